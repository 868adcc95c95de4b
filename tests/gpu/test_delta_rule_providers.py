"""Every delta_rule provider the policy can pick on CUDA against the family's reference
(float64 on the same float32 inputs), within the provider's stated ``TOLERANCE``, on the
awkward sizes of test_gdn_prefill (token counts around the 64-token chunk, value heads sharing
key heads 1-3 ways, a value head size that fills no tile, a carried-in state); and the engine
path resolves the policy's first installed provider."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.ops import registry
from ninfer_runtime.ops.delta_rule import policy
from ninfer_runtime.ops.delta_rule import reference as R
from ninfer_runtime.ops.delta_rule.reference import TOLERANCE

from .conftest import requires_gpu
from .test_gdn_prefill import CASES, _inputs

pytestmark = requires_gpu

CUDA_PROVIDERS = [n for n in policy.TABLE[("chunk", "cuda")] if n != "reference"]
#: a library provider autotunes its kernels for every new head layout (seconds each): two
#: of the sizes, the awkward one and the 27B's, for those
LIBRARY_CASES = [CASES[1], CASES[-1]]


def _provider(name: str) -> registry.Provider:
    provider = registry.providers("delta_rule")["chunk"][name]
    if not provider.available():
        pytest.skip(f"delta_rule.{name} needs {', '.join(provider.requires)} (not installed)")
    return provider


@pytest.mark.parametrize(
    ("name", "t", "hk", "hv", "dk", "dv"),
    [(n, *case) for n in CUDA_PROVIDERS for case in (CASES if n == "nvrtc" else LIBRARY_CASES)],
)
def test_provider_matches_the_reference(
    name: str, t: int, hk: int, hv: int, dk: int, dv: int
) -> None:
    import cupy as cp

    provider = _provider(name)
    if not provider.takes({"device": "cuda", "key_dim": dk, "value_dim": dv}):
        pytest.skip(f"delta_rule.{name} declines dk={dk}, dv={dv}")
    rng = np.random.default_rng(t * 7 + dk)
    q, k, v, g, beta, state = _inputs(rng, t, hk, hv, dk, dv)
    want_state = state.astype(np.float64)
    want = R.chunk(*(a.astype(np.float64) for a in (q, k, v, g, beta)), want_state)
    got_state = cp.asarray(state)
    got = provider.load()(*(cp.asarray(a) for a in (q, k, v, g, beta)), got_state)
    rtol, atol = TOLERANCE[name]
    for what, x, ref in (("out", got, want), ("state", got_state, want_state)):
        x = cp.asnumpy(x).astype(np.float64)
        assert np.all(np.isfinite(x)), what
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(x, ref, rtol=rtol, atol=atol * scale, err_msg=f"{name} {what}")


def test_the_backend_resolves_the_first_installed_provider() -> None:
    expected = next(n for n in CUDA_PROVIDERS if _provider_if_available(n))
    fn = registry.resolve("delta_rule", "chunk", device="cuda", key_dim=128, value_dim=128)
    assert fn is registry.providers("delta_rule")["chunk"][expected].load()


def _provider_if_available(name: str) -> bool:
    return registry.providers("delta_rule")["chunk"][name].available()


#: (T, heads, head size): the tiny GLM5Next's KDA layer, a chunk past fla's 64 with an awkward
#: head size, and GLM5Next's heads
KDA_CASES = [(37, 2, 32), (100, 4, 64), (300, 64, 128)]


@pytest.mark.parametrize(("t", "h", "d"), KDA_CASES)
def test_kda_providers_match_the_reference(t: int, h: int, d: int) -> None:
    """Each CUDA provider of ``kda_chunk`` (per-channel log-decays in GLM5Next's [-5, 0))
    against the float64 oracle on the same float32 inputs."""
    import cupy as cp

    from ninfer_runtime.ops.delta_rule import kda_reference as KDA

    rng = np.random.default_rng(t + h + d)
    q, k, v, _, beta, state = _inputs(rng, t, h, h, d, d)
    g = (-5 / (1 + np.exp(3 - 2 * rng.standard_normal((t, h, d))))).astype(np.float32)
    want_state = state.astype(np.float64)
    want = KDA.kda_chunk(*(a.astype(np.float64) for a in (q, k, v, g, beta)), want_state)
    table = registry.providers("delta_rule")["kda_chunk"]
    for name in policy.TABLE[("kda_chunk", "cuda")]:
        if not table[name].available():
            continue
        got_state = cp.asarray(state)
        got = table[name].load()(*(cp.asarray(a) for a in (q, k, v, g, beta)), got_state)
        rtol, atol = TOLERANCE[name]
        for what, x, ref in (("out", got, want), ("state", got_state, want_state)):
            x = cp.asnumpy(x).astype(np.float64)
            assert np.all(np.isfinite(x)), what
            scale = float(np.abs(ref).max())
            np.testing.assert_allclose(
                x, ref, rtol=rtol, atol=atol * scale, err_msg=f"kda {name} {what}"
            )


#: (lanes, heads, head size, taps): the tiny GLM5Next's KDA layer, several lanes of an awkward
#: size, and GLM5Next's heads
KDA_DECODE_CASES = [(1, 2, 32, 4), (3, 4, 64, 3), (8, 64, 128, 4)]


@pytest.mark.parametrize(("n", "h", "d", "taps"), KDA_DECODE_CASES)
def test_kda_decode_providers_match_the_reference(n: int, h: int, d: int, taps: int) -> None:
    """Each CUDA provider of ``kda_decode`` (the convolution step, SiLU, the q/k normalisation
    and the delta rule with one decay a key channel, states by slot) against the float64
    oracle on the same float32 inputs: the output and both states, within the family's
    stated tolerance; the slots not stepped stay as they were, to the bit."""
    import cupy as cp

    from ninfer_runtime.ops.delta_rule import kda_reference as KDA

    rng = np.random.default_rng(n * 31 + h + d)
    channels, pool = 3 * h * d, n + 2
    mixed = rng.standard_normal((n, channels)).astype(np.float32)
    kernel = (rng.standard_normal((taps, channels)) * 0.5).astype(np.float32)
    conv = rng.standard_normal((pool, channels, taps - 1)).astype(np.float32)
    g = (-5 / (1 + np.exp(3 - 2 * rng.standard_normal((n, h, d))))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((n, h))))).astype(np.float32)
    states = (rng.standard_normal((pool, h, d, d)) * 0.5).astype(np.float32)
    slots = rng.permutation(pool)[:n].astype(np.int32)
    dims = {"heads": h, "head_dim": d}
    want_conv, want_states = conv.astype(np.float64), states.astype(np.float64)
    f64 = (a.astype(np.float64) for a in (mixed, kernel))
    want = KDA.kda_decode(
        *f64, want_conv, g.astype(np.float64), beta.astype(np.float64), want_states, slots, **dims
    )
    table = registry.providers("delta_rule")["kda_decode"]
    for name in policy.TABLE[("kda_decode", "cuda")]:
        got_conv, got_states = cp.asarray(conv), cp.asarray(states)
        args = (cp.asarray(a) for a in (mixed, kernel))
        got = table[name].load()(
            *args, got_conv, cp.asarray(g), cp.asarray(beta), got_states, cp.asarray(slots), **dims
        )
        rtol, atol = TOLERANCE[name]
        for what, x, ref in (
            ("out", got, want),
            ("conv states", got_conv, want_conv),
            ("states", got_states, want_states),
        ):
            x = cp.asnumpy(x).astype(np.float64)
            assert np.all(np.isfinite(x)), what
            scale = float(np.abs(ref).max())
            np.testing.assert_allclose(
                x, ref, rtol=rtol, atol=atol * scale, err_msg=f"kda_decode {name} {what}"
            )
        untouched = np.setdiff1d(np.arange(pool), slots)
        np.testing.assert_array_equal(cp.asnumpy(got_states)[untouched], states[untouched])


#: (lanes' rows, key heads, value heads, dk, dv): several lanes around the 64-token chunk
#: with rows of no lane between them, and one lane of the 27B's heads
PREFILL_CASES = [((1, 63, 65, 130), 2, 4, 128, 64), ((300,), 16, 48, 128, 128)]


@pytest.mark.parametrize(("lengths", "hk", "hv", "dk", "dv"), PREFILL_CASES)
def test_prefill_providers_match_the_reference(
    lengths: tuple[int, ...], hk: int, hv: int, dk: int, dv: int
) -> None:
    """Each CUDA provider of ``prefill``, the policy's and those only forced (the
    convolution and the delta rule over lanes' segments, slots out of row order, a gap of 3
    rows between lanes) against the reference in float64 on the same float32 inputs, within
    ``PREFILL_TOLERANCE``: every lane's rows, recurrent and convolution states; slots no
    segment names untouched."""
    import cupy as cp

    from ninfer_runtime.ops.delta_rule.reference import PREFILL_TOLERANCE

    rng = np.random.default_rng(sum(lengths) + hv)
    dims = {"key_heads": hk, "key_dim": dk, "value_heads": hv, "value_dim": dv}
    channels, slots = 2 * hk * dk + hv * dv, len(lengths) + 2
    segments, at = [], 2
    for i, count in enumerate(lengths):
        segments.append((at, count, slots - 1 - i))
        at += count + 3
    n = at
    mixed = rng.standard_normal((n, channels)).astype(np.float32)
    kernel = (rng.standard_normal((4, channels)) * 0.5).astype(np.float32)
    g = (-np.log1p(np.exp(rng.standard_normal((n, hv)))) * 0.3).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((n, hv))))).astype(np.float32)
    conv = rng.standard_normal((slots, channels, 3)).astype(np.float32)
    state = (rng.standard_normal((slots, hv, dk, dv)) * 0.5).astype(np.float32)
    want_conv, want_state = conv.astype(np.float64), state.astype(np.float64)
    want = R.prefill(
        *(a.astype(np.float64) for a in (mixed, kernel)), want_conv, g.astype(np.float64),
        beta.astype(np.float64), want_state, segments, **dims,
    )  # fmt: skip
    table = registry.providers("delta_rule")["prefill"]
    tried = 0
    for name in (n for n in table if n != "reference"):  # in the policy or forced only
        provider = table[name]
        if not provider.available() or (name != "nvrtc" and len(lengths) == 1):
            continue  # a library autotunes each new layout (seconds): the lanes' case only
        tried += 1
        got_conv, got_state = cp.asarray(conv), cp.asarray(state)
        got = provider.load()(
            cp.asarray(mixed), cp.asarray(kernel), got_conv, cp.asarray(g), cp.asarray(beta),
            got_state, segments, **dims,
        )  # fmt: skip
        rtol, atol = PREFILL_TOLERANCE[name]
        rows = np.concatenate([np.arange(a, a + c) for a, c, _ in segments])
        named = [s for _, _, s in segments]
        for what, x, ref in (
            ("out", cp.asnumpy(got)[rows], want[rows]),
            ("state", cp.asnumpy(got_state)[named], want_state[named]),
            ("conv", cp.asnumpy(got_conv)[named], want_conv[named]),
        ):
            assert np.all(np.isfinite(x)), f"{name} {what}"
            scale = float(np.abs(ref).max())
            np.testing.assert_allclose(
                x, ref, rtol=rtol, atol=atol * scale, err_msg=f"{name} {what}"
            )
        others = [s for s in range(slots) if s not in named]
        np.testing.assert_array_equal(cp.asnumpy(got_state)[others], state[others])
        np.testing.assert_array_equal(cp.asnumpy(got_conv)[others], conv[others])
    assert tried >= 1
