"""What the benchmark sends: random prompts of words the bundled tiny model knows, and the
agent workload's conversations (one shared system prompt and tool list, then each client's own
growing history, resent whole every turn)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: prompt vocabulary: words the bundled tiny model knows
SENTENCE = (
    "the capital of france is paris and the weather is sunny warm today tell me a joke why did "
    "the tensor cross the bus to reach other gpu hello how can i help you"
)
WORDS = SENTENCE.split()


def prompts(count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


def warmup_prompts(concurrency: int, words: int, seed: int) -> list[str]:
    """Prompts that share no text with the timed ones (a prefix cache warmed on those would
    shorten their prefill), one per lane so that every lane count's step is ready."""
    return prompts(concurrency, words, -1 - seed)


#: the tools every agent request lists (they are rendered into the shared system prompt)
AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    arg: {"type": kind, "description": f"the {arg.replace('_', ' ')}"}
                    for arg, kind in args.items()
                },
                "required": list(args)[:1],
            },
        },
    }
    for name, description, args in (
        ("get_weather", "Current weather for a city", {"city": "string", "unit": "string"}),
        ("search_web", "Search the web", {"query": "string", "count": "integer"}),
        ("read_file", "Read a workspace file", {"path": "string", "max_lines": "integer"}),
        ("run_shell", "Run a shell command", {"command": "string", "timeout_s": "number"}),
    )
]  # fmt: skip


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@dataclass
class Conversation:
    """One agent client: the shared system prompt, then its own turns, each resent whole."""

    system: str
    user_words: int
    rng: random.Random
    messages: list[dict] = field(default_factory=list)

    def next_turn(self) -> list[dict]:
        """The history plus a new short user message: what this turn sends."""
        if not self.messages:
            self.messages.append({"role": "system", "content": self.system})
        self.messages.append({"role": "user", "content": words(self.user_words, self.rng)})
        return list(self.messages)

    def reply(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


def agent_conversations(
    clients: int, system_words: int, user_words: int, seed: int
) -> list[Conversation]:
    system = "You are a helpful agent. " + words(system_words, random.Random(seed))
    return [
        Conversation(system, user_words, random.Random(seed * 1000 + c + 1)) for c in range(clients)
    ]
