"""HTTP connections (``connections.py``): open ones, those refused over the limit, and
those closed by a timeout (idle between requests, or a request head too slow)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ConnectionSeries"]


class ConnectionSeries:
    """The connection part of ``Metrics``."""

    def _add_connection_series(self, r: CollectorRegistry) -> None:
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

    def set_connections(self, open_now: int) -> None:
        self.connections.set(open_now)

    def connection_refused(self) -> None:
        self.connections_refused.inc()

    def connection_timed_out(self, phase: str) -> None:
        self.connections_timed_out.labels(phase).inc()
