"""``ninfer``: one-shot generation from a .ninfer artifact on the command line.

This module is the command itself: its flags, their checks and the run they make. The flags
``ninfer-serve`` shares with it are ``cli_options``' (re-exported here, as callers import them
from this module), the request built from the flags ``cli_request``'s, and what is printed
``cli_output``'s.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import click

from ninfer_format import Artifact, ArtifactError
from ninfer_format.extras import require_extra

from .cli_options import (
    DEFAULT_CONTEXT,
    EXPERT_STREAM_CHUNK_HELP,
    EXPERT_STREAM_DECODE,
    EXPERT_STREAM_DECODE_HELP,
    EXPERT_STREAM_ROWS_HELP,
    PLE_ROWS_CHOICES,
    PLE_ROWS_HELP,
    fit_context,
    model_options,
    model_positions,
    speculative_options,
)
from .cli_output import print_reply, spec_summary, usage_summary
from .cli_request import chat_messages, named_image_errors, read_images
from .errors import EngineError
from .model_path import not_an_artifact
from .state import KV_SETTINGS

if TYPE_CHECKING:
    from .speculative import SpecConfig

__all__ = [
    "DEFAULT_CONTEXT",
    "EXPERT_STREAM_CHUNK_HELP",
    "EXPERT_STREAM_DECODE",
    "EXPERT_STREAM_DECODE_HELP",
    "EXPERT_STREAM_ROWS_HELP",
    "PLE_ROWS_CHOICES",
    "PLE_ROWS_HELP",
    "fit_context",
    "main",
    "model_options",
    "model_positions",
    "speculative_options",
]

EPILOG = """\b
Examples:
  ninfer model.ninfer --prompt "What is the capital of France?"
  ninfer model.ninfer --prompt "Tell me a joke." --temperature 0.7 --seed 1 --stream
  ninfer model.ninfer --messages chat.json --no-thinking --max-tokens 200
  ninfer model.ninfer --raw --prompt "Once upon a time" --greedy --print-token-ids
  ninfer model.ninfer --prompt "Count to ten." --spec mtp --draft-tokens 3 --stats
  ninfer vlm.ninfer --image cat.jpg --prompt "What is in this picture?"
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--prompt", help="The user message (or the raw text with --raw).")
@click.option(
    "--messages",
    "messages_file",
    type=click.Path(path_type=Path),
    help="JSON file with a list of chat messages.",
)
@click.option("--system", help="A system message put first.")
@click.option(
    "--image",
    "image_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="An image (PNG, JPEG, WebP, GIF) put before the user message's text; repeat for "
    "more, in order. Needs a vision-language artifact.",
)
@click.option("--max-tokens", type=int, default=None, help="Generated tokens at most.")
@click.option("--temperature", type=float, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@click.option("--greedy", is_flag=True, help="Always the most likely token (temperature 0).")
@click.option("--no-thinking", is_flag=True, help="Ask the template to skip reasoning.")
@click.option("--raw", is_flag=True, help="Tokenize the prompt as is, without a chat template.")
@click.option("--print-token-ids", is_flag=True, help="Also print the generated ids as JSON.")
@click.option("--stream", is_flag=True, help="Print text as it is generated.")
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--max-context",
    type=click.IntRange(min=2),
    help="Tokens of prompt and reply together at most, up to the model's positions "
    f"(max_position_embeddings).  [default: {DEFAULT_CONTEXT}, or the model's positions if fewer]",
)
@click.option(
    "--kv-dtype",
    type=click.Choice(list(KV_SETTINGS)),
    default="auto",
    show_default=True,
    help="How keys and values are kept (auto: float32 on cpu, bfloat16 on cuda; bfloat16: "
    "half float32's memory, fp8_e4m3: a quarter).",
)
@click.option(
    "--tensor-parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Ranks the model is split over, a process each (cuda: a GPU each, NCCL between them).",
)
@click.option(
    "--expert-parallel",
    is_flag=True,
    help="With --tensor-parallel: each routed expert whole on one rank (EP), not split.",
)
@click.option(
    "--vram-budget",
    metavar="SIZE",
    help="Device memory for weights, workspace and context, e.g. 8GiB: the routed experts "
    "that do not fit are computed from host memory (MoE models; the CPU backend simulates "
    "the split).  [default: $NINFER_VRAM_BUDGET_MIB, else no budget]",
)
@click.option(
    "--host-expert-cache",
    metavar="SIZE",
    help="With --vram-budget: host memory for decoded copies of the most chosen host "
    "experts, e.g. 4GiB (0: none, every use decodes).  [default: a quarter of the available "
    "memory]",
)
@click.option("--expert-stream-rows", type=click.IntRange(min=0), help=EXPERT_STREAM_ROWS_HELP)
@click.option("--expert-stream-chunk", type=click.IntRange(min=1), help=EXPERT_STREAM_CHUNK_HELP)
@click.option(
    "--expert-stream-decode",
    type=click.Choice(EXPERT_STREAM_DECODE),
    help=EXPERT_STREAM_DECODE_HELP,
)
@click.option("--ple-rows", type=click.Choice(PLE_ROWS_CHOICES), help=PLE_ROWS_HELP)
@speculative_options("off")
@click.option("--stats", is_flag=True, help="Also print speculative decoding's acceptance.")
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="warning",
    show_default=True,
    help="info: also which provider serves each op (ninfer.ops) and the engine's choices.",
)
def main(model: Path, **options: Any) -> None:
    """Generate a reply from the .ninfer artifact MODEL."""
    o = SimpleNamespace(**options)
    logging.basicConfig(level=o.log_level.upper(), format="ninfer: %(levelname)s %(message)s")
    if (o.prompt is None) == (o.messages_file is None):
        raise click.UsageError("give exactly one of --prompt and --messages")
    if o.raw and o.messages_file is not None:
        raise click.UsageError("--raw takes --prompt text, not --messages")
    if o.raw and o.image_files:
        raise click.UsageError("--image goes with the chat path (a user message), not --raw")
    require_extra("runtime", "ninfer")
    try:
        spec = _spec_config(o)
    except EngineError as exc:
        click.echo(f"ninfer: error: {exc}", err=True)
        sys.exit(2)
    problem = not_an_artifact(model)
    if problem is not None:
        click.echo(f"ninfer: {problem}", err=True)
        sys.exit(2)
    try:
        _run(model, o, spec)
    except (ArtifactError, EngineError) as exc:
        click.echo(f"ninfer: error: {exc}", err=True)
        sys.exit(1)


def _spec_config(o: SimpleNamespace) -> SpecConfig | None:
    """Speculative decoding's settings from ``--spec``, ``--draft-tokens`` and
    ``--proposal-head`` (None: off); SpecConfig says which values are refused."""
    from .speculative import SpecConfig

    given = {"draft_tokens": o.draft_tokens, "proposal_head": o.proposal_head}
    given = {key: value for key, value in given.items() if value is not None}
    if o.spec == "off":
        if given:
            flags = ", ".join("--" + key.replace("_", "-") for key in given)
            raise EngineError(f"{flags} needs --spec mtp")
        return None
    return SpecConfig(o.spec, **given)


def _run(model: Path, o: SimpleNamespace, spec: SpecConfig | None) -> None:
    """Load the engine, generate the one reply the flags ask for, and print it."""
    from .engine import Engine, GenerationRequest
    from .expert_offload import vram_budget_setting
    from .frontend import SamplingParams

    started = time.perf_counter()
    artifact = Artifact.open(model)
    engine = Engine(
        artifact,
        backend=o.backend,
        max_context=fit_context(o.max_context, model_positions(artifact)),
        max_lanes=1,
        kv_dtype=o.kv_dtype,
        spec=spec,
        tensor_parallel=o.tensor_parallel,
        expert_parallel=o.expert_parallel,
        vram_budget=vram_budget_setting(o.vram_budget),
        host_expert_cache=o.host_expert_cache,
        expert_stream_rows=o.expert_stream_rows,
        expert_stream_chunk=o.expert_stream_chunk,
        expert_stream_decode=o.expert_stream_decode,
        model_options=model_options(o.ple_rows),
    )
    loaded = time.perf_counter() - started
    params = SamplingParams.resolve(
        engine.tokenizer.generation_defaults,
        temperature=0.0 if o.greedy else o.temperature,
        top_p=o.top_p,
        top_k=o.top_k,
        min_p=o.min_p,
        seed=o.seed,
        max_tokens=o.max_tokens,
    )
    if o.raw:
        request = GenerationRequest(prompt=o.prompt, sampling=params, parse_output=False)
    else:
        request = GenerationRequest(
            messages=chat_messages(o.prompt, o.messages_file, o.system, len(o.image_files)),
            images=read_images(o.image_files),
            sampling=params,
            enable_thinking=False if o.no_thinking else None,
        )
    finished = print_reply(
        named_image_errors(engine.generate(request), o.image_files),
        stream=o.stream,
        print_token_ids=o.print_token_ids,
    )
    click.secho(usage_summary(finished, loaded), dim=True, err=True)
    if o.stats:
        click.secho(spec_summary(engine.spec_stats), dim=True, err=True)


if __name__ == "__main__":
    main()
