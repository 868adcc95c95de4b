"""The runner's compiled steps: made once per shape, kept for the pool they address.

A decode step, a multi-row step, a speculative round or its commit is handed to the backend
once per key (its kind and lane count, ...) to compile: the CUDA backend captures it as a
graph and replays it every token. A captured step addresses the buffers of the pool it was
made for, so a step made for one pool is never run on another: the first step asked for a
new pool drops the old pool's steps (and with them the last hold on the old pool).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models.base import Model
    from .state import ContextPool


class CompiledSteps:
    """``model``'s compiled steps by key, all for one pool at a time."""

    def __init__(self, model: Model):
        self.model = model
        self._pool: ContextPool | None = None
        self._steps: dict[tuple[Any, ...], Any] = {}

    def get(
        self,
        pool: ContextPool,
        key: tuple[Any, ...],
        fn: Callable[..., Any],
        shapes: Sequence[tuple[int, ...]],
        capture: bool = True,
    ) -> Any:
        """``fn`` compiled once per ``key`` for ``pool`` (inputs of ``shapes``; ``capture``
        False: never captured, the step reads the host)."""
        if pool is not self._pool:
            self._pool, self._steps = pool, {}
        step = self._steps.get(key)
        if step is None:
            self.model.rope_table(pool.max_context + 1)  # sized before any capture
            step = self._steps[key] = self.model.backend.compile_step(fn, shapes, capture)
        return step

    def made(self) -> list[tuple[Any, ...]]:
        """The keys of the steps made for the current pool."""
        return list(self._steps)
