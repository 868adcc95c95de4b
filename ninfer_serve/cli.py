"""``ninfer-serve``: serve a .ninfer artifact over HTTP (OpenAI and Anthropic APIs).

The port is bound first and the model loads in the engine thread while ``/health`` answers
503 ``loading``, so an orchestrator sees a live process at once; the "ready" line follows when
requests can be served. Ctrl-C (or SIGTERM) stops accepting connections, lets running requests
finish for up to ``drain_timeout_s``, cancels the rest and exits with status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click

from ninfer_format.extras import require_extra
from ninfer_runtime.cli import (
    PLE_ROWS_CHOICES,
    PLE_ROWS_HELP,
    model_positions,
    speculative_options,
)
from ninfer_runtime.model_path import not_an_artifact
from ninfer_runtime.state import KV_DTYPES

from .config import ConfigError, Settings, fit_to_model, is_loopback, load_settings
from .lanes import engine_lanes

__all__ = ["main"]

EXAMPLES = """
\b
Examples:
  ninfer-serve model.ninfer
  ninfer-serve model.ninfer --max-concurrency 4 --max-context 32768 --backend cuda
  ninfer-serve model.ninfer --config ninfer.toml --host 0.0.0.0 --api-key "$KEY"
"""


def _say(text: str) -> None:
    click.echo(f"ninfer-serve: {text}", err=True)


@click.command(epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="TOML file with [server], [engine], [context_cache], [speculative] tables; "
    "flags win over it.",
)
@click.option("--host", help="Address to bind.  [default: 127.0.0.1]")
@click.option("--port", type=int, help="Port (0: any free port).  [default: 8080]")
@click.option("--api-key", help="Require this key (Bearer or x-api-key); also $NINFER_API_KEY.")
@click.option(
    "--allow-insecure",
    is_flag=True,
    default=None,
    help="Allow a non-loopback --host without an API key.",
)
@click.option(
    "--allowed-origins",
    help="Comma-separated origins (scheme://host[:port], or *) whose web pages may call the "
    "server (CORS).  [default: none, no CORS headers]",
)
@click.option(
    "--allow-credentials",
    is_flag=True,
    default=None,
    help="With --allowed-origins: pages may send cookies and HTTP auth (not with *).",
)
@click.option(
    "--served-model-name",
    "--model-id",
    "served_model_name",
    help="Model name clients send.  [default: MODEL's file name without .ninfer]",
)
@click.option(
    "--max-context",
    type=int,
    help="Tokens per request (prompt + output), at most the model's positions.  "
    "[default: 8192 or the model's positions if fewer]",
)
@click.option(
    "--max-concurrency",
    help="Requests decoding at once: auto (as many lanes as the memory holds, up to 8) or "
    "1..8.  [default: auto]",
)
@click.option(
    "--max-pending-requests",
    type=int,
    help="Requests that may wait for a lane; beyond that 429.  [default: 16]",
)
@click.option(
    "--pending-timeout-ms", type=int, help="Longest wait for a lane before 503.  [default: 30000]"
)
@click.option(
    "--max-connections",
    type=int,
    help="Open connections served at once; more are answered 503.  "
    "[default: 4096, or fewer if ulimit -n leaves less]",
)
@click.option(
    "--keep-alive-timeout",
    type=float,
    help="Seconds an idle connection stays open between requests.  [default: 5]",
)
@click.option(
    "--header-timeout",
    type=float,
    help="Seconds a request head may take to arrive in full.  [default: 10]",
)
@click.option(
    "--max-request-mib",
    type=float,
    help="Largest request body.  [default: 32 bytes per context token, at least 1, plus "
    "one --max-image-mib image in base64]",
)
@click.option(
    "--max-image-mib",
    type=float,
    help="Largest image (decoded or fetched).  [default: 10]",
)
@click.option(
    "--max-images-per-request",
    type=int,
    help="Images one request may carry (0: no image input).  [default: 16]",
)
@click.option(
    "--allow-image-urls",
    is_flag=True,
    default=None,
    help="Fetch http(s) image URLs that requests name (off: base64 images only; the server "
    "would reach any host a request names).",
)
@click.option(
    "--image-fetch-timeout",
    type=float,
    help="With --allow-image-urls: seconds one image URL may take.  [default: 10]",
)
@click.option("--prefill-chunk", type=int, help="Prompt tokens per prefill step.  [default: 1024]")
@click.option(
    "--kv-dtype",
    type=click.Choice(list(KV_DTYPES)),
    help="How K/V are stored.  [default: float32]",
)
@click.option(
    "--tensor-parallel",
    type=int,
    help=(
        "Ranks the model is split over, a process each (cuda: a GPU each, NCCL between "
        "them).  [default: 1]"
    ),
)
@click.option(
    "--expert-parallel/--no-expert-parallel",
    default=None,
    help="With --tensor-parallel: each routed expert whole on one rank (EP), not split.  "
    "[default: split]",
)
@click.option(
    "--context-capacity",
    help="Memory for K/V pages and recurrent states: auto or a size like 24GiB.  [default: auto]",
)
@click.option(
    "--memory-headroom",
    help="With --context-capacity auto: GPU memory left free beside the pool, e.g. 4GiB.  "
    "[default: 2GiB or 5% of the GPU, whichever is more]",
)
@click.option(
    "--host-context-capacity",
    help="Host memory preempted requests are copied to (and back from, exactly); beyond it "
    "they replay their tokens.  [default: 4GiB]",
)
@click.option(
    "--vram-budget",
    metavar="SIZE",
    help="Device memory for weights, workspace and context, e.g. 8GiB: a MoE model's routed "
    "experts that do not fit are computed from host memory (the CPU backend simulates the "
    "split).  [default: $NINFER_VRAM_BUDGET_MIB, else none]",
)
@click.option(
    "--host-expert-cache",
    metavar="SIZE",
    help="With --vram-budget: host memory for decoded copies of the most chosen host "
    "experts, e.g. 4GiB (0: none).  [default: a quarter of the available memory]",
)
@click.option("--ple-rows", type=click.Choice(PLE_ROWS_CHOICES), help=PLE_ROWS_HELP)
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), help="[default: cpu]")
@speculative_options(None)
@click.option(
    "--default-max-tokens",
    type=int,
    help="max_tokens for requests that give none.  [default: rest of the context]",
)
@click.option(
    "--no-thinking",
    "no_thinking",
    is_flag=True,
    default=None,
    help="Templates skip reasoning unless a request asks for it.",
)
@click.option(
    "--chat-template",
    type=click.Path(path_type=Path),
    help="Jinja chat template to use instead of the artifact's.",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    help="[default: info]",
)
def main(model: Path, config_path: Path | None, **flags: Any) -> None:
    """Serve the .ninfer artifact MODEL over HTTP: OpenAI Chat Completions and Responses,
    Anthropic Messages, /health and Prometheus /metrics."""
    require_extra("serve", "ninfer-serve")
    api_key = flags["api_key"] or os.environ.get("NINFER_API_KEY") or None
    overrides = {
        "server": {
            "host": flags["host"],
            "port": flags["port"],
            "api_key": api_key,
            "allow_insecure": flags["allow_insecure"],
            "allowed_origins": flags["allowed_origins"],
            "allow_credentials": flags["allow_credentials"],
            "served_model_name": flags["served_model_name"],
            "max_request_mib": flags["max_request_mib"],
            "max_image_mib": flags["max_image_mib"],
            "max_images_per_request": flags["max_images_per_request"],
            "allow_image_urls": flags["allow_image_urls"],
            "image_fetch_timeout_s": flags["image_fetch_timeout"],
            "max_connections": flags["max_connections"],
            "keep_alive_timeout_s": flags["keep_alive_timeout"],
            "header_timeout_s": flags["header_timeout"],
            "default_max_tokens": flags["default_max_tokens"],
            "enable_thinking": False if flags["no_thinking"] else None,
            "log_level": flags["log_level"],
        },
        "engine": {
            "backend": flags["backend"],
            "max_context": flags["max_context"],
            "max_concurrency": flags["max_concurrency"],
            "max_pending_requests": flags["max_pending_requests"],
            "pending_timeout_ms": flags["pending_timeout_ms"],
            "prefill_chunk": flags["prefill_chunk"],
            "chat_template": flags["chat_template"],
            "context_capacity": flags["context_capacity"],
            "memory_headroom": flags["memory_headroom"],
            "host_context_capacity": flags["host_context_capacity"],
            "vram_budget": flags["vram_budget"],
            "host_expert_cache": flags["host_expert_cache"],
            "kv_dtype": flags["kv_dtype"],
            "ple_rows": flags["ple_rows"],
        },
        "speculative": {
            "method": flags["spec"],
            "draft_tokens": flags["draft_tokens"],
            "proposal_head": flags["proposal_head"],
        },
        "parallel": {
            "tensor_parallel": flags["tensor_parallel"],
            "expert_parallel": flags["expert_parallel"],
        },
    }
    try:
        settings = load_settings(config_path, overrides)
    except ConfigError as exc:
        _say(f"error: {exc}")
        sys.exit(2)
    server = settings.server
    if not is_loopback(server.host) and not server.api_key and not server.allow_insecure:
        _say(
            f"error: refusing to listen on {server.host} without an API key; give --api-key "
            "(or $NINFER_API_KEY), or --allow-insecure if the network is trusted"
        )
        sys.exit(2)
    if not is_loopback(server.host) and not server.api_key:
        _say(
            f"warning: listening on {server.host} without an API key (--allow-insecure): "
            "anyone who can reach this port can use the model"
        )
    problem = not_an_artifact(model)
    if problem is not None:
        _say(f"error: {problem}")
        sys.exit(2)
    sys.exit(serve(model, settings))


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


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when the
    # socket says it is TCP, and without it Nagle holds each small SSE event until the
    # client's delayed ACK (~40 ms added to the first token)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


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
        _say(
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

    from .app import create_app
    from .connections import ConnectionGuard, protocol_for

    logging.basicConfig(
        level=settings.server.log_level.upper(), format="ninfer-serve: %(levelname)s %(message)s"
    )
    engine_cfg = settings.engine
    try:
        template = _read_template(engine_cfg.chat_template)
    except ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    try:
        artifact = Artifact.open(model)
        model_id = served_model_name(model, settings)
    except (ArtifactError, EngineError, OSError, ValueError) as exc:
        _say(f"error: cannot open {model}: {exc}")
        return 1
    try:
        fit_to_model(settings, model_positions(artifact))
    except ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    try:
        sock = _bind(settings.server.host, settings.server.port)
    except OSError as exc:
        _say(
            f"error: cannot listen on {settings.server.host}:{settings.server.port}: "
            f"{exc.strerror or exc}"
        )
        return 1
    port = sock.getsockname()[1]
    url = _url(settings.server.host, port)
    started = time.perf_counter()
    spec = settings.speculative.spec_config()
    drafting = f", {spec.method} drafting {spec.draft_tokens} token(s)" if spec else ""
    lanes_shown = (
        "lanes auto"
        if engine_cfg.max_concurrency == "auto"
        else f"{engine_cfg.max_concurrency} lane(s)"
    )
    _say(
        f"loading {model} as model {model_id!r} (backend {engine_cfg.backend}, "
        f"max_context {engine_cfg.max_context}, "
        f"{lanes_shown}{drafting}); {url}/health answers 503 until ready"
    )
    outcome = {"status": 0}
    holder: dict[str, Any] = {}

    def load() -> Engine:
        return Engine(
            artifact,
            backend=engine_cfg.backend,
            max_context=engine_cfg.max_context,
            max_lanes=engine_lanes(engine_cfg.max_concurrency),
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
            vision=settings.vision_options(),
            model_options=engine_cfg.model_options(),
        )

    def on_loaded(engine: Engine | None, error: str | None) -> None:
        if engine is None:
            _say(f"error: cannot load {model}: {error}")
            outcome["status"] = 1
            holder["server"].should_exit = True
            return
        seconds = time.perf_counter() - started
        choice = engine_loop.lane_choice
        if choice is not None:
            _say(f"{choice.lanes} decode lane(s) ({choice.reason})")
        _say(f"serving {model_id!r} at {url}/v1 (ready in {seconds:.1f} s; Ctrl-C to stop)")

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
        _say("stopped")
    return outcome["status"]
