"""Tile packing (``backends/cuda/tiles.py``) on the CPU: the stored bytes come back exactly, and
decoding the tiles the way ``kernels/tiles.cu`` does (the word layouts of the module's
docstring, read here with numpy) gives the codec's own values at every (row, k)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.row_split import FORMATS, pack_row_split, row_split_geometry
from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import tiles as T
from tests.format.test_codecs_gguf import _random_blocks

NAMES = {F.Q4: "q4_g64_fp16", F.Q5: "q5_g64_fp16", F.Q8: "q8_g32_fp16"}
# rows not a multiple of a tile, K not a multiple of 128 or of four groups, one-tile objects
SHAPES = [(16, 128), (37, 200), (100, 640), (5, 64), (33, 1000)]


def stored(code: int, shape: tuple[int, int], seed: int) -> np.ndarray:
    fmt = FORMATS[NAMES[code]]
    rng = np.random.default_rng(seed)
    codes = rng.integers(fmt.qmin, fmt.qmax + 1, size=shape)
    scales = rng.integers(0, 0x7000, size=(shape[0], -(-shape[1] // fmt.group)))
    return np.frombuffer(pack_row_split(fmt.name, codes, scales.astype(np.uint16)), np.uint8)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("code", sorted(NAMES))
def test_round_trip(code: int, shape: tuple[int, int]) -> None:
    raw = stored(code, shape, seed=shape[0])
    tiled = T.pack_tiles(np, raw, code, *shape)
    geo = T.tile_geometry(code, *shape)
    assert tiled.size == geo.size and geo.groups % 4 == 0 and geo.row_tiles * 16 >= shape[0]
    assert np.array_equal(T.unpack_tiles(np, tiled, code, *shape), raw)


def _pairs_q4(words: np.ndarray) -> np.ndarray:
    """[..., 4 mmas, 4 pairs, 2] code values of a lane's words, as tiles.cu's frag reads them."""
    i = np.arange(4)[None, :]
    w = words[..., :, None]
    first = (w >> (4 * i)) & 15
    second = (w >> (16 + 4 * i)) & 15
    return np.stack([first, second], axis=-1).astype(np.int64) - 8


def _pairs_q5(words: np.ndarray, fifth: np.ndarray) -> np.ndarray:
    """The same for q5's five words: pair P < 15 in word P // 3, field P % 3; pair 15 from
    bits 15 and 31 of the five words (code bit b in word b)."""
    five = np.concatenate([words, fifth[..., None]], axis=-1).astype(np.int64)
    out = np.empty((*words.shape[:-1], 4, 4, 2), dtype=np.int64)
    for pair in range(16):
        j, i = divmod(pair, 4)
        for second in range(2):
            if pair < 15:
                w, f = divmod(pair, 3)
                code = (five[..., w] >> (16 * second + 5 * f)) & 31
            else:
                code = sum(((five[..., b] >> (15 + 16 * second)) & 1) << b for b in range(5))
            out[..., j, i, second] = code - 16
    return out


def _pairs_q8(words: np.ndarray) -> np.ndarray:
    """[..., 2 mmas, 4 pairs, 2] code values: pair i of mma j is bytes (i % 2, i % 2 + 2) of
    word 2 j + i // 2."""
    out = np.empty((*words.shape[:-1], 2, 4, 2), dtype=np.int64)
    for j in range(2):
        for i in range(4):
            w = words[..., 2 * j + i // 2] >> (8 * (i % 2))
            out[..., j, i, 0] = (w & 0xFF).astype(np.int64) - 128
            out[..., j, i, 1] = ((w >> 16) & 0xFF).astype(np.int64) - 128
    return out


def kernel_view(tiled: np.ndarray, code: int, shape: tuple[int, int]) -> np.ndarray:
    """The [rows, K_pad] weights as the kernel's fragments place them: pair 0 row g slots
    (0, 1), pair 1 row g + 8 slots (0, 1), pair 2 row g slots (2, 3), pair 3 row g + 8 slots
    (2, 3); slot s of mma j on lane t is k = (16 or 8) t + 4 j + s; times the group scale."""
    geo = T.tile_geometry(code, *shape)
    words = tiled[: geo.high_offset].view(np.uint32).reshape(geo.row_tiles, geo.groups, 32, 4)
    high = None
    if code == F.Q5:
        h = tiled[geo.high_offset : geo.scale_offset].view(np.uint32)
        h = h.reshape(geo.row_tiles, geo.groups // 4, 32, 4).transpose(0, 1, 3, 2)
        high = h.reshape(geo.row_tiles, geo.groups, 32)
    if code == F.Q8:
        pairs = _pairs_q8(words)
    elif code == F.Q5:
        pairs = _pairs_q5(words, high)
    else:
        pairs = _pairs_q4(words)
    scales = tiled[geo.scale_offset :].view(np.float16).astype(np.float32)
    scales = scales.reshape(geo.row_tiles, geo.groups // 4, 8, 4, 2)
    out = np.zeros((geo.row_tiles * 16, geo.groups * geo.group), dtype=np.float32)
    lanes_k = geo.group // 4
    for lane in range(32):
        g, t = divmod(lane, 4)
        for j in range(pairs.shape[-3]):
            for i in range(4):
                r = g + 8 * (i % 2)
                for e in range(2):
                    k = lanes_k * t + 4 * j + 2 * (i // 2) + e
                    value = pairs[:, :, lane, j, i, e].astype(np.float32)
                    s = scales[:, :, g, :, i % 2].reshape(geo.row_tiles, geo.groups)
                    cols = np.arange(geo.groups) * geo.group + k
                    rows = np.arange(geo.row_tiles)[:, None] * 16 + r
                    out[rows, cols[None, :]] = value * s
    return out[: shape[0]]


@pytest.mark.parametrize("shape", [(37, 200), (16, 128), (33, 1000)])
@pytest.mark.parametrize("code", sorted(NAMES))
def test_fragments_hold_the_codec_values(code: int, shape: tuple[int, int]) -> None:
    raw = stored(code, shape, seed=3)
    want = codec_for(NAMES[code], "row_split_k128_v1").decode(raw, shape, 1)
    got = kernel_view(T.pack_tiles(np, raw, code, *shape), code, shape)
    k_pad = row_split_geometry(NAMES[code], shape).padded_columns
    np.testing.assert_array_equal(got[:, : shape[1]], want)
    assert not got[:, shape[1] :].any()  # row padding and padded groups: zero weights
    assert got.shape[1] >= k_pad


def test_planes_say_tiled() -> None:
    p = T.tiled_planes(F.Q5, 37, 200)
    geo = T.tile_geometry(F.Q5, 37, 200)
    assert p.tiled and p.stride == geo.groups and p.x_width == geo.groups * 64
    assert (p.off1, p.off2) == (geo.high_offset, geo.scale_offset)


def _prmt(a: Any, b: Any, selector: Any) -> np.ndarray:
    """PTX prmt.b32 (default mode, selector nibbles below 8): result byte n is byte
    ``selector`` nibble n of b:a (numpy arrays or ints, broadcast)."""
    a, b, selector = (np.asarray(v).astype(np.uint64) for v in (a, b, selector))
    source = a | (b << np.uint64(32))
    out = np.zeros(np.broadcast(source, selector).shape, dtype=np.uint64)
    for n in range(4):
        which = (selector >> np.uint64(4 * n)) & np.uint64(7)
        out |= ((source >> (which * np.uint64(8))) & np.uint64(0xFF)) << np.uint64(8 * n)
    return out


def test_q8_fragments_are_the_pairs() -> None:
    """tiles.cu's TileQ8: one permute under the fp16 exponent byte 0x64 and a subtraction of
    1152 give pair i of mma j as the layout places it (checked above against the codec)."""
    rng = np.random.default_rng(4)
    words = rng.integers(0, 2**32, size=(64, 4), dtype=np.uint64).astype(np.uint32)
    want = _pairs_q8(words)
    for j in range(2):
        for i in range(4):
            w = words[:, 2 * j + i // 2].astype(np.int64)
            bits = _prmt(w, 0x64646464, 0x4341 if i % 2 else 0x4240)
            halves = np.stack([bits & 0xFFFF, bits >> 16], axis=-1).astype(np.uint16)
            got = halves.view(np.float16).astype(np.float64) - 1152
            np.testing.assert_array_equal(got, want[:, j, i, :])


# ------------------------------------------------------------------------- GGUF q4_k, q5_k
K_SHAPES = [(37, 512), (16, 256), (5, 1024)]
K_QUANTS = {T.Q4_K: "gguf_q4_k", T.Q5_K: "gguf_q5_k", T.Q6_K: "gguf_q6_k"}
K_BLOCK_BYTES = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}


def k_stored(code: int, shape: tuple[int, int], seed: int) -> np.ndarray:
    return _random_blocks(K_QUANTS[code], shape[0] * shape[1] // 256, seed).reshape(-1)


@pytest.mark.parametrize("shape", K_SHAPES)
@pytest.mark.parametrize("code", sorted(K_QUANTS))
def test_k_quant_round_trip(code: int, shape: tuple[int, int]) -> None:
    raw = k_stored(code, shape, seed=shape[0])
    tiled = T.pack_tiles(np, raw, code, *shape)
    geo = T.tile_geometry(code, *shape)
    # the same bits as the blocks of whole row tiles (rows padded with zero blocks)
    assert tiled.size == geo.size == geo.row_tiles * 16 * (shape[1] // 256) * K_BLOCK_BYTES[code]
    assert np.array_equal(T.unpack_tiles(np, tiled, code, *shape), raw)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for the twelve scale bytes (last axis): [..., 8] scales and
    mins of the eight sub-blocks."""
    s = scales.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    return sc, m


@pytest.mark.parametrize("shape", K_SHAPES)
@pytest.mark.parametrize("code", [T.Q4_K, T.Q5_K])
def test_q4_k_q5_k_fragments_hold_the_codec_values(code: int, shape: tuple[int, int]) -> None:
    """tiles.cu's TileQ4K / TileQ5K as numpy: q4's nibble fragments (the unsigned codes c; for
    q5_k the fifth bit of pair i of mma j at bit 4 j + i of the lane's fifth word, + 16 for
    the second element), mma j on sub-block j // 2 of the group, scale d sc and min dmin m
    from the row's block head, w = c d sc - dmin m: the codec's (gguf's) values bit for bit."""
    raw = k_stored(code, shape, seed=5)
    want = codec_for(K_QUANTS[code], "gguf_blocks_v1").decode(raw, shape, 1)
    tiled = T.pack_tiles(np, raw, code, *shape)
    geo = T.tile_geometry(code, *shape)
    words = tiled[: geo.high_offset].view(np.uint32).reshape(geo.row_tiles, geo.groups, 32, 4)
    codes = _pairs_q4(words) + 8  # [tiles, groups, lane, mma, pair, 2]
    if code == T.Q5_K:
        fifth = tiled[geo.high_offset : geo.scale_offset].view(np.uint32)
        fifth = fifth.reshape(geo.row_tiles, geo.groups // 4, 32, 4).transpose(0, 1, 3, 2)
        fifth = fifth.reshape(geo.row_tiles, geo.groups, 32).astype(np.int64)
        for j in range(4):
            for i in range(4):
                for e in range(2):
                    bit = (fifth >> (16 * e + 4 * j + i)) & 1
                    codes[:, :, :, j, i, e] |= bit << 4
    heads = tiled[geo.scale_offset :].reshape(geo.row_tiles, geo.groups // 4, 8, 2, 16)
    d = heads[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = heads[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc, m = _scale_min_k4(heads[..., 4:16])  # [tiles, blocks, g, rr, 8 sub-blocks]
    scale = (d[..., None] * sc).astype(np.float32)
    mins = (dmin[..., None] * m).astype(np.float32)
    out = np.zeros((geo.row_tiles * 16, shape[1]), dtype=np.float32)
    q = np.arange(geo.groups)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for j in range(4):
            sub = 2 * (q % 4) + j // 2  # group q's sub-block of its block q // 4
            for i in range(4):
                rr = i % 2
                s_q, m_q = scale[:, q // 4, g, rr, sub], mins[:, q // 4, g, rr, sub]
                rows = np.arange(geo.row_tiles)[:, None] * 16 + g + 8 * rr
                for e in range(2):
                    k = 32 * (j // 2) + 8 * t + 4 * (j % 2) + 2 * (i // 2) + e
                    c = codes[:, :, lane, j, i, e].astype(np.float32)
                    out[rows, (q * 64 + k)[None, :]] = c * s_q - m_q
    np.testing.assert_array_equal(out[: shape[0]], want)


# ------------------------------------------------------------------------------ GGUF q6_k
@pytest.mark.parametrize("shape", K_SHAPES)
def test_q6_k_fragments_hold_the_codec_values(shape: tuple[int, int]) -> None:
    """tiles.cu's TileQ6K as numpy: the low nibble of pair i of mma j as q4's, its high two
    bits at field 4 (j % 2) + i of the lane's high word j // 2, mma j on sub-block j of the
    group, scale d sc from the row tile's record: the codec's values bit for bit."""
    raw = k_stored(T.Q6_K, shape, seed=6)
    want = codec_for("gguf_q6_k", "gguf_blocks_v1").decode(raw, shape, 1)
    tiled = T.pack_tiles(np, raw, T.Q6_K, *shape)
    geo = T.tile_geometry(T.Q6_K, *shape)
    blocks = geo.groups // 4
    words = tiled[: geo.high_offset].view(np.uint32).reshape(geo.row_tiles, geo.groups, 32, 4)
    low = _pairs_q4(words) + 8  # [tiles, groups, lane, mma, pair, 2]
    high = tiled[geo.high_offset : geo.scale_offset].view(np.uint32)
    high = high.reshape(geo.row_tiles, blocks, 32, 4, 2).transpose(0, 1, 3, 2, 4)
    high = high.reshape(geo.row_tiles, geo.groups, 32, 2).astype(np.int64)
    records = tiled[geo.scale_offset :].reshape(geo.row_tiles, blocks, 288)
    sc = records[..., :256].reshape(geo.row_tiles, blocks, 8, 2, 16).view(np.int8)
    d = records[..., 256:].copy().view(np.float16).reshape(geo.row_tiles, blocks, 2, 8)
    out = np.zeros((geo.row_tiles * 16, shape[1]), dtype=np.float32)
    q = np.arange(geo.groups)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for j in range(4):
            for i in range(4):
                rr, f = i % 2, 4 * (j % 2) + i
                scale = (
                    d[:, q // 4, rr, g].astype(np.float32) * sc[:, q // 4, g, rr, 4 * (q % 4) + j]
                )
                rows = np.arange(geo.row_tiles)[:, None] * 16 + g + 8 * rr
                for e in range(2):
                    bits = (high[:, :, lane, j // 2] >> (16 * e + 2 * f)) & 3
                    c = low[:, :, lane, j, i, e] | (bits << 4)
                    k = 16 * j + 4 * t + 2 * (i // 2) + e
                    out[rows, (q * 64 + k)[None, :]] = (c - 32).astype(np.float32) * scale
    np.testing.assert_array_equal(out[: shape[0]], want)


# --------------------------------------------------------------------------- GGUF iq2_xxs
def _iq2_tables() -> tuple[np.ndarray, np.ndarray]:
    import gguf.quants as q

    q.IQ2_XXS.init_grid()
    grid = q.IQ2_XXS.grid.reshape(256, 8).astype(np.float32)
    return grid, np.frombuffer(q.IQ2_XXS.ksigns, dtype=np.uint8)


@pytest.mark.parametrize("shape", K_SHAPES)
def test_iq2_xxs_round_trip(shape: tuple[int, int]) -> None:
    raw = _random_blocks("gguf_iq2_xxs", shape[0] * shape[1] // 256, shape[0]).reshape(-1)
    tiled = T.pack_tiles(np, raw, T.IQ2_XXS, *shape)
    geo = T.tile_geometry(T.IQ2_XXS, *shape)
    # the blocks' bits and four unused bits a lane word of signs (64 bytes a tile and block)
    assert tiled.size == geo.size == geo.row_tiles * (shape[1] // 256) * (16 * 66 + 64)
    assert np.array_equal(T.unpack_tiles(np, tiled, T.IQ2_XXS, *shape), raw)


@pytest.mark.parametrize("shape", K_SHAPES)
def test_iq2_xxs_tiles_hold_the_codec_values(shape: tuple[int, int]) -> None:
    """The lane words and records as tiles.cu's TileIQ2XXS reads them (grid index byte 2 h +
    rr, sign index at bits 7 (2 h + rr), scale nibble 2 u + h of row g + 8 rr's word, d of
    the row; grid row t of sub-block h at k = 32 h + 8 t): the codec's values bit for bit."""
    raw = _random_blocks("gguf_iq2_xxs", shape[0] * shape[1] // 256, 7).reshape(-1)
    want = codec_for("gguf_iq2_xxs", "gguf_blocks_v1").decode(raw, shape, 1)
    tiled = T.pack_tiles(np, raw, T.IQ2_XXS, *shape)
    geo = T.tile_geometry(T.IQ2_XXS, *shape)
    blocks = geo.groups // 4
    grid, ksigns = _iq2_tables()
    words = tiled[: geo.scale_offset].view(np.uint32).reshape(geo.row_tiles, blocks, 8, 4, 4, 2)
    records = tiled[geo.scale_offset :].reshape(geo.row_tiles, blocks, 96)
    nibbles = records[..., :64].copy().view(np.uint32).reshape(geo.row_tiles, blocks, 8, 2)
    d = records[..., 64:].copy().view(np.float16).reshape(geo.row_tiles, blocks, 2, 8)
    out = np.zeros((geo.row_tiles * 16, shape[1]), dtype=np.float32)
    tiles, blks = np.arange(geo.row_tiles)[:, None], np.arange(blocks)[None, :]
    for g in range(8):
        for t in range(4):
            for u in range(4):
                for h in range(2):
                    for rr in range(2):
                        f = 2 * h + rr
                        index = (words[:, :, g, t, u, 0] >> (8 * f)) & 255
                        signs = ksigns[(words[:, :, g, t, u, 1] >> (7 * f)) & 127]
                        s = ((nibbles[:, :, g, rr] >> (4 * (2 * u + h))) & 15).astype(np.float32)
                        db = (
                            d[:, :, rr, g].astype(np.float32) * (np.float32(0.5) + s)
                        ) * np.float32(0.25)
                        for e in range(8):
                            w = (db * grid[index, e]).astype(np.float32)
                            w = np.where((signs >> e) & 1, -w, w)
                            k = blks * 256 + 64 * u + 32 * h + 8 * t + e
                            out[tiles * 16 + g + 8 * rr, k] = w
    np.testing.assert_array_equal(out[: shape[0]], want)


def test_iq2_xxs_tables_give_signed_grid_values() -> None:
    """The tile kernel's iq2_xxs tables, read back from the generated source, and its
    fragment arithmetic (tiles.cu, TileIQ2XXSWith::frag): prmt of the two byte words by grid
    row r's selectors plus the sign adds of index s gives the bf16 values of ggml's row r,
    each negated where ggml's sign byte s has its bit set."""
    import re

    from ninfer_runtime.backends.cuda.gguf_tables import iq2_xxs_tile_tables

    text = iq2_xxs_tile_tables()
    tables = {
        name: np.array([int(v, 16) for v in body.split(",")], dtype=np.uint64)
        for name, body in re.findall(r"u32 (\w+)\[\d+\] = \{([^}]*)\}", text)
    }
    lo, hi = (int(re.search(rf"BYTES_{n} (0x[0-9a-f]+)u", text).group(1), 16) for n in ("LO", "HI"))
    selectors = tables["TILE_IQ2XXS_SELECTORS"].reshape(256, 1, 2)  # [row, -, half]
    adds = tables["TILE_IQ2XXS_SIGN_ADDS"].reshape(1, 128, 2)  # [-, index, half]
    grid, ksigns = _iq2_tables()
    negative = (ksigns[:, None] >> np.arange(8)) & 1
    want = (grid[:, None, :] * np.where(negative, -1.0, 1.0)[None, :, :]).astype(np.float32)
    words = []
    for half in (0, 1):
        sel = selectors[..., half] + adds[..., half]
        words += [_prmt(lo, hi, sel), _prmt(lo, hi, sel >> np.uint64(16))]
    pairs = np.stack(words, -1)  # [row, index, word]: values 2 w, 2 w + 1
    halves = np.stack([pairs & 0xFFFF, pairs >> 16], -1).astype(np.uint32) << 16
    np.testing.assert_array_equal(halves.view(np.float32).reshape(256, 128, 8), want)
