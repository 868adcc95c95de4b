"""The request ``ninfer`` sends, from its flags: the chat messages and the images.

``--prompt`` or ``--messages`` (a JSON file) give the messages, ``--system`` a system message
put first, and each ``--image`` an image part put before the last user message's text. An
error the engine raises about the request's i-th image names the file it came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from .errors import RequestError


def chat_messages(
    prompt: str | None, messages_file: Path | None, system: str | None, images: int = 0
) -> list[Any]:
    """The chat messages of ``--prompt`` or ``--messages``, with ``images`` image parts
    (``with_images``) and the ``--system`` message first."""
    if messages_file is not None:
        try:
            data = json.loads(messages_file.read_text())
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"{messages_file}: {exc}", param_hint="--messages") from None
        messages = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(messages, list):
            raise click.BadParameter(
                'expected a JSON list of messages (or {"messages": [...]})', param_hint="--messages"
            )
    else:
        messages = [{"role": "user", "content": prompt}]
    if images:
        messages = with_images(messages, images)
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    return messages


def with_images(messages: list[Any], images: int) -> list[Any]:
    """``messages`` with ``images`` image parts put first in the last user message, before
    its text (``--image`` files, in the order given)."""
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise click.BadParameter("--image needs a user message to go with", param_hint="--image")
    last = dict(messages[users[-1]])
    content = last.get("content")
    text = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    last["content"] = [*({"type": "image"} for _ in range(images)), *text]
    return [*messages[: users[-1]], last, *messages[users[-1] + 1 :]]


def read_images(paths: tuple[Path, ...]) -> list[Any]:
    """The ``--image`` files' bytes as the request's images; a file that cannot be read is
    a usage error naming it."""
    from .media import ImageInput

    images = []
    for path in paths:
        try:
            images.append(ImageInput(path.read_bytes()))
        except OSError as exc:
            message = f"{path}: {exc.strerror or exc}"
            raise click.BadParameter(message, param_hint="--image") from None
    return images


def named_image_errors(events: Iterator[Any], files: tuple[Path, ...]) -> Iterator[Any]:
    """``events``, with an error about the request's i-th image (``param`` ``images[i]``)
    naming its file instead."""
    try:
        yield from events
    except RequestError as exc:
        param = exc.param or ""
        index = param[len("images[") : -1] if param.startswith("images[") else ""
        if not index.isdigit() or int(index) >= len(files):
            raise
        raise RequestError(f"{files[int(index)]}: {exc}", param=param, code=exc.code) from None
