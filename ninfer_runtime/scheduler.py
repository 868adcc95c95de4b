"""The engine's scheduling: which requests hold lanes, and what each step runs for them.

A ``Scheduler`` owns the waiting queue, the running lanes and the context pool's pages as
they are shared with the prefix cache. It admits requests first come first served, each
resuming from the deepest cached checkpoint of what it has consumed (or waiting a step or
two for one a running lane is about to keep); it packs the lanes still reading their
prompts into one prefill chunk; it grows the generating lanes' pages, evicting checkpoints
and then preempting the most recently admitted lane when the pool runs short (to host
memory, else replayed from a checkpoint); and it keeps checkpoints where prefills stop and
generations end. It samples nothing and emits no events: the engine (``engine``) runs the
forwards it plans and turns their logits into tokens (the only model call here is the
drafter's entry a lane resuming from a checkpoint needs, with speculation). ``lane`` holds
the lane record, ``lane_checkpoints`` the checkpoints' planning and keeping, and
``prefill_reads`` the packing of a step's prefill chunk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from .lane import Lane, Read
from .lane_checkpoints import LaneCheckpoints, resume_drafter
from .prefill_reads import prefill_reads
from .prefix_cache import PrefixCache
from .runner import ModelRunner
from .state import ContextPool

#: ``Lane`` and ``Read`` live in ``lane``; their callers import them from here too
__all__ = ["Lane", "Read", "Scheduler"]


class Scheduler:
    """The waiting queue and the lanes of one engine, over its context pool and prefix
    cache (``cache``: None without one). ``margin``: positions a lane's pages hold beyond
    its tokens (a speculative round's K+1); ``drafting``: whether lanes carry a drafter's
    entries (speculation), which resuming from a checkpoint must restore."""

    def __init__(
        self,
        pool: ContextPool,
        cache: PrefixCache | None,
        runner: ModelRunner,
        *,
        max_lanes: int,
        prefill_chunk: int,
        checkpoint_interval: int,
        margin: int,
        drafting: bool,
        host_capacity: int,
    ):
        self.pool = pool
        self.cache = cache
        self.runner = runner
        self.max_lanes = max_lanes
        self.prefill_chunk = prefill_chunk
        self.checkpoint_interval = checkpoint_interval
        #: the model keeps checkpoints inside a prefill read, so none ends one
        self.checkpoints_inside_reads = runner.checkpoints_inside_reads
        self.margin = margin
        self.drafting = drafting
        self.checkpoints = LaneCheckpoints(
            pool,
            cache,
            checkpoint_interval=checkpoint_interval,
            prefill_chunk=prefill_chunk,
            drafting=drafting,
        )
        #: requests not in a lane, first in line first: new ones, and preempted ones
        self.waiting: deque[Lane] = deque()
        #: the lanes running, by request id, in the order they were admitted
        self.active: dict[str, Lane] = {}
        self.preemptions = 0
        self.replayed_tokens = 0
        #: host memory preempted lanes may be copied to (beyond it they are replayed)
        self.host_capacity = host_capacity
        self.host_bytes = 0

    # ------------------------------------------------------------------ the queue
    @property
    def has_work(self) -> bool:
        return bool(self.active or self.waiting)

    def holds(self, request_id: str) -> bool:
        """Whether a request with this id is waiting or running."""
        return request_id in self.active or any(
            w.request.request_id == request_id for w in self.waiting
        )

    def queue(self, a: Lane) -> None:
        """``a`` waits for a lane, after the requests already waiting."""
        self.waiting.append(a)

    def cancel(self, request_id: str) -> Lane | None:
        """The request out of the queue or its lane (``retire`` frees its memory); None
        when it is neither waiting nor running."""
        for w in list(self.waiting):
            if w.request.request_id == request_id:
                self.waiting.remove(w)
                return w
        return self.active.pop(request_id, None)

    def retire(self, a: Lane, *, keep: bool) -> None:
        """``a``'s request has ended: out of its lane, its slot and pages back to the pool
        (and a host copy of them, if any, let go). ``keep``: it ended by itself (a stop or
        its length), and the next chat turn resends this exchange: keep where its generation
        ended (with speculation, before the round it ended in: that round is not committed)."""
        self.active.pop(a.request.request_id, None)
        if keep and a.state is not None:
            consumed = np.concatenate([a.cache_prompt, np.asarray(a.generated, dtype=np.int64)])
            self.checkpoints.keep(a, consumed, "generation", a.last_hidden)
        if a.state is not None:
            self.pool.close(a.state)
        a.state = None  # type: ignore[assignment]
        self._drop_saved(a)

    def pool_bytes(self) -> dict[str, int]:
        """The context pool's bytes by use: K/V pages running requests hold, pages only
        prefix-cache checkpoints hold, free pages, the lanes' recurrent state slots, and the
        pages checkpoints' state snapshots take."""
        # counted over the held pages only: the server asks every step, and a pool can hold
        # hundreds of thousands of pages (the bundled model's, filling an H200: about 350k)
        pool = self.pool
        running: set[int] = set()
        for a in self.active.values():
            if a.state is not None:
                running.update(a.state.pages)
        held = pool.pages - pool.free_pages  # pages any sequence or checkpoint holds
        cached = held - len(running) - pool.snapshot_pages_used
        return {
            "kv_running": len(running) * pool.page_bytes,
            "kv_cached": cached * pool.page_bytes,
            "kv_free": pool.free_pages * pool.page_bytes,
            "states": pool.slots * pool.slot_bytes,
            "snapshots": pool.snapshot_pages_used * pool.page_bytes,
        }

    # ------------------------------------------------------------- one step's plan
    def admit(self) -> Iterator[Lane]:
        """Admit waiting requests, first come first served, while a lane is free and the
        pool has room (a request waiting for another's shared checkpoint keeps its place
        without holding up those behind it); yield each one admitted with nothing left to
        prefill (its whole
        prompt was cached, or a preempted lane's replay begins) as it is admitted, so that
        one which finishes at once frees its lane for the next."""
        i = 0
        while i < len(self.waiting) and len(self.active) < self.max_lanes:
            a = self.waiting[i]
            if self.checkpoints.awaits_shared(a, self.active.values()):
                i += 1  # it keeps its place; the requests behind it need not wait with it
                continue
            if not self._admit(a):
                break  # first come, first served: wait until running requests free pages
            del self.waiting[i]
            self.active[a.request.request_id] = a
            if a.pending is None and a.prefilled == len(a.prompt_ids):
                yield a

    def prefill_reads(self) -> list[Read]:
        """This step's prefill chunk, shared by the lanes still reading their prompts,
        oldest first (``prefill_reads.prefill_reads``)."""
        return prefill_reads(
            self.active.values(),
            prefill_chunk=self.prefill_chunk,
            checkpoint_interval=None if self.cache is None else self.checkpoint_interval,
            inside=self.checkpoints_inside_reads,
        )

    def prefilled(self, a: Lane, end: int, hidden: Any, logits: Any) -> bool:
        """Lane ``a`` has read its prompt up to ``end``: a checkpoint where one goes
        (``hidden``: the last row's hidden state, for the drafter; ``logits``: the read's
        rows, the last of which a checkpoint at the prompt's end keeps). True: that was the
        prompt's end."""
        prompt = a.cache_prompt
        a.prefilled = end
        if end < len(prompt):
            kind = a.plan.get(end, "interval" if end % self.checkpoint_interval == 0 else None)
            if kind is not None:
                self.checkpoints.keep(a, prompt, kind, hidden)
            return False
        self.checkpoints.keep(a, prompt, "prompt_end", hidden, logits[-1])
        return True

    def generating(self) -> list[Lane]:
        """The lanes that generate this step, each with pages for its next token (and a
        round's margin): cached checkpoints are evicted, then the most recently admitted
        lanes preempted, until they all have them."""
        self._make_room([a for a in self.active.values() if a.pending is not None])
        return [a for a in self.active.values() if a.pending is not None]

    # ------------------------------------------------------------------ admission
    def _admit(self, a: Lane) -> bool:
        """Open a lane's memory for ``a``, continuing from the deepest cached checkpoint of
        what it has consumed; False: not now. Pages for what it has consumed and its next
        token (they grow as it generates)."""
        if a.saved is not None:
            return self._restore(a)
        consumed = self._consumed(a)
        need = len(consumed) + 1
        prefix = None
        # a prompt still to be scored is read from its first token: resuming from a
        # checkpoint would skip the positions it scores
        if self.cache is not None and a.prompt_scores is None:
            prefix = self.cache.lookup(consumed, whole=bool(a.generated), salt=a.request.cache_salt)
        shared = prefix.length // self.pool.page_tokens if prefix else 0
        # a preempted request comes back when it can also take its next page, so it is not
        # preempted again at once for the page it gave up
        headroom = bool(a.generated) and self.pool.pages_for(need) < self.pool.pages
        fresh = self.pool.pages_for(need) - shared + int(headroom)
        if self.pool.free_pages < fresh and self.cache is not None:
            self.cache.make_room(pages=fresh, keep=prefix)
            if self.pool.free_pages < fresh and prefix is not None:
                # the checkpoint's own pages are in the way: let it go too, start afresh
                fresh, prefix = self.pool.pages_for(need), None
                self.cache.make_room(pages=fresh)
        if self.pool.free_pages < fresh:
            return False
        a.open(self.pool.open(need, prefix))
        first = not a.generated
        if self.cache is not None and first:
            self.cache.count(len(a.prompt_ids), prefix)
        a.resumed = prefix.length if prefix is not None else 0
        a.prefilled = min(a.resumed, len(a.prompt_ids))
        if self.cache is not None and first:
            a.plan = self.checkpoints.plan(a, (*self.active.values(), *self.waiting))
        if not first:  # preempted: feed again what it generated after the resumed point
            a.replay = a.generated[max(a.resumed - len(a.prompt_ids), 0) :]
            self.replayed_tokens += len(a.replay) - 1
        if prefix is not None:
            if first:
                a.cached = prefix.length
            if self.drafting and prefix.length < len(a.prompt_ids):
                resume_drafter(self.runner, a, prefix)
        return True

    def _restore(self, a: Lane) -> bool:
        """A lane preempted to host memory back in the pool as it was, with room for the
        rest of its prompt or its next token (and its next page, so it is not preempted
        again at once)."""
        need = len(self._consumed(a)) + 1 + self.margin
        pages = self.pool.pages_for(need)
        fresh = pages + int(pages < min(self.pool.pages, self.pool.max_pages))
        if self.pool.free_pages < fresh and self.cache is not None:
            self.cache.make_room(pages=fresh)
        if self.pool.free_pages < fresh:
            return False
        a.open(self.pool.restore(a.saved, need))  # type: ignore[arg-type]
        self._drop_saved(a)
        return True

    def _drop_saved(self, a: Lane) -> None:
        if a.saved is not None:
            self.host_bytes -= a.saved.nbytes
            a.saved = None

    @staticmethod
    def _consumed(a: Lane) -> np.ndarray:
        """The tokens a lane's memory holds once it is all back, as the prefix cache keys
        them: the prompt, and every generated token but the pending one."""
        if not a.generated:
            return a.cache_prompt
        return np.concatenate([a.cache_prompt, np.asarray(a.generated[:-1], dtype=np.int64)])

    # ----------------------------------------------------------------- preemption
    def _make_room(self, lanes: list[Lane]) -> None:
        """Pages for every generating lane's next token (and a round's margin): evict
        cached checkpoints, then preempt the most recently admitted lanes."""
        for a in lanes:
            while self.active.get(a.request.request_id) is a and a.state.free < 1 + self.margin:
                if self.pool.grow(a.state):
                    continue
                if self.cache is not None and self.cache.make_room(pages=1):
                    continue
                self._preempt(list(self.active.values())[-1])

    def _preempt(self, a: Lane) -> None:
        """Free a lane's memory now and queue it first. Its memory goes to host memory when
        that has room (and comes back as it was), else it is let go: when admitted again
        the lane resumes (from a checkpoint, else from its prompt) and replays what it
        generated. Either way its stream goes on where it was, with the same tokens."""
        self.active.pop(a.request.request_id)
        size = self.pool.host_bytes(a.state)
        if a.state.length and self.host_bytes + size <= self.host_capacity:
            a.saved = self.pool.save(a.state)
            self.host_bytes += a.saved.nbytes
        else:
            a.prefilled, a.replay = 0, []
            a.pending = None
        self.pool.close(a.state)
        a.state = None  # type: ignore[assignment]
        self.waiting.appendleft(a)
        self.preemptions += 1
