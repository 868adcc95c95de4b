"""Build the bundled default model: a tiny Qwen3.5-architecture checkpoint in HF format.

It has the real architecture (GDN and gated-attention layers, MTP weights), its own small
byte-level BPE tokenizer with the Qwen special tokens, and our chat template. It is trained
for a minute on a handful of chat exchanges so that the demo's replies are words rather than
noise; it knows nothing else. Deterministic: re-running gives the same files.

    python scripts/make_default_model.py [models/tiny-qwen3_5]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny_checkpoints import (  # noqa: E402
    COMMON,
    add_mtp,
    write_generation_config,
    write_tokenizer,
)

EXCHANGES = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi, who are you?", "I am a tiny demo model bundled with ninfer."),
    ("What is ninfer?", "ninfer runs .ninfer models on CPUs and NVIDIA GPUs."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("What is two plus two?", "Two plus two is four."),
    ("Name a color.", "Blue is a color."),
    ("Tell me a joke.", "Why did the tensor cross the bus? To reach the other GPU."),
    ("How is the weather?", "The weather is sunny and warm today."),
    ("Thank you!", "You are welcome!"),
]
TEMPLATE = ROOT / "ninfer_runtime" / "frontend" / "templates" / "qwen3_5_chatml.jinja"


def chat_text(user: str, answer: str) -> str:
    return (
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        f"<think>\n\n</think>\n\n{answer}<|im_end|>\n"
    )


def main(out: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    corpus = [chat_text(u, a) for u, a in EXCHANGES]
    write_tokenizer(out, COMMON["vocab_size"], corpus=corpus * 20)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    sequences = [torch.tensor(tok.encode(text).ids) for text in corpus]
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(intermediate_size=256, **COMMON))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    width = max(len(s) for s in sequences)
    batch = torch.full((len(sequences), width), tok.token_to_id("<|endoftext|>"))
    labels = torch.full_like(batch, -100)
    for i, s in enumerate(sequences):
        batch[i, : len(s)] = s
        labels[i, : len(s)] = s
    for step in range(150):
        loss = model(input_ids=batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    print(f"final loss {loss.item():.4f}")
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(out)
    add_mtp(out, model)
    write_generation_config(out)
    if TEMPLATE.exists():
        shutil.copy(TEMPLATE, out / "chat_template.jinja")
    config = json.loads((out / "config.json").read_text())
    print(
        f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir())} bytes), "
        f"{config['num_hidden_layers']} layers"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "models" / "tiny-qwen3_5")
