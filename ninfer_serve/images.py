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

The protocol modules only read shapes (they know no server settings);
``image_reader.ImageReader`` reads the sources after admission, within the server's limits.
Every refusal is one 400 naming the client's field. ``split_images`` then gives the engine
its messages, each image a ``{"type": "image"}`` part, and the images in order.
Whether the bytes are an image the model can take (format, truncation, pixel count) is the
engine's to say when it validates the request (``ImageError``, also a 400).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.media import ImageInput

from .errors import ApiError, shown

__all__ = [
    "Base64Image",
    "ImageSource",
    "RemoteImage",
    "base64_size",
    "data_url_image",
    "image_bytes",
    "image_part",
    "image_parts",
    "invalid_image",
    "param_of",
    "read_into",
    "source_of",
    "split_images",
    "url_image",
]

#: the content-part keys that hold an image's source and its client field until
#: ``split_images`` takes them out
_SOURCE = "ninfer_image_source"
_PARAM = "ninfer_image_param"


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


def invalid_image(message: str, param: str, code: str = "invalid_image") -> ApiError:
    """The 400 for an image at client field ``param``."""
    return ApiError(400, f"{param}: {message}", code=code, param=param)


def base64_size(data: str) -> int:
    """The bytes ``data`` decodes to, if it is valid base64 (whitespace aside)."""
    return len(data) * 3 // 4 - data.count("=", max(len(data) - 2, 0))


def data_url_image(url: Any, param: str) -> Base64Image | RemoteImage:
    """The image a Chat or Responses ``image_url`` names: a base64 ``data:image/...`` URL, or
    an ``http(s)`` URL; anything else is refused naming ``param``."""
    if not isinstance(url, str) or not url:
        raise invalid_image(
            "expected a data URL (data:image/png;base64,...) or an image URL", param
        )
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        return url_image(url, param)
    if scheme != "data":
        raise invalid_image(
            f"{shown(url, 40)} is not a data URL (data:image/png;base64,...) or an http(s) URL",
            param,
        )
    head, comma, payload = url[5:].partition(",")
    if not comma:
        raise invalid_image("a data URL needs a comma before its data", param)
    media_type, *params = head.split(";")
    media_type = media_type.strip().lower()
    if not media_type.startswith("image/"):
        raise invalid_image(
            f"a data URL of media type {shown(media_type or 'text/plain')}; expected an "
            "image (image/png, image/jpeg, image/webp, image/gif)",
            param,
        )
    if "base64" not in (p.strip().lower() for p in params):
        raise invalid_image(
            f"expected a base64 data URL (data:{media_type};base64,...), not percent-encoded data",
            param,
        )
    return Base64Image(payload, param)


def url_image(url: Any, param: str) -> RemoteImage:
    """An ``http(s)`` image URL from ``param`` (whether it is fetched, ``ImageReader`` says)."""
    if not isinstance(url, str) or url.split(":", 1)[0].lower() not in ("http", "https"):
        raise invalid_image(f"expected an http(s) URL, not {shown(url, 40)}", param)
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
        if not isinstance(content, list) or not any(map(source_of, _parts(content))):
            out.append(message)
            continue
        parts = []
        for part in content:
            source = source_of(part) if isinstance(part, dict) else None
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
    sources = (part[_SOURCE] for part in image_parts(messages))
    return sum(len(s.data) for s in sources if isinstance(s, ImageInput))


def _parts(content: list[Any]) -> Iterator[dict[str, Any]]:
    return (p for p in content if isinstance(p, dict))


def source_of(part: dict[str, Any]) -> ImageSource | None:
    """The image source ``image_part`` put in ``part`` (a client's JSON can name the key
    too, but never give it one of these objects)."""
    source = part.get(_SOURCE)
    return source if isinstance(source, Base64Image | RemoteImage | ImageInput) else None


def image_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The image parts of ``messages``, in order."""
    return [
        part
        for message in messages
        if isinstance(message.get("content"), list)
        for part in _parts(message["content"])
        if source_of(part) is not None
    ]


def read_into(part: dict[str, Any], image: ImageInput) -> None:
    """Put the bytes read for an image part's source in its place."""
    part[_SOURCE] = image


def param_of(part: dict[str, Any]) -> str | None:
    """The client field an image part came from."""
    return part.get(_PARAM)
