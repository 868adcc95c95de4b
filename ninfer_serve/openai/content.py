"""Content parts of Chat messages and Responses input: text as it is, images as image parts.

Images come where OpenAI takes them and the chat template can write them: Chat
``image_url`` parts in user messages; Responses ``input_image`` parts in user messages and
in a ``function_call_output``'s output (a tool message). Anywhere else (Qwen templates
refuse images in a system message), and for media the server does not take (audio, files),
one 400 names the part. ``detail`` is accepted and changes nothing: the model's image
processor decides the resolution an image is seen at.
"""

from __future__ import annotations

from typing import Any

from ..errors import ApiError, invalid_request, shown
from ..images import data_url_image, image_part

__all__ = ["chat_content", "input_image"]

_TEXT_PARTS = ("text", "input_text", "output_text", "refusal")
_DETAILS = ("auto", "low", "high")


def _unsupported(kind: Any, where: str, why: str) -> ApiError:
    return ApiError(
        400,
        f"{where}: content part type {shown(kind)} {why}",
        code="unsupported_content",
        param=f"{where}.type",
    )


def _detail(part: dict[str, Any], where: str) -> None:
    detail = part.get("detail")
    if detail is not None and detail not in _DETAILS:
        raise invalid_request(
            f"{where}.detail must be one of {', '.join(_DETAILS)}, not {shown(detail)}",
            f"{where}.detail",
        )


def chat_content(messages: list[dict[str, Any]]) -> None:
    """Turn the ``image_url`` parts of Chat ``messages`` into image parts, in place; refuse
    other media and images outside user messages."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _TEXT_PARTS:
                continue
            if kind != "image_url":
                raise _unsupported(kind, where, "is not supported (text and image_url)")
            if message.get("role") != "user":
                raise _unsupported(kind, where, "is only taken in user messages")
            image = part.get("image_url")
            if not isinstance(image, dict):
                raise invalid_request(
                    f"{where}.image_url must be an object with a url", f"{where}.image_url"
                )
            _detail(image, f"{where}.image_url")
            content[j] = image_part(data_url_image(image.get("url"), f"{where}.image_url.url"))


def input_image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """The image part for a Responses ``input_image`` part at ``where``."""
    if part.get("file_id") is not None:
        raise ApiError(
            400,
            f"{where}.file_id: uploaded files are not supported; send the image in image_url "
            "as a data URL",
            code="unsupported_parameter",
            param=f"{where}.file_id",
        )
    _detail(part, where)
    return image_part(data_url_image(part.get("image_url"), f"{where}.image_url"))
