"""``ninfer-bench cache``: time to first token with a cached prefix against cold, and requests
completing in a pool too small for all of them."""

from __future__ import annotations

import time

import click

from ninfer_format.extras import require_extra

from ..lane_limits import MAX_LANES
from ..state import KV_SETTINGS, resolve_kv_dtype
from .cli_outputs import output_options, write_rows


@click.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cuda", show_default=True)
@click.option(
    "--prefix",
    type=click.IntRange(min=1),
    default=16000,
    show_default=True,
    help="tokens of the shared prefix",
)
@click.option(
    "--suffix",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="tokens after the prefix, fresh for every request",
)
@click.option(
    "--cached-requests",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="requests timed resuming from the prefix (median)",
)
@click.option(
    "--context",
    type=click.IntRange(min=2),
    default=1024,
    show_default=True,
    help="memory pressure: tokens of each request, prompt and generated",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=768,
    show_default=True,
    help="memory pressure: tokens each request generates (greedy)",
)
@click.option(
    "--requests",
    type=click.IntRange(1, MAX_LANES),
    default=8,
    show_default=True,
    help="memory pressure: requests submitted at once (one lane each; at most the backend's "
    "lanes: 64)",
)
@click.option(
    "--full-requests",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="memory pressure: full-length requests the pool's K/V pages hold",
)
@click.option(
    "--host-context-capacity",
    default="0",
    show_default=True,
    help="memory pressure: host memory preempted lanes are copied to (0: they replay)",
)
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="compare the outputs under pressure with an unconstrained run of the same requests "
    "(without it the unconstrained engine is still loaded: its pool sizes the small one)",
)
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="prefill chunk (ninfer-serve's default)",
)
@click.option(
    "--kv-dtype",
    type=click.Choice(list(KV_SETTINGS)),
    default="auto",
    show_default=True,
    help="auto: float32 on cpu, bfloat16 on cuda",
)
@output_options
def cache(
    artifact: str,
    backend: str,
    prefix: int,
    suffix: int,
    cached_requests: int,
    context: int,
    max_tokens: int,
    requests: int,
    full_requests: int,
    host_context_capacity: str,
    check: bool,
    chunk: int,
    kv_dtype: str,
    json_out: str | None,
    record: str | None,
    commit: str | None,
) -> None:  # fmt: skip
    """Time to first token with a cached prefix against cold, and requests completing in a
    pool too small for all of them, through the engine with the prefix cache on.

    \b
    Example (27B shapes on the GPU; about 3 minutes):
      ninfer-bench synth --geometry qwen3_6_27b --formats qwen3_6_27b -o 27b.ninfer
      ninfer-bench cache 27b.ninfer --record docs/performance.md
    """
    require_extra("runtime", "ninfer-bench cache")  # the engine's tokenizer and chat template
    from ninfer_format import Artifact, ArtifactError

    from ..backends import get_backend
    from ..errors import EngineError
    from . import cache as C
    from . import measure as M
    from . import record as R

    if max_tokens >= context:
        raise click.BadParameter(
            f"{max_tokens} must be below --context ({context}): each prompt has "
            "context - max-tokens tokens",
            param_hint="--max-tokens",
        )
    started = time.perf_counter()
    kv_dtype = resolve_kv_dtype(kv_dtype, backend)
    try:
        opened = Artifact.open(artifact)
        ttft = C.prefix_ttft(
            opened, backend, prefix=prefix, suffix=suffix, cached_requests=cached_requests,
            chunk=chunk, kv_dtype=kv_dtype,
        )  # fmt: skip
        rows = [{"kind": "prefix ttft", **M.as_row(ttft)}]
        click.echo("\n".join(C.table_lines(rows)))
        pressure = C.memory_pressure(
            opened, backend, requests=requests, full_requests=full_requests, context=context,
            max_tokens=max_tokens, check=check, chunk=chunk, kv_dtype=kv_dtype,
            host_context_capacity=host_context_capacity,
        )  # fmt: skip
    except (ArtifactError, EngineError, C.CacheMiss) as exc:
        raise click.ClickException(str(exc)) from None
    rows.append({"kind": "pressure", **M.as_row(pressure)})
    click.echo("\n".join(C.table_lines(rows[1:])))
    click.echo(f"done in {time.perf_counter() - started:.1f} s")

    def markdown() -> str:
        xp = get_backend(backend).xp
        return C.markdown(rows, R.run_context(xp, artifact, kv_dtype, M.copy_bandwidth(xp), commit))

    write_rows(rows, json_out, record, markdown)
