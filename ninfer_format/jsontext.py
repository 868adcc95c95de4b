"""Strict JSON text parsing for the directory (rule R3).

The standard library parser is used with hooks that reject what the format forbids: duplicate
member names at any depth, NaN/Infinity literals, non-finite floats and byte-order marks. Every
failure becomes a ``DirectoryError``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import DirectoryError

MAX_DEPTH = 64


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DirectoryError(f"JSON directory: duplicate member {key!r} in one object")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise DirectoryError(f"JSON directory: literal {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DirectoryError(f"JSON directory: number {text[:40]} does not fit a finite float")
    return value


def _depth(text: str) -> int:
    """Deepest nesting of [ and { outside strings (cheap guard before recursive parsing)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_directory_text(raw: bytes) -> Any:
    """Decode and parse the directory bytes; trailing JSON whitespace is allowed."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise DirectoryError("JSON directory: starts with a UTF-8 byte-order mark")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DirectoryError(f"JSON directory: not valid UTF-8 at byte {exc.start}") from None
    if _depth(text) > MAX_DEPTH:
        raise DirectoryError(f"JSON directory: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_members,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except DirectoryError:
        raise
    except json.JSONDecodeError as exc:
        raise DirectoryError(
            f"JSON directory: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise DirectoryError(f"JSON directory: {exc}") from None


def dump_directory_text(document: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON as the reference writer emits it."""
    return json.dumps(
        document, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    ).encode("utf-8")
