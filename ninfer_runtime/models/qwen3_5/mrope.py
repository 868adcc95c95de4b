"""Qwen3.5's multimodal RoPE (M-RoPE): three position streams, temporal, height and width.

Each rotary frequency pair reads one stream. transformers' ``Qwen3_5TextRotaryEmbedding``
interleaves them (whatever ``mrope_interleaved`` says): pair ``i`` reads height when
``i % 3 == 1`` and ``i < 3·section[1]``, width when ``i % 3 == 2`` and ``i < 3·section[2]``,
temporal otherwise. Text tokens carry the same position in all three streams, so for text
M-RoPE is plain 1-D RoPE.

A prompt's positions (transformers' ``get_rope_index``): text runs count on from the last
position; an image's ``t·(h/m)·(w/m)`` placeholder tokens (m = spatial merge size) sit at
``start + (frame, row, column)`` in the three streams, and the text after it starts at
``start + max(h, w) / m``. Tokens after the prompt continue at their sequence index plus
``delta = max position + 1 - prompt length`` in every stream (transformers' ``rope_deltas``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import ModelError

#: the streams of a [3, T] positions array
TEMPORAL, HEIGHT, WIDTH = 0, 1, 2


def rope_streams(mrope_section: Sequence[int], pairs: int) -> np.ndarray:
    """Which stream (0 temporal, 1 height, 2 width) each of ``pairs`` rotary frequency pairs
    reads -> int [pairs]."""
    i = np.arange(pairs)
    streams = np.full(pairs, TEMPORAL)
    streams[(i % 3 == 1) & (i < 3 * mrope_section[HEIGHT])] = HEIGHT
    streams[(i % 3 == 2) & (i < 3 * mrope_section[WIDTH])] = WIDTH
    return streams


def image_runs(
    ids: np.ndarray, grid_thw: np.ndarray, image_token_id: int, merge: int
) -> list[tuple[int, int]]:
    """The prompt's runs ``[a, b)`` of ``image_token_id``, checked to be, in order, the merged
    tokens of the images of ``grid_thw`` [images, 3] (in patches)."""
    ids = np.asarray(ids).reshape(-1)
    grids = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    flags = np.concatenate([[0], (ids == image_token_id).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(flags))
    runs = list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
    if len(runs) != len(grids):
        raise ModelError(
            f"the prompt has {len(runs)} run(s) of image placeholder tokens for {len(grids)} "
            "image(s)"
        )
    for k, ((a, b), (t, h, w)) in enumerate(zip(runs, grids.tolist(), strict=True)):
        if b - a != t * (h // merge) * (w // merge):
            raise ModelError(
                f"image {k} has {b - a} placeholder tokens; its grid {[t, h, w]} needs "
                f"{t * (h // merge) * (w // merge)}"
            )
    return runs


def prompt_positions(
    ids: np.ndarray, grid_thw: np.ndarray, image_token_id: int, merge: int
) -> tuple[np.ndarray, int]:
    """M-RoPE positions of a prompt whose runs of ``image_token_id`` are, in order, the
    images of ``grid_thw`` [images, 3] (in patches) -> (int64 [3, T], delta for the tokens
    after it)."""
    ids = np.asarray(ids).reshape(-1)
    grids = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    runs = image_runs(ids, grids, image_token_id, merge)
    positions = np.empty((3, len(ids)), dtype=np.int64)
    next_position = text_from = 0
    for (a, b), (t, h, w) in zip(runs, grids.tolist(), strict=True):
        positions[:, text_from:a] = next_position + np.arange(a - text_from)
        next_position += a - text_from
        rows, columns = h // merge, w // merge
        frame, row, column = np.meshgrid(
            np.arange(t), np.arange(rows), np.arange(columns), indexing="ij"
        )
        positions[:, a:b] = next_position + np.stack([frame, row, column]).reshape(3, -1)
        next_position += max(rows, columns)
        text_from = b
    positions[:, text_from:] = next_position + np.arange(len(ids) - text_from)
    delta = int(positions.max()) + 1 - len(ids) if len(ids) else 0
    return positions, delta


def continued_positions(start: int, tokens: int, delta: int) -> np.ndarray:
    """Positions of ``tokens`` tokens from sequence index ``start`` on, after a prompt whose
    M-RoPE delta is ``delta`` (the same in every stream, so 1-D) -> int64 [tokens]."""
    return np.arange(start, start + tokens, dtype=np.int64) + delta
