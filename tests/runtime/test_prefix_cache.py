"""The prefix cache on the CPU reference: requests resume from checkpoints of earlier prompts
and generations, and their outputs equal cold runs token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_convert.pipeline import convert
from ninfer_runtime.engine import (
    SHORT_CHUNK_TOKENS,
    CacheBoundary,
    Engine,
    Finished,
    GenerationRequest,
    TokenEvent,
)
from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.speculative import SpecConfig
from tests.bundled import BUNDLED


def _requests(seed: int = 0) -> list[list[int]]:
    """A shared 300-token "system prompt" with branches of different lengths after it, a
    prompt that leaves it after 150 tokens, then the branches again, the last one twice."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 400, 300).tolist()
    branches = [system + rng.integers(0, 400, n).tolist() for n in (5, 40, 1, 77)]
    return [*branches[:1], [*system[:150], 1, 2, 3], *branches[1:], *branches, branches[-1]]


def _serve(engine: Engine, prompts, **sampling) -> list[tuple[list[int], Finished]]:
    """One request at a time (so each can find the checkpoints of those before it)."""
    out = []
    for prompt in prompts:
        params = SamplingParams(**{"temperature": 0.0, "max_tokens": 20, **sampling})
        request = GenerationRequest(prompt_ids=prompt, sampling=params, parse_output=False)
        tokens, finished = [], None
        for event in engine.generate(request):
            if isinstance(event, TokenEvent):
                tokens.append(event.token_id)
            elif isinstance(event, Finished):
                finished = event
        out.append((tokens, finished))
    return out


def _concurrent(engine: Engine, prompts, params: SamplingParams) -> list[list[int]]:
    """Every prompt submitted at once, stepped to the end (the pool checked after every
    step when the engine caches): each request's streamed token ids."""
    ids = {}
    for p in prompts:
        request = GenerationRequest(prompt_ids=p, sampling=params, parse_output=False)
        ids[engine.submit(request)] = []
    while engine.has_work:
        for e in engine.step():
            if isinstance(e, TokenEvent):
                ids[e.request_id].append(e.token_id)
        if engine.cache is not None:
            _check_pool(engine)
    return list(ids.values())


def _capacity(pool, pages: int) -> int:
    """Bytes of a pool with ``pool``'s lanes (their state slots) and ``pages`` pages."""
    return pool.slots * pool.slot_bytes + pages * pool.page_bytes


def _engine(art: Path, cache: bool, **kw) -> Engine:
    return Engine(
        art, max_lanes=2, max_context=4096, prefill_chunk=128, prefix_cache=cache,
        checkpoint_interval=64, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_outputs_equal_a_cold_run(artifact_path, kind) -> None:
    art = artifact_path("qwen3_5_bf16", kind)
    prompts = _requests()
    for sampling in ({}, {"temperature": 0.9, "seed": 5}):
        cold = _serve(_engine(art, False), prompts, **sampling)
        warm_engine = _engine(art, True)
        warm = _serve(warm_engine, prompts, **sampling)
        assert [t for t, _ in warm] == [t for t, _ in cold]
        cached = [f.usage.cached_tokens for _, f in warm]
        assert cached[0] == 0
        assert cached[1] == 128  # the last 64-token boundary before it leaves the system prompt
        assert cached[2:5] == [256] * 3  # the system prompt's last boundary
        # the same prompts again: at least the system prompt (their own checkpoints may
        # have been evicted for the ones after them: 8 snapshot slots in all), and a prompt
        # repeated at once resumes whole, from its own checkpoint's logits
        assert all(c >= 256 for c in cached[5:])
        assert cached[-1] == len(prompts[-1])
        stats = warm_engine.cache.stats
        assert stats.hit_tokens == sum(cached)
        assert [f.usage.cached_tokens for _, f in cold] == [0] * len(prompts)


def test_concurrent_lanes_share_the_prefix(artifact_path) -> None:
    """Requests running at once: later ones resume from the checkpoints earlier ones left."""
    art = artifact_path("qwen3_5_bf16", "dense")
    prompts = _requests(seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=16)

    def run(cache: bool) -> list[list[int]]:
        return _concurrent(_engine(art, cache), prompts, params)

    assert run(True) == run(False)


def test_speculative_decoding_resumes_too(artifact_path) -> None:
    art = artifact_path("qwen3_5_bf16", "dense")
    prompts = _requests(seed=1)
    cold = _serve(_engine(art, False), prompts)
    warm_engine = _engine(art, True, spec=SpecConfig(draft_tokens=3))
    warm = _serve(warm_engine, prompts)
    assert [t for t, _ in warm] == [t for t, _ in cold]
    assert warm_engine.cache.stats.hit_tokens > 0


@pytest.mark.parametrize("spec", [None, SpecConfig(draft_tokens=3)], ids=["plain", "mtp"])
def test_a_chat_turn_resumes_after_the_last_reply(tmp_path, spec, monkeypatch) -> None:
    """Turn 2 resends turn 1 as history: it resumes after every token of turn 1's prompt and
    reply that the template renders the same again (here up to the reasoning opener it
    leaves out of the history), and answers as a cold run does; with speculative decoding
    too. Turn 1's prompt is one prefill chunk, the checkpoint at its history's end kept
    inside it."""
    art = tmp_path / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, art)
    engine = Engine(art, max_context=512, prefix_cache=True, spec=spec)
    chunks: list[int] = []
    chunk = engine.runner._chunk

    def counted(lanes, ids, last_only, *placed):
        chunks.append(sum(len(i) for i in ids))
        return chunk(lanes, ids, last_only, *placed)

    monkeypatch.setattr(engine.runner, "_chunk", counted)
    greedy = SamplingParams(temperature=0.0)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = GenerationRequest(messages=messages, sampling=greedy)
    prompt_ids, _ = engine.render(first)
    reply_ids = [e.token_id for e in engine.generate(first) if isinstance(e, TokenEvent)]
    history_end = engine.intake.history_end(first, list(prompt_ids))
    assert history_end is not None and 1 < len(prompt_ids) - history_end <= SHORT_CHUNK_TOKENS
    assert chunks == [len(prompt_ids)]
    assert engine.cache.contains(list(prompt_ids[:history_end]), None)
    reply = engine.tokenizer.decode(reply_ids, skip_special_tokens=True)
    assert "Paris" in reply
    history = [*messages, {"role": "assistant", "content": reply.split("</think>")[-1].strip()}]
    second = GenerationRequest(
        messages=[*history, {"role": "user", "content": "What is the capital of Italy?"}],
        sampling=greedy,
    )
    second_ids, _ = engine.render(second)
    turn_one = list(prompt_ids) + reply_ids
    shared = next(i for i, (x, y) in enumerate(zip(turn_one, second_ids, strict=False)) if x != y)
    assert shared > len(prompt_ids) // 2
    events = list(engine.generate(second))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.usage.cached_tokens == shared
    cold = Engine(art, max_context=512).generate(second)
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == [
        e.token_id for e in cold if isinstance(e, TokenEvent)
    ]


def test_a_history_end_found_elsewhere_is_not_looked_for_again(bundled_bf16, monkeypatch):
    """A server finds a chat prompt's history end off the engine's thread and hands it to
    ``submit``, which then neither renders nor tokenizes the conversation again; without
    one, ``submit`` finds the same itself; without a prefix cache there is none."""
    engine = Engine(bundled_bf16, max_context=512, prefix_cache=True)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    request = GenerationRequest(messages=messages, sampling=SamplingParams(max_tokens=1))
    ids, opened = engine.render(request)
    found = engine.history_end(request, ids)
    assert found is not None and 0 < found < len(ids)
    assert Engine(bundled_bf16, max_context=512).history_end(request, ids) is None
    real = engine.intake.history_end

    def refused(*_):
        raise AssertionError("looked for again")

    monkeypatch.setattr(engine.intake, "history_end", refused)
    engine.submit(request, rendered=(ids, opened), history_end=found)
    monkeypatch.setattr(engine.intake, "history_end", real)
    again = GenerationRequest(messages=messages, sampling=SamplingParams(max_tokens=1))
    engine.submit(again)
    lanes = {a.request.request_id: a for a in engine.scheduler.waiting}
    assert lanes[request.request_id].history_end == lanes[again.request_id].history_end == found
    wrong = GenerationRequest(messages=messages, sampling=SamplingParams(max_tokens=1))
    with pytest.raises(RequestError, match=rf"^history_end is {len(ids)}; expected 1\.\.") as e:
        engine.submit(wrong, rendered=(ids, opened), history_end=len(ids))
    assert e.value.param == "history_end"


@pytest.mark.parametrize("spec", [None, SpecConfig(draft_tokens=3)], ids=["plain", "mtp"])
def test_the_next_turn_resumes_where_the_generation_ended(artifact_path, spec) -> None:
    """A prompt that continues a finished request's prompt and output resumes from the
    checkpoint kept where that generation ended: after every token it consumed, or with
    speculative decoding where its last (uncommitted) round began, at most K + 1 before."""
    art = artifact_path("qwen3_5_bf16", "dense")
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 400, 100).tolist()
    engine = _engine(art, True, spec=spec)
    ((reply, _),) = _serve(engine, [prompt], ignore_eos=True)
    turn = prompt + reply + rng.integers(0, 400, 10).tolist()
    ((tokens, finished),) = _serve(engine, [turn])
    consumed = len(prompt) + len(reply) - 1  # the last token was never fed
    if spec is None:
        assert finished.usage.cached_tokens == consumed
    else:
        assert consumed - 4 <= finished.usage.cached_tokens <= consumed
    assert tokens == _serve(_engine(art, False), [turn])[0][0]


def test_a_changed_tool_reuses_the_prefix_before_it(artifact_path) -> None:
    """Two prompts equal up to token 200 (a tool definition changes there): the second
    resumes from the last checkpoint boundary before 200, and its output is a cold run's."""
    art = artifact_path("qwen3_5_bf16", "dense")
    rng = np.random.default_rng(7)
    a = rng.integers(0, 400, 330).tolist()
    b = a[:200] + rng.integers(0, 400, 130).tolist()
    engine = _engine(art, True)
    _serve(engine, [a])
    ((tokens, finished),) = _serve(engine, [b])
    assert finished.usage.cached_tokens == 192  # 200 rounded down to the 64-token boundary
    assert tokens == _serve(_engine(art, False), [b])[0][0]


def test_eviction_never_frees_a_page_still_held(artifact_path) -> None:
    """A long random workload on a small pool: after every step the pages' holder counts
    equal the live sequences' and checkpoints' references, free pages are unheld, and
    every request completes as a cold run does."""
    art = artifact_path("qwen3_5_bf16", "dense")
    rng = np.random.default_rng(11)
    bases = [rng.integers(0, 400, 200).tolist() for _ in range(3)]
    prompts = [
        bases[rng.integers(0, 3)][: rng.integers(20, 200)] + rng.integers(0, 400, 9).tolist()
        for _ in range(30)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=12)

    def run(cache: bool) -> list[list[int]]:
        engine = Engine(
            art, max_lanes=3, max_context=320, prefill_chunk=64, prefix_cache=cache,
            checkpoint_interval=32,
        )  # fmt: skip
        ids = _concurrent(engine, prompts, params)
        if cache:
            assert engine.cache.stats.evictions > 0 and engine.cache.stats.hit_tokens > 0
        return ids

    assert run(True) == run(False)


def _check_pool(engine: Engine) -> None:
    pool = engine.pool
    held = np.zeros(pool.pages, dtype=np.int64)
    for a in engine.scheduler.active.values():
        held[a.state.pages] += 1
    for checkpoint in engine.cache.checkpoints():
        held[list(checkpoint.pages) + list(checkpoint.snapshot)] += 1
    assert np.array_equal(pool.holders(), held)
    free = set(pool.free_page_ids())
    assert len(free) == pool.free_pages
    assert free == set(np.flatnonzero(held == 0).tolist())
    # the pool's bytes by use (counted over the held pages) as the holder counts say
    running = np.zeros(pool.pages, dtype=bool)
    for a in engine.scheduler.active.values():
        running[a.state.pages] = True
    cached = int(((held > 0) & ~running).sum()) - pool.snapshot_pages_used
    by_use = engine.pool_bytes()
    assert by_use["kv_running"] == int(running.sum()) * pool.page_bytes
    assert by_use["kv_cached"] == cached * pool.page_bytes


@pytest.mark.parametrize("cache", [False, True])
def test_a_small_pool_preempts_and_replays_exactly(artifact_path, cache) -> None:
    """Four requests whose generations need twice the pages the pool has: lanes are
    preempted (memory freed) and replayed later, and every stream equals an unconstrained
    run's, token for token, none repeated (greedy and seeded sampling)."""
    art = artifact_path("qwen3_5_bf16", "dense")
    roomy = Engine(art, max_lanes=4, max_context=512)
    # five pages, shared by the lanes' K/V and (with the cache) the checkpoints
    budget = _capacity(roomy.pool, 5)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 400, 100 + 20 * i).tolist() for i in range(4)]
    for sampling in ({"temperature": 0.0}, {"temperature": 0.8, "seed": 3}):
        params = SamplingParams(max_tokens=300, ignore_eos=True, **sampling)

        small = Engine(
            art, max_lanes=4, max_context=512, context_capacity=budget, prefix_cache=cache
        )
        assert small.pool.pages == 5
        assert _concurrent(small, prompts, params) == _concurrent(roomy, prompts, params)
        assert small.preemptions > 0 and small.replayed_tokens > 0


def test_speculative_lanes_grow_and_are_preempted_exactly(artifact_path) -> None:
    """With MTP rounds, lanes' pages grow too (a round's margin ahead), and a pool too small
    for them preempts and replays (the drafter's entries replayed with the tokens): greedy
    streams equal plain decoding's, none repeated."""
    art = artifact_path("qwen3_5_bf16", "dense")
    roomy = Engine(art, max_lanes=4, max_context=512)
    spec = SpecConfig(draft_tokens=3)
    budget = _capacity(
        roomy.runner.new_pool(lanes=4, max_context=8, draft_tokens=3, step_rows=SHORT_CHUNK_TOKENS),
        5,
    )
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 400, 100 + 20 * i).tolist() for i in range(4)]
    params = SamplingParams(max_tokens=300, ignore_eos=True, temperature=0.0)
    for cache in (False, True):
        small = Engine(
            art, max_lanes=4, max_context=512, context_capacity=budget, prefix_cache=cache,
            spec=spec,
        )  # fmt: skip
        assert small.pool.pages == 5
        assert _concurrent(small, prompts, params) == _concurrent(roomy, prompts, params)
        assert small.preemptions > 0 and small.replayed_tokens > 0
        assert small.spec_stats.rounds > 0


def test_checkpoints_sharing_every_page_never_block_admission(artifact_path) -> None:
    """Two one-page lanes and checkpoints that all share the pages: a waiting request makes
    them go (all of them if need be), and every request finishes."""
    art = artifact_path("qwen3_5_bf16", "dense")
    engine = Engine(art, max_lanes=2, max_context=256, prefix_cache=True, checkpoint_interval=16)
    rng = np.random.default_rng(5)
    base = rng.integers(0, 400, 250).tolist()
    for _ in range(24):
        prompt = base[: rng.integers(10, 250)]
        params = SamplingParams(temperature=1.0, max_tokens=int(rng.choice([1, 5, 100])))
        engine.submit(GenerationRequest(prompt_ids=prompt, sampling=params, parse_output=False))
    finished = 0
    for _ in range(5000):
        if not engine.has_work:
            break
        finished += sum(isinstance(e, Finished) for e in engine.step())
        _check_pool(engine)
    assert finished == 24 and not engine.has_work


def _kept(pool, cache, tokens: list[int]):
    """A checkpoint of a sequence that consumed ``tokens`` (the sequence then ends)."""
    state = pool.open(len(tokens) + 1)
    state.length = len(tokens)
    checkpoint = pool.keep(state)
    cache.insert(tokens, checkpoint)
    pool.close(state)
    return checkpoint


def test_eviction_goes_by_tokens_saved_per_page_then_age() -> None:
    """The checkpoint that saves the fewest prefill tokens per page it frees goes first,
    an older one before a newer one of the same worth; a more valuable one stays even when
    it is the oldest."""
    from ninfer_runtime.ops.attention.memory import KvSpec
    from ninfer_runtime.ops.delta_rule.memory import GdnSpec
    from ninfer_runtime.prefix_cache import PrefixCache
    from ninfer_runtime.state import ContextPool

    pool = ContextPool(
        [KvSpec(2, 8), GdnSpec(2, 4, 4, 24, 4)], np, slots=1, pages=12, max_context=16,
        page_tokens=4,
    )  # fmt: skip
    cache = PrefixCache(pool)
    deep = _kept(pool, cache, list(range(12)))  # 12 tokens for 3 + 1 pages
    _kept(pool, cache, [7, 8])  # 2 tokens for 1 + 1 pages
    other = _kept(pool, cache, [9, 9, 9])  # 3 tokens for 1 + 1 pages
    assert pool.free_pages == 12 - 8
    assert cache.make_room(pages=6)
    assert cache.checkpoints() == [deep, other] and cache.stats.evictions == 1
    assert cache.make_room(pages=8)
    assert cache.checkpoints() == [deep]
    assert not cache.make_room(pages=13) and not cache.checkpoints()


def test_keys_chain_blocks_and_carry_the_salt() -> None:
    """A key names exactly its first n tokens (the same in any longer sequence, across block
    boundaries) and the engine's salt: another artifact or K/V type never matches."""
    from ninfer_runtime.prefix_cache import BLOCK_TOKENS, _Chain

    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, 3 * BLOCK_TOKENS + 7)
    long, salted = _Chain(ids, b"a"), _Chain(ids, b"b")
    for n in (1, BLOCK_TOKENS - 1, BLOCK_TOKENS, BLOCK_TOKENS + 1, 2 * BLOCK_TOKENS + 5):
        assert long.key(n) == _Chain(ids[:n], b"a").key(n)
        assert long.key(n) != salted.key(n)
    changed = ids.copy()
    changed[3] += 1
    assert _Chain(changed, b"a").key(2 * BLOCK_TOKENS) != long.key(2 * BLOCK_TOKENS)


@pytest.mark.parametrize("spec", [None, SpecConfig(draft_tokens=3)], ids=["plain", "mtp"])
def test_preempted_lanes_go_to_host_memory_and_come_back_exactly(artifact_path, spec) -> None:
    """With host memory for them, preempted lanes (some in the middle of their prompts:
    short prefill chunks) are copied out and back instead of replayed: streams equal an
    unconstrained run's (greedy; seeded too without rounds), nothing is replayed, and the
    host memory is all given back at the end."""
    art = artifact_path("qwen3_5_bf16", "dense")
    roomy = Engine(art, max_lanes=4, max_context=512, spec=spec, prefill_chunk=32)
    budget = _capacity(roomy.pool, 5)
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 400, 100 + 20 * i).tolist() for i in range(4)]
    samplings = [{"temperature": 0.0}] + ([{"temperature": 0.8, "seed": 3}] if spec is None else [])
    for sampling in samplings:
        params = SamplingParams(max_tokens=300, ignore_eos=True, **sampling)
        small = Engine(
            art, max_lanes=4, max_context=512, context_capacity=budget, spec=spec,
            host_context_capacity="1GiB", prefix_cache=True, prefill_chunk=32,
        )  # fmt: skip
        assert small.pool.pages == 5
        assert _concurrent(small, prompts, params) == _concurrent(roomy, prompts, params)
        assert small.preemptions > 0 and small.replayed_tokens == 0
        assert small.host_bytes == 0


@pytest.mark.parametrize("host", ["0", "1GiB"])
def test_a_lane_preempted_while_reading_its_prompt_resumes_it(artifact_path, host) -> None:
    """A generating lane needs a page while a later lane is still prefilling (short chunks):
    the later lane is preempted in its prompt, copied to host memory or let go, and both
    streams equal an unconstrained run's."""
    art = artifact_path("qwen3_5_bf16", "dense")
    kw = dict(max_lanes=2, max_context=512, prefill_chunk=16)
    roomy = Engine(art, **kw)
    budget = _capacity(roomy.pool, 3)
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 400, 250).tolist(), rng.integers(0, 400, 400).tolist()]
    params = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0.0)
    small = Engine(art, context_capacity=budget, host_context_capacity=host, **kw)
    assert small.pool.pages == 3
    preempted_in_prompt = []
    preempt = small.scheduler._preempt

    def spy(a) -> None:
        preempted_in_prompt.append(a.prefilled < len(a.prompt_ids))
        preempt(a)

    small.scheduler._preempt = spy
    assert _concurrent(small, prompts, params) == _concurrent(roomy, prompts, params)
    assert any(preempted_in_prompt)
    assert small.host_bytes == 0


class _ArgmaxOnDevice:
    """A device sampler for greedy lanes (the CUDA backend has one; the CPU none)."""

    def supports(self, params: SamplingParams) -> bool:
        return params.greedy

    def set_lanes(self, lanes) -> None:
        self.lanes = lanes

    def sample(self, rows):
        return np.argmax(rows, axis=-1)


def test_a_step_where_every_decoding_lane_replays_samples_nothing(artifact_path) -> None:
    """With a device sampler, a decode step whose lanes all replay has no rows to sample
    (on CUDA it once failed concatenating none); greedy streams still equal a roomy run's."""
    art = artifact_path("qwen3_5_bf16", "dense")
    roomy = Engine(art, max_lanes=4, max_context=512)
    budget = _capacity(roomy.pool, 5)
    small = Engine(art, max_lanes=4, max_context=512, context_capacity=budget)
    small.token_choice.device_sampler = _ArgmaxOnDevice()
    steps_all_replaying = []
    decode = small.step_forwards.decode

    def spy(lanes, events) -> None:
        steps_all_replaying.append(all(a.replay for a in lanes))
        decode(lanes, events)

    small.step_forwards.decode = spy
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 400, 100 + 20 * i).tolist() for i in range(4)]
    params = SamplingParams(max_tokens=300, ignore_eos=True, temperature=0.0)
    assert _concurrent(small, prompts, params) == _concurrent(roomy, prompts, params)
    assert any(steps_all_replaying) and small.replayed_tokens > 0


@pytest.mark.parametrize("spec", [None, SpecConfig(draft_tokens=2)], ids=["plain", "mtp"])
def test_a_random_workload_under_every_kind_of_pressure(artifact_path, spec) -> None:
    """Shared prefixes, a pool too small for the lanes, host memory for only some of the
    preempted lanes (others replay), requests cancelled at random points, and requests
    naming boundaries (some a few tokens before their prompt's end) under two salts, so
    that some wait for another's checkpoint: after every step the pool's holder counts
    match its sequences and checkpoints and host memory is accounted; every request not
    cancelled streams what an unconstrained engine streams; at the end only the cache holds
    pages and no host memory is held."""

    art = artifact_path("qwen3_5_bf16", "dense")
    rng = np.random.default_rng(21)
    bases = [rng.integers(0, 400, 300).tolist() for _ in range(2)]
    prompts = [
        bases[rng.integers(0, 2)][: rng.integers(30, 300)] + rng.integers(0, 400, 5).tolist()
        for _ in range(14)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    kw = dict(max_lanes=4, max_context=512, prefill_chunk=48, spec=spec)
    expected = _concurrent(Engine(art, **kw), prompts, params)

    roomy = Engine(art, **kw)
    engine = Engine(
        art, context_capacity=_capacity(roomy.pool, 6), prefix_cache=True,
        checkpoint_interval=64, host_context_capacity=2 * roomy.pool.page_bytes, **kw,
    )  # fmt: skip
    saves = []
    save = engine.pool.save
    engine.pool.save = lambda state: saves.append(state.slot) or save(state)
    ids = {}
    marks = np.random.default_rng(22)  # its own stream: the cancellations stay as they were
    for p in prompts:
        positions = [n for n in (60, 120, 180, 240, len(p) - 2) if n < len(p)]
        kinds = marks.choice(["boundary", "breakpoint"], len(positions))
        request = GenerationRequest(
            prompt_ids=p,
            sampling=params,
            parse_output=False,
            cache_boundaries=[CacheBoundary(n, k) for n, k in zip(positions, kinds, strict=True)],
            cache_salt=[None, "tenant"][marks.integers(0, 2)],
        )
        ids[engine.submit(request)] = []
    order, cancelled = list(ids), set()
    steps, boundaries_kept = 0, 0
    while engine.has_work:
        assert steps < 20_000, "the engine stopped making progress"
        steps += 1
        if steps % 37 == 0:  # cancel one request, wherever it is (waiting, paused, running)
            victim = order[rng.integers(0, len(order))]
            if victim not in cancelled and engine.cancel(victim) is not None:
                cancelled.add(victim)
        for e in engine.step():
            if isinstance(e, TokenEvent):
                ids[e.request_id].append(e.token_id)
        _check_pool(engine)
        assert 0 <= engine.host_bytes <= engine.host_capacity
        counts = engine.cache.checkpoint_counts()
        boundaries_kept = max(boundaries_kept, counts["boundary"] + counts["breakpoint"])
    assert cancelled and engine.preemptions > len(saves) > 0 and engine.replayed_tokens > 0
    assert boundaries_kept > 0
    for rid, want in zip(order, expected, strict=True):
        got = ids[rid]
        assert got == (want[: len(got)] if rid in cancelled else want), rid
    assert engine.host_bytes == 0
    engine.cache.clear()
    assert engine.pool.free_pages == engine.pool.pages and engine.pool.snapshot_pages_used == 0
