"""The CUDA backend's settings from the environment, each read the same way."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence


def env_choice(
    name: str, choices: Sequence[str], default: str, environ: Mapping[str, str] | None = None
) -> str:
    """The value of variable ``name`` (case and spaces aside; unset or empty: ``default``),
    one of ``choices``; any other is refused in one line naming the variable (ValueError)."""
    environ = os.environ if environ is None else environ
    value = environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"{name}={environ.get(name)!r}: expected one of {', '.join(choices)}")
    return value
