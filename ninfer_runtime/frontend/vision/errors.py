"""The one error type of image input."""

from __future__ import annotations

from ninfer_runtime.errors import RequestError


class ImageError(RequestError):
    """An image the request supplied cannot be used (not an image, truncated, too large, an
    aspect ratio the processor refuses): the caller's fault, so a ``RequestError`` (HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = "image"):
        super().__init__(message, param=param, code="invalid_image")
