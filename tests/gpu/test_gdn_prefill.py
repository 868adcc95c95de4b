"""The Gated DeltaNet prefill kernels (``cuda/gdn_prefill.py``) against the reference
(``conv.causal_conv`` / ``conv.split_heads`` / ``reference.chunk`` in float64 on the same float32
inputs).

Awkward sizes on purpose: token counts around the 64-token chunk, a value head size that
does not fill the 32/64-column tiles, value heads sharing key heads 1, 2 or 3 ways, every
compiled key head size, and a state carried in from before (as a prefill chunk after the
first has)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends import array_ops as A
from ninfer_runtime.backends.cuda import gdn_prefill
from ninfer_runtime.functional import l2_normalize
from ninfer_runtime.ops import delta_rule
from ninfer_runtime.ops.delta_rule import conv as C
from ninfer_runtime.ops.delta_rule import reference as R

from .conftest import requires_gpu

pytestmark = requires_gpu


def _inputs(rng: np.random.Generator, t: int, hk: int, hv: int, dk: int, dv: int) -> tuple:
    q = l2_normalize(rng.standard_normal((t, hk, dk))) * dk**-0.5
    k = l2_normalize(rng.standard_normal((t, hk, dk)))
    v = rng.standard_normal((t, hv, dv))
    g = -np.log1p(np.exp(rng.standard_normal((t, hv)))) * 0.3  # log-decay <= 0
    beta = 1 / (1 + np.exp(-rng.standard_normal((t, hv))))
    state = rng.standard_normal((hv, dk, dv)) * 0.5
    return tuple(a.astype(np.float32) for a in (q, k, v, g, beta, state))


CASES = [  # (tokens, key heads, value heads, dk, dv)
    (1, 1, 1, 16, 16),
    (63, 2, 4, 16, 36),
    (64, 1, 3, 32, 64),
    (65, 2, 2, 64, 20),
    (200, 2, 6, 128, 128),
    (333, 16, 48, 128, 128),  # the 27B layer's heads
]


@pytest.mark.parametrize(("t", "hk", "hv", "dk", "dv"), CASES)
def test_gdn_chunk_matches_the_reference(t: int, hk: int, hv: int, dk: int, dv: int) -> None:
    import cupy as cp

    rng = np.random.default_rng(t * 7 + dk)
    q, k, v, g, beta, state = _inputs(rng, t, hk, hv, dk, dv)
    want_state = state.astype(np.float64)
    want = R.chunk(*(a.astype(np.float64) for a in (q, k, v, g, beta)), want_state)

    got_state = cp.asarray(state)
    got = gdn_prefill.gdn_chunk(*(cp.asarray(a) for a in (q, k, v, g, beta)), got_state)
    for name, x, ref in (("out", got, want), ("state", got_state, want_state)):
        x = cp.asnumpy(x).astype(np.float64)
        assert np.all(np.isfinite(x)), name
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(x, ref, rtol=1e-4, atol=2e-5 * scale, err_msg=name)


def test_gdn_chunk_continues_where_an_earlier_chunk_left_off() -> None:
    """Two calls over halves equal one call over the whole (the state carries everything)."""
    import cupy as cp

    rng = np.random.default_rng(5)
    q, k, v, g, beta, state = (cp.asarray(a) for a in _inputs(rng, 150, 2, 4, 64, 64))
    whole_state = state.copy()
    whole = gdn_prefill.gdn_chunk(q, k, v, g, beta, whole_state)
    halves = [
        gdn_prefill.gdn_chunk(q[s], k[s], v[s], g[s], beta[s], state)
        for s in (slice(0, 77), slice(77, 150))
    ]
    np.testing.assert_allclose(
        cp.asnumpy(cp.concatenate(halves)), cp.asnumpy(whole), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(cp.asnumpy(state), cp.asnumpy(whole_state), rtol=1e-4, atol=1e-5)


CONV_CASES = [  # (tokens, taps, key heads, dk, value width, mixed's first column, row width)
    (1, 4, 1, 16, 48, 0, 87),  # fewer tokens than the window; row stride 87: one a thread
    (3, 2, 2, 32, 40, 0, 175),
    (130, 4, 16, 128, 6144, 0, 10247),
    (130, 4, 16, 128, 6144, 0, 10304),  # float4, ten channel slices, a part token tile
    (21, 3, 2, 64, 96, 4, 356),  # float4 from a column slice 16 bytes in
    (21, 3, 2, 64, 96, 1, 356),  # a slice 4 bytes in: one a thread
    (9, 4, 2, 16, 18, 0, 84),  # a value width that is not a multiple of 4
    (24, 2, 2, 16, 32, 0, 100),  # whole token tiles
    (11, 4, 40, 20, 8, 0, 1608),  # a slice boundary among the key heads (1020 channels)
    (257, 4, 16, 128, 4096, 0, 12352),  # the 27B layer's layout
]


@pytest.mark.parametrize(("t", "taps", "hk", "dk", "value_width", "first", "width"), CONV_CASES)
def test_conv_heads_matches_the_reference(
    t: int, taps: int, hk: int, dk: int, value_width: int, first: int, width: int
) -> None:
    """Rows of a wider array (as the model's projection output), a conv state carried in,
    token counts that fill the 8-token tiles or not."""
    import cupy as cp

    rng = np.random.default_rng(t + taps + first)
    channels = 2 * hk * dk + value_width
    wide = rng.standard_normal((t, width)).astype(np.float32)
    kernel = (rng.standard_normal((taps, channels)) * 0.5).astype(np.float32)
    state = rng.standard_normal((channels, taps - 1)).astype(np.float32)
    want_state = state.astype(np.float64)
    rows = wide[:, first : first + channels].astype(np.float64)
    conv = A.silu(C.causal_conv(rows, kernel.astype(np.float64), want_state))
    want = C.split_heads(conv, hk, dk, 1, value_width)

    got_state = cp.asarray(state)[None]  # slot 0 of one
    got = gdn_prefill.conv_heads(
        cp.asarray(wide)[:, first:],
        cp.asarray(kernel),
        got_state,
        ((0, t, 0),),
        key_heads=hk,
        key_dim=dk,
        value_width=value_width,
    )
    for name, x, ref in zip("qkv", got, want, strict=True):
        np.testing.assert_allclose(
            cp.asnumpy(x).reshape(ref.shape), ref, rtol=1e-5, atol=1e-6, err_msg=name
        )
    np.testing.assert_array_equal(cp.asnumpy(got_state[0]), want_state.astype(np.float32))


def test_conv_heads_float4_and_one_a_thread_agree_to_the_bit() -> None:
    """The same rows 16 bytes into a wider array (float4) and 4 bytes in (the scalar
    fallback): the same float operations per element in the same order."""
    import cupy as cp

    rng = np.random.default_rng(3)
    t, hk, dk, value_width = 37, 4, 128, 1024
    channels = 2 * hk * dk + value_width
    rows = cp.asarray(rng.standard_normal((t, channels)), cp.float32)
    kernel = cp.asarray(rng.standard_normal((4, channels)) * 0.5, cp.float32)
    state = cp.asarray(rng.standard_normal((channels, 3)), cp.float32)
    dims = {"key_heads": hk, "key_dim": dk, "value_width": value_width}
    got = []
    for first in (4, 1):
        wide = cp.zeros((t, channels + 8), cp.float32)
        wide[:, first : first + channels] = rows
        lane = ((0, t, 0),)
        states = state[None].copy()
        got.append(gdn_prefill.conv_heads(wide[:, first:], kernel, states, lane, **dims))
    for name, a, b in zip("qkv", *got, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b), err_msg=name)


def test_the_backend_prefill_equals_the_reference_on_cupy(cuda_backend) -> None:
    """The delta_rule family's ``prefill`` on CUDA (kernels) against
    ``reference.prefill`` run on CuPy, states included; a value head size our kernels do
    not take goes to the next provider of the delta_rule policy, checked within that
    provider's stated tolerance."""
    import cupy as cp

    from ninfer_runtime.ops import registry
    from ninfer_runtime.ops.delta_rule.reference import TOLERANCE

    rng = np.random.default_rng(1)
    for t, hk, hv, dk, dv in ((70, 1, 2, 32, 32), (5, 1, 2, 32, 18)):
        channels = 2 * hk * dk + hv * dv
        mixed = cp.asarray(rng.standard_normal((t, channels)), cp.float32)
        kernel = cp.asarray(rng.standard_normal((4, channels)) * 0.5, cp.float32)
        g = cp.asarray(-np.abs(rng.standard_normal((t, hv))) * 0.3, cp.float32)
        beta = cp.asarray(rng.random((t, hv)), cp.float32)
        conv = cp.asarray(rng.standard_normal((channels, 3)), cp.float32)
        state = cp.asarray(rng.standard_normal((hv, dk, dv)) * 0.5, cp.float32)
        dims = {"key_heads": hk, "key_dim": dk, "value_heads": hv, "value_dim": dv}
        ref_conv, ref_state = conv.copy(), state.copy()
        lane = ((0, t, 0),)
        got = delta_rule.resolved("prefill", "cuda", kernel, **dims)(
            mixed, kernel, conv[None], g, beta, state[None], lane, **dims
        )
        want = R.prefill(mixed, kernel, ref_conv[None], g, beta, ref_state[None], lane, **dims)
        chosen = registry.resolve("delta_rule", "chunk", device="cuda", key_dim=dk, value_dim=dv)
        name = next(
            n for n, p in registry.providers("delta_rule")["chunk"].items() if p.load() is chosen
        )
        assert (name == "nvrtc") == (dv % 4 == 0)
        rtol, atol = TOLERANCE[name]
        for x, ref in ((got, want), (state, ref_state), (conv, ref_conv)):
            scale = max(float(cp.abs(ref).max()), 1.0)
            np.testing.assert_allclose(
                cp.asnumpy(x), cp.asnumpy(ref), rtol=max(rtol, 1e-4), atol=max(atol * scale, 1e-5)
            )


def test_lanes_stacked_in_one_call_equal_each_lane_alone() -> None:
    """The family's ``prefill`` on CUDA over several lanes' rows in one call (segments of
    1 to 130 rows, around the 8-token tiles and the 64-token chunks, in slots out of order,
    rows of no lane between them): each lane's rows, states and convolution states are
    those of the lane prefilled alone, to the bit (the same launches' arithmetic per chunk)."""
    import cupy as cp

    rng = np.random.default_rng(11)
    hk, hv, dk, dv, taps = 2, 4, 128, 64, 4
    dims = {"key_heads": hk, "key_dim": dk, "value_heads": hv, "value_dim": dv}
    channels = 2 * hk * dk + hv * dv
    lengths, slots, gap = (1, 63, 64, 65, 130, 7), (3, 0, 5, 1, 6, 2), 3
    segments, at = [], 0
    for count, slot in zip(lengths, slots, strict=True):
        segments.append((at, count, slot))
        at += count + gap
    n = at
    mixed = cp.asarray(rng.standard_normal((n, channels + 16)), cp.float32)[:, :channels]
    kernel = cp.asarray(rng.standard_normal((taps, channels)) * 0.5, cp.float32)
    g = cp.asarray(-np.abs(rng.standard_normal((n, hv))) * 0.3, cp.float32)
    beta = cp.asarray(rng.random((n, hv)), cp.float32)
    conv = cp.asarray(rng.standard_normal((8, channels, taps - 1)), cp.float32)
    state = cp.asarray(rng.standard_normal((8, hv, dk, dv)) * 0.5, cp.float32)
    prefill = delta_rule.resolved("prefill", "cuda", kernel, **dims)

    together_conv, together_state = conv.copy(), state.copy()
    together = prefill(mixed, kernel, together_conv, g, beta, together_state, segments, **dims)
    for first, count, slot in segments:
        rows = slice(first, first + count)
        alone_conv, alone_state = conv[slot : slot + 1].copy(), state[slot : slot + 1].copy()
        alone = prefill(
            mixed[rows], kernel, alone_conv, g[rows], beta[rows], alone_state, ((0, count, 0),),
            **dims,
        )  # fmt: skip
        np.testing.assert_array_equal(cp.asnumpy(together[rows]), cp.asnumpy(alone))
        np.testing.assert_array_equal(cp.asnumpy(together_state[slot]), cp.asnumpy(alone_state[0]))
        np.testing.assert_array_equal(cp.asnumpy(together_conv[slot]), cp.asnumpy(alone_conv[0]))
    untouched = [s for s in range(8) if s not in slots]
    np.testing.assert_array_equal(
        cp.asnumpy(together_state[untouched]), cp.asnumpy(state[untouched])
    )
