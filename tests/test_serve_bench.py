"""The agent workload of benchmarks/serve_bench.py builds what a chat client resends: one shared
system prompt, then each client's own growing history (no server is started here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "benchmarks/serve_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_agent_conversations_resend_their_growing_history():
    bench = load_bench()
    conversations = bench.agent_conversations(clients=3, system_words=50, user_words=6, seed=1)
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
    bench = load_bench()
    names = [tool["function"]["name"] for tool in bench.AGENT_TOOLS]
    assert len(names) == len(set(names)) >= 3
    for tool in bench.AGENT_TOOLS:
        assert tool["type"] == "function"
        parameters = tool["function"]["parameters"]
        assert parameters["type"] == "object" and parameters["properties"]
        assert set(parameters["required"]) <= set(parameters["properties"])
