"""Every exception a route raises as an error response in the shape of the API its path
belongs to, with a code: Litestar's own (unknown route, 405, 413, bad JSON, validation) and ours.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import ClientException, HTTPException, ValidationException

from .errors import ApiError, from_exception, validation_failed
from .gate import REQUEST_ID, is_anthropic
from .http import ClientGone

__all__ = ["JsonRequest", "error_response"]

log = logging.getLogger("ninfer_serve")


class JsonRequest(Request[Any, Any, Any]):
    """Litestar's request, with a body nested deeper than the JSON decoder goes as a 400."""

    async def json(self) -> Any:
        try:
            return await super().json()
        except RecursionError:
            raise ClientException("the JSON body is nested too deeply") from None


def _http_error(exc: HTTPException) -> ApiError:
    """Litestar's own errors (404 route, 405, 413, bad JSON, validation) as ``ApiError``."""
    if exc.status_code >= 500:
        log.error("error while serving a request", exc_info=exc)
    error = _http_error_of(exc)
    error.headers = {**(exc.headers or {}), **error.headers}  # 405 keeps its Allow header
    return error


def _http_error_of(exc: HTTPException) -> ApiError:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        problems = exc.extra if isinstance(exc.extra, list) else []
        return validation_failed(map(_problem, problems), len(problems))
    if status == 413:
        return ApiError(
            413,
            "the request body is larger than the server's limit (--max-request-mib)",
            code="request_too_large",
        )
    if status == 404:
        return ApiError(404, "no such endpoint", code="not_found")
    if status == 405:
        return ApiError(405, "method not allowed for this endpoint", code="method_not_allowed")
    if status == 400:
        return ApiError(400, f"invalid request: {exc.detail}", code="invalid_json")
    return ApiError(status, str(exc.detail), code="http_error")


def _problem(problem: Any) -> tuple[str | None, str]:
    """(path, text) of one of Litestar's validation messages."""
    if not isinstance(problem, dict):
        return None, str(problem)
    if problem.get("key") == "data":
        return None, "the request body is missing or is not a JSON object"
    return problem.get("key"), str(problem.get("message"))


def error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, ClientGone):  # nobody reads it; the access log shows 499
        error = ApiError(499, "the client disconnected", code="client_closed_request")
    elif isinstance(exc, HTTPException):
        error = _http_error(exc)
    else:
        error = from_exception(exc)
    if is_anthropic(request.url.path):
        status, body = error.anthropic(request.scope.get(REQUEST_ID))  # type: ignore[call-overload]
    else:
        status, body = error.openai()
    return Response(body, status_code=status, headers=error.headers)
