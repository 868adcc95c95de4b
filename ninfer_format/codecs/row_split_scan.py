"""What ``ninfer-inspect --verify`` finds in a ``row_split_k128_v1`` object's bytes.

Scale checks read only the scale plane; code checks decode only the groups they concern
(zero-scale groups, padded groups), so verifying runs near memory speed.
"""

from __future__ import annotations

import numpy as np

from .direct import nonzero_gap_findings, where_text
from .registry import Finding
from .row_split_formats import RowSplitFormat, RowSplitGeometry
from .row_split_lanes import group_lanes, padded_scales


def scan_planes(fmt: RowSplitFormat, geo: RowSplitGeometry, raw: np.ndarray) -> list[Finding]:
    """Invalid scales and codes (errors), negative EXT-ALL scales and non-zero padding
    (warnings)."""
    findings: list[Finding] = []
    words = padded_scales(geo, raw)
    real = geo.real_groups
    scale = words[:, :real]

    magnitude = scale & 0x7FFF
    non_finite = magnitude >= 0x7C00
    if non_finite.any():
        findings.append(Finding("error", "scale is Inf or NaN: " + where_text(non_finite)))
    minus_zero = scale == 0x8000
    if minus_zero.any():
        findings.append(Finding("error", "scale is -0 (0x8000): " + where_text(minus_zero)))
    negative = (scale >= 0x8000) & (magnitude != 0) & ~non_finite
    if negative.any():
        if fmt.nf4:
            findings.append(Finding("error", "negative scale: " + where_text(negative)))
        else:
            text = "negative scale (EXT-ALL dialect): " + where_text(negative)
            findings.append(Finding("warning", text))

    def off_pad_counts(rows: np.ndarray, groups: np.ndarray, real_lanes: bool) -> np.ndarray:
        lanes = group_lanes(fmt, geo, raw, (rows, groups))
        column = groups[:, None] * fmt.group + np.arange(fmt.group)
        in_range = (column < geo.columns) == real_lanes
        counts = np.zeros((geo.rows, geo.groups_per_row), dtype=np.int64)
        counts[rows, groups] = ((lanes != fmt.pad_code) & in_range).sum(axis=1)
        return counts

    rows, groups = np.nonzero(scale == 0)
    if rows.size:
        bad = off_pad_counts(rows, groups, real_lanes=True)[:, :real]
        if bad.any():
            text = "non-zero codes in groups whose scale is +0: " + where_text(bad, "lanes")
            findings.append(Finding("error", text))
    if fmt.bits == 8:
        minus_128 = raw[: geo.base_bytes] == 0x80
        if minus_128.any():
            lanes = minus_128.reshape(geo.rows, geo.groups_per_row, fmt.group)
            column = np.arange(geo.padded_columns).reshape(geo.groups_per_row, fmt.group)
            illegal = (lanes & (column < geo.columns)).sum(axis=2)[:, :real]
            if illegal.any():
                text = "illegal code 0x80 (-128): " + where_text(illegal, "lanes")
                findings.append(Finding("error", text))

    if geo.columns < geo.padded_columns:
        first = geo.columns // fmt.group
        rows, groups = np.meshgrid(
            np.arange(geo.rows), np.arange(first, geo.groups_per_row), indexing="ij"
        )
        pad_lanes = off_pad_counts(rows.ravel(), groups.ravel(), real_lanes=False)
        if pad_lanes.any():
            zero = "code 7" if fmt.nf4 else "0"
            text = f"non-zero padding: lanes at columns >= {geo.columns} not {zero}: "
            findings.append(Finding("warning", text + where_text(pad_lanes, "lanes")))
    pad_scales = words[:, real:] != 0
    if pad_scales.any():
        text = "non-zero padding: scale of wholly padded groups not 0x0000: "
        counts = np.zeros(words.shape, dtype=np.int64)
        counts[:, real:] = pad_scales
        findings.append(Finding("warning", text + where_text(counts)))
    findings += nonzero_gap_findings(
        raw,
        [
            (geo.base_bytes, geo.high_offset, "gap after the base plane"),
            (geo.high_offset + geo.high_bytes, geo.scale_offset, "gap after the high-bit plane"),
        ],
    )
    return findings
