"""Per-layer embeddings against transformers' ``Qwen4ExpTextPLELayer`` (fp32): one pass over
a sequence with end-of-text tokens inside, and the same rows split over a prefill chunk, a
multi-row step with a partial commit, and single-row decode steps; two lanes' decode steps
together as each alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.models.batch import Batch, DecodeIndex, Lane
from ninfer_runtime.models.qwen4_exp.memory import PleGdnSpec, PleState
from ninfer_runtime.models.qwen4_exp.ple import (
    PerLayerEmbedding,
    last_ngram_ids,
    ngram_ids,
    shifted,
)
from ninfer_runtime.ops.delta_rule.memory import GdnSpec

from .qwen4_exp_modules import EOS, array, geometry, randomized, relative_error, tiny_config

T = 16
#: token ids with end-of-text tokens inside (n-grams must not reach across them)
IDS = np.array([7, 3, 9, EOS, 11, 12, 13, 2, EOS, EOS, 40, 41, 9, 3, 63, 0])


@pytest.fixture(scope="module")
def case(torch_threads):
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextPLELayer

    config = tiny_config(ple_layer_ids=[1, 3])
    g = geometry(config)
    hf = randomized(Qwen4ExpTextPLELayer(config, layer_idx=2, ple_layer_index=1), seed=7)
    streams = torch.randn(1, T, g.streams_width, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        expected = hf(streams, torch.as_tensor(IDS)[None], cache=None)[0]
    weights = {
        "L/ple/ngram_table": array(hf.ple_embedding.ngram_embedding.weight),
        "L/ple/key": array(hf.key_proj.weight),
        "L/ple/value": array(hf.value_proj.weight),
        "L/ple/key_norm": array(hf.norm_key.weight),
        "L/ple/query_norm": array(hf.norm_query.weight),
        "L/ple/convolution_norm": array(hf.norm_conv.weight),
        "L/ple/convolution": array(hf.conv1d.weight)[:, 0, :].T.copy(),
    }
    ple = PerLayerEmbedding("L/", 2, g.ple, g.hyper.streams, g.eps, CpuBackend(), weights)
    return g, ple, array(streams[0]), array(expected)


def _memory(g, record_rows: int = 1):
    p, d = g.ple, g.gdn
    gdn = GdnSpec(d.value_heads, d.key_dim, d.value_dim, d.conv_channels, d.conv_kernel)
    state = PleState(g.streams_width, (p.conv_kernel - 1) * p.conv_dilation, 2, p.pad_token)
    return PleGdnSpec(gdn, state).allocate(
        np, slots=2, pages=0, page_tokens=16, kv_dtype="float32", record_rows=record_rows
    )


def test_one_pass_matches_transformers(case):
    g, ple, streams, expected = case
    lane = Lane(slice(0, T), 0, SimpleNamespace(slot=0))
    out = ple(streams, IDS, Batch((lane,), None, None, None), _memory(g))
    assert relative_error(out, expected) < 1e-4


def test_prefill_verify_commit_decode_continue_exactly(case):
    """6 rows prefilled, 4 verified with 2 kept, then one row at a time: the same rows."""
    g, ple, streams, expected = case
    memory, slot = _memory(g, record_rows=4), 1
    lane = Lane(slice(0, 6), 0, SimpleNamespace(slot=slot))
    outs = [ple(streams[:6], IDS[:6], Batch((lane,), None, None), memory)]
    verify = DecodeIndex(np.full(4, slot, np.int32), np.arange(6, 10), None, tokens=4)
    outs.append(ple(streams[6:10], IDS[6:10], Batch((), None, None, verify), memory)[:2])
    ple.commit(memory, np.array([slot]), np.array([2]))
    for t in range(8, T):
        step = DecodeIndex(np.array([slot], np.int32), np.array([t]), None)
        outs.append(ple(streams[t : t + 1], IDS[t : t + 1], Batch((), None, None, step), memory))
    assert relative_error(np.concatenate(outs), expected) < 1e-4
    assert memory.ple_context[slot].tolist() == IDS[-2:].tolist()
    assert memory.ple_context[0].tolist() == [EOS, EOS]  # the other slot untouched


def test_shift_reads_pad_across_end_of_text():
    history = np.array([EOS, EOS, 7, 3, EOS, 9, 4])
    assert shifted(history, 1, EOS).tolist() == [EOS, EOS, EOS, 7, 3, EOS, 9]
    assert shifted(history, 2, EOS).tolist() == [EOS, EOS, EOS, EOS, 7, EOS, EOS]


def test_a_decode_steps_hash_is_the_last_position_of_the_whole_history(case):
    """``last_ngram_ids`` (a decode step's, on the lanes' contexts) gives the rows
    ``ngram_ids`` gives the last position of each history: end-of-text tokens at every
    place in the window, and windows shorter than the n-gram."""
    g, ple = case[0], case[1]
    rng = np.random.default_rng(3)
    for length in (1, 2, g.ple.ngram_size, g.ple.ngram_size + 2):
        histories = rng.choice([EOS, 1, 5, 9, 20, 63], size=(40, length))
        want = np.stack([ngram_ids(h, g.ple, ple.layer)[-1] for h in histories])
        got = last_ngram_ids(histories, g.ple, ple.layer, ple.head_sizes, ple.head_offsets)
        np.testing.assert_array_equal(got, want)


def test_a_decode_step_of_two_lanes_is_each_lane_alone(case):
    """Decode steps read every lane's row at once, each lane's convolution and n-gram
    context its own: two lanes stepped together give what each gives stepped alone."""
    g, ple, streams, _ = case
    together, apart = _memory(g), [_memory(g), _memory(g)]
    outs_together, outs_apart = [], []
    for t in range(6):
        rows = np.array([t, T - 1 - t])  # lane 0 walks forward, lane 1 backward
        step = DecodeIndex(np.array([0, 1], np.int32), np.array([t, t]), None)
        outs_together.append(ple(streams[rows], IDS[rows], Batch((), None, None, step), together))
        for lane, memory in enumerate(apart):
            one = DecodeIndex(np.array([lane], np.int32), np.array([t]), None)
            r = rows[lane : lane + 1]
            outs_apart.append(ple(streams[r], IDS[r], Batch((), None, None, one), memory))
    np.testing.assert_array_equal(np.concatenate(outs_together), np.concatenate(outs_apart))
    for lane, memory in enumerate(apart):
        np.testing.assert_array_equal(together.ple_conv[lane], memory.ple_conv[lane])
        np.testing.assert_array_equal(together.ple_context[lane], memory.ple_context[lane])
