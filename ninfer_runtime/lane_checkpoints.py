"""The scheduler's lanes and the prefix cache's checkpoints.

Where a lane's prefill keeps checkpoints besides every ``checkpoint_interval`` tokens and its
prompt's end (the positions themselves are chosen by ``checkpoint_plan``), keeping one (a
snapshot of the lane's memory at its length, under its request's salt), and whether a
request about to be admitted should wait a step or two for one a running lane is about to
keep, and the drafter's entry a lane resuming from one needs. The scheduler decides when;
this module knows what a checkpoint needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .checkpoint_plan import awaited_position, choose_checkpoints, pending_checkpoints
from .lane import Lane
from .prefix_cache import PrefixCache, common_prefix
from .runner import ModelRunner
from .state import Checkpoint, ContextPool


class LaneCheckpoints:
    """Checkpoints of one scheduler's lanes in its prefix cache (``cache``: None without
    one, and then nothing is kept and nobody waits). ``drafting``: lanes carry a drafter's
    entries, so a checkpoint is only useful with the hidden row the drafter resumes from."""

    def __init__(
        self,
        pool: ContextPool,
        cache: PrefixCache | None,
        *,
        checkpoint_interval: int,
        prefill_chunk: int,
        drafting: bool,
    ):
        self.pool = pool
        self.cache = cache
        self.checkpoint_interval = checkpoint_interval
        self.prefill_chunk = prefill_chunk
        self.drafting = drafting

    def awaits_shared(self, a: Lane, running: Iterable[Lane]) -> bool:
        """Whether ``a`` (not yet admitted, reading its prompt for the first time) should
        wait because a ``running`` lane with the same salt is prefilling the prompt ``a``
        starts with and will keep a checkpoint there: one that lets ``a`` resume at least
        one prefill chunk later than it could now. It never waits long: the lane prefills
        one chunk per step, and once it is past the position (the checkpoint written, or
        not for want of pages) or gone (finished, cancelled, preempted) ``a`` goes on."""
        if self.cache is None or a.generated or a.saved is not None or a.prompt_scores is not None:
            return False
        salt = a.request.cache_salt
        writers = [
            (
                w.cache_prompt,
                pending_checkpoints(
                    w.plan,
                    prefilled=w.prefilled,
                    prompt_tokens=len(w.prompt_ids),
                    interval=self.checkpoint_interval,
                ),
            )
            for w in running
            if w.request.cache_salt == salt and not w.generated and w.prefilled < len(w.prompt_ids)
        ]
        deepest = awaited_position(a.cache_prompt, writers)
        if not deepest:
            return False
        return deepest - self.cache.resumable(a.cache_prompt, salt) >= self.prefill_chunk

    def plan(self, a: Lane, lanes: Iterable[Lane]) -> dict[int, str]:
        """Where ``a``'s prefill keeps checkpoints besides every ``checkpoint_interval``
        tokens and its end (``checkpoint_plan``): where a chat prompt stops being what the
        next turn resends, and the best of the request's own boundaries (``lanes``: the
        scheduler's running and waiting ones, whose shared prefixes with ``a`` count)."""
        assert self.cache is not None
        prompt, salt = a.cache_prompt, a.request.cache_salt
        plan = {}
        if a.history_end is not None:
            plan[a.history_end] = "boundary"
        if not a.request.cache_boundaries:  # nothing to choose: no sharers to count
            return plan
        others = [
            common_prefix(w.cache_prompt, prompt)
            for w in lanes
            if w is not a and w.request.cache_salt == salt
        ]
        chosen = choose_checkpoints(
            a.request.cache_boundaries,
            prompt_tokens=len(prompt),
            resumed=a.resumed,
            kept_anyway=lambda p: p in plan or p % self.checkpoint_interval == 0,
            exists=lambda p: self.cache.contains(prompt[:p], salt),  # type: ignore[union-attr]
            shared_lengths=[*others, *self.cache.shared_lengths(prompt, salt)],
        )
        return {**plan, **chosen}

    def marks(self, a: Lane, start: int, end: int) -> list[MarkCapture]:
        """The checkpoints ``a``'s read of ``start:end`` keeps inside it (a model whose
        ``checkpoints_inside_reads`` says so reads through them): its plan's positions and
        the interval's strictly between, each with snapshot pages taken now; none where the
        cache has one already or no pages are free."""
        if self.cache is None:
            return []
        interval = self.checkpoint_interval
        inside = {p: k for p, k in a.plan.items() if start < p < end}
        first = (start // interval + 1) * interval
        inside |= {p: "interval" for p in range(first, end, interval) if p not in inside}
        captures, salt = [], a.request.cache_salt
        for position in sorted(inside):
            if position <= a.resumed or not self._new(a.cache_prompt[:position], salt):
                continue
            snapshot = self.pool.take_snapshot()
            if snapshot is None:
                break
            captures.append(MarkCapture(self.pool, a, position, inside[position], snapshot))
        return captures

    def keep_marks(self, captures: Iterable[MarkCapture], hidden_rows: Any) -> None:
        """After the forward: each complete capture a checkpoint in the cache (``hidden_rows``:
        lane -> its read's hidden rows and where they start, for the drafter), the others'
        pages let go."""
        assert self.cache is not None
        for c in captures:
            if not c.complete:
                self.pool.release_snapshot(c.snapshot)
                continue
            a, hidden = c.lane, None
            if self.drafting:
                rows, start = hidden_rows[id(a)]
                hidden = rows[c.position - start - 1]
            kept = self.pool.keep_marked(a.state, c.position, c.snapshot, hidden, None, c.kind)
            self.cache.insert(a.cache_prompt[: c.position], kept, a.request.cache_salt)

    def keep(
        self,
        a: Lane,
        tokens: np.ndarray,
        kind: str,
        hidden: Any = None,
        logits: Any = None,
    ) -> None:
        """Keep ``a``'s memory at its length in the prefix cache, under its salt
        (``tokens``: what it has consumed; ``kind``: why; ``logits``: the last token's,
        when a request may resume with nothing left to prefill)."""
        if self.cache is None or a.state.length <= a.resumed:
            return
        if self.drafting and hidden is None:  # the drafter could not resume from it
            return
        salt = a.request.cache_salt
        if not self._new(tokens[: a.state.length], salt):
            return
        kept = self.pool.keep(a.state, hidden, logits, kind)
        if kept is not None:
            self.cache.insert(tokens[: a.state.length], kept, salt)

    def _new(self, tokens: np.ndarray, salt: str | None) -> bool:
        """Whether a checkpoint of ``tokens`` would be new to the cache (one it keeps already
        is refreshed instead), room made for its snapshot where pages are short."""
        assert self.cache is not None
        if self.cache.refresh(tokens, salt):
            return False
        if self.pool.free_pages < self.pool.snapshot_pages:
            self.cache.make_room(pages=self.pool.snapshot_pages)
        return True


class MarkCapture:
    """A checkpoint of lane ``lane`` at ``position`` (``kind``), kept inside a prefill read:
    the snapshot pages its layers fill as the forward passes it (``save_captures``, the
    ``batch.Mark``'s), made a checkpoint after the forward (``LaneCheckpoints.keep_marks``)
    only if every slot state array of the pool was filled."""

    def __init__(self, pool: ContextPool, lane: Lane, position: int, kind: str, snapshot: Any):
        self.pool, self.lane, self.position, self.kind = pool, lane, position, kind
        self.snapshot = snapshot
        self.saved: set[int] = set()

    @property
    def complete(self) -> bool:
        return all(id(part) in self.saved for part in self.pool.state_parts())


def save_captures(captures: Sequence[MarkCapture], states: Any) -> None:
    """The ``states`` of several captures of one pool saved in one copy (a ``batch.Mark``'s
    saver: a layer's round of marks)."""
    captures[0].pool.save_states(states, [(c.lane.state.slot, c.snapshot) for c in captures])
    for c in captures:
        c.saved.update(id(s) for s in states)


def resume_drafter(runner: ModelRunner, a: Lane, checkpoint: Checkpoint) -> None:
    """The drafter's entry of the last token ``checkpoint`` kept, for lane ``a`` resuming
    from it with prompt left to read: the entry needs that token's hidden row (kept) and
    the next token (known only now)."""
    span = slice(checkpoint.length, checkpoint.length + 1)
    rows = at = None
    if a.images is not None:  # at its M-RoPE position, an image's row placed
        from .images import placed_inputs

        read = [(a.prompt_ids, a.images, span.start, span.stop)]
        rows, at = placed_inputs(runner.model, read)
    runner.mtp_prefill(checkpoint.hidden[None], a.prompt_ids[span], a.state, at, rows)
