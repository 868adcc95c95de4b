"""The shape and byte budget of an engine's context pool, known before the model loads.

An engine's pool is planned from its settings alone (lanes, context, K/V dtype, speculation,
the prefix cache); its byte budget needs the backend's device (``context_capacity="auto"``).
The plan is made first because an expert offload budget (``vram_budget``) places the experts
beside the pool before the model prepares a weight (``planned_bytes``); the pool itself is
allocated from the same plan once the model is loaded (``new_pool``).
"""

from __future__ import annotations

from typing import Any

from .capacity import budget_bytes, parse_capacity, parse_size
from .runner import ModelRunner
from .speculative import SpecConfig
from .state import ContextPool, DraftSpec

#: with the prefix cache and no context capacity given, the pool holds beside every lane's
#: full context this many checkpoints' GDN state snapshots per lane (a capacity given is
#: all shared: pages go to K/V or snapshots as the workload needs)
CACHE_SNAPSHOTS_PER_LANE = 4
#: prompt chunks of up to this many tokens run as one compiled multi-row step (as a
#: speculative round's verification does), not as a prefill: a chat prompt's tail after
#: the checkpoint the next turn resumes from is a few generation-prompt tokens, and a
#: prefill of them would cost a whole prefill's launches
SHORT_CHUNK_TOKENS = 8


class PoolPlan:
    """The pool of an engine with ``lanes`` lanes of ``max_context`` tokens; its budget from
    ``context_capacity`` (bytes, a size, ``"auto"`` or None) less ``memory_headroom``."""

    def __init__(
        self,
        *,
        lanes: int,
        max_context: int,
        kv_dtype: str,
        spec: SpecConfig | None,
        prefix_cache: bool,
        context_capacity: int | str | None,
        memory_headroom: int | str | None,
    ):
        #: a round writes up to K+1 positions past a sequence's length: a lane's pages grow
        #: to hold that margin beyond its own tokens before every round
        self.margin = spec.draft_tokens + 1 if spec else 0
        self.args: dict[str, Any] = dict(
            lanes=lanes,
            max_context=max_context + self.margin,
            kv_dtype=kv_dtype,
            draft_tokens=spec.draft_tokens if spec else 0,
            step_rows=SHORT_CHUNK_TOKENS,
            snapshots=CACHE_SNAPSHOTS_PER_LANE * lanes if prefix_cache else 0,
        )
        self.context_capacity = context_capacity
        self.memory_headroom = memory_headroom

    def budget(self, device: Any) -> int | None:
        """The pool's bytes on ``device`` (None: every lane at its full context)."""
        capacity = parse_capacity(self.context_capacity)
        return budget_bytes(capacity, device, parse_size(self.memory_headroom))

    def planned_bytes(self, model: Any) -> int:
        """The bytes ``new_pool`` will allocate for ``model``, from its memory kinds alone
        (its config read, no weight needed)."""
        specs, mtp = model.state_specs()
        args = dict(self.args)
        draft_tokens = args.pop("draft_tokens")
        draft = DraftSpec(draft_tokens + 1, model.config.hidden) if draft_tokens else None
        budget = self.budget(model.backend)
        return ContextPool.planned_bytes(specs, mtp=mtp, draft=draft, budget=budget, **args)

    def new_pool(self, runner: ModelRunner, device: Any) -> ContextPool:
        """The pool, allocated by ``runner`` for its model on ``device``."""
        return runner.new_pool(**self.args, budget=self.budget(device))
