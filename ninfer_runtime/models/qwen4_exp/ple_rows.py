"""Where the rows of PLE's n-gram tables come from: memory or the artifact on disk.

* ``resident``: each table is loaded whole, like any weight (float32 on the CPU backend);
  right for small models, whose tables are a few MiB.
* ``streamed``: no table is loaded; a step reads the rows its n-grams hash to from the
  artifact (``row_reader``), through one LRU cache of ``ple_cache_bytes`` shared by all PLE
  layers (``row_cache``). The real checkpoint's tables hold ~45 B parameters (90 GiB in bf16,
  ~25 GiB in NF4), which no host holds decoded.
* ``auto`` (the default): streamed when the tables, decoded to float32, would take more than
  ``RESIDENT_LIMIT_BYTES``, else resident.

Both modes decode the same stored codes with the same codec, so the logits are identical.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ...errors import ModelError
from ...row_cache import RowCache, StreamedRows
from ...row_reader import RowCounters, RowReader
from .config import Qwen4ExpGeometry

PLE_ROWS_MODES = ("auto", "resident", "streamed")
#: decoded (float32) bytes of all n-gram tables above which ``auto`` streams them
RESIDENT_LIMIT_BYTES = 1 << 30
#: the default capacity of the streamed rows' cache (decoded float32 rows)
DEFAULT_CACHE_BYTES = 256 << 20


def table_names(g: Qwen4ExpGeometry) -> list[str]:
    """The n-gram table parameter of every PLE layer."""
    return [f"text/layers/{i}/ple/ngram_table" for i in (g.ple.layers if g.ple else ())]


def resident_bytes(artifact: Any, names: Iterable[str]) -> int:
    """Bytes the tables take decoded to float32, as the CPU backend would hold them."""
    shapes = artifact.binder_report.parameters
    return sum(4 * math.prod(shapes[name]) for name in names)


def choose_mode(mode: str, artifact: Any, names: list[str]) -> str:
    """``resident`` or ``streamed`` for the option ``mode`` (``ple_rows``)."""
    if mode not in PLE_ROWS_MODES:
        raise ModelError(f"ple_rows {mode!r}: expected one of {', '.join(PLE_ROWS_MODES)}")
    if mode != "auto":
        return mode
    if names and resident_bytes(artifact, names) > RESIDENT_LIMIT_BYTES:
        return "streamed"
    return "resident"


class StreamedTables:
    """The streamed n-gram tables of a model by parameter name, and their shared cache."""

    def __init__(self, artifact: Any, names: list[str], cache_bytes: int):
        for name in names:  # rows are read as stored; a resident table's columns are put back
            if artifact.input_columns(name) is not None:
                raise ModelError(
                    f"parameter {name!r}: its columns are stored out of order, so its rows "
                    "cannot be streamed (ple_rows='resident' puts them in place)"
                )
        if not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ModelError(f"ple_cache_bytes {cache_bytes!r}: expected a byte count >= 0")
        self.cache = RowCache(cache_bytes)
        self.tables = {name: StreamedRows(RowReader(artifact, name), self.cache) for name in names}

    def counters(self) -> RowCounters:
        """What every table has read from disk, summed."""
        counters = [table.reader.counters for table in self.tables.values()]
        return RowCounters(
            bytes=sum(c.bytes for c in counters),
            rows=sum(c.rows for c in counters),
            ranges=sum(c.ranges for c in counters),
        )

    def reset_counters(self) -> None:
        """Zero what every table has read and what the cache held or missed."""
        for table in self.tables.values():
            table.reader.counters.reset()
        self.cache.hits = self.cache.misses = 0
