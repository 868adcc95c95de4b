"""The magnitudes a GGUF GEMV's sums are made of, for its error bound (shared by the host and
GPU tests of ``gguf_dot``): for a block type the GEMV evaluates factored
(``dl * sum x q - ml * sum x``), each value's scale and min parts, each taken alone."""

from __future__ import annotations

import numpy as np

from ninfer_format.codecs import codec_for, gguf_blocks
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, LAYOUT

#: the types ``gguf_dot`` (kernels/gguf_decode.cuh: GgufFactored) evaluates factored
FACTORED = {"gguf_q4_k", "gguf_q5_k"}


def term_magnitudes(fmt: str, blocks: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """|w| for each value of the ``[n, block bytes]`` blocks laid out as ``shape``, or for a
    factored type |d * sc * q| + |dmin * m| (decoded with the other scale field zeroed)."""
    codec = codec_for(fmt, LAYOUT)
    if fmt not in FACTORED:
        return np.abs(codec.decode(blocks.reshape(-1), shape)).astype(np.float64)
    block_type = next(bt for bt in gguf_blocks._BLOCK_TYPES if bt.format == fmt)
    total = np.zeros(shape, dtype=np.float64)
    for _, keep in block_type.f16_fields:
        alone = blocks.reshape(-1, FORMAT_BLOCKS[fmt][2]).copy()
        for _, offset in block_type.f16_fields:
            if offset != keep:
                alone[:, offset : offset + 2] = 0
        total += np.abs(codec.decode(alone.reshape(-1), shape))
    return total
