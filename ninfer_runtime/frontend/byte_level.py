"""The byte-level BPE alphabet: how byte-level vocabularies write raw bytes as characters."""

from __future__ import annotations

from functools import cache

__all__ = ["byte_to_unicode", "unicode_to_byte"]


@cache
def byte_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte as one printable character.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, NBSP, soft
    hyphen) are moved to code points 256 and up, in byte order. Vocabulary strings of byte-level
    tokenizers are written in this alphabet.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


@cache
def unicode_to_byte() -> dict[str, int]:
    """The inverse of ``byte_to_unicode``: each alphabet character's byte."""
    return {char: b for b, char in byte_to_unicode().items()}
