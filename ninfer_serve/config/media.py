"""``[vision]`` and ``[media]``: images in chat messages and the cache of encoded images."""

from __future__ import annotations

from pydantic import Field, field_validator

from .table import Table

__all__ = ["MediaSettings", "VisionSettings"]


class VisionSettings(Table):
    """``[vision]``: images in chat messages, for an artifact with a vision component (read at
    start-up). ``enabled = false``: the vision tower is not loaded and requests with images
    are refused. Per request, beside ``[server] max_images_per_request``: all its images
    together at most ``max_image_tokens`` tokens, each at most ``max_image_pixels`` pixels as
    stored in its file (checked on the header, before any pixel is decoded)."""

    enabled: bool = True
    max_image_tokens: int = Field(16384, ge=1)
    max_image_pixels: int = Field(40_000_000, ge=1)


class MediaSettings(Table):
    """``[media]``: ``cache_capacity``, the bytes of encoded images kept by their digest, so
    an image sent again (the next turn of a chat about it) skips the vision encoder; a size
    such as ``512MiB``, 0 for none."""

    cache_capacity: str = "128MiB"

    @field_validator("cache_capacity")
    @classmethod
    def _size(cls, value: str) -> str:
        from ninfer_runtime.engine import parse_size
        from ninfer_runtime.errors import EngineError

        try:
            parse_size(value, "media cache capacity")
        except EngineError as exc:
            raise ValueError(str(exc)) from None
        return value
