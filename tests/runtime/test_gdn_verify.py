"""The reference verification ops (the delta_rule family's ``reference.verify`` / ``commit``)
against plain decoding: T tokens verified from the lanes' states leave them untouched and
give the rows T ``decode`` calls give; committing the first counts[i] of them leaves the
states those calls leave, bit for bit, without reading ``counts`` on the host."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.ops.delta_rule import reference as R
from ninfer_runtime.ops.delta_rule.memory import GdnDrafts, GdnSpec

DIMS = dict(key_heads=2, key_dim=16, value_heads=4, value_dim=8)
TAPS, POOL, ROWS = 4, 6, 6
CHANNELS = 2 * 2 * 16 + 4 * 8


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def inputs(rng: np.random.Generator, lanes: int, tokens: int) -> dict[str, np.ndarray]:
    n = lanes * tokens
    return {
        "mixed": f32(rng, n, CHANNELS),
        "g": -rng.uniform(0.01, 2.0, (n, DIMS["value_heads"])).astype(np.float32),
        "beta": rng.uniform(0.0, 1.0, (n, DIMS["value_heads"])).astype(np.float32),
    }


def decode_in_turn(x, kernel, conv, states, slots, tokens, counts):
    """Token j of lane i through ``gdn_decode`` for every j < counts[i]; -> rows [N, Hv, dv]
    (zeros where not decoded)."""
    lanes = len(slots)
    out = np.zeros((lanes * tokens, DIMS["value_heads"], DIMS["value_dim"]), np.float32)
    for j in range(tokens):
        live = np.flatnonzero(counts > j)
        rows = live * tokens + j
        out[rows] = R.decode(
            x["mixed"][rows], kernel, conv, x["g"][rows], x["beta"][rows], states, slots[live],
            **DIMS,
        )  # fmt: skip
    return out


@pytest.mark.parametrize(("lanes", "tokens"), [(1, 2), (3, 4), (4, 6)])
def test_verify_then_commit_equals_decoding_in_turn(lanes: int, tokens: int) -> None:
    rng = np.random.default_rng(lanes * 10 + tokens)
    kernel = f32(rng, TAPS, CHANNELS, scale=0.5)
    conv = f32(rng, POOL, CHANNELS, TAPS - 1)
    states = f32(rng, POOL, 4, 16, 8, scale=0.3)
    slots = rng.permutation(POOL)[:lanes].astype(np.int32)
    x = inputs(rng, lanes, tokens)
    records = GdnDrafts(GdnSpec(4, 16, 8, CHANNELS, TAPS), POOL, ROWS, np)
    records.mixed[...] = f32(rng, POOL, ROWS, CHANNELS)  # stale rows of an earlier round
    conv0, states0 = conv.copy(), states.copy()

    o = R.verify(
        x["mixed"], kernel, conv, x["g"], x["beta"], states, slots, records, tokens=tokens,
        **DIMS,
    )  # fmt: skip
    assert np.array_equal(conv, conv0) and np.array_equal(states, states0)
    for stored, name in ((records.mixed, "mixed"), (records.g, "g"), (records.beta, "beta")):
        assert np.array_equal(stored[slots, :tokens], x[name].reshape(lanes, tokens, -1))
    conv_ref, states_ref = conv.copy(), states.copy()
    every = np.full(lanes, tokens)
    ref = decode_in_turn(x, kernel, conv_ref, states_ref, slots, tokens, every)
    assert np.array_equal(o, ref)

    counts = rng.integers(1, tokens + 1, lanes).astype(np.int32)
    counts[0] = tokens
    conv_ref, states_ref = conv.copy(), states.copy()
    decode_in_turn(x, kernel, conv_ref, states_ref, slots, tokens, counts)
    R.commit(kernel, conv, states, slots, records, counts, **DIMS)
    assert np.array_equal(conv, conv_ref)
    assert np.array_equal(states, states_ref)
    others = np.setdiff1d(np.arange(POOL), slots)
    assert np.array_equal(states[others], states0[others])


@pytest.mark.parametrize("k", [1, 4])
def test_speculative_rounds_equal_plain_decoding_on_the_cpu(artifact_path, k: int) -> None:
    """Through the runner: every verified row's logits and, after the commits of random
    accepted prefixes, every GDN state equal plain decoding's bit for bit (CPU products are
    row-stable up to 64 rows)."""
    from ninfer_runtime.backends.cpu import CpuBackend
    from tests.speculation import speculate_against_decoding

    path = artifact_path("qwen3_5_bf16", "dense")
    err, scale, state_err = speculate_against_decoding(
        path, CpuBackend, lanes=3, k=k, rounds=4, seed=k
    )
    assert scale > 0 and err == 0.0 and state_err == 0.0
