"""What every settings table shares: the error that stops the server, and the pydantic base.

Why ``extra="forbid"``: a misspelt key in a config file must stop the server with a message
naming the key, not be ignored while the server runs with a default the user did not mean.
``validate_assignment``: a value set after loading (``fit_to_model``) is checked as well.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigError", "Table"]


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, key and problem."""


class Table(BaseModel):
    """One TOML table: unknown keys refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
