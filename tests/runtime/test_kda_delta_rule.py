"""The delta rule's per-channel-decay variant (KDA, ``ops/delta_rule/kda_reference.py``): the
chunked form against the recurrent one and against transformers' own KDA functions (outputs
and final states, float32), and the slot-addressed decode, verification and commit against
plain one-token prefills."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.functional import l2_normalize
from ninfer_runtime.ops import delta_rule
from ninfer_runtime.ops.delta_rule.kda_reference import (
    KDA_CHUNK,
    kda_chunk,
    kda_commit,
    kda_decode,
    kda_prefill,
    kda_step,
    kda_verify,
)
from ninfer_runtime.ops.delta_rule.memory import GdnSpec

H, D, TAPS = 3, 8, 3
DIMS = {"heads": H, "head_dim": D}
TOL = 1e-4


def scan_inputs(t: int, seed: int, floor: float = -5.0) -> tuple[Any, ...]:
    """q, k l2-normalised (q scaled), a per-channel log-decay in [floor, 0], beta in [0, 1],
    a nonzero state; float32."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    q = l2_normalize(rng.standard_normal((t, H, D)).astype(f32)) * f32(D**-0.5)
    k = l2_normalize(rng.standard_normal((t, H, D)).astype(f32))
    v = rng.standard_normal((t, H, D)).astype(f32)
    g = (rng.random((t, H, D)) * floor).astype(f32)
    beta = rng.random((t, H)).astype(f32)
    state = rng.standard_normal((H, D, D)).astype(f32) * f32(0.1)
    return q, k, v, g, beta, state


def close(a: Any, b: Any) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max()) <= TOL * max(float(np.abs(b).max()), 1e-6)


@pytest.mark.parametrize("t", [1, KDA_CHUNK - 1, 2 * KDA_CHUNK + 5])
@pytest.mark.parametrize("floor", [-5.0, -60.0])  # a chunk's decays far past float32's range
def test_chunked_form_equals_the_recurrent_one(t: int, floor: float) -> None:
    q, k, v, g, beta, state = scan_inputs(t, seed=t, floor=floor)
    s_chunk, s_step = state.copy(), state.copy()
    out_chunk = kda_chunk(q, k, v, g, beta, s_chunk)
    out_step = kda_step(q, k, v, g, beta, s_step)
    assert np.isfinite(out_chunk).all()
    assert close(out_chunk, out_step) and close(s_chunk, s_step)


def test_a_scalar_decay_is_the_gated_delta_rule() -> None:
    """The same g on every channel of a head is Gated DeltaNet: the family's scalar chunk."""
    q, k, v, g, beta, state = scan_inputs(40, seed=3)
    g = np.repeat(g[:, :, :1], D, axis=2)
    gdn = delta_rule.resolved("chunk", "cpu", np.zeros((TAPS, 1)), key_dim=D, value_dim=D)
    s_kda, s_gdn = state.copy(), state.copy()
    out = kda_chunk(q, k, v, g, beta, s_kda)
    assert close(out, gdn(q, k, v, g[:, :, 0], beta, s_gdn)) and close(s_kda, s_gdn)


def test_chunked_and_recurrent_forms_match_transformers() -> None:
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
    rng = np.random.default_rng(7)
    t = 45
    raw_q, raw_k = (rng.standard_normal((t, H, D)).astype(np.float32) for _ in range(2))
    _, _, v, g, beta, state = scan_inputs(t, seed=8)

    def torch_args() -> list[Any]:
        return [torch.from_numpy(x)[None] for x in (raw_q, raw_k, v, g, beta)]

    q = l2_normalize(raw_q) * np.float32(D**-0.5)
    k = l2_normalize(raw_k)
    ours = state.copy()
    out = kda_chunk(q, k, v, g, beta, ours)
    for fn in (hf.chunk_kimi_delta_attention, hf.recurrent_kimi_delta_attention):
        qt, kt, vt, gt, bt = torch_args()
        ref, final = fn(
            qt, kt, vt, g=gt, beta=bt, initial_state=torch.from_numpy(state.copy())[None],
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        assert close(out, ref[0].numpy()) and close(ours, final[0].numpy())


def lanes_inputs(lanes: int, rows: int, seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    mixed = rng.standard_normal((lanes * rows, 3 * H * D)).astype(f32)
    g = (rng.random((lanes * rows, H, D)) * -2).astype(f32)
    beta = rng.random((lanes * rows, H)).astype(f32)
    kernel = rng.standard_normal((TAPS, 3 * H * D)).astype(f32)
    conv = rng.standard_normal((4, 3 * H * D, TAPS - 1)).astype(f32)
    states = rng.standard_normal((4, H, D, D)).astype(f32) * f32(0.1)
    return mixed, g, beta, kernel, conv, states


def one_at_a_time(mixed, g, beta, kernel, conv, states, slots, rows) -> Any:
    """Each lane's rows through one-token prefills, in order (conv/states updated)."""
    out = np.zeros((len(slots) * rows, H, D), np.float32)
    for i, s in enumerate(slots):
        for j in range(rows):
            r = slice(i * rows + j, i * rows + j + 1)
            out[r] = kda_prefill(mixed[r], kernel, conv[s], g[r], beta[r], states[s], **DIMS)
    return out


def test_decode_addresses_every_lane_by_slot() -> None:
    mixed, g, beta, kernel, conv, states = lanes_inputs(2, 1, seed=11)
    slots = np.array([3, 1])
    conv_ref, states_ref = conv.copy(), states.copy()
    ref = one_at_a_time(mixed, g, beta, kernel, conv_ref, states_ref, slots, 1)
    out = kda_decode(mixed, kernel, conv, g, beta, states, slots, **DIMS)
    assert close(out, ref) and close(conv, conv_ref) and close(states, states_ref)


def test_prefill_of_a_prompt_equals_its_tokens_one_by_one() -> None:
    mixed, g, beta, kernel, conv, states = lanes_inputs(1, 37, seed=12)
    conv_ref, states_ref = conv.copy(), states.copy()
    ref = one_at_a_time(mixed, g, beta, kernel, conv_ref, states_ref, [2], 37)
    out = kda_prefill(mixed, kernel, conv[2], g, beta, states[2], **DIMS)
    assert close(out, ref) and close(conv, conv_ref) and close(states, states_ref)


def test_verification_leaves_states_and_commit_folds_the_accepted_rows() -> None:
    lanes, rows = 2, 3
    mixed, g, beta, kernel, conv, states = lanes_inputs(lanes, rows, seed=13)
    slots, counts = np.array([0, 2]), np.array([1, 3])
    spec = GdnSpec(H, D, D, 3 * H * D, TAPS, channel_decay=True)
    memory = spec.allocate(np, slots=4, pages=0, page_tokens=1, kv_dtype="float32",
                           record_rows=rows)  # fmt: skip
    memory.conv[...], memory.recurrent[...] = conv, states
    out = kda_verify(mixed, kernel, memory.conv, g, beta, memory.recurrent, slots,
                     memory.drafts, tokens=rows, **DIMS)  # fmt: skip
    assert np.array_equal(memory.conv, conv) and np.array_equal(memory.recurrent, states)
    conv_ref, states_ref = conv.copy(), states.copy()
    assert close(out, one_at_a_time(mixed, g, beta, kernel, conv_ref, states_ref, slots, rows))

    kda_commit(kernel, memory.conv, memory.recurrent, slots, memory.drafts, counts, **DIMS)
    conv_ref, states_ref = conv.copy(), states.copy()
    for lane, (s, n) in enumerate(zip(slots, counts, strict=True)):
        r = slice(lane * rows, lane * rows + n)
        one_at_a_time(mixed[r], g[r], beta[r], kernel, conv_ref, states_ref, [s], n)
    assert close(memory.conv, conv_ref) and close(memory.recurrent, states_ref)
    assert spec.record_bytes(rows) == rows * 4 * (3 * H * D + H * D + H)
