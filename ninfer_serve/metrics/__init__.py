"""Prometheus metrics: ``ninfer_*`` names plus vLLM-named aliases of the common ones.

Why aliases: Grafana boards and autoscalers written for vLLM read ``vllm:*`` series (with a
``model_name`` label); exporting the same measurements under those names lets them work
unchanged. Every update goes through one method of ``Metrics`` so the two names can never
disagree; each family of series and its methods live in a module of their own (``engine``,
``lifecycle``, ``connections``, ``speculative``; the shared buckets in ``buckets``).
Each server gets its own registry (tests run several in one process; no global state).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from .connections import ConnectionSeries
from .engine import EngineSeries
from .lifecycle import RequestSeries
from .speculative import SpeculativeSeries

# the *_created series double the page and no board reads them (vLLM turns them off too)
disable_created_metrics()

__all__ = ["EXPOSITION_CONTENT_TYPE", "Metrics"]

#: The type of what ``generate_latest`` writes: the classic text format (names escaped with
#: underscores), which every Prometheus reads
EXPOSITION_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class Metrics(EngineSeries, RequestSeries, ConnectionSeries, SpeculativeSeries):
    """All series of one server; the methods are the events that move them (one base class
    per concern, each owning its series and events)."""

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
        self._labels = {"model_name": model_id}
        # the registry keeps the order series are added in, which is the page's order
        self._add_engine_series(
            r, backend=backend, max_concurrency=max_concurrency, max_context=max_context
        )
        self._add_request_series(r)
        self._add_connection_series(r)
        self._add_pool_series(r)
        self._add_speculative_series(r, draft_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
