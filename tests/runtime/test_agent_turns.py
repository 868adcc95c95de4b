"""An agent-like chat workload on the engine, step by step: eight clients share a system
prompt several prefill chunks long, and each sends its next turn as soon as its last one
ends. From turn 2 on a request resumes where the history its previous turn left ends, and
its first token follows its submission within two steps (one read of its tail and generation
prompt, the checkpoint at its own history's end kept inside it; a step later when the tails
beside it filled the chunk), with the prefix cache's outputs those of a cold run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ninfer_runtime.engine import (
    SHORT_CHUNK_TOKENS,
    CacheBoundary,
    Engine,
    Finished,
    GenerationRequest,
    OutputEvent,
    TokenEvent,
)
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.frontend.parsers.events import TextDelta

WORDS = ["the", "capital", "of", "france", "is", "paris", "and", "weather", "sunny", "warm"]
CLIENTS, TURNS, CHUNK = 8, 3, 256


@pytest.fixture(scope="module")
def artifact(bundled_bf16: Path) -> Path:
    return bundled_bf16


def _run(art: Path, cache: bool) -> tuple[Engine, dict[str, dict], list[list]]:
    """The workload; per request (``c<client>t<turn>``) its submission step, first-token
    step, prompt tokens, cached tokens, history end and tokens; per step its prefill reads
    (request id, start, end)."""
    engine = Engine(
        art, max_lanes=CLIENTS, max_context=2048, prefill_chunk=CHUNK, prefix_cache=cache
    )
    rng = random.Random(0)
    system = {"role": "system", "content": " ".join(rng.choices(WORDS, k=300))}
    conversations = [[system] for _ in range(CLIENTS)]
    # where the system message ends, as the server gives it (``cache_boundaries``)
    opening = engine.template.render([system], add_generation_prompt=False)
    system_end = len(engine.tokenizer.encode(opening))
    requests: dict[str, dict] = {}
    steps: list[list] = []
    scheduler = engine.scheduler

    def logged():  # this step's prefill reads, as the scheduler plans them
        reads = type(scheduler).prefill_reads(scheduler)
        steps[-1].extend((a.request.request_id, start, end) for a, start, end in reads)
        return reads

    scheduler.prefill_reads = logged
    due, turn, texts = dict.fromkeys(range(CLIENTS), 0), dict.fromkeys(range(CLIENTS), 0), {}
    while due or engine.has_work:
        for c in [c for c, at in due.items() if at <= len(steps)]:
            del due[c]
            user = {
                "role": "user",
                "content": " ".join(random.Random(c * 10 + turn[c]).choices(WORDS, k=12)),
            }
            conversations[c].append(user)
            request = GenerationRequest(
                messages=list(conversations[c]),
                enable_thinking=False,
                sampling=SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                request_id=f"c{c}t{turn[c]}",
                cache_boundaries=[CacheBoundary(system_end, "boundary")],
            )
            ids, opened = engine.render(request)
            engine.submit(request, rendered=(ids, opened))
            requests[request.request_id] = {
                "client": c,
                "turn": turn[c],
                "submitted": len(steps),
                "prompt": len(ids),
                "history_end": engine.intake.history_end(request, list(ids)),
                "tokens": [],
            }
            texts[request.request_id] = []
        steps.append([])
        for event in engine.step():
            rid = event.request_id
            if isinstance(event, TokenEvent):
                requests[rid].setdefault("first", len(steps) - 1)
                requests[rid]["tokens"].append(event.token_id)
            elif isinstance(event, OutputEvent) and isinstance(event.event, TextDelta):
                texts[rid].append(event.event.text)
            elif isinstance(event, Finished):
                requests[rid]["cached"] = event.usage.cached_tokens
                c = requests[rid]["client"]
                conversations[c].append({"role": "assistant", "content": "".join(texts[rid])})
                turn[c] += 1
                if turn[c] < TURNS:
                    due[c] = len(steps)
    return engine, requests, steps


def test_later_turns_answer_within_two_steps_of_their_submission(artifact) -> None:
    _, requests, steps = _run(artifact, cache=True)
    first_turn = [r for r in requests.values() if r["turn"] == 0]
    assert all(r["prompt"] > 2 * CHUNK for r in first_turn)  # the prefix spans several chunks
    reads: dict[str, list[tuple[int, int, int]]] = {}
    for index, step in enumerate(steps):
        for rid, start, end in step:
            reads.setdefault(rid, []).append((index, start, end))
    later = {rid: r for rid, r in requests.items() if r["turn"] > 0}
    for rid, r in later.items():
        previous = requests[f"c{r['client']}t{r['turn'] - 1}"]
        # resumed where the previous turn's history ends (a checkpoint kept inside that
        # turn's read): the rest, its last answer, the new user message and the generation
        # prompt, is one read
        assert r["cached"] == previous["history_end"]
        ((step, start, end),) = reads[rid]
        assert (start, end) == (r["cached"], r["prompt"])
        # in the step the request was submitted before, or (when the tails beside it filled
        # that step's chunk) the next; it samples the first token
        assert step - r["submitted"] <= 1
        assert step == r["first"]
    # the clients' later turns arrive together: one step reads most of their tails at once
    since = min(r["submitted"] for r in later.values())
    tails = [
        sum(end - start > SHORT_CHUNK_TOKENS for _, start, end in step) for step in steps[since:]
    ]
    assert max(tails) >= CLIENTS // 2
    _, cold, _ = _run(artifact, cache=False)
    assert {rid: r["tokens"] for rid, r in requests.items()} == {
        rid: r["tokens"] for rid, r in cold.items()
    }
