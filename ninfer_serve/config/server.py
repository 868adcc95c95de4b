"""``[server]``: the HTTP side (address, API key, CORS, request and image bounds, timeouts)."""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .table import Table

__all__ = ["ServerSettings", "is_loopback"]


class ServerSettings(Table):
    """``[server]``: the HTTP side."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    api_key: str | None = None
    #: The model name clients send; None: the artifact file's name without ``.ninfer`` (as
    #: vLLM serves the model it was given). ``model_id`` is its older spelling.
    served_model_name: str | None = Field(None, min_length=1)
    allow_insecure: bool = False
    #: None: sized for the context (``max_context`` × ``BODY_BYTES_PER_TOKEN``, at least 1 MiB)
    #: plus one image of ``max_image_mib`` in base64 (when images are taken)
    max_request_mib: float | None = Field(None, gt=0)
    #: Images (``image_reader.py``): the bytes of one image (decoded or fetched), the images of
    #: one request (0: no image input), whether ``http(s)`` image URLs are fetched (off: a
    #: server that fetches what requests name can be made to reach hosts clients cannot),
    #: and the seconds a fetch may take.
    max_image_mib: float = Field(10, gt=0)
    max_images_per_request: int = Field(16, ge=0)
    allow_image_urls: bool = False
    image_fetch_timeout_s: float = Field(10, gt=0)
    #: Used when a request gives no max_tokens (None: the rest of the context).
    default_max_tokens: int | None = Field(None, ge=1)
    #: Template default for requests that do not say (None: the template's own default).
    enable_thinking: bool | None = None
    response_store_max_records: int = Field(1024, ge=0)
    #: Seconds a Ctrl-C waits for running requests before cancelling them.
    drain_timeout_s: float = Field(30, ge=0)
    #: An SSE comment is sent after this many seconds without an event (proxies drop idle
    #: connections, and a queued or long-prefilling request is otherwise silent).
    keepalive_s: float = Field(5, gt=0)
    #: Seconds an idle connection is kept open between requests (HTTP keep-alive).
    keep_alive_timeout_s: float = Field(5, gt=0)
    #: Seconds a request head may take to arrive in full, from the connection's opening or
    #: its first byte after a response; a slower one is answered 408 and closed (slowloris).
    header_timeout_s: float = Field(10, gt=0)
    #: Connections served at once; more are answered 503 and closed. None: 4096, or fewer
    #: when the descriptor limit (``ulimit -n``, raised to its hard limit) leaves less.
    max_connections: int | None = Field(None, ge=1)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    #: Origins whose web pages may call the server (CORS, ``cors.py``): ``scheme://host[:port]``
    #: or ``*``, as a list or one comma-separated string; None or empty: no CORS headers at all.
    allowed_origins: list[str] | None = None
    #: Let those pages send cookies and HTTP authentication (never with ``*``).
    allow_credentials: bool = False

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        from ..cors import check_origin

        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [check_origin(o) if isinstance(o, str) else o for o in value]
        return value

    @model_validator(mode="after")
    def _credentials(self) -> ServerSettings:
        if self.allow_credentials and not self.allowed_origins:
            raise ValueError("allow_credentials needs allowed_origins")
        if self.allow_credentials and "*" in (self.allowed_origins or ()):
            raise ValueError(
                "allow_credentials cannot go with allowed_origins '*' (browsers refuse "
                "credentials for any origin); list the origins"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _older_names(cls, data: Any) -> Any:
        # the older key still works; the newer wins when a file and a flag give both
        if isinstance(data, dict) and "model_id" in data:
            data = dict(data)
            data.setdefault("served_model_name", data.pop("model_id"))
        return data


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
