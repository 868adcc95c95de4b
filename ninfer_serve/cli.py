"""``ninfer-serve``: serve a .ninfer artifact over HTTP (OpenAI and Anthropic APIs).

The command reads its settings (``--config`` file, flags over it), refuses an exposed host
without an API key and a MODEL that is no artifact, then hands over to ``startup.serve``.
The options live in ``cli_options``; binding, loading, serving and draining in ``startup``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ninfer_format.extras import require_extra
from ninfer_runtime.model_path import not_an_artifact

from .cli_options import EXAMPLES, flag_overrides, serve_options
from .config import ConfigError, is_loopback, load_settings
from .startup import say, serve, served_model_name

__all__ = ["main", "serve", "served_model_name"]


@click.command(epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@serve_options
def main(model: Path, config_path: Path | None, **flags: Any) -> None:
    """Serve the .ninfer artifact MODEL over HTTP: OpenAI Chat Completions and Responses,
    Anthropic Messages, /health and Prometheus /metrics."""
    require_extra("serve", "ninfer-serve")
    try:
        settings = load_settings(config_path, flag_overrides(flags))
    except ConfigError as exc:
        say(f"error: {exc}")
        sys.exit(2)
    server = settings.server
    if not is_loopback(server.host) and not server.api_key and not server.allow_insecure:
        say(
            f"error: refusing to listen on {server.host} without an API key; give --api-key "
            "(or $NINFER_API_KEY), or --allow-insecure if the network is trusted"
        )
        sys.exit(2)
    if not is_loopback(server.host) and not server.api_key:
        say(
            f"warning: listening on {server.host} without an API key (--allow-insecure): "
            "anyone who can reach this port can use the model"
        )
    problem = not_an_artifact(model)
    if problem is not None:
        say(f"error: {problem}")
        sys.exit(2)
    sys.exit(serve(model, settings))
