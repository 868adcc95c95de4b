"""``ninfer-bench run``: decode and prefill rates of an artifact beside their floors, and the
tables its options add (speculative rounds, profiles, long prefill, ranks)."""

from __future__ import annotations

import time

import click

from ..state import KV_SETTINGS, resolve_kv_dtype
from .cli_load import load_bench_model, load_options
from .cli_outputs import output_options, write_rows
from .cli_parallel import parallel_table
from .cli_providers import force_providers, provider_option
from .cli_spec import acceptance_table, chosen_draft_tokens, spec_tables
from .offload_rates import OffloadReport
from .ple_rates import PleReport


def _ints(ctx: click.Context | None, param: click.Parameter | None, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected comma-separated positive integers, got {text!r}")
    return values


def _ints_or_none(ctx: click.Context, param: click.Parameter, text: str | None) -> list[int] | None:
    return None if text is None else _ints(ctx, param, text)


@click.command()
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
@click.option(
    "--chunk",
    type=int,
    default=2048,
    show_default=True,
    help="prefill chunk (under a --vram-budget that leaves experts to stream, the engine's "
    "longer expert stream chunk, as it plans)",
)
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
    "--kv-dtype",
    type=click.Choice(list(KV_SETTINGS)),
    default="auto",
    show_default=True,
    help="auto: float32 on cpu, bfloat16 on cuda",
)
@click.option("--profile", "profile_lanes", type=int, default=0, help="also profile N lanes")
@click.option(
    "--kernel-trace",
    is_flag=True,
    help="with --profile / --profile-prefill: also trace the profiled step's kernels "
    "(torch.profiler: kernels per step, idle gaps, top kernels)",
)
@output_options
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
@provider_option
@load_options
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
    kernel_trace: bool,
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
    ple_rows: str | None,
    expert_stream_decode: str | None,
    forced: list[tuple[str, str, str]],
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
    from ninfer_format import Artifact, ArtifactError

    from ..errors import EngineError
    from ..runner import ModelRunner
    from . import kernel_trace as K
    from . import layer_times as T
    from . import measure as M
    from . import record as R
    from .active_bytes import ActiveWeights, active_weights
    from .kernel_profiler import trace_rows

    drafts = chosen_draft_tokens(spec, draft_tokens, measure_acceptance)
    force_providers(forced)
    started = time.perf_counter()
    try:
        opened = Artifact.open(artifact)
        reduced = opened.provenance.get("reduced")
        model, offload = load_bench_model(
            opened, backend, vram_budget, reduced, chunk, ple_rows, expert_stream_decode
        )
        if offload is not None:  # the chunk the engine would take under this budget
            chunk = offload.prefill_rows
        runner = ModelRunner(model)
        weights = active_weights(opened)
    except (ArtifactError, EngineError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if drafts and not runner.model.has_mtp:
        raise click.ClickException(
            f"{artifact}: the artifact has no mtp component; --spec mtp needs one "
            "(ninfer-bench synth writes it unless --no-mtp)"
        )
    click.echo(f"loaded {artifact} on {backend} in {time.perf_counter() - started:.1f} s")
    kv_dtype = resolve_kv_dtype(kv_dtype, runner.backend)
    xp = runner.backend.xp
    bandwidth = M.copy_bandwidth(xp)
    products = getattr(runner.backend, "decode_precision", "")
    click.echo(
        f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s (read + write); K/V {kv_dtype}"
        + (f"; decode products {products}" if products else "")
    )
    # what offload and streamed PLE rows move, said beside each measurement
    offload_report = OffloadReport.start(offload, xp)
    beside = (offload_report, PleReport.start(model))
    rows: list[dict] = []
    click.echo(
        f"{'lanes':>5} {'context':>7} {'tok/s':>9} {'ms/step':>8} {'GB/step':>8} "
        f"{'floor ms':>8} {'% floor':>7}"
    )
    plain: dict[tuple[int, int], float] = {}
    for context in contexts:
        for n in lanes:
            for report in beside:
                report.reset()
            try:
                r = M.decode_rate(
                    runner, n, context, steps=steps, floor_bw=bandwidth, kv_dtype=kv_dtype,
                    weights=weights,
                )  # fmt: skip
            except EngineError as exc:  # a step's logits were NaN or inf
                raise click.ClickException(str(exc)) from None
            plain[n, context] = r.step_ms
            rows.append({"kind": "decode", **M.as_row(r)})
            click.echo(
                f"{n:>5} {context:>7} {r.tokens_per_s:>9.1f} {r.step_ms:>8.2f} "
                f"{r.bytes_per_step / 1e9:>8.2f} {r.floor_ms:>8.2f} {r.percent_of_floor:>6.1f}%"
            )
            for report in beside:
                rows += report.read(f"{n} lane(s), context {context}", steps + M.DECODE_WARMUP)
    if reduced is not None:
        counted = weights if weights is not None else ActiveWeights(opened)
        click.echo(
            f"this artifact has {len(reduced['kept'])} of the model's "
            f"{sum(reduced['whole_kinds'].values())} layers: each kind's time is measured "
            "(what the step saves with the layer bypassed), the whole model's step "
            "EXTRAPOLATED from them"
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
        rows += spec_tables(runner, drafts, plain, rounds, bandwidth, kv_dtype)
    if measure_acceptance:
        rows += acceptance_table(opened, backend, drafts, answer_tokens, kv_dtype)
    if prefill:
        rate = M.matmul_rate(xp)
        for report in beside:
            report.reset()
        try:
            p = M.prefill_rate(runner, prefill, chunk=chunk, flop_rate=rate, weights=weights)
        except EngineError as exc:  # the prompt read twice gave different logits
            raise click.ClickException(str(exc)) from None
        rows.append({"kind": "prefill", **M.as_row(p), "matmul_flops": rate})
        click.echo(
            f"prefill {p.tokens} tokens (chunk {p.chunk}): {p.tokens_per_s:.0f} tok/s, "
            f"{p.seconds:.2f} s; {p.flops / 1e12:.1f} TFLOP at a measured "
            f"{rate / 1e12:.0f} TFLOP/s fp16 matmul = {p.floor_s:.2f} s floor "
            f"({p.percent_of_floor:.1f}%)"
        )
        # the prompt read twice (warm, then timed): a step is one prompt
        for report in beside:
            rows += report.read(f"prefill of {prefill} tokens, a step = the prompt", 2)
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
    # last: the profiler's hooks time nothing else
    if kernel_trace and (profile_lanes or profile_prefill):
        traced = trace_rows(
            runner, lanes=profile_lanes, context=contexts[0], kv_dtype=kv_dtype,
            chunk=chunk if profile_prefill else 0,
        )  # fmt: skip
        rows += traced
        for row in traced:
            click.echo("\n".join(K.lines(row)))
    rows += offload_report.finish()  # the device memory the run held, against the plan
    if ranks > 1:
        del runner  # one rank's model leaves the device before the ranks load theirs
        rows += parallel_table(
            opened, backend, ranks, lanes, contexts, steps, plain, kv_dtype, expert_parallel
        )
    said = ", ".join(f"{family}.{op}={name}" for family, op, name in forced)
    write_rows(
        rows,
        json_out,
        record,
        lambda: R.markdown(
            rows, R.run_context(xp, artifact, kv_dtype, bandwidth, commit, products, said)
        ),
    )
