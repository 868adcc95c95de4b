"""Rows of large stored tables, read from disk as steps need them and kept in a bounded cache.

``RowCache`` holds decoded rows by ``(table, row)``, least recently used first out, never more
than ``capacity`` bytes (float32 values). ``StreamedRows`` is one table read through a
``RowReader`` and a cache shared by all tables: ``gather`` looks every distinct row of a step
up, reads the missing ones in one coalesced pass and returns the rows the step asked for. The
rows a step reads are returned from that read, so a cache smaller than one step's rows costs
re-reads in later steps, never wrong values.

Which rows a step needs is known only once its tokens are (the rows are hashes of them), so
the read-ahead is per step: a prefill hashes its whole prompt (or chunk) first and reads all
its rows in one pass; a decode step reads the rows of its one token per lane.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from .row_reader import RowReader

Array = Any


class RowCache:
    """Decoded rows by ``(table, row)``, at most ``capacity`` bytes, least recently used out."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"a row cache's capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self.bytes = 0
        self.hits = self.misses = 0
        self._rows: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def fill(self, table: str, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Copy the held ones of ``rows`` into ``out`` (same order) and mark them recently
        used -> a bool mask of the rows not held."""
        missing = np.ones(rows.size, dtype=bool)
        for i, row in enumerate(rows.tolist()):
            values = self._rows.get((table, row))
            if values is not None:
                self._rows.move_to_end((table, row))
                out[i] = values
                missing[i] = False
        held = int(rows.size - missing.sum())
        self.hits += held
        self.misses += rows.size - held
        return missing

    def put(self, table: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Keep ``values[i]`` as row ``rows[i]`` of ``table``, dropping the least recently used
        rows beyond the capacity (a row larger than the whole capacity is not kept)."""
        for row, row_values in zip(rows.tolist(), values, strict=True):
            key = (table, row)
            old = self._rows.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            if row_values.nbytes > self.capacity:
                continue
            self._rows[key] = row_values.copy()
            self.bytes += row_values.nbytes
            while self.bytes > self.capacity:
                _, dropped = self._rows.popitem(last=False)
                self.bytes -= dropped.nbytes

    def clear(self) -> None:
        self._rows.clear()
        self.bytes = 0


class StreamedRows:
    """A table ``[N, K]`` whose rows come from disk through a shared ``RowCache``."""

    def __init__(self, reader: RowReader, cache: RowCache):
        self.reader, self.cache = reader, cache
        self.shape = reader.shape

    def gather(self, ids: Array) -> np.ndarray:
        """Rows for ``ids`` (any shape) -> float32 ``[ids.size, K]``, in the ids' order."""
        flat = np.asarray(ids, dtype=np.int64).reshape(-1)
        distinct, where = np.unique(flat, return_inverse=True)
        values = np.empty((distinct.size, self.shape[1]), dtype=np.float32)
        missing = self.cache.fill(self.reader.name, distinct, values)
        if missing.any():
            read = self.reader.read(distinct[missing])
            values[missing] = read
            self.cache.put(self.reader.name, distinct[missing], read)
        return values[where.reshape(-1)]
