"""benchmarks/serve_bench.py: the agent workload builds what a chat client resends (one shared
system prompt, then each client's own growing history); the random workload measures tokens
that decode to no text, runs the engine baseline before the server, and starts the server
with the lanes and backend asked for."""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import weakref
from pathlib import Path

import pytest

import ninfer_runtime.engine as engine_module
from tests.benchmarks import BENCHMARKS, load_benchmark

# serve_bench.py's parts, the package beside it, found as when it runs (its folder on sys.path)
sys.path.append(str(BENCHMARKS))
from serve import runs
from serve.engine_baseline import release_device_memory
from serve.errors import BenchError
from serve.report import agent_table
from serve.run_info import device_name
from serve.sample import Sample
from serve.server_process import CUDA_CONTEXT_CAPACITY, server_args, server_command
from serve.stats import Level, agent_stats
from serve.workload import AGENT_TOOLS, agent_conversations

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    return load_benchmark("serve_bench")


def test_agent_conversations_resend_their_growing_history():
    conversations = agent_conversations(clients=3, system_words=50, user_words=6, seed=1)
    sent = []
    for turn in range(3):
        for number, conversation in enumerate(conversations):
            messages = conversation.next_turn()
            sent.append(messages)
            conversation.reply(f"reply {number}.{turn}")
    first, last = sent[0], sent[-1]
    # one system prompt for every client, each client's own user turns
    assert {c.messages[0]["content"] for c in conversations} == {first[0]["content"]}
    assert len(first[0]["content"].split()) == 5 + 50
    assert len({c.messages[1]["content"] for c in conversations}) == 3
    # turn 3 resends turn 1 and 2 (with the replies) and adds one user message
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last[:5] == conversations[2].messages[:5]
    assert last[2]["content"] == "reply 2.0" and last[4]["content"] == "reply 2.1"
    # what turn 1 sent is untouched by later turns
    assert sent[2] == last[:2]


def test_agent_tools_are_function_schemas():
    names = [tool["function"]["name"] for tool in AGENT_TOOLS]
    assert len(names) == len(set(names)) >= 3
    for tool in AGENT_TOOLS:
        assert tool["type"] == "function"
        parameters = tool["function"]["parameters"]
        assert parameters["type"] == "object" and parameters["properties"]
        assert set(parameters["required"]) <= set(parameters["properties"])


def wide_vocabulary_artifact(path: Path, monkeypatch) -> Path:
    """A tiny synthetic model whose vocabulary is mostly ids its byte-level tokenizer does not
    have, as a 27B synthetic artifact's: greedy decoding of its random weights produces
    tokens that decode to no text."""
    from ninfer_runtime.bench import geometries, synthetic

    wide = {**geometries.GEOMETRIES["tiny_dense"], "vocab_size": 65536}
    monkeypatch.setitem(geometries.GEOMETRIES, "tiny_wide_vocabulary", wide)
    synthetic.write_synthetic(path, "tiny_wide_vocabulary", "qwen3_6_27b", seed=0)
    return path


def test_tokens_without_text_are_measured_and_the_baseline_runs_before_the_server(
    tmp_path, monkeypatch, capsys
):
    bench = load_bench()
    model = wide_vocabulary_artifact(tmp_path / "wide.ninfer", monkeypatch)
    # the engines the benchmark builds (other tests of this process may hold engines of theirs)
    built: list[weakref.ref] = []
    engines_alive_at_server_start = []
    start_server = runs.start_server

    class TrackedEngine(engine_module.Engine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(weakref.ref(self))

    def checked_start(*args, **kwargs):
        gc.collect()
        engines_alive_at_server_start.append(sum(ref() is not None for ref in built))
        return start_server(*args, **kwargs)

    monkeypatch.setattr(engine_module, "Engine", TrackedEngine)
    monkeypatch.setattr(runs, "start_server", checked_start)
    report = tmp_path / "report.json"
    argv = ["serve_bench.py", "--model", str(model), "--concurrency", "2", "--num-prompts", "2"]
    argv += ["--input-words", "8", "--output-len", "4", "--engine-baseline"]
    argv += ["--commit", "c0ffee", "--json", str(report)]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    out = capsys.readouterr().out

    # the baseline ran first and was released before the server started
    order = [out.index(s) for s in ("[C=2] engine baseline", "engine baseline released")]
    assert order == sorted(order) and order[-1] < out.index("[C=2] server: ")
    assert len(built) == 1 and engines_alive_at_server_start == [0]
    # no token showed text, yet every one is counted, and TTFT / TPOT are the server's
    level = json.loads(report.read_text())["levels"][0]
    server, engine = level["server"], level["engine"]
    assert "no text was streamed" in out
    assert server["ok"] == 2 and server["output_tokens"] == 2 * 4
    assert server["ttft_from_server"] == 2
    assert math.isnan(server["itl_mean"]) and server["server_itl_mean"] > 0
    assert server["tpot_mean"] > 0 and server["ttft_mean"] > 0
    # the engine alone counts its token events, text or not
    assert engine["output_tokens"] == 2 * 4 and engine["tpot_mean"] > 0 and engine["ttft_mean"] > 0
    # the markdown block names the commit and compares the two TPOTs
    block = out[out.index("### Serving: wide.ninfer, cpu") :]
    assert "commit c0ffee" in block and "--max-concurrency 2" in block
    row = next(line for line in block.splitlines() if line.startswith("| 2 |"))
    assert "n/a" not in row.split("|")[2] and "server (no text streamed)" in row


def test_a_level_without_any_token_is_one_clear_error():
    failed = [Sample(error="HTTP 400: model 'x' is not served") for _ in range(3)]
    with pytest.raises(BenchError, match=r"C=8, server: none of the 3 requests .*HTTP 400"):
        Level(8, failed, 1.0, "server").stats()


def test_gpu_server_gets_its_lanes_the_cuda_backend_and_a_bounded_context_pool():
    args = argparse.Namespace(backend="cuda", context_capacity=None, server_args=None)
    command = server_command(Path("27b.ninfer"), 8, 1024, None, server_args(args))
    assert command[:3] == [sys.executable, "-m", "ninfer_serve"]
    flags = dict(zip(command[4::2], command[5::2], strict=True))
    assert flags["--backend"] == "cuda" and flags["--max-concurrency"] == "8"
    assert flags["--context-capacity"] == CUDA_CONTEXT_CAPACITY
    # given flags win (they come last), and a CPU server keeps its default pool
    args.server_args = "--context-capacity 8GiB"
    assert server_args(args)[-2:] == ["--context-capacity", "8GiB"]
    cpu = argparse.Namespace(backend="cpu", context_capacity=None, server_args=None)
    assert "--context-capacity" not in server_args(cpu)


def test_cuda_paths_without_an_engine_never_import_cupy():
    """Without an engine baseline the benchmark process needs no CuPy: the GPU's name comes
    from nvidia-smi, and releasing memory touches CuPy only where an engine imported it."""
    assert "cupy" not in sys.modules
    assert release_device_memory("cuda") == ""
    assert device_name("cuda")  # a name, or "unknown GPU" on a machine without one
    assert "cupy" not in sys.modules


def test_turn_one_after_the_first_client_leaves_out_the_fastest():
    def sample(ttft: float, cached: int) -> object:
        return Sample(ttft=ttft, prompt_tokens=100, cached_tokens=cached, ok=True)

    # the first client the server took reads the shared prefix; the others resume from it
    turn_one = [sample(1.1, 90), sample(0.9, 0), sample(1.0, 90)]
    stats = agent_stats([turn_one, [sample(0.2, 95)]], duration=3.0, preemptions=0)
    assert stats["first_turn"]["ttft_mean"] == pytest.approx(1000.0)
    assert stats["first_turn_followers"]["ttft_mean"] == pytest.approx(1050.0)
    assert stats["cached_share"] == pytest.approx(275 / 400)
    table = agent_table({"on": stats})
    assert "| on | 1000.0 / " in table and " | 1050.0 / " in table
    # a failed request has no TTFT: it is neither the first client nor a follower
    failed = Sample(prompt_tokens=100, error="HTTP 500: boom")
    for at in range(len(turn_one) + 1):
        with_failure = [*turn_one[:at], failed, *turn_one[at:]]
        stats = agent_stats([with_failure, [sample(0.2, 95)]], duration=3.0, preemptions=0)
        assert stats["first_turn_followers"]["ttft_mean"] == pytest.approx(1050.0), at
