"""lm-evaluation-harness against a real server on the bundled model, offline: a multiple-choice
task scored through /v1/completions (``local-completions``: echoed prompt log-probabilities)
and a generation task through /v1/chat/completions (``local-chat-completions``), both defined
in local YAML over local JSONL. The log-likelihoods the harness reports must be the ones the
CPU engine gives the same text, and the generated text what the server answers directly."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import BUNDLED, Server, start_server

pytest.importorskip(
    "lm_eval", reason="lm-eval is not installed (pip install 'lm-eval[api]'; .ci/run installs it)"
)

#: the chat prompt the bundled model was trained on, up to the start of its answer
TRAINED = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CHOICES = ["Paris", "Rome", "four", "Blue"]
MULTIPLE_CHOICE = [
    ("What is the capital of France?", "The capital of France is", 0),
    ("What is the capital of Italy?", "The capital of Italy is", 1),
    ("What is two plus two?", "Two plus two is", 2),
]
#: questions from the model's training exchanges, with the answers it learnt
ANSWERS = {
    "What is the capital of France?": "The capital of France is Paris.",
    "What is two plus two?": "Two plus two is four.",
}


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-context", "2048")


@pytest.fixture(scope="module")
def engine(artifact):
    from ninfer_runtime.engine import Engine

    return Engine(artifact, max_context=512)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of task YAMLs over JSONL files, for the harness's ``include_path``."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    cache = folder / "datasets-cache"  # the datasets library's arrow cache stays in the test's tmp
    capitals = folder / "trained_facts.jsonl"
    capitals.write_text(
        "".join(
            json.dumps({"prompt": TRAINED.format(q=q) + stem, "choices": CHOICES, "answer": gold})
            + "\n"
            for q, stem, gold in MULTIPLE_CHOICE
        )
    )
    questions = folder / "trained_questions.jsonl"
    questions.write_text(
        "".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in ANSWERS.items())
    )
    (folder / "trained_facts.yaml").write_text(
        f"""task: ninfer_trained_facts
dataset_path: json
dataset_kwargs:
  data_files:
    test: {capitals}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""
    )
    (folder / "trained_answers.yaml").write_text(
        f"""task: ninfer_trained_answers
dataset_path: json
dataset_kwargs:
  data_files:
    test: {questions}
  cache_dir: {cache}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["<|im_end|>"]
  max_gen_toks: 24
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
"""
    )
    return folder


@pytest.fixture(scope="module")
def harness(tasks: Path) -> Iterator[Any]:
    """``simple_evaluate`` with a task manager over ``tasks``, the hub and datasets offline."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_DATASETS_OFFLINE", "1")
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("TOKENIZERS_PARALLELISM", "false")
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        manager = TaskManager(include_path=str(tasks), include_defaults=False)

        def evaluate(**kwargs: Any) -> dict[str, Any]:
            return simple_evaluate(
                task_manager=manager, log_samples=True, bootstrap_iters=0, **kwargs
            )

        yield evaluate


def total_log_likelihood(engine, ids: list[int]) -> float:
    """Sum of log P(token t | tokens before t) over ``ids[1:]``, by ``ninfer-perplexity``'s code."""
    from ninfer_runtime.perplexity import perplexity

    ppl, scored, _ = perplexity(engine, ids, context=len(ids), stride=len(ids))
    assert scored == len(ids) - 1
    return -math.log(ppl) * scored


def continuation_log_likelihood(engine, context: str, continuation: str) -> float:
    """log P(continuation | context): the whole text's score less the context's, which is the
    sum over the continuation's tokens (the context's tokens are a prefix of the whole's)."""
    whole = engine.tokenizer.encode(context + continuation)
    head = engine.tokenizer.encode(context)
    assert whole[: len(head)] == head, (context, continuation)
    return total_log_likelihood(engine, whole) - total_log_likelihood(engine, head)


@pytest.mark.parametrize("tokenized", [True, False], ids=["token-ids", "text"])
def test_multiple_choice_log_likelihoods_are_the_engines(server, engine, harness, tokenized):
    model_args = {
        "model": server.model,
        "base_url": f"{server.url}/v1/completions",
        "tokenizer_backend": "huggingface",
        "tokenizer": str(BUNDLED),
        "tokenized_requests": tokenized,
    }
    results = harness(
        model="local-completions", model_args=model_args, tasks=["ninfer_trained_facts"]
    )
    samples = results["samples"]["ninfer_trained_facts"]
    assert len(samples) == len(MULTIPLE_CHOICE)
    correct = 0
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        assert len(sample["arguments"]) == len(CHOICES)
        scores = []
        for (context, continuation), ((reported, _greedy),) in zip(
            sample["arguments"], sample["resps"], strict=True
        ):
            assert continuation.strip() in CHOICES
            expected = continuation_log_likelihood(engine, context, continuation)
            assert reported == pytest.approx(expected, abs=1e-4), (context, continuation)
            scores.append(expected)
        gold = sample["target"]
        assert sample["acc"] == float(scores.index(max(scores)) == gold)
        correct += scores.index(max(scores)) == gold
    accuracy = results["results"]["ninfer_trained_facts"]["acc,none"]
    assert accuracy == pytest.approx(correct / len(MULTIPLE_CHOICE))
    assert accuracy == 1.0  # the model was trained on these exchanges


def test_generation_task_returns_the_models_text(server, harness):
    model_args = {"model": server.model, "base_url": f"{server.url}/v1/chat/completions"}
    results = harness(
        model="local-chat-completions",
        model_args=model_args,
        tasks=["ninfer_trained_answers"],
        apply_chat_template=True,
    )
    samples = sorted(results["samples"]["ninfer_trained_answers"], key=lambda s: s["doc_id"])
    assert [s["doc"]["question"] for s in samples] == list(ANSWERS)
    for sample, question in zip(samples, ANSWERS, strict=True):
        direct = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={
                "model": server.model,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 24,
                "temperature": 0,
            },
            timeout=60,
        )
        assert direct.status_code == 200, direct.text
        text = direct.json()["choices"][0]["message"]["content"]
        assert text  # the model answers
        ((generated,),) = sample["resps"]
        assert generated == text
        assert sample["exact_match"] == float(text == ANSWERS[question])
    # the model was trained on these exchanges: it answers them word for word
    assert results["results"]["ninfer_trained_answers"]["exact_match,none"] == 1.0
