"""The engine: requests in, token and text events out, several requests batched in lanes.

One ``step()`` runs one prefill chunk (the oldest request still reading its prompt, joined by
others whose next read fits beside it) and one batched decode step for every request that is
generating, so long prompts never stall the lanes that are already streaming (continuous
batching). With speculative decoding
(``spec``) the decode step is a round: the MTP block drafts K tokens per lane, one batched
forward verifies them, and each lane emits the tokens it keeps (``speculative``); a token
is emitted only once its round has committed. The CLI, perplexity and the server
drive the same object; the model underneath is the same on every backend.
"""

from __future__ import annotations

import secrets
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ninfer_format import Artifact, ArtifactError

from .arrays import array_module
from .backends.base import to_numpy
from .checkpoint_plan import (
    awaited_position,
    check_cache_fields,
    choose_checkpoints,
    pending_checkpoints,
)
from .errors import EngineError, RequestError
from .frontend import (
    ChatTemplate,
    DetokenizeStream,
    OutputParser,
    ParseEvent,
    Sampler,
    SamplingParams,
    StopMatcher,
    StopReason,
    Tokenizer,
)
from .frontend.tokenizer import THINK_OPEN
from .logprobs import TokenLogprobs, TopLogprobs, score_rows, token_logprobs
from .models import ForwardOutput, load_model
from .prefix_cache import CacheBoundary, PrefixCache, common_prefix
from .runner import ModelRunner
from .speculative import SpecConfig, SpecStats, accept_greedy, accept_sampled
from .state import HostCopy, SequenceState
from .tensor_parallel import parallel_runner

#: ``(logits [V] float32, answer token ids so far) -> logits``: a per-request hook run before
#: sampling (constrained decoding masks tokens with ``-inf``). It sees only the answer part:
#: it is not called while the output is still inside reasoning, so a grammar applies after
#: ``</think>`` and thinking stays free. Reasoning is bounded so the answer always comes: by
#: ``SamplingParams.max_thinking_tokens``; with a processor, by at most half of ``max_tokens``
#: too, and a stop token drawn inside reasoning ends the reasoning instead.
LogitsProcessor = Callable[[np.ndarray, Sequence[int]], np.ndarray]

#: with the prefix cache and no context capacity given, the pool holds beside every lane's
#: full context this many checkpoints' GDN state snapshots per lane (a capacity given is
#: all shared: pages go to K/V or snapshots as the workload needs)
CACHE_SNAPSHOTS_PER_LANE = 4
#: prompt chunks of up to this many tokens run as one compiled multi-row step (as a
#: speculative round's verification does), not as a prefill: a chat prompt's tail after
#: the checkpoint the next turn resumes from is a few generation-prompt tokens, and a
#: prefill of them would cost a whole prefill's launches
SHORT_CHUNK_TOKENS = 8
#: a prompt scored token by token (``prompt_logprobs``) is read in chunks of at most this
#: many tokens: each chunk's logits over the whole vocabulary are computed at once
PROMPT_LOGPROB_CHUNK = 256


@dataclass
class GenerationRequest:
    """What to generate from: chat ``messages`` (rendered with the chat template), a ``prompt``
    string tokenized as is, or ``prompt_ids``; exactly one of them."""

    messages: Sequence[Mapping[str, Any]] | None = None
    prompt: str | None = None
    prompt_ids: Sequence[int] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    enable_thinking: bool | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    #: Leave the final assistant message open and continue it (assistant prefill).
    continue_final_message: bool = False
    #: End the prompt with the template's opening of an assistant turn (never when
    #: continuing the final message); off, the model continues after the last message.
    add_generation_prompt: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    parse_output: bool = True
    #: Read ``<tool_call>`` blocks as calls; off, they stay text (``tool_choice: none``).
    parse_tool_calls: bool = True
    logits_processor: LogitsProcessor | None = None
    request_id: str = field(default_factory=lambda: f"req-{uuid.uuid4().hex[:16]}")
    #: The prefix-cache namespace: checkpoints this request keeps are stored under it and
    #: its lookup finds only checkpoints kept under the same salt (None: the unsalted one).
    cache_salt: str | None = None
    #: Prompt positions where this request's prefill may keep a checkpoint for others that
    #: share the prompt up to there; the engine keeps the few worth most (``checkpoint_plan``).
    cache_boundaries: Sequence[CacheBoundary] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    #: Generated tokens that were reasoning (up to and including ``</think>``).
    reasoning_tokens: int = 0
    #: Speculative decoding: drafted tokens verification kept, and those it turned down.
    accepted_draft_tokens: int = 0
    rejected_draft_tokens: int = 0


@dataclass(frozen=True)
class TokenEvent:
    """A generated token. With ``SamplingParams.logprobs = k``: its log-probability and the
    k most likely tokens at its position (``logprobs`` module docs: what they are computed
    from); both None when the request asked for none."""

    request_id: str
    token_id: int
    logprob: float | None = None
    top_logprobs: TopLogprobs | None = None


@dataclass(frozen=True)
class PromptLogprobs:
    """With ``SamplingParams.prompt_logprobs = k``, once the prompt is read (before the first
    token): per prompt token its log-probability given the tokens before it and the k most
    likely tokens there; None for the first token, which nothing predicts."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    top_logprobs: tuple[TopLogprobs | None, ...]


@dataclass(frozen=True)
class OutputEvent:
    """A parsed piece of the reply: reasoning, text or a tool-call delta (frontend.parsers)."""

    request_id: str
    event: ParseEvent


@dataclass(frozen=True)
class Finished:
    request_id: str
    reason: str  # "stop" | "length" | "cancelled"
    stop: StopReason | None
    usage: Usage
    prompt_seconds: float
    decode_seconds: float


@dataclass(frozen=True)
class Failed:
    """A request ended by an error of its own (its sampling or its logits processor raised);
    its lane and memory are freed and the other requests go on."""

    request_id: str
    error: Exception


Event = TokenEvent | PromptLogprobs | OutputEvent | Finished | Failed


@dataclass
class _Active:
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


class Engine:
    """Load an artifact once, then serve requests through ``submit``/``step`` or ``generate``."""

    def __init__(
        self,
        artifact: str | Path | Artifact,
        *,
        backend: str = "cpu",
        max_context: int = 4096,
        max_lanes: int = 8,
        prefill_chunk: int = 512,
        chat_template: str | None = None,
        context_capacity: int | str | None = None,
        memory_headroom: int | str | None = None,
        kv_dtype: str = "float32",
        spec: SpecConfig | None = None,
        prefix_cache: bool = False,
        checkpoint_interval: int = 8192,
        host_context_capacity: int | str | None = 0,
        tensor_parallel: int = 1,
        expert_parallel: bool = False,
    ):
        if not 1 <= max_lanes <= 8:
            raise EngineError(f"max_lanes must be in 1..8, got {max_lanes}")
        if max_context < 2 or prefill_chunk < 1 or checkpoint_interval < 1:
            raise EngineError(
                "max_context must be >= 2, prefill_chunk and checkpoint_interval >= 1"
            )
        try:
            self.artifact = artifact if isinstance(artifact, Artifact) else Artifact.open(artifact)
            resources = {
                role: self.artifact.resource(role)
                for role in (self.artifact.components["text"].resources or {})
            }
        except ArtifactError as exc:
            raise EngineError(str(exc)) from None
        if tensor_parallel < 1:
            raise EngineError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
        if expert_parallel and tensor_parallel < 2:
            raise EngineError(
                "expert_parallel (--expert-parallel) needs tensor_parallel (--tensor-parallel) "
                ">= 2: it holds each expert on one of the ranks"
            )
        if tensor_parallel > 1:  # rank 0 here, the other ranks following its runner's calls
            self.model, self.runner, stop = parallel_runner(
                self.artifact, backend, tensor_parallel, expert_parallel
            )
            weakref.finalize(self, stop)
        else:
            self.model = load_model(self.artifact, backend=backend)
            self.runner = ModelRunner(self.model)
        self.tokenizer = Tokenizer.from_resources(resources)
        self.template = ChatTemplate.from_resources(resources, override=chat_template)
        self.max_context = max_context
        self.max_lanes = max_lanes
        self.prefill_chunk = prefill_chunk
        self._device_sampler = self.model.backend.device_sampler()
        self.spec = spec
        self.spec_stats = SpecStats(spec.draft_tokens) if spec else None
        if spec is not None and not self.model.has_mtp:
            raise EngineError(
                f"{self.artifact.path}: the artifact has no mtp component; speculative "
                f"method {spec.method!r} needs one (convert with --components text,mtp)"
            )
        # a round writes up to K+1 positions past a sequence's length: a lane's pages grow
        # to hold that margin beyond its own tokens before every round
        self._margin = spec.draft_tokens + 1 if spec else 0
        self.preemptions = 0
        self.replayed_tokens = 0
        #: host memory preempted lanes may be copied to (beyond it they are replayed)
        self.host_capacity = parse_size(host_context_capacity, "host context capacity") or 0
        self.host_bytes = 0
        self.pool = self.runner.new_pool(
            lanes=max_lanes,
            max_context=max_context + self._margin,
            budget=budget_bytes(
                parse_capacity(context_capacity), self.model.backend, parse_size(memory_headroom)
            ),
            kv_dtype=kv_dtype,
            draft_tokens=spec.draft_tokens if spec else 0,
            step_rows=SHORT_CHUNK_TOKENS,
            snapshots=CACHE_SNAPSHOTS_PER_LANE * max_lanes if prefix_cache else 0,
        )
        #: checkpoints of earlier prompts and generations, resumed by later requests
        self.cache = (
            PrefixCache(self.pool, self._cache_salt(backend, kv_dtype)) if prefix_cache else None
        )
        self.checkpoint_interval = checkpoint_interval
        self._waiting: deque[_Active] = deque()
        self._active: dict[str, _Active] = {}

    def _cache_salt(self, backend: str, kv_dtype: str) -> bytes:
        """What decides a checkpoint's states besides its tokens."""
        return b"|".join([self.artifact.artifact_id, backend.encode(), kv_dtype.encode()])

    # ------------------------------------------------------------------ admission
    @property
    def lanes_in_use(self) -> int:
        return len(self._active)

    @property
    def context_usage(self) -> float:
        """Fraction of the context pool's pages held by running requests (pages only
        checkpoints hold are the cache's: they go when a request needs them)."""
        return self.pool_bytes()["kv_running"] / (self.pool.pages * self.pool.page_bytes or 1)

    def pool_bytes(self) -> dict[str, int]:
        """The context pool's bytes by use: K/V pages running requests hold, pages only
        prefix-cache checkpoints hold, free pages, the lanes' recurrent state slots, and the
        pages checkpoints' state snapshots take."""
        # counted over the held pages only: the server asks every step, and a pool can hold
        # hundreds of thousands of pages (the bundled model's, filling an H200: about 350k)
        pool = self.pool
        running: set[int] = set()
        for a in self._active.values():
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

    @property
    def pool_tokens(self) -> int:
        """The most tokens one sequence can ever hold in the context pool (prompt and output
        together), below ``max_context`` when the pool is the smaller."""
        return self.pool.capacity_tokens - self._margin

    @property
    def has_work(self) -> bool:
        return bool(self._active or self._waiting)

    def render(self, request: GenerationRequest) -> tuple[list[int], bool]:
        """Prompt token ids, and whether the output starts inside reasoning."""
        given = [x is not None for x in (request.messages, request.prompt, request.prompt_ids)]
        if sum(given) != 1:
            raise RequestError(
                "give exactly one of messages, prompt or prompt_ids", param="messages"
            )
        if request.prompt_ids is not None:
            ids = [int(t) for t in request.prompt_ids]
            return ids, False
        if request.prompt is not None:
            return self.tokenizer.encode(request.prompt), False
        text = self.template.render(
            request.messages,  # type: ignore[arg-type]
            tools=request.tools,
            add_generation_prompt=request.add_generation_prompt
            and not request.continue_final_message,
            continue_final_message=request.continue_final_message,
            enable_thinking=request.enable_thinking,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        opened = text.rstrip().endswith(THINK_OPEN)
        return self.tokenizer.encode(text), opened

    def submit(
        self, request: GenerationRequest, *, rendered: tuple[Sequence[int], bool] | None = None
    ) -> str:
        """Validate and queue a request; it gets a lane in the next steps when one is free.

        ``rendered`` is ``render(request)`` when the caller already ran it (a server renders
        first to count tokens and refuse oversized prompts before queueing), so the prompt is
        not rendered twice.
        """
        ids, in_reasoning = rendered if rendered is not None else self.render(request)
        ids = [int(t) for t in ids]
        if not ids:
            raise RequestError("the prompt is empty", param="messages")
        if len(ids) >= self.max_context:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; max_context is {self.max_context} "
                "(prompt plus at least one generated token)",
                param="messages",
                code="context_length_exceeded",
            )
        vocab = self.model.config.vocab
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(
                f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt_ids"
            )
        params = request.sampling
        holds = self.pool_tokens
        room = min(self.max_context, holds) - len(ids)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the context pool holds {holds} in all",
                param="messages",
                code="context_length_exceeded",
            )
        max_tokens = min(params.max_tokens or room, room)
        budget = params.max_thinking_tokens
        if request.logits_processor is not None:  # a constrained answer is never starved
            budget = min(budget or max_tokens, max(max_tokens // 2, 1))
        parser = None
        if request.parse_output:
            parser = OutputParser(
                starts_in_reasoning=in_reasoning,
                tools=request.tools,
                parse_tool_calls=request.parse_tool_calls,
                continues_text=request.continue_final_message,
            )
        active = _Active(
            request=request,
            prompt_ids=np.asarray(ids, dtype=np.int64),
            state=None,  # type: ignore[arg-type]  (allocated when admitted to a lane)
            sampler=Sampler(params, ids),
            stops=StopMatcher.from_params(params, self.tokenizer.eos_token_ids),
            detokenizer=self.tokenizer.detokenize_stream(
                skip_special_tokens=params.skip_special_tokens
            ),
            parser=parser,
            max_tokens=max_tokens,
            answer_start=None if in_reasoning else 0,
            thinking_budget=budget if in_reasoning else None,
        )
        if params.seed is not None:
            active.seed = params.seed
        if params.prompt_logprobs is not None:
            active.prompt_scores = [None] * len(ids)
        check_cache_fields(request.cache_salt, request.cache_boundaries, len(ids))
        if self.cache is not None:
            active.history_end = self._history_end(request, ids)
        if request.request_id in self._active or any(
            w.request.request_id == request.request_id for w in self._waiting
        ):
            raise RequestError(f"request id {request.request_id!r} is already in use")
        self._waiting.append(active)
        return request.request_id

    def cancel(self, request_id: str) -> Finished | None:
        """Stop a request now and free its lane and memory."""
        for w in list(self._waiting):
            if w.request.request_id == request_id:
                self._waiting.remove(w)
                return self._finish(w, "cancelled", None, [])
        active = self._active.pop(request_id, None)
        if active is None:
            return None
        return self._finish(active, "cancelled", None, [])

    # ----------------------------------------------------------------------- steps
    def step(self, flush: Callable[[list[Event]], None] | None = None) -> list[Event]:
        """Admit what fits, run one prefill chunk and one decode step (or round); the
        events of all three. ``flush``, when given, gets the admission and prefill part's
        events as soon as they are known, before the decode step runs (a server streams a
        first token without waiting for it); they are then left out of the list returned."""
        events: list[Event] = []
        while self._waiting and len(self._active) < self.max_lanes:
            head = self._waiting[0]
            if self._awaits_shared_checkpoint(head) or not self._admit(head):
                break  # first come, first served: wait until running requests free pages
            self._waiting.popleft()
            self._active[head.request.request_id] = head
            if head.pending is None and head.prefilled == len(head.prompt_ids):
                # the whole prompt was cached, or a preempted lane's replay begins
                logits = head.state.resumed_logits
                out = None if logits is None else ForwardOutput([logits[None]], [None])
                self._prompts_done([head], out, events)
        prefilling = [a for a in self._active.values() if a.prefilled < len(a.prompt_ids)]
        if prefilling:
            self._prefill(prefilling, events)
        if flush is not None and events:
            flush(events)
            events = []
        self._make_room([a for a in self._active.values() if a.pending is not None])
        decoding = [a for a in self._active.values() if a.pending is not None]
        if self.spec is None:
            if decoding:
                self._decode(decoding, events)
            return events
        # lanes replaying after a preemption feed their known tokens one step at a time
        replaying = [a for a in decoding if a.replay]
        generating = [a for a in decoding if not a.replay]
        if replaying:
            self._decode(replaying, events)
        if generating:
            self._speculate(generating, events)
        return events

    def _history_end(self, request: GenerationRequest, ids: list[int]) -> int | None:
        """How many of a chat prompt's tokens the next turn resends unchanged: the prompt's
        common prefix with the conversation rendered as history (this turn answered, one
        more user message), None when that is all of it or nothing."""
        if request.messages is None or request.continue_final_message:
            return None
        placeholder = [{"role": "assistant", "content": "x"}, {"role": "user", "content": "x"}]
        text = self.template.render(
            [*request.messages, *placeholder],
            tools=request.tools,
            add_generation_prompt=False,
            enable_thinking=request.enable_thinking,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        later = np.asarray(self.tokenizer.encode(text), dtype=np.int64)
        shared = common_prefix(np.asarray(ids, dtype=np.int64), later)
        return shared if 0 < shared < len(ids) else None

    def _awaits_shared_checkpoint(self, a: _Active) -> bool:
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
                w.prompt_ids,
                pending_checkpoints(
                    w.plan,
                    prefilled=w.prefilled,
                    prompt_tokens=len(w.prompt_ids),
                    interval=self.checkpoint_interval,
                ),
            )
            for w in self._active.values()
            if w.request.cache_salt == salt and not w.generated and w.prefilled < len(w.prompt_ids)
        ]
        deepest = awaited_position(a.prompt_ids, writers)
        if not deepest:
            return False
        return deepest - self.cache.resumable(a.prompt_ids, salt) >= self.prefill_chunk

    def _plan_checkpoints(self, a: _Active) -> dict[int, str]:
        """Where ``a``'s prefill keeps checkpoints besides every ``checkpoint_interval``
        tokens and its end (``checkpoint_plan``): where a chat prompt stops being what the
        next turn resends, and the best of the request's own boundaries."""
        assert self.cache is not None
        prompt, salt = a.prompt_ids, a.request.cache_salt
        plan = {}
        if a.history_end is not None:
            plan[a.history_end] = "boundary"
        if not a.request.cache_boundaries:  # nothing to choose: no sharers to count
            return plan
        others = [
            common_prefix(w.prompt_ids, prompt)
            for w in (*self._active.values(), *self._waiting)
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

    def _admit(self, a: _Active) -> bool:
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
        a.state = self.pool.open(need, prefix)
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
            if self.spec is not None and prefix.length < len(a.prompt_ids):
                # the drafter's entry of the last kept token, now that the next is known
                nxt = a.prompt_ids[prefix.length : prefix.length + 1]
                self.runner.mtp_prefill(prefix.hidden[None], nxt, a.state)
        return True

    def _restore(self, a: _Active) -> bool:
        """A lane preempted to host memory back in the pool as it was, with room for the
        rest of its prompt or its next token (and its next page, so it is not preempted
        again at once)."""
        need = len(self._consumed(a)) + 1 + self._margin
        pages = self.pool.pages_for(need)
        fresh = pages + int(pages < min(self.pool.pages, self.pool.max_pages))
        if self.pool.free_pages < fresh and self.cache is not None:
            self.cache.make_room(pages=fresh)
        if self.pool.free_pages < fresh:
            return False
        a.state = self.pool.restore(a.saved, need)  # type: ignore[arg-type]
        self._drop_saved(a)
        return True

    def _drop_saved(self, a: _Active) -> None:
        if a.saved is not None:
            self.host_bytes -= a.saved.nbytes
            a.saved = None

    @staticmethod
    def _consumed(a: _Active) -> np.ndarray:
        """The tokens a lane's memory holds once it is all back: the prompt, and every
        generated token but the pending one."""
        if not a.generated:
            return a.prompt_ids
        return np.concatenate([a.prompt_ids, np.asarray(a.generated[:-1], dtype=np.int64)])

    def _make_room(self, lanes: list[_Active]) -> None:
        """Pages for every generating lane's next token (and a round's margin): evict
        cached checkpoints, then preempt the most recently admitted lanes."""
        for a in lanes:
            while self._active.get(a.request.request_id) is a and a.state.free < 1 + self._margin:
                if self.pool.grow(a.state):
                    continue
                if self.cache is not None and self.cache.make_room(pages=1):
                    continue
                self._preempt(list(self._active.values())[-1])

    def _preempt(self, a: _Active) -> None:
        """Free a lane's memory now and queue it first. Its memory goes to host memory when
        that has room (and comes back as it was), else it is let go: when admitted again
        the lane resumes (from a checkpoint, else from its prompt) and replays what it
        generated. Either way its stream goes on where it was, with the same tokens."""
        self._active.pop(a.request.request_id)
        size = self.pool.host_bytes(a.state)
        if a.state.length and self.host_bytes + size <= self.host_capacity:
            a.saved = self.pool.save(a.state)
            self.host_bytes += a.saved.nbytes
        else:
            a.prefilled, a.replay = 0, []
            a.pending = None
        self.pool.close(a.state)
        a.state = None  # type: ignore[assignment]
        self._waiting.appendleft(a)
        self.preemptions += 1

    def _checkpoint(
        self,
        a: _Active,
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
        if self.spec is not None and hidden is None:  # the drafter could not resume from it
            return
        salt = a.request.cache_salt
        if self.cache.refresh(tokens[: a.state.length], salt):
            return
        if self.pool.free_pages < self.pool.snapshot_pages:
            self.cache.make_room(pages=self.pool.snapshot_pages)
        kept = self.pool.keep(a.state, hidden, logits, kind)
        if kept is not None:
            self.cache.insert(tokens[: a.state.length], kept, salt)

    def _prefill(self, lanes: list[_Active], events: list[Event]) -> None:
        """One prefill chunk of at most ``prefill_chunk`` tokens, shared by the lanes still
        reading their prompts, oldest first: the oldest reads what it would alone, and the
        next ones join while their whole next read fits in what is left (requests that
        resume from a shared prefix each read a short tail: one forward reads them all,
        each weight streamed once). A read is never cut to fit, so a prompt's chunks end
        where they would alone and its numbers do not depend on the company it keeps. A
        lane scoring its prompt reads alone (every row's logits are computed)."""
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
        scoring = reads[0][0].prompt_scores is not None
        out = self.runner.forward(
            [a.prompt_ids[start:end] for a, start, end in reads],
            [a.state for a, _, _ in reads],
            last_only=not scoring,
        )
        done = [
            i
            for i, (a, start, end) in enumerate(reads)
            if self._prefilled(a, start, end, out.logits[i], out.hidden[i], events)
        ]
        if done:  # their first tokens, sampled together
            whole = len(done) == len(reads) and out.last_logits is not None
            self._prompts_done(
                [reads[i][0] for i in done],
                ForwardOutput(
                    [out.logits[i] for i in done],
                    [out.hidden[i] for i in done],
                    out.last_logits if whole else None,
                ),
                events,
            )

    def _chunk_end(self, a: _Active) -> int:
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

    def _prefilled(
        self, a: _Active, start: int, end: int, logits: Any, hidden: Any, events: list[Event]
    ) -> bool:
        """Lane ``a`` has read ``start:end`` of its prompt (``logits``: its rows', or only
        the last row's; ``hidden``: its rows'): scores, the drafter's entries and a
        checkpoint where one goes. True: that was the prompt's end."""
        prompt = a.prompt_ids
        scoring = a.prompt_scores is not None
        if scoring:
            self._score_prompt(a, start, end, logits)
        if self.spec is not None:  # the drafter reads the prompt too
            self.runner.mtp_prefill(hidden, prompt[start + 1 : end + 1], a.state)
        a.prefilled = end
        last = hidden[-1] if self.spec is not None else None
        if end < len(prompt):
            kind = a.plan.get(end, "interval" if end % self.checkpoint_interval == 0 else None)
            if kind is not None:
                self._checkpoint(a, prompt, kind, last)
            return False
        self._checkpoint(a, prompt, "prompt_end", last, logits[-1])
        if scoring:
            events.append(self._prompt_logprobs(a))
        return True

    @staticmethod
    def _score_prompt(a: _Active, start: int, end: int, rows: Any) -> None:
        """Scores of the prompt tokens the chunk ``start:end`` predicts: its row i (logits
        [end - start, V]) predicts token ``start + i + 1``; the chunk's last row the next
        chunk's first token, when there is one."""
        targets = a.prompt_ids[start + 1 : end + 1].tolist()
        if targets and a.prompt_scores is not None:
            k = a.request.sampling.prompt_logprobs or 0
            scores = token_logprobs(rows[: len(targets)], targets, [k] * len(targets))
            a.prompt_scores[start + 1 : start + 1 + len(targets)] = scores

    @staticmethod
    def _prompt_logprobs(a: _Active) -> PromptLogprobs:
        """The prompt's scores as one event; the prompt is scored once (read again after a
        preemption, it is not scored again)."""
        scores = a.prompt_scores or []
        a.prompt_scores = None
        return PromptLogprobs(
            a.request.request_id,
            tuple(int(t) for t in a.prompt_ids),
            tuple(None if s is None else s.logprob for s in scores),
            tuple(None if s is None else s.top for s in scores),
        )

    def _prompts_done(
        self, lanes: list[_Active], out: ForwardOutput | None, events: list[Event]
    ) -> None:
        """The lanes' prompts are in: each one's first token from its last logits (``out``,
        lane by lane), or for a preempted lane the first token to replay."""
        fresh = [i for i, a in enumerate(lanes) if not a.generated]
        for a in lanes:
            if a.generated:
                a.pending = a.replay.pop(0)
        if not fresh:
            return
        assert out is not None
        if len(fresh) < len(lanes):
            out = ForwardOutput([out.logits[i] for i in fresh], [out.hidden[i] for i in fresh])
        now = time.perf_counter()
        for i in fresh:
            lanes[i].first_token = now
        for lane, token, score in self._sample([lanes[i] for i in fresh], out, events):
            self._emit(lane, token, events, score)

    def _decode(self, lanes: list[_Active], events: list[Event]) -> None:
        tokens = [np.asarray([a.pending], dtype=np.int64) for a in lanes]
        out = self.runner.forward(tokens, [a.state for a in lanes], last_only=True)
        if self.spec is not None:  # replaying: the drafter's entries follow the tokens
            xp, kept = self.model.backend.xp, self.pool.draft_hidden
            for a, fed, hidden in zip(lanes, tokens, out.hidden, strict=True):
                rows = xp.concatenate([kept[a.state.slot, :1], hidden[-1:]])
                self.runner.mtp_prefill(rows, fed, a.state)
        generating = [i for i, a in enumerate(lanes) if not a.replay]
        for a in lanes:
            if a.replay:  # replaying after a preemption: the next token is known
                a.pending = a.replay.pop(0)
        if len(generating) < len(lanes):
            out = ForwardOutput(
                [out.logits[i] for i in generating], [out.hidden[i] for i in generating]
            )
        for a, token, score in self._sample([lanes[i] for i in generating], out, events):
            self._emit(a, token, events, score)

    def _speculate(self, lanes: list[_Active], events: list[Event]) -> None:
        """One speculative round for every generating lane. A lane whose next tokens the
        engine constrains (a logits processor, a thinking budget closing within the round)
        keeps only the main model's first token, sampled as in a plain step."""
        k = self.spec.draft_tokens  # type: ignore[union-attr]
        if self.cache is not None:  # a lane ending in this round keeps a checkpoint with it
            xp = self.model.backend.xp
            rows = self.pool.draft_hidden[
                xp.asarray([a.state.slot for a in lanes]),
                xp.asarray([len(a.state.draft_carry) for a in lanes]),
            ]
            for a, row in zip(lanes, rows, strict=True):
                a.last_hidden = row
        proposal = self.runner.speculate(
            [a.state for a in lanes],
            [a.pending for a in lanes],
            k,
            optimized_head=self.spec.proposal_head == "optimized",  # type: ignore[union-attr]
        )
        kept: dict[str, list[int]] = {}
        for i, a in enumerate(lanes):
            rows = slice(i * (k + 1), (i + 1) * (k + 1))
            if not self._may_speculate(a, k):
                first = ForwardOutput([proposal.logits[rows.start : rows.start + 1]], [None])
                sampled = self._sample([a], first, events)
                tokens, scores = [t for _, t, _ in sampled], [s for _, _, s in sampled]
                drafts: list[int] = []
                self.spec_stats.fallbacks += 1  # type: ignore[union-attr]
            else:
                try:
                    tokens, scores = self._accept(
                        a, proposal.drafts[i], proposal.targets[i], proposal.logits[rows]
                    )
                except Exception as exc:  # this request's parameters, not the engine's
                    self._fail(a, exc, events)
                    continue
                drafts = tokens[:-1]
                a.drafted += k
                a.accepted += len(drafts)
                self.spec_stats.record(len(drafts))  # type: ignore[union-attr]
            for token, score in zip(tokens, scores, strict=True):
                self._emit(a, token, events, score)
                if a.pending is None:  # the request ended inside the round
                    break
            kept[a.request.request_id] = drafts
        # lanes still generating commit what they kept (the others have been released)
        survivors = [a for a in lanes if self._active.get(a.request.request_id) is a]
        if survivors:
            self.runner.commit(
                [a.state for a in survivors], [kept[a.request.request_id] for a in survivors]
            )

    def _may_speculate(self, a: _Active, k: int) -> bool:
        if a.request.logits_processor is not None or self._held_stops(a):
            return False  # a draft could be a stop token min_tokens forbids yet
        if a.answer_start is not None or a.thinking_budget is None:
            return True
        forced_from = a.thinking_budget - len(self.tokenizer.think_close_ids)
        return len(a.generated) + k < forced_from

    @staticmethod
    def _accept(
        a: _Active, drafts: Any, targets: Any, rows: Any
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """The tokens lane ``a`` keeps from its round (they count for its penalties), and
        with ``logprobs`` their scores: the main model's rows at their positions, penalised
        as plain decoding has them (the kept tokens before each count as generated)."""
        params = a.request.sampling
        plain_greedy = params.greedy and not (
            params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty
        )
        if plain_greedy:
            tokens = accept_greedy(drafts, targets)
            scored = rows[: len(tokens)]  # no penalties: scored where the rows are
        else:
            scored = to_numpy(rows).astype(np.float32)
            tokens = accept_sampled(a.sampler, drafts, scored)
        scores: list[TokenLogprobs | None] = [None] * len(tokens)
        if params.logprobs is not None:
            if not plain_greedy:
                scored = np.stack(
                    [a.sampler.penalized(scored[j], extra=tokens[:j]) for j in range(len(tokens))]
                )
            scores = list(token_logprobs(scored, tokens, [params.logprobs] * len(tokens)))
        a.sampler.accept(tokens)
        return tokens, scores

    def _sample(
        self, lanes: list[_Active], out: ForwardOutput, events: list[Event]
    ) -> list[tuple[_Active, int, TokenLogprobs | None]]:
        """Each lane's next token, and its score for a lane asking for logprobs; a lane
        whose own sampling fails is ended with ``Failed`` (in ``events``) and left out, so
        one request's error never stops the others."""
        if not lanes:  # every lane of the step was replaying
            return []
        forced = [self._forced(a) for a in lanes]
        on_device = self._device_sampler is not None and all(
            self._device_sampler.supports(a.request.sampling)
            and (a.request.logits_processor is None or a.answer_start is None)
            for a in lanes
        )
        if on_device:  # only the token ids cross to the host
            sampler = self._device_sampler
            sampler.set_lanes([(a.request.sampling, a.seed, len(a.generated)) for a in lanes])
            rows = out.last_logits
            if rows is None:
                rows = self.model.backend.xp.concatenate([row[-1:] for row in out.logits])
            drawn = [int(t) for t in to_numpy(sampler.sample(self._hold_stops(lanes, rows)))]
            tokens = [
                self._answer_instead_of_stop(a, t if f is None else f)
                for a, t, f in zip(lanes, drawn, forced, strict=True)
            ]
            # no lane here has penalties: its rows, where they are, are what it is scored on
            scores = score_rows(rows, tokens, [a.request.sampling.logprobs for a in lanes])
            return list(zip(lanes, tokens, scores, strict=True))
        picked = []
        for a, row, token in zip(lanes, out.logits, forced, strict=True):
            top = a.request.sampling.logprobs
            try:
                scores = scored = None
                if token is None or top is not None:  # a forced token needs no row
                    scores = to_numpy(row[-1]).astype(np.float32, copy=False)
                if top is not None:  # penalised by the tokens before this one only
                    scored = a.sampler.penalized(scores)
                if token is None:
                    process = a.request.logits_processor
                    if process is not None and a.answer_start is not None:
                        scores = process(scores.copy(), a.generated[a.answer_start :])
                    held = self._held_stops(a)
                    if held and np.isfinite(np.delete(scores, held)).any():
                        # a grammar that admits only a stop wins: the output ends there
                        scores = scores.copy()
                        scores[held] = -np.inf
                    token = a.sampler.sample(scores)
                else:
                    a.sampler.accept(token)  # counts for the penalties like a drawn token
                token = self._answer_instead_of_stop(a, token)
                score = None if top is None else token_logprobs(scored[None], [token], [top])[0]
                picked.append((a, token, score))
            except Exception as exc:  # this request's parameters or hook, not the engine's
                self._fail(a, exc, events)
        return picked

    def _held_stops(self, a: _Active) -> list[int]:
        """The stop token ids (EOS unless ignored, ``stop_token_ids``) lane ``a`` may not
        draw yet: all of them while it has fewer than ``min_tokens`` tokens, else none."""
        params = a.request.sampling
        if len(a.generated) >= params.min_tokens:
            return []
        vocab = self.model.config.vocab
        eos = () if params.ignore_eos else self.tokenizer.eos_token_ids
        return sorted({t for t in (*eos, *params.stop_token_ids) if t < vocab})

    def _hold_stops(self, lanes: list[_Active], rows: Any) -> Any:
        """``rows`` (lane i's logits, on the device) with the stop tokens each lane may not
        draw yet at -inf: a copy when any lane has some (the rows themselves are scored for
        logprobs as they are), else ``rows`` as given. The device twin of the host path's
        masking in ``_sample``."""
        held = [(i, self._held_stops(a)) for i, a in enumerate(lanes)]
        held = [(i, ids) for i, ids in held if ids]
        if not held:
            return rows
        xp = array_module(rows)
        rows = rows.copy()
        for i, ids in held:
            rows[i, xp.asarray(ids)] = -xp.inf
        return rows

    def _fail(self, a: _Active, error: Exception, events: list[Event]) -> None:
        self._active.pop(a.request.request_id, None)
        self._release(a)
        events.append(Failed(a.request.request_id, error))

    def _release(self, a: _Active) -> None:
        """The lane's slot and pages go back to the pool (and a host copy of them, if any,
        is let go)."""
        if a.state is not None:
            self.pool.close(a.state)
        a.state = None  # type: ignore[assignment]
        self._drop_saved(a)

    def _forced(self, a: _Active) -> int | None:
        """The token the thinking budget imposes now: once it is spent, ``</think>``."""
        if a.answer_start is not None or a.thinking_budget is None:
            return None
        close = self.tokenizer.think_close_ids
        at = len(a.generated) - max(a.thinking_budget - len(close), 0)
        return close[at] if 0 <= at < len(close) else None

    def _answer_instead_of_stop(self, a: _Active, token: int) -> int:
        """A constrained request must answer: a stop token drawn inside its reasoning spends
        the thinking budget there, so ``</think>`` and then the grammar's answer follow."""
        if (
            a.answer_start is None
            and a.request.logits_processor is not None
            and a.stops.is_stop_token(token)
        ):
            a.thinking_budget = len(a.generated) + len(self.tokenizer.think_close_ids)
            forced = self._forced(a)
            return token if forced is None else forced
        return token

    def _emit(
        self, a: _Active, token: int, events: list[Event], score: TokenLogprobs | None = None
    ) -> None:
        rid = a.request.request_id
        a.pending = None
        stop = a.stops.check_token(token)
        if stop is not None:
            self._close(a, "stop", stop, events)
            return
        a.generated.append(token)
        close = self.tokenizer.think_close_ids
        if a.answer_start is None and close and tuple(a.generated[-len(close) :]) == close:
            a.answer_start = len(a.generated)
        if score is None:
            events.append(TokenEvent(rid, token))
        else:
            events.append(TokenEvent(rid, token, score.logprob, score.top))
        may_stop = len(a.generated) >= a.request.sampling.min_tokens
        step = a.stops.feed(a.detokenizer.add(token), matching=may_stop)
        self._parse(a, step.text, events)
        if step.stop is not None:
            self._close(a, "stop", step.stop, events)
        elif len(a.generated) >= a.max_tokens:
            self._close(a, "length", None, events)
        else:
            a.pending = token

    def _parse(self, a: _Active, text: str, events: list[Event]) -> None:
        if not text:
            return
        rid = a.request.request_id
        if a.parser is None:
            from .frontend import TextDelta

            events.append(OutputEvent(rid, TextDelta(text)))
            return
        events.extend(OutputEvent(rid, e) for e in a.parser.feed(text))

    def _close(self, a: _Active, reason: str, stop: StopReason | None, events: list[Event]) -> None:
        self._active.pop(a.request.request_id, None)
        if stop is None or stop.kind != "stop_string":
            tail = a.detokenizer.flush()
            may_stop = len(a.generated) >= a.request.sampling.min_tokens
            step = (
                a.stops.feed(tail, matching=may_stop) if tail and a.stops.stopped is None else None
            )
            text = (step.text if step else "") + (
                a.stops.flush() if a.stops.stopped is None else ""
            )
            self._parse(a, text, events)
        events.append(self._finish(a, reason, stop, events))

    def _finish(
        self, a: _Active, reason: str, stop: StopReason | None, events: list[Event]
    ) -> Finished:
        rid = a.request.request_id
        if a.parser is not None:
            # a limit ended the output (max_tokens, the context, a stop the client asked for)
            cut_off = reason == "length" or (stop is not None and stop.kind != "eos")
            events.extend(OutputEvent(rid, e) for e in a.parser.finish(cut_off=cut_off))
        now = time.perf_counter()
        first = a.first_token or now
        if reason in ("stop", "length") and a.state is not None:
            # the next chat turn resends this exchange: keep where the generation ended
            # (with speculation, before the round it ended in: that round is not committed)
            consumed = np.concatenate([a.prompt_ids, np.asarray(a.generated, dtype=np.int64)])
            self._checkpoint(a, consumed, "generation", a.last_hidden)
        self._release(a)
        reasoning = len(a.generated) if a.answer_start is None else a.answer_start
        return Finished(
            rid,
            reason,
            stop,
            Usage(
                len(a.prompt_ids),
                len(a.generated),
                cached_tokens=a.cached,
                reasoning_tokens=reasoning,
                accepted_draft_tokens=a.accepted,
                rejected_draft_tokens=a.drafted - a.accepted,
            ),
            prompt_seconds=first - a.started,
            decode_seconds=now - first,
        )

    # ------------------------------------------------------------------ one-shot
    def generate(self, request: GenerationRequest) -> Iterator[Event]:
        """Submit one request and yield its events until it finishes."""
        rid = self.submit(request)
        while True:
            for event in self.step():
                if event.request_id == rid:
                    if isinstance(event, Failed):
                        raise event.error
                    yield event
                    if isinstance(event, Finished):
                        return
            if not self.has_work:
                return


_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
_UNITS.update({f"{u}B": v for u, v in list(_UNITS.items()) if u not in ("", "B")})
_UNITS.update({f"{u}IB": 1024 ** "KMGT".index(u) * 1024 for u in "KMGT"})


def parse_capacity(text: str | int | None) -> int | str | None:
    """``auto``, a byte count, or a size with a unit (``24GiB``, ``16G``, ``512 MiB``)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    size = _parse_size(text, "context capacity", "'auto' or a size such as 24GiB, 16G, 512MiB")
    if size is not None and size <= 0:
        raise EngineError(f"context capacity {text!r} must be positive")
    return size


def parse_size(text: str | int | None, what: str = "memory headroom") -> int | None:
    """A byte count, or a size with a unit (``4GiB``), zero or more; ``None`` stays ``None``."""
    return _parse_size(text, what, "a size such as 4GiB, 512MiB or a byte count")


def _parse_size(text: str | int | None, what: str, expected: str) -> int | None:
    if text is None or isinstance(text, int):
        if text is not None and text < 0:
            raise EngineError(f"{what} {text!r} must not be negative")
        return text
    value = text.strip().upper().replace(" ", "")
    number = value.rstrip("KMGTIB")
    unit = value[len(number) :]
    try:
        size = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise EngineError(f"{what} {text!r}: expected {expected}") from None
    if size < 0:
        raise EngineError(f"{what} {text!r} must not be negative")
    return int(size)


def budget_bytes(
    capacity: int | str | None, backend: Any, headroom: int | None = None
) -> int | None:
    """The context pool's byte budget: ``capacity`` as given (``None``: no limit), or for
    ``"auto"`` what the backend has free after weights and workspace, less ``headroom``
    (``None``: the backend's default; the result is ``None`` when it has no memory limit)."""
    if capacity == "auto":
        return backend.context_budget(headroom)
    return None if capacity is None else int(capacity)
