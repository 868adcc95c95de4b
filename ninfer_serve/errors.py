"""HTTP errors in each API's own shape.

Why one type for all: the same failure (overload, a bad field, a queue timeout) must reach an
OpenAI client as ``{"error": {message, type, param, code}}`` and an Anthropic client as
``{"type": "error", "error": {type, message}}`` with the status codes each SDK retries on
(Anthropic: 529 for overload, 504 for timeouts). Handlers raise ``ApiError``; the app renders
it for the API the path belongs to.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from ninfer_runtime.errors import EngineError, RequestError

from .admission import EngineUnavailable, Overloaded, QueueTimeout

__all__ = [
    "AnthropicErrorBody",
    "ApiError",
    "OpenAIErrorBody",
    "anthropic_body",
    "from_exception",
    "invalid_request",
    "openai_body",
    "shown",
    "unsupported_parameter",
    "validation_failed",
]

log = logging.getLogger("ninfer_serve")

#: the most characters of an error message and of its ``param``: whatever a client sends (a
#: megabyte where a name belongs, half a million wrong list items), the error body stays a
#: few KiB, so building, encoding and sending it costs nothing noticeable
MAX_MESSAGE_CHARS = 2048
MAX_PARAM_CHARS = 256
#: the validation problems a 400 lists; the rest are counted
SHOWN_PROBLEMS = 5
#: the most characters of one listed problem's path and of its text
PROBLEM_CHARS = 160

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class _OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str


class OpenAIErrorBody(BaseModel):
    """The OpenAI error shape (for the OpenAPI schema; bodies are built by ``openai_body``)."""

    error: _OpenAIError


class _AnthropicError(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """The Anthropic error shape (for the OpenAPI schema)."""

    type: str = "error"
    error: _AnthropicError
    request_id: str | None = None


class ApiError(Exception):
    """An error response: status, message, machine-readable ``code`` and the blamed ``param``.

    ``code`` is required: clients branch on it, so no error goes out without one.
    ``anthropic_status`` is the status an Anthropic client gets when it differs (overload is
    429 for OpenAI clients and 529 for Anthropic ones).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        anthropic_status: int | None = None,
        headers: dict[str, str] | None = None,
    ):
        message = _bounded(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = None if param is None else _bounded(param, MAX_PARAM_CHARS)
        self.anthropic_status = anthropic_status or status
        self.headers = headers or {}

    def openai(self) -> tuple[int, dict[str, Any]]:
        return self.status, openai_body(self.status, self.message, self.code, self.param)

    def anthropic(self, request_id: str | None) -> tuple[int, dict[str, Any]]:
        return self.anthropic_status, anthropic_body(
            self.anthropic_status, self.message, request_id
        )


def invalid_request(message: str, param: str | None) -> ApiError:
    """A 400 for a field whose value the protocol module refuses."""
    return ApiError(400, message, code="invalid_request", param=param)


def unsupported_parameter(param: str, why: str) -> ApiError:
    """A 400 for a field this server does not implement (set to a value that would matter)."""
    return ApiError(400, f"{param}: {why}", code="unsupported_parameter", param=param)


def validation_failed(problems: Iterable[tuple[str | None, str]], total: int) -> ApiError:
    """The 400 for a body that fails validation: its first ``SHOWN_PROBLEMS`` ``(path, text)``
    problems, each cut to ``PROBLEM_CHARS``, and how many more there were (``total`` counts
    them all; ``problems`` is read no further than needed). ``param`` is the first path."""
    parts: list[str] = []
    param = None
    seen = 0
    for path, text in problems:
        if seen == SHOWN_PROBLEMS:
            break
        seen += 1
        text = _bounded(text, PROBLEM_CHARS)
        if path:
            path = _bounded(path, PROBLEM_CHARS)
            param = param or path
            text = f"{path}: {text}"
        if text not in parts:  # a body that is not an object is one problem per field
            parts.append(text)
    message = "; ".join(parts) or "the request body does not match the schema"
    if total > seen:
        message += f" (and {total - seen} more)"
    return ApiError(400, f"invalid request: {message}", code="invalid_request", param=param)


def _bounded(text: str, limit: int) -> str:
    """``text``, or its start and end around a note of how much was cut when it is longer
    than ``limit`` characters (the end of a message often says what was wrong)."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head, tail = text[: keep * 3 // 4], text[len(text) - keep // 4 :]
    return f"{head}...({len(text) - len(head) - len(tail)} characters cut)...{tail}"


def shown(value: object, limit: int = 80) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters (a client may send
    megabytes where a name belongs, and an error must not echo them back)."""
    if not isinstance(value, str):  # any JSON value where a string belongs
        text = repr(value)
        return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def openai_body(status: int, message: str, code: str, param: str | None) -> dict[str, Any]:
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def anthropic_body(status: int, message: str, request_id: str | None) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    if request_id:
        body["request_id"] = request_id
    return body


def from_exception(exc: BaseException) -> ApiError:
    """The response for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestError):
        return ApiError(400, str(exc), code=exc.code, param=exc.param)
    if isinstance(exc, Overloaded):
        return ApiError(
            429,
            str(exc),
            code="server_overloaded",
            anthropic_status=529,
            headers={"retry-after": "1"},
        )
    if isinstance(exc, QueueTimeout):
        return ApiError(
            503,
            str(exc),
            code="request_queue_timeout",
            anthropic_status=504,
            headers={"retry-after": "1"},
        )
    if isinstance(exc, EngineUnavailable):
        code = "model_loading" if exc.loading else "service_unavailable"
        headers = {"retry-after": "2"} if exc.loading else {}
        return ApiError(503, str(exc), code=code, headers=headers)
    log.error("error while serving a request", exc_info=exc)
    if isinstance(exc, EngineError):
        return ApiError(500, f"engine error: {exc}", code="engine_error")
    return ApiError(
        500, "internal server error; the server log has the details", code="internal_error"
    )
