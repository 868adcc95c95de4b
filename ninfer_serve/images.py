"""Images in requests: the three APIs' shapes as one kind of content part, read at the edge.

A Chat ``image_url`` part, a Responses ``input_image`` part and an Anthropic ``image`` block
each become ``image_part(source)`` in the conversation a ``Job`` carries, where the part
keeps where the image comes from:

- ``Base64Image``: the data as the client sent it (a data URL's payload, a base64 block),
  not decoded yet;
- ``RemoteImage``: an ``http(s)`` URL, fetched only on a server started with
  ``--allow-image-urls`` (off by default: a server that fetches what a request names can be
  made to reach hosts its clients cannot, such as a cloud metadata address);
- ``ImageInput``: bytes read already (a stored Responses conversation's images).

The protocol modules only read shapes (they know no server settings); ``ImageReader.read``
runs after admission, in the generator: it checks the request's image count and each
image's size, decodes the base64 (in a worker thread) and fetches the URLs, bounded in bytes
and time. Every refusal is one 400 naming the client's field. ``split_images`` then gives
the engine its messages, each image a ``{"type": "image"}`` part, and the images in order.
Whether the bytes are an image the model can take (format, truncation, pixel count) is the
engine's to say when it validates the request (``ImageError``, also a 400).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.media import ImageInput

from .errors import ApiError, shown

__all__ = [
    "Base64Image",
    "ImageLimits",
    "ImageReader",
    "RemoteImage",
    "base64_size",
    "data_url_image",
    "image_bytes",
    "image_part",
    "split_images",
    "url_image",
]

#: the content-part keys that hold an image's source and its client field until
#: ``split_images`` takes them out
_SOURCE = "ninfer_image_source"
_PARAM = "ninfer_image_param"
#: redirects an image URL may take (a CDN's one or two; more is a loop or a trick)
MAX_REDIRECTS = 3
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


@dataclass(frozen=True)
class Base64Image:
    """Base64 text from field ``param`` (decoded by ``ImageReader``)."""

    data: str
    param: str

    def __repr__(self) -> str:
        return f"Base64Image({len(self.data)} characters from {self.param})"


@dataclass(frozen=True)
class RemoteImage:
    """An ``http(s)`` URL from field ``param`` (fetched by ``ImageReader``)."""

    url: str
    param: str


ImageSource = Base64Image | RemoteImage | ImageInput


def image_part(source: ImageSource) -> dict[str, Any]:
    """The conversation's content part for an image."""
    return {"type": "image", _SOURCE: source, _PARAM: getattr(source, "param", None)}


def _invalid(message: str, param: str, code: str = "invalid_image") -> ApiError:
    return ApiError(400, f"{param}: {message}", code=code, param=param)


def base64_size(data: str) -> int:
    """The bytes ``data`` decodes to, if it is valid base64 (whitespace aside)."""
    return len(data) * 3 // 4 - data.count("=", max(len(data) - 2, 0))


def data_url_image(url: Any, param: str) -> Base64Image | RemoteImage:
    """The image a Chat or Responses ``image_url`` names: a base64 ``data:image/...`` URL, or
    an ``http(s)`` URL; anything else is refused naming ``param``."""
    if not isinstance(url, str) or not url:
        raise _invalid("expected a data URL (data:image/png;base64,...) or an image URL", param)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        return url_image(url, param)
    if scheme != "data":
        raise _invalid(
            f"{shown(url, 40)} is not a data URL (data:image/png;base64,...) or an http(s) URL",
            param,
        )
    head, comma, payload = url[5:].partition(",")
    if not comma:
        raise _invalid("a data URL needs a comma before its data", param)
    media_type, *params = head.split(";")
    media_type = media_type.strip().lower()
    if not media_type.startswith("image/"):
        raise _invalid(
            f"a data URL of media type {shown(media_type or 'text/plain')}; expected an "
            "image (image/png, image/jpeg, image/webp, image/gif)",
            param,
        )
    if "base64" not in (p.strip().lower() for p in params):
        raise _invalid(
            f"expected a base64 data URL (data:{media_type};base64,...), not percent-encoded data",
            param,
        )
    return Base64Image(payload, param)


def url_image(url: Any, param: str) -> RemoteImage:
    """An ``http(s)`` image URL from ``param`` (whether it is fetched, ``ImageReader`` says)."""
    if not isinstance(url, str) or url.split(":", 1)[0].lower() not in ("http", "https"):
        raise _invalid(f"expected an http(s) URL, not {shown(url, 40)}", param)
    return RemoteImage(url, param)


def split_images(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[ImageInput], list[str | None]]:
    """(the messages with each image part as ``{"type": "image"}``, the images in order, the
    client field each image came from). The messages given are left as they are (a stored
    Responses conversation keeps them); those without images are passed on as they are.
    Every image must have been read (``ImageReader.read``)."""
    out: list[dict[str, Any]] = []
    images: list[ImageInput] = []
    params: list[str | None] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list) or not any(map(_source, _parts(content))):
            out.append(message)
            continue
        parts = []
        for part in content:
            source = _source(part) if isinstance(part, dict) else None
            if source is None:
                parts.append(part)
                continue
            if not isinstance(source, ImageInput):
                raise AssertionError(f"{source!r} was not read before the prompt was built")
            parts.append({"type": "image"})
            images.append(source)
            params.append(part.get(_PARAM))
        out.append({**message, "content": parts})
    return out, images, params


def image_bytes(messages: list[dict[str, Any]]) -> int:
    """The bytes of the images read into ``messages`` (a stored conversation's)."""
    sources = (part[_SOURCE] for part in _image_parts(messages))
    return sum(len(s.data) for s in sources if isinstance(s, ImageInput))


def _parts(content: list[Any]) -> Iterator[dict[str, Any]]:
    return (p for p in content if isinstance(p, dict))


def _source(part: dict[str, Any]) -> ImageSource | None:
    """The image source ``image_part`` put in ``part`` (a client's JSON can name the key
    too, but never give it one of these objects)."""
    source = part.get(_SOURCE)
    return source if isinstance(source, Base64Image | RemoteImage | ImageInput) else None


def _image_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        part
        for message in messages
        if isinstance(message.get("content"), list)
        for part in _parts(message["content"])
        if _source(part) is not None
    ]


class ImageReader:
    """Reads a request's image sources into ``ImageInput``s within ``limits``."""

    def __init__(self, limits: ImageLimits):
        self.limits = limits

    async def read(self, messages: list[dict[str, Any]]) -> None:
        """Turn every image source in ``messages`` into an ``ImageInput``, in place."""
        parts = _image_parts(messages)
        if not parts:
            return
        limits = self.limits
        if len(parts) > limits.max_images:
            first = parts[limits.max_images][_PARAM]
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
        for part in parts:
            source = part[_SOURCE]
            if isinstance(source, RemoteImage) and not limits.allow_urls:
                raise _invalid(
                    "image URLs are not fetched by this server (start it with "
                    "--allow-image-urls); send the image as base64 data",
                    source.param,
                    code="image_url_not_allowed",
                )
            if isinstance(source, Base64Image) and base64_size(source.data) > limits.max_bytes:
                raise self._too_large(base64_size(source.data), source.param)
        encoded = [p for p in parts if isinstance(p[_SOURCE], Base64Image)]
        if encoded:
            decoded = await asyncio.to_thread(self._decode, [p[_SOURCE] for p in encoded])
            for part, image in zip(encoded, decoded, strict=True):
                part[_SOURCE] = image
        remote = [p for p in parts if isinstance(p[_SOURCE], RemoteImage)]
        if remote:
            fetched = await self._fetch_all([p[_SOURCE] for p in remote])
            for part, image in zip(remote, fetched, strict=True):
                part[_SOURCE] = image

    def _too_large(self, size: int, param: str) -> ApiError:
        return _invalid(
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
                    raise _invalid("not valid base64 data", source.param) from None
            if not raw:
                raise _invalid("the image data is empty", source.param)
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
            raise _invalid(f"{where}: no image within {seconds:g} s", source.param) from None
        except httpx.TooManyRedirects:
            raise _invalid(f"{where}: more than {MAX_REDIRECTS} redirects", source.param) from None
        except httpx.HTTPError as exc:
            problem = str(exc) or type(exc).__name__
            raise _invalid(f"{where}: {shown(problem, 120)}", source.param) from None

    async def _download(self, client: Any, source: RemoteImage, where: str) -> ImageInput:
        limit = self.limits.max_bytes
        async with client.stream("GET", source.url, headers={"accept": "image/*"}) as response:
            if response.status_code != 200:
                raise _invalid(f"{where}: HTTP {response.status_code}", source.param)
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind and not (kind.startswith("image/") or kind in _OPAQUE_TYPES):
                raise _invalid(f"{where}: content type {shown(kind)}, not an image", source.param)
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
            raise _invalid(f"{where}: an empty body", source.param)
        return ImageInput(b"".join(chunks))


#: content types a server may give an image file it does not recognise
_OPAQUE_TYPES = frozenset({"application/octet-stream", "binary/octet-stream"})
