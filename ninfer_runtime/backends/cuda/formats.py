"""Which stored layouts the CUDA kernels read in place, and the plane offsets they need.

Every number here comes from the codec's own geometry in ``ninfer_format.codecs``, so the
kernels and the numpy decoders (the oracle) can never disagree about where a plane starts.
Format codes match the ``FMT_*`` macros in ``kernels/common.cuh``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ninfer_format.codecs import fp8_row, gguf_blocks, nvfp4
from ninfer_format.codecs.row_split import LAYOUT as ROW_SPLIT
from ninfer_format.codecs.row_split import row_split_geometry

Q4, Q5, Q6, Q8, NF4, NVFP4, FP8, BF16 = range(8)

ROW_SPLIT_CODES = {
    "q4_g64_fp16": Q4,
    "q5_g64_fp16": Q5,
    "q6_g64_fp16": Q6,
    "q8_g32_fp16": Q8,
    "nf4_g64_fp16": NF4,
}
#: ``gguf_*`` codes are this plus the ggml type id (the template argument of kernels/gguf.cu)
GGUF_BASE = 100
GGUF_CODES = {
    name: GGUF_BASE + ggml_type for name, (ggml_type, _, _) in gguf_blocks.FORMAT_BLOCKS.items()
}
#: (format, layout) -> code for every layout a GEMV kernel reads directly
PACKED: dict[tuple[str, str], int] = {
    **{(name, ROW_SPLIT): code for name, code in ROW_SPLIT_CODES.items()},
    (nvfp4.FORMAT, nvfp4.LAYOUT): NVFP4,
    (fp8_row.FORMAT, fp8_row.LAYOUT): FP8,
    ("bf16", "contiguous_le_v1"): BF16,
    **{(name, gguf_blocks.LAYOUT): code for name, code in GGUF_CODES.items()},
}


def is_gguf(code: int) -> bool:
    return code >= GGUF_BASE


@dataclass(frozen=True)
class Planes:
    """Kernel arguments describing one ``[rows, columns]`` object.

    ``off1``/``off2``: the layout's second and third plane (row_split: high bits, scales;
    nvfp4: scales, divisors; fp8: row scales). ``stride``: groups per row for row_split,
    ggml blocks per row for ``gguf_*``, else K. ``x_width``: columns the GEMV reads from x
    (row_split pads rows to 128; x is padded with zeros to match). ``units``: 16-byte units
    per row (``gguf_*``: groups of 32 values). ``gemv``: whether the vectorised
    GEMV may read this shape (fp8 and bf16 need rows that start on 16-byte boundaries).
    ``tiled``: the object was tile packed at upload (``tiles.py``); only the tile kernels
    read it.
    """

    code: int
    rows: int
    columns: int
    off1: int = 0
    off2: int = 0
    stride: int = 0
    rows_per_divisor: int = 1
    x_width: int = 0
    units: int = 0
    gemv: bool = True
    tiled: bool = False

    def kernel_args(self) -> tuple[np.int64, np.int64, np.int32, np.int32]:
        """``off1, off2, stride, rows_per_divisor`` as every packed-weight kernel takes them
        (after the object's bytes)."""
        return (
            np.int64(self.off1),
            np.int64(self.off2),
            np.int32(self.stride),
            np.int32(self.rows_per_divisor),
        )


def planes(format: str, layout: str, shape: tuple[int, int], divisors: int = 1) -> Planes:
    code = PACKED[(format, layout)]
    rows, columns = shape
    if code in ROW_SPLIT_CODES.values():
        geo = row_split_geometry(format, (rows, columns))
        per_unit = 16 if code == Q8 else 32
        return Planes(
            code,
            rows,
            columns,
            off1=geo.high_offset,
            off2=geo.scale_offset,
            stride=geo.groups_per_row,
            x_width=geo.padded_columns,
            units=geo.padded_columns // per_unit,
        )
    if code == NVFP4:
        geo4 = nvfp4.CODEC.geometry((rows, columns), divisors)
        return Planes(
            code,
            rows,
            columns,
            off1=geo4.scale_offset,
            off2=geo4.divisor_offset,
            stride=columns,
            rows_per_divisor=geo4.rows_per_divisor,
            x_width=columns,
            units=columns // 32,
        )
    if is_gguf(code):
        _, values, _ = gguf_blocks.FORMAT_BLOCKS[format]
        return Planes(
            code, rows, columns, stride=columns // values, x_width=columns, units=columns // 32
        )
    if code == FP8:
        geo8 = fp8_row.CODEC.geometry((rows, columns))
        return Planes(
            code,
            rows,
            columns,
            off1=geo8.scale_offset,
            stride=columns,
            x_width=columns,
            units=columns // 16,
            gemv=columns % 16 == 0,
        )
    return Planes(
        code,
        rows,
        columns,
        stride=columns,
        x_width=columns,
        units=columns // 8,
        gemv=columns % 8 == 0,
    )
