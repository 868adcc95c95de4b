"""What a tensor-parallel rank of the CUDA backend reads in place (``weights.rank_plan``):
its rows of a parameter split by rows, as segments of the stored objects; a parameter split
along another axis decoded as the rank's share; any other parameter as one rank reads it.
Pure arithmetic over the artifact's bindings: it runs on any machine."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.cuda.weights import plan_segments, rank_plan, rows_of_plan
from ninfer_runtime.models.qwen3_5.config import Qwen35Config
from ninfer_runtime.models.qwen3_5.shard import ShardedArtifact, shard_index, split_of
from ninfer_runtime.parallel import Shard


def stored_rows(plan: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
    """(object, row) of every parameter row, in order."""
    return [(oid, row0 + i) for oid, row0, rows in plan for i in range(rows)]


def test_rows_of_a_plan_cross_its_segments_and_merge() -> None:
    plan = [("a", 10, 4), ("b", 0, 3), ("a", 14, 2)]  # a's rows 14.. continue after b's
    rows = [1, 2, 3, 4, 6, 7, 8]
    got = rows_of_plan(plan, rows)
    assert stored_rows(got) == [stored_rows(plan)[r] for r in rows]
    assert got == [("a", 11, 3), ("b", 0, 1), ("b", 2, 1), ("a", 14, 2)]
    assert rows_of_plan(plan, np.arange(9)) == plan
    assert rows_of_plan(plan, []) == []


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_a_ranks_plan_is_its_share_of_the_stored_rows(artifact_path, kind) -> None:
    from ninfer_format import Artifact

    art = Artifact.open(artifact_path("tiny_mixed", kind))
    c = Qwen35Config.from_text_config(art.components["text"].config)
    by_rows = by_columns = 0
    for rank in range(2):
        sharded = ShardedArtifact(art, c, Shard(rank, 2))
        for name in art.binder_report.parameters:
            full = plan_segments(art, name)
            plan, rows = rank_plan(sharded, name, full)
            split = split_of(name) if name.startswith(("text/", "mtp/")) else None
            if split is None:
                assert (plan, rows) == (full, None), name
                continue
            shape = art.binder_report.parameters[name]
            axis, index = shard_index(name, int(shape[split[0]]), c, Shard(rank, 2))
            if axis != 0 or full is None:  # decoded: the share comes from ``parameter``
                assert (plan, rows) == (None, None), name
                by_columns += axis != 0
                continue
            by_rows += 1
            assert rows == len(index) and sum(n for _, _, n in plan) == rows
            assert stored_rows(plan) == [stored_rows(full)[r] for r in index], name
    assert by_rows > 10 and by_columns > 4  # projections, experts, the head; downs, outputs


def test_an_artifact_that_is_not_sharded_plans_as_before(artifact_path) -> None:
    from ninfer_format import Artifact

    art = Artifact.open(artifact_path("tiny_mixed", "dense"))
    for name in art.binder_report.parameters:
        full = plan_segments(art, name)
        assert rank_plan(art, name, full) == (full, None)
