"""The 18 EXT-ALL ``gguf_*`` codecs: geometry, decoding against gguf-py, encoding, scanning.

gguf-py's dequantizers are the value oracle (they are the reference implementation of ggml's
``dequantize_row_*``); Q2_0, which gguf-py lacks, is checked against a plain Python loop.
"""

from __future__ import annotations

import struct
import sys
import warnings

import gguf.quants
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ninfer_format.codecs import gguf_blocks
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, GGML_TYPE_TO_FORMAT
from ninfer_format.codecs.registry import codec_for
from ninfer_format.errors import CodecError

LAYOUT = "gguf_blocks_v1"
FORMATS = sorted(FORMAT_BLOCKS)
F16_NAN = 0x7E00
F16_INF = 0x7C00


def _codec(fmt: str):
    return codec_for(fmt, LAYOUT)


def _scale_fields(fmt: str) -> list[int]:
    """Byte offsets of the plain f16 scale fields (d, dmin) of one block."""
    return [offset for _, offset in gguf_blocks._BLOCK_TYPES[_index(fmt)].f16_fields]


def _index(fmt: str) -> int:
    return [bt.format for bt in gguf_blocks._BLOCK_TYPES].index(fmt)


def _random_blocks(fmt: str, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Random block bytes whose scale fields are small finite positive halves."""
    _, _, block_bytes = FORMAT_BLOCKS[fmt]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.02, size=n_blocks).astype(np.float16).view(np.uint16)
    gguf_blocks.set_scales(fmt, blocks, scales)
    return blocks


def _slow_q2_0(raw: bytes, n_blocks: int) -> list[float]:
    out = []
    for b in range(n_blocks):
        block = raw[18 * b : 18 * (b + 1)]
        (d,) = struct.unpack("<e", block[:2])
        for j in range(64):
            code = (block[2 + j // 4] >> (2 * (j % 4))) & 3
            out.append(float(np.float32(code - 1) * np.float32(d)))
    return out


def test_tables_match_ggml() -> None:
    assert len(FORMAT_BLOCKS) == 18
    assert {v: k for k, v in GGML_TYPE_TO_FORMAT.items()} == {
        fmt: t for fmt, (t, _, _) in FORMAT_BLOCKS.items()
    }
    for fmt, (type_id, values, nbytes) in FORMAT_BLOCKS.items():
        if type_id == 42:
            assert (fmt, values, nbytes) == ("gguf_q2_0", 64, 18)
            continue
        qtype = GGMLQuantizationType(type_id)
        assert fmt == "gguf_" + qtype.name.lower()
        assert GGML_QUANT_SIZES[qtype] == (values, nbytes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_geometry(fmt: str) -> None:
    codec = _codec(fmt)
    _, bv, bb = FORMAT_BLOCKS[fmt]
    assert (codec.format, codec.layout, codec.alignment, codec.profile) == (
        fmt,
        LAYOUT,
        256,
        "EXT-ALL",
    )
    assert codec.decoded_dtype == np.float32
    assert codec.bits_per_weight == pytest.approx(8 * bb / bv)
    assert codec.encoded_size((3, 2 * bv)) == 3 * 2 * bb
    assert codec.encoded_size((7, 5 * bv)) == 7 * 5 * bb
    codec.check_shape((1, bv))
    bad_shapes = [(3, bv + 16), (3, bv // 2), (2 * bv,), (2, 3, bv), (), (0, bv), (3, 0)]
    for shape in bad_shapes:
        with pytest.raises(CodecError) as err:
            codec.encoded_size(shape)
        assert fmt in str(err.value) and LAYOUT in str(err.value)
    with pytest.raises(CodecError, match=f"multiple of {bv}"):
        codec.check_shape((3, bv + 16))
    with pytest.raises(CodecError, match="rank 2"):
        codec.check_shape((2, 3, bv))
    with pytest.raises(CodecError, match="divisors"):
        codec.check_shape((128, bv), divisors=2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_matches_reference(fmt: str) -> None:
    codec = _codec(fmt)
    type_id, bv, _ = FORMAT_BLOCKS[fmt]
    shape = (3, 2 * bv)
    blocks = _random_blocks(fmt, 6)
    data = blocks.reshape(-1)
    got = codec.decode(data, shape)
    assert got.dtype == np.float32 and got.shape == shape
    if type_id == 42:
        want = np.array(_slow_q2_0(data.tobytes(), 6), dtype=np.float32).reshape(shape)
    else:
        want = gguf.quants.dequantize(data.reshape(3, -1), GGMLQuantizationType(type_id))
    assert np.isfinite(got).all()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", ["gguf_q8_0", "gguf_q4_k", "gguf_iq1_m", "gguf_q2_0"])
def test_decode_in_chunks_is_the_same(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = _codec(fmt)
    _, bv, _ = FORMAT_BLOCKS[fmt]
    shape = (5, 3 * bv)
    data = _random_blocks(fmt, 15, seed=1).reshape(-1)
    whole = codec.decode(data, shape)
    # 4-block chunks regrouped into 2-block rows: chunks with and without a ragged tail.
    monkeypatch.setattr(gguf_blocks, "_CHUNK_VALUES", 4 * bv)
    monkeypatch.setattr(gguf_blocks, "_ROW_VALUES", 2 * bv)
    chunked = codec.decode(data, shape)
    assert np.array_equal(whole.view(np.uint32), chunked.view(np.uint32))


def test_decode_accepts_bytes() -> None:
    codec = _codec("gguf_q8_0")
    data = _random_blocks("gguf_q8_0", 2).reshape(-1)
    assert np.array_equal(codec.decode(data.tobytes(), (1, 64)), codec.decode(data, (1, 64)))


@pytest.mark.parametrize("fmt", ["gguf_q8_0", "gguf_q4_0", "gguf_q5_0"])
def test_encode_round_trip(fmt: str) -> None:
    codec = _codec(fmt)
    type_id, _, _ = FORMAT_BLOCKS[fmt]
    values = np.random.default_rng(2).standard_normal((4, 128)).astype(np.float32)
    raw = codec.encode(values)
    assert len(raw) == codec.encoded_size(values.shape)
    qtype = GGMLQuantizationType(type_id)
    assert raw == gguf.quants.quantize(values, qtype).tobytes()
    decoded = codec.decode(np.frombuffer(raw, dtype=np.uint8), values.shape)
    want = gguf.quants.dequantize(gguf.quants.quantize(values, qtype), qtype)
    assert np.array_equal(decoded, want)
    # One quantization step is the worst error: absmax/127 for q8_0, absmax/8 (4 bits), /16.
    step = {"gguf_q8_0": 127, "gguf_q4_0": 8, "gguf_q5_0": 16}[fmt]
    absmax = np.abs(values.reshape(-1, 32)).max(axis=1, keepdims=True)
    err = np.abs(decoded - values).reshape(-1, 32)
    assert (err <= absmax / step * 1.01).all()


def test_encode_iq4_nl_if_gguf_can() -> None:
    codec = _codec("gguf_iq4_nl")
    values = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    try:
        raw = codec.encode(values)
    except CodecError as exc:
        assert "no encoder for gguf_iq4_nl" in str(exc)
    else:
        decoded = codec.decode(np.frombuffer(raw, dtype=np.uint8), values.shape)
        assert np.abs(decoded - values).max() < 0.5 * np.abs(values).max()


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in gguf_blocks._ENCODABLE])
def test_encode_refused_without_encoder(fmt: str) -> None:
    _, bv, _ = FORMAT_BLOCKS[fmt]
    with pytest.raises(CodecError, match=f"no encoder for {fmt}; import blocks from a GGUF"):
        _codec(fmt).encode(np.zeros((1, bv), dtype=np.float32))


def test_encode_rejects_bad_values() -> None:
    codec = _codec("gguf_q8_0")
    with pytest.raises(CodecError, match="non-finite"):
        codec.encode(np.full((1, 32), np.nan, dtype=np.float32))
    with pytest.raises(CodecError, match="multiple of 32"):
        codec.encode(np.zeros((1, 40), dtype=np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_scan_finds_bad_scales(fmt: str) -> None:
    codec = _codec(fmt)
    _, bv, _ = FORMAT_BLOCKS[fmt]
    shape = (4, 2 * bv)
    blocks = _random_blocks(fmt, 8, seed=4)
    assert codec.scan(blocks.reshape(-1), shape) == []
    bits = np.full(8, np.float16(0.015).view(np.uint16), dtype=np.uint16)
    bits[5], bits[7] = F16_NAN, F16_INF
    gguf_blocks.set_scales(fmt, blocks, bits)
    findings = codec.scan(blocks.reshape(-1), shape)
    n_fields = 1 if fmt == "gguf_iq1_m" else len(_scale_fields(fmt))
    assert len(findings) == n_fields  # one summary per scale field, never one per block
    for finding in findings:
        assert finding.severity == "error"
        assert fmt in finding.message
        assert "2 of 8 blocks" in finding.message
        assert "first: block 5, row 2" in finding.message


def test_scan_names_dmin() -> None:
    blocks = _random_blocks("gguf_q4_k", 2)
    blocks[1, 2:4] = np.array([F16_NAN], dtype="<u2").view(np.uint8)  # dmin @2
    (finding,) = _codec("gguf_q4_k").scan(blocks.reshape(-1), (1, 512))
    assert "`dmin`" in finding.message and "first: block 1" in finding.message


def test_nan_scale_decodes_quietly() -> None:
    blocks = _random_blocks("gguf_q2_k", 2)
    gguf_blocks.set_scales("gguf_q2_k", blocks, np.array([F16_NAN, F16_INF]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = _codec("gguf_q2_k").decode(blocks.reshape(-1), (1, 512))
    assert np.isnan(values[0, :256]).all()


@pytest.mark.parametrize("fmt", ["gguf_q8_0", "gguf_q6_k", "gguf_q2_0"])
def test_wrong_buffer_is_refused(fmt: str) -> None:
    codec = _codec(fmt)
    _, bv, bb = FORMAT_BLOCKS[fmt]
    data = _random_blocks(fmt, 2).reshape(-1)
    for call in (codec.decode, codec.scan):
        with pytest.raises(CodecError, match=f"needs {2 * bb} bytes, object has {2 * bb - 1}"):
            call(data[:-1], (1, 2 * bv))
        with pytest.raises(CodecError, match="needs"):
            call(np.concatenate([data, data[:1]]), (1, 2 * bv))
        with pytest.raises(CodecError, match="1-D uint8"):
            call(data.view(np.int8), (1, 2 * bv))
        with pytest.raises(CodecError, match="1-D uint8"):
            call(data.reshape(2, -1), (1, 2 * bv))


def test_missing_gguf_is_a_codec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setitem(sys.modules, "gguf.quants", None)
    data = _random_blocks("gguf_q4_k", 1).reshape(-1)
    with pytest.raises(CodecError, match=r"decoding gguf_q4_k needs the gguf package"):
        _codec("gguf_q4_k").decode(data, (1, 256))
    # Q2_0 is decoded here, so it never needs gguf.
    q2 = _random_blocks("gguf_q2_0", 1).reshape(-1)
    assert _codec("gguf_q2_0").decode(q2, (1, 64)).shape == (1, 64)


def test_dequantizer_failure_is_a_codec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
        raise ValueError("boom")

    monkeypatch.setattr(gguf.quants, "dequantize", broken)
    data = _random_blocks("gguf_iq2_xs", 1).reshape(-1)
    with pytest.raises(CodecError, match="gguf_iq2_xs: boom"):
        _codec("gguf_iq2_xs").decode(data, (1, 256))
