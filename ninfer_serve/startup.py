"""Starting ``ninfer-serve`` from its settings: bind the port, load the model in the engine
thread while ``/health`` answers 503 ``loading``, serve until Ctrl-C or SIGTERM, then drain.

The port is bound first so an orchestrator sees a live process at once; the "ready" line follows
when requests can be served. On a stop, running requests may finish for up to
``drain_timeout_s`` before the rest are cancelled, and the exit status is 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any

import click

from ninfer_runtime.cli import model_positions

from .config import ConfigError, Settings, fit_to_model
from .lanes import engine_lanes
from .listener import base_url, listen

__all__ = ["say", "serve", "served_model_name"]


def say(text: str) -> None:
    """One line to the operator on stderr, named for the command."""
    click.echo(f"ninfer-serve: {text}", err=True)


def served_model_name(model: Path, settings: Settings) -> str:
    """The name clients send: ``--served-model-name``, else the file's name without
    ``.ninfer`` (what the command line named, as vLLM serves the model it is given; the
    artifact's own ``metadata.name`` may differ once a file is renamed or copied)."""
    given = settings.server.served_model_name
    if given is not None:
        return given
    return model.name.removesuffix(".ninfer") or model.name


def _read_template(path: Path | None) -> str | None:
    """The text of the chat template given in place of the artifact's (None: not given)."""
    if path is None:
        return None
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"chat template {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"chat template {path}: not UTF-8 text") from None


def _connection_limit(settings: Settings) -> int:
    """``max_connections``, or its default sized for the descriptor limit (raised first as
    far as the hard limit allows); an explicit value the limit cannot hold is warned about."""
    from .connections import DEFAULT_MAX_CONNECTIONS, RESERVED_DESCRIPTORS, descriptor_limit

    given = settings.server.max_connections
    descriptors = descriptor_limit((given or DEFAULT_MAX_CONNECTIONS) + RESERVED_DESCRIPTORS)
    room = max(descriptors - RESERVED_DESCRIPTORS, descriptors // 2)
    if given is None:
        return min(DEFAULT_MAX_CONNECTIONS, room)
    if given > room:
        say(
            f"warning: max_connections {given} is more than the descriptor limit leaves "
            f"(ulimit -n {descriptors}, {descriptors - room} kept for the process); beyond "
            f"{room} connections new ones wait until some close"
        )
    return given


def serve(model: Path, settings: Settings) -> int:
    """Run the server until Ctrl-C / SIGTERM; the process exit status."""
    import uvicorn

    from ninfer_format import Artifact, ArtifactError
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.errors import EngineError
    from ninfer_runtime.expert_offload import vram_budget_setting
    from ninfer_runtime.warm_up import warm_up

    from .app import create_app
    from .connections import ConnectionGuard, protocol_for

    logging.basicConfig(
        level=settings.server.log_level.upper(), format="ninfer-serve: %(levelname)s %(message)s"
    )
    engine_cfg = settings.engine
    try:
        template = _read_template(engine_cfg.chat_template)
    except ConfigError as exc:
        say(f"error: {exc}")
        return 2
    try:
        artifact = Artifact.open(model)
        model_id = served_model_name(model, settings)
    except (ArtifactError, EngineError, OSError, ValueError) as exc:
        say(f"error: cannot open {model}: {exc}")
        return 1
    try:
        fit_to_model(settings, model_positions(artifact))
    except ConfigError as exc:
        say(f"error: {exc}")
        return 2
    try:
        sock = listen(settings.server.host, settings.server.port)
    except OSError as exc:
        say(
            f"error: cannot listen on {settings.server.host}:{settings.server.port}: "
            f"{exc.strerror or exc}"
        )
        return 1
    port = sock.getsockname()[1]
    url = base_url(settings.server.host, port)
    started = time.perf_counter()
    spec = settings.speculative.spec_config()
    drafting = f", {spec.method} drafting {spec.draft_tokens} token(s)" if spec else ""
    lanes_shown = (
        "lanes auto"
        if engine_cfg.max_concurrency == "auto"
        else f"{engine_cfg.max_concurrency} lane(s)"
    )
    say(
        f"loading {model} as model {model_id!r} (backend {engine_cfg.backend}, "
        f"max_context {engine_cfg.max_context}, "
        f"{lanes_shown}{drafting}); {url}/health answers 503 until ready"
    )
    outcome = {"status": 0}
    holder: dict[str, Any] = {}

    def load() -> Engine:
        engine = Engine(
            artifact,
            backend=engine_cfg.backend,
            max_context=engine_cfg.max_context,
            max_lanes=engine_lanes(engine_cfg.max_concurrency, engine_cfg.backend),
            prefill_chunk=engine_cfg.prefill_chunk,
            chat_template=template,
            context_capacity=engine_cfg.context_capacity,
            memory_headroom=engine_cfg.memory_headroom,
            host_context_capacity=engine_cfg.host_context_capacity,
            kv_dtype=engine_cfg.kv_dtype,
            spec=spec,
            prefix_cache=settings.context_cache.enabled,
            checkpoint_interval=settings.context_cache.checkpoint_interval,
            tensor_parallel=settings.parallel.tensor_parallel,
            expert_parallel=settings.parallel.expert_parallel,
            vram_budget=vram_budget_setting(engine_cfg.vram_budget),
            host_expert_cache=engine_cfg.host_expert_cache,
            expert_stream_rows=engine_cfg.expert_stream_rows,
            expert_stream_chunk=engine_cfg.expert_stream_chunk,
            expert_stream_decode=engine_cfg.expert_stream_decode,
            vision=settings.vision_options(),
            model_options=engine_cfg.model_options(),
        )
        if engine_cfg.backend == "cuda":  # library kernels' first calls, before any request
            say(f"prefill path warmed up in {warm_up(engine):.1f} s")
        return engine

    def on_loaded(engine: Engine | None, error: str | None) -> None:
        if engine is None:
            say(f"error: cannot load {model}: {error}")
            outcome["status"] = 1
            holder["server"].should_exit = True
            return
        seconds = time.perf_counter() - started
        choice = engine_loop.lane_choice
        if choice is not None:
            say(f"{choice.lanes} decode lane(s) ({choice.reason})")
        say(f"serving {model_id!r} at {url}/v1 (ready in {seconds:.1f} s; Ctrl-C to stop)")

    app = create_app(settings, model_id=model_id, load=load, on_loaded=on_loaded, root=str(model))
    assert app.state is not None
    guard = ConnectionGuard(
        max_connections=_connection_limit(settings),
        header_timeout_s=settings.server.header_timeout_s,
        metrics=app.state.metrics,
    )
    config = uvicorn.Config(
        app,
        http=protocol_for(guard),
        timeout_keep_alive=settings.server.keep_alive_timeout_s,  # type: ignore[arg-type]
        log_level=settings.server.log_level,
        access_log=settings.server.log_level == "debug",
        # after the drain only answers already decided are still being written
        timeout_graceful_shutdown=10,
        lifespan="on",
        server_header=False,
    )
    engine_loop = app.state.loop

    class DrainingServer(uvicorn.Server):
        """Drains the engine before uvicorn waits for open connections.

        uvicorn waits for connections, then cancels what is left, and only then runs the
        application's shutdown; draining first answers every request (queued ones 503, running
        ones when they finish or are cancelled at the drain timeout) before anything is cut off.
        """

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            guard.install(asyncio.get_running_loop())
            await super().startup(sockets)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            for listener in self.servers:
                listener.close()  # stop accepting connections first
            await engine_loop.drain(settings.server.drain_timeout_s)
            await super().shutdown(sockets)

    holder["server"] = server = DrainingServer(config)

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    # uvicorn re-raises the signal that stopped it once it has drained; make that a clean exit
    signal.signal(signal.SIGTERM, stop)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    if outcome["status"] == 0:
        say("stopped")
    return outcome["status"]
