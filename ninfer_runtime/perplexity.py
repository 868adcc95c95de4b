"""``ninfer-perplexity``: perplexity of a text file under a .ninfer model.

Sliding windows of ``--context`` tokens advance by ``--stride``; each window scores only the
tokens not scored by the previous one (the usual strided evaluation), reading its prefix from
scratch so every scored token sees up to ``context - stride`` tokens of history.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import click
import numpy as np

from ninfer_format.extras import require_extra
from ninfer_format.progress import terminal_bar

from .backends.base import to_numpy
from .errors import EngineError
from .logprobs import log_softmax


def perplexity(engine, ids: list[int], context: int, stride: int) -> tuple[float, int, float]:  # type: ignore[no-untyped-def]
    """(perplexity, scored tokens, seconds)."""
    if len(ids) < 2:
        raise EngineError("the text needs at least two tokens")
    if not 0 < stride <= context:
        raise EngineError(f"--stride must be in 1..--context ({context}), got {stride}")
    runner = engine.runner
    nll, scored, started = 0.0, 0, time.perf_counter()
    previous_end = 1  # token 0 is never scored (nothing predicts it)
    with terminal_bar(len(ids) - 1, "scoring", "tok") as advance:
        for begin in range(0, len(ids) - 1, stride):
            end = min(begin + context, len(ids))
            window = np.asarray(ids[begin:end], dtype=np.int64)
            state = runner.new_state(len(window))
            logits = []
            for a in range(0, len(window), engine.prefill_chunk):
                out = runner.forward([window[a : a + engine.prefill_chunk]], [state])
                logits.append(to_numpy(out.logits[0]).astype(np.float32, copy=False))
            rows = np.concatenate(logits)[:-1]  # row t predicts token t+1
            targets = window[1:]
            first = max(previous_end, begin + 1) - (begin + 1)
            lp = log_softmax(rows[first:])
            nll -= float(lp[np.arange(len(lp)), targets[first:]].sum())
            scored += len(lp)
            advance(len(lp))
            previous_end = end
            if end == len(ids):
                break
    return math.exp(nll / scored), scored, time.perf_counter() - started


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Example: ninfer-perplexity model.ninfer --text wiki.txt --context 1024 --stride 512",
)
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--text",
    "text_file",
    type=click.Path(path_type=Path),
    required=True,
    help="UTF-8 text file to score.",
)
@click.option("--context", type=int, default=1024, show_default=True, help="Window in tokens.")
@click.option("--stride", type=int, default=None, help="Window step (default: context / 2).")
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
def main(model: Path, text_file: Path, context: int, stride: int | None, backend: str) -> None:
    """Print the perplexity of a text file under the .ninfer artifact MODEL."""
    require_extra("runtime", "ninfer-perplexity")
    from .engine import Engine

    try:
        text = text_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"ninfer-perplexity: {text_file}: {exc}", err=True)
        sys.exit(2)
    if not model.is_file():
        click.echo(f"ninfer-perplexity: {model}: no such file", err=True)
        sys.exit(2)
    try:
        engine = Engine(model, backend=backend, max_context=max(context, 2))
        ids = engine.tokenizer.encode(text)
        ppl, scored, seconds = perplexity(engine, ids, context, stride or max(context // 2, 1))
    except EngineError as exc:
        click.echo(f"ninfer-perplexity: error: {exc}", err=True)
        sys.exit(1)
    click.echo(
        f"perplexity {ppl:.4f} over {scored} tokens ({len(ids)} in the text), "
        f"{scored / seconds:.1f} tok/s"
    )


if __name__ == "__main__":
    main()
