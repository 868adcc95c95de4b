"""Reading a checkpoint's JSON files, every failure one ``SourceError`` naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import SourceError


def read_json(path: Path) -> Any:
    """Parse one JSON file; any failure becomes a ``SourceError`` that names the file."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{path} is not valid JSON: {exc}") from exc


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object (a config, an index)."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise SourceError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value
