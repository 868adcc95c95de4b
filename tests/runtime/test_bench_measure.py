"""The measuring half of ninfer-bench, on the CPU backend and tiny synthetic artifacts."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_runtime.bench import measure as M
from ninfer_runtime.bench.cli import main
from ninfer_runtime.bench.synthetic import write_synthetic
from ninfer_runtime.models import load_model
from ninfer_runtime.state import ContextPool


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = {}
    for geometry, formats in (("tiny_dense", "qwen3_6_27b"), ("tiny_moe", "qwen3_6_35b_a3b")):
        path = tmp_path_factory.mktemp(geometry) / "s.ninfer"
        write_synthetic(path, geometry, formats, seed=2)
        out[geometry] = path
    return out


def test_step_bytes_count_weights_once_and_context_per_lane(artifacts):
    model = load_model(Artifact.open(artifacts["tiny_dense"]), "cpu")
    specs, _ = model.state_specs()
    per_token = ContextPool.page_bytes_of(specs, None, 1)
    one = M.decode_step_bytes(model, 1, 100)
    assert M.decode_step_bytes(model, 1, 300) - one == 200 * per_token
    # a second lane adds its context, its states and one embedding row, not the weights again
    two = M.decode_step_bytes(model, 2, 100)
    row = M.weight_bytes(model.token_embedding) // model.config.vocab
    states = ContextPool.slot_bytes_of(specs)
    assert two - one == 100 * per_token + 2 * states + row
    assert one > M.weight_bytes(model.output_head)


def test_moe_bytes_grow_with_the_experts_a_batch_touches(artifacts):
    model = load_model(Artifact.open(artifacts["tiny_moe"]), "cpu")
    m = next(layer.ffn.weights for layer in model.layers)
    expert = sum(M.weight_bytes(w) for w in vars(m.experts[0]).values())
    one, eight = M.decode_step_bytes(model, 1, 0), M.decode_step_bytes(model, 8, 0)
    specs, _ = model.state_specs()
    per_lane = 2 * ContextPool.slot_bytes_of(specs) + (
        M.weight_bytes(model.token_embedding) // model.config.vocab
    )
    extra_experts = (eight - one - 7 * per_lane) / (len(model.layers) * expert)
    e, k = len(m.experts), m.top_k
    expected = e * (1 - (1 - k / e) ** 8) - k
    assert extra_experts == pytest.approx(expected, abs=0.2)


def test_run_prints_a_table_and_writes_rows(artifacts, tmp_path):
    out = tmp_path / "rows.json"
    args = "--backend cpu --lanes 1,3 --contexts 40 --steps 2 --prefill 70 --chunk 32 --profile 2"
    result = CliRunner().invoke(
        main, ["run", str(artifacts["tiny_moe"]), *args.split(), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "% floor" in result.output and "prefill 70 tokens" in result.output
    rows = json.loads(out.read_text())
    decode = [r for r in rows if r["kind"] == "decode"]
    assert [(r["lanes"], r["context"]) for r in decode] == [(1, 40), (3, 40)]
    for r in decode:
        assert r["tokens_per_s"] == pytest.approx(r["lanes"] * 1e3 / r["step_ms"])
        assert r["percent_of_floor"] == pytest.approx(100 * r["floor_ms"] / r["step_ms"])
    profile = next(r for r in rows if r["kind"] == "profile")
    # every op the Qwen3.5-MoE step runs, and no other architecture's (GLM5Next's)
    glm = {"kda_decode", "latent_attention", "routed_experts"}
    assert set(M.PROFILED_OPS) - glm <= set(profile) and not glm & set(profile)
    assert profile["step"] > 0


def test_profile_on_the_cpu_says_the_kernel_trace_is_unavailable(artifacts, tmp_path):
    """``--profile 1 --kernel-trace`` on the CPU backend: the ablation as ever, then one line
    saying why there is no kernel trace, in the output, the rows and the record; without
    ``--kernel-trace`` no trace is tried."""
    args = "--backend cpu --lanes 1 --contexts 8 --steps 1 --prefill 0 --profile 1"
    result = CliRunner().invoke(main, ["run", str(artifacts["tiny_dense"]), *args.split()])
    assert result.exit_code == 0 and "kernel trace" not in result.output, result.output
    out, md = tmp_path / "rows.json", tmp_path / "perf.md"
    args += " --kernel-trace"
    args += f" --json {out} --record {md}"
    result = CliRunner().invoke(main, ["run", str(artifacts["tiny_dense"]), *args.split()])
    assert result.exit_code == 0, result.output
    why = "kernel trace unavailable: the CPU backend runs no CUDA kernels"
    assert result.output.index("profile, 1 lane(s)") < result.output.index(why)
    rows = json.loads(out.read_text())
    assert {"kind": "kernel trace", "unavailable": why.split(": ")[1]} in rows
    assert "Kernel trace unavailable: the CPU backend runs no CUDA kernels." in md.read_text()


def test_run_times_the_decode_table_over_ranks_beside_one_rank(artifacts, tmp_path):
    """``--tensor-parallel 2``: the decode table again over two ranks (processes, on the CPU
    backend), each row with its speedup over one rank's step and rank 0's share of the bytes
    (less than the whole: its heads, columns and vocabulary rows); and in the record."""
    out, record = tmp_path / "rows.json", tmp_path / "perf.md"
    args = "--backend cpu --lanes 1,2 --contexts 24 --steps 2 --prefill 0 --tensor-parallel 2"
    result = CliRunner().invoke(
        main,
        ["run", str(artifacts["tiny_dense"]), *args.split(), "--json", str(out), "--record",
         str(record), "--commit", "abc"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 ranks" in result.output and "x 1 rank" in result.output
    rows = json.loads(out.read_text())
    one = {(r["lanes"], r["context"]): r for r in rows if r["kind"] == "decode"}
    two = [r for r in rows if r["kind"] == "decode parallel"]
    assert [(r["lanes"], r["context"]) for r in two] == [(1, 24), (2, 24)]
    for r in two:
        base = one[r["lanes"], r["context"]]
        assert r["ranks"] == 2
        assert r["speedup"] == pytest.approx(base["step_ms"] / r["step_ms"])
        assert 0.3 * base["bytes_per_step"] < r["bytes_per_step"] < base["bytes_per_step"]
    assert "Over 2 ranks" in record.read_text()


@pytest.mark.parametrize("geometry", ["tiny_dense", "tiny_moe"])
def test_long_prefill_by_part_and_the_prefill_profile(artifacts, tmp_path, geometry):
    """--long-prefill times one prompt in parts of whole chunks (covering it exactly, each
    part's floor counting attention over the context before it); --profile-prefill ablates
    every op of the prefill path; both go into the record."""
    from ninfer_runtime.bench.record import RunContext, markdown

    out = tmp_path / "rows.json"
    args = "--backend cpu --lanes 1 --contexts 8 --steps 1 --prefill 0 --chunk 16"
    result = CliRunner().invoke(
        main,
        [
            "run", str(artifacts[geometry]), *args.split(), "--long-prefill", "100",
            "--profile-prefill", "--json", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "one 100-token prompt" in result.output and "prefill profile" in result.output
    rows = json.loads(out.read_text())
    parts = [r for r in rows if r["kind"] == "long prefill"]
    assert parts[0]["start"] == 0 and parts[-1]["end"] == 100
    assert all(a["end"] == b["start"] for a, b in itertools.pairwise(parts))
    assert all(r["start"] % 16 == 0 and r["tokens_per_s"] > 0 for r in parts)
    model = load_model(Artifact.open(artifacts[geometry]))
    for r in parts:
        assert r["flops"] == pytest.approx(
            M.prefill_flops(model, r["end"] - r["start"], r["start"])
        )
    later, first = parts[-1], parts[0]  # the same tokens cost more attention later on
    per_token = [r["flops"] / (r["end"] - r["start"]) for r in (first, later)]
    assert per_token[1] > per_token[0]
    profile = next(r for r in rows if r["kind"] == "prefill profile")
    ops = set(M.PREFILL_OPS) - ({"moe"} if geometry == "tiny_dense" else set())  # what it runs
    assert ops == set(M.PREFILL_OPS) & set(profile) and profile["chunk"] > 0 and "rest" in profile
    # the CPU backend computes as it issues: the host's time is about the chunk's
    assert 0.2 * profile["chunk"] < profile["host_issue"] < 5 * profile["chunk"]
    context = RunContext("2026-12-02", "cpu", "abc", "s.ninfer", "float32", 1.0)
    text = markdown(rows, context)
    assert "One 100-token prompt (chunks of 16)" in text and "Prefill profile, one chunk" in text
    assert text.count("| 0-") == 1


def test_bad_lane_list_is_a_usage_error(artifacts):
    result = CliRunner().invoke(main, ["run", str(artifacts["tiny_dense"]), "--lanes", "1,x"])
    assert result.exit_code == 2 and "comma-separated positive integers" in result.output


def test_provider_forces_an_op_and_a_bad_one_is_a_usage_error(artifacts, tmp_path):
    """``--provider FAMILY.OP=NAME`` serves the op by that provider for the run (said in the
    output and the record); an unknown provider or a malformed one is a usage error naming
    what it takes."""
    from ninfer_runtime.ops import registry

    seen = []
    original = registry.override

    def recording(family, op, name):
        seen.append((family, op, name))
        return original(family, op, name)

    args = "--backend cpu --lanes 1 --contexts 8 --steps 1 --prefill 40 --chunk 16"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "override", recording)
        result = CliRunner().invoke(
            main,
            ["run", str(artifacts["tiny_dense"]), *args.split(),
             "--provider", "delta_rule.prefill=reference", "--record", str(tmp_path / "p.md")],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "delta_rule.prefill served by reference (--provider)" in result.output
    assert "ops forced delta_rule.prefill=reference" in (tmp_path / "p.md").read_text()
    assert seen == [("delta_rule", "prefill", "reference")]
    assert ("delta_rule", "prefill") not in registry._FORCED  # given back when the run ends
    for bad, said in (
        ("delta_rule.prefill=nope", "expected fla, nvrtc, reference"),
        ("delta_rule", "expected FAMILY.OP=NAME"),
        ("nofamily.op=x", "expected FAMILY.OP=NAME"),
    ):
        result = CliRunner().invoke(main, ["run", str(artifacts["tiny_dense"]), "--provider", bad])
        assert result.exit_code == 2 and said in result.output, result.output
    # a provider that does not run on this device: one line when the op is first asked for
    result = CliRunner().invoke(
        main,
        ["run", str(artifacts["tiny_dense"]), *args.split(), "--provider", "norm.rms_norm=nvrtc"],
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.splitlines()[-1] == (
        "Error: norm.rms_norm: no provider of ['nvrtc'] takes device=cpu"
    )


#: a Python prelude that refuses the converter and torch, as on ``pip install ninfer[gpu]``
WITHOUT_CONVERT = """
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("ninfer_convert", "torch", "safetensors"):
            raise ImportError(f"{name} is not installed here")

sys.meta_path.insert(0, Refuse())
"""


def _bench_without_convert(*args: str, code: str = "") -> subprocess.CompletedProcess[str]:
    run = "from ninfer_runtime.bench.cli import main; sys.argv[0] = 'ninfer-bench'; main()"
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_CONVERT + (code or run), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_needs_neither_the_converter_nor_torch(artifacts):
    blocked = _bench_without_convert(code="import ninfer_runtime.bench.synthetic")
    assert blocked.returncode != 0 and "ninfer_convert is not installed" in blocked.stderr
    modules = (
        "import ninfer_runtime.bench.measure, ninfer_runtime.bench.record, ninfer_runtime.runner"
    )
    assert _bench_without_convert(code=modules).returncode == 0
    helped = _bench_without_convert("run", "--help")
    assert helped.returncode == 0 and "Usage: ninfer-bench run" in helped.stdout, helped.stderr
    args = "--backend cpu --lanes 1 --contexts 8 --steps 1 --prefill 16 --chunk 8"
    ran = _bench_without_convert("run", str(artifacts["tiny_dense"]), *args.split())
    assert ran.returncode == 0 and "% floor" in ran.stdout, ran.stderr


def test_a_prefill_that_does_not_repeat_itself_is_not_timed():
    """The timed prefill reads the warm-up's prompt again: NaN logits, or logits further apart
    than ``REPEAT_TOLERANCE`` of their largest value, end the run with one line saying so
    rather than a rate; a difference within it (another summation order) passes."""
    import numpy as np

    from ninfer_runtime.bench.rates import REPEAT_TOLERANCE, check_repeated
    from ninfer_runtime.errors import EngineError

    first = np.array([[1.0, -4.0, 2.5]], dtype=np.float32)
    check_repeated(first, first + 0.5 * REPEAT_TOLERANCE * 4.0, "prefill")
    with pytest.raises(EngineError, match="not finite"):
        check_repeated(first, np.array([[1.0, np.nan, 2.5]], dtype=np.float32), "prefill")
    with pytest.raises(EngineError, match=r"prefill of 8 tokens.*apart"):
        check_repeated(first, first * 1.01, "prefill of 8 tokens")


class _DeviceRows:
    """A device array as CuPy's behaves: copied down by ``get()``, never read by numpy."""

    def __init__(self, values: list[float]) -> None:
        import numpy as np

        self.values = np.array([values], dtype=np.float32)

    def get(self) -> Any:
        return self.values.copy()

    def __array__(self, *_: Any, **__: Any) -> Any:
        raise TypeError("implicit conversion of a device array to numpy")


def test_the_rates_read_device_logits_as_a_gpu_backend_gives_them(monkeypatch):
    """``prefill_rate`` and ``decode_rate`` check the logits of device arrays (lists of
    per-lane arrays that numpy cannot read): each lane's rows copied down, NaN refused."""
    import types

    import numpy as np

    from ninfer_runtime.bench import rates
    from ninfer_runtime.errors import EngineError
    from ninfer_runtime.models import ForwardOutput

    logits = [[0.5, -1.0]]

    class Runner:
        backend = types.SimpleNamespace(xp=np)
        model = types.SimpleNamespace(config=types.SimpleNamespace(vocab=2))

        def new_state(self, n: int) -> object:
            return object()

        def prefill(self, ids, state, *, chunk, last_only):
            return ForwardOutput([_DeviceRows(logits[-1])], [])

        def new_pool(self, **_: Any) -> Any:
            return types.SimpleNamespace(open=lambda n: object(), advance=lambda s, n: None)

        def forward(self, ids, states):
            return ForwardOutput([_DeviceRows(logits[-1]) for _ in states], [])

    monkeypatch.setattr(rates, "prefill_flops", lambda *a, **k: 1.0)
    monkeypatch.setattr(rates, "fill_random", lambda *a: None)
    monkeypatch.setattr(rates, "decode_step_bytes", lambda *a: 1)
    rates.prefill_rate(Runner(), 4, chunk=2, flop_rate=1.0)
    rates.decode_rate(Runner(), 2, 8, steps=2, warmup=1, floor_bw=1.0)
    logits.append([np.nan, 1.0])
    with pytest.raises(EngineError, match="not finite"):
        rates.decode_rate(Runner(), 2, 8, steps=2, warmup=1, floor_bw=1.0)
