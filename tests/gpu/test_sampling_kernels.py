"""The on-device sampler (kernels/sampling.cu) against the numpy reference sampler.

Greedy must equal numpy's argmax (ties to the lowest id); sampled tokens must come only from the
reference's survivors (``Sampler.probabilities``) with its probabilities, be a function of
(seed, counter, logits row, parameters) alone, and the launch must replay from a CUDA graph.
The draws are deterministic, so the statistical bounds cannot flake: a seed passes or fails.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.cuda import sampling as S
from ninfer_runtime.frontend.sampling import Sampler, SamplingParams

from .conftest import requires_gpu

pytestmark = requires_gpu

LANES = S.MAX_LANES


def draw(row: np.ndarray, params: SamplingParams, counters: np.ndarray, seed: int = 1234) -> Any:
    """One token per counter for one logits row (8 lanes a launch, no host sync in between)."""
    import cupy as cp

    rounds = -(-len(counters) // LANES)
    logits = cp.asarray(np.ascontiguousarray(np.broadcast_to(row, (LANES, row.size))))
    lane = {
        "temperature": cp.full(LANES, params.temperature, cp.float32),
        "top_k": cp.full(LANES, params.top_k, cp.int32),
        "top_p": cp.full(LANES, params.top_p, cp.float64),
        "min_p": cp.full(LANES, params.min_p, cp.float64),
        "seeds": cp.full(LANES, seed, cp.uint64),
    }
    padded = np.zeros(rounds * LANES, np.uint64)
    padded[: len(counters)] = counters
    steps = cp.asarray(padded.reshape(rounds, LANES))
    out = cp.empty((rounds, LANES), cp.int32)
    for r in range(rounds):
        S.sample(logits, **lane, counters=steps[r], out=out[r])
    return cp.asnumpy(out).reshape(-1)[: len(counters)]


@pytest.mark.parametrize("vocab", [50, 1000, 248_320])
def test_greedy_is_argmax_with_ties_to_the_lowest_id(vocab: int) -> None:
    import cupy as cp

    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal((LANES, vocab)).astype(np.float32)
    for i in range(1, 6):  # lane i: the maximum i + 1 times
        logits[i, rng.choice(vocab, size=i, replace=False)] = logits[i].max()
    logits[5, : vocab // 2] = -np.inf
    logits[6] = -1.0
    logits[6, [5, 10]] = [-0.0, 0.0]  # equal values: the lower id wins
    logits[7] = 0.25  # all tied
    padded = np.full((LANES, vocab + 3), 9.0, np.float32)  # strided rows: ld != V
    padded[:, 1 : vocab + 1] = logits
    sampler = S.DeviceSampler()
    for i in range(LANES):
        sampler.set_lane(i, SamplingParams(temperature=0.0, top_k=5), seed=i, counter=0)
    got = cp.asnumpy(sampler.sample(cp.asarray(padded)[:, 1 : vocab + 1]))
    np.testing.assert_array_equal(got, np.argmax(logits, axis=1))


def test_rows_without_a_finite_logit_give_minus_one() -> None:
    import cupy as cp

    logits = np.full((2, 100), -np.inf, np.float32)
    logits[1, ::2] = np.nan
    sampler = S.DeviceSampler()
    sampler.set_lane(0, SamplingParams(temperature=0.0), seed=0, counter=0)
    sampler.set_lane(1, SamplingParams(top_p=0.5, top_k=3), seed=0, counter=0)
    assert cp.asnumpy(sampler.sample(cp.asarray(logits))).tolist() == [-1, -1]


CASES = {
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(top_k=8),
    "top_p": SamplingParams(top_p=0.8),
    "min_p": SamplingParams(min_p=0.1),
    "combined": SamplingParams(temperature=1.3, top_k=20, top_p=0.9, min_p=0.02),
}


@pytest.mark.parametrize("name", list(CASES))
def test_draws_follow_the_filtered_distribution(name: str) -> None:
    params, n = CASES[name], 20_000
    row = (np.random.default_rng(7).standard_normal(50) * 1.5).astype(np.float32)
    ids, probs = Sampler(params).probabilities(row)
    draws = draw(row, params, np.arange(n, dtype=np.uint64))
    assert set(np.unique(draws).tolist()) <= set(ids.tolist()), "a filtered-out token was drawn"
    counts = np.bincount(draws, minlength=row.size)[ids].astype(np.float64)
    tv = 0.5 * np.abs(counts / n - probs).sum()
    assert tv < 0.04, f"total variation {tv:.4f}"
    # Pearson chi-square, categories with fewer than 5 expected pooled, bound ~6 sigma
    expected = probs * n
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    chi2, df = float(((obs - exp) ** 2 / exp).sum()), max(len(exp) - 1, 1)
    assert chi2 < df + 6 * math.sqrt(2 * df), f"chi2 {chi2:.1f} with {df} dof"


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=3),  # the 3rd largest is 2: ids 1, 4, 6
        SamplingParams(top_k=4),  # the 4th largest is 1: every 1 stays too
        SamplingParams(top_k=4, top_p=0.8, temperature=2.0),  # 5 of the seven 1s: 2..9
        SamplingParams(top_p=0.5, temperature=5.0),  # two of the 1s: ids 2 and 3
    ],
    ids=["top_k", "top_k_ties", "top_p_in_ties", "top_p"],
)
def test_ties_at_the_cut_match_the_reference(params: SamplingParams) -> None:
    """top_k keeps every tie of the k-th logit; top_p takes tied tokens by ascending id."""
    row = np.array([0, 3, 1, 1, 3, 1, 2, 1, -np.inf, 1, 1, 1], np.float32)
    ids, _ = Sampler(params).probabilities(row)
    draws = draw(row, params, np.arange(4000, dtype=np.uint64), seed=99)
    assert sorted(set(draws.tolist())) == sorted(ids.tolist())


def test_nucleus_takes_tied_tokens_by_id() -> None:
    row = np.concatenate([np.full(8, 1.0), np.full(4, -6.0)]).astype(np.float32)
    params = SamplingParams(top_p=0.5)  # eight ~1/8 tokens: mass before the 5th is ~0.4996
    ids, _ = Sampler(params).probabilities(row)
    assert ids.tolist() == [0, 1, 2, 3, 4]
    draws = draw(row, params, np.arange(2000, dtype=np.uint64))
    assert sorted(set(draws.tolist())) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=50),
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(min_p=0.2),
        SamplingParams(temperature=1.5, top_k=1000, top_p=0.7, min_p=0.01),
    ],
    ids=["top_k", "top_p", "min_p", "combined"],
)
def test_large_vocabulary_draws_only_survivors(params: SamplingParams) -> None:
    rng = np.random.default_rng(3)
    row = rng.standard_normal(248_320).astype(np.float32)
    row[rng.choice(row.size, 40, replace=False)] += rng.uniform(4, 9, 40).astype(np.float32)
    ids, _ = Sampler(params).probabilities(row)
    draws = draw(row, params, np.arange(400, dtype=np.uint64))
    outside = set(draws.tolist()) - set(ids.tolist())
    assert not outside, f"drew filtered-out tokens {sorted(outside)[:10]}"


def test_seeded_lanes_do_not_depend_on_the_batch() -> None:
    import cupy as cp

    rng = np.random.default_rng(11)
    params = [
        SamplingParams(temperature=0.9, top_p=0.95),
        SamplingParams(top_k=40),
        SamplingParams(min_p=0.05, temperature=1.2),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=100, top_p=0.8, min_p=0.01),
        SamplingParams(temperature=2.0),
        SamplingParams(top_p=0.5),
        SamplingParams(temperature=0.6, top_k=7),
    ]
    logits = (rng.standard_normal((len(params), 5000)) * 2).astype(np.float32)

    def run(requests: list[int], counter: int) -> np.ndarray:
        sampler = S.DeviceSampler()
        for lane, r in enumerate(requests):
            sampler.set_lane(lane, params[r], seed=1000 + r, counter=counter)
        return cp.asnumpy(sampler.sample(cp.asarray(logits[requests])))

    everyone = list(range(len(params)))  # fewer than MAX_LANES: the rest stay unset
    first = run(everyone, 5)
    np.testing.assert_array_equal(run(everyone, 5), first)
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    np.testing.assert_array_equal(run(order, 5), first[order])
    np.testing.assert_array_equal(run([6, 1, 4], 5), first[[6, 1, 4]])
    later = np.stack([run(everyone, c) for c in range(6, 12)])
    assert (later != first).any(axis=0).sum() >= 5, "the counter does not change the draws"


def test_graph_replay_with_new_logits() -> None:
    import cupy as cp

    vocab = 3000
    sampler = S.DeviceSampler()
    for i in range(4):
        sampler.set_lane(i, SamplingParams(temperature=0.0), seed=0, counter=0)
    for i in range(4, LANES):
        sampler.set_lane(i, SamplingParams(temperature=0.8, top_k=20, top_p=0.9), i, 0)
    buf = cp.zeros((LANES, vocab), cp.float32)
    sampler.sample(buf)  # compile and load before capture
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        ids = sampler.sample(buf)
        graph = stream.end_capture()
    rng = np.random.default_rng(5)
    for _ in range(4):
        logits = (rng.standard_normal((LANES, vocab)) * 3).astype(np.float32)
        with stream:
            buf.set(logits)
            sampler.advance()
            graph.launch(stream)
            stream.synchronize()
            got = cp.asnumpy(ids)
            eager = cp.asnumpy(sampler.sample(buf))
            stream.synchronize()
        np.testing.assert_array_equal(got[:4], np.argmax(logits[:4], axis=1))
        np.testing.assert_array_equal(got, eager)
        for i in range(4, LANES):
            survivors, _ = Sampler(
                SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
            ).probabilities(logits[i])
            assert got[i] in survivors


def test_supports_only_penalty_free_lanes() -> None:
    assert S.supports(SamplingParams(temperature=0.3, top_k=5, top_p=0.9, min_p=0.1))
    assert not S.supports(SamplingParams(presence_penalty=0.5))
    assert not S.supports(SamplingParams(frequency_penalty=-0.1))
    assert not S.supports(SamplingParams(repetition_penalty=1.1))
    with pytest.raises(ValueError):
        S.DeviceSampler().set_lane(0, SamplingParams(repetition_penalty=1.2), seed=0, counter=0)


def test_set_lanes_is_set_lane_for_every_lane_in_one_upload() -> None:
    import cupy as cp

    rng = np.random.default_rng(13)
    logits = cp.asarray((rng.standard_normal((5, 4000)) * 2).astype(np.float32))
    lanes = [
        (SamplingParams(temperature=0.9, top_p=0.95), 7, 3),
        (SamplingParams(temperature=0.0), 8, 0),
        (SamplingParams(top_k=40, min_p=0.05), 2**64 + 9, 11),
        (SamplingParams(temperature=1.7), 10, 2),
        (SamplingParams(top_k=5, top_p=0.5), 11, 1),
    ]
    one_by_one = S.DeviceSampler()
    for i, (params, seed, counter) in enumerate(lanes):
        one_by_one.set_lane(i, params, seed, counter)
    together = S.DeviceSampler()
    together.set_lanes(lanes)
    np.testing.assert_array_equal(cp.asnumpy(together._device), cp.asnumpy(one_by_one._device))
    np.testing.assert_array_equal(
        cp.asnumpy(together.sample(logits)), cp.asnumpy(one_by_one.sample(logits))
    )
    with pytest.raises(ValueError):
        together.set_lanes([(SamplingParams(presence_penalty=0.5), 0, 0)])
    with pytest.raises(IndexError):
        together.set_lanes([(SamplingParams(), 0, 0)] * (LANES + 1))
