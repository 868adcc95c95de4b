"""A converted GLM5Next artifact (``tests/tiny_glm5_next.py``, recipe ``glm5_next_bf16``) on the
CPU backend: logits through ``load_model`` and the runner against transformers'
``Glm5NextForConditionalGeneration`` with the artifact's weights (bf16-rounded where it stores
them so), prompts within and past ``index_topk``; ``ninfer --raw --greedy`` against
transformers' greedy ``generate``; and the engine's prefix cache and preemptions, whose streams
equal a cold, unconstrained run's token for token."""

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
from tests.runtime.glm5_next_reference import _logical, torch
from tests.runtime.test_prefix_cache import _capacity, _concurrent

tiny = pytest.importorskip("tests.tiny_glm5_next")

TOL = 1e-4
#: more indexer heads than the tiny builder's two: a pool every head scores below zero gets an
#: index score of exactly 0 (relu), and among such ties transformers' topk picks its own way
#: (ours: the earliest pools), so a selection boundary on a tie would differ by design
OVERRIDES = {"index_n_heads": 16}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("glm5_next")
    checkpoint = tiny.build_tiny_glm5_next(root / "checkpoint", **OVERRIDES)
    tiny.convert("glm5_next_bf16", checkpoint, root / "tiny.ninfer")
    return checkpoint, root / "tiny.ninfer"


@pytest.fixture(scope="module")
def pair(converted: tuple[Path, Path]):
    """Our model of the artifact, and transformers' with the artifact's weights: each
    parameter rounded to bf16 where the artifact holds it so, else as saved."""
    ours = load_model(converted[1])
    hf = tiny.build_model(**OVERRIDES)
    hf.config.text_config._attn_implementation = "eager"
    c = hf.config.text_config
    stored = _artifact_weights(converted[1])
    with torch.no_grad():
        for name, p in hf.named_parameters():
            value = p.detach().float().numpy()
            logical = _logical(name, value, c) if _is_text(name) else {}
            if not logical:
                continue
            rounded = p.to(torch.bfloat16).float()
            as_bf16 = _logical(name, rounded.numpy(), c)
            if all(np.array_equal(stored[k], v) for k, v in as_bf16.items()):
                p.copy_(rounded)
            else:
                assert all(np.array_equal(stored[k], v) for k, v in logical.items()), name
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                key = next(iter(_logical(name, b.numpy(), c)))
                b.copy_(torch.from_numpy(stored[key]))
    return ours, hf


def _is_text(name: str) -> bool:
    return name.startswith("model.language_model.") or name == "lm_head.weight"


def _artifact_weights(path: Path) -> dict[str, np.ndarray]:
    from ninfer_format import Artifact

    with Artifact.open(path) as art:
        return {
            n: np.asarray(art.parameter(n), np.float32)
            for n in art.bindings
            if n.startswith("text/")
        }


def hf_logits(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids)[None].long()).logits[0].numpy()


@pytest.mark.parametrize("t", [6, 37])  # within index_topk (8 + the open pool), and past it
def test_logits_match_transformers(pair, t: int) -> None:
    ours, hf = pair
    ids = np.random.default_rng(t).integers(0, ours.config.vocab, t)
    runner = ModelRunner(ours)
    logits = runner.prefill(ids, runner.new_state(64)).logits[0]
    ref = hf_logits(hf, ids)
    assert np.abs(logits - ref).max() / np.abs(ref).max() < TOL


def test_decode_across_a_token_bucket_matches_transformers(pair) -> None:
    """Two lanes (6 and 250 tokens) decoded side by side through the 256-token bucket's edge:
    a step reads its lanes' latents padded to ``batch.token_bucket`` of the furthest position
    (the shorter lane's rows past its own never seen): each step's logits are transformers'
    over the whole sequence so far."""
    ours, hf = pair
    rng = np.random.default_rng(3)
    sequences = [list(rng.integers(0, ours.config.vocab, t)) for t in (6, 250)]
    runner = ModelRunner(ours)
    pool = runner.new_pool(lanes=2, max_context=320, page_tokens=16)
    states = [pool.open(320) for _ in sequences]
    last = [
        runner.prefill(np.array(s), st).logits[0][-1]
        for s, st in zip(sequences, states, strict=True)
    ]
    for _ in range(9):  # positions 250..258 on the long lane: buckets 256, then 512 (320 held)
        for seq, row in zip(sequences, last, strict=True):
            seq.append(int(np.argmax(row)))
        last = [x[0] for x in runner.forward([np.array(s[-1:]) for s in sequences], states).logits]
        for seq, row in zip(sequences, last, strict=True):
            ref = hf_logits(hf, np.array(seq))[-1]
            assert np.abs(row - ref).max() / np.abs(ref).max() < TOL


def test_greedy_cli_equals_transformers_generate(converted, pair) -> None:
    checkpoint, artifact = converted
    _, hf = pair
    prompt = "The quick brown fox jumps over the lazy dog, and then"
    _, ours, generated = cli_and_transformers_greedy(artifact, checkpoint, hf, prompt)
    assert ours and ours == generated[: len(ours)]


def test_prefix_cache_and_preemption_replay_exactly(converted) -> None:
    _, artifact = converted
    rng = np.random.default_rng(1)
    assert_warm_streams_equal_cold(artifact, rng)

    # three lanes that each outgrow one 256-token page, in a pool of four pages
    roomy = Engine(artifact, max_lanes=3, max_context=512)
    prompts = [rng.integers(0, 400, 220 + 10 * i).tolist() for i in range(3)]
    params = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0.0)
    small = Engine(artifact, max_lanes=3, max_context=512,
                   context_capacity=_capacity(roomy.pool, 4))  # fmt: skip
    assert small.pool.pages == 4
    assert _concurrent(small, prompts, params) == _concurrent(roomy, prompts, params)
    assert small.preemptions > 0
