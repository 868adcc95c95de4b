"""POST /v1/completions against a real server on the bundled model: every prompt form, echo,
the legacy log-probability shape, prompt scoring as harnesses do it, n samples, streaming,
refusals, and the official ``openai`` SDK."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from .conftest import Server, metric, start_server, wait_for

LANES = 3
CONTEXT = 4096
#: a prompt the bundled model continues in more than one way at temperature 1
VARIED = "a b c"
SCORED = "The weather in Paris is sunny today."
#: a prompt the bundled model continues for a while at temperature 0
GO_ON = "The capital of France"


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    lanes = ("--max-concurrency", str(LANES), "--pending-timeout-ms", "30000")
    yield from start_server(artifact, *lanes, "--max-context", str(CONTEXT))


def complete(server: Server, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)


def ok(server: Server, **body: Any) -> dict[str, Any]:
    response = complete(server, **body)
    assert response.status_code == 200, response.text
    return response.json()


def events(server: Server, **body: Any) -> list[dict[str, Any]]:
    """The JSON payloads of a streamed request, checking it ends with [DONE]."""
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def tokens_of(server: Server, text: str) -> list[int]:
    response = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=10)
    return response.json()["tokens"]


def test_every_prompt_form_gives_the_same_greedy_text(server):
    text = GO_ON
    ids = tokens_of(server, text)
    greedy = {"max_tokens": 6, "temperature": 0}
    single = ok(server, prompt=text, **greedy)
    assert single["object"] == "text_completion" and single["id"].startswith("cmpl-")
    (choice,) = single["choices"]
    assert choice["index"] == 0 and choice["text"] and choice["logprobs"] is None
    assert choice["finish_reason"] in ("length", "stop")
    assert single["usage"]["prompt_tokens"] == len(ids)
    assert single["usage"]["total_tokens"] == len(ids) + single["usage"]["completion_tokens"]
    assert "cached_tokens" in single["usage"]["prompt_tokens_details"]
    # the same prompt as ids, and inside a list of each form: the same text, in prompt order
    assert ok(server, prompt=ids, **greedy)["choices"][0]["text"] == choice["text"]
    other = "Once upon a time"
    for prompts in ([text, other], [ids, tokens_of(server, other)]):
        reply = ok(server, prompt=prompts, **greedy)
        assert [c["index"] for c in reply["choices"]] == [0, 1]
        assert reply["choices"][0]["text"] == choice["text"]
        assert reply["choices"][1]["text"] != choice["text"]
        assert reply["usage"]["prompt_tokens"] == len(ids) + len(tokens_of(server, other))


def test_max_tokens_defaults_to_16_and_is_the_limit(server):
    reply = ok(server, prompt=VARIED, ignore_eos=True)
    assert reply["usage"]["completion_tokens"] == 16
    assert reply["choices"][0]["finish_reason"] == "length"
    reply = ok(server, prompt=VARIED, ignore_eos=True, max_tokens=3)
    assert reply["usage"]["completion_tokens"] == 3


def test_echo_puts_the_prompt_first(server):
    reply = ok(server, prompt=SCORED, echo=True, max_tokens=4, temperature=0)
    plain = ok(server, prompt=SCORED, max_tokens=4, temperature=0)
    assert reply["choices"][0]["text"] == SCORED + plain["choices"][0]["text"]
    ids = tokens_of(server, SCORED)
    # ids echo as their text
    assert ok(server, prompt=ids, echo=True, max_tokens=0)["choices"][0]["text"] == SCORED


def test_logprobs_in_the_legacy_shape(server):
    # text without special tokens (they leave the text but not the tokens)
    reply = ok(server, prompt=VARIED, max_tokens=5, logprobs=3, temperature=0)
    (choice,) = reply["choices"]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    count = reply["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == count
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(count)]
    for token, value, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert value <= 0
        # the three best, and the chosen one among them (greedy: it is the best)
        assert 3 <= len(top) <= 4 and top[token] == value
        assert max(top.values()) == pytest.approx(value)


def test_echo_logprobs_with_max_tokens_0_scores_the_prompt_like_perplexity(server, artifact):
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.perplexity import perplexity

    reply = ok(server, prompt=SCORED, echo=True, logprobs=1, max_tokens=0)
    (choice,) = reply["choices"]
    assert choice["text"] == SCORED and choice["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    engine = Engine(artifact, max_context=512)
    ids = engine.tokenizer.encode(SCORED)
    assert len(lp["tokens"]) == len(ids) == reply["usage"]["prompt_tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == SCORED
    ppl, scored, _ = perplexity(engine, ids, context=len(ids), stride=len(ids))
    assert scored == len(ids) - 1
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(-math.log(ppl) * scored, abs=1e-4)
    # the same scores streamed: the echo chunk carries them, nothing is generated
    chunks = events(server, prompt=SCORED, echo=True, logprobs=1, max_tokens=0)
    assert "".join(c["choices"][0]["text"] for c in chunks) == SCORED
    assert chunks[0]["choices"][0]["logprobs"] == lp
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_streamed_equals_non_streamed(server):
    body = {"prompt": GO_ON, "max_tokens": 8, "temperature": 0, "logprobs": 2, "echo": True}
    whole = ok(server, **body)["choices"][0]
    chunks = events(server, **body, stream_options={"include_usage": True})
    *parts, last = chunks
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in parts)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
    texts = [c["choices"][0]["text"] for c in parts]
    assert len(texts) > 2 and "".join(texts) == whole["text"]
    assert parts[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    joined: dict[str, list[Any]] = {k: [] for k in whole["logprobs"]}
    for c in parts:
        for key, values in (c["choices"][0]["logprobs"] or {}).items():
            joined[key] += values
    assert joined == whole["logprobs"]


def test_n_seeded_samples_are_reproducible_different_and_share_the_prefill(server):
    body = {"prompt": VARIED, "n": 3, "seed": 7, "temperature": 1, "max_tokens": 10}
    hits = metric(server.url, "vllm:prefix_cache_hits_total")
    first = ok(server, **body)
    prompt_tokens = len(tokens_of(server, VARIED))
    # the samples after the first resume from its prompt's checkpoint
    assert metric(server.url, "vllm:prefix_cache_hits_total") - hits >= 2 * prompt_tokens
    texts = [c["text"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert len(set(texts)) > 1
    assert [c["text"] for c in ok(server, **body)["choices"]] == texts
    assert first["usage"]["prompt_tokens"] == prompt_tokens  # the prompt once
    # n = 1 with the seed is the first sample
    assert ok(server, **{**body, "n": 1})["choices"][0]["text"] == texts[0]
    # two prompts of two samples: indexed prompt by prompt
    reply = ok(server, **{**body, "n": 2, "prompt": [VARIED, SCORED]})
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in reply["choices"][:2]] == texts[:2]
    # streamed: the same samples, each choice's chunks in order
    streamed: dict[int, str] = {}
    for chunk in events(server, **body):
        for c in chunk["choices"]:
            streamed[c["index"]] = streamed.get(c["index"], "") + c["text"]
    assert [streamed[i] for i in range(3)] == texts


def test_stop_string_ends_the_choice(server):
    free = ok(server, prompt=VARIED, max_tokens=10, temperature=0, ignore_eos=True)
    text = free["choices"][0]["text"]
    stop = text.strip()[:3]
    reply = ok(server, prompt=VARIED, max_tokens=10, temperature=0, ignore_eos=True, stop=[stop])
    (choice,) = reply["choices"]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == text[: text.index(stop)]


def test_guided_decoding_constrains_a_raw_completion(server):
    chosen = ok(server, prompt=VARIED, guided_choice=["yes", "no"], n=2, seed=3)
    assert {c["text"] for c in chosen["choices"]} <= {"yes", "no"}
    digits = ok(server, prompt=GO_ON, guided_regex="[0-9]{2,4}", temperature=0)
    assert re.fullmatch("[0-9]{2,4}", digits["choices"][0]["text"])


def test_a_streamed_request_is_refused_before_the_stream_opens(server):
    for body, param in (
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
    ):
        response = complete(server, prompt=["hi", "ok"], stream=True, **body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"logit_bias": {"5": 3.0}}, "logit_bias"),
        ({"n": LANES + 1}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt[1]"),
        ({"prompt": [1, 10**9]}, "prompt[1]"),
        ({"prompt": ["a", [1]]}, "prompt[1]"),
        ({"prompt": [[1], [2, "x"]]}, "prompt[1][1]"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": [True]}, "prompt[0]"),
        ({"prompt": "word " * CONTEXT}, "prompt"),
        ({"temperature": "hot"}, "temperature"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_refusals_name_the_field_in_openais_shape(server, body, param):
    response = complete(server, **{"prompt": "hi", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"]
    assert error["param"] == param and param.split("[")[0] in error["message"]
    assert "\n" not in error["message"]


def test_another_model_is_404(server):
    response = complete(server, prompt="hi", model="other")
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_a_client_that_leaves_frees_every_lane(server):
    long = {"prompt": VARIED, "n": LANES, "max_tokens": CONTEXT - 100, "ignore_eos": True}

    def idle() -> bool:
        return metric(server.url, "ninfer_lanes_in_use") == 0

    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=30
    ) as response:
        lines = response.iter_lines()  # kept: dropping it would close the stream
        assert next(lines).startswith("data: ")
        assert metric(server.url, "ninfer_lanes_in_use") >= 1
    assert wait_for(idle, timeout=3)
    with pytest.raises(httpx.ReadTimeout):  # non-streaming, the client gives up
        complete_within(server, 0.5, **long)
    assert wait_for(idle, timeout=3)


def complete_within(server: Server, seconds: float, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=seconds)


def test_a_list_of_prompts_takes_its_lanes_in_turn(artifact):
    """One lane and no waiting room: a request of many prompts still runs, one at a time,
    instead of filling the admission queue itself."""
    for one_lane in start_server(
        artifact, "--max-concurrency", "1", "--max-pending-requests", "0", "--max-context", "256"
    ):
        prompts = [f"{VARIED} {i}" for i in range(6)]
        response = complete(one_lane, prompt=prompts, max_tokens=3, temperature=0)
        assert response.status_code == 200, response.text
        assert [c["index"] for c in response.json()["choices"]] == list(range(6))


def test_the_openai_sdk(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    reply = client.completions.create(
        model=server.model, prompt=GO_ON, max_tokens=5, logprobs=2, echo=True, temperature=0
    )
    choice = reply.choices[0]
    assert choice.text.startswith(GO_ON) and reply.usage.completion_tokens >= 1
    assert choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.tokens) == reply.usage.prompt_tokens + reply.usage.completion_tokens
    stream = client.completions.create(
        model=server.model,
        prompt=GO_ON,
        max_tokens=5,
        logprobs=2,
        echo=True,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    tokens = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    assert tokens == choice.logprobs.tokens
    assert chunks[-1].usage.total_tokens == reply.usage.total_tokens
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model=server.model, prompt="hi", suffix="end")


# -- every field of the request model ------------------------------------------------------------
#
# Each field of ``CompletionRequest`` has an entry: ``Served`` (setting it changes the reply,
# ids and times aside), ``Refused`` (a 4xx naming it) or ``Informational`` (no effect on the
# result by definition). A field without one fails the walk.

#: every id of the bundled vocabulary: as stop tokens, they end the output at once
EVERY_ID = list(range(452))


@dataclass(frozen=True)
class Served:
    value: Any
    given: dict[str, Any] = field(default_factory=dict)
    #: send the request once first, so that its prompt is in the prefix cache
    warm: bool = False


@dataclass(frozen=True)
class Refused:
    value: Any
    status: int = 400


@dataclass(frozen=True)
class Informational:
    value: Any
    why: str


REPEATS = {"ignore_eos": True, "max_tokens": 40, "logprobs": 0}
WALK: dict[str, Served | Refused | Informational] = {
    "prompt": Served(GO_ON),
    "model": Refused("another-model", status=404),
    "max_tokens": Served(3),
    "temperature": Served(0.3),
    "top_p": Served(0.1),
    "top_k": Served(1),
    "min_p": Served(0.9),
    # an output long enough to repeat itself, scored (the scores are after the penalties)
    "presence_penalty": Served(2.0, REPEATS),
    "frequency_penalty": Served(2.0, REPEATS),
    "repetition_penalty": Served(3.0, REPEATS),
    "seed": Served(2),
    "stop": Served(["a"]),
    "stop_token_ids": Served(EVERY_ID),
    "ignore_eos": Served(True, {"prompt": SCORED}),
    "min_tokens": Served(5, {"prompt": SCORED}),
    "include_stop_str_in_output": Served(True, {"stop": ["a"]}),
    "skip_special_tokens": Served(False, {"prompt": SCORED, "ignore_eos": True}),
    "guided_json": Served({"type": "object", "properties": {"a": {"type": "integer"}}}),
    "guided_regex": Served("[0-9]+"),
    "guided_choice": Served(["yes", "no"]),
    "guided_grammar": Served('start: "a" | "b"'),
    "structured_outputs": Served({"choice": ["yes", "no"]}),
    "guided_whitespace_pattern": Refused(" "),
    "structural_tag": Refused("{}"),
    "allowed_token_ids": Refused([1, 2]),
    "bad_words": Refused(["Blue"]),
    "length_penalty": Refused(0.5),
    "truncate_prompt_tokens": Refused(4),
    "spaces_between_special_tokens": Refused(False),
    "return_tokens_as_token_ids": Refused(True),
    "top_a": Refused(0.5),
    "typical_p": Refused(0.5),
    "stream": Served(True),
    "stream_options": Served({"include_usage": True}, {"stream": True}),
    "n": Served(2),
    "echo": Served(True),
    "logprobs": Served(1),
    "suffix": Refused("end"),
    "best_of": Refused(2),
    "use_beam_search": Refused(True),
    "logit_bias": Refused({"13": 5.0}),
    "user": Informational("someone", "an end-user id for the client's own records"),
    # a namespace of its own: the prompt the walk sent before is not found cached there
    "cache_salt": Served("tenant-a", warm=True),
    "prompt_cache_options": Informational(
        {"breakpoints": [3]}, "a hint for where the cache keeps checkpoints; the reply is the same"
    ),
}
BASE = {"prompt": VARIED, "max_tokens": 12, "seed": 1, "temperature": 1}


def test_every_field_has_an_entry():
    from ninfer_serve.openai.completions import CompletionRequest

    assert set(CompletionRequest.model_fields) == set(WALK)


def served(server: Server, body: dict[str, Any]) -> tuple[int, str]:
    """The reply's status and body, ids and times taken out."""
    response = complete(server, **body)
    text = response.text
    for key in ("id", "created"):
        for value in {str(v) for v in _values(text, key)}:
            text = text.replace(value, "")
    return response.status_code, text


def _values(text: str, key: str) -> list[Any]:
    found = []
    for line in text.splitlines():
        payload = line.removeprefix("data: ")
        if payload.startswith("{"):
            found.append(json.loads(payload).get(key))
    return [v for v in found if v is not None]


@pytest.mark.parametrize("name", WALK)
def test_a_field_changes_the_result_or_is_refused(server, name):
    entry = WALK[name]
    if isinstance(entry, Refused):
        response = complete(server, **{**BASE, name: entry.value})
        assert response.status_code == entry.status, response.text
        assert response.json()["error"]["param"] == name
        return
    given = {**BASE, **(entry.given if isinstance(entry, Served) else {})}
    if isinstance(entry, Served) and entry.warm:
        served(server, given)
    before = served(server, given)
    after = served(server, {**given, name: entry.value})
    assert before[0] == after[0] == 200, after
    if isinstance(entry, Served):
        assert before != after, f"{name}: the reply is the same with {entry.value!r}"
    else:
        assert before == after, f"{name} ({entry.why}) changed the reply"


def test_a_request_while_the_model_loads_is_503_not_a_sample_count_error() -> None:
    """With auto lanes the server has none until the engine has loaded: a request then is
    told the model is loading (503), not that ``n = 1`` is above its lanes (400)."""
    import threading

    from litestar.testing import TestClient

    from ninfer_serve.app import create_app
    from ninfer_serve.config import load_settings

    release = threading.Event()

    def load() -> Any:
        release.wait(30)
        raise RuntimeError("this engine never loads")

    gate = create_app(load_settings(None, {}), model_id="m", load=load)
    with TestClient(app=gate) as client:  # type: ignore[arg-type]
        try:
            response = client.post("/v1/completions", json={"prompt": "hi"})
        finally:
            release.set()  # the load fails now, so shutting down waits for nothing
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "model_loading"
