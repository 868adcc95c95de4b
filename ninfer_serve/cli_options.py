"""The ``ninfer-serve`` command line: its argument and options, and how the options given
land in the settings tables (``config.load_settings`` puts them over the ``--config`` file)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ninfer_runtime.cli import (
    EXPERT_STREAM_CHUNK_HELP,
    EXPERT_STREAM_DECODE,
    EXPERT_STREAM_DECODE_HELP,
    EXPERT_STREAM_ROWS_HELP,
    PLE_ROWS_CHOICES,
    PLE_ROWS_HELP,
    speculative_options,
)
from ninfer_runtime.state import KV_SETTINGS

__all__ = ["EXAMPLES", "flag_overrides", "serve_options"]

EXAMPLES = """
\b
Examples:
  ninfer-serve model.ninfer
  ninfer-serve model.ninfer --max-concurrency 4 --max-context 32768 --backend cuda
  ninfer-serve model.ninfer --config ninfer.toml --host 0.0.0.0 --api-key "$KEY"
"""

# Every option defaults to None (flags: ``default=None`` too) so that ``flag_overrides`` can
# tell a flag the user gave from one left out, and a default never masks the config file.
# In the order ``--help`` lists them.
_OPTIONS: list[Callable[[Any], Any]] = [
    click.argument("model", type=click.Path(path_type=Path)),
    click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path),
        help="TOML file with [server], [engine], [context_cache], [speculative] tables; "
        "flags win over it.",
    ),
    click.option("--host", help="Address to bind.  [default: 127.0.0.1]"),
    click.option("--port", type=int, help="Port (0: any free port).  [default: 8080]"),
    click.option("--api-key", help="Require this key (Bearer or x-api-key); also $NINFER_API_KEY."),
    click.option(
        "--allow-insecure",
        is_flag=True,
        default=None,
        help="Allow a non-loopback --host without an API key.",
    ),
    click.option(
        "--allowed-origins",
        help="Comma-separated origins (scheme://host[:port], or *) whose web pages may call the "
        "server (CORS).  [default: none, no CORS headers]",
    ),
    click.option(
        "--allow-credentials",
        is_flag=True,
        default=None,
        help="With --allowed-origins: pages may send cookies and HTTP auth (not with *).",
    ),
    click.option(
        "--served-model-name",
        "--model-id",
        "served_model_name",
        help="Model name clients send.  [default: MODEL's file name without .ninfer]",
    ),
    click.option(
        "--max-context",
        type=int,
        help="Tokens per request (prompt + output), at most the model's positions.  "
        "[default: 8192 or the model's positions if fewer]",
    ),
    click.option(
        "--max-concurrency",
        help="Requests decoding at once: auto (as many lanes as the memory holds, up to the "
        "backend's most, 64) or a number up to it.  [default: auto]",
    ),
    click.option(
        "--max-pending-requests",
        type=int,
        help="Requests that may wait for a lane; beyond that 429.  [default: 16]",
    ),
    click.option(
        "--pending-timeout-ms",
        type=int,
        help="Longest wait for a lane before 503.  [default: 30000]",
    ),
    click.option(
        "--max-connections",
        type=int,
        help="Open connections served at once; more are answered 503.  "
        "[default: 4096, or fewer if ulimit -n leaves less]",
    ),
    click.option(
        "--keep-alive-timeout",
        type=float,
        help="Seconds an idle connection stays open between requests.  [default: 5]",
    ),
    click.option(
        "--header-timeout",
        type=float,
        help="Seconds a request head may take to arrive in full.  [default: 10]",
    ),
    click.option(
        "--max-request-mib",
        type=float,
        help="Largest request body.  [default: 32 bytes per context token, at least 1, plus "
        "one --max-image-mib image in base64]",
    ),
    click.option(
        "--max-image-mib",
        type=float,
        help="Largest image (decoded or fetched).  [default: 10]",
    ),
    click.option(
        "--max-images-per-request",
        type=int,
        help="Images one request may carry (0: no image input).  [default: 16]",
    ),
    click.option(
        "--allow-image-urls",
        is_flag=True,
        default=None,
        help="Fetch http(s) image URLs that requests name (off: base64 images only; the server "
        "would reach any host a request names).",
    ),
    click.option(
        "--image-fetch-timeout",
        type=float,
        help="With --allow-image-urls: seconds one image URL may take.  [default: 10]",
    ),
    click.option(
        "--prefill-chunk",
        type=click.IntRange(min=1),
        help="Prompt tokens per prefill step.  [default: the backend's, 512 on cpu, 2048 on cuda]",
    ),
    click.option(
        "--kv-dtype",
        type=click.Choice(list(KV_SETTINGS)),
        help="How K/V are stored (auto: float32 on cpu, bfloat16 on cuda).  [default: auto]",
    ),
    click.option(
        "--tensor-parallel",
        type=int,
        help=(
            "Ranks the model is split over, a process each (cuda: a GPU each, NCCL between "
            "them).  [default: 1]"
        ),
    ),
    click.option(
        "--expert-parallel/--no-expert-parallel",
        default=None,
        help="With --tensor-parallel: each routed expert whole on one rank (EP), not split.  "
        "[default: split]",
    ),
    click.option(
        "--context-capacity",
        help="Memory for K/V pages and recurrent states: auto or a size like 24GiB.  "
        "[default: auto]",
    ),
    click.option(
        "--memory-headroom",
        help="With --context-capacity auto: GPU memory left free beside the pool, e.g. 4GiB.  "
        "[default: 2GiB or 5% of the GPU, whichever is more]",
    ),
    click.option(
        "--host-context-capacity",
        help="Host memory preempted requests are copied to (and back from, exactly); beyond it "
        "they replay their tokens.  [default: 4GiB]",
    ),
    click.option(
        "--vram-budget",
        metavar="SIZE",
        help="Device memory for weights, workspace and context, e.g. 8GiB: a MoE model's routed "
        "experts that do not fit are computed from host memory (the CPU backend simulates the "
        "split).  [default: $NINFER_VRAM_BUDGET_MIB, else none]",
    ),
    click.option(
        "--host-expert-cache",
        metavar="SIZE",
        help="With --vram-budget: host memory for decoded copies of the most chosen host "
        "experts, e.g. 4GiB (0: none).  [default: a quarter of the available memory]",
    ),
    click.option("--expert-stream-rows", type=click.IntRange(min=0), help=EXPERT_STREAM_ROWS_HELP),
    click.option(
        "--expert-stream-chunk", type=click.IntRange(min=1), help=EXPERT_STREAM_CHUNK_HELP
    ),
    click.option(
        "--expert-stream-decode",
        type=click.Choice(EXPERT_STREAM_DECODE),
        help=EXPERT_STREAM_DECODE_HELP,
    ),
    click.option("--ple-rows", type=click.Choice(PLE_ROWS_CHOICES), help=PLE_ROWS_HELP),
    click.option("--backend", type=click.Choice(["cpu", "cuda"]), help="[default: cpu]"),
    speculative_options(None),
    click.option(
        "--default-max-tokens",
        type=int,
        help="max_tokens for requests that give none.  [default: rest of the context]",
    ),
    click.option(
        "--no-thinking",
        "no_thinking",
        is_flag=True,
        default=None,
        help="Templates skip reasoning unless a request asks for it.",
    ),
    click.option(
        "--chat-template",
        type=click.Path(path_type=Path),
        help="Jinja chat template to use instead of the artifact's.",
    ),
    click.option(
        "--log-level",
        type=click.Choice(["critical", "error", "warning", "info", "debug"]),
        help="[default: info]",
    ),
]


def serve_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``command`` with MODEL and every ``ninfer-serve`` option, in help order."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def flag_overrides(flags: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The options given, per settings table (``None``: not given, left to the file or the
    default); the API key falls back to ``$NINFER_API_KEY``."""
    api_key = flags["api_key"] or os.environ.get("NINFER_API_KEY") or None
    return {
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
            "expert_stream_rows": flags["expert_stream_rows"],
            "expert_stream_chunk": flags["expert_stream_chunk"],
            "expert_stream_decode": flags["expert_stream_decode"],
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
