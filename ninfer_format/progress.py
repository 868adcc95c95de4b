"""Progress bars for long steps: shown on a terminal, silent elsewhere.

A bar is a context manager ``bar(total, description, unit)`` that yields ``advance(n, note="")``.
``terminal_bar`` draws one with tqdm on standard error when that is a terminal; tqdm comes with
the ``convert`` and ``runtime`` extras, not the base install, so without it the bar is silent
too. Library functions take a bar factory and default to ``silent``; the command-line tools and
the engine's weight loading use ``terminal_bar``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

Advance = Callable[..., None]
ProgressBar = Callable[[int, str, str], AbstractContextManager[Advance]]


@contextmanager
def silent(total: int, description: str, unit: str = "B") -> Iterator[Advance]:
    yield lambda n, note="": None


@contextmanager
def terminal_bar(total: int, description: str, unit: str = "B") -> Iterator[Advance]:
    try:
        from tqdm import tqdm
    except ImportError:
        with silent(total, description, unit) as advance:
            yield advance
        return
    # disable=None: tqdm draws nothing unless the stream is a terminal; SI prefixes (k, M, G)
    # for large counts only, so that 75 parameters do not read "75.0"
    with tqdm(
        total=total,
        desc=description,
        unit=unit,
        unit_scale=total >= 10_000,
        file=sys.stderr,
        disable=None,
    ) as bar:

        def advance(n: int, note: str = "") -> None:
            if note:
                bar.set_postfix_str(note[-48:], refresh=False)
            bar.update(n)

        yield advance
