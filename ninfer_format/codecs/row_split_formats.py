"""The formats of ``row_split_k128_v1`` and the byte geometry of their three planes (spec 4.2).

Rows are padded to a multiple of 128 columns so the GPU kernels can read whole 128-column
tiles. Each group of G lanes along K takes B bytes of the base plane (low nibbles, or whole
bytes for q8), H bytes of the high-bit plane (q5, q6) and one binary16 scale word; each plane
starts at the codec alignment. The GPU loader and the quantizers read this table too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..framing import align_up
from ..numeric import NF4_ZERO_CODE
from .direct import ALIGNMENT
from .registry import Profile

LAYOUT = "row_split_k128_v1"
ROW_TILE = 128


@dataclass(frozen=True)
class RowSplitFormat:
    name: str
    bits: int
    group: int  # G: lanes per group, along K
    base_bytes: int  # B: base-plane bytes per group
    high_bytes: int  # H: high-bit-plane bytes per group
    qmin: int
    qmax: int
    profile: Profile
    nf4: bool = False

    @property
    def pad_code(self) -> int:
        return NF4_ZERO_CODE if self.nf4 else 0


FORMATS: dict[str, RowSplitFormat] = {
    f.name: f
    for f in (
        RowSplitFormat("q4_g64_fp16", 4, 64, 32, 0, -8, 7, "CORE"),
        RowSplitFormat("q5_g64_fp16", 5, 64, 32, 8, -16, 15, "CORE"),
        RowSplitFormat("q6_g64_fp16", 6, 64, 32, 16, -32, 31, "CORE"),
        RowSplitFormat("q8_g32_fp16", 8, 32, 32, 0, -127, 127, "CORE"),
        RowSplitFormat("nf4_g64_fp16", 4, 64, 32, 0, 0, 15, "ninfer", nf4=True),
    )
}


@dataclass(frozen=True)
class RowSplitGeometry:
    """Byte offsets of the three planes of one ``[N, K]`` object (spec 4.2)."""

    rows: int
    columns: int
    padded_columns: int  # K_pad = align_up(K, 128)
    groups_per_row: int  # gpr = K_pad / G, including wholly padded groups
    real_groups: int  # ceil(K / G): groups holding at least one real column
    base_bytes: int
    high_offset: int
    high_bytes: int
    scale_offset: int
    size: int


def plane_geometry(fmt: RowSplitFormat, rows: int, columns: int) -> RowSplitGeometry:
    """The planes of a ``[rows, columns]`` object of ``fmt`` (dimensions already checked)."""
    k_pad = align_up(columns, ROW_TILE)
    gpr = k_pad // fmt.group
    base_bytes = rows * gpr * fmt.base_bytes
    high_bytes = rows * gpr * fmt.high_bytes
    high_offset = align_up(base_bytes, ALIGNMENT)
    scale_offset = high_offset + align_up(high_bytes, ALIGNMENT)
    return RowSplitGeometry(
        rows=rows,
        columns=columns,
        padded_columns=k_pad,
        groups_per_row=gpr,
        real_groups=-(-columns // fmt.group),
        base_bytes=base_bytes,
        high_offset=high_offset,
        high_bytes=high_bytes,
        scale_offset=scale_offset,
        size=scale_offset + rows * gpr * 2,
    )
