"""Images in the engine's requests (artifacts with Qwen3.5's vision tower: Qwen3.5 VLMs and
multimodal Qwen4Exp; and GLM5Next's tower; ``models.vision_families`` tells them apart).

A chat message carries an image as a ``{"type": "image"}`` content part; the chat template
writes it as ``<|vision_start|><|image_pad|><|vision_end|>`` (GLM5Next:
``<|begin_of_image|><|image|><|end_of_image|>``) and ``GenerationRequest.images``
holds the images in the order of those parts. ``VisionInput`` turns such a request into
what the prefill needs:

* ``expand`` (at ``Engine.render``): each image decoded and checked (format, pixels, the
  request's image count and image tokens), and its one ``<|image_pad|>`` widened to the
  image's merged-token count, so the prompt's length is what the model reads;
* ``encode`` (at ``Engine.submit``): the vision tower's rows of each image (one image per
  call, so an image's rows never depend on its company), taken from the media cache when the
  same bytes were encoded before; the prompt's positions and ``rope_delta`` (M-RoPE for
  Qwen's, sequence indices and 0 for GLM5Next's); and the
  prompt as the prefix cache sees it (``cache_ids``): each image's placeholders stand for
  its digest, so a checkpoint with an image is found again only for the same image at the
  same place.

An image not in the media cache is decoded and processed once: at render (often a worker
thread of the server), which keeps its processed pixels (``pending``, a second
least-recently-used store within ``PENDING_PIXEL_BYTES``) for its submit to encode. Only the
processor's output is kept, never the decoded photo. An image the store let go is
processed again at submit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_format import ArtifactError

from .backends.base import to_numpy
from .errors import EngineError, ModelError, RequestError
from .media import ImageInput
from .media_cache import DEFAULT_CACHE_BYTES, EncodedImage, MediaCache
from .models.vision_families import QWEN3_5, vision_family

#: the tokens a chat template writes for one image (Qwen3.5's template; ninfer's built-in one)
IMAGE_PAD = QWEN3_5.image_token
#: bytes of processed pixels kept from a render's count of a new image to its submit's
#: encode (a 1024² image's are ~20 MB)
PENDING_PIXEL_BYTES = 256 << 20


@dataclass(frozen=True)
class VisionOptions:
    """How the engine takes images. ``enabled`` is decided at load (off: the tower is not
    loaded and image requests are refused). Per request: at most ``max_images`` images,
    each at most ``max_image_pixels`` pixels as decoded (checked on the header, before any
    pixel is decoded), and ``max_image_tokens`` merged tokens for all its images together.
    ``cache_capacity``: bytes of encoded images the media cache keeps."""

    enabled: bool = True
    max_images: int = 16
    max_image_pixels: int = 40_000_000
    max_image_tokens: int = 16384
    cache_capacity: int = DEFAULT_CACHE_BYTES


@dataclass(frozen=True)
class PromptImages:
    """One prompt's images as its prefill places them.

    ``placed``: the prompt indices of the image placeholders (sorted), ``rows`` their
    embeddings (host float32 [placeholders, hidden], in the same order), ``positions`` the
    prompt's M-RoPE positions (int64 [3, T]), ``rope_delta`` the offset of every position
    after the prompt, ``cache_ids`` the prompt's ids as the prefix cache keys them, and how
    many of its ``count`` images the media cache served."""

    placed: np.ndarray
    rows: np.ndarray
    positions: np.ndarray
    rope_delta: int
    cache_ids: np.ndarray
    count: int
    from_cache: int

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For the prompt span ``start:end``: the span's indices of its placeholders, their
        rows, and the span's positions [3, end - start]."""
        lo, hi = np.searchsorted(self.placed, [start, end])
        return self.placed[lo:hi] - start, self.rows[lo:hi], self.positions[:, start:end]


def digest_token(digest: str) -> int:
    """The id an image's placeholders take in prefix-cache keys: negative, so no text token
    is ever equal to it, and 60 bits of the image's sha256."""
    return -1 - int(digest[:15], 16)


class VisionInput:
    """The image path of one engine: its artifact's vision tower and image processor on
    ``backend``, the tokenizer's placeholder id, ``options`` and the media cache."""

    def __init__(self, artifact: Any, backend: Any, tokenizer: Any, options: VisionOptions):
        from .frontend.vision import ImageProcessor  # needs Pillow: only for VLM artifacts

        self.options = options
        self.family = family = vision_family(artifact)
        self.image_token_id = tokenizer.token_id(family.image_token)
        if self.image_token_id is None:
            raise ModelError(
                f"the artifact's tokenizer has no {family.image_token} token for images"
            )
        self.tower = family.tower(artifact, backend)
        self.processor = ImageProcessor.from_artifact(artifact, family.sizing)
        if self.processor.merge_size != self.tower.config.merge:
            raise ModelError(
                f"preprocessor_config.json merge_size {self.processor.merge_size} differs from "
                f"the vision config's spatial_merge_size {self.tower.config.merge}"
            )
        self.cache = MediaCache(options.cache_capacity)
        #: processed pixels (as ``grid`` and ``rows``) of images counted, not yet encoded
        self.pending = MediaCache(PENDING_PIXEL_BYTES)
        self._lock = threading.Lock()  # render runs in worker threads, submit in the engine's

    # ----------------------------------------------------------------------- render
    def expand(self, ids: Sequence[int], images: Sequence[ImageInput]) -> list[int]:
        """``ids`` (a rendered prompt, one placeholder per image) with each image's
        placeholder repeated to its merged-token count; the images are checked first."""
        counts = self._token_counts(images)
        at = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(at) != len(images):
            raise RequestError(
                f"the messages hold {len(at)} image part(s) for {len(images)} image(s)",
                param="images",
            )
        out, previous = [], 0
        for i, count in zip(at, counts, strict=True):
            out += [*ids[previous:i], *[self.image_token_id] * count]
            previous = i + 1
        return [*out, *ids[previous:]]

    def _token_counts(self, images: Sequence[ImageInput]) -> list[int]:
        """Each image's merged-token count, checking the request's limits (an image the
        media cache holds was checked when it was encoded; one counted already and not yet
        encoded keeps its grid with its pixels)."""
        self._check_count(images)
        grids = []
        for i, image in enumerate(images):
            with self._lock:
                kept = self.cache.peek(image.digest) or self.pending.peek(image.digest)
            grids.append(kept.grid if kept is not None else self._counted(image, i))
        return self._check_tokens(grids)

    def _counted(self, image: ImageInput, index: int) -> tuple[int, int, int]:
        """The grid of an image not yet encoded; its pixels kept for the encode."""
        pixels, grid_thw = self._pixels(image, index)
        grid = _grid(grid_thw)
        with self._lock:
            self.pending.put(image.digest, EncodedImage(grid, pixels))
        return grid

    def _processed(self, image: ImageInput, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(pixel_values, grid_thw) of an image to encode: those its count kept, or new."""
        with self._lock:
            held = self.pending.take(image.digest)
        if held is None:
            return self._pixels(image, index)
        return held.rows, np.asarray([held.grid], dtype=np.int64)

    def _check_count(self, images: Sequence[ImageInput]) -> None:
        if len(images) > self.options.max_images:
            raise _image_error(
                f"{len(images)} images in the request; at most {self.options.max_images}",
                "images",
            )

    def _check_tokens(self, grids: Sequence[tuple[int, int, int]]) -> list[int]:
        """The merged-token count of each image of ``grids``, all of them within the
        request's limit."""
        counts = self.tower.merged_tokens(grids)
        if sum(counts) > self.options.max_image_tokens:
            raise _image_error(
                f"the images take {sum(counts)} tokens; at most "
                f"{self.options.max_image_tokens} image tokens a request",
                "images",
            )
        return counts

    def _pixels(self, image: ImageInput, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(pixel_values, grid_thw [1, 3]) of one image, or its ``ImageError`` naming it."""
        from .frontend.vision import ImageError, decode_image

        try:
            decoded = decode_image(image.data, max_pixels=self.options.max_image_pixels)
            return self.processor.process([decoded])
        except ImageError as exc:
            raise _image_error(str(exc), f"images[{index}]") from None

    # ----------------------------------------------------------------------- submit
    def encode(self, ids: np.ndarray, images: Sequence[ImageInput]) -> PromptImages:
        """The prompt ``ids`` (placeholders expanded, as ``expand`` made them) with its
        images' rows, positions and cache key."""
        self._check_count(images)  # the limits again: the caller may have rendered elsewhere
        found: list[EncodedImage | tuple[np.ndarray, np.ndarray]] = []
        for i, image in enumerate(images):
            with self._lock:
                kept = self.cache.get(image.digest)
            found.append(kept if kept is not None else self._processed(image, i))
        grids = [f.grid if isinstance(f, EncodedImage) else _grid(f[1]) for f in found]
        self._check_tokens(grids)
        rows = []
        for image, grid, f in zip(images, grids, found, strict=True):
            if isinstance(f, EncodedImage):
                rows.append(f.rows)
                continue
            encoded = EncodedImage(grid, self._encode_one(*f))  # decoded, not encoded yet
            with self._lock:
                self.cache.put(image.digest, encoded)
            rows.append(encoded.rows)
        hits = sum(isinstance(f, EncodedImage) for f in found)
        try:
            positions, delta = self.family.positions(
                ids, np.asarray(grids, dtype=np.int64), self.image_token_id, self.tower.config.merge
            )
        except ModelError as exc:  # the ids were not expanded for these images
            raise RequestError(f"prompt_ids do not fit the images: {exc}", param="images") from None
        placed = np.flatnonzero(ids == self.image_token_id)
        cache_ids = ids.copy()
        starts = np.cumsum([0, *(len(r) for r in rows)])
        for image, a, b in zip(images, starts[:-1], starts[1:], strict=True):
            cache_ids[placed[a:b]] = digest_token(image.digest)
        return PromptImages(
            placed=placed,
            rows=np.concatenate(rows),
            positions=positions,
            rope_delta=delta,
            cache_ids=cache_ids,
            count=len(images),
            from_cache=hits,
        )

    def _encode_one(self, pixel_values: np.ndarray, grid_thw: np.ndarray) -> np.ndarray:
        rows = self.tower.encode(pixel_values, grid_thw)
        return np.ascontiguousarray(to_numpy(rows), dtype=np.float32)


def _grid(grid_thw: np.ndarray) -> tuple[int, int, int]:
    """One image's (frames, rows, columns) from its ``grid_thw`` [1, 3]."""
    t, h, w = (int(x) for x in grid_thw[0])
    return t, h, w


def _image_error(message: str, param: str) -> Exception:
    from .frontend.vision import ImageError

    return ImageError(message, param=param)


def load_vision(
    artifact: Any,
    backend: Any,
    tokenizer: Any,
    options: VisionOptions,
    *,
    backend_name: str,
    tensor_parallel: int,
) -> tuple[VisionInput | None, str | None]:
    """The engine's image path, or None and the one line an image request is refused with."""
    if "vision" not in artifact.components:
        return None, "this model takes no images (its artifact has no vision component)"
    if not options.enabled:
        return None, "image input is turned off for this server ([vision] enabled = false)"
    served = vision_family(artifact).backends
    if backend_name not in served:
        return (
            None,
            f"image input for this model runs on {' and '.join(served)}, not {backend_name}",
        )
    if tensor_parallel > 1:
        return None, "image input needs tensor_parallel 1"
    try:
        return VisionInput(artifact, backend, tokenizer, options), None
    except ImportError as exc:  # Pillow, the vision extra
        return None, str(exc)
    except (EngineError, ArtifactError) as exc:
        logging.getLogger("ninfer.engine").warning("images are refused: %s", exc)
        return None, f"image input is unavailable: {exc}"


def placed_inputs(
    model: Any, reads: Sequence[tuple[np.ndarray, PromptImages | None, int, int]]
) -> tuple[Any, np.ndarray]:
    """The layers' input of one prefill chunk in which some prompt has images: each read's
    (prompt ids, images or None, start, end) embedded, image rows placed at their
    placeholders -> (embeddings [rows, hidden] on the device, positions int64 [3, rows])."""
    xp = model.backend.xp
    embedded, positions = [], []
    for ids, images, start, end in reads:
        rows = model.embed(xp.asarray(ids[start:end]))
        if images is None:
            positions.append(np.broadcast_to(np.arange(start, end), (3, end - start)))
        else:
            at, placed, span = images.read(start, end)
            if len(at):
                rows[xp.asarray(at)] = xp.asarray(placed).astype(rows.dtype)
            positions.append(span)
        embedded.append(rows)
    return xp.concatenate(embedded), np.concatenate(positions, axis=1)
