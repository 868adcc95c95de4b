"""``ninfer``: one-shot generation from a .ninfer artifact on the command line."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import click

from ninfer_format import Artifact, ArtifactError
from ninfer_format.extras import require_extra

from .errors import EngineError, RequestError
from .model_path import not_an_artifact
from .state import KV_DTYPES

if TYPE_CHECKING:
    from .speculative import SpecConfig, SpecStats


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

EPILOG = """\b
Examples:
  ninfer model.ninfer --prompt "What is the capital of France?"
  ninfer model.ninfer --prompt "Tell me a joke." --temperature 0.7 --seed 1 --stream
  ninfer model.ninfer --messages chat.json --no-thinking --max-tokens 200
  ninfer model.ninfer --raw --prompt "Once upon a time" --greedy --print-token-ids
  ninfer model.ninfer --prompt "Count to ten." --spec mtp --draft-tokens 3 --stats
  ninfer vlm.ninfer --image cat.jpg --prompt "What is in this picture?"
"""


def _messages(
    prompt: str | None, messages_file: Path | None, system: str | None, images: int = 0
) -> list[Any]:
    if messages_file is not None:
        try:
            data = json.loads(messages_file.read_text())
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"{messages_file}: {exc}", param_hint="--messages") from None
        messages = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(messages, list):
            raise click.BadParameter(
                'expected a JSON list of messages (or {"messages": [...]})', param_hint="--messages"
            )
    else:
        messages = [{"role": "user", "content": prompt}]
    if images:
        messages = _with_images(messages, images)
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    return messages


def _with_images(messages: list[Any], images: int) -> list[Any]:
    """``messages`` with ``images`` image parts put first in the last user message, before
    its text (``--image`` files, in the order given)."""
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise click.BadParameter("--image needs a user message to go with", param_hint="--image")
    last = dict(messages[users[-1]])
    content = last.get("content")
    text = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    last["content"] = [*({"type": "image"} for _ in range(images)), *text]
    return [*messages[: users[-1]], last, *messages[users[-1] + 1 :]]


def _read_images(paths: tuple[Path, ...]) -> list[Any]:
    from .media import ImageInput

    images = []
    for path in paths:
        try:
            images.append(ImageInput(path.read_bytes()))
        except OSError as exc:
            message = f"{path}: {exc.strerror or exc}"
            raise click.BadParameter(message, param_hint="--image") from None
    return images


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
    type=click.Choice(list(KV_DTYPES)),
    default="float32",
    show_default=True,
    help="How keys and values are kept (bfloat16: half the memory, fp8_e4m3: a quarter).",
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


def _spec_summary(stats: SpecStats | None) -> str:
    """The ``--stats`` line: how many drafts verification kept, overall and by position."""
    if stats is None:
        return "[speculative decoding off]"
    by_position = " ".join(
        f"{count / max(stats.rounds, 1):.0%}" for count in stats.accepted_per_position
    )
    fallbacks = f", {stats.fallbacks} step(s) without drafts" if stats.fallbacks else ""
    return (
        f"[speculative: {stats.accepted}/{stats.drafted} drafts accepted "
        f"({stats.acceptance_rate:.1%}), {stats.tokens_per_round:.2f} tokens per round over "
        f"{stats.rounds} rounds, by position {by_position}{fallbacks}]"
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


def _run(model: Path, o: SimpleNamespace, spec: SpecConfig | None) -> None:
    from .engine import Engine, Finished, GenerationRequest, OutputEvent, TokenEvent
    from .expert_offload import vram_budget_setting
    from .frontend import (
        ReasoningDelta,
        SamplingParams,
        TextDelta,
        ToolCallArgumentsDelta,
        ToolCallStart,
    )

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
            messages=_messages(o.prompt, o.messages_file, o.system, len(o.image_files)),
            images=_read_images(o.image_files),
            sampling=params,
            enable_thinking=False if o.no_thinking else None,
        )
    stream = o.stream
    reasoning, text, ids = [], [], []
    in_reasoning = False
    finished = None
    for event in _named_image_errors(engine.generate(request), o.image_files):
        if isinstance(event, TokenEvent):
            ids.append(event.token_id)
        elif isinstance(event, OutputEvent):
            e = event.event
            if isinstance(e, ReasoningDelta):
                reasoning.append(e.text)
                if stream:
                    if not in_reasoning:
                        click.secho("[reasoning] ", dim=True, nl=False)
                        in_reasoning = True
                    click.secho(e.text, dim=True, nl=False)
            elif isinstance(e, TextDelta | ToolCallStart | ToolCallArgumentsDelta):
                piece = (
                    e.text
                    if isinstance(e, TextDelta | ToolCallArgumentsDelta)
                    else f"\n[tool call {e.name}] "
                )
                text.append(piece)
                if stream:
                    if in_reasoning:
                        click.echo("\n")
                        in_reasoning = False
                    click.echo(piece, nl=False)
        elif isinstance(event, Finished):
            finished = event
    if stream:
        click.echo("")
    else:
        if "".join(reasoning).strip():
            click.secho("[reasoning] " + "".join(reasoning).strip(), dim=True)
            click.echo("")
        click.echo("".join(text))
    if o.print_token_ids:
        click.echo(json.dumps(ids))
    assert finished is not None
    u = finished.usage
    prompt_rate = u.prompt_tokens / max(finished.prompt_seconds, 1e-9)
    decode_rate = max(u.completion_tokens - 1, 0) / max(finished.decode_seconds, 1e-9)
    images = f" ({u.images} images)" if u.images else ""
    click.secho(
        f"[{u.prompt_tokens} prompt tokens{images} at {prompt_rate:.1f} tok/s, "
        f"{u.completion_tokens} "
        f"generated at {decode_rate:.1f} tok/s, finish: {finished.reason}, load {loaded:.2f} s]",
        dim=True,
        err=True,
    )
    if o.stats:
        click.secho(_spec_summary(engine.spec_stats), dim=True, err=True)


def _named_image_errors(events: Iterator[Any], files: tuple[Path, ...]) -> Iterator[Any]:
    """``events``, with an error about the request's i-th image (``param`` ``images[i]``)
    naming its file instead."""
    try:
        yield from events
    except RequestError as exc:
        param = exc.param or ""
        index = param[len("images[") : -1] if param.startswith("images[") else ""
        if not index.isdigit() or int(index) >= len(files):
            raise
        raise RequestError(f"{files[int(index)]}: {exc}", param=param, code=exc.code) from None


if __name__ == "__main__":
    main()
