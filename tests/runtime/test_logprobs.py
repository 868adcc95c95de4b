"""Log-probabilities from the engine on the CPU reference (the bundled model).

* generated tokens: the chosen token's log-probability and the k most likely tokens equal a
  float64 log-softmax of the logits a fresh forward pass computes, penalties applied and
  temperature not; greedy's chosen token is its own top-1;
* prompt tokens: each given the tokens before it (the first: None), summing to minus the
  negative log-likelihood ``ninfer-perplexity`` computes; a warm prefix cache changes nothing;
* speculative decoding reports exactly what plain decoding does;
* a request asking for none gets None and costs nothing (no full-row logits, no scoring).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import ninfer_runtime.token_choice as token_choice_module
from ninfer_runtime.engine import (
    Engine,
    Finished,
    GenerationRequest,
    PromptLogprobs,
    TokenEvent,
)
from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.logprobs import log_softmax, score_rows, token_logprobs
from ninfer_runtime.perplexity import perplexity
from ninfer_runtime.speculative import SpecConfig

TEXT = (
    "The capital of France is Paris. The capital of Italy is Rome. "
    "A tiny model answers tiny questions, and the fox jumps over the lazy dog again."
)


@pytest.fixture(scope="module")
def artifact(bundled_bf16: Path) -> Path:
    return bundled_bf16


@pytest.fixture(scope="module")
def engine(artifact) -> Engine:
    return Engine(artifact, max_context=256, prefill_chunk=16)


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    return engine.tokenizer.encode(TEXT)


def run(engine: Engine, ids: list[int], **sampling) -> tuple[list[TokenEvent], list, Finished]:
    """The request's token events, its PromptLogprobs events and its Finished event."""
    params = SamplingParams(**{"max_tokens": 12, "ignore_eos": True, **sampling})
    tokens, prompts, finished = [], [], None
    request = GenerationRequest(prompt_ids=ids, sampling=params, parse_output=False)
    for event in engine.generate(request):
        if isinstance(event, TokenEvent):
            tokens.append(event)
        elif isinstance(event, PromptLogprobs):
            prompts.append(event)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return tokens, prompts, finished


def oracle(engine: Engine, ids: list[int]) -> np.ndarray:
    """float64 log-softmax of the logits at every position of ``ids`` (row t predicts token
    t + 1), from one forward pass over a fresh state."""
    state = engine.runner.new_state(len(ids) + 1)
    logits = np.asarray(engine.runner.forward([np.asarray(ids)], [state]).logits[0], np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def assert_top(top, expected_row: np.ndarray, k: int) -> None:
    """``top`` lists the k most likely tokens of the oracle row, most likely first."""
    assert len(top) == k
    values = [v for _, v in top]
    assert values == sorted(values, reverse=True)
    best = np.argsort(-expected_row, kind="stable")[:k]
    assert [t for t, _ in top] == best.tolist()
    np.testing.assert_allclose(values, expected_row[best], atol=1e-4)


# ----------------------------------------------------------------------- generated tokens
def test_greedy_logprobs_equal_a_numpy_log_softmax(engine, prompt) -> None:
    events, prompts, _ = run(engine, prompt, temperature=0.0, logprobs=5)
    assert prompts == []  # prompt logprobs were not asked for
    tokens = [e.token_id for e in events]
    expected = oracle(engine, prompt + tokens[:-1])[len(prompt) - 1 :]
    for e, row in zip(events, expected, strict=True):
        assert e.logprob == pytest.approx(row[e.token_id], abs=1e-4)
        assert e.top_logprobs[0] == (e.token_id, e.logprob)  # greedy: the chosen is the top-1
        assert_top(e.top_logprobs, row, 5)


def test_penalties_count_and_temperature_does_not(engine, prompt) -> None:
    penalties = dict(repetition_penalty=1.5, presence_penalty=0.7, frequency_penalty=0.4)
    events, _, _ = run(engine, prompt, temperature=0.8, seed=3, logprobs=3, **penalties)
    tokens = [e.token_id for e in events]
    state = engine.runner.new_state(len(prompt) + len(tokens))
    full = engine.runner.forward([np.asarray(prompt + tokens[:-1])], [state]).logits[0]
    raw = np.asarray(full, np.float64)[len(prompt) - 1 :]
    moved_by_penalties = moved_by_temperature = 0.0
    for j, e in enumerate(events):
        row = raw[j].copy()
        seen = sorted(set(prompt) | set(tokens[:j]))
        row[seen] = np.where(row[seen] > 0, row[seen] / 1.5, row[seen] * 1.5)
        for token, count in Counter(tokens[:j]).items():
            row[token] -= 0.4 * count + 0.7
        expected = log_softmax(row[None])[0]
        assert e.logprob == pytest.approx(expected[e.token_id], abs=1e-4)
        assert_top(e.top_logprobs, expected, 3)
        moved_by_penalties = max(
            moved_by_penalties, abs(log_softmax(raw[j : j + 1])[0, 0] - expected[0])
        )
        moved_by_temperature = max(
            moved_by_temperature, abs(log_softmax(row[None] / 0.8)[0, 0] - expected[0])
        )
    # the checks above tell both choices apart
    assert moved_by_penalties > 1e-2 and moved_by_temperature > 1e-2


def test_zero_alternatives_and_none(engine, prompt) -> None:
    zero, _, _ = run(engine, prompt, temperature=0.0, logprobs=0)
    assert all(e.top_logprobs == () and e.logprob <= 0.0 for e in zero)
    plain, prompts, _ = run(engine, prompt, temperature=0.0)
    assert [e.token_id for e in plain] == [e.token_id for e in zero]
    assert all(e.logprob is None and e.top_logprobs is None for e in plain)
    assert prompts == []


def test_a_lane_asking_for_none_pays_nothing(engine, prompt, monkeypatch) -> None:
    """Beside a lane that asks, a lane that does not: it gets None, no token of it is
    scored and no forward pass computes more than the last row's logits for it."""
    scored, last_only = [], []
    score, forward = token_choice_module.token_logprobs, engine.runner.forward

    def counting(rows, chosen, tops):
        scored.append(len(chosen))
        return score(rows, chosen, tops)

    def recording(tokens, states, *, last_only=False, **inputs):
        last_only_flags.append(last_only)
        return forward(tokens, states, last_only=last_only, **inputs)

    last_only_flags = last_only
    monkeypatch.setattr(token_choice_module, "token_logprobs", counting)
    monkeypatch.setattr(engine.runner, "forward", recording)
    alone, _, _ = run(engine, prompt, temperature=0.0)
    assert scored == [] and all(last_only)

    asking = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
    silent = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    rids = [
        engine.submit(GenerationRequest(prompt_ids=prompt, sampling=p, parse_output=False))
        for p in (asking, silent)
    ]
    got: dict[str, list[TokenEvent]] = {rid: [] for rid in rids}
    while engine.has_work:
        for event in engine.step():
            if isinstance(event, TokenEvent):
                got[event.request_id].append(event)
    asked, quiet = got[rids[0]], got[rids[1]]
    assert [e.token_id for e in quiet] == [e.token_id for e in alone][:6]
    assert all(e.logprob is None and e.top_logprobs is None for e in quiet)
    assert all(e.logprob is not None and len(e.top_logprobs) == 2 for e in asked)
    assert sum(scored) == 6  # the asking lane's tokens only


class ArgmaxSampler:
    """The CUDA backend's device sampler as the engine sees it, on numpy rows: greedy lanes
    without penalties are sampled (and so scored) where the logits are."""

    @staticmethod
    def supports(params: SamplingParams) -> bool:
        return params.greedy and params.repetition_penalty == 1.0

    def set_lanes(self, lanes) -> None:
        pass

    def sample(self, rows):
        return np.argmax(rows, axis=-1)


def test_lanes_sampled_where_the_logits_are_score_the_same(artifact, engine, prompt, monkeypatch):
    """The path of a device sampler: the asking lanes' rows are picked out of the batch and
    scored where they are, with the numbers the host path gives."""
    from ninfer_runtime.backends.cpu import CpuBackend

    expected, _, _ = run(engine, prompt, temperature=0.0, logprobs=3)
    monkeypatch.setattr(CpuBackend, "device_sampler", lambda self: ArgmaxSampler())
    device = Engine(artifact, max_context=256, prefill_chunk=16)
    rids = [
        device.submit(GenerationRequest(prompt_ids=prompt, sampling=p, parse_output=False))
        for p in (
            SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
            SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3),
        )
    ]
    got: dict[str, list[TokenEvent]] = {rid: [] for rid in rids}
    while device.has_work:
        for event in device.step():
            if isinstance(event, TokenEvent):
                got[event.request_id].append(event)
    assert all(e.logprob is None for e in got[rids[0]])
    assert [(e.token_id, e.logprob, e.top_logprobs) for e in got[rids[1]]] == [
        (e.token_id, e.logprob, e.top_logprobs) for e in expected
    ]


class NeverClosingSampler(ArgmaxSampler):
    """A device sampler that never draws ``</think>`` itself, so the thinking budget's
    forced token always differs from what it drew."""

    def __init__(self, close: int):
        self.close = close

    def sample(self, rows):
        rows = rows.copy()
        rows[:, self.close] = -np.inf
        return np.argmax(rows, axis=-1)


def test_a_forced_token_is_scored_as_itself_on_the_device_path(artifact, engine, monkeypatch):
    """Lanes sampled where the logits are get scored on the drawn ids before those are
    read; a token the thinking budget forces in their place is scored as itself: each
    reported log-probability is the emitted token's under a fresh forward pass."""
    from ninfer_runtime.backends.cpu import CpuBackend

    (close,) = engine.tokenizer.think_close_ids
    monkeypatch.setattr(CpuBackend, "device_sampler", lambda self: NeverClosingSampler(close))
    device = Engine(artifact, max_context=256, prefill_chunk=16)
    params = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, max_thinking_tokens=3, logprobs=2
    )
    request = GenerationRequest(
        messages=[{"role": "user", "content": "Hello!"}],
        sampling=params,
        enable_thinking=True,
        parse_output=False,
    )
    prompt, _ = device.render(request)
    events = [e for e in device.generate(request) if isinstance(e, TokenEvent)]
    tokens = [e.token_id for e in events]
    assert close in tokens[:3]  # forced: this sampler never draws it
    expected = oracle(device, [*prompt, *tokens])
    for t, event in enumerate(events):
        row = expected[len(prompt) - 1 + t]
        assert event.logprob == pytest.approx(row[event.token_id], abs=1e-4)
        assert_top(event.top_logprobs, row, 2)


# --------------------------------------------------------------------------- prompt tokens
def test_prompt_logprobs_sum_to_minus_the_perplexity_nll(engine, prompt) -> None:
    """The prompt is read in chunks of 16: each chunk's last row scores the next chunk's
    first token."""
    assert len(prompt) > 40
    _, prompts, _ = run(engine, prompt, temperature=0.0, max_tokens=1, prompt_logprobs=2)
    (event,) = prompts
    assert event.token_ids == tuple(prompt)
    assert event.logprobs[0] is None and event.top_logprobs[0] is None
    ppl, scored, _ = perplexity(engine, prompt, context=len(prompt), stride=len(prompt))
    assert scored == len(prompt) - 1
    assert sum(event.logprobs[1:]) == pytest.approx(-math.log(ppl) * scored, abs=1e-4)
    expected = oracle(engine, prompt)
    for t in range(1, len(prompt)):
        assert event.logprobs[t] == pytest.approx(expected[t - 1, prompt[t]], abs=1e-4)
        assert_top(event.top_logprobs[t], expected[t - 1], 2)


def test_prompt_logprobs_come_before_the_first_token(engine, prompt) -> None:
    params = SamplingParams(
        temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=0, logprobs=1
    )
    request = GenerationRequest(prompt_ids=prompt, sampling=params, parse_output=False)
    kinds = [type(e).__name__ for e in engine.generate(request)]
    assert kinds.index("PromptLogprobs") < kinds.index("TokenEvent")
    assert kinds.count("PromptLogprobs") == 1


def test_a_warm_prefix_cache_gives_the_cold_scores(artifact, prompt) -> None:
    kw = dict(max_context=256, prefix_cache=True, checkpoint_interval=16, prefill_chunk=16)
    cold_tokens, (cold,), _ = run(
        Engine(artifact, **kw), prompt, temperature=0.0, prompt_logprobs=3
    )
    warm = Engine(artifact, **kw)
    run(warm, prompt, temperature=0.0)
    _, _, resumed = run(warm, prompt, temperature=0.0)
    assert resumed.usage.cached_tokens >= 16  # a request without scores resumes
    tokens, (scores,), finished = run(warm, prompt, temperature=0.0, prompt_logprobs=3)
    assert finished.usage.cached_tokens == 0  # this one reads its whole prompt
    assert (scores.logprobs, scores.top_logprobs) == (cold.logprobs, cold.top_logprobs)
    assert [e.token_id for e in tokens] == [e.token_id for e in cold_tokens]


# --------------------------------------------------------------------- speculative decoding
@pytest.mark.parametrize("penalty", [1.0, 1.3], ids=["greedy", "greedy-with-penalty"])
def test_speculation_reports_what_plain_decoding_does(artifact, penalty) -> None:
    """Accepted drafts are scored on the main model's rows at their positions: the same
    numbers as plain decoding (the penalty sends the round through the sampling rule)."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(
        temperature=0.0, max_tokens=40, repetition_penalty=penalty, logprobs=4, prompt_logprobs=1
    )

    def events(spec):
        engine = Engine(artifact, max_context=256, spec=spec)
        request = GenerationRequest(messages=messages, sampling=params)
        got = [e for e in engine.generate(request) if isinstance(e, TokenEvent | PromptLogprobs)]
        return [e.__dict__ | {"request_id": None} for e in got], engine

    plain, _ = events(None)
    spec, engine = events(SpecConfig(draft_tokens=3))
    assert engine.spec_stats.accepted > 0
    assert len(plain) > 10
    assert spec == plain


# ------------------------------------------------------------------------ the parameters
@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [-1, 21, 2.0, True, "3"])
def test_bad_values_are_refused_naming_the_field(field, value) -> None:
    with pytest.raises(RequestError, match=rf"^{field} must be") as caught:
        SamplingParams(**{field: value})
    assert caught.value.param == field


def test_the_helper_on_ties_and_short_rows() -> None:
    rows = np.array([[0.5, 2.0, 2.0, -1.0], [3.0, 3.0, 3.0, 3.0]], np.float32)
    first, second = token_logprobs(rows, [3, 2], [3, 9])
    expected = log_softmax(rows)
    assert first.logprob == float(expected[0, 3])
    assert first.top == (
        (1, float(expected[0, 1])),
        (2, float(expected[0, 2])),
        (0, float(expected[0, 0])),
    )
    assert [t for t, _ in second.top] == [0, 1, 2, 3]  # clipped to the vocabulary
    assert second.logprob == pytest.approx(-math.log(4))
    with pytest.raises(ValueError, match="2 rows, 1 tokens"):
        token_logprobs(rows, [0], [1, 1])


def test_only_the_rows_that_ask_are_scored() -> None:
    rows = np.random.default_rng(3).normal(size=(3, 7)).astype(np.float32)
    got = score_rows(rows, [4, 1, 6], [None, 2, 0])
    assert got[0] is None
    assert got[1:] == token_logprobs(rows[1:], [1, 6], [2, 0])
    assert score_rows(rows, [4, 1, 6], [None, None, None]) == [None, None, None]
    # the ids as an array where the rows are (a device sampler's, unread): the same
    assert score_rows(rows, np.array([4, 1, 6]), [None, 2, 0]) == got
