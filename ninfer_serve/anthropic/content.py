"""Anthropic content blocks as chat content: text blocks and ``image`` blocks, in order.

Images come where Anthropic takes them: in user messages and in a ``tool_result``'s content.
An image block's ``source`` is ``base64`` (``media_type`` image/*, ``data``) or, on a server
started with ``--allow-image-urls``, ``url``; ``file`` sources (the Files API) are refused by
name. Text blocks next to each other are joined with a newline, as a message of text blocks
alone is; with an image among them the content is a list of text and image parts.
"""

from __future__ import annotations

from typing import Any

from ..errors import ApiError, invalid_request, shown
from ..images import Base64Image, image_part, url_image

__all__ = ["Content", "image_block"]


def image_block(block: dict[str, Any], where: str) -> dict[str, Any]:
    """The image part for the ``image`` block at ``where``."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise invalid_request(f"{where}.source must be an object", f"{where}.source")
    kind = source.get("type")
    here = f"{where}.source"
    if kind == "base64":
        media_type = source.get("media_type")
        if not isinstance(media_type, str) or not media_type.lower().startswith("image/"):
            raise ApiError(
                400,
                f"{here}.media_type: {shown(media_type)} is not an image media type "
                "(image/jpeg, image/png, image/gif, image/webp)",
                code="invalid_image",
                param=f"{here}.media_type",
            )
        data = source.get("data")
        if not isinstance(data, str):
            raise invalid_request(f"{here}.data must be a base64 string", f"{here}.data")
        return image_part(Base64Image(data, f"{here}.data"))
    if kind == "url":
        return image_part(url_image(source.get("url"), f"{here}.url"))
    if kind == "file":
        raise ApiError(
            400,
            f"{here}: file sources (the Files API) are not supported; send the image as "
            "base64 data",
            code="unsupported_content",
            param=f"{here}.type",
        )
    raise invalid_request(f"{here}.type must be base64 or url, not {shown(kind)}", f"{here}.type")


class Content:
    """Chat content built block by block: ``text`` and ``image`` in order."""

    def __init__(self) -> None:
        self.parts: list[dict[str, Any]] = []

    def text(self, text: str) -> None:
        last = self.parts[-1] if self.parts else None
        if last is not None and last["type"] == "text":
            last["text"] += "\n" + text
        else:
            self.parts.append({"type": "text", "text": text})

    def image(self, part: dict[str, Any]) -> None:
        self.parts.append(part)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def value(self) -> str | list[dict[str, Any]]:
        """A string when there is no image (the text blocks joined), else the parts."""
        if any(part["type"] == "image" for part in self.parts):
            return self.parts
        return "".join(part["text"] for part in self.parts)
