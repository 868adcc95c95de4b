"""A converted Qwen4Exp artifact (``tests/tiny_qwen4_exp.py``, recipe ``qwen4_exp_bf16``) on the
CPU backend: logits through ``load_model`` and the runner against transformers'
``Qwen4ExpForCausalLM`` with the artifact's weights (bf16-rounded, GDN ``A_log`` and
``dt_bias`` kept fp32 as the recipe stores them), prompts within and past the indexer's budget,
with and without PLE layers; a prompt in chunks, a multi-row step and decode steps continue it;
``ninfer --raw --greedy`` against transformers' greedy ``generate``; the engine's prefix cache
and preemptions replay a cold run's streams token for token.

The tiny model's indexer gets 16 heads (the builder's default is 2): a block's score is a sum of
ReLUs, so with few heads blocks often tie at exactly zero, and which tied block ``torch.topk``
keeps is its implementation's choice (ours keeps the earliest).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.engine import Engine
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner
from tests.runtime.artifact_checks import (
    assert_warm_streams_equal_cold,
    cli_and_transformers_greedy,
)
from tests.runtime.test_fidelity import round_through_bf16
from tests.runtime.test_prefix_cache import _capacity, _concurrent

tiny = pytest.importorskip("tests.tiny_qwen4_exp")
torch = pytest.importorskip("torch")

RECIPE = "qwen4_exp_bf16"
TOL = 1e-4
#: the recipe keeps these fp32; every other parameter is stored bf16
BUDGET = tiny.TEXT["indexer_budget"]


def _convert(root: Path, name: str, **overrides) -> tuple[Path, Path]:
    from ninfer_convert.pipeline import convert

    checkpoint = tiny.build(root / name, indexer_n_heads=16, **overrides)
    convert(RECIPE, {"base": str(checkpoint)}, root / f"{name}.ninfer")
    return checkpoint, root / f"{name}.ninfer"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, torch_threads) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("qwen4_exp")
    # the first with the builder's MTP tensors (converted, left unread), the second without
    plain = _convert(root, "plain", ple_layer_ids=[], mtp=False)
    return {"ple": _convert(root, "ple"), "plain": plain}


def _transformers(checkpoint: Path):
    from transformers import Qwen4ExpForCausalLM

    hf = Qwen4ExpForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    round_through_bf16(hf)
    return hf


@pytest.fixture(scope="module")
def pairs(converted) -> dict[str, tuple]:
    return {
        kind: (load_model(artifact), _transformers(checkpoint))
        for kind, (checkpoint, artifact) in converted.items()
    }


def _reference(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids)[None].long(), use_cache=False).logits[0].numpy()


def _relative(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def test_each_connections_down_and_inject_are_one_object(converted) -> None:
    """They read the same normed streams: the converter stores them as one object (down's
    rows, then inject's), so a connection's two products are one (one launch on a GPU)."""
    from ninfer_format import Artifact

    with Artifact.open(converted["plain"][1]) as art:
        connections = {
            n.rsplit("/", 1)[0] for n in art.bindings if n.endswith("_connection/inject")
        }
        assert connections
        for c in sorted(connections):
            (down,), (inject,) = art.bindings[c + "/down"].parts, art.bindings[c + "/inject"].parts
            assert down.object == inject.object and down.range[1] == inject.range[0], c


@pytest.mark.parametrize("kind", ["ple", "plain"])
@pytest.mark.parametrize("t", [BUDGET - 4, 3 * BUDGET])
def test_logits_match_transformers(pairs, kind: str, t: int) -> None:
    ours, hf = pairs[kind]
    ids = np.random.default_rng(t).integers(0, ours.config.vocab, t)
    runner = ModelRunner(ours)
    logits = runner.forward([ids], [runner.new_state(64)]).logits[0]
    assert _relative(logits, _reference(hf, ids)) < TOL


def test_chunks_a_multi_row_step_and_decode_steps_continue_a_prompt(pairs) -> None:
    """19 tokens in chunks of 7, 3 as one compiled step, then 20 decode steps (past the budget
    all along): the rows transformers computes for the whole sequence at once."""
    ours, hf = pairs["ple"]
    ids = np.random.default_rng(5).integers(0, ours.config.vocab, 42)
    runner = ModelRunner(ours)
    state = runner.new_pool(lanes=1, max_context=64, step_rows=4, page_tokens=16).open(64)
    rows = [runner.prefill(ids[:19], state, chunk=7).logits[0]]  # the last chunk's: 14..18
    rows.append(runner.forward([ids[19:22]], [state]).logits[0])
    rows += [runner.forward([ids[t : t + 1]], [state]).logits[0] for t in range(22, 42)]
    assert _relative(np.concatenate(rows), _reference(hf, ids)[14:]) < TOL


def test_lanes_of_one_forward_keep_to_their_own_memory(pairs) -> None:
    """Two prompts of different lengths prefilled as one chunk, then decoded side by side:
    each lane's rows are those transformers computes for its sequence alone."""
    ours, hf = pairs["ple"]
    rng = np.random.default_rng(9)
    seqs = [rng.integers(0, ours.config.vocab, n) for n in (30, 23)]
    runner = ModelRunner(ours)
    pool = runner.new_pool(lanes=2, max_context=64, page_tokens=16)
    states = [pool.open(64), pool.open(64)]
    first = runner.forward([s[:20] for s in seqs], states).logits
    rows = [[first[0]], [first[1]]]
    for t in range(20, 23):
        step = runner.forward([s[t : t + 1] for s in seqs], states).logits
        rows[0].append(step[0])
        rows[1].append(step[1])
    for seq, lane in zip(seqs, rows, strict=True):
        assert _relative(np.concatenate(lane), _reference(hf, seq[:23])) < TOL


def test_greedy_cli_equals_transformers_generate(converted, pairs) -> None:
    checkpoint, artifact = converted["ple"]
    _, hf = pairs["ple"]
    prompt = "The quick brown fox jumps over the lazy dog, and then it runs into the old forest"
    ids, ours, generated = cli_and_transformers_greedy(artifact, checkpoint, hf, prompt)
    assert len(ids) > BUDGET  # the indexer selects while generating
    assert ours and ours == generated[: len(ours)]


def test_prefix_cache_and_preemption_replay_exactly(converted) -> None:
    """Checkpoints carry PLE's convolution and n-gram context with the GDN states, and a
    preempted lane's replay rebuilds them: the streams equal a cold, unconstrained run's."""
    _, artifact = converted["ple"]
    rng = np.random.default_rng(1)
    assert_warm_streams_equal_cold(artifact, rng)

    # three lanes each crossing into a second 256-token page, four pages: lanes are preempted,
    # their memory freed (replayed later) or copied to host memory (copied back)
    roomy = Engine(artifact, max_lanes=3, max_context=512)
    prompts = [rng.integers(0, 400, 220 + 10 * i).tolist() for i in range(3)]
    params = SamplingParams(max_tokens=50, ignore_eos=True, temperature=0.0)
    expected = _concurrent(roomy, prompts, params)
    for host in (0, 1 << 26):
        small = Engine(artifact, max_lanes=3, max_context=512, host_context_capacity=host,
                       context_capacity=_capacity(roomy.pool, 4))  # fmt: skip
        assert _concurrent(small, prompts, params) == expected
        assert small.preemptions > 0
        assert small.replayed_tokens > 0 if host == 0 else small.replayed_tokens == 0


def test_other_backends_are_refused_in_one_line() -> None:
    from types import SimpleNamespace

    from ninfer_runtime.errors import ModelError
    from ninfer_runtime.models.qwen4_exp import load_qwen4_exp

    with pytest.raises(ModelError, match="cpu and cuda backend only") as error:
        load_qwen4_exp(None, SimpleNamespace(name="metal"))
    assert "\n" not in str(error.value)


def test_an_mtp_component_is_left_unread_and_speculation_refused(converted) -> None:
    from ninfer_format import Artifact
    from ninfer_runtime.errors import EngineError
    from ninfer_runtime.speculative import SpecConfig

    _, artifact = converted["ple"]
    with Artifact.open(artifact) as art:
        assert "mtp" in art.components
    with pytest.raises(EngineError, match="mtp component is not run"):
        Engine(artifact, max_lanes=1, max_context=64, spec=SpecConfig(draft_tokens=2))
