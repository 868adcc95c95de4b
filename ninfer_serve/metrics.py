"""Prometheus metrics: ``ninfer_*`` names plus vLLM-named aliases of the common ones.

Why aliases: Grafana boards and autoscalers written for vLLM read ``vllm:*`` series (with a
``model_name`` label); exporting the same measurements under those names lets them work
unchanged. Every update goes through one method here so the two names can never disagree.
Each server gets its own registry (tests run several in one process; no global state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

if TYPE_CHECKING:
    from ninfer_runtime.speculative import SpecStats

# the *_created series double the page and no board reads them (vLLM turns them off too)
disable_created_metrics()

__all__ = ["EXPOSITION_CONTENT_TYPE", "Metrics"]

#: The type of what ``generate_latest`` writes: the classic text format (names escaped with
#: underscores), which every Prometheus reads
EXPOSITION_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

_LATENCY = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_TOKEN_LATENCY = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class Metrics:
    """All series of one server; the methods are the events that move them."""

    def __init__(
        self,
        model_id: str,
        *,
        backend: str,
        max_concurrency: int,  # 0 until the lanes are chosen (``set_max_concurrency``)
        max_context: int,
        draft_tokens: int = 0,
    ):
        r = self.registry = CollectorRegistry(auto_describe=True)
        m = {"model_name": model_id}
        self._labels = m
        info = Gauge(
            "ninfer_model_info", "Served model (value 1)", ["model_id", "backend"], registry=r
        )
        info.labels(model_id, backend).set(1)
        self.max_concurrency = Gauge(
            "ninfer_max_concurrency", "Decode lanes (max running requests)", registry=r
        )
        self.max_concurrency.set(max_concurrency)
        Gauge("ninfer_max_context_tokens", "Context length per request", registry=r).set(
            max_context
        )
        self.ready = Gauge("ninfer_engine_ready", "1 while the engine accepts work", registry=r)

        # scheduler state
        self.running = Gauge(
            "ninfer_requests_running", "Requests holding a decode lane", registry=r
        )
        self.waiting = Gauge(
            "ninfer_requests_waiting",
            "Requests admitted but waiting for a lane (incl. preparation)",
            registry=r,
        )
        self.lanes = Gauge(
            "ninfer_lanes_in_use", "Lanes the engine thread reports busy", registry=r
        )
        self.v_running = Gauge(
            "vllm:num_requests_running", "Running requests", ["model_name"], registry=r
        ).labels(**m)
        self.v_waiting = Gauge(
            "vllm:num_requests_waiting", "Waiting requests", ["model_name"], registry=r
        ).labels(**m)
        self.v_kv = Gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction of the context pool's K/V pages held by running requests",
            ["model_name"],
            registry=r,
        ).labels(**m)

        # tokens
        self.prompt_tokens = Counter(
            "ninfer_prompt_tokens", "Prompt tokens of started requests", registry=r
        )
        self.cached_tokens = Counter(
            "ninfer_prompt_tokens_cached",
            "Prompt tokens resumed from the prefix cache instead of computed",
            registry=r,
        )
        self.prefill_tokens = Counter(
            "ninfer_prefill_tokens", "Prompt tokens computed (cached ones left out)", registry=r
        )
        self.generation_tokens = Counter("ninfer_generation_tokens", "Generated tokens", registry=r)
        self.reasoning_tokens = Counter(
            "ninfer_reasoning_tokens", "Generated tokens inside reasoning", registry=r
        )
        self.v_prompt = Counter(
            "vllm:prompt_tokens", "Prompt tokens", ["model_name"], registry=r
        ).labels(**m)
        self.v_generation = Counter(
            "vllm:generation_tokens", "Generated tokens", ["model_name"], registry=r
        ).labels(**m)
        # vLLM counts both in tokens: the prompt tokens looked up, and those found cached
        self.v_prefix_queries = Counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up", ["model_name"], registry=r
        ).labels(**m)
        self.v_prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens found cached", ["model_name"], registry=r
        ).labels(**m)
        self.v_prompt_cached = Counter(
            "vllm:prompt_tokens_cached", "Cached prompt tokens", ["model_name"], registry=r
        ).labels(**m)
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Prompt tokens by source (computed, or resumed from the prefix cache)",
            ["model_name", "source"],
            registry=r,
        )
        self.v_prompt_computed = by_source.labels(model_id, "local_compute")
        self.v_prompt_cache_hit = by_source.labels(model_id, "local_cache_hit")

        # requests
        self.requests = Counter(
            "ninfer_requests", "Finished requests by outcome", ["outcome"], registry=r
        )
        self.rejections = Counter(
            "ninfer_admission_rejections", "Requests refused by admission", ["reason"], registry=r
        )
        self.v_success = Counter(
            "vllm:request_success",
            "Finished requests",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "ninfer_time_to_first_token_seconds",
            "Arrival to first generated token",
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "ninfer_inter_token_latency_seconds",
            "Time between consecutive generated tokens",
            buckets=_TOKEN_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            "ninfer_request_duration_seconds", "Arrival to last token", buckets=_LATENCY, registry=r
        )
        self.queue = Histogram(
            "ninfer_request_queue_seconds",
            "Arrival to lane assignment",
            buckets=_LATENCY,
            registry=r,
        )
        self.prefill = Histogram(
            "ninfer_request_prefill_seconds",
            "The engine taking the request to its first token (the prompt's prefill)",
            buckets=_LATENCY,
            registry=r,
        )
        self.v_prefill = Histogram(
            "vllm:request_prefill_time_seconds",
            "Prefill time",
            ["model_name"],
            buckets=_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            ["model_name"],
            buckets=_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency",
            ["model_name"],
            buckets=_TOKEN_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Time per output token (older name of the ITL series)",
            ["model_name"],
            buckets=_TOKEN_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end latency",
            ["model_name"],
            buckets=_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Queue time",
            ["model_name"],
            buckets=_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_prompt_len = Histogram(
            "vllm:request_prompt_tokens",
            "Prompt length",
            ["model_name"],
            buckets=_TOKENS,
            registry=r,
        ).labels(**m)
        self.v_gen_len = Histogram(
            "vllm:request_generation_tokens",
            "Generation length",
            ["model_name"],
            buckets=_TOKENS,
            registry=r,
        ).labels(**m)

        # constrained decoding
        self.constraints = Counter(
            "ninfer_constraint_requests",
            "Requests with constrained decoding, by kind",
            ["kind"],
            registry=r,
        )

        # HTTP connections (connections.py): open ones, those refused over the limit, and
        # those closed by a timeout (idle between requests, or a request head too slow)
        self.connections = Gauge("ninfer_connections_open", "Open HTTP connections", registry=r)
        self.connections_refused = Counter(
            "ninfer_connections_refused",
            "Connections answered 503 beyond max_connections",
            registry=r,
        )
        self.connections_timed_out = Counter(
            "ninfer_connections_timed_out",
            "Connections closed by a timeout (idle: keep-alive; header: a request head)",
            ["phase"],
            registry=r,
        )
        for phase in ("idle", "header"):
            self.connections_timed_out.labels(phase)

        self.pool_bytes = Gauge(
            "ninfer_context_pool_bytes",
            "Context pool bytes by use (kv_running, kv_cached, kv_free, states, snapshots)",
            ["use"],
            registry=r,
        )
        self.checkpoints = Gauge(
            "ninfer_cache_checkpoints",
            "Prefix-cache checkpoints kept, by why (prompt_end, boundary, breakpoint, "
            "interval, generation)",
            ["kind"],
            registry=r,
        )
        for kind in ("prompt_end", "boundary", "breakpoint", "interval", "generation"):
            self.checkpoints.labels(kind)
        self.host_bytes = Gauge(
            "ninfer_host_context_bytes",
            "Host memory holding preempted lanes' context (--host-context-capacity)",
            registry=r,
        )
        # the context pool under pressure: prefix-cache checkpoints let go, lanes preempted
        # (memory freed, resumed later) and the generated tokens they fed again
        self.memory_events = {
            name: Counter(f"ninfer_{name}", text, registry=r)
            for name, text in (
                ("cache_evictions", "Prefix-cache checkpoints let go for room"),
                ("preemptions", "Lanes preempted for room (resumed later, nothing lost)"),
                ("replayed_tokens", "Generated tokens fed again after a preemption"),
                # the media cache: images whose encoded rows were found (the vision encoder
                # skipped) or not, and entries let go for room; 0 without image input
                ("media_cache_hits", "Images served from the media cache"),
                ("media_cache_misses", "Images the vision encoder ran for"),
                ("media_cache_evictions", "Encoded images let go from the media cache for room"),
            )
        }

        # MoE expert offload (--vram-budget; 0 without it): routed (token, expert) pairs
        # computed by resident experts and by host ones, what the host's share made the
        # device wait, and experts streamed to the device for prefill (the GPU's window)
        self.memory_events.update(
            (name, Counter(f"ninfer_{name}", text, registry=r))
            for name, text in (
                ("expert_device_hits", "Routed expert pairs computed in device memory"),
                ("expert_host_hits", "Routed expert pairs computed from host memory"),
                ("expert_host_wait_seconds", "Seconds the device waited for host experts"),
                ("expert_streamed_bytes", "Expert bytes streamed to the device for prefill"),
            )
        )

        # speculative decoding (0 with it off, so boards find the series): a round is one
        # speculating lane's draft-and-verify; positions are 0-based, one series each
        self.spec_rounds = Counter(
            "ninfer_spec_decode_rounds", "Speculative rounds (per speculating lane)", registry=r
        )
        self.spec_drafted = Counter("ninfer_spec_decode_draft_tokens", "Tokens drafted", registry=r)
        self.spec_accepted = Counter(
            "ninfer_spec_decode_accepted_tokens", "Drafted tokens verification kept", registry=r
        )
        self.spec_fallbacks = Counter(
            "ninfer_spec_decode_fallback_steps",
            "Lanes in a round that kept one token without drafts (constrained next tokens)",
            registry=r,
        )
        per_position = Counter(
            "ninfer_spec_decode_accepted_per_position",
            "Rounds whose draft at this position was kept",
            ["position"],
            registry=r,
        )
        self.v_spec_drafts = Counter(
            "vllm:spec_decode_num_drafts", "Draft rounds", ["model_name"], registry=r
        ).labels(**m)
        self.v_spec_drafted = Counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens", ["model_name"], registry=r
        ).labels(**m)
        self.v_spec_accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Accepted tokens", ["model_name"], registry=r
        ).labels(**m)
        v_per_position = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position",
            ["model_name", "position"],
            registry=r,
        )
        self._spec_positions = [
            (per_position.labels(str(j)), v_per_position.labels(model_id, str(j)))
            for j in range(draft_tokens)
        ]

    # -- events -------------------------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        self.ready.set(1 if ready else 0)

    def set_max_concurrency(self, lanes: int) -> None:
        self.max_concurrency.set(lanes)

    def set_queue(self, running: int, waiting: int, scheduled: int) -> None:
        """``running``/``waiting``: requests holding a server lane / admitted without one;
        ``scheduled``: those the engine runs. vLLM's gauges count what the engine runs, so a
        request whose lane waits for context-pool pages is waiting there."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.v_running.set(scheduled)
        self.v_waiting.set(running + waiting - scheduled)

    def set_lanes(
        self,
        lanes: int,
        context_usage: float,
        pool_bytes: dict[str, int] | None = None,
        host_bytes: int = 0,
    ) -> None:
        self.lanes.set(lanes)
        self.v_kv.set(context_usage)
        for use, size in (pool_bytes or {}).items():
            self.pool_bytes.labels(use).set(size)
        self.host_bytes.set(host_bytes)

    def set_checkpoints(self, counts: dict[str, int]) -> None:
        """The prefix cache's checkpoints now, by kind."""
        for kind, count in counts.items():
            self.checkpoints.labels(kind).set(count)

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()
        self.requests.labels("rejected").inc()

    def left_before_start(self) -> None:
        """The client went away while its request was being prepared or queued."""
        self.requests.labels("cancelled").inc()

    def started(self, prompt_tokens: int, queue_seconds: float, *, cache: bool) -> None:
        """A request went to the engine. With the prefix ``cache`` on, what its prompt
        computes is known when the engine looks it up (``looked_up``); without, all of it."""
        self.prompt_tokens.inc(prompt_tokens)
        self.v_prompt.inc(prompt_tokens)
        self.v_prompt_len.observe(prompt_tokens)
        self.queue.observe(queue_seconds)
        self.v_queue.observe(queue_seconds)
        if not cache:
            self.prefill_tokens.inc(prompt_tokens)
            self.v_prompt_computed.inc(prompt_tokens)

    def looked_up(self, queried: int, hit: int) -> None:
        """The engine's prefix cache was asked for ``queried`` prompt tokens and resumed
        ``hit`` of them (the rest are computed) since the previous call."""
        self.cached_tokens.inc(hit)
        self.prefill_tokens.inc(queried - hit)
        self.v_prefix_queries.inc(queried)
        self.v_prefix_hits.inc(hit)
        self.v_prompt_cached.inc(hit)
        self.v_prompt_cache_hit.inc(hit)
        self.v_prompt_computed.inc(queried - hit)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.v_ttft.observe(seconds)

    def prefilled(self, seconds: float) -> None:
        self.prefill.observe(seconds)
        self.v_prefill.observe(seconds)

    def tokens(self, count: int, gap_seconds: float | None) -> None:
        """``count`` tokens arrived together; ``gap_seconds`` since the previous arrival."""
        self.generation_tokens.inc(count)
        self.v_generation.inc(count)
        if gap_seconds is not None and count:
            each = gap_seconds / count
            for _ in range(count):
                self.itl.observe(each)
                self.v_itl.observe(each)
                self.v_tpot.observe(each)

    def finished(
        self, outcome: str, reason: str, seconds: float, completion: int, reasoning: int
    ) -> None:
        self.requests.labels(outcome).inc()
        self.reasoning_tokens.inc(reasoning)
        self.e2e.observe(seconds)
        self.v_e2e.observe(seconds)
        self.v_gen_len.observe(completion)
        self.v_success.labels(self._labels["model_name"], reason).inc()

    def set_connections(self, open_now: int) -> None:
        self.connections.set(open_now)

    def connection_refused(self) -> None:
        self.connections_refused.inc()

    def connection_timed_out(self, phase: str) -> None:
        self.connections_timed_out.labels(phase).inc()

    def constrained(self, kind: str) -> None:
        self.constraints.labels(kind).inc()

    def memory(self, gained: dict[str, int]) -> None:
        """What the engine's pool counters (``memory_events``) gained since the last call."""
        for name, count in gained.items():
            self.memory_events[name].inc(count)

    def speculated(self, gained: SpecStats) -> None:
        """What the engine's speculative counters gained since the previous call."""
        self.spec_rounds.inc(gained.rounds)
        self.spec_drafted.inc(gained.drafted)
        self.spec_accepted.inc(gained.accepted)
        self.spec_fallbacks.inc(gained.fallbacks)
        self.v_spec_drafts.inc(gained.rounds)
        self.v_spec_drafted.inc(gained.drafted)
        self.v_spec_accepted.inc(gained.accepted)
        for (ours, theirs), count in zip(
            self._spec_positions, gained.accepted_per_position, strict=True
        ):
            ours.inc(count)
            theirs.inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
