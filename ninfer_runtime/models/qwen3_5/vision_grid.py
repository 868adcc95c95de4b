"""Where each patch of an ``encode`` call sits, and what that position gives it (host numpy).

The processor emits every frame's patches in merge-block order: the m×m patches that the merger
joins into one token are consecutive rows, blocks in raster order, so for a frame of h×w
patches row ``i`` is block ``i // m²`` (block row, block column) and, within it, patch
``i % m²`` (row, column). From (row, column) within its frame a patch gets

* its learned position: the ``side × side`` table bilinearly resampled to the frame's h×w grid
  with corners aligned (``F.interpolate(..., align_corners=True)``), as four taps and weights;
* its rotary angles: the first quarter of the head's frequencies turn with the row, the second
  with the column, and the two halves of the rotate-half pairs share them.

Frames of a video repeat the same positions; every frame is its own attention segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backends.base import to_numpy
from ...errors import ModelError


@dataclass(frozen=True)
class PatchGrid:
    """Per-patch positions of the images of one call, and its attention segments."""

    rows: np.ndarray  # [P] int64: row within the patch's frame
    cols: np.ndarray  # [P] int64: column within the patch's frame
    heights: np.ndarray  # [P] int64: its frame's height in patches
    widths: np.ndarray  # [P] int64: its frame's width in patches
    bounds: tuple[int, ...]  # segment starts, then the end (``cu_seqlens``): one per frame

    @property
    def patches(self) -> int:
        return int(self.rows.shape[0])


def checked_grid(grid_thw: object, merge: int) -> np.ndarray:
    """``grid_thw`` as host int64 [images, 3], or a ModelError saying what is wrong."""
    grid = np.asarray(to_numpy(grid_thw))
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
        raise ModelError(f"grid_thw must be [images, 3], got {list(grid.shape)}")
    if not np.issubdtype(grid.dtype, np.integer) or (grid <= 0).any():
        raise ModelError("grid_thw must hold positive integers")
    if (grid[:, 1:] % merge).any():
        raise ModelError(f"grid_thw heights and widths must be multiples of {merge} (merge)")
    return grid.astype(np.int64)


def merged_tokens(grid_thw: object, merge: int) -> list[int]:
    """Embedding rows (placeholder tokens) of each image of ``grid_thw``: t·h·w / m²."""
    grid = checked_grid(grid_thw, merge)
    return [int(t * h * w) // merge**2 for t, h, w in grid.tolist()]


def input_grid(pixel_values: Any, grid_thw: object, merge: int, patch_width: int) -> PatchGrid:
    """The layout of a tower's input: ``grid_thw`` checked, and ``pixel_values`` checked to be
    its patches [P, C·pt·ps·ps] (``patch_width`` wide)."""
    grid = patch_grid(checked_grid(grid_thw, merge), merge)
    shape = tuple(pixel_values.shape)
    if shape != (grid.patches, patch_width):
        raise ModelError(
            f"pixel_values {list(shape)} do not match grid_thw: expected "
            f"[{grid.patches}, {patch_width}] (patches, C·pt·ps·ps)"
        )
    return grid


def patch_grid(grid_thw: np.ndarray, merge: int) -> PatchGrid:
    """The layout of ``grid_thw`` [images, 3] (frames, height, width in patches; the heights
    and widths multiples of ``merge``)."""
    rows, cols, heights, widths, bounds = [], [], [], [], [0]
    for t, h, w in grid_thw.tolist():
        within = np.arange(h * w)
        block, (in_row, in_col) = (
            within // (merge * merge),
            np.divmod(within % (merge * merge), merge),
        )
        block_row, block_col = np.divmod(block, w // merge)
        frame_rows, frame_cols = block_row * merge + in_row, block_col * merge + in_col
        rows.append(np.tile(frame_rows, t))
        cols.append(np.tile(frame_cols, t))
        heights.append(np.full(t * h * w, h))
        widths.append(np.full(t * h * w, w))
        bounds += [bounds[-1] + (f + 1) * h * w for f in range(t)]
    return PatchGrid(
        rows=np.concatenate(rows).astype(np.int64),
        cols=np.concatenate(cols).astype(np.int64),
        heights=np.concatenate(heights).astype(np.int64),
        widths=np.concatenate(widths).astype(np.int64),
        bounds=tuple(bounds),
    )


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear interpolation along one axis: a target ``index`` of ``size`` maps onto the table's
    ``side`` entries with the end points aligned -> (the two table indices, their weights)."""
    source = index * (side - 1) / np.maximum(size - 1, 1)
    floor = np.floor(source)
    taps = floor.astype(np.int64)[:, None] + np.arange(2)
    weights = np.clip(1.0 - np.abs(source[:, None] - taps), 0.0, None)
    return np.clip(taps, 0, side - 1), weights


def position_taps(grid: PatchGrid, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Each patch's learned position as a weighted sum of rows of the flattened ``side × side``
    table -> (indices [P, 4] int64, weights [P, 4] float32)."""
    row_taps, row_weights = _axis_taps(grid.rows, grid.heights, side)
    col_taps, col_weights = _axis_taps(grid.cols, grid.widths, side)
    indices = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
    return indices, weights.astype(np.float32)


def rotary_angles(grid: PatchGrid, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [P, head_dim] of the 2-D rotary embedding: frequencies
    ``theta^(-2i / (head_dim/2))`` for i < head_dim/4, angles ``[row·f | column·f]`` for the
    first half of the head and again for the second (rotate-half pairs (j, j + head_dim/2))."""
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (np.arange(0, half, 2, dtype=np.float64) / half)
    angles = np.concatenate([grid.rows[:, None] * inv_freq, grid.cols[:, None] * inv_freq], axis=-1)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
