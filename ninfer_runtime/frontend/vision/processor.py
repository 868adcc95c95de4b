"""Images -> the vision tower's ``pixel_values`` and ``grid_thw``, as the checkpoint's image
processor makes them.

Qwen3.5 checkpoints name ``Qwen2VLImageProcessor(Fast)`` in ``preprocessor_config.json``;
transformers 5.x runs it with its Pillow backend (``Qwen2VLImageProcessorPil``) when torchvision
is absent and with torchvision's resize when present. This is the Pillow backend step for step,
and it matches it exactly (bit for bit, tests/runtime/test_image_preprocessing.py):

    size      smart_resize: each side a multiple of factor = patch_size · merge_size, the area
              brought within [min_pixels, max_pixels] keeping the aspect ratio
    resize    Pillow ``Image.resize`` with the config's filter (bicubic) on the 8-bit image
    rescale   uint8 -> float64 · rescale_factor -> float32
    normalize (x - mean) / std in float32, per channel
    patches   [gh·gw, C·T·P·P] rows in merge-block order (the m×m patches of one merged token
              consecutive), the single frame repeated T = temporal_patch_size times

GLM5Next checkpoints name ``Glm5NextImageProcessor``: the same steps with ``sizing="tokens"``
(token_budget.py): the canvas holds ``min_image_tokens`` to ``max_image_tokens`` merged tokens,
the image is resized into its top-left corner keeping its aspect ratio, and the rest is black
(0 before rescaling, so ``-mean/std`` after).

torchvision's antialiased bicubic resize (float math, rounded back to 8 bits) is not Pillow's
fixed-point one: emulated with torch's ``interpolate``, ~10% of resized pixels differ, by 1 to 3
levels, i.e. up to ~3·2/255 in ``pixel_values`` for std 0.5. Pillow's numbers are the ones
transformers gives where torchvision is not installed, and the only ones reproducible here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import artifact_error
from ._pil import Image
from .decode import to_rgb
from .errors import ImageError
from .token_budget import canvas, content_size

ROLE = "preprocessor_config.json"
#: transformers' Qwen2VLImageProcessor class defaults (OPENAI_CLIP mean and std)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
#: smart_resize refuses images longer than this many times their width (or the reverse)
MAX_ASPECT_RATIO = 200
#: Pillow's filters by their numbers (the config's ``resample``): nearest, lanczos, bilinear,
#: bicubic, box, hamming
RESAMPLE_FILTERS = range(6)
#: how the canvas is sized: Qwen2-VL's pixel-area budget, or GLM5Next's merged-token budget
SIZINGS = ("area", "tokens")
#: transformers' Glm5NextImageProcessor class defaults (merged tokens an image)
DEFAULT_MIN_IMAGE_TOKENS = 16
DEFAULT_MAX_IMAGE_TOKENS = 8000


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """transformers' ``smart_resize``: (height, width) multiples of ``factor``, area within
    [min_pixels, max_pixels], aspect ratio kept as closely as that allows. Python's ``round``
    (half to even) as there."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageError(
            f"image is {width}x{height}; its aspect ratio must be at most {MAX_ASPECT_RATIO}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageProcessor:
    """The preprocessor_config.json settings the Qwen2-VL image processor uses."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    do_resize: bool = True
    resample: int = 3  # bicubic
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    do_convert_rgb: bool = True
    sizing: str = "area"
    min_image_tokens: int = DEFAULT_MIN_IMAGE_TOKENS  # sizing "tokens" only
    max_image_tokens: int = DEFAULT_MAX_IMAGE_TOKENS
    patch_expand_factor: int = 1

    @classmethod
    def from_config(cls, config: Mapping[str, Any], sizing: str = "area") -> ImageProcessor:
        """From the file's members, transformers' defaults for absent ones; other members
        (``image_processor_type``, ``processor_class``, ...) are ignored. ``sizing`` "area"
        (Qwen2-VL): ``size`` holds ``shortest_edge`` / ``longest_edge`` (the pixel budget;
        older files' ``min_pixels`` / ``max_pixels`` there too), and top-level ``min_pixels`` /
        ``max_pixels`` override it, as transformers' constructor does. "tokens" (GLM5Next):
        ``min_image_tokens``, ``max_image_tokens`` and ``patch_expand_factor`` (``size`` is
        ignored, as transformers does)."""
        if not isinstance(config, Mapping):
            raise artifact_error(ROLE, f"expected a JSON object, found {type(config).__name__}")
        if sizing not in SIZINGS:
            raise ValueError(f"sizing must be one of {SIZINGS}, got {sizing!r}")
        values: dict[str, Any] = {"sizing": sizing}
        if sizing == "area":
            values.update(_pixel_budget(config))
            names: tuple[str, ...] = ()
        else:
            names = ("min_image_tokens", "max_image_tokens", "patch_expand_factor")
        for name in ("patch_size", "temporal_patch_size", "merge_size", *names):
            values[name] = _member(config, name, getattr(cls, name))
        for name, value in values.items():
            if name != "sizing" and (type(value) is not int or value <= 0):
                raise artifact_error(ROLE, f"{name} must be a positive integer, got {value!r}")
        low, high = (
            ("min_pixels", "max_pixels")
            if sizing == "area"
            else ("min_image_tokens", "max_image_tokens")
        )
        if values.get(low, 0) > values.get(high, 0):
            raise artifact_error(ROLE, f"{low} {values[low]} exceeds {high} {values[high]}")
        for name in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            values[name] = _member(config, name, getattr(cls, name))
            if type(values[name]) is not bool:
                raise artifact_error(ROLE, f"{name} must be true or false, got {values[name]!r}")
        values["resample"] = _member(config, "resample", cls.resample)
        if type(values["resample"]) is not int or values["resample"] not in RESAMPLE_FILTERS:
            raise artifact_error(
                ROLE, f"resample must be a Pillow filter number 0-5, got {values['resample']!r}"
            )
        factor = _member(config, "rescale_factor", cls.rescale_factor)
        if not _is_number(factor) or factor <= 0:
            raise artifact_error(ROLE, f"rescale_factor must be a positive number, got {factor!r}")
        values["rescale_factor"] = float(factor)
        values["image_mean"] = _per_channel(_member(config, "image_mean", CLIP_MEAN), "image_mean")
        values["image_std"] = _per_channel(_member(config, "image_std", CLIP_STD), "image_std")
        if 0 in values["image_std"]:
            raise artifact_error(
                ROLE, f"image_std must not hold 0: {_member(config, 'image_std', None)!r}"
            )
        return cls(**values)

    @classmethod
    def from_artifact(cls, artifact: Any, sizing: str = "area") -> ImageProcessor:
        """From the vision component's ``preprocessor_config.json`` resource (spec 5.7)."""
        try:
            return cls.from_config(json.loads(artifact.resource(ROLE, "vision")), sizing)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise artifact_error(ROLE, f"invalid JSON ({exc})") from None

    @property
    def factor(self) -> int:
        """Side lengths are multiples of this: one merged token's span in pixels."""
        return self.patch_size * self.merge_size

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """(frames, rows, columns) in patches of an image of this size once processed; it
        contributes ``rows · columns / merge_size²`` placeholder tokens."""
        if self.do_resize and self.sizing == "tokens":
            height, width = self._canvas(height, width)
        elif self.do_resize:
            height, width = smart_resize(
                height, width, self.factor, self.min_pixels, self.max_pixels
            )
        elif height % self.factor or width % self.factor:
            raise ImageError(
                f"image is {width}x{height}; with do_resize off both sides must be multiples "
                f"of {self.factor}"
            )
        return 1, height // self.patch_size, width // self.patch_size

    def process(self, images: Sequence[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
        """``pixel_values`` float32 [Σ gh·gw, 3·T·P·P] (images one after another) and
        ``grid_thw`` int64 [images, 3]: ``VisionTower.encode``'s inputs."""
        if not images:
            raise ImageError("no images to process")
        levels = self._levels()
        resized = [self._resized(image) for image in images]
        grids = [grid for _, grid in resized]
        width = len(levels) * self.temporal_patch_size * self.patch_size**2
        out = np.empty((sum(g[1] * g[2] for g in grids), width), np.float32)
        at = 0
        for x, (_, gh, gw) in resized:  # each image's patches written in place, once
            # each 8-bit level's value, looked up: the same arithmetic on each level as on
            # each pixel, in one pass over the pixels instead of four
            values = np.empty(x.shape, np.float32)
            for c in range(x.shape[0]):
                np.take(levels[c], x[c], out=values[c], mode="clip")  # (uint8: in range)
            self._place_patches(values, out[at : at + gh * gw], gh, gw)
            at += gh * gw
        return out, np.array(grids, dtype=np.int64)

    def _resized(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """The image as the tower sees it, 8-bit: [C, H, W] uint8 and its patch grid."""
        if self.do_convert_rgb:
            image = to_rgb(image)
        elif image.mode != "RGB":
            raise ImageError(f"image mode is {image.mode}; with do_convert_rgb off it must be RGB")
        grid = self.grid(image.height, image.width)
        size = (grid[2] * self.patch_size, grid[1] * self.patch_size)  # Pillow: (width, height)
        content = size
        if self.do_resize and self.sizing == "tokens":
            factor = self.factor * self.patch_expand_factor
            h, w = content_size(
                image.height,
                image.width,
                size[::-1],
                self.temporal_patch_size,
                factor,
                self.min_image_tokens,
            )
            content = (w, h)
        if self.do_resize and content != image.size:
            image = image.resize(content, resample=self.resample)
        x: np.ndarray = np.asarray(image).transpose(2, 0, 1)  # [C, H, W] uint8
        if content != size:  # black below and right of the image, up to the canvas
            x = np.pad(x, ((0, 0), (0, size[1] - content[1]), (0, size[0] - content[0])))
        return x, grid

    def _levels(self) -> np.ndarray:
        """float32 [3, 256]: what rescaling and normalizing make of each 8-bit level in each
        channel (rescale in float64 rounded to float32, then (x - mean) / std in float32, as
        the Pillow backend computes them)."""
        x = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 256))
        if self.do_rescale:
            x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            mean = np.array(self.image_mean, np.float32)[:, None]
            std = np.array(self.image_std, np.float32)[:, None]
            x = (x.astype(np.float32, copy=False) - mean) / std
        return np.ascontiguousarray(x, dtype=np.float32)

    def _canvas(self, height: int, width: int) -> tuple[int, int]:
        factor = self.factor * self.patch_expand_factor
        return canvas(
            height,
            width,
            factor,
            self.temporal_patch_size,
            self.min_image_tokens,
            self.max_image_tokens,
        )

    def _place_patches(self, x: np.ndarray, out: np.ndarray, gh: int, gw: int) -> None:
        """[C, H, W] into ``out`` [gh·gw, C·T·P·P]: patch rows ordered by merge block, then
        by row and column inside the block; each row's C×P×P values repeated over the T
        frames."""
        c, p, m, t = x.shape[0], self.patch_size, self.merge_size, self.temporal_patch_size
        blocks = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        np.copyto(out.reshape(gh // m, gw // m, m, m, c, t, p, p), blocks[:, :, :, :, :, None])


def _member(config: Mapping[str, Any], name: str, default: Any) -> Any:
    """A member's value; ``null`` counts as absent (transformers takes None as its default)."""
    value = config.get(name)
    return default if value is None else value


def _pixel_budget(config: Mapping[str, Any]) -> dict[str, Any]:
    """min_pixels and max_pixels as transformers' constructor reads them."""
    size = _member(config, "size", {})
    if not isinstance(size, Mapping):
        raise artifact_error(ROLE, f"size must be an object, found {size!r}")
    budget = {
        "min_pixels": size.get("shortest_edge", size.get("min_pixels", DEFAULT_MIN_PIXELS)),
        "max_pixels": size.get("longest_edge", size.get("max_pixels", DEFAULT_MAX_PIXELS)),
    }
    budget.update({k: config[k] for k in budget if config.get(k) is not None})
    return budget


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _per_channel(value: Any, name: str) -> tuple[float, float, float]:
    """Three channel values; one number stands for all three (transformers allows both)."""
    if _is_number(value):
        return (float(value),) * 3
    if isinstance(value, list | tuple) and len(value) == 3 and all(map(_is_number, value)):
        return tuple(float(v) for v in value)  # type: ignore[return-value]
    raise artifact_error(ROLE, f"{name} must be three numbers, got {value!r}")
