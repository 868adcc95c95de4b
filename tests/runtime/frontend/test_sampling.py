"""Sampling: validation, reproducibility, each filter and penalty on crafted logits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ninfer_runtime.errors import EngineError, RequestError
from ninfer_runtime.frontend.sampling import Sampler, SamplingParams, sample_lanes


def logits_of(probs: list[float]) -> np.ndarray:
    return np.log(np.array(probs, dtype=np.float64)).astype(np.float32)


def candidates(params: SamplingParams, logits: np.ndarray, prompt: tuple = ()) -> dict[int, float]:
    ids, probs = Sampler(params, prompt).probabilities(logits)
    return {int(i): float(p) for i, p in zip(ids, probs, strict=True)}


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 5e-324}, "repetition_penalty"),  # logits / it overflow
        ({"seed": 1.5}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["ok", ""]}, "stop[1]"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": [1, -2]}, "stop_token_ids[1]"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_validation_names_the_field(fields: dict, param: str) -> None:
    with pytest.raises(RequestError) as info:
        SamplingParams(**fields)
    assert info.value.param == param
    assert param.split("[")[0] in str(info.value)


def test_valid_params_are_normalized() -> None:
    params = SamplingParams(temperature=0, top_k=5, stop="END", stop_token_ids=[7], seed=-3)
    assert params.greedy and params.temperature == 0.0 and isinstance(params.temperature, float)
    assert params.stop == ("END",) and params.stop_token_ids == (7,)
    assert not SamplingParams(temperature=0.1).greedy


def test_resolve_request_over_model_defaults() -> None:
    defaults = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    params = SamplingParams.resolve(defaults, temperature=None, top_p=0.5, seed=1)
    assert (params.temperature, params.top_k, params.top_p, params.seed) == (0.6, 20, 0.5, 1)
    with pytest.raises(TypeError, match="unknown sampling fields: bogus"):
        SamplingParams.resolve(defaults, bogus=1)


# -- reproducibility ----------------------------------------------------------------------------


def test_seeded_requests_reproduce() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(40, 64)).astype(np.float32)
    params = SamplingParams(temperature=1.0, seed=1234)

    def run(p: SamplingParams) -> list[int]:
        sampler = Sampler(p)
        return [sampler.sample(row) for row in rows]

    first = run(params)
    assert first == run(params)
    assert first != run(SamplingParams(temperature=1.0, seed=1235))
    assert run(SamplingParams(seed=-5)) != run(SamplingParams(seed=5))
    assert len(set(first)) > 10  # it really samples


def test_lanes_do_not_disturb_each_other() -> None:
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(20, 32)).astype(np.float32)
    alone = Sampler(SamplingParams(seed=7))
    solo = [alone.sample(r) for r in rows]
    lanes = [Sampler(SamplingParams(seed=7)), Sampler(SamplingParams(seed=99, top_k=3))]
    batched = [sample_lanes(lanes, np.stack([r, r[::-1]]))[0] for r in rows]
    assert batched == solo
    with pytest.raises(EngineError, match="does not match 2 lanes"):
        sample_lanes(lanes, rows[:3])


def test_sampling_follows_the_distribution() -> None:
    logits = logits_of([0.5, 0.3, 0.2])
    sampler = Sampler(SamplingParams(seed=0))
    draws = np.bincount([sampler.sample(logits, commit=False) for _ in range(6000)], minlength=3)
    assert np.allclose(draws / 6000, [0.5, 0.3, 0.2], atol=0.03)


# -- greedy and filters -------------------------------------------------------------------------


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    logits = np.array([1.0, 3.0, 3.0, -2.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0, seed=None))
    assert [sampler.sample(logits, commit=False) for _ in range(5)] == [1] * 5


def test_temperature_sharpens_and_flattens() -> None:
    logits = logits_of([0.6, 0.3, 0.1])
    cold = candidates(SamplingParams(temperature=0.5), logits)
    hot = candidates(SamplingParams(temperature=2.0), logits)
    assert cold[0] == pytest.approx(0.36 / 0.46, rel=1e-5)
    assert hot[0] == pytest.approx(math.sqrt(0.6) / sum(map(math.sqrt, (0.6, 0.3, 0.1))), rel=1e-5)


def test_tiny_temperature_is_nearly_greedy() -> None:
    logits = np.array([1.0, 1.5, 0.5], dtype=np.float32)
    assert candidates(SamplingParams(temperature=1e-300), logits) == {1: 1.0}


def test_top_k_keeps_the_k_best_and_ties() -> None:
    logits = logits_of([0.1, 0.4, 0.2, 0.3])
    assert set(candidates(SamplingParams(top_k=2), logits)) == {1, 3}
    tied = np.array([0.0, 1.0, 1.0, 2.0], dtype=np.float32)
    assert set(candidates(SamplingParams(top_k=2), tied)) == {1, 2, 3}
    assert len(candidates(SamplingParams(top_k=0), logits)) == 4


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = logits_of([0.5, 0.3, 0.15, 0.05])
    kept = candidates(SamplingParams(top_p=0.75), logits)
    assert set(kept) == {0, 1}
    assert kept[0] == pytest.approx(0.5 / 0.8, rel=1e-5)
    assert set(candidates(SamplingParams(top_p=0.81), logits)) == {0, 1, 2}
    assert set(candidates(SamplingParams(top_p=0.01), logits)) == {0}


def test_min_p_is_relative_to_the_best_token() -> None:
    logits = logits_of([0.5, 0.3, 0.15, 0.05])
    assert set(candidates(SamplingParams(min_p=0.29), logits)) == {0, 1, 2}
    assert set(candidates(SamplingParams(min_p=0.61), logits)) == {0}


def test_filters_compose_in_order() -> None:
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    # top_k -> {0, 1, 2} renormalized to 4/9, 3/9, 2/9; top_p 0.7 -> {0, 1};
    # min_p 0.7 keeps 3/9 >= 0.7 * 4/9, min_p 0.8 does not
    assert set(candidates(SamplingParams(top_k=3, top_p=0.7, min_p=0.7), logits)) == {0, 1}
    assert set(candidates(SamplingParams(top_k=3, top_p=0.7, min_p=0.8), logits)) == {0}


def test_masked_logits_are_never_chosen() -> None:
    logits = np.array([-np.inf, 0.0, -np.inf, 0.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(seed=3))
    assert {sampler.sample(logits, commit=False) for _ in range(50)} == {1, 3}
    with pytest.raises(EngineError, match="no finite value"):
        sampler.sample(np.full(4, -np.inf, dtype=np.float32))
    with pytest.raises(EngineError, match="NaN"):
        sampler.sample(np.array([0.0, np.nan], dtype=np.float32))


# -- penalties ----------------------------------------------------------------------------------


def test_repetition_penalty_hf_style_over_prompt_and_output() -> None:
    logits = np.array([2.0, -2.0, 2.0, -2.0, 1.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(repetition_penalty=2.0), prompt_ids=[0, 1])
    out = sampler.penalized(logits)
    assert out.tolist() == [1.0, -4.0, 2.0, -2.0, 1.0]
    sampler.accept([2, 3])
    assert sampler.penalized(logits).tolist() == [1.0, -4.0, 1.0, -4.0, 1.0]
    assert logits.tolist() == [2.0, -2.0, 2.0, -2.0, 1.0]  # the input row is untouched


def test_presence_and_frequency_penalties_over_output_only() -> None:
    logits = np.zeros(4, dtype=np.float32)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    sampler = Sampler(params, prompt_ids=[3])
    sampler.accept([1, 1, 1, 2])
    assert sampler.penalized(logits).tolist() == [0.0, -1.25, -0.75, 0.0]


def test_sample_commits_tokens_for_penalties() -> None:
    logits = np.array([1.0, 0.9], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0, frequency_penalty=1.0))
    assert [sampler.sample(logits) for _ in range(3)] == [0, 1, 0]
    speculative = Sampler(SamplingParams(temperature=0, frequency_penalty=1.0))
    assert [speculative.sample(logits, commit=False) for _ in range(3)] == [0, 0, 0]


def test_penalties_apply_before_greedy() -> None:
    logits = np.array([1.0, 0.8], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0, repetition_penalty=1.5), prompt_ids=[0])
    assert sampler.sample(logits) == 1
