"""Several prompts read in one prefill forward on the CUDA backend (graphs on), on the
bundled model: the lanes' tails after a shared cached prefix, and short prompts submitted
together, get the greedy tokens each gets alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
from ninfer_runtime.frontend import SamplingParams
from tests.bundled import BUNDLED

from .conftest import requires_gpu

pytestmark = requires_gpu


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("packed_bundled") / "tiny.ninfer"
    convert("tiny_mixed", {"base": str(BUNDLED)}, out)
    return out


def _greedy(engine: Engine, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """Every prompt submitted at once: each one's greedy tokens, and the token counts of
    every multi-token forward (the prefill reads)."""
    reads: list[list[int]] = []
    forward = engine.runner.forward

    def recorded(tokens_per_lane, states, **kwargs):  # type: ignore[no-untyped-def]
        if any(len(t) > 1 for t in tokens_per_lane):
            reads.append([len(t) for t in tokens_per_lane])
        return forward(tokens_per_lane, states, **kwargs)

    engine.runner.forward = recorded  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ids = [engine.submit(GenerationRequest(prompt_ids=p, sampling=params)) for p in prompts]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_work:
        for e in engine.step():
            if isinstance(e, TokenEvent):
                tokens[e.request_id].append(e.token_id)
    engine.runner.forward = forward  # type: ignore[method-assign]
    return [tokens[rid] for rid in ids], reads


@pytest.mark.parametrize("shared", [0, 200])
def test_packed_reads_give_the_tokens_of_reads_alone(artifact: Path, shared: int) -> None:
    rng = np.random.default_rng(shared)
    system = rng.integers(0, 500, shared).tolist()
    prompts = [system + rng.integers(0, 500, n).tolist() for n in (12, 20, 9, 30)]
    kw = dict(backend="cuda", max_lanes=4, max_context=1024, prefill_chunk=128)
    alone = []
    for p in prompts:
        tokens, _ = _greedy(Engine(artifact, **kw), [p])
        alone += tokens
    engine = Engine(artifact, prefix_cache=True, **kw)
    if shared:  # the shared prefix cached first: the four then read only their tails
        _greedy(engine, [system])
    together, reads = _greedy(engine, prompts)
    assert together == alone
    assert [len(r) for r in reads] == [4], reads
