"""A prompt's images between the client's view and the engine's tokens.

The engine widens each image to a run of placeholder tokens and names an image it refuses by
its place in ``GenerationRequest.images``; a rendered prefix of the conversation must count its
images as the prompt does, and an error must name the field the client sent the image in.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby

from ninfer_runtime.errors import RequestError

__all__ = ["blamed", "widened"]


def widened(
    encode: Callable[[str], list[int]], prompt: list[int], pad: int
) -> Callable[[str], list[int]]:
    """``encode`` with the k-th image placeholder of its tokens widened to the k-th image's
    run of placeholders in ``prompt`` (the engine's render, images widened): a rendered
    prefix of the conversation then counts its images as the prompt does, without decoding
    the images again."""
    runs = [len(list(run)) for is_pad, run in groupby(prompt, lambda t: t == pad) if is_pad]

    def widened_encode(text: str) -> list[int]:
        out: list[int] = []
        seen = 0
        for token in encode(text):
            if token == pad and seen < len(runs):
                out += [pad] * runs[seen]
                seen += 1
            else:
                out.append(token)
        return out

    return widened_encode


def blamed(exc: RequestError, params: list[str | None], prompt_param: str) -> RequestError:
    """``exc``, an engine error about the request's images, naming the client's field: the
    engine names an image by its place in ``GenerationRequest.images`` (``images[i]``), or
    all of them (``images``: their count or tokens, or a model that takes none), which is
    the conversation's field (``messages``, ``input``)."""
    param = exc.param or ""
    field: str | None = prompt_param
    if param.startswith("images[") and "]" in param:
        digits = param[len("images[") : param.index("]")]
        index = int(digits) if digits.isdigit() else len(params)
        field = params[index] if index < len(params) else None
    if field is None:
        return exc
    message = str(exc)
    if field != prompt_param and not message.startswith(field):
        message = f"{field}: {message}"
    return RequestError(message, param=field, code=exc.code)
