"""The vision towers an artifact's ``vision`` component can be, by its config's model_type, and
what the engine's image path needs of each: the tower, the token the chat template writes once
per image (widened to the image's merged-token count), how the image processor sizes images,
and the text layers' positions of a prompt with images.

* Qwen3.5's tower (``qwen3_5_vision``, ``qwen3_5_moe_vision``, ``qwen4_exp_vision``; the
  default): ``<|image_pad|>``, Qwen2-VL's pixel-area sizing, M-RoPE positions (an image
  advances them by its longer side, so ``rope_delta`` < 0);
* GLM5Next's (``glm5_next_vision``): ``<|image|>``, the merged-token budget with padding, and
  plain sequence indices (its text layers read no positions: KDA and NoPE attention; as
  transformers' ``Glm5NextModel``, which counts every token one on), ``rope_delta`` 0.

Both check that the prompt's runs of placeholders are, in order, the images' token counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .glm5_next.vision import Glm5NextVisionTower
from .qwen3_5.mrope import image_runs, prompt_positions
from .qwen3_5.vision import VisionTower

#: (ids, grid_thw, image token id, merge) -> (positions int64 [3, T], delta after the prompt)
Positions = Callable[[np.ndarray, np.ndarray, int, int], tuple[np.ndarray, int]]


def sequence_positions(
    ids: np.ndarray, grid_thw: np.ndarray, image_token_id: int, merge: int
) -> tuple[np.ndarray, int]:
    """Every token at its sequence index in all three streams, delta 0; the placeholders are
    checked against the images as for M-RoPE."""
    image_runs(ids, grid_thw, image_token_id, merge)  # raises on a count mismatch
    count = np.asarray(ids).reshape(-1).shape[0]
    return np.broadcast_to(np.arange(count, dtype=np.int64), (3, count)).copy(), 0


@dataclass(frozen=True)
class VisionFamily:
    """``tower(artifact, backend)``; ``image_token`` (the placeholder); ``sizing`` (the image
    processor's, ``ImageProcessor.from_config``); ``positions`` (``Positions``); ``backends``:
    those the family's image path is served on (where its GPU test has passed)."""

    tower: Callable[[Any, Any], Any]
    image_token: str
    sizing: str
    positions: Positions
    backends: tuple[str, ...]


#: both image paths on cuda since their GPU tests passed on an H100 (tests/gpu/test_images_cuda.py,
#: tests/gpu/test_glm5_next_images_cuda.py)
QWEN3_5 = VisionFamily(VisionTower, "<|image_pad|>", "area", prompt_positions, ("cpu", "cuda"))
GLM5_NEXT = VisionFamily(
    Glm5NextVisionTower, "<|image|>", "tokens", sequence_positions, ("cpu", "cuda")
)
#: the vision component's model_type -> its family, where not Qwen3.5's
FAMILY_OF = {"glm5_next_vision": GLM5_NEXT}


def vision_family(artifact: Any) -> VisionFamily:
    """The family of ``artifact``'s vision component (Qwen3.5's unless its model_type says)."""
    component = artifact.components.get("vision")
    config = (component.config or {}) if component is not None else {}
    return FAMILY_OF.get(config.get("model_type"), QWEN3_5)
