"""Images with speculative decoding (MTP) on a tiny random Qwen3.5 VLM with MTP tensors.

Greedy output with ``spec`` equals greedy output without it (verification reads RoPE rows
at index + the prompt's ``rope_delta``), and every round's first draft is the argmax of a
one-shot drafter over the whole sequence at its multimodal positions (the drafter's
entries, prompt and carried rows, sit where the main model's tokens do).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer_runtime.engine import Engine, GenerationRequest
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.images import placed_inputs
from ninfer_runtime.models.batch import Lane
from ninfer_runtime.speculative import SpecConfig
from tests.runtime.test_engine_images import CAT, TOWER, checkpoint, concurrent, request, run

__all__ = ["checkpoint"]  # the module fixture this file builds on

LONG = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def add_vlm_mtp(directory: Path) -> None:
    """Random ``mtp.*`` tensors beside a VLM checkpoint's ``model.language_model.*``: the
    input projection, the three norms and one full-attention layer (near the text one, its
    query and key norms larger, so that its attention is sharp enough for positions and
    image rows to change its drafts)."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    prefix = "model.language_model.layers.1."  # layer 1 is full attention (COMMON)
    generator = torch.Generator().manual_seed(5)
    for name, value in list(tensors.items()):
        if name.startswith(prefix):
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float32)
            sharpen = 1.0 if name.endswith(("q_norm.weight", "k_norm.weight")) else 0.0
            drawn = value + 0.05 * noise.to(value.dtype) + sharpen
            tensors["mtp.layers.0." + name[len(prefix) :]] = drawn
    hidden = tensors["lm_head.weight"].shape[1]
    scale = 0.6 / (2 * hidden) ** 0.5
    tensors["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator) * scale
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = 0.3 * torch.randn(hidden, generator=generator)
    dtype = tensors["lm_head.weight"].dtype
    tensors = {k: (v.to(dtype) if k.startswith("mtp.") else v) for k, v in tensors.items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Path:
    from ninfer_convert.pipeline import convert

    directory = tmp_path_factory.mktemp("tiny_vlm_mtp")
    shutil.copytree(checkpoint, directory, dirs_exist_ok=True)
    add_vlm_mtp(directory)
    path = directory / "vlm_mtp.ninfer"
    convert("qwen3_5_bf16", {"base": str(directory)}, path)
    return path


@pytest.fixture(scope="module")
def plain(artifact: Path) -> Engine:
    return Engine(artifact, max_lanes=2, max_context=256)


def speculating(artifact: Path, k: int, max_context: int = 256, **options: Any) -> Engine:
    spec = SpecConfig(draft_tokens=k, proposal_head="full")
    return Engine(artifact, max_lanes=2, max_context=max_context, spec=spec, **options)


def record_rounds(engine: Engine) -> list[tuple[int, int]]:
    """Each speculative round's (sequence length, first draft) of its one lane."""
    rounds: list[tuple[int, int]] = []
    speculate = engine.runner.speculate

    def spy(states: Any, pending: Any, k: int, **kwargs: Any) -> Any:
        proposal = speculate(states, pending, k, **kwargs)
        rounds.append((states[0].length, int(proposal.drafts[0, 0])))
        return proposal

    engine.runner.speculate = spy  # type: ignore[method-assign]
    return rounds


def one_shot_drafts(
    engine: Engine, req: GenerationRequest, tokens: list[int], shifted: bool, rows: bool = True
):
    """The drafter's argmax after every token of prompt + ``tokens``, all in one chunk:
    main-model hidden rows at the prompt's M-RoPE positions (index + rope_delta after it),
    then the MTP block pairing hidden j with token j + 1 (an image's row at a placeholder)
    at token j + 1's position. ``shifted`` False: every position is the plain index (what
    ignoring images would do); ``rows`` False: the drafter embeds placeholders as tokens."""
    prompt, _ = engine.render(req)
    images = engine.vision.encode(np.asarray(prompt, dtype=np.int64), req.images)
    ids = np.asarray([*prompt, *tokens], dtype=np.int64)
    n, p = len(ids), len(prompt)
    embedded, prompt_at = placed_inputs(engine.model, [(ids[:p], images, 0, p)])
    embedded = np.concatenate([embedded, engine.model.embed(ids[p:])])
    after = np.arange(p, n) + images.rope_delta
    positions = np.concatenate([prompt_at, np.broadcast_to(after, (3, n - p))], axis=1)
    if not shifted:
        positions = np.broadcast_to(np.arange(n), (3, n))
    runner = engine.runner
    state = runner.new_pool(lanes=1, max_context=256, draft_tokens=1).open(256)
    out = runner.forward([ids], [state], embeddings=embedded, positions=positions)
    batch = runner.batch([Lane(slice(0, n - 1), 0, state)], positions[:, 1:])
    inputs = embedded[1:] if rows else None
    logits = engine.model.mtp_logits(out.hidden[0][:-1], ids[1:], batch, state.pool.mtp, inputs)
    return np.argmax(np.asarray(logits), axis=-1)


@pytest.mark.parametrize(
    ("k", "parts"),
    [(1, (TOWER, "and", CAT, "compare them.")), (3, ("What is this?", CAT))],
    ids=["k1-two-images", "k3-one-image"],
)
def test_greedy_with_images_is_unchanged_by_speculation(artifact, plain, k, parts) -> None:
    req = request(*parts, sampling=LONG)
    engine = speculating(artifact, k)
    assert engine.vision is not None  # images are taken with spec now
    rounds = record_rounds(engine)
    tokens, finished = run(engine, req)
    assert tokens == run(plain, req)[0]
    assert engine.spec_stats.rounds > 0 and engine.spec_stats.drafted > 0
    assert finished.usage.images == len(req.images)
    drafts = one_shot_drafts(plain, req, tokens, shifted=True)
    assert [d for _, d in rounds] == [int(drafts[length - 1]) for length, _ in rounds]
    # the check has teeth: positions that ignore the images, or placeholders embedded as
    # tokens, draft otherwise
    for shifted, rows in ((False, True), (True, False)):
        other = one_shot_drafts(plain, req, tokens, shifted, rows)
        assert any(int(other[length - 1]) != d for length, d in rounds)


def test_lanes_with_and_without_images_speculate_together(artifact, plain) -> None:
    """One lane after an image (rope_delta < 0), one text-only lane (delta 0), and a
    second turn resumed from the prefix cache past its image: as without speculation."""
    requests = [
        request(TOWER, "and", CAT, "compare them.", sampling=LONG),
        request("Just text, no picture.", sampling=LONG),
    ]
    engine = speculating(artifact, 2, prefix_cache=True)
    assert concurrent(engine, requests) == concurrent(plain, requests)
    assert engine.spec_stats.rounds > 0
    messages = [*requests[0].messages, {"role": "assistant", "content": "two pictures"},
                {"role": "user", "content": "Which is taller?"}]  # fmt: skip
    later = GenerationRequest(messages=messages, images=requests[0].images, sampling=LONG)
    tokens, done = run(engine, later)
    assert 0 < done.usage.cached_tokens < done.usage.prompt_tokens
    assert tokens == run(plain, later)[0]


def test_cli_image_with_spec_mtp(artifact, tmp_path) -> None:
    """``ninfer --image ... --spec mtp`` gives the ids ``ninfer --image ...`` gives, with
    its speculative-rounds line."""
    import json

    from click.testing import CliRunner

    from ninfer_runtime.cli import main as ninfer_cli

    (tmp_path / "cat.png").write_bytes(CAT)
    args = [str(artifact), "--prompt", "What is this?", "--image", str(tmp_path / "cat.png")]
    args += ["--greedy", "--max-tokens", "8", "--print-token-ids"]
    ids = []
    for extra in ([], ["--spec", "mtp", "--draft-tokens", "1", "--stats"]):
        result = CliRunner().invoke(ninfer_cli, [*args, *extra])
        assert result.exit_code == 0, result.output
        ids.append(json.loads(result.stdout.strip().splitlines()[-1]))
    assert ids[0] == ids[1] and len(ids[0]) == 8
    assert "[speculative: " in result.stderr


def test_preempted_image_lanes_speculate_as_unconstrained_ones(artifact, plain) -> None:
    """Image requests whose generations need more pages than the pool has: preempted lanes
    read their prompts again (images and drafter rows placed) and replay their tokens at
    shifted positions, then speculate on; every stream equals an unconstrained run's."""
    sampling = SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)
    requests = [
        request("What is this?", CAT, sampling=sampling),
        request(TOWER, "and", CAT, "compare them.", sampling=sampling),
    ]
    roomy = speculating(artifact, 2, max_context=512)
    budget = roomy.pool.slots * roomy.pool.slot_bytes + 3 * roomy.pool.page_bytes
    small = speculating(artifact, 2, max_context=512, context_capacity=budget)
    assert concurrent(small, requests) == concurrent(roomy, requests)
    assert small.preemptions > 0 and small.replayed_tokens > 0 and small.spec_stats.rounds > 0
