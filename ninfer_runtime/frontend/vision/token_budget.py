"""GLM5Next's image sizing (transformers' ``Glm5NextImageProcessor``): a canvas whose sides are
multiples of the merged-token span, holding between ``min_image_tokens`` and
``max_image_tokens`` merged tokens, with the image resized into its top-left corner (aspect
ratio kept, never enlarged unless below the minimum) and the rest padded with black.

Qwen's processor (``processor.smart_resize``) instead stretches the whole image to the canvas;
everything after the pixels are laid out (rescale, normalise, patch order) is the same.
"""

from __future__ import annotations

import math

from .errors import ImageError


def _up(value: int, factor: int) -> int:
    return math.ceil(value / factor) * factor


def canvas(
    height: int, width: int, factor: int, temporal: int, min_tokens: int, max_tokens: int
) -> tuple[int, int]:
    """(height, width) of the padded canvas, multiples of ``factor``: the image's sides rounded
    up, scaled up to ``min_tokens`` or down to at most ``max_tokens`` merged tokens (one merged
    token spans ``temporal`` frames of factor × factor pixels; a still image is ``temporal``
    identical frames)."""
    frames = temporal  # a still image fills exactly one temporal patch
    least, most = (n * temporal * factor * factor for n in (min_tokens, max_tokens))
    h, w = _up(height, factor), _up(width, factor)
    if frames * h * w < least:
        scale = math.sqrt(least / (frames * height * width))
        h = _up(max(1, math.ceil(height * scale)), factor)
        w = _up(max(1, math.ceil(width * scale)), factor)
    if frames * h * w <= most:
        return h, w
    if most < frames * factor * factor:
        raise ImageError(f"max_image_tokens {max_tokens} leaves no room for one merged token")
    # the tallest content height whose rounded-up canvas still fits the budget
    best, low, high = (factor, factor), 1, height
    while low <= high:
        content = (low + high) // 2
        h = _up(content, factor)
        w = _up(max(1, math.floor(width * content / height)), factor)
        if frames * h * w <= most:
            best, low = (h, w), content + 1
        else:
            high = content - 1
    return best


def content_size(
    height: int,
    width: int,
    canvas_size: tuple[int, int],
    temporal: int,
    factor: int,
    min_tokens: int,
) -> tuple[int, int]:
    """(height, width) the image is resized to inside the canvas: scaled by the tighter side,
    not enlarged when it already holds ``min_tokens`` merged tokens."""
    canvas_height, canvas_width = canvas_size
    scale = min(canvas_height / height, canvas_width / width)
    if temporal * height * width >= temporal * factor * factor * min_tokens:
        scale = min(1.0, scale)
    return (
        max(1, min(canvas_height, math.floor(height * scale))),
        max(1, min(canvas_width, math.floor(width * scale))),
    )
