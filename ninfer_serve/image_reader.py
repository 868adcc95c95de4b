"""Reading a request's images within the server's limits, after admission.

``ImageReader.read`` checks the request's image count and each image's size (a base64
one's from its length, before decoding), decodes the base64 (in a worker thread, as it may
be megabytes) and fetches ``http(s)`` URLs when the server allows them (``httpx``, at most
``MAX_REDIRECTS`` redirects, ``max_bytes`` bytes, ``fetch_timeout_s`` seconds for each URL in
all), putting an ``ImageInput`` in each image part's place. Every refusal is one 400 naming
the client's field.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.media import ImageInput

from .errors import ApiError, shown
from .images import (
    Base64Image,
    RemoteImage,
    base64_size,
    image_parts,
    invalid_image,
    param_of,
    read_into,
    source_of,
)

__all__ = ["MAX_REDIRECTS", "ImageLimits", "ImageReader"]

#: redirects an image URL may take (a CDN's one or two; more is a loop or a trick)
MAX_REDIRECTS = 3
#: content types a server may give an image file it does not recognise
_OPAQUE_TYPES = frozenset({"application/octet-stream", "binary/octet-stream"})
_MIB = 1024 * 1024


@dataclass(frozen=True)
class ImageLimits:
    """What one request may send: ``max_images`` images (0: none), each at most ``max_bytes``
    bytes once decoded or fetched; URLs fetched only with ``allow_urls``, each within
    ``fetch_timeout_s`` seconds."""

    max_bytes: int = 10 * _MIB
    max_images: int = 16
    allow_urls: bool = False
    fetch_timeout_s: float = 10.0


class ImageReader:
    """Reads a request's image sources into ``ImageInput``s within ``limits``."""

    def __init__(self, limits: ImageLimits):
        self.limits = limits

    async def read(self, messages: list[dict[str, Any]]) -> None:
        """Turn every image source in ``messages`` into an ``ImageInput``, in place."""
        parts = image_parts(messages)
        if not parts:
            return
        limits = self.limits
        if len(parts) > limits.max_images:
            first = param_of(parts[limits.max_images])
            allowed = (
                "this server takes no images (--max-images-per-request 0)"
                if limits.max_images == 0
                else f"at most {limits.max_images} images a request (--max-images-per-request)"
            )
            raise ApiError(
                400,
                f"{len(parts)} images in the request; {allowed}",
                code="too_many_images",
                param=first,
            )
        encoded: list[tuple[dict[str, Any], Base64Image]] = []
        remote: list[tuple[dict[str, Any], RemoteImage]] = []
        for part in parts:
            source = source_of(part)
            if isinstance(source, RemoteImage):
                if not limits.allow_urls:
                    raise invalid_image(
                        "image URLs are not fetched by this server (start it with "
                        "--allow-image-urls); send the image as base64 data",
                        source.param,
                        code="image_url_not_allowed",
                    )
                remote.append((part, source))
            elif isinstance(source, Base64Image):
                size = base64_size(source.data)
                if size > limits.max_bytes:
                    raise self._too_large(size, source.param)
                encoded.append((part, source))
        if encoded:
            decoded = await asyncio.to_thread(self._decode, [s for _, s in encoded])
            for (part, _), image in zip(encoded, decoded, strict=True):
                read_into(part, image)
        if remote:
            fetched = await self._fetch_all([s for _, s in remote])
            for (part, _), image in zip(remote, fetched, strict=True):
                read_into(part, image)

    def _too_large(self, size: int, param: str) -> ApiError:
        return invalid_image(
            f"the image is {size / _MIB:.1f} MiB; this server takes at most "
            f"{self.limits.max_bytes / _MIB:g} MiB an image (--max-image-mib)",
            param,
            code="image_too_large",
        )

    def _decode(self, sources: list[Base64Image]) -> list[ImageInput]:
        images = []
        for source in sources:
            data = source.data
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                try:  # MIME-style base64 wraps its lines
                    raw = base64.b64decode("".join(data.split()), validate=True)
                except (binascii.Error, ValueError):
                    raise invalid_image("not valid base64 data", source.param) from None
            if not raw:
                raise invalid_image("the image data is empty", source.param)
            images.append(ImageInput(raw))
        return images

    async def _fetch_all(self, sources: list[RemoteImage]) -> list[ImageInput]:
        import httpx

        timeout = httpx.Timeout(self.limits.fetch_timeout_s)
        async with httpx.AsyncClient(
            timeout=timeout, follow_redirects=True, max_redirects=MAX_REDIRECTS, trust_env=False
        ) as client:
            return list(await asyncio.gather(*(self._fetch(client, s) for s in sources)))

    async def _fetch(self, client: Any, source: RemoteImage) -> ImageInput:
        import httpx

        seconds = self.limits.fetch_timeout_s
        where = f"fetching {shown(source.url, 80)}"
        try:
            async with asyncio.timeout(seconds):
                return await self._download(client, source, where)
        except TimeoutError:
            raise invalid_image(f"{where}: no image within {seconds:g} s", source.param) from None
        except httpx.TooManyRedirects:
            raise invalid_image(
                f"{where}: more than {MAX_REDIRECTS} redirects", source.param
            ) from None
        except httpx.HTTPError as exc:
            problem = str(exc) or type(exc).__name__
            raise invalid_image(f"{where}: {shown(problem, 120)}", source.param) from None

    async def _download(self, client: Any, source: RemoteImage, where: str) -> ImageInput:
        limit = self.limits.max_bytes
        async with client.stream("GET", source.url, headers={"accept": "image/*"}) as response:
            if response.status_code != 200:
                raise invalid_image(f"{where}: HTTP {response.status_code}", source.param)
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind and not (kind.startswith("image/") or kind in _OPAQUE_TYPES):
                raise invalid_image(
                    f"{where}: content type {shown(kind)}, not an image", source.param
                )
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                raise self._too_large(int(length), source.param)
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise self._too_large(size, source.param)
                chunks.append(chunk)
        if not size:
            raise invalid_image(f"{where}: an empty body", source.param)
        return ImageInput(b"".join(chunks))
