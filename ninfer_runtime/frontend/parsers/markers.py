"""Finding markers in streamed text, and holding back what may still become one."""

from __future__ import annotations

from collections.abc import Iterable


def _earliest(text: str, markers: Iterable[str]) -> tuple[int, str | None]:
    """Position and marker of the first marker occurrence in ``text`` (longest on a tie)."""
    best, found = len(text), None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (at < best or (at == best and found and len(marker) > len(found))):
            best, found = at, marker
    return (best, found) if found is not None else (0, None)


def _held_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest
