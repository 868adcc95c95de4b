"""``ninfer-bench run --tensor-parallel N``: the decode table over N ranks beside one rank's."""

from __future__ import annotations

from typing import Any

import click


def parallel_table(
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
