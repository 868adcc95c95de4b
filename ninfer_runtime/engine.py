"""The engine: requests in, token and text events out, several requests batched in lanes.

``Engine`` is the public API (``submit``, ``step``, ``generate``, ``cancel``): it decides what
each step runs and hands every other job to a module of its own: ``loader`` loads the
artifact, model, runner, tokenizer and template, ``intake`` renders a request and checks it
into a lane, ``step_forwards`` runs the prefill chunk and the plain decode step,
``token_choice`` picks each lane's next token from its logits, ``events`` turns the tokens
into events and ends lanes, ``speculative_round`` runs a round,
``prompt_logprobs`` scores prompts, ``pool_plan`` sizes the context pool. Which requests
hold lanes and what each step reads is the ``scheduler``'s job; the requests and events
themselves are in ``request`` (re-exported here).

One ``step()`` runs one prefill chunk (the oldest request still reading its prompt, joined by
others whose next read fits beside it) and one batched decode step for every request that is
generating, so long prompts never stall the lanes that are already streaming (continuous
batching). With speculative decoding
(``spec``) the decode step is a round: the MTP block drafts K tokens per lane, one batched
forward verifies them, and each lane emits the tokens it keeps (``speculative_round``); a token
is emitted only once its round has committed. The CLI, perplexity and the server
drive the same object; the model underneath is the same on every backend.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ninfer_format import Artifact

from .capacity import budget_bytes, parse_capacity, parse_size
from .errors import EngineError, RequestError
from .events import EventWriter
from .images import VisionOptions
from .intake import RequestIntake
from .kv_storage import resolve_kv_dtype
from .lane_limits import check_max_lanes
from .loader import load
from .media_cache import MediaCache
from .models import ForwardOutput
from .pool_plan import SHORT_CHUNK_TOKENS, PoolPlan
from .prefill_reads import default_prefill_chunk
from .prefix_cache import CacheBoundary, PrefixCache
from .request import (
    Event,
    Failed,
    Finished,
    GenerationRequest,
    LogitsProcessor,
    OutputEvent,
    PromptLogprobs,
    TokenEvent,
    Usage,
)
from .scheduler import Scheduler
from .speculative import SpecConfig, SpecStats
from .speculative_round import SpeculativeRounds, check_drafter
from .step_forwards import StepForwards
from .token_choice import TokenChooser

__all__ = [
    "SHORT_CHUNK_TOKENS",
    "CacheBoundary",
    "Engine",
    "Event",
    "Failed",
    "Finished",
    "GenerationRequest",
    "LogitsProcessor",
    "OutputEvent",
    "PromptLogprobs",
    "TokenEvent",
    "Usage",
    "VisionOptions",
    "budget_bytes",
    "parse_capacity",
    "parse_size",
]


class Engine:
    """Load an artifact once, then serve requests through ``submit``/``step`` or ``generate``."""

    def __init__(
        self,
        artifact: str | Path | Artifact,
        *,
        backend: str = "cpu",
        max_context: int = 4096,
        max_lanes: int = 8,
        prefill_chunk: int | None = None,
        chat_template: str | None = None,
        context_capacity: int | str | None = None,
        memory_headroom: int | str | None = None,
        kv_dtype: str = "auto",
        spec: SpecConfig | None = None,
        prefix_cache: bool = False,
        checkpoint_interval: int = 8192,
        host_context_capacity: int | str | None = 0,
        tensor_parallel: int = 1,
        expert_parallel: bool = False,
        vram_budget: int | str | None = None,
        host_expert_cache: int | str | None = None,
        expert_stream_rows: int | None = None,
        expert_stream_chunk: int | None = None,
        expert_stream_decode: str | None = None,
        vision: VisionOptions | None = None,
        model_options: dict[str, Any] | None = None,
    ):
        # the backend's own most lanes (``lane_limits``), known before anything loads; a
        # tensor-parallel engine's ranks all run this backend
        check_max_lanes(max_lanes, backend)
        #: how the pool stores K/V: ``auto`` is the backend's own (CPU float32, CUDA bfloat16)
        self.kv_dtype = kv_dtype = resolve_kv_dtype(kv_dtype, backend)
        if prefill_chunk is None:  # the backend's (CPU 512, CUDA 2048)
            prefill_chunk = default_prefill_chunk(backend)
        if max_context < 2 or prefill_chunk < 1 or checkpoint_interval < 1:
            raise EngineError(
                "max_context must be >= 2, prefill_chunk and checkpoint_interval >= 1"
            )
        # the context pool's shape (its byte budget needs the backend): a budget plans the
        # experts beside it before the model prepares a weight
        pool_plan = PoolPlan(
            lanes=max_lanes,
            max_context=max_context,
            kv_dtype=kv_dtype,
            spec=spec,
            prefix_cache=prefix_cache,
            context_capacity=context_capacity,
            memory_headroom=memory_headroom,
        )
        loaded = load(
            artifact,
            backend=backend,
            pool_plan=pool_plan,
            chat_template=chat_template,
            tensor_parallel=tensor_parallel,
            expert_parallel=expert_parallel,
            vram_budget=vram_budget,
            host_expert_cache=host_expert_cache,
            expert_stream_rows=expert_stream_rows,
            expert_stream_chunk=expert_stream_chunk,
            expert_stream_decode=expert_stream_decode,
            prefill_chunk=prefill_chunk,
            vision=vision,
            model_options=model_options,
        )
        self.artifact, self.model, self.runner = loaded.artifact, loaded.model, loaded.runner
        if loaded.stop is not None:  # the other tensor-parallel ranks end with the engine
            weakref.finalize(self, loaded.stop)
        #: with a ``vram_budget`` (``--vram-budget``), the routed experts that do not fit it
        #: are computed from host memory (``expert_offload``); None: all resident
        self.expert_offload = loaded.expert_offload
        if self.expert_offload is not None:  # host experts that stream take longer calls
            prefill_chunk = self.expert_offload.prefill_rows
        self.tokenizer, self.template = loaded.tokenizer, loaded.template
        #: images in chat messages (a VLM artifact's tower on the CPU backend), or None
        self.vision, no_images = loaded.vision, loaded.no_images
        #: requests to lanes: prompts rendered and checked
        self.intake = RequestIntake(
            self.tokenizer, self.template, self.vision, no_images, vocab=self.model.config.vocab
        )
        self.max_context = max_context
        self.max_lanes = max_lanes
        self.prefill_chunk = prefill_chunk
        self.spec = spec
        self.spec_stats = SpecStats(spec.draft_tokens) if spec else None
        if spec is not None:
            check_drafter(self.artifact, self.model, spec)
        # a round writes past a sequence's length: its pages hold that margin beyond its tokens
        self._margin = pool_plan.margin
        self.pool = pool_plan.new_pool(self.runner, self.model.backend)
        if self.expert_offload is not None:  # the experts go where the pool leaves room
            self.expert_offload.start(self.runner, self.tokenizer.encode, self.pool.nbytes())
        #: checkpoints of earlier prompts and generations, resumed by later requests
        self.cache = (
            PrefixCache(self.pool, self._cache_salt(backend, kv_dtype)) if prefix_cache else None
        )
        #: the waiting queue and the lanes: what each step runs
        self.scheduler = Scheduler(
            self.pool,
            self.cache,
            self.runner,
            max_lanes=max_lanes,
            prefill_chunk=prefill_chunk,
            checkpoint_interval=checkpoint_interval,
            margin=self._margin,
            drafting=spec is not None,
            host_capacity=parse_size(host_context_capacity, "host context capacity") or 0,
        )
        #: tokens to events, and the lanes' ends
        self.event_writer = EventWriter(self.scheduler, self.tokenizer)
        #: each lane's next token from its logits
        self.token_choice = TokenChooser(self.model, self.tokenizer, self.event_writer.fail)
        #: each step's prefill chunk and plain decode step
        self.step_forwards = StepForwards(
            spec,
            model=self.model,
            runner=self.runner,
            pool=self.pool,
            scheduler=self.scheduler,
            token_choice=self.token_choice,
            event_writer=self.event_writer,
        )
        #: with ``spec``: each step's draft-and-verify round for the generating lanes
        self.speculative_rounds: SpeculativeRounds | None = None
        if spec is not None:
            self.speculative_rounds = SpeculativeRounds(
                spec,
                self.spec_stats,  # type: ignore[arg-type]
                model=self.model,
                runner=self.runner,
                scheduler=self.scheduler,
                token_choice=self.token_choice,
                event_writer=self.event_writer,
            )

    def _cache_salt(self, backend: str, kv_dtype: str) -> bytes:
        """What decides a checkpoint's states besides its tokens."""
        return b"|".join([self.artifact.artifact_id, backend.encode(), kv_dtype.encode()])

    # ------------------------------------------------------------------ the lanes
    @property
    def lanes_in_use(self) -> int:
        return len(self.scheduler.active)

    @property
    def context_usage(self) -> float:
        """Fraction of the context pool's pages held by running requests (pages only
        checkpoints hold are the cache's: they go when a request needs them)."""
        return self.pool_bytes()["kv_running"] / (self.pool.pages * self.pool.page_bytes or 1)

    def pool_bytes(self) -> dict[str, int]:
        """The context pool's bytes by use (``Scheduler.pool_bytes``)."""
        return self.scheduler.pool_bytes()

    @property
    def pool_tokens(self) -> int:
        """The most tokens one sequence can ever hold in the context pool (prompt and output
        together), below ``max_context`` when the pool is the smaller."""
        return self.pool.capacity_tokens - self._margin

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def media_cache(self) -> MediaCache | None:
        """Encoded images by digest (``stats``: hits, misses, evictions); None without
        image input."""
        return None if self.vision is None else self.vision.cache

    @property
    def preemptions(self) -> int:
        """Lanes preempted so far for want of pages."""
        return self.scheduler.preemptions

    @property
    def replayed_tokens(self) -> int:
        """Generated tokens fed again after preemptions (lanes not kept in host memory)."""
        return self.scheduler.replayed_tokens

    @property
    def host_capacity(self) -> int:
        """Host memory preempted lanes may be copied to (beyond it they are replayed)."""
        return self.scheduler.host_capacity

    @property
    def host_bytes(self) -> int:
        """Host memory the lanes preempted there hold now."""
        return self.scheduler.host_bytes

    def render(self, request: GenerationRequest) -> tuple[list[int], bool]:
        """Prompt token ids, and whether the output starts inside reasoning."""
        return self.intake.render(request)

    def history_end(self, request: GenerationRequest, ids: Sequence[int]) -> int | None:
        """With a prefix cache, how many of a chat prompt's tokens ``ids`` the next turn
        resends unchanged (a checkpoint is kept there); None without one, or when that is
        all of it or nothing. Tokenizes the conversation again: a server asks off the
        engine's thread and hands it to ``submit``."""
        return None if self.cache is None else self.intake.history_end(request, ids)

    def submit(
        self,
        request: GenerationRequest,
        *,
        rendered: tuple[Sequence[int], bool] | None = None,
        history_end: int | None = None,
    ) -> str:
        """Validate and queue a request; it gets a lane in the next steps when one is free.

        ``rendered`` is ``render(request)`` when the caller already ran it (a server renders
        first to count tokens and refuse oversized prompts before queueing), so the prompt is
        not rendered twice; ``history_end`` likewise (None: found here).
        """
        if rendered is None:
            rendered = self.render(request)
        if history_end is None:
            history_end = self.history_end(request, rendered[0])
        lane = self.intake.lane(
            request,
            rendered,
            max_context=self.max_context,
            pool_tokens=self.pool_tokens,
            history_end=history_end,
        )
        if self.scheduler.holds(request.request_id):
            raise RequestError(f"request id {request.request_id!r} is already in use")
        self.scheduler.queue(lane)
        return request.request_id

    def cancel(self, request_id: str) -> Finished | None:
        """Stop a request now and free its lane and memory."""
        a = self.scheduler.cancel(request_id)
        return None if a is None else self.event_writer.finish(a, "cancelled", None, [])

    # ----------------------------------------------------------------------- steps
    def step(self, flush: Callable[[list[Event]], None] | None = None) -> list[Event]:
        """Admit what fits, run one prefill chunk and one decode step (or round); the
        events of all three. ``flush``, when given, gets the admission and prefill part's
        events as soon as they are known, before the decode step runs (a server streams a
        first token without waiting for it); they are then left out of the list returned."""
        events: list[Event] = []
        for head in self.scheduler.admit():
            # the whole prompt was cached, or a preempted lane's replay begins
            logits = head.state.resumed_logits
            out = None if logits is None else ForwardOutput([logits[None]], [None])
            self.step_forwards.prompts_done([head], out, events)
        reads = self.scheduler.prefill_reads()
        if reads:
            self.step_forwards.prefill(reads, events)
        if flush is not None and events:
            flush(events)
            events = []
        decoding = self.scheduler.generating()
        if self.speculative_rounds is None:
            if decoding:
                self.step_forwards.decode(decoding, events)
            return events
        # lanes replaying after a preemption feed their known tokens one step at a time
        replaying = [a for a in decoding if a.replay]
        generating = [a for a in decoding if not a.replay]
        if replaying:
            self.step_forwards.decode(replaying, events)
        if generating:
            self.speculative_rounds.run(generating, events)
        return events

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
