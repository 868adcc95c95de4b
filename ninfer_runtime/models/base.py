"""What every architecture offers the engine: states, a batched forward, optional drafting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..state import SequenceState

Array = Any


@dataclass
class ForwardOutput:
    """Per lane, in the order the lanes were given.

    ``logits[i]`` is [T_i, V] (or [1, V] when only the last row was asked for);
    ``hidden[i]`` is [T_i, H], the post-final-norm hidden states the MTP head consumes.
    ``last_logits`` is [lanes, V], every lane's last logits row in one array, when the model
    computed them as one (a decode step, ``last_only``), so a sampler need not gather them;
    ``None`` otherwise.
    """

    logits: list[Array]
    hidden: list[Array]
    last_logits: Array | None = None


class Model(Protocol):
    """A loaded architecture on a backend; the engine drives it through this surface."""

    @property
    def has_mtp(self) -> bool: ...

    def new_state(self, max_context: int) -> SequenceState: ...

    def forward(
        self,
        tokens_per_lane: Sequence[Array],
        states: Sequence[SequenceState],
        *,
        last_only: bool = False,
    ) -> ForwardOutput: ...

    def mtp_logits(
        self,
        hidden: Array,
        next_token_ids: Array,
        state: SequenceState,
        *,
        start: int | None = None,
    ) -> Array: ...
