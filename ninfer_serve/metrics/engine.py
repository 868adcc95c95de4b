"""The server's and engine's state: what is served, lanes and queues, the context pool.

Gauges the engine thread's readings set (``engine_readings.py``), and the counters of what the
pool did under pressure (evictions, preemptions, the media cache, MoE expert offload).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["EngineSeries"]


class EngineSeries:
    """The engine-state part of ``Metrics``: what the server runs and how full it is."""

    _labels: dict[str, str]

    def _add_engine_series(
        self,
        r: CollectorRegistry,
        *,
        backend: str,
        max_concurrency: int,
        max_context: int,
    ) -> None:
        m = self._labels
        model_id = m["model_name"]
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

    def _add_pool_series(self, r: CollectorRegistry) -> None:
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
        # the device computed and those the host did, what the host's share made the device
        # wait and the bytes it read, experts streamed to the device for prefill (the GPU's
        # window), and the bytes the device read in place from host memory (mapped decode)
        self.memory_events.update(
            (name, Counter(f"ninfer_{name}", text, registry=r))
            for name, text in (
                ("expert_device_hits", "Routed expert pairs the device computed"),
                ("expert_host_hits", "Routed expert pairs computed from host memory"),
                ("expert_host_wait_seconds", "Seconds the device waited for host experts"),
                ("expert_streamed_bytes", "Expert bytes streamed to the device for prefill"),
                ("expert_host_bytes", "Expert bytes the host read computing its pairs"),
                ("expert_mapped_bytes", "Expert bytes the device read in place from host memory"),
            )
        )

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

    def memory(self, gained: dict[str, int]) -> None:
        """What the engine's pool counters (``memory_events``) gained since the last call."""
        for name, count in gained.items():
            self.memory_events[name].inc(count)
