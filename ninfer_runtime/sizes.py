"""Byte counts as people read them in messages: ``512 B``, ``10 KiB``, ``1.5 MiB``, ``24 GiB``.

Sizes are given in binary units (``--context-capacity 24GiB``), so they are shown in them; the
unit follows the size, so a small capacity is not printed as ``0 MiB``.
"""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def format_size(count: float) -> str:
    """``count`` bytes in the largest binary unit that keeps it at 1 or more, to three
    significant digits (whole bytes below 1 KiB)."""
    if abs(count) < 1024:
        return f"{int(count)} B"
    value = float(count)
    for unit in _UNITS:
        value /= 1024
        shown = _three_digits(value)
        # by the rounded figure: a byte short of 1 MiB is "1 MiB", not "1024 KiB"
        if abs(float(shown)) < 1024 or unit == _UNITS[-1]:
            break
    return f"{shown} {unit}"


def _three_digits(value: float) -> str:
    """``value`` to three significant digits (more above 999), without trailing zeros."""
    decimals = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    shown = f"{value:.{decimals}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown
