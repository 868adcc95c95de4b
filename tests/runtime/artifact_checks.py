"""Checks that the converted-artifact tests of each model run alike: ``ninfer --raw --greedy``
beside transformers' greedy ``generate``, and the prefix cache's streams beside a cold run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from ninfer_runtime.cli import main as ninfer_cli
from ninfer_runtime.engine import Engine
from tests.runtime.test_prefix_cache import _serve


def cli_and_transformers_greedy(
    artifact: Path, checkpoint: Path, hf: Any, prompt: str, max_tokens: int = 12
) -> tuple[list[int], list[int], list[int]]:
    """The prompt's ids (the checkpoint's tokenizer), the ids ``ninfer --raw --greedy`` prints
    for it, and the ids transformers' greedy ``generate`` continues it with (``hf`` in eval)."""
    import torch
    from tokenizers import Tokenizer

    args = ["--raw", "--prompt", prompt, "--greedy", "--max-tokens", str(max_tokens)]
    out = CliRunner().invoke(ninfer_cli, [str(artifact), *args, "--print-token-ids"])
    assert out.exit_code == 0, out.output
    ours = json.loads(out.stdout.strip().splitlines()[-1])
    ids = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(prompt).ids
    with torch.no_grad():
        generated = hf.generate(
            torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
            eos_token_id=hf.generation_config.eos_token_id, pad_token_id=0,
        )[0, len(ids):].tolist()  # fmt: skip
    return ids, ours, generated


def assert_warm_streams_equal_cold(artifact: Path, rng: np.random.Generator) -> None:
    """A 70-token system prompt, three prompts that continue it, then the system prompt alone:
    with the prefix cache (a checkpoint every 32 tokens) the streams equal a cold engine's, and
    the second and third prompts resume from 64 cached tokens."""
    system = rng.integers(0, 400, 70).tolist()
    prompts = [system + rng.integers(0, 400, n).tolist() for n in (3, 20, 9)] + [system]
    cold = _serve(Engine(artifact, max_lanes=2, max_context=256, prefill_chunk=32), prompts)
    warm_engine = Engine(artifact, max_lanes=2, max_context=256, prefill_chunk=32,
                         prefix_cache=True, checkpoint_interval=32)  # fmt: skip
    warm = _serve(warm_engine, prompts)
    assert [t for t, _ in warm] == [t for t, _ in cold]
    assert [f.usage.cached_tokens for _, f in warm][1:3] == [64, 64]
