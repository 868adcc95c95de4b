"""Progress of the long steps (loading weights, scoring a text) on a terminal.

A tqdm bar on stderr, shown only when stderr is a terminal (tqdm's ``disable=None``), so logs,
pipes and the server's output stay as they were; it is cleared when the step ends.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress_bar(total: int, desc: str, unit: str) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        leave=False,
        disable=None,
    )
