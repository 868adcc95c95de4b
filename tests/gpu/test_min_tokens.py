"""``min_tokens`` on the CUDA backend's device sampler against the CPU engine.

Lanes without penalties draw their tokens on the device; a lane still short of its
``min_tokens`` has its stop tokens masked in a copy of the logits rows (the rows themselves
are scored for logprobs, as on the CPU). Checked on the bundled model, whose answer to "Hi" is
five tokens and an end of turn, with four lanes in the same steps:

* greedy with ``min_tokens``: the end of turn is held back, and the token drawn in its place
  (and the ones after, while the backends agree) is the CPU engine's;
* sampled, with a stop token id as well: neither stops the output early;
* a lane without ``min_tokens``: its tokens are those of the same request alone and on the
  CPU (the mask of its neighbours does not reach it);
* with ``logprobs``: the scores of the tokens are the CPU's, within bf16 rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bundled import BUNDLED

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

#: |Δ| of a log-probability between the backends (bf16 activations on the GPU)
TOL = 0.05
PERIOD = 13  # the bundled tokenizer's "."


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("min_tokens_bundled") / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, out)
    return out


LANES: list[dict[str, Any]] = [
    {"temperature": 0.0, "min_tokens": 12},
    {"temperature": 0.8, "seed": 5, "min_tokens": 10, "stop_token_ids": [PERIOD]},
    {"temperature": 0.0},
    {"temperature": 0.0, "min_tokens": 8, "logprobs": 2},
]


def run(engine: Any, lanes: list[dict[str, Any]]) -> list[list[Any]]:
    """The lanes' requests in flight together: each one's token events, in order."""
    from ninfer_runtime.engine import Failed, Finished, GenerationRequest, TokenEvent
    from ninfer_runtime.frontend import SamplingParams

    out: dict[str, list[Any]] = {}
    for fields in lanes:
        request = GenerationRequest(
            messages=[{"role": "user", "content": "Hi"}],
            enable_thinking=False,
            sampling=SamplingParams(**{"max_tokens": 32, **fields}),
        )
        out[engine.submit(request)] = []
    done = 0
    while done < len(lanes):
        for event in engine.step():
            assert not isinstance(event, Failed), event
            if isinstance(event, TokenEvent):
                out[event.request_id].append(event)
            elif isinstance(event, Finished):
                done += 1
    return list(out.values())


def ids(events: list[Any]) -> list[int]:
    return [e.token_id for e in events]


def test_min_tokens_on_the_device_sampler_matches_the_cpu(artifact: Path) -> None:
    from ninfer_runtime.engine import Engine

    cpu = Engine(artifact, max_context=256)
    gpu = Engine(artifact, backend="cuda", max_context=256)
    assert gpu.model.backend.device_sampler() is not None  # no lane here has penalties
    stops = set(cpu.tokenizer.eos_token_ids)
    expected = [run(cpu, [lane])[0] for lane in LANES]
    got = run(gpu, LANES)
    alone = run(gpu, [LANES[2]])[0]
    assert len(ids(expected[2])) == 5  # the plain answer ends after five tokens
    for lane, tokens in zip(LANES, got, strict=True):
        least = lane.get("min_tokens", 0)
        held = stops | set(lane.get("stop_token_ids", ()))
        assert len(tokens) >= least and not held.intersection(ids(tokens)[:least]), lane
    assert ids(got[2]) == ids(alone) == ids(expected[2])
    agree = {}
    for i in (0, 3):
        pairs = zip(ids(got[i]), ids(expected[i]), strict=False)
        agree[i] = next(
            (j for j, (a, b) in enumerate(pairs) if a != b), min(len(got[i]), len(expected[i]))
        )
        # where the CPU's end of turn was masked, the GPU drew the same token in its place
        assert agree[i] > 5, f"lane {i}: the backends' tokens part after {agree[i]}"
        REPORT.append(("min_tokens cuda vs cpu", f"lane {i} tokens agreeing", str(agree[i])))
    # scores come from the rows before the mask: the end of turn is still the top token there
    for events in (got[3], expected[3]):
        assert events[5].top_logprobs[0][0] in stops
    scored = list(zip(got[3], expected[3], strict=False))[: agree[3]]
    worst = max(abs(g.logprob - e.logprob) for g, e in scored)
    assert worst < TOL
    REPORT.append(("min_tokens cuda vs cpu", "logprobs max |Δ|", f"{worst:.2e}"))
