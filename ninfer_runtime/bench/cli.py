"""``ninfer-bench``: benchmark helpers. ``synth`` writes a synthetic artifact."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from ninfer_format.errors import ArtifactError, TargetExists
from ninfer_format.extras import require_extra
from ninfer_format.progress import terminal_bar

from ..state import KV_DTYPES
from .geometries import GEOMETRIES


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ninfer benchmark tools."""


@main.command()
@click.option("--geometry", type=click.Choice(sorted(GEOMETRIES)), required=True)
@click.option("--formats", required=True, help="recipe name, e.g. qwen3_6_27b_nvfp4")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="overwrite an existing artifact")
@click.option("--plan-only", is_flag=True, help="print the planned size, write nothing")
@click.option(
    "--mtp/--no-mtp",
    default=True,
    show_default=True,
    help="write the recipe's MTP component (the drafter of --spec mtp)",
)
@click.option(
    "--proposal-rows",
    type=int,
    help="rows of the indexed proposal head (default: 131072 capped by the vocabulary when "
    "there is an MTP component; 0: none)",
)
@click.option(
    "--layers",
    type=click.IntRange(min=1),
    help="write only this many decoder layers, at full width, keeping one of every kind "
    "(ninfer-bench run then extrapolates the whole model's step)",
)
@click.option(
    "--ple-rows-scale",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=1.0,
    show_default=True,
    help="n-gram (PLE) tables of about this share of their rows, for disk (a step reads as "
    "many rows either way)",
)
def synth(
    geometry: str,
    formats: str,
    output: str,
    seed: int,
    force: bool,
    plan_only: bool,
    mtp: bool,
    proposal_rows: int | None,
    layers: int | None,
    ple_rows_scale: float,
) -> None:
    """Write a synthetic artifact: random valid codes and scales, no checkpoint needed.

    \b
    Example (Qwen3.8-Flash-Next's layers at full width, three of its 48, tables at 1/16):
      ninfer-bench synth --geometry qwen3_8_flash_next --formats qwen3_8_flash_next \\
          --layers 3 --ple-rows-scale 0.0625 -o q38-3l.ninfer
    """
    require_extra("convert", "ninfer-bench synth")
    from ninfer_format.errors import ArtifactError as FormatError

    from .synthetic import RecipeError, plan_synthetic, write_synthetic

    shape = dict(mtp=mtp, proposal_rows=proposal_rows, layers=layers, ple_rows_scale=ple_rows_scale)
    try:
        plan = plan_synthetic(geometry, formats, **shape)
    except RecipeError as exc:
        raise click.BadParameter(str(exc), param_hint="--formats") from None
    except (ValueError, FormatError) as exc:
        hint = "--layers" if "--layers" in str(exc) else "--proposal-rows"
        raise click.BadParameter(str(exc), param_hint=hint) from None
    parts = ", ".join(f"{c} {b / 1e9:.3f}" for c, b in plan.bytes_by_component().items())
    click.echo(
        f"{geometry} / {plan.recipe.name}: {len(plan.parents)} weight objects, "
        f"{plan.payload_bytes / 1e9:.3f} GB planned ({parts} GB)"
    )
    if plan.reduction is not None:
        _echo_reduction(plan.reduction)
    if mtp and "mtp" in plan.recipe.components and "mtp" not in plan.components:
        click.echo("no mtp component: the runtime runs no MTP block for this architecture")
    if plan_only:
        return
    try:
        report = write_synthetic(
            output, geometry, formats, seed, force, **shape, progress=terminal_bar
        )
    except TargetExists:
        raise click.ClickException(f"{output}: already exists; add --force to replace it") from None
    except (ArtifactError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"wrote {output}: {report.payload_bytes / 1e9:.3f} GB in {report.seconds:.1f} s "
        f"({report.mb_per_s:.0f} MB/s)"
    )


def _echo_reduction(reduced: dict[str, Any]) -> None:
    """What a reduced plan keeps and what it stands for."""
    whole = reduced["whole_bytes"]
    kinds = ", ".join(f"{k} x{n}" for k, n in reduced["whole_kinds"].items())
    click.echo(
        f"layers kept: {reduced['kept']} ({', '.join(reduced['kinds'])}) of "
        f"{sum(reduced['whole_kinds'].values())} ({kinds}); the whole model's text weights "
        f"{whole['weights'] / 2**30:.1f} GiB, routed experts {whole['experts'] / 2**30:.1f} GiB"
    )
    if reduced["ple_rows_scale"] != 1:
        click.echo(
            f"n-gram (PLE) tables at {reduced['ple_rows_scale']:g} of their rows (for disk; a "
            "step reads as many rows a token, so the step is unchanged but for caching)"
        )


def _load(opened: Any, backend: str, vram_budget: str | None, reduced: Any) -> Any:
    """The model, its routed experts split by ``vram_budget`` (scaled to a reduced artifact)."""
    from ..expert_offload import ExpertOffload
    from ..models import load_model

    if vram_budget is None:
        return load_model(opened, backend)
    budget, note = _scaled_budget(opened, vram_budget, reduced)
    click.echo(note)
    offload = ExpertOffload.for_budget(budget, backend)
    options = {"ple_rows": "streamed"} if _has_ple(opened) else None  # as the whole model's
    return load_model(opened, backend, expert_offload=offload, options=options)


def _has_ple(opened: Any) -> bool:
    return bool(opened.components["text"].config.get("ple_layer_ids"))


def _scaled_budget(opened: Any, given: str, reduced: Any) -> tuple[int, str]:
    """The budget in bytes for this artifact, and a line saying so. A reduced artifact gets
    its own weights other than routed experts (n-gram tables aside: they stay on the host)
    plus the share of its experts the whole model would keep within ``given``."""
    from ..capacity import parse_size
    from ..expert_offload.plan import WeightSizes

    whole_budget = parse_size(given, "vram budget")
    assert whole_budget is not None
    if reduced is None:
        return whole_budget, f"--vram-budget {whole_budget / 2**30:.1f} GiB"
    names = [n for n in opened.bindings if n.startswith("text/") and "ngram_table" not in n]
    sizes = WeightSizes.measure(opened, names)
    whole = reduced["whole_bytes"]
    tables = sum(_stored(opened, n) for n in opened.bindings if "ngram_table" in n) / reduced.get(
        "ple_rows_scale", 1
    )
    whole_other = whole["weights"] - whole["experts"] - tables
    share = min(1.0, max(0.0, (whole_budget - whole_other) / max(whole["experts"], 1)))
    budget = int(sizes.other + share * sizes.expert_total)
    return budget, (
        f"--vram-budget {whole_budget / 2**30:.1f} GiB for the whole model keeps "
        f"{100 * share:.1f}% of its routed experts in device memory; this artifact gets "
        f"{budget / 2**30:.2f} GiB, the same share of its own"
    )


def _stored(opened: Any, name: str) -> int:
    from ..expert_offload.plan import stored_bytes

    return stored_bytes(opened, name)


def _ints(ctx: click.Context | None, param: click.Parameter | None, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected comma-separated positive integers, got {text!r}")
    return values


def _parallel_table(
    opened: Any,
    backend: str,
    ranks: int,
    lanes: list[int],
    contexts: list[int],
    steps: int,
    one_rank: dict[tuple[int, int], float],
    kv_dtype: str,
    expert_parallel: bool = False,
) -> list[dict]:
    """The decode table over ``ranks`` ranks (``tensor_parallel.parallel_runner``; with
    ``expert_parallel`` each routed expert whole on one rank), each row
    beside one rank's step (``one_rank``, ms by (lanes, context)); the floor is rank 0's
    share of the step's bytes at the copy bandwidth measured on its device."""
    import gc

    from ..errors import EngineError
    from ..tensor_parallel import parallel_runner
    from . import measure as M

    gc.collect()
    try:
        _, runner, stop = parallel_runner(opened, backend, ranks, expert_parallel)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None
    rows: list[dict] = []
    try:
        bandwidth = M.copy_bandwidth(runner.backend.xp)
        click.echo(
            f"{ranks} ranks{', experts whole' if expert_parallel else ''} (copy "
            f"{bandwidth / 1e9:.0f} GB/s on rank 0's device; GB/step and "
            "floor: rank 0's share)"
        )
        click.echo(
            f"{'lanes':>5} {'context':>7} {'tok/s':>9} {'ms/step':>8} {'GB/step':>8} "
            f"{'floor ms':>8} {'% floor':>7} {'x 1 rank':>8}"
        )
        for context in contexts:
            for n in lanes:
                r = M.decode_rate(
                    runner, n, context, steps=steps, floor_bw=bandwidth, kv_dtype=kv_dtype
                )
                speedup = one_rank[n, context] / r.step_ms
                rows.append(
                    {"kind": "decode parallel", "ranks": ranks, **M.as_row(r), "speedup": speedup}
                )
                click.echo(
                    f"{n:>5} {context:>7} {r.tokens_per_s:>9.1f} {r.step_ms:>8.2f} "
                    f"{r.bytes_per_step / 1e9:>8.2f} {r.floor_ms:>8.2f} "
                    f"{r.percent_of_floor:>6.1f}% {speedup:>7.2f}x"
                )
    finally:
        stop()
    return rows


def _ints_or_none(ctx: click.Context, param: click.Parameter, text: str | None) -> list[int] | None:
    return None if text is None else _ints(ctx, param, text)


@main.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cuda", show_default=True)
@click.option(
    "--lanes", default="1,2,4,8", show_default=True, callback=_ints, help="decode lane counts"
)
@click.option(
    "--contexts", default="1024,16384", show_default=True, callback=_ints, help="decode contexts"
)
@click.option("--steps", type=int, default=32, show_default=True, help="timed decode steps")
@click.option("--prefill", type=int, default=7680, show_default=True, help="0 skips prefill")
@click.option("--chunk", type=int, default=2048, show_default=True, help="prefill chunk")
@click.option(
    "--long-prefill",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="also prefill one prompt of this many tokens, timed by part (e.g. 131072)",
)
@click.option(
    "--profile-prefill",
    is_flag=True,
    help="also profile one prefill chunk of --chunk tokens (ablation, ms per op)",
)
@click.option(
    "--kv-dtype", type=click.Choice(list(KV_DTYPES)), default="float32", show_default=True
)
@click.option("--profile", "profile_lanes", type=int, default=0, help="also profile N lanes")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="write rows as JSON")
@click.option(
    "--record",
    type=click.Path(dir_okay=False, writable=True),
    help="append the run (date, device, commit, tables) to this markdown file",
)
@click.option(
    "--commit",
    help="the source commit --record names (default: git describe of the source tree)",
)
@click.option(
    "--spec",
    type=click.Choice(["off", "mtp", "dflash", "dflash2"]),
    default="off",
    show_default=True,
    help="also time speculative rounds of this drafter against the plain step",
)
@click.option(
    "--draft-tokens",
    callback=_ints_or_none,
    help="draft tokens per round, comma-separated  [default with --spec mtp: 1,2,3,4,5]",
)
@click.option("--rounds", type=int, default=16, show_default=True, help="timed rounds (median)")
@click.option(
    "--tensor-parallel",
    "ranks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="also time the decode table over this many ranks (a process each; cuda: a GPU each), "
    "beside one rank's",
)
@click.option(
    "--expert-parallel",
    is_flag=True,
    help="with --tensor-parallel: each routed expert whole on one rank (EP), not split",
)
@click.option(
    "--measure-acceptance",
    is_flag=True,
    help="with --spec mtp: greedy answers to the demo prompts through the engine, with and "
    "without rounds (meaningful on a model whose MTP head is trained)",
)
@click.option(
    "--answer-tokens",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="with --measure-acceptance: the most tokens of each answer",
)
@click.option(
    "--vram-budget",
    help="device memory for the weights, e.g. 139GiB (one H200): routed experts beyond it are "
    "computed from host memory (CPU backend). For an artifact of fewer layers, the budget "
    "of the whole model: the same share of experts is kept in host memory",
)
def run(
    artifact: str,
    backend: str,
    lanes: list[int],
    contexts: list[int],
    steps: int,
    prefill: int,
    chunk: int,
    long_prefill: int,
    profile_prefill: bool,
    kv_dtype: str,
    profile_lanes: int,
    json_out: str | None,
    record: str | None,
    commit: str | None,
    spec: str,
    draft_tokens: list[int] | None,
    rounds: int,
    measure_acceptance: bool,
    answer_tokens: int,
    ranks: int,
    expert_parallel: bool,
    vram_budget: str | None,
) -> None:
    """Decode and prefill rates of ARTIFACT beside their floors; with --spec mtp, speculative
    rounds against the plain step.

    \b
    Example (27B shapes, q4/q5 weights, on the GPU):
      ninfer-bench synth --geometry qwen3_6_27b --formats qwen3_6_27b -o 27b.ninfer
      ninfer-bench run 27b.ninfer --record docs/performance.md
      ninfer-bench run 27b.ninfer --spec mtp --prefill 0 --record docs/performance.md
      ninfer-bench run 27b.ninfer --tensor-parallel 2 --prefill 0   # two GPUs against one

    An artifact of fewer layers (synth --layers) also gets each kind of layer's time and the
    whole model's step extrapolated from them, said as such.
    """
    import json
    import os

    from ninfer_format import Artifact, ArtifactError

    from ..errors import EngineError
    from ..runner import ModelRunner
    from . import layer_times as T
    from . import measure as M
    from . import record as R
    from .active_bytes import ActiveWeights, active_weights

    if record and not os.path.isdir(os.path.dirname(os.path.abspath(record))):
        raise click.BadParameter(f"{record}: its directory does not exist", param_hint="--record")
    drafts = _draft_tokens(spec, draft_tokens, measure_acceptance)
    started = time.perf_counter()
    try:
        opened = Artifact.open(artifact)
        reduced = opened.provenance.get("reduced")
        runner = ModelRunner(_load(opened, backend, vram_budget, reduced))
        weights = active_weights(opened)
    except (ArtifactError, EngineError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if drafts and not runner.model.has_mtp:
        raise click.ClickException(
            f"{artifact}: the artifact has no mtp component; --spec mtp needs one "
            "(ninfer-bench synth writes it unless --no-mtp)"
        )
    click.echo(f"loaded {artifact} on {backend} in {time.perf_counter() - started:.1f} s")
    xp = runner.backend.xp
    bandwidth = M.copy_bandwidth(xp)
    click.echo(f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s (read + write); K/V {kv_dtype}")
    rows: list[dict] = []
    click.echo(
        f"{'lanes':>5} {'context':>7} {'tok/s':>9} {'ms/step':>8} {'GB/step':>8} "
        f"{'floor ms':>8} {'% floor':>7}"
    )
    plain: dict[tuple[int, int], float] = {}
    for context in contexts:
        for n in lanes:
            r = M.decode_rate(
                runner, n, context, steps=steps, floor_bw=bandwidth, kv_dtype=kv_dtype,
                weights=weights,
            )  # fmt: skip
            plain[n, context] = r.step_ms
            rows.append({"kind": "decode", **M.as_row(r)})
            click.echo(
                f"{n:>5} {context:>7} {r.tokens_per_s:>9.1f} {r.step_ms:>8.2f} "
                f"{r.bytes_per_step / 1e9:>8.2f} {r.floor_ms:>8.2f} {r.percent_of_floor:>6.1f}%"
            )
    if reduced is not None:
        counted = weights if weights is not None else ActiveWeights(opened)
        click.echo(
            f"this artifact has {len(reduced['kept'])} of the model's "
            f"{sum(reduced['whole_kinds'].values())} layers: each kind's time is measured "
            "(layers timed one by one), the whole model's step EXTRAPOLATED from them"
        )
        for row in [r for r in rows if r["kind"] == "decode"]:
            decode = M.DecodeResult(**{k: row[k] for k in M.DecodeResult.__dataclass_fields__})
            e = T.extrapolate_row(
                runner, reduced, counted, decode, kv_dtype=kv_dtype, steps=steps,
                floor_bw=bandwidth,
            )  # fmt: skip
            rows.append({"kind": "decode extrapolated", **M.as_row(e)})
            click.echo("\n".join(T.lines(e)))
    if drafts:
        rows += _spec_tables(runner, drafts, plain, rounds, bandwidth, kv_dtype)
    if measure_acceptance:
        rows += _acceptance_table(opened, backend, drafts, answer_tokens, kv_dtype)
    if prefill:
        rate = M.matmul_rate(xp)
        p = M.prefill_rate(runner, prefill, chunk=chunk, flop_rate=rate, weights=weights)
        rows.append({"kind": "prefill", **M.as_row(p), "matmul_flops": rate})
        click.echo(
            f"prefill {p.tokens} tokens (chunk {p.chunk}): {p.tokens_per_s:.0f} tok/s, "
            f"{p.seconds:.2f} s; {p.flops / 1e12:.1f} TFLOP at a measured "
            f"{rate / 1e12:.0f} TFLOP/s fp16 matmul = {p.floor_s:.2f} s floor "
            f"({p.percent_of_floor:.1f}%)"
        )
    if long_prefill:
        rate = M.matmul_rate(xp)
        segments = M.long_prefill(
            runner, long_prefill, chunk=chunk, flop_rate=rate, kv_dtype=kv_dtype, weights=weights
        )
        parts = [{"kind": "long prefill", "chunk": chunk, **M.as_row(s)} for s in segments]
        rows += parts
        total = sum(s.seconds for s in segments)
        click.echo(
            f"one {long_prefill}-token prompt (chunk {chunk}): {long_prefill / total:.0f} "
            f"tok/s, {total:.2f} s; by part (floor: FLOPs at {rate / 1e12:.0f} TFLOP/s):"
        )
        click.echo("\n".join(R.long_prefill_table(parts)))
    if profile_prefill:
        spent = M.profile_prefill(runner, chunk)
        rows.append({"kind": "prefill profile", "tokens": chunk, "past": 0, **spent})
        click.echo(f"prefill profile, one {chunk}-token chunk: ms taken by each op (ablation)")
        for name, ms in spent.items():
            click.echo(f"  {name:<18} {ms:8.2f}")
    if profile_lanes:
        spent = M.profile_decode(runner, profile_lanes, contexts[0])
        rows.append({"kind": "profile", "lanes": profile_lanes, **spent})
        click.echo(f"profile, {profile_lanes} lane(s): ms per step taken by each op (ablation)")
        for name, ms in spent.items():
            click.echo(f"  {name:<18} {ms:8.3f}")
        for k in drafts:
            spent = M.profile_round(runner, profile_lanes, contexts[0], k)
            rows.append({"kind": "round profile", "lanes": profile_lanes, "k": k, **spent})
            click.echo(
                f"round profile, {profile_lanes} lane(s), K = {k}: ms per round taken by each "
                "op (ablation)"
            )
            for name, ms in spent.items():
                click.echo(f"  {name:<18} {ms:8.3f}")
    if ranks > 1:
        del runner  # one rank's model leaves the device before the ranks load theirs
        rows += _parallel_table(
            opened, backend, ranks, lanes, contexts, steps, plain, kv_dtype, expert_parallel
        )
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)
    if record:
        context = R.run_context(xp, artifact, kv_dtype, bandwidth, commit)
        R.append(record, R.markdown(rows, context))
        click.echo(f"recorded in {record}")


@main.command()
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
    type=click.IntRange(1, 8),
    default=8,
    show_default=True,
    help="memory pressure: requests submitted at once (one lane each)",
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
    "--kv-dtype", type=click.Choice(list(KV_DTYPES)), default="float32", show_default=True
)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="write rows as JSON")
@click.option(
    "--record",
    type=click.Path(dir_okay=False, writable=True),
    help="append the run (date, device, commit, tables) to this markdown file",
)
@click.option(
    "--commit",
    help="the source commit --record names (default: git describe of the source tree)",
)
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
    import json
    import os

    from ninfer_format import Artifact, ArtifactError

    from ..backends import get_backend
    from ..errors import EngineError
    from . import cache as C
    from . import measure as M
    from . import record as R

    if record and not os.path.isdir(os.path.dirname(os.path.abspath(record))):
        raise click.BadParameter(f"{record}: its directory does not exist", param_hint="--record")
    if max_tokens >= context:
        raise click.BadParameter(
            f"{max_tokens} must be below --context ({context}): each prompt has "
            "context - max-tokens tokens",
            param_hint="--max-tokens",
        )
    started = time.perf_counter()
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
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)
    if record:
        xp = get_backend(backend).xp
        context = R.run_context(xp, artifact, kv_dtype, M.copy_bandwidth(xp), commit)
        R.append(record, C.markdown(rows, context))
        click.echo(f"recorded in {record}")


def _draft_tokens(spec: str, given: list[int] | None, acceptance: bool) -> list[int]:
    """The K values to time: none without --spec; 1..5 by default with --spec mtp."""
    from ..errors import EngineError
    from ..speculative import MAX_DRAFT_TOKENS, SpecConfig

    if spec == "off":
        if given is not None or acceptance:
            option = "--draft-tokens" if given is not None else "--measure-acceptance"
            raise click.BadParameter(f"{option} needs --spec mtp", param_hint="--spec")
        return []
    drafts = given or list(range(1, MAX_DRAFT_TOKENS + 1))
    try:
        for k in drafts:
            SpecConfig(method=spec, draft_tokens=k)
    except EngineError as exc:
        hint = "--spec" if "method" in str(exc) else "--draft-tokens"
        raise click.BadParameter(str(exc), param_hint=hint) from None
    return drafts


def _spec_tables(
    runner: Any,
    drafts: list[int],
    plain: dict[tuple[int, int], float],
    rounds: int,
    bandwidth: float,
    kv_dtype: str,
) -> list[dict]:
    """A round of each K at each (lanes, context) against the plain step, then a draft
    step's cost with the proposal head and with the full vocabulary."""
    from . import measure as M

    rows: list[dict] = []
    rates = "".join(f" {f'a={a:g}':>14}" for a in M.ACCEPTANCE_RATES)
    click.echo(
        "speculative rounds (draft + verify + commit); tok/s (speed-up) at per-position "
        "acceptance a"
    )
    click.echo(
        f"{'lanes':>5} {'context':>7} {'K':>2} {'ms/step':>8} {'ms/round':>8} {'ratio':>6} "
        f"{'GB/round':>8} {'floor ms':>8} {'% floor':>7} {'plain tok/s':>11}{rates}"
    )
    for (n, context), step_ms in plain.items():
        for k in drafts:
            r = M.spec_round_rate(
                runner, n, context, k, step_ms=step_ms, floor_bw=bandwidth, rounds=rounds,
                kv_dtype=kv_dtype,
            )  # fmt: skip
            rows.append({"kind": "spec", **M.as_row(r)})
            implied = "".join(
                f" {f'{r.tokens_per_s(a):.1f} ({r.speedup(a):.2f}x)':>14}"
                for a in M.ACCEPTANCE_RATES
            )
            click.echo(
                f"{n:>5} {context:>7} {k:>2} {r.step_ms:>8.2f} {r.round_ms:>8.2f} "
                f"{r.ratio:>5.2f}x {r.bytes_per_round / 1e9:>8.2f} {r.floor_ms:>8.2f} "
                f"{r.percent_of_floor:>6.1f}% {r.plain_tokens_per_s:>11.1f}{implied}"
            )
    if runner.model.proposal_head is None:
        click.echo("no proposal head: draft steps score the full vocabulary")
        return rows
    click.echo("one draft step (MTP block + head): proposal rows (optimized) vs full vocabulary")
    click.echo(
        f"{'lanes':>5} {'context':>7} {'rows':>7} {'opt ms':>8} {'floor ms':>8} "
        f"{'full ms':>8} {'floor ms':>8} {'saved':>6}"
    )
    for n, context in plain:
        d = M.draft_step_rate(runner, n, context, floor_bw=bandwidth, kv_dtype=kv_dtype)
        rows.append({"kind": "draft", **M.as_row(d)})
        click.echo(
            f"{n:>5} {context:>7} {d.proposal_rows:>7} {d.optimized_ms:>8.3f} "
            f"{d.optimized_floor_ms:>8.3f} {d.full_ms:>8.3f} {d.full_floor_ms:>8.3f} "
            f"{100 * (1 - d.optimized_ms / d.full_ms):>5.0f}%"
        )
    return rows


def _acceptance_table(
    artifact: Any, backend: str, drafts: list[int], answer_tokens: int, kv_dtype: str
) -> list[dict]:
    """Measured acceptance and tok/s of greedy answers to the demo prompts, per K."""
    from . import measure as M

    results = M.measure_acceptance(
        artifact, backend, drafts, max_tokens=answer_tokens, kv_dtype=kv_dtype
    )
    click.echo(
        f"measured on {len(M.DEMO_PROMPTS)} demo prompts (greedy, one lane, through the engine)"
    )
    click.echo(
        f"{'K':>2} {'tokens':>6} {'accepted':>8} {'tok/round':>9} {'tok/s':>8} "
        f"{'plain tok/s':>11} {'speed-up':>8} {'same tokens':>11}"
    )
    rows = []
    for a in results:
        rows.append({"kind": "acceptance", **M.as_row(a)})
        click.echo(
            f"{a.draft_tokens:>2} {a.tokens:>6} {100 * a.acceptance:>7.1f}% "
            f"{a.tokens_per_round:>9.2f} {a.tokens_per_s:>8.1f} {a.plain_tokens_per_s:>11.1f} "
            f"{a.speedup:>7.2f}x {'yes' if a.same_tokens else 'NO':>11}"
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
