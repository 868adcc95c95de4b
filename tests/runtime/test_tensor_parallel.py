"""Tensor parallelism on the CPU: two ranks as threads of one process (``ThreadGroup``), each
holding its share of the model (``models/qwen3_5/shard.py``), give one rank's greedy tokens."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from ninfer_runtime.models import load_model
from ninfer_runtime.models.qwen3_5.config import Qwen35Config
from ninfer_runtime.models.qwen3_5.shard import local_config, shard_parameter, split_of
from ninfer_runtime.parallel import CollectiveError, Shard, ShardError, Solo, ThreadGroup
from ninfer_runtime.runner import ModelRunner

PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3, 250, 18, 64, 5], dtype=np.int64)


def greedy(runner: ModelRunner, tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """The prompt prefilled in two chunks, then ``tokens`` greedy decode steps: the tokens and
    every step's logits."""
    state = runner.new_state(64)
    logits = runner.prefill(PROMPT, state, chunk=8, last_only=True).logits[0][-1]
    out, seen = [], [logits]
    for _ in range(tokens):
        out.append(int(np.argmax(logits)))
        logits = runner.forward([np.array([out[-1]])], [state]).logits[0][-1]
        seen.append(logits)
    return out, seen


def each_rank(group: ThreadGroup, work) -> list:
    """``work(rank)`` for every rank of the group, each in its own thread -> their results in
    rank order; the first failure is raised (after breaking the group, so no rank waits)."""
    results: list = [None] * group.world
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            results[r] = work(group.rank(r))
        except BaseException as exc:
            errors.append(exc)
            group.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(group.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def on_ranks(path, world: int, tokens: int) -> list[tuple[list[int], list[np.ndarray]]]:
    """``greedy`` on each rank of a ``world``-rank thread group."""
    return each_rank(
        ThreadGroup(world, timeout=60),
        lambda rank: greedy(ModelRunner(load_model(path, "cpu", collective=rank)), tokens),
    )


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_two_ranks_give_one_ranks_greedy_tokens(artifact_path, kind) -> None:
    path = artifact_path("qwen3_5_bf16", kind)
    want, want_logits = greedy(ModelRunner(load_model(path)), tokens=12)
    ranks = on_ranks(path, 2, tokens=12)
    for got, got_logits in ranks:
        assert got == want
        for a, b in zip(got_logits, want_logits, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())
    # every rank computed the same sums: bit-identical logits
    assert all(np.array_equal(a, b) for a, b in zip(ranks[0][1], ranks[1][1], strict=True))


def test_a_rank_holds_its_share_of_the_heads(artifact_path) -> None:
    """Each rank's model has half the query, GDN key and value heads, the one key/value head
    shared (fewer than ranks), and pools sized for them."""
    path = artifact_path("qwen3_5_bf16", "dense")
    full = load_model(path).config
    group = ThreadGroup(2)
    model = load_model(path, "cpu", collective=group.rank(1))
    c = model.config
    assert c.attention.heads == full.attention.heads // 2
    assert c.attention.kv_heads == full.attention.kv_heads == 1
    assert c.gdn.key_heads == full.gdn.key_heads // 2
    assert c.gdn.value_heads == full.gdn.value_heads // 2
    assert (c.hidden, c.vocab) == (full.hidden, full.vocab)
    assert model.output_head.shape == (full.vocab // 2, full.hidden)  # its vocabulary rows


def test_the_shares_put_together_are_the_parameter(artifact_path) -> None:
    """For every split parameter, the ranks' shares along its axis are its blocks' parts in
    rank order (the GDN convolution: of each of q, k and v), and each is a different part;
    a parameter not split is the same on every rank."""
    from ninfer_format import Artifact

    art = Artifact.open(artifact_path("qwen3_5_bf16", "moe"))
    c = Qwen35Config.from_text_config(art.components["text"].config)
    names = [n for n in art.bindings if n.startswith(("text/", "mtp/"))]
    split = 0
    for name in names:
        full = np.asarray(art.parameter(name, in_order=True))
        parts = [shard_parameter(name, full, c, Shard(r, 2)) for r in range(2)]
        rule = split_of(name)
        if rule is None:
            assert all(p is full for p in parts), name
            continue
        split += 1
        axis = rule[0]
        if name.endswith("attention/key") or name.endswith("attention/value"):
            assert all(np.array_equal(p, full) for p in parts), name  # one kv head: shared
            continue
        if name.endswith("gdn/convolution"):
            kw, vw = c.gdn.key_width, c.gdn.value_width
            blocks = np.split(full, [kw, 2 * kw], axis=1)
            for r in range(2):
                want = np.concatenate([np.array_split(b, 2, axis=1)[r] for b in blocks], axis=1)
                np.testing.assert_array_equal(parts[r], want)
            assert parts[0].shape[1] == (2 * kw + vw) // 2
            continue
        np.testing.assert_array_equal(np.concatenate(parts, axis=axis), full, err_msg=name)
        assert parts[0].shape[axis] == full.shape[axis] // 2
    assert split > 20  # attention, GDN, dense and expert projections all found


def test_a_geometry_that_does_not_split_is_refused_naming_the_field(artifact_path) -> None:
    from ninfer_format import Artifact

    c = Qwen35Config.from_text_config(
        Artifact.open(artifact_path("qwen3_5_bf16", "dense")).components["text"].config
    )
    with pytest.raises(ShardError, match="num_attention_heads: 2 do not split over 3 ranks"):
        local_config(c, 3)
    gdn_only = dataclasses.replace(c, attention=None)
    with pytest.raises(ShardError, match="linear_num_key_heads: 2 do not split over 4 ranks"):
        local_config(gdn_only, 4)


def test_a_rank_that_fails_breaks_the_group_instead_of_hanging() -> None:
    group = ThreadGroup(2, timeout=30)
    caught: list[BaseException] = []

    def waiting() -> None:
        try:
            group.rank(0).all_reduce(np.ones(3))
        except CollectiveError as exc:
            caught.append(exc)

    t = threading.Thread(target=waiting)
    t.start()
    group.abort()  # rank 1 failed before its all-reduce
    t.join(10)
    assert not t.is_alive() and caught and "stopped taking part" in str(caught[0])


def test_all_reduce_sums_in_rank_order_on_every_rank() -> None:
    xs = [np.array([1e8, 1.0], dtype=np.float32), np.array([-1e8, 2.0], dtype=np.float32)]
    xs.append(np.array([3.0, 4.0], dtype=np.float32))
    out = each_rank(ThreadGroup(3), lambda rank: rank.all_reduce(xs[rank.rank]))
    want = (xs[0] + xs[1]) + xs[2]
    assert all(np.array_equal(o, want) for o in out)
    assert Solo().all_reduce(xs[0]) is xs[0]


def test_all_gather_puts_the_ranks_side_by_side_in_rank_order() -> None:
    xs = [np.arange(6.0).reshape(2, 3), 10 + np.arange(4.0).reshape(2, 2)]
    out = each_rank(ThreadGroup(2), lambda rank: rank.all_gather(xs[rank.rank]))
    want = np.concatenate(xs, axis=-1)
    assert all(np.array_equal(o, want) for o in out) and out[0].shape == (2, 5)
