"""The options ``ninfer`` and ``ninfer-serve`` share, and the engine settings they become.

Both commands take the same speculative decoding flags and ``--ple-rows``, and size the
context the same way against the model's positions; ``ninfer-serve`` reads these from here
(``ninfer_runtime.cli`` re-exports them too). Nothing here imports the engine, so ``--help``
stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ninfer_format import Artifact

from .errors import EngineError


def speculative_options(spec_default: str | None) -> Callable[[Any], Any]:
    """``--spec``, ``--draft-tokens`` and ``--proposal-head``, as ``ninfer`` and
    ``ninfer-serve`` both take them (``spec_default`` None: a config file may set it)."""
    options = [
        click.option(
            "--spec",
            default=spec_default,
            metavar="off|mtp",
            help="Speculative decoding: mtp drafts with the artifact's MTP component "
            "(dflash, dflash2: not available yet).  [default: off]",
        ),
        click.option(
            "--draft-tokens",
            type=int,
            help="Tokens drafted per round with --spec mtp, 1..5.  [default: 3]",
        ),
        click.option(
            "--proposal-head",
            type=click.Choice(["optimized", "full"]),
            help="The drafter scores the artifact's proposal rows or the whole vocabulary.  "
            "[default: optimized when the artifact has them]",
        ),
    ]

    def apply(fn: Any) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


#: --max-context when not given (unless the model has fewer positions)
DEFAULT_CONTEXT = 4096
#: ``--ple-rows`` values, Qwen4Exp's ``ple_rows`` model option (``models/qwen4_exp/ple_rows.py``
#: is the authority; kept here so ``--help`` does not import the model)
PLE_ROWS_CHOICES = ("auto", "resident", "streamed")
#: the help text of ``--ple-rows`` (ninfer and ninfer-serve)
PLE_ROWS_HELP = (
    "Qwen4Exp's PLE n-gram tables: resident (loaded whole), streamed (rows read from the "
    "artifact as steps need them) or auto (streamed above 1 GiB decoded). Another model "
    "refuses the option.  [default: the model's, auto]"
)

#: the help text of ``--expert-stream-rows`` (ninfer and ninfer-serve); its default is
#: ``expert_offload.STREAM_ROWS``, written out so ``--help`` does not import the runtime
EXPERT_STREAM_ROWS_HELP = (
    "With --vram-budget: a prefill chunk of more token rows than this streams the host "
    "experts it routes to through the device instead of computing them on the host.  "
    "[default: 32]"
)
#: the help text of ``--expert-stream-chunk``; its default is
#: ``expert_offload.STREAM_CHUNK``, written out as above
EXPERT_STREAM_CHUNK_HELP = (
    "With --vram-budget leaving experts in host memory: prompt tokens per prefill step, "
    "when more than the engine's prefill chunk (each host expert a step routes to crosses "
    "to the device once a step).  [default: 8192]"
)

#: the help text of ``--expert-stream-decode``; its choices and default are
#: ``stream_window.STREAM_DECODE``, written out as above
EXPERT_STREAM_DECODE = ("auto", "all", "off", "mapped")
EXPERT_STREAM_DECODE_HELP = (
    "With --vram-budget on a GPU: how decode steps compute the host experts they route to: "
    "mapped (the device reads them in place from pinned host memory: no copy, no host "
    "work), all (streamed through the device), off (on the host), or auto (mapped on a "
    "GPU).  [default: auto]"
)


def model_options(ple_rows: str | None) -> dict[str, Any] | None:
    """The engine's ``model_options`` from the flags that set one (None: none given, so a
    model that takes no such option is not refused)."""
    return {"ple_rows": ple_rows} if ple_rows is not None else None


def model_positions(artifact: Artifact) -> int | None:
    """The text model's ``max_position_embeddings`` (None when its config does not say)."""
    text = artifact.components.get("text")
    value = (text.config or {}).get("max_position_embeddings") if text is not None else None
    return value if type(value) is int and value > 0 else None


def fit_context(requested: int | None, positions: int | None) -> int:
    """``--max-context`` for a model of ``positions``: the default is cut to them, a larger
    value given is refused (RoPE past the trained positions gives no usable text)."""
    if requested is None:
        return DEFAULT_CONTEXT if positions is None else min(DEFAULT_CONTEXT, positions)
    if positions is not None and requested > positions:
        raise EngineError(
            f"--max-context {requested} is more than the model's {positions} positions "
            f"(its max_position_embeddings); give {positions} or less"
        )
    return requested
