"""Typed reading of free-form JSON config objects: each bad member becomes one error line.

Configs arrive as arbitrary JSON, so a reader never raises on a wrong type or value: it appends
a line naming the member (``<where><key>' <problem>``) to a problem list and returns None,
letting the caller report every bad member of a config at once.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from typing import Any

MISSING = object()


def show(value: Any) -> str:
    """A short JSON rendering of ``value`` for an error line."""
    if value is MISSING:
        return "nothing"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # not JSON, or an int beyond Python's str() digit limit
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


class ConfigReader:
    """Typed access to one free-form config object; each bad member becomes one error line."""

    def __init__(self, values: Mapping[str, Any], where: str, problems: list[str]) -> None:
        self.values = values
        self.where = where  # e.g. "text config member 'rope_parameters."
        self.problems = problems
        self.why = ""  # appended to "is missing" lines, e.g. " (full-attention layers need it)"

    def error(self, key: str, problem: str) -> None:
        self.problems.append(f"{self.where}{key}' {problem}")

    def _get(self, key: str) -> Any:
        if key not in self.values:
            self.error(key, "is missing" + self.why)
            return MISSING
        return self.values[key]

    def positive_int(self, key: str) -> int | None:
        value = self._get(key)
        if value is MISSING:
            return None
        if type(value) is not int or value <= 0:  # type() also rejects bool
            self.error(key, f"must be a positive integer, got {show(value)}")
            return None
        return value

    def positive_number(self, key: str) -> float | None:
        """A positive JSON number (int or float) within float range, as a float."""
        value = self._get(key)
        if value is MISSING:
            return None
        number = math.nan
        if type(value) in (int, float):  # type() rejects bool
            with contextlib.suppress(OverflowError):  # an int beyond float range (10**400)
                number = float(value)
        if not math.isfinite(number) or number <= 0:
            self.error(key, f"must be a positive number, got {show(value)}")
            return None
        return number

    def boolean(self, key: str) -> bool | None:
        value = self._get(key)
        if value is MISSING:
            return None
        if type(value) is not bool:
            self.error(key, f"must be true or false, got {show(value)}")
            return None
        return value

    def int_list(self, key: str, length: int) -> list[int] | None:
        value = self._get(key)
        if value is MISSING:
            return None
        if (
            not isinstance(value, list)
            or len(value) != length
            or any(type(v) is not int or v < 0 for v in value)
        ):
            self.error(key, f"must be a list of {length} non-negative integers, got {show(value)}")
            return None
        return value

    def string_list(self, key: str) -> list[str] | None:
        value = self._get(key)
        if value is MISSING:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.error(key, f"must be a list of strings, got {show(value)}")
            return None
        return value

    def section(self, key: str) -> ConfigReader | None:
        value = self._get(key)
        if value is MISSING:
            return None
        if not isinstance(value, dict):
            self.error(key, f"must be an object, got {show(value)}")
            return None
        inner = ConfigReader(value, f"{self.where}{key}.", self.problems)
        inner.why = self.why
        return inner
