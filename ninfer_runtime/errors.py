"""Error types of the inference engine.

Errors are types so callers (the server, the CLI) can map them to responses without parsing
messages: an ``EngineError`` is the engine's or the artifact's fault, a ``RequestError`` is the
caller's (a bad field, a bad message history) and maps to HTTP 400.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class: the engine cannot do what was asked; the message names what and why."""


class RequestError(EngineError):
    """A request is invalid; ``param`` names the offending field when one is to blame."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.param = param
        self.code = code


class ModelError(EngineError):
    """The artifact cannot be run: unknown architecture, missing component, bad geometry."""
