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
drafter's entry a lane resuming from a checkpoint needs, with speculation).
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .checkpoint_plan import awaited_position, choose_checkpoints, pending_checkpoints
from .frontend import DetokenizeStream, OutputParser, Sampler, StopMatcher
from .logprobs import TokenLogprobs
from .prefix_cache import PrefixCache, common_prefix
from .request import GenerationRequest
from .runner import ModelRunner
from .state import ContextPool, HostCopy, SequenceState

if TYPE_CHECKING:
    from .images import PromptImages

#: a prompt scored token by token (``prompt_logprobs``) is read in chunks of at most this
#: many tokens: each chunk's logits over the whole vocabulary are computed at once
PROMPT_LOGPROB_CHUNK = 256


@dataclass
class Lane:
    """One request as the engine runs it, from ``submit`` to its end: what it generates
    with, how far it has read and generated, and its memory (``state``: its lane's memory
    in the pool, None while it waits)."""

    request: GenerationRequest
    prompt_ids: np.ndarray
    state: SequenceState
    sampler: Sampler
    stops: StopMatcher
    detokenizer: DetokenizeStream
    parser: OutputParser | None
    max_tokens: int
    #: Index in ``generated`` where the answer starts; ``None`` while still in reasoning.
    answer_start: int | None = 0
    #: Most reasoning tokens (``</think>`` included) before the engine writes ``</think>``.
    thinking_budget: int | None = None
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # sampled token not yet fed to the model
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    #: the device sampler's random stream (the request's seed, else a random one)
    seed: int = field(default_factory=lambda: secrets.randbits(63))
    drafted: int = 0
    accepted: int = 0
    #: prompt tokens resumed from a cached checkpoint instead of prefilled
    cached: int = 0
    #: with the prefix cache, where the prompt stops being what the next chat turn resends
    #: (it renders this turn's reply without the reasoning opener): a checkpoint goes there
    history_end: int | None = None
    #: tokens the lane resumed from at its latest admission (a checkpoint's length)
    resumed: int = 0
    #: after a preemption: generated tokens to feed again (never sampled, never emitted)
    #: before the lane generates; the last is its pending token
    replay: list[int] = field(default_factory=list)
    #: with speculation and the prefix cache: the main model's hidden row of the last token
    #: consumed before the current round (what a checkpoint at the lane's length keeps)
    last_hidden: Any = None
    #: while preempted to host memory: its memory there (resumed as it was, nothing replayed)
    saved: HostCopy | None = None
    #: with ``prompt_logprobs``: each prompt position's score as its chunk is read
    prompt_scores: list[TokenLogprobs | None] | None = None
    #: with the prefix cache: prompt positions (before its end) where its prefill stops and
    #: keeps a checkpoint besides every ``checkpoint_interval`` tokens, and their kinds
    plan: dict[int, str] = field(default_factory=dict)
    #: a prompt with images: their rows, the M-RoPE positions and the prefix-cache key
    images: PromptImages | None = None

    @property
    def cache_prompt(self) -> np.ndarray:
        """The prompt as the prefix cache keys it: its ids, an image's placeholders standing
        for the image's digest (``images.PromptImages.cache_ids``)."""
        return self.prompt_ids if self.images is None else self.images.cache_ids

    def open(self, state: SequenceState) -> None:
        """``state`` is the lane's memory now; positions after its prompt continue with the
        prompt's M-RoPE offset."""
        self.state = state
        state.rope_delta = 0 if self.images is None else self.images.rope_delta


#: one lane's prefill read in a step: the lane, and the prompt span ``start:end`` it reads
Read = tuple[Lane, int, int]


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
        self.margin = margin
        self.drafting = drafting
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
            self._checkpoint(a, consumed, "generation", a.last_hidden)
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
            if self._awaits_shared_checkpoint(a):
                i += 1  # it keeps its place; the requests behind it need not wait with it
                continue
            if not self._admit(a):
                break  # first come, first served: wait until running requests free pages
            del self.waiting[i]
            self.active[a.request.request_id] = a
            if a.pending is None and a.prefilled == len(a.prompt_ids):
                yield a

    def prefill_reads(self) -> list[Read]:
        """This step's prefill chunk: at most ``prefill_chunk`` tokens, shared by the lanes
        still reading their prompts, oldest first: the oldest reads what it would alone, and
        the next ones join while their whole next read fits in what is left (requests that
        resume from a shared prefix each read a short tail: one forward reads them all,
        each weight streamed once). A read is never cut to fit, so a prompt's chunks end
        where they would alone and its numbers do not depend on the company it keeps. A
        lane scoring its prompt reads alone (every row's logits are computed)."""
        lanes = [a for a in self.active.values() if a.prefilled < len(a.prompt_ids)]
        budget, reads = self.prefill_chunk, []
        for a in lanes:
            scoring = a.prompt_scores is not None
            end = self._chunk_end(a)
            if reads and (scoring or end - a.prefilled > budget):
                continue
            reads.append((a, a.prefilled, end))
            budget -= end - a.prefilled
            if scoring or budget <= 0:
                break
        return reads

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
                self._checkpoint(a, prompt, kind, hidden)
            return False
        self._checkpoint(a, prompt, "prompt_end", hidden, logits[-1])
        return True

    def generating(self) -> list[Lane]:
        """The lanes that generate this step, each with pages for its next token (and a
        round's margin): cached checkpoints are evicted, then the most recently admitted
        lanes preempted, until they all have them."""
        self._make_room([a for a in self.active.values() if a.pending is not None])
        return [a for a in self.active.values() if a.pending is not None]

    # ------------------------------------------------------------------ admission
    def _awaits_shared_checkpoint(self, a: Lane) -> bool:
        """Whether ``a`` (not yet admitted, reading its prompt for the first time) should
        wait because a running lane with the same salt is prefilling the prompt ``a``
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
            for w in self.active.values()
            if w.request.cache_salt == salt and not w.generated and w.prefilled < len(w.prompt_ids)
        ]
        deepest = awaited_position(a.cache_prompt, writers)
        if not deepest:
            return False
        return deepest - self.cache.resumable(a.cache_prompt, salt) >= self.prefill_chunk

    def _plan_checkpoints(self, a: Lane) -> dict[int, str]:
        """Where ``a``'s prefill keeps checkpoints besides every ``checkpoint_interval``
        tokens and its end (``checkpoint_plan``): where a chat prompt stops being what the
        next turn resends, and the best of the request's own boundaries."""
        assert self.cache is not None
        prompt, salt = a.cache_prompt, a.request.cache_salt
        plan = {}
        if a.history_end is not None:
            plan[a.history_end] = "boundary"
        if not a.request.cache_boundaries:  # nothing to choose: no sharers to count
            return plan
        others = [
            common_prefix(w.cache_prompt, prompt)
            for w in (*self.active.values(), *self.waiting)
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
            a.plan = self._plan_checkpoints(a)
        if not first:  # preempted: feed again what it generated after the resumed point
            a.replay = a.generated[max(a.resumed - len(a.prompt_ids), 0) :]
            self.replayed_tokens += len(a.replay) - 1
        if prefix is not None:
            if first:
                a.cached = prefix.length
            if self.drafting and prefix.length < len(a.prompt_ids):
                # the drafter's entry of the last kept token, now that the next is known
                span = slice(prefix.length, prefix.length + 1)
                rows = at = None
                if a.images is not None:  # at its M-RoPE position, an image's row placed
                    from .images import placed_inputs

                    read = [(a.prompt_ids, a.images, span.start, span.stop)]
                    rows, at = placed_inputs(self.runner.model, read)
                self.runner.mtp_prefill(prefix.hidden[None], a.prompt_ids[span], a.state, at, rows)
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

    # ---------------------------------------------------------------- checkpoints
    def _checkpoint(
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
        if self.cache.refresh(tokens[: a.state.length], salt):
            return
        if self.pool.free_pages < self.pool.snapshot_pages:
            self.cache.make_room(pages=self.pool.snapshot_pages)
        kept = self.pool.keep(a.state, hidden, logits, kind)
        if kept is not None:
            self.cache.insert(tokens[: a.state.length], kept, salt)

    def _chunk_end(self, a: Lane) -> int:
        """Where lane ``a``'s next prefill read ends: at most ``prefill_chunk`` tokens on,
        where a checkpoint goes, and a scored prompt's chunks stay bounded."""
        start, prompt = a.prefilled, a.prompt_ids
        end = min(start + self.prefill_chunk, len(prompt))
        if a.prompt_scores is not None:  # every row's logits are computed: keep them bounded
            end = min(end, start + PROMPT_LOGPROB_CHUNK)
        if self.cache is not None:
            end = min(end, (start // self.checkpoint_interval + 1) * self.checkpoint_interval)
            end = min([end, *(p for p in a.plan if p > start)])
        return end
