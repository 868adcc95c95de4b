"""One way to build the frontend's errors, so every message carries the field it blames."""

from __future__ import annotations

from ninfer_runtime.errors import EngineError, RequestError

__all__ = ["EngineError", "RequestError", "artifact_error", "request_error"]


def request_error(message: str, param: str | None = None) -> RequestError:
    """A ``RequestError`` naming ``param``.

    ``errors.py`` is shared with other parts of the engine; setting the attribute after
    construction keeps this working whatever constructor signature that module settles on.
    """
    error = RequestError(message)
    error.param = param
    return error


def artifact_error(role: str, problem: str) -> EngineError:
    """An ``EngineError`` for a frontend resource of the artifact that cannot be used."""
    return EngineError(f"artifact resource {role!r}: {problem}")
