"""The whole configuration (``Settings``, one field per TOML table) and what is derived from
more than one table: the request-body bound, the image limits, the engine's vision options, and
``max_context`` fitted to the model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from .engine import (
    ContextCacheSettings,
    EngineSettings,
    ParallelSettings,
    SpeculativeSettings,
)
from .media import MediaSettings, VisionSettings
from .server import ServerSettings
from .table import ConfigError, Table

if TYPE_CHECKING:
    from ninfer_runtime.images import VisionOptions

    from ..image_reader import ImageLimits

__all__ = ["BODY_BYTES_PER_TOKEN", "Settings", "fit_to_model"]

#: A generous bound on request-body bytes per prompt token: text is about 4 bytes a token,
#: JSON-escaped CJK (``\uXXXX``) about 9. The default body limit is the context times this,
#: at least 1 MiB. It also bounds the parsing and validation a body costs on the event loop
#: (about 0.1 s per MiB of the smallest messages).
BODY_BYTES_PER_TOKEN = 32
_MIB = 1024 * 1024


class Settings(Table):
    """The whole configuration: the seven TOML tables."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    context_cache: ContextCacheSettings = Field(default_factory=ContextCacheSettings)
    speculative: SpeculativeSettings = Field(default_factory=SpeculativeSettings)
    parallel: ParallelSettings = Field(default_factory=ParallelSettings)
    vision: VisionSettings = Field(default_factory=VisionSettings)
    media: MediaSettings = Field(default_factory=MediaSettings)

    def vision_options(self) -> VisionOptions:
        """The engine's image settings (``ninfer_runtime.images.VisionOptions``)."""
        from ninfer_runtime.engine import VisionOptions, parse_size

        return VisionOptions(
            enabled=self.vision.enabled,
            max_images=self.server.max_images_per_request,
            max_image_pixels=self.vision.max_image_pixels,
            max_image_tokens=self.vision.max_image_tokens,
            cache_capacity=parse_size(self.media.cache_capacity, "media cache capacity") or 0,
        )

    @property
    def max_request_bytes(self) -> int:
        server = self.server
        if server.max_request_mib is not None:
            return int(server.max_request_mib * _MIB)
        text = max(self.engine.max_context * BODY_BYTES_PER_TOKEN, _MIB)
        if server.max_images_per_request == 0:
            return text
        return text + -(-self.image_limits.max_bytes * 4 // 3)  # one image, base64

    @property
    def image_limits(self) -> ImageLimits:
        """What a request may send as images (``image_reader.ImageReader``)."""
        from ..image_reader import ImageLimits

        server = self.server
        return ImageLimits(
            max_bytes=int(server.max_image_mib * _MIB),
            max_images=server.max_images_per_request,
            allow_urls=server.allow_image_urls,
            fetch_timeout_s=server.image_fetch_timeout_s,
        )


def fit_to_model(settings: Settings, positions: int | None) -> None:
    """Clamp a default ``max_context`` to the model's ``positions`` (its
    ``max_position_embeddings``); an explicit larger value is a ``ConfigError``."""
    engine = settings.engine
    if positions is None or engine.max_context <= positions:
        return
    if "max_context" in engine.model_fields_set:
        raise ConfigError(
            f"max_context {engine.max_context} is more than the model's {positions} positions "
            f"(its max_position_embeddings); give {positions} or less"
        )
    engine.max_context = positions
