"""Reading the settings: the ``--config`` TOML file, the flags over it, and pydantic's
validation errors turned into one line per problem naming the file (or "flags") and key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .settings import Settings
from .table import ConfigError

__all__ = ["load_settings"]


def _describe(error: ValidationError, source: str) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key {key!r}")
        else:
            message = item["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {key}: {message}")
    return "\n".join(lines)


def load_settings(config: Path | None, overrides: dict[str, dict[str, Any]]) -> Settings:
    """Settings from a TOML file (optional) with flag ``overrides`` per table on top.

    ``overrides`` holds only the flags the user gave (``None`` values are dropped), so a default
    flag never masks a value from the file.
    """
    data: dict[str, Any] = {}
    source = "flags"
    if config is not None:
        source = str(config)
        try:
            data = tomllib.loads(config.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{config}: cannot read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config}: not valid TOML: {exc}") from None
    for table, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            current = data.get(table)
            if current is not None and not isinstance(current, dict):
                raise ConfigError(f"{source}: {table} must be a table")
            data[table] = {**(current or {}), **given}
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
