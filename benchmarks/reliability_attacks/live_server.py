"""The one ``ninfer-serve`` the HTTP families (``bodies``, ``schema``, ``overload``) attack:
started on first use with one lane and two queue places, and which 5xx answers it may give."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from .paths import BUNDLED

SERVER_ARGS = ("--max-context", "256", "--max-concurrency", "1", "--max-pending-requests", "2")
SERVER_ARGS += ("--pending-timeout-ms", "1000")
ALLOWED_5XX = {503, 504, 529}
HTTP_FAMILIES = ("bodies", "schema", "overload")


class LiveServer:
    """One ``ninfer-serve`` for the HTTP families, started on first use."""

    def __init__(self, work: Path):
        self.work = work
        self.server: Any = None

    def get(self) -> Any:
        if self.server is None or self.server.process.poll() is not None:
            from ninfer_convert.pipeline import convert
            from tests.serve.conftest import Server

            artifact = self.work / "serve" / "tiny.ninfer"
            if not artifact.exists():
                artifact.parent.mkdir(parents=True, exist_ok=True)
                convert("qwen3_5_bf16", {"base": str(BUNDLED)}, artifact)
            self.server = Server(artifact, *SERVER_ARGS)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop(timeout=10)

    def tracebacks(self) -> list[str]:
        if self.server is None:
            return []
        return [ln for ln in self.server.lines if ln.startswith("Traceback")]
