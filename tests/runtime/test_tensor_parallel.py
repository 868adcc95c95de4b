"""Tensor parallelism on the CPU: two ranks, each holding its share of the model
(``models/qwen3_5/shard.py``), give one rank's greedy tokens: as threads of one process
(``ThreadGroup``) at the runner, as processes joined by pipes under the engine."""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading

import numpy as np
import pytest

from ninfer_runtime.models import load_model
from ninfer_runtime.models.qwen3_5.config import Qwen35Config
from ninfer_runtime.models.qwen3_5.shard import local_config, shard_parameter, split_of
from ninfer_runtime.parallel import CollectiveError, Shard, ShardError, Solo, ThreadGroup
from ninfer_runtime.runner import ModelRunner
from tests.bundled import BUNDLED

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


def on_ranks(
    path, world: int, tokens: int, expert_parallel: bool = False
) -> list[tuple[list[int], list[np.ndarray]]]:
    """``greedy`` on each rank of a ``world``-rank thread group."""
    return each_rank(
        ThreadGroup(world, timeout=60),
        lambda rank: greedy(ModelRunner(load_model(path, "cpu", rank, expert_parallel)), tokens),
    )


@pytest.mark.parametrize(
    ("kind", "expert_parallel"),
    [("dense", False), ("moe", False), ("moe", True)],
    ids=["dense", "moe-split-experts", "moe-whole-experts"],
)
def test_two_ranks_give_one_ranks_greedy_tokens(artifact_path, kind, expert_parallel) -> None:
    path = artifact_path("qwen3_5_bf16", kind)
    want, want_logits = greedy(ModelRunner(load_model(path)), tokens=12)
    ranks = on_ranks(path, 2, tokens=12, expert_parallel=expert_parallel)
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


def test_with_expert_parallelism_a_rank_holds_its_experts_whole(artifact_path) -> None:
    """Each rank holds a contiguous half of every layer's routed experts, whole, and none of
    the others' (not loaded at all); the shared expert and the heads stay split."""
    from ninfer_format import Artifact

    path = artifact_path("qwen3_5_bf16", "moe")
    full = load_model(path)
    experts = full.config.moe.experts
    art = Artifact.open(path)
    group = ThreadGroup(2)
    for r in range(2):
        model = load_model(path, "cpu", group.rank(r), expert_parallel=True)
        held = range(r * experts // 2, (r + 1) * experts // 2)
        assert model.config.moe.held == held
        assert model.config.attention.heads == full.config.attention.heads // 2
        for layer, whole in zip(model.layers, full.layers, strict=True):
            ws, wf = layer.ffn.weights, whole.ffn.weights
            assert [e for e, ex in enumerate(ws.experts) if ex is not None] == list(held)
            for e in held:
                np.testing.assert_array_equal(ws.experts[e].gate, wf.experts[e].gate)
                np.testing.assert_array_equal(ws.experts[e].down, wf.experts[e].down)
            assert ws.shared.gate.shape[0] == wf.shared.gate.shape[0] // 2
    name = "text/layers/0/moe/experts/0/down"
    assert name in art.bindings and split_of(name) is not None
    assert split_of(name, expert_parallel=True) is None
    assert split_of("text/layers/0/moe/shared/down", expert_parallel=True) is not None


def test_experts_that_do_not_split_are_refused_naming_the_field(artifact_path) -> None:
    from ninfer_format import Artifact

    art = Artifact.open(artifact_path("qwen3_5_bf16", "moe"))
    c = Qwen35Config.from_text_config(art.components["text"].config)
    with pytest.raises(ShardError, match=f"num_experts: {c.moe.experts} do not split over 3"):
        local_config(c, Shard(0, 3, expert_parallel=True))


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
        local_config(c, Shard(0, 3))
    gdn_only = dataclasses.replace(c, attention=None)
    with pytest.raises(ShardError, match="linear_num_key_heads: 2 do not split over 4 ranks"):
        local_config(gdn_only, Shard(0, 4))


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


# ----------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("bundled_tp") / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, out)
    return out


def replies(engine, questions: list[str]) -> list[list[int]]:
    """Greedy token ids for each question in turn, then for a follow-up turn of the first
    (whose prompt starts with a cached one when the prefix cache is on)."""
    from ninfer_runtime.engine import GenerationRequest, TokenEvent
    from ninfer_runtime.frontend import SamplingParams

    def ask(messages) -> list[int]:
        request = GenerationRequest(
            messages=messages, sampling=SamplingParams(temperature=0.0, max_tokens=24)
        )
        return [e.token_id for e in engine.generate(request) if isinstance(e, TokenEvent)]

    out = [ask([{"role": "user", "content": q}]) for q in questions]
    first = [{"role": "user", "content": questions[0]}]
    text = engine.tokenizer.decode(out[0])
    follow_up = [*first, {"role": "assistant", "content": text}]
    out.append(ask([*follow_up, {"role": "user", "content": "And why?"}]))
    return out


def engine_and_rank(path, **options):
    """An engine over two ranks, and rank 1's process."""
    from ninfer_runtime.engine import Engine

    before = set(multiprocessing.active_children())
    engine = Engine(path, tensor_parallel=2, **options)
    (rank,) = [p for p in multiprocessing.active_children() if p not in before]
    assert rank.name == "ninfer-rank-1"
    return engine, rank


@pytest.mark.parametrize(
    "options",
    [{}, {"prefix_cache": True}, {"spec": "mtp"}],
    ids=["plain", "prefix-cache", "speculative"],
)
def test_an_engine_over_two_ranks_answers_as_one_rank(bundled, options) -> None:
    """``Engine(tensor_parallel=2)``: rank 0 schedules, rank 1 (a process) makes its runner's
    and pool's calls on its share of the model; the greedy replies are one rank's."""
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.speculative import SpecConfig

    if options.get("spec"):
        options = {"spec": SpecConfig(method="mtp", draft_tokens=2)}
    questions = ["What is the capital of France?", "Hello!", "Tell me a joke."]
    want = replies(Engine(bundled, max_context=256, **options), questions)
    engine, follower = engine_and_rank(bundled, max_context=256, **options)
    assert engine.model.config.attention.heads == 1  # rank 0's share of the two heads
    got = replies(engine, questions)
    assert got == want and all(want)
    del engine  # the engine's end ends the other rank's process
    follower.join(30)
    assert follower.exitcode == 0


def test_ranks_in_processes_with_whole_experts_give_one_ranks_greedy_tokens(
    artifact_path,
) -> None:
    """``parallel_runner(..., expert_parallel=True)``: rank 1 a process holding its half of
    the experts whole, following rank 0's runner calls; one rank's greedy tokens."""
    from ninfer_format import Artifact
    from ninfer_runtime.tensor_parallel import parallel_runner

    path = artifact_path("qwen3_5_bf16", "moe")
    want, _ = greedy(ModelRunner(load_model(path)), tokens=8)
    model, runner, stop = parallel_runner(Artifact.open(path), "cpu", 2, expert_parallel=True)
    try:
        assert model.config.moe.held == range(model.config.moe.experts // 2)
        got, _ = greedy(runner, tokens=8)
    finally:
        stop()
    assert got == want


def test_expert_parallelism_without_ranks_is_refused_in_one_line(bundled) -> None:
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.errors import EngineError

    with pytest.raises(EngineError, match=r"expert_parallel .* needs tensor_parallel .* >= 2"):
        Engine(bundled, max_context=64, expert_parallel=True)


def test_a_rank_that_cannot_load_stops_the_engine_in_one_line(bundled) -> None:
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.errors import EngineError

    with pytest.raises(EngineError, match="num_attention_heads: 2 do not split over 3 ranks"):
        Engine(bundled, max_context=64, tensor_parallel=3)


def test_the_server_reads_its_ranks_from_the_flag_or_the_parallel_table(tmp_path) -> None:
    from ninfer_serve.config import ConfigError, load_settings

    config = tmp_path / "ninfer.toml"
    config.write_text("[parallel]\ntensor_parallel = 2\n")
    assert load_settings(config, {}).parallel.tensor_parallel == 2
    assert load_settings(None, {}).parallel.tensor_parallel == 1
    flags = {"parallel": {"tensor_parallel": 4}}
    assert load_settings(config, flags).parallel.tensor_parallel == 4
    assert load_settings(config, {}).parallel.expert_parallel is False
    config.write_text("[parallel]\ntensor_parallel = 2\nexpert_parallel = true\n")
    assert load_settings(config, {}).parallel.expert_parallel is True
    no = {"parallel": {"expert_parallel": False}}
    assert load_settings(config, no).parallel.expert_parallel is False
    config.write_text("[parallel]\ntensor_parallel = 0\n")
    with pytest.raises(ConfigError, match=f"^{config}: .*tensor_parallel") as error:
        load_settings(config, {})
    assert "\n" not in str(error.value)


def test_ninfer_splits_the_model_over_the_ranks_it_is_given(bundled) -> None:
    """The ``ninfer`` command with ``--tensor-parallel 2`` prints one rank's greedy reply;
    with a count the heads do not split into, one line naming the field."""
    from click.testing import CliRunner

    from ninfer_runtime.cli import main

    args = [str(bundled), "--prompt", "What is the capital of France?", "--greedy"]
    one = CliRunner().invoke(main, args)
    two = CliRunner().invoke(main, [*args, "--tensor-parallel", "2"])
    assert one.exit_code == two.exit_code == 0 and two.stdout == one.stdout
    assert "Paris" in two.stdout
    bad = CliRunner().invoke(main, [*args, "--tensor-parallel", "3"])
    assert bad.exit_code == 1
    assert "num_attention_heads: 2 do not split over 3 ranks" in bad.output


def test_a_rank_whose_process_ends_stops_the_engine_naming_it(bundled) -> None:
    """Rank 1's process ending makes rank 0's next collective raise at once (no wait for
    the timeout), in one line naming rank 1."""
    from ninfer_runtime.engine import GenerationRequest
    from ninfer_runtime.parallel import CollectiveError

    engine, follower = engine_and_rank(bundled, max_context=64)
    follower.kill()
    follower.join(10)
    with pytest.raises(CollectiveError) as error:
        list(engine.generate(GenerationRequest(prompt="Hello")))
    message = str(error.value)
    assert "rank 1's process ended" in message and "\n" not in message


def test_a_rank_that_fails_sends_its_error_instead_of_its_share() -> None:
    """Over the pipes: rank 1 failing (``fail``) makes rank 0's all-reduce raise naming rank
    1 and its error; shares that arrive are combined in rank order and sent back."""
    from multiprocessing import Pipe

    from ninfer_runtime.parallel.processes import PipeRank

    near, far = Pipe()
    rank0, rank1 = PipeRank(0, 2, [near], timeout=30), PipeRank(1, 2, [far], timeout=30)
    got: list = []
    t = threading.Thread(target=lambda: got.append(rank1.all_reduce(np.array([2.0, 3.0]))))
    t.start()
    assert np.array_equal(rank0.all_reduce(np.array([1.0, 1.0])), [3.0, 4.0])
    t.join(10)
    assert np.array_equal(got[0], [3.0, 4.0])
    rank1.fail("RuntimeError: out of memory")
    with pytest.raises(CollectiveError, match="rank 1 failed: RuntimeError: out of memory"):
        rank0.all_gather(np.ones(2))


def test_the_mirror_resolves_rank_0s_objects_to_each_ranks_own_and_forgets_closed_ones() -> None:
    """A follower makes rank 0's calls on its own objects: a state rank 0 passes back (alone
    or in a list) is the follower's state made by the same call, and once closed it is
    forgotten on both sides."""
    import queue

    from ninfer_runtime.parallel import Leader, follow

    class State:
        def __init__(self, rank: int, n: int):
            self.rank, self.n = rank, n

    class Pool:
        def __init__(self, rank: int):
            self.rank, self.opened, self.log = rank, 0, []

        def open(self) -> State:
            self.opened += 1
            return State(self.rank, self.opened)

        def close(self, state: State) -> None:
            self.log.append(("close", state.rank, state.n))

    class Runner:
        def __init__(self, rank: int):
            self.rank, self.log = rank, []

        def new_pool(self) -> Pool:
            return Pool(self.rank)

        def forward(self, ids, states) -> list[int]:
            self.log.append((list(ids), [(s.rank, s.n) for s in states]))
            return [s.n for s in states]

    kept, inbox = (State, Pool), queue.Queue()
    follower, failures = Runner(1), []
    t = threading.Thread(target=follow, args=(inbox, follower, kept, failures.append))
    t.start()
    leader = Leader([inbox], kept, wrapped=(Pool,))
    runner = leader.wrap(Runner(0))
    pool = runner.new_pool()
    a, b = pool.open(), pool.open()
    assert runner.forward([5, 6], [a, b]) == [1, 2]
    pool.close(a)
    assert len(leader._known) == 3  # the runner, the pool and b
    leader.stop()
    t.join(10)
    assert not failures and follower.log == [([5, 6], [(1, 1), (1, 2)])]


def test_rank_0_shares_a_value_down_the_pipes() -> None:
    """``PipeRank.share``: what NCCL's unique id travels by (rank 0's value on every rank)."""
    from ninfer_runtime.parallel.processes import PipeRank

    pairs = [multiprocessing.Pipe() for _ in range(2)]
    root = PipeRank(0, 3, [a for a, _ in pairs])
    others = [PipeRank(r, 3, [b]) for r, (_, b) in enumerate(pairs, start=1)]
    assert root.share(b"id") == b"id"
    assert [rank.share(None) for rank in others] == [b"id", b"id"]


def test_two_ranks_on_the_cuda_backend_need_two_gpus_and_nccl(bundled) -> None:
    """Where this machine cannot run two GPU ranks, the engine says why in one line, before
    any process starts."""
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.errors import EngineError
    from ninfer_runtime.parallel.nccl import unavailable_reason

    reason = unavailable_reason(2)
    if reason is None:
        pytest.skip("this machine runs two GPU ranks (tests/gpu/test_tensor_parallel_cuda.py)")
    before = set(multiprocessing.active_children())
    with pytest.raises(EngineError) as caught:
        Engine(bundled, tensor_parallel=2, backend="cuda")
    assert str(caught.value) == f"--tensor-parallel 2: {reason}"
    assert "\n" not in str(caught.value)
    assert set(multiprocessing.active_children()) == before


def test_a_peer_that_fails_or_ends_is_seen_on_quiet_pipes() -> None:
    """``PipeRank.wait_for_failure``, what NCCL's watchdog waits on: a failure message, or a
    pipe closing with its process, says which rank."""
    from ninfer_runtime.parallel.processes import Failure, PipeRank

    pairs = [multiprocessing.Pipe() for _ in range(2)]
    root = PipeRank(0, 3, [a for a, _ in pairs])
    pairs[1][1].send(Failure(2, "out of memory"))
    assert root.wait_for_failure() == "rank 0 of 3: rank 2 failed: out of memory"
    follower = PipeRank(1, 3, [pairs[0][1]])
    pairs[0][0].close()
    assert follower.wait_for_failure() == "rank 1 of 3: rank 0's process ended"
