"""Cross-origin requests (CORS): which web pages' scripts may call the server, and with what.

Off unless ``allowed_origins`` lists origins (``--allowed-origins``): then a request whose
``Origin`` is listed (or any, with ``*``) gets ``Access-Control-Allow-Origin`` on every
response, errors included, and a browser's preflight (``OPTIONS`` with ``Origin`` and
``Access-Control-Request-Method``) is answered here, before the API key is checked: a browser
sends a preflight without credentials, and it must succeed for the real request, which carries
them, to be sent. A request from an origin not listed is served as from any other client,
without the headers, so the browser keeps its answer from the page; a preflight from one is
answered 403.

Why not Litestar's ``CORSConfig``: it runs inside the application, after the key check (which
must not see preflights, and whose 401 a page must be able to read), and a path with its own
``OPTIONS`` handler would not answer preflights.

With ``allow_credentials`` the browser may send cookies and HTTP authentication, and the
response names the requesting origin; credentials with ``*`` are refused in the settings, as
browsers refuse them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["ALLOWED_METHODS", "CorsPolicy", "check_origin"]

#: the methods the API uses
ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
#: request headers a page may send: auth, JSON bodies, the two APIs' version and beta headers
#: and the official SDKs' own (``x-stainless-*``: their name, version and retry count)
_ALLOWED_HEADERS = frozenset(
    {
        "authorization",
        "content-type",
        "accept",
        "x-api-key",
        "x-request-id",
        "anthropic-version",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "openai-organization",
        "openai-project",
        "openai-beta",
    }
)
_ALLOWED_PREFIXES = ("x-stainless-",)
#: response headers a page may read beside the safelisted ones
_EXPOSED = b"x-request-id, request-id, retry-after"
#: seconds a browser may cache a preflight answer
_MAX_AGE = b"600"
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")


def check_origin(origin: str) -> str:
    """``origin`` as compared (lower case, no trailing slash), or ``ValueError`` naming it:
    ``*`` or ``scheme://host[:port]``, as a browser writes its ``Origin`` header."""
    value = origin.strip().lower().removesuffix("/")
    if value != "*" and not _ORIGIN.fullmatch(value):
        raise ValueError(
            f"origin {origin!r} is not '*' or scheme://host[:port] (such as http://localhost:3000)"
        )
    return value


def allowed_header(name: str) -> bool:
    return name in _ALLOWED_HEADERS or name.startswith(_ALLOWED_PREFIXES)


class CorsPolicy:
    """The headers cross-origin requests get, for the origins ``origins`` lists."""

    def __init__(self, origins: Sequence[str], allow_credentials: bool = False):
        self.any_origin = "*" in origins
        self.origins = frozenset(origins)
        self.allow_credentials = allow_credentials

    def allows(self, origin: str) -> bool:
        return self.any_origin or origin.lower().removesuffix("/") in self.origins

    def response_headers(self, origin: bytes | None) -> list[tuple[bytes, bytes]]:
        """Headers for any response to a request from ``origin`` (none: not allowed, or no
        ``Origin``); ``Vary: Origin`` whenever the answer depends on it, for caches."""
        vary = [] if self.any_origin and not self.allow_credentials else [(b"vary", b"Origin")]
        if origin is None:
            return vary
        if not self.allows(origin.decode("latin-1")):
            return vary
        # a wildcard answer cannot carry credentials: name the origin then
        named = not self.any_origin or self.allow_credentials
        out = [(b"access-control-allow-origin", origin if named else b"*")]
        if self.allow_credentials:
            out.append((b"access-control-allow-credentials", b"true"))
        out.append((b"access-control-expose-headers", _EXPOSED))
        return out + vary

    @staticmethod
    def is_preflight(method: str, headers: Mapping[bytes, bytes]) -> bool:
        return (
            method == "OPTIONS"
            and b"origin" in headers
            and b"access-control-request-method" in headers
        )

    def preflight_headers(self, headers: Mapping[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        """The answer's own headers (``response_headers`` adds the origin's): the methods,
        and of the request headers the browser asks about, those allowed (all of ours when
        it asks about none)."""
        asked = headers.get(b"access-control-request-headers", b"").decode("latin-1")
        names = [n.strip().lower() for n in asked.split(",") if n.strip()]
        allowed: Iterable[str] = [n for n in names if allowed_header(n)] if names else []
        shown = ", ".join(allowed or sorted(_ALLOWED_HEADERS))
        return [
            (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
            (b"access-control-allow-headers", shown.encode("latin-1")),
            (b"access-control-max-age", _MAX_AGE),
        ]

    async def answer_preflight(self, headers: Mapping[bytes, bytes], send: Any) -> bool:
        """Answer the preflight of an allowed origin (204, no body) through ``send``; False
        when the origin is not allowed (the caller refuses it)."""
        if not self.allows(headers[b"origin"].decode("latin-1")):
            return False
        start = {"type": "http.response.start", "status": 204}
        await send({**start, "headers": self.preflight_headers(headers)})
        await send({"type": "http.response.body", "body": b""})
        return True
