"""Build the bundled default model: a tiny Qwen3.5-architecture checkpoint in HF format.

It has the real architecture (GDN and gated-attention layers, an MTP head), its own small
byte-level BPE tokenizer with the Qwen special tokens, and our chat template. It is trained
for a minute on a handful of chat exchanges so that the demo's replies are words rather than
noise; it knows nothing else. Then, with the main model frozen as saved (bf16), its MTP head
is trained on the same exchanges to predict the token after next, so that speculative
decoding on it accepts drafts. Deterministic: re-running gives the same files.

    python scripts/make_default_model.py [models/tiny-qwen3_5]
    python scripts/make_default_model.py --mtp-only [models/tiny-qwen3_5]

Float rounding in the main model's training differs between CPUs and torch builds, and 150
steps amplify it, so the main weights are reproducible on one machine but not across them.
``--mtp-only`` retrains just the MTP head on the checkpoint already in the directory, leaving
its main weights (and so the model's answers) as they are; that is how the checked-in head was
made.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

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
MTP_SEED, MTP_STEPS, MTP_LR = 1, 300, 3e-3


def chat_text(user: str, answer: str) -> str:
    return (
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        f"<think>\n\n</think>\n\n{answer}<|im_end|>\n"
    )


class MtpHead(torch.nn.Module):
    """The MTP block (architecture notes 5.8), its parameters named as in the checkpoint
    under ``mtp.``: from the main model's final hidden state at t and the embedding of token
    t+1 it makes the hidden state that the main model's ``lm_head`` turns into token t+2."""

    def __init__(self, config) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
        )

        super().__init__()
        width, eps = config.hidden_size, config.rms_norm_eps
        self.fc = torch.nn.Linear(2 * width, width, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(width, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(width, eps=eps)
        full = config.layer_types.index("full_attention")
        self.layers = torch.nn.ModuleList([Qwen3_5DecoderLayer(config, full)])
        self.norm = Qwen3_5RMSNorm(width, eps=eps)

    def forward(self, main, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Logits for the tokens after ``next_ids`` [B, T]: row t pairs ``hidden[:, t]`` (the
        main model's, after its final norm) with ``next_ids[:, t]``, at position t + 1."""
        embeds = main.model.embed_tokens(next_ids)
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        x = self.fc(x)
        positions = torch.arange(1, next_ids.shape[1] + 1)[None]
        x = self.layers[0](x, main.model.rotary_emb(x, positions))  # causal: no mask given
        return main.lm_head(self.norm(x))


def load_main(directory: Path):
    """The saved main model in float32 (its bf16 values), frozen; ``mtp.*`` is not loaded."""
    from transformers import Qwen3_5ForCausalLM

    main = Qwen3_5ForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return main.requires_grad_(False)


def load_mtp_head(directory: Path, main) -> MtpHead:
    """The checkpoint's ``mtp.*`` tensors as an ``MtpHead`` in float32."""
    tensors = load_file(directory / "model.safetensors")
    head = MtpHead(main.config)
    head.load_state_dict({k[4:]: v.float() for k, v in tensors.items() if k.startswith("mtp.")})
    return head


def training_batch(tok, sequences: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids padded with <|endoftext|>, and labels with -100 on the padding."""
    width = max(len(s) for s in sequences)
    batch = torch.full((len(sequences), width), tok.token_to_id("<|endoftext|>"))
    labels = torch.full_like(batch, -100)
    for i, s in enumerate(sequences):
        batch[i, : len(s)] = s
        labels[i, : len(s)] = s
    return batch, labels


def encode_exchanges(directory: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The exchanges as a padded batch (``training_batch``), with the tokenizer in ``directory``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    sequences = [torch.tensor(tok.encode(chat_text(u, a)).ids) for u, a in EXCHANGES]
    return training_batch(tok, sequences)


def mtp_examples(main, directory: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row t of every exchange: the main model's hidden state t and token t+1 as inputs, token
    t+2 as the target (-100 on padding)."""
    batch, labels = encode_exchanges(directory)
    with torch.no_grad():
        hidden = main.model(input_ids=batch).last_hidden_state
    return hidden[:, :-2], batch[:, 1:-1], labels[:, 2:]


def train_mtp(out: Path) -> None:
    """Train the MTP head of the checkpoint in ``out`` on the exchanges; the main model (its
    embedding and ``lm_head`` too) stays frozen. Starts from ``add_mtp``'s initialisation."""
    torch.manual_seed(MTP_SEED)
    torch.set_num_threads(2)
    main = load_main(out)
    add_mtp(out, main)
    head = load_mtp_head(out, main)
    hidden, next_ids, targets = mtp_examples(main, out)
    optimizer = torch.optim.AdamW(head.parameters(), lr=MTP_LR, weight_decay=0.0)
    for step in range(MTP_STEPS):
        logits = head(main, hidden, next_ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"mtp step {step} loss {loss.item():.3f}")
    print(f"mtp final loss {loss.item():.4f}")
    tensors = load_file(out / "model.safetensors")
    head = head.to(torch.bfloat16)
    tensors |= {f"mtp.{name}": value.contiguous() for name, value in head.state_dict().items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with torch.no_grad():
        predicted = head.float()(main, hidden, next_ids).argmax(-1)
    valid = targets != -100
    accuracy = (predicted == targets)[valid].float().mean().item()
    print(f"mtp top-1 accuracy on token t+2 {accuracy:.3f} (bf16 head as saved)")


def main(out: Path) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    corpus = [chat_text(u, a) for u, a in EXCHANGES]
    write_tokenizer(out, COMMON["vocab_size"], corpus=corpus * 20)
    batch, labels = encode_exchanges(out)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(intermediate_size=256, **COMMON))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
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
    write_generation_config(out)
    if TEMPLATE.exists():
        shutil.copy(TEMPLATE, out / "chat_template.jinja")
    train_mtp(out)
    config = json.loads((out / "config.json").read_text())
    print(
        f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir())} bytes), "
        f"{config['num_hidden_layers']} layers"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "models" / "tiny-qwen3_5")
    parser.add_argument(
        "--mtp-only",
        action="store_true",
        help="retrain only the MTP head of the checkpoint in OUT; its main weights stay",
    )
    args = parser.parse_args()
    if args.mtp_only:
        train_mtp(args.out)
    else:
        main(args.out)
