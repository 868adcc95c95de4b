"""Strict JSON text parsing for the directory (rule R3).

The standard library parser is used with hooks that reject what the format forbids: duplicate
member names at any depth, NaN/Infinity literals, non-finite floats, byte-order marks and lone
surrogates. Pathological nesting stops at the parser's recursion guard; the free-form members
(config, metadata, provenance) are limited to ``MAX_DEPTH`` levels by the validator. Every
failure becomes a ``DirectoryError``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import DirectoryError

MAX_DEPTH = 64


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise DirectoryError(f"JSON directory: duplicate member {duplicate!r} in one object")
    return members


def _reject_constant(name: str) -> Any:
    raise DirectoryError(f"JSON directory: literal {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DirectoryError(f"JSON directory: number {text[:40]} does not fit a finite float")
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Depth of nested containers, stopping once ``limit`` is passed (for free-form members)."""
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return 0
    deepest = 0
    for child in children:
        if isinstance(child, dict | list):
            deepest = max(deepest, nesting_depth(child, limit - 1))
            if deepest >= limit:
                break
    return deepest + 1


def _has_lone_surrogate(document: Any) -> bool:
    """Iterative walk (nesting may reach the parser's limit, deeper than Python's stack)."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def parse_directory_text(raw: bytes) -> Any:
    """Decode and parse the directory bytes; trailing JSON whitespace is allowed."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise DirectoryError("JSON directory: starts with a UTF-8 byte-order mark")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DirectoryError(f"JSON directory: not valid UTF-8 at byte {exc.start}") from None
    try:
        document = json.loads(
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
    except RecursionError:
        raise DirectoryError("JSON directory: nested too deeply") from None
    except ValueError as exc:
        raise DirectoryError(f"JSON directory: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(document):
        raise DirectoryError("JSON directory: a string holds a lone surrogate (not valid UTF-8)")
    return document


def dump_directory_text(document: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON as the reference writer emits it."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
        "utf-8"
    )
