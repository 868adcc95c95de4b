"""Checkpoints at the boundaries requests name (``GenerationRequest.cache_boundaries``) and
the prefix cache's salts, on the CPU reference with the bundled model: requests that share
a long prompt prefix and differ after it resume at the boundary, together or one after the
other, with the same greedy tokens as with the cache off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.checkpoint_plan import (
    MAX_NEW_CHECKPOINTS,
    awaited_position,
    choose_checkpoints,
    pending_checkpoints,
)
from ninfer_runtime.engine import (
    CacheBoundary,
    Engine,
    Finished,
    GenerationRequest,
    TokenEvent,
)
from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend import SamplingParams
from tests.runtime.test_prefix_cache import _check_pool

SHARED = 320  # tokens of the shared "system prompt"
TAIL = 10  # tokens of each request's own question after it


@pytest.fixture(scope="module")
def artifact(bundled_bf16: Path) -> Path:
    return bundled_bf16


def _prompts(count: int, seed: int = 0, shared: int = SHARED) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 500, shared).tolist()
    return [system + rng.integers(0, 500, TAIL).tolist() for _ in range(count)]


def _engine(artifact: Path, cache: bool = True, **kw) -> Engine:
    kw = {"max_lanes": 2, "max_context": 1024, "prefill_chunk": 64, **kw}
    return Engine(artifact, prefix_cache=cache, **kw)


def _request(prompt, boundaries=(SHARED,), kind="boundary", salt=None) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=prompt,
        sampling=SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        parse_output=False,
        cache_boundaries=[CacheBoundary(p, kind) for p in boundaries],
        cache_salt=salt,
    )


def _run(engine: Engine, requests, between=None) -> list[tuple[list[int], Finished]]:
    """Every request submitted at once and stepped to the end (the pool checked after
    every step; ``between(engine, step)`` runs before each step): tokens and Finished
    (None for a request cancelled between steps: ``cancel`` returned its Finished)."""
    ids = [engine.submit(r) for r in requests]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    done: dict[str, Finished] = {}
    steps = 0
    while engine.has_work:
        assert steps < 2000, "the engine stopped making progress"
        if between is not None:
            between(engine, steps)
        steps += 1
        for e in engine.step():
            if isinstance(e, TokenEvent):
                tokens[e.request_id].append(e.token_id)
            elif isinstance(e, Finished):
                done[e.request_id] = e
        if engine.cache is not None:
            _check_pool(engine)
    return [(tokens[rid], done.get(rid)) for rid in ids]  # a cancelled one has none


def _one_by_one(engine: Engine, requests) -> list[tuple[list[int], Finished]]:
    return [_run(engine, [r])[0] for r in requests]


def _cold(artifact: Path, prompts) -> list[list[int]]:
    return [t for t, _ in _one_by_one(_engine(artifact, cache=False), map(_request, prompts))]


def test_a_second_request_resumes_at_the_shared_boundary(artifact) -> None:
    prompts = _prompts(2)
    engine = _engine(artifact)
    warm = _one_by_one(engine, [_request(p) for p in prompts])
    assert [f.usage.cached_tokens for _, f in warm] == [0, SHARED]
    assert [t for t, _ in warm] == _cold(artifact, prompts)
    counts = engine.cache.checkpoint_counts()
    # the boundary once (the second request resumed there), each prompt's end and reply's
    assert counts == {
        "prompt_end": 2, "boundary": 1, "breakpoint": 0, "interval": 0, "generation": 2,
    }  # fmt: skip


def test_requests_submitted_together_wait_for_the_shared_checkpoint(artifact) -> None:
    """Of three requests arriving in the same step, the third is held back until the first
    has written the boundary they share, then resumes from it; the second, sharing too
    little of the prompt to be worth waiting for (less than a prefill chunk), is admitted
    at once."""
    prompts = _prompts(2, seed=1)
    short = prompts[0][:40] + list(range(300))
    engine = _engine(artifact, max_lanes=3)
    lanes = []
    out = _run(
        engine,
        [_request(prompts[0]), _request(short, boundaries=(40,)), _request(prompts[1])],
        between=lambda e, step: lanes.append(e.lanes_in_use),
    )
    assert [f.usage.cached_tokens for _, f in out] == [0, 0, SHARED]
    assert lanes[1] == 2  # after the first step: the first and the second, the third waits
    assert [t for t, _ in out] == _cold(artifact, [prompts[0], short, prompts[1]])
    assert engine.cache.checkpoint_counts()["boundary"] == 2  # SHARED, and the short one's 40


def test_a_request_waiting_for_a_checkpoint_does_not_hold_up_those_behind_it(artifact) -> None:
    """The second request waits for the first one's shared boundary; an unrelated third,
    submitted after it, is admitted at once (a free lane and room are all it needs); the
    second still resumes from the boundary."""
    prompts = _prompts(2, seed=9)
    other = np.random.default_rng(10).integers(0, 500, SHARED + TAIL).tolist()
    engine = _engine(artifact, max_lanes=3)
    lanes = []
    out = _run(
        engine,
        [_request(prompts[0]), _request(prompts[1]), _request(other, boundaries=())],
        between=lambda e, step: lanes.append(e.lanes_in_use),
    )
    assert lanes[1] == 2  # the first and the third run; the second waits for the boundary
    assert [f.usage.cached_tokens for _, f in out] == [0, SHARED, 0]
    assert [t for t, _ in out] == _cold(artifact, [prompts[0], prompts[1], other])


def test_a_waiting_request_goes_on_when_the_writer_is_cancelled(artifact) -> None:
    prompts = _prompts(2, seed=2)
    engine = _engine(artifact)
    first, second = _request(prompts[0]), _request(prompts[1])

    def cancel_first(e: Engine, step: int) -> None:
        if step == 2:  # the first has read two chunks of the shared prompt; the second waits
            assert e.lanes_in_use == 1
            assert e.cancel(first.request_id).reason == "cancelled"

    out = _run(engine, [first, second], between=cancel_first)
    tokens, finished = out[1]
    assert finished.reason != "cancelled" and finished.usage.cached_tokens == 0
    assert tokens == _cold(artifact, prompts[1:])[0]
    assert engine.cache.checkpoint_counts()["boundary"] == 1  # the second wrote its own


def test_a_waiting_request_goes_on_when_the_writer_has_no_room_for_it(artifact) -> None:
    """The first request passes the shared boundary without keeping its checkpoint (no
    pages for a snapshot, here by refusing it): the second stops waiting and reads the
    whole prompt itself."""
    prompts = _prompts(2, seed=9)
    engine = _engine(artifact)
    keep = engine.pool.keep

    def keep_no_boundary(state, hidden=None, logits=None, kind="prompt_end"):
        return None if kind == "boundary" else keep(state, hidden, logits, kind)

    engine.pool.keep = keep_no_boundary
    lanes = []
    out = _run(
        engine,
        [_request(p) for p in prompts],
        between=lambda e, step: lanes.append(e.lanes_in_use),
    )
    assert lanes[1:6] == [1] * 5  # waits while the first reads its five chunks up to 320
    assert lanes[6] == 2 and [f.usage.cached_tokens for _, f in out] == [0, 0]
    assert [t for t, _ in out] == _cold(artifact, prompts)


def test_a_client_breakpoint_is_kept_and_resumed(artifact) -> None:
    prompts = _prompts(2, seed=3)
    engine = _engine(artifact)
    requests = [_request(p, boundaries=(200,), kind="breakpoint") for p in prompts]
    warm = _one_by_one(engine, requests)
    assert [f.usage.cached_tokens for _, f in warm] == [0, 200]
    assert [t for t, _ in warm] == _cold(artifact, prompts)
    counts = engine.cache.checkpoint_counts()
    assert counts["breakpoint"] == 1 and counts["boundary"] == 0


def test_at_most_four_new_checkpoints_per_request(artifact) -> None:
    """Ten boundaries: the four that save most (here the deepest) are kept; a second
    request naming them again resumes from the deepest and keeps no duplicate."""
    prompts = _prompts(2, seed=4)
    positions = list(range(32, SHARED + 1, 32))
    engine = _engine(artifact)
    _run(engine, [_request(prompts[0], boundaries=positions)])
    lengths = sorted(c.length for c in engine.cache.checkpoints() if c.kind == "boundary")
    assert lengths == sorted(positions)[-MAX_NEW_CHECKPOINTS:]
    (_, finished), = _run(engine, [_request(prompts[1], boundaries=positions)])  # fmt: skip
    assert finished.usage.cached_tokens == max(positions)
    assert engine.cache.checkpoint_counts()["boundary"] == MAX_NEW_CHECKPOINTS


def test_different_salts_never_share(artifact) -> None:
    prompts = _prompts(5, seed=5)
    engine = _engine(artifact, max_lanes=4)  # room for every checkpoint: none is evicted
    salts = ["tenant-a", "tenant-b", None, "", "tenant-a"]
    out = _one_by_one(engine, [_request(p, salt=s) for p, s in zip(prompts, salts, strict=True)])
    # only the last, salted as the first, resumes at the boundary the first kept
    assert [f.usage.cached_tokens for _, f in out] == [0, 0, 0, 0, SHARED]
    assert [t for t, _ in out] == _cold(artifact, prompts)
    cache = engine.cache
    assert cache.checkpoint_counts()["boundary"] == 4  # one per namespace
    assert cache.lookup(prompts[0], salt="tenant-a").length == len(prompts[0])
    assert cache.lookup(prompts[0], salt="tenant-c") is None
    assert cache.lookup(prompts[0], salt=None).length == SHARED  # the unsalted boundary
    assert cache.lookup(prompts[0], salt="").length == SHARED


def test_different_salts_do_not_wait_for_each_other(artifact) -> None:
    prompts = _prompts(2, seed=6)
    engine = _engine(artifact)
    lanes = []
    out = _run(
        engine,
        [_request(prompts[0], salt="a"), _request(prompts[1], salt="b")],
        between=lambda e, step: lanes.append(e.lanes_in_use),
    )
    assert lanes[1] == 2 and [f.usage.cached_tokens for _, f in out] == [0, 0]


def test_checkpoints_are_counted_by_kind(artifact) -> None:
    prompts = _prompts(1, seed=7)
    engine = _engine(artifact, checkpoint_interval=128)
    request = _request(prompts[0], boundaries=(128, 300))
    request.cache_boundaries = [CacheBoundary(128, "breakpoint"), CacheBoundary(300)]
    _run(engine, [request])
    # 128 is an interval position too: it is kept once, as the client's breakpoint
    assert engine.cache.checkpoint_counts() == {
        "prompt_end": 1, "boundary": 1, "breakpoint": 1, "interval": 1, "generation": 1,
    }  # fmt: skip


@pytest.mark.parametrize(
    "boundary, words",
    [
        (CacheBoundary(0), "position 0 is outside the 330-token prompt"),
        (CacheBoundary(331), r"position 331 is outside the 330-token prompt \(expected 1\.\.330\)"),
        (CacheBoundary(5, "sometimes"), "is not a CacheBoundary of kind"),
        (5, "5 is not a CacheBoundary"),
    ],
)
def test_bad_boundaries_are_refused_in_one_line(artifact, boundary, words) -> None:
    engine = _engine(artifact)
    request = _request(_prompts(1)[0])
    request.cache_boundaries = [boundary]
    with pytest.raises(RequestError, match=words) as raised:
        engine.submit(request)
    assert raised.value.param == "cache_boundaries" and "\n" not in str(raised.value)


def test_a_salt_that_is_not_unicode_text_is_refused_at_submit(artifact) -> None:
    """Refused in one line when submitted, not when the engine's step looks it up (which
    would fail every running request with it)."""
    engine = _engine(artifact)
    with pytest.raises(RequestError, match="cache_salt is not valid Unicode") as raised:
        engine.submit(_request(_prompts(1)[0], salt="tenant-\ud800"))
    assert raised.value.param == "cache_salt" and not engine.has_work
    engine.submit(_request(_prompts(1)[0], salt="tenant-\u00e9"))  # any real text is taken


def test_the_choice_goes_by_expected_value() -> None:
    def choose(positions, *, kinds=None, resumed=0, anyway=(), exists=(), shared=()):
        kinds = kinds or {}
        return choose_checkpoints(
            [CacheBoundary(p, kinds.get(p, "boundary")) for p in positions],
            prompt_tokens=1000,
            resumed=resumed,
            kept_anyway=lambda p: p in anyway,
            exists=lambda p: p in exists,
            shared_lengths=shared,
        )

    # without sharers, the deepest four
    assert sorted(choose([100, 200, 300, 400, 500, 600])) == [300, 400, 500, 600]
    # a boundary another live request or cached checkpoint shares counts once per sharer:
    # 250 shared by two (750) goes before 600 and 500 and 400 alone
    assert sorted(choose([250, 400, 500, 600, 700], shared=[260, 255])) == [250, 500, 600, 700]
    # equal value: the client's breakpoint first (200 shared by one = 400 alone)
    picked = choose([200, 400, 500, 600, 700], kinds={200: "breakpoint"}, shared=[210])
    assert sorted(picked) == [200, 500, 600, 700] and picked[200] == "breakpoint"
    # a position kept anyway takes no place among the four; existing and resumed ones none
    picked = choose([100, 200, 300, 400, 500, 600, 999], anyway=[600], exists=[500], resumed=100)
    assert picked == {600: "boundary", 999: "boundary", 400: "boundary", 300: "boundary",
                      200: "boundary"}  # fmt: skip
    # a boundary a few tokens before the prompt's end is a candidate like any other
    assert 999 in choose([999])


def test_many_boundaries_ask_whether_a_checkpoint_exists_of_the_best_few_only() -> None:
    """Asking costs a hash of the prompt up to the position: of 5000 boundaries only the
    best candidates are asked about, until four new ones are found."""
    asked = []

    def exists(position: int) -> bool:
        asked.append(position)
        return position in (4999, 4997)  # two of the deepest are cached already

    picked = choose_checkpoints(
        [CacheBoundary(p) for p in range(1, 5000)],
        prompt_tokens=5000,
        resumed=0,
        kept_anyway=lambda p: False,
        exists=exists,
        shared_lengths=[],
    )
    assert sorted(picked) == [4994, 4995, 4996, 4998]
    assert len(asked) == len(set(asked)) == 4 + 2


def test_a_prefill_still_keeps_its_planned_interval_and_end_checkpoints_ahead() -> None:
    ahead = pending_checkpoints([100, 320, 700], prefilled=320, prompt_tokens=1000, interval=256)
    assert ahead == [700, 512, 768, 1000]  # 100 and 320 are read already
    assert pending_checkpoints([], prefilled=511, prompt_tokens=512, interval=256) == [512]


def test_the_awaited_checkpoint_is_the_deepest_the_prompt_can_resume_from() -> None:
    prompt = np.arange(100)
    other = np.concatenate([np.arange(60), -np.ones(40, dtype=np.int64)])
    # another prompt sharing 60 tokens: its checkpoints up to 60 serve, deeper ones not
    assert awaited_position(prompt, [(other, [30, 60, 80, 100])]) == 60
    # the same prompt: its end serves (the writer keeps its last logits there)
    assert awaited_position(prompt, [(other, [30]), (prompt.copy(), [50, 100])]) == 100
    # a longer prompt's checkpoint at this prompt's end has no logits: it does not serve
    longer = np.arange(150)
    assert awaited_position(prompt, [(longer, [40, 100, 150])]) == 40
    # a prompt this one extends: its end serves
    assert awaited_position(prompt, [(np.arange(70), [70])]) == 70
    assert awaited_position(prompt, []) == 0


def test_positions_of_any_integer_type_are_taken(artifact) -> None:
    engine = _engine(artifact)
    request = _request(_prompts(1, seed=8)[0], boundaries=(np.int64(SHARED),))
    _run(engine, [request])
    assert engine.cache.checkpoint_counts()["boundary"] == 1
