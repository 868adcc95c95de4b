"""Prompts with images for a VLM (Qwen3.5's tower, or GLM5Next's with ``positions`` of its
family): the vision tower's rows placed among the text tokens, multimodal RoPE positions, and
the prompt prefilled through the runner.

A prompt carries each image as ``<|vision_start|>`` then ``merged_tokens`` image placeholder
tokens (``<|image_pad|>``) then ``<|vision_end|>``, images in the order of ``grid_thw``. As in
transformers' ``Qwen3_5Model``:

* the placeholders' input embeddings are replaced, in order, by the tower's output rows
  (``VisionTower.encode``: one row per merged token);
* positions are the three M-RoPE streams of ``models.qwen3_5.mrope.prompt_positions``; the
  tokens after the prompt sit at their sequence index plus the prompt's ``rope_delta`` (≤ 0:
  an image advances the positions by its longer side, not by its token count).

Usage (CPU reference; each prefill independent):

    prompts = ImagePrompts(runner, VisionTower(artifact, backend), image_token_id)
    prompt = prompts.prepare(ids, pixel_values, grid_thw)
    out = prompts.prefill(prompt, state)                 # logits of the prompt's rows
    out = prompts.extend(next_ids, state, prompt.rope_delta)   # the tokens after it

``extend`` runs its tokens as a chunk at explicit positions. The engine serves the same math
with several sequences at once (``images``): it places rows chunk by chunk and sets the
sequence's ``SequenceState.rope_delta``, which the runner's decode step adds to its RoPE rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ModelError
from .models.base import ForwardOutput
from .models.qwen3_5.mrope import continued_positions, prompt_positions
from .models.qwen3_5.vision import VisionTower
from .models.vision_families import Positions
from .runner import ModelRunner
from .state import SequenceState

Array = Any


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt ready for the text layers: its ids [T], input embeddings (device [T, H]) with
    the images' rows placed, M-RoPE positions (host int64 [3, T]) and the offset of the
    positions of every token after it (``rope_delta``)."""

    ids: np.ndarray
    embeddings: Array
    positions: np.ndarray
    rope_delta: int


class ImagePrompts:
    """Prompts with images for one runner's model and its vision tower. ``image_token_id`` is
    the tokenizer's image placeholder (``<|image_pad|>``; the checkpoint config's
    ``image_token_id``); ``positions`` the prompt positions of the tower's family
    (``models.vision_families``: M-RoPE by default, GLM5Next's sequence indices)."""

    def __init__(
        self,
        runner: ModelRunner,
        tower: VisionTower,
        image_token_id: int,
        positions: Positions = prompt_positions,
    ):
        self.runner, self.tower, self.image_token_id = runner, tower, image_token_id
        self.positions = positions
        hidden = runner.model.config.hidden
        if tower.config.out_hidden != hidden:
            raise ModelError(
                f"the vision tower's rows are {tower.config.out_hidden} wide, the text "
                f"model's embeddings {hidden}"
            )

    def prepare(self, ids: Array, pixel_values: Any, grid_thw: Any) -> ImagePrompt:
        """Encode the images and place their rows at the prompt's placeholder tokens."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
        positions, delta = self.positions(ids, grid, self.image_token_id, self.tower.config.merge)
        model, xp = self.runner.model, self.runner.backend.xp
        embeddings = model.embed(xp.asarray(ids))
        if len(grid):
            rows = self.tower.encode(pixel_values, grid)  # counts checked by prompt_positions
            placed = xp.asarray(np.flatnonzero(ids == self.image_token_id))
            embeddings[placed] = rows.astype(embeddings.dtype)
        return ImagePrompt(ids, embeddings, positions, delta)

    def prefill(
        self,
        prompt: ImagePrompt,
        state: SequenceState,
        *,
        chunk: int = 512,
        last_only: bool = False,
    ) -> ForwardOutput:
        """The prompt through the text layers (``ModelRunner.prefill`` with its embeddings
        and positions); ``state`` must be empty."""
        if state.length:
            raise ModelError(
                f"a prompt with images starts a sequence; this one holds {state.length}"
            )
        return self.runner.prefill(
            prompt.ids,
            state,
            chunk=chunk,
            last_only=last_only,
            embeddings=prompt.embeddings,
            positions=prompt.positions,
        )

    def extend(self, tokens: Array, state: SequenceState, rope_delta: int) -> ForwardOutput:
        """Text tokens after a prompt with images (``rope_delta`` is its ``ImagePrompt``'s):
        their positions continue from the prompt's largest position."""
        tokens = np.asarray(tokens).reshape(-1)
        positions = continued_positions(state.length, len(tokens), rope_delta)
        return self.runner.forward([tokens], [state], positions=positions)
