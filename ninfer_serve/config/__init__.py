"""Server settings: one pydantic model per TOML table, filled from ``--config`` then flags.

Why pydantic with ``extra="forbid"``: a misspelt key in a config file must stop the server with
a message naming the key, not be ignored while the server runs with a default the user did not
mean. Flags win over the file; both land in the same models, so validation happens once.

The tables: ``server`` (HTTP side), ``engine`` (``[engine]``, ``[context_cache]``,
``[speculative]``, ``[parallel]``), ``media`` (``[vision]``, ``[media]``); ``settings`` holds
them all and what is derived from several; ``loading`` reads the file and the flags.
"""

from __future__ import annotations

from .engine import (
    DEFAULT_MAX_CONTEXT,
    ContextCacheSettings,
    EngineSettings,
    ParallelSettings,
    SpeculativeSettings,
)
from .loading import load_settings
from .media import MediaSettings, VisionSettings
from .server import ServerSettings, is_loopback
from .settings import BODY_BYTES_PER_TOKEN, Settings, fit_to_model
from .table import ConfigError

__all__ = [
    "BODY_BYTES_PER_TOKEN",
    "DEFAULT_MAX_CONTEXT",
    "ConfigError",
    "ContextCacheSettings",
    "EngineSettings",
    "MediaSettings",
    "ParallelSettings",
    "ServerSettings",
    "Settings",
    "SpeculativeSettings",
    "VisionSettings",
    "fit_to_model",
    "is_loopback",
    "load_settings",
]
