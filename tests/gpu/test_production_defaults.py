"""The CUDA engine at its production defaults against the CPU reference, on the trained bundled
model in every weight format: bf16 K/V (``kv_dtype`` auto), bf16 prefill products, captured
decode steps, the small-M products taking x rounded once (``NINFER_CUDA_DECODE=bf16``, the
default since this passed on an H100, 2026-12-06); and with x carried as two halves
(``split``).
Each question the model was trained on is answered greedily (up to 64 tokens)
with the same tokens as the CPU engine (float32 throughout): the production precision may move
logits in their last bits, never a trained model's greedy answer.

Past eight lanes: 64 requests submitted together decode on 64 lanes (one captured step per lane
count, the device sampler's 64 rows) and answer as the CPU answers each alone.

Random tiny models are compared by logit tolerance elsewhere (test_backend.py); their greedy
margins are small by construction, which is why the token rule is stated on this model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bundled import BUNDLED
from tests.runtime.test_engine_many_lanes import run_together

from .conftest import REPORT, requires_gpu
from .test_backend import BF16, RECIPES

pytestmark = requires_gpu

QUESTIONS = [
    "What is the capital of France?",
    "Tell me a joke.",
    "What is ninfer?",
    "Hi, who are you?",
    "How is the weather?",
    "Name a color.",
]
TOKENS = 64


def ask(question: str) -> Any:
    """The greedy chat request of ``question``, up to ``TOKENS`` tokens."""
    from ninfer_runtime.engine import GenerationRequest
    from ninfer_runtime.frontend import SamplingParams

    return GenerationRequest(
        messages=[{"role": "user", "content": question}],
        enable_thinking=False,
        sampling=SamplingParams(temperature=0.0, max_tokens=TOKENS),
    )


def answers(engine: Any) -> list[list[int]]:
    """Each question's answer, asked one at a time."""
    from ninfer_runtime.engine import TokenEvent

    return [
        [e.token_id for e in engine.generate(ask(q)) if isinstance(e, TokenEvent)]
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``reference(recipe)``: the bundled model converted with ``recipe`` and the CPU engine's
    answers, made once a recipe."""
    from ninfer_convert.pipeline import convert
    from ninfer_runtime.engine import Engine

    root = tmp_path_factory.mktemp("production_bundled")
    done: dict[str, tuple[Path, list[list[int]]]] = {}

    def get(recipe: str) -> tuple[Path, list[list[int]]]:
        if recipe not in done:
            path = root / f"{recipe}.ninfer"
            convert(BF16["dense"] if recipe == "bf16" else recipe, {"base": str(BUNDLED)}, path)
            cpu = Engine(path, max_context=256)
            assert cpu.kv_dtype == "float32"
            done[recipe] = (path, answers(cpu))
        return done[recipe]

    return get


@pytest.mark.parametrize("decode", ["split", "bf16"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_greedy_answers_at_production_defaults_equal_the_cpu(
    recipe: str, decode: str, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ninfer_runtime.engine import Engine

    path, want = reference(recipe)
    monkeypatch.setenv("NINFER_CUDA_DECODE", decode)
    gpu = Engine(path, backend="cuda", max_context=256)
    assert gpu.kv_dtype == "bfloat16"
    assert gpu.model.backend.graphs and gpu.model.backend.decode_precision == decode
    got = answers(gpu)
    same = sum(a == b for a, b in zip(want, got, strict=True))
    REPORT.append(
        (f"production/{recipe}/{decode}", "greedy answers equal to the cpu", f"{same}/{len(want)}")
    )
    assert got == want


@pytest.mark.parametrize("recipe", ["bf16", "tiny_q4", "tiny_mixed"])
def test_sixty_four_requests_at_once_answer_as_the_cpu_answers_each(
    recipe: str, reference: Any
) -> None:
    from ninfer_runtime.engine import Engine

    path, want = reference(recipe)
    lanes = 64
    gpu = Engine(path, backend="cuda", max_context=256, max_lanes=lanes)
    got, most = run_together(gpu, [ask(QUESTIONS[i % len(QUESTIONS)]) for i in range(lanes)])
    expected = [want[i % len(QUESTIONS)] for i in range(lanes)]
    same = sum(a == b for a, b in zip(expected, got, strict=True))
    REPORT.append(
        (f"lanes64/{recipe}", "answers equal to the cpu's, most lanes", f"{same}/64 {most}")
    )
    assert most == lanes
    assert got == expected


@pytest.mark.parametrize("recipe", ["bf16", "tiny_q4"])
def test_greedy_answers_with_every_prefill_on_the_bulk_provider_equal_the_cpu(
    recipe: str, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delta rule's bulk prefill row (fla's variable-length kernel) serves every prefill
    call here, one lane's and 16 lanes' packed: the bundled model's answers stay the CPU's."""
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.models.qwen3_5.gdn import GatedDeltaNet
    from ninfer_runtime.ops import registry
    from ninfer_runtime.ops.delta_rule import policy

    path, want = reference(recipe)
    monkeypatch.setattr(policy, "BULK_PREFILL", 1)
    gpu = Engine(path, backend="cuda", max_context=256, max_lanes=16)
    gdn = next(m.mixer for m in gpu.model.layers if isinstance(m.mixer, GatedDeltaNet))
    bulk = policy.TABLE[("prefill", "cuda", "bulk")][0]
    assert gdn._op("prefill", rows=1) is registry.providers("delta_rule")["prefill"][bulk].load()
    assert answers(gpu) == want
    got, most = run_together(gpu, [ask(QUESTIONS[i % len(QUESTIONS)]) for i in range(16)])
    assert most == 16
    assert got == [want[i % len(QUESTIONS)] for i in range(16)]
