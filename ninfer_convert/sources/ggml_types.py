"""The ggml tensor types a GGUF source reads: their names, block geometry and float values.

gguf-py's tables cover the types it knows; ggml type 42 (Q2_0) is newer than gguf-py, so its
name and block size come from ``ninfer_format``'s block codec, which also decodes it. Keeping
that exception in one place lets the rest of the source treat every type alike.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, GGML_TYPE_TO_FORMAT

#: ggml types that gguf-py's enum lacks: id -> (name, values per block, bytes per block)
EXTRA_TYPES: dict[int, tuple[str, int, int]] = {
    42: ("Q2_0", *FORMAT_BLOCKS[GGML_TYPE_TO_FORMAT[42]][1:]),
}

#: unquantized ggml types and the numpy dtype of their elements
PLAIN_DTYPES: dict[int, np.dtype] = {
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


def ggml_type_name(ggml_type: int) -> str:
    """The ggml name of a type id ("Q4_K", "F32", "Q2_0"), or ``TYPE_<id>`` if unknown."""
    if ggml_type in EXTRA_TYPES:
        return EXTRA_TYPES[ggml_type][0]
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"TYPE_{ggml_type}"


def block_geometry(ggml_type: int) -> tuple[int, int] | None:
    """(values per block, bytes per block), or None for a type nobody here knows."""
    if ggml_type in EXTRA_TYPES:
        return EXTRA_TYPES[ggml_type][1:]
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None


def decode_values(ggml_type: int, blocks: np.ndarray, ne: tuple[int, ...]) -> np.ndarray:
    """The values of ``blocks`` (uint8 ``[rows, row_bytes]``) of a tensor of type
    ``ggml_type`` and ggml shape ``ne``, flat or in rows: float32, except that integer types
    keep their dtype and F64 stays float64.

    Quantized types are dequantized with gguf-py's reference dequantizers, Q2_0 with the
    ``gguf_q2_0`` codec; gguf-py raises ``NotImplementedError`` for a type it cannot decode.
    """
    plain = PLAIN_DTYPES.get(ggml_type)
    if plain is not None:
        values = blocks.view(plain)
        return values.astype(np.float32) if plain == np.float16 else values.copy()
    if ggml_type == GGMLQuantizationType.BF16:
        # bfloat16 is the high half of a float32: widen the bits, no rounding involved.
        return (blocks.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    if ggml_type in EXTRA_TYPES:
        from ninfer_format.codecs import codec_for

        codec = codec_for(GGML_TYPE_TO_FORMAT[ggml_type], "gguf_blocks_v1")
        return codec.decode(blocks.reshape(-1), (blocks.shape[0], ne[0]))
    from gguf.quants import dequantize

    with np.errstate(all="ignore"):  # NaN/Inf block scales propagate; inspect flags them
        return dequantize(blocks, GGMLQuantizationType(ggml_type))
