"""More than eight lanes where the backend runs them, and the lane limits' messages."""

from __future__ import annotations

import pytest

from ninfer_runtime import backends
from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
from ninfer_runtime.errors import EngineError
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.lane_limits import MAX_LANES, backend_max_lanes

LANES = 24
TOKENS = 3


def _requests() -> list[GenerationRequest]:
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    return [
        GenerationRequest(prompt=f"lane {i}: " + "ab" * (i % 5), sampling=params)
        for i in range(LANES)
    ]


def run_together(engine: Engine, requests: list[GenerationRequest]) -> tuple[list[list[int]], int]:
    """Each request's token ids with all of them submitted at once, and the most lanes used."""
    ids = {engine.submit(request): [] for request in requests}
    most = 0
    while engine.has_work:
        events = engine.step()
        most = max(most, engine.lanes_in_use)
        for event in events:
            if isinstance(event, TokenEvent):
                ids[event.request_id].append(event.token_id)
    return list(ids.values()), most


def test_twenty_four_lanes_decode_what_each_request_decodes_alone(artifact_path):
    engine = Engine(artifact_path("qwen3_5_bf16", "dense"), max_context=64, max_lanes=LANES)
    alone = [run_together(engine, [request])[0][0] for request in _requests()]
    together, most = run_together(engine, _requests())
    assert most == LANES
    assert together == alone
    assert all(len(tokens) == TOKENS for tokens in together)


def test_the_cpu_backend_runs_the_products_most_lanes_and_no_more(artifact_path):
    assert backend_max_lanes("cpu") == MAX_LANES == 64
    with pytest.raises(EngineError, match=r"^max_lanes 65: the cpu backend runs at most 64 lanes$"):
        Engine(artifact_path("qwen3_5_bf16", "dense"), max_lanes=65)
    with pytest.raises(EngineError, match="at least 1 lane"):
        Engine(artifact_path("qwen3_5_bf16", "dense"), max_lanes=0)


class EightRows:
    """A backend whose kernels take 8 rows (it is refused before it is ever created)."""

    name = "eight-rows"
    max_lanes = 8


class Unstated:
    """A backend that states no limit: the first backends' 8."""

    name = "unstated"


def test_a_backend_limits_the_lanes_before_anything_loads(artifact_path, monkeypatch):
    def never() -> EightRows:
        raise AssertionError("refused settings must not create the backend")

    for name, kind in (("eight-rows", EightRows), ("unstated", Unstated)):
        monkeypatch.setitem(backends._FACTORIES, name, never)  # registered for this test only
        monkeypatch.setitem(backends._CLASSES, name, lambda kind=kind: kind)
    assert backend_max_lanes("eight-rows") == backend_max_lanes(Unstated()) == 8
    assert backend_max_lanes("cuda") == 64  # CudaTraits: known on a machine without CuPy too
    for name in ("eight-rows", "unstated"):
        with pytest.raises(EngineError, match=rf"^max_lanes 9: the {name} backend runs at most 8 "):
            Engine(artifact_path("qwen3_5_bf16", "dense"), backend=name, max_lanes=9)
