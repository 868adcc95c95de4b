"""A request's way through the server: admission, queue, prefill, tokens, its end.

Token counts (prompt, cached, computed, generated), outcomes, latencies and constrained-decoding
kinds; vLLM's names beside ours, moved by the same call.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from .buckets import LATENCY, TOKEN_LATENCY, TOKENS

__all__ = ["RequestSeries"]


class RequestSeries:
    """The per-request part of ``Metrics``: the events of a request's life."""

    _labels: dict[str, str]

    def _add_request_series(self, r: CollectorRegistry) -> None:
        m = self._labels
        model_id = m["model_name"]

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
            buckets=LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "ninfer_inter_token_latency_seconds",
            "Time between consecutive generated tokens",
            buckets=TOKEN_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            "ninfer_request_duration_seconds", "Arrival to last token", buckets=LATENCY, registry=r
        )
        self.queue = Histogram(
            "ninfer_request_queue_seconds",
            "Arrival to lane assignment",
            buckets=LATENCY,
            registry=r,
        )
        self.prefill = Histogram(
            "ninfer_request_prefill_seconds",
            "The engine taking the request to its first token (the prompt's prefill)",
            buckets=LATENCY,
            registry=r,
        )
        self.v_prefill = Histogram(
            "vllm:request_prefill_time_seconds",
            "Prefill time",
            ["model_name"],
            buckets=LATENCY,
            registry=r,
        ).labels(**m)
        self.v_ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            ["model_name"],
            buckets=LATENCY,
            registry=r,
        ).labels(**m)
        self.v_itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency",
            ["model_name"],
            buckets=TOKEN_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Time per output token (older name of the ITL series)",
            ["model_name"],
            buckets=TOKEN_LATENCY,
            registry=r,
        ).labels(**m)
        self.v_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end latency",
            ["model_name"],
            buckets=LATENCY,
            registry=r,
        ).labels(**m)
        self.v_queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Queue time",
            ["model_name"],
            buckets=LATENCY,
            registry=r,
        ).labels(**m)
        self.v_prompt_len = Histogram(
            "vllm:request_prompt_tokens",
            "Prompt length",
            ["model_name"],
            buckets=TOKENS,
            registry=r,
        ).labels(**m)
        self.v_gen_len = Histogram(
            "vllm:request_generation_tokens",
            "Generation length",
            ["model_name"],
            buckets=TOKENS,
            registry=r,
        ).labels(**m)

        # constrained decoding
        self.constraints = Counter(
            "ninfer_constraint_requests",
            "Requests with constrained decoding, by kind",
            ["kind"],
            registry=r,
        )

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

    def constrained(self, kind: str) -> None:
        self.constraints.labels(kind).inc()
