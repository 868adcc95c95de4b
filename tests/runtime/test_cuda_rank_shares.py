"""What a tensor-parallel rank of the CUDA backend holds of each weight
(``weight_plans.rank_share``, ``Residency._share``): its rows of a parameter split by rows and
its columns of one split by columns, cut out of the stored objects as objects of their own
(``codecs.slicing``), which decode to exactly the rank's share; any other parameter as one rank
holds it. The residency runs on numpy here, so this checks on any machine what the GPU will
upload."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_runtime.backends.cuda import weights
from ninfer_runtime.backends.cuda.tiles import unpack_tiles
from ninfer_runtime.backends.cuda.weights import (
    PackedWeight,
    Residency,
    plan_segments,
    rank_share,
    rows_of_plan,
)
from ninfer_runtime.models.qwen3_5.config import Qwen35Config
from ninfer_runtime.models.qwen3_5.shard import ShardedArtifact
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
def test_a_ranks_cut_weights_decode_to_its_share(artifact_path, kind, monkeypatch) -> None:
    from ninfer_format import Artifact

    monkeypatch.setattr(weights, "PACK_FROM_WEIGHTS", 0)  # tile pack the tiny q4/q5/q8 objects too
    art = Artifact.open(artifact_path("tiny_mixed", kind))
    c = Qwen35Config.from_text_config(art.components["text"].config)
    by_rows = by_columns = tiled = 0
    for rank in range(2):
        sharded = ShardedArtifact(art, c, Shard(rank, 2))
        residency = Residency(np)
        for name in art.binder_report.parameters:
            plan = plan_segments(art, name)
            share = rank_share(sharded, name, plan)
            if share is None:  # held whole: as one rank holds it
                continue
            weight = residency._share(sharded, name, share)
            want = sharded.parameter(name, in_order=True)
            if not isinstance(weight, PackedWeight):
                np.testing.assert_array_equal(weight.array, want, err_msg=name)
                continue
            assert weight.shape == want.shape and share.cuts
            parts = []
            for cut, seg in zip(share.cuts, weight.segments, strict=True):
                obj = art.objects[cut.object_id]
                width = cut.columns[1] - cut.columns[0]
                codec = codec_for(obj.format, obj.layout)
                data, planes = seg.parent.data, seg.parent.planes
                if planes.tiled:  # tile packed at upload: the stored bytes come back
                    data = unpack_tiles(np, data, planes.code, cut.rows, width)
                    tiled += 1
                parts.append(codec.decode(data, (cut.rows, width)))
                # the rank holds that piece only, not the object it was cut from
                assert data.nbytes == codec.encoded_size((cut.rows, width))
            np.testing.assert_array_equal(np.concatenate(parts), want, err_msg=name)
            by_rows += share.by_rows
            by_columns += not share.by_rows
    assert by_rows > 10 and by_columns > 4  # projections, experts, the head; downs, outputs
    assert tiled > 0  # the mixed recipe's q4/q5/q8 projections outside the MoE blocks


def test_an_artifact_that_is_not_sharded_is_held_whole(artifact_path) -> None:
    from ninfer_format import Artifact

    art = Artifact.open(artifact_path("tiny_mixed", "dense"))
    assert all(
        rank_share(art, name, plan_segments(art, name)) is None
        for name in art.binder_report.parameters
    )


def test_with_expert_parallelism_a_rank_uploads_its_experts_rows_only(artifact_path) -> None:
    """Under expert parallelism a rank's routed experts are held whole, and of the banks that
    stack every expert it uploads the run of rows of its own experts only: about half the
    bytes of one rank's, and the same values."""
    from ninfer_format import Artifact

    art = Artifact.open(artifact_path("tiny_q4", "moe"))  # (experts in q4: cut by rows)
    c = Qwen35Config.from_text_config(art.components["text"].config)
    experts = c.moe.experts

    def names(held: range) -> list[str]:
        return [f"text/layers/0/moe/experts/{e}/{p}" for e in held for p in ("gate", "up", "down")]

    banks = {oid for n in names(range(experts)) for oid, _, _ in plan_segments(art, n)}
    whole = sum(int(art.objects[oid].bytes) for oid in banks)  # what one rank uploads
    for rank in range(2):
        sharded = ShardedArtifact(art, c, Shard(rank, 2, expert_parallel=True))
        held = range(rank * experts // 2, (rank + 1) * experts // 2)
        residency = Residency(np)
        got = residency.prepare(sharded, names(held))
        for name, weight in got.items():
            ((oid, _, _),) = plan_segments(art, name)[:1]
            obj = art.objects[oid]
            codec = codec_for(obj.format, obj.layout)
            rows = []
            for seg in weight.segments:
                p = seg.parent.planes
                assert seg.parent.object_id != oid  # a cut of the bank, not the bank
                rows.append(
                    codec.decode(seg.parent.data, (p.rows, p.columns))[seg.row0 :][: seg.rows]
                )
            np.testing.assert_array_equal(
                np.concatenate(rows), art.parameter(name, in_order=True), err_msg=name
            )
        assert 0 < residency.report.bytes <= whole // 2 + 1024


@pytest.mark.parametrize("recipe", ["tiny_mixed", "tiny_q4"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_one_rank_uses_every_row_of_the_objects_it_uploads(artifact_path, recipe, kind) -> None:
    """On one rank no object is cut to the rows its parameters use (``Residency._windows``):
    the model's parameters cover every row of every object they read."""
    from ninfer_format import Artifact
    from ninfer_runtime.models.qwen3_5.model import Qwen35Model

    art = Artifact.open(artifact_path(recipe, kind))
    c = Qwen35Config.from_text_config(art.components["text"].config)
    names = Qwen35Model.parameter_names(c, "mtp" in art.components)
    plans = {name: plan_segments(art, name) for name in names}
    whole = [name for name in names if plans[name]]
    assert len(whole) > 20
    assert Residency(np)._windows(art, whole, plans) == {}
