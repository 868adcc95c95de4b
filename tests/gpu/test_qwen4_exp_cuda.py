"""Qwen4Exp on the CUDA backend against the CPU reference, on the tiny converted artifact
(``tests/tiny_qwen4_exp.py``, recipe ``qwen4_exp_bf16``: PLE on both GDN layers, the QSA
indexer on both attention layers, MoE, two hyper-connection streams).

Qwen4Exp is served on the backends in ``qwen4_exp.model.SERVED_BACKENDS``; cuda joined them
once this file had passed on a GPU (an H100). A capturing backend captures a decode step
within QSA's budget and past it (``Qwen4Exp.step_variant``: past it the step reads its token
bucket; neither reads anything back, streamed n-gram rows being read before it; not yet run
on a GPU past the budget), and runs multi-row steps eagerly; prefill products run in float32
(``NINFER_CUDA_PREFILL=float32``), so the tokens compare one for one.

* Logits: a prompt shorter and one longer than the indexer's budget, each prefilled in chunks,
  continued by a three-row step and decode steps (the short one crosses the budget while
  decoding), with the n-gram tables resident and streamed from disk: within ``LOGIT_TOL`` of
  the CPU's largest logit; streamed, the CUDA model reads the same rows, ranges and bytes from
  the artifact as the CPU's. The products differ from the CPU's in the last bits (the small-M
  tensor-core kernels carry x as two bf16 halves, ~1e-5 of each product, compounding through
  the layers); a wrong op (a norm's weight, a mask, a hash, a state not advanced) shows at
  1e-1 or more. A QSA block choice flipped by a near-tie in the block scores would show as a
  large difference too: the indexer gets 16 heads, as the CPU artifact test gives it, so that
  scores (sums of ReLUs) are rarely exactly tied.
* The engine: greedy tokens of two prompts (shorter and longer than the budget) decoded side
  by side equal the CPU engine's; with the prefix cache, prompts that continue a system
  prompt resume from its checkpoints (PLE's convolution and n-gram context restored with the
  GDN states, QSA's index keys with the pages) and stream the cold run's tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.base import to_numpy
from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.models import load_model
from ninfer_runtime.models.qwen4_exp import model as qwen4_exp_model
from ninfer_runtime.runner import ModelRunner

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

RECIPE = "qwen4_exp_bf16"
#: logits within this fraction of the CPU's largest |logit| (see the module docstring)
LOGIT_TOL = 1e-3
#: tokens each engine request decodes
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def tiny() -> Any:
    return pytest.importorskip("tests.tiny_qwen4_exp")


@pytest.fixture(scope="module")
def budget(tiny: Any) -> int:
    return int(tiny.TEXT["indexer_budget"])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, tiny: Any) -> Path:
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("qwen4_exp_cuda")
    checkpoint = tiny.build(root / "ple", indexer_n_heads=16)
    out = root / "ple.ninfer"
    convert(RECIPE, {"base": str(checkpoint)}, out)
    return out


@pytest.fixture(autouse=True)
def float32_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Float32 products; engines' backends capture graphs by default (the model's decode
    steps within QSA's budget)."""
    assert "cuda" in qwen4_exp_model.SERVED_BACKENDS
    monkeypatch.setenv("NINFER_CUDA_PREFILL", "float32")
    monkeypatch.setenv("NINFER_CUDA_DECODE", "split")


def cuda_backend(*, graphs: bool = False) -> Any:
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    return CudaBackend(graphs=graphs, prefill_precision="float32", decode_precision="split")


@pytest.mark.parametrize("ple_rows", ["resident", "streamed"])
def test_decode_steps_within_the_budget_are_captured_and_equal_eager_ones(
    artifact: Path, budget: int, ple_rows: str
) -> None:
    """A capturing backend keeps its graphs: one lane's decode steps within QSA's budget,
    the n-gram tables resident or streamed (their rows read before each step), are captured
    once (the step's key names the path it takes) and give the eager steps' logits."""
    from ninfer_runtime.backends.cuda.graphs import GraphStep

    vocab = load_model(artifact).config.vocab
    ids = np.random.default_rng(3).integers(0, vocab, budget)
    logits = {}
    for graphs in (False, True):
        model = load_model(artifact, cuda_backend(graphs=graphs), options={"ple_rows": ple_rows})
        assert model.backend.graphs is graphs
        runner = ModelRunner(model)
        state = runner.new_pool(lanes=1, max_context=64, page_tokens=16).open(64)
        runner.prefill(ids[: budget // 2], state, chunk=7)
        rows = [
            to_numpy(runner.forward([ids[t : t + 1]], [state]).logits[0])
            for t in range(budget // 2, budget - 2)
        ]
        logits[graphs] = np.concatenate(rows)
        if graphs:
            made = runner.steps._steps
            assert [k for k, step in made.items() if isinstance(step, GraphStep)] == [
                ("decode", 1, "all")
            ]
    error = float(np.abs(logits[True] - logits[False]).max() / np.abs(logits[False]).max())
    case = f"qwen4_exp/captured decode, {ple_rows}"
    REPORT.append((case, "max |logit diff| / max |logit|", f"{error:.2e}"))
    assert error <= 1e-6


def continued_rows(model: Any, ids: np.ndarray, prompt: int) -> np.ndarray:
    """The logits of ``ids``' rows from the last prefill chunk on: ``prompt`` tokens in chunks
    of 7, three as one multi-row step, then one decode step per token."""
    runner = ModelRunner(model)
    state = runner.new_pool(lanes=1, max_context=128, step_rows=4, page_tokens=16).open(128)
    rows = [to_numpy(runner.prefill(ids[:prompt], state, chunk=7).logits[0])]
    rows.append(to_numpy(runner.forward([ids[prompt : prompt + 3]], [state]).logits[0]))
    for t in range(prompt + 3, ids.shape[0]):
        rows.append(to_numpy(runner.forward([ids[t : t + 1]], [state]).logits[0]))
    return np.concatenate(rows)


@pytest.mark.parametrize("ple_rows", ["resident", "streamed"])
@pytest.mark.parametrize("longer", [False, True], ids=["under_budget", "past_budget"])
def test_logits_equal_the_cpu_reference(
    artifact: Path, budget: int, ple_rows: str, longer: bool
) -> None:
    prompt = 3 * budget if longer else budget - 4
    options = {"ple_rows": ple_rows}
    cpu = load_model(artifact, options=options)
    cuda = load_model(artifact, cuda_backend(), options=options)
    ids = np.random.default_rng(prompt).integers(0, cpu.config.vocab, prompt + 12)
    ours, reference = continued_rows(cuda, ids, prompt), continued_rows(cpu, ids, prompt)
    error = float(np.abs(ours - reference).max() / np.abs(reference).max())
    case = f"qwen4_exp/{ple_rows}/{prompt} tokens"
    REPORT.append((case, "max |logit diff| / max |logit|", f"{error:.2e}"))
    assert error < LOGIT_TOL
    if ple_rows == "streamed":  # the rows the n-grams hash to, read as on the CPU (whose
        # reads test_qwen4_exp_ple_rows.py counts against an independent hash)
        assert cuda.ple_tables.counters() == cpu.ple_tables.counters()
        assert cpu.ple_tables.counters().bytes > 0


def concurrent(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    """Every prompt submitted at once, greedy, stepped to the end: each one's token ids."""
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
    ids: dict[Any, list[int]] = {}
    for p in prompts:
        request = GenerationRequest(prompt_ids=p, sampling=params, parse_output=False)
        ids[engine.submit(request)] = []
    while engine.has_work:
        for event in engine.step():
            if isinstance(event, TokenEvent):
                ids[event.request_id].append(event.token_id)
    return list(ids.values())


def test_greedy_tokens_of_lanes_side_by_side_equal_the_cpu_engine(
    artifact: Path, budget: int
) -> None:
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 400, n).tolist() for n in (budget - 4, 3 * budget + 5)]
    got = {
        name: concurrent(
            Engine(artifact, backend=name, max_lanes=2, max_context=256, kv_dtype="float32"),
            prompts,
        )
        for name in ("cpu", "cuda")
    }
    REPORT.append(
        ("qwen4_exp/two lanes", "greedy tokens cuda == cpu", str(got["cuda"] == got["cpu"]))
    )
    assert got["cuda"] == got["cpu"]


def test_prefix_cache_resumes_give_the_cold_tokens(artifact: Path) -> None:
    from tests.runtime.test_prefix_cache import _serve

    rng = np.random.default_rng(1)
    system = rng.integers(0, 400, 70).tolist()
    prompts = [system + rng.integers(0, 400, n).tolist() for n in (3, 20, 9)] + [system]

    def engine(backend: str, cache: bool) -> Engine:
        return Engine(artifact, backend=backend, max_lanes=2, max_context=256, prefill_chunk=32,
                      prefix_cache=cache, checkpoint_interval=32, kv_dtype="float32")  # fmt: skip

    streams = {
        (backend, cache): _serve(engine(backend, cache), prompts)
        for backend, cache in (("cpu", False), ("cuda", False), ("cuda", True))
    }
    cold, warm = streams["cuda", False], streams["cuda", True]
    assert [f.usage.cached_tokens for _, f in warm][1:3] == [64, 64]  # resumed from 64 tokens
    resumed = [t for t, _ in warm] == [t for t, _ in cold]
    REPORT.append(("qwen4_exp/prefix cache", "warm cuda tokens == cold cuda", str(resumed)))
    assert resumed
    assert [t for t, _ in cold] == [t for t, _ in streams["cpu", False]]
