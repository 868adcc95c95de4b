"""Keys and values stored in a pool's attention layer as the engine stores them: through the
attention family's ``write`` op, each row at its slot and position."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_runtime.ops import attention


def store_rows(pool: Any, layer: Any, state: Any, start: int, k: np.ndarray, v: np.ndarray) -> None:
    """Tokens ``start .. start + len(k) - 1`` of ``state``'s sequence into ``layer``'s pages."""
    write = attention.resolved("write", "cpu", layer.k, precision="float32")
    slots = np.full(k.shape[0], state.slot, dtype=np.int32)
    positions = np.arange(start, start + k.shape[0], dtype=np.int32)
    write(layer.k, layer.v, pool.page_table, slots, positions, k, v)
