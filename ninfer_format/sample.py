"""``ninfer-sample``: write a small, complete Qwen3.5-architecture artifact with random weights.

It exercises every CORE format (plus the NF4 extension), packed parents bound by parts, an MTP
component, the four frontend resources and an NVFP4 use with its activation divisor, so a
fresh checkout has a real artifact to inspect. The weights are random: it is a format sample,
not a language model.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from .binders.qwen3_5 import ParamSpec, expected_parameters
from .codecs import codec_for
from .errors import ArtifactError, TargetExists
from .writer import ArtifactWriter, ResourceSpec, TensorSpec

CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 64,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "layer_types": ["linear_attention", "full_attention"],
    "rope_parameters": {
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2],
    },
}

LAYOUT = {
    "bf16": "contiguous_le_v1",
    "fp32": "contiguous_le_v1",
    "int32": "contiguous_le_v1",
    "nvfp4": "block_scale_k16_m128x4_v1",
    "fp8_e4m3fn_row_bf16": "row_scale_v1",
}

# (suffix of the logical name, format); the first match wins; packed groups share a parent.
PLAN = [
    ("text/token_embedding", "q8_g32_fp16"),
    ("text/output_head", "q6_g64_fp16"),
    ("attention/output", "nvfp4"),
    ("gdn/query", "nf4_g64_fp16"),
    ("gdn/key", "nf4_g64_fp16"),
    ("gdn/value", "fp8_e4m3fn_row_bf16"),
    ("gdn/z", "fp8_e4m3fn_row_bf16"),
    ("gdn/output", "q5_g64_fp16"),
    ("mlp/gate", "nvfp4"),
    ("mlp/up", "nvfp4"),
    ("mlp/down", "fp8_e4m3fn_row_bf16"),
    ("mtp/input_projection", "q8_g32_fp16"),
    ("attention/query", "q4_g64_fp16"),
    ("attention/key", "q4_g64_fp16"),
    ("attention/gate", "q5_g64_fp16"),
    ("attention/value", "q5_g64_fp16"),
]
GROUPS = [
    ("attention/query", "attention/key"),
    ("attention/gate", "attention/value"),
    ("gdn/query", "gdn/key"),
    ("gdn/value", "gdn/z"),
    ("mlp/gate", "mlp/up"),
]


@dataclass
class Parent:
    spec: TensorSpec
    members: list[ParamSpec]


def _format_of(p: ParamSpec) -> str:
    if p.role.value == "fp32 vector":
        return "fp32"
    if p.role.value != "matrix":
        return "bf16"
    return next((fmt for suffix, fmt in PLAN if p.name.endswith(suffix)), "bf16")


def _parents(params: list[ParamSpec]) -> list[Parent]:
    by_name = {p.name: p for p in params}
    parents: list[Parent] = []
    done: set[str] = set()
    for p in params:
        if p.name in done:
            continue
        members = [p]
        for group in GROUPS:
            if p.name.endswith(group[0]):
                base = p.name[: -len(group[0])]
                members = [by_name[base + g] for g in group]
        done.update(m.name for m in members)
        fmt = _format_of(p)
        rows = sum(m.shape[0] for m in members)
        shape = (rows, *p.shape[1:]) if len(members) > 1 else p.shape
        oid = f"weight/{len(parents):06d}"
        parents.append(
            Parent(TensorSpec(oid, shape, fmt, LAYOUT.get(fmt, "row_split_k128_v1")), members)
        )
    return parents


def _values(rng: np.random.Generator, parent: Parent) -> np.ndarray:
    spec = parent.spec
    role = parent.members[0].role.value
    if role == "fp32 vector":
        return rng.uniform(-1.0, 0.5, spec.shape).astype(np.float32)
    if role == "vector":
        return rng.normal(0.0, 0.1, spec.shape).astype(np.float32)
    scale = 1.0 / np.sqrt(spec.shape[-1])
    return (rng.standard_normal(spec.shape) * scale).astype(np.float32)


def _resources() -> dict[str, bytes]:
    vocab = {f"<t{i}>": i for i in range(CONFIG["vocab_size"] - 3)}
    vocab |= {"<|endoftext|>": 1021, "<|im_start|>": 1022, "<|im_end|>": 1023}
    tokenizer = {
        "version": "1.0",
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<t0>"},
    }
    return {
        "tokenizer.json": json.dumps(tokenizer).encode(),
        "tokenizer_config.json": json.dumps({"eos_token": "<|im_end|>"}).encode(),
        "chat_template.jinja": b"{% for m in messages %}<|im_start|>{{ m.role }}\n"
        b"{{ m.content }}<|im_end|>\n{% endfor %}",
        "generation_config.json": json.dumps({"eos_token_id": [1023, 1021]}).encode(),
    }


def write_sample(path: Path, *, overwrite: bool = False, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    params = expected_parameters(CONFIG, components=("text", "mtp"))
    parents = _parents(params)
    resources = _resources()
    specs: list[TensorSpec | ResourceSpec] = [
        ResourceSpec(f"resource/text/{role}", "raw_bytes_v1", len(data))
        for role, data in resources.items()
    ]
    specs += [p.spec for p in parents]
    bindings: dict[str, dict] = {}
    uses: list[dict] = []
    divisors: list[str] = []
    for parent in parents:
        start = 0
        for m in parent.members:
            n = int(np.prod(m.shape))
            if len(parent.members) == 1:
                bindings[m.name] = {"object": parent.spec.id}
            else:
                bindings[m.name] = {
                    "parts": [{"object": parent.spec.id, "range": [start, start + n]}]
                }
            start += n
            for site in m.inputs:
                use: dict = {"parameter": m.name, "input": site, "activation_policy": "A16Only"}
                if parent.spec.format == "nvfp4":
                    aux = f"auxiliary/{len(divisors):06d}"
                    divisors.append(aux)
                    use["activation_policy"] = "AllowA4"
                    use["auxiliaries"] = {"activation_input_divisor": {"object": aux}}
                uses.append(use)
    specs += [TensorSpec(a, (), "fp32", "contiguous_le_v1") for a in divisors]
    components = {
        "text": {
            "config": CONFIG,
            "resources": {role: f"resource/text/{role}" for role in resources},
        },
        "mtp": {"config": {"architectures": ["Qwen3_5MTP"]}, "target": "text"},
    }
    with ArtifactWriter(
        path,
        components=components,
        objects=specs,
        bindings=bindings,
        uses=uses,
        metadata={"name": "ninfer-sample"},
        provenance={"writer": "ninfer-sample", "seed": seed},
        overwrite=overwrite,
    ) as w:
        for role, data in resources.items():
            w.write(f"resource/text/{role}", data)
        for parent in parents:
            codec = codec_for(parent.spec.format, parent.spec.layout)
            w.write(parent.spec.id, codec.encode(_values(rng, parent)))
        for aux in divisors:
            w.write(aux, np.array(448.0 * 6 / 4.0, np.float32))


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Example: ninfer-sample out/sample.ninfer --force",
)
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace an existing artifact.")
@click.option("--seed", default=0, show_default=True, help="Random seed of the weights.")
def main(path: Path, force: bool, seed: int) -> None:
    """Write a small sample .ninfer v3 artifact (random weights) to PATH."""
    try:
        write_sample(path, overwrite=force, seed=seed)
    except TargetExists:  # its own text names the library's overwrite=True, not the flag
        click.echo(f"ninfer-sample: {path}: already exists; add --force to replace it", err=True)
        sys.exit(1)
    except ArtifactError as exc:
        for p in exc.problems:
            click.echo(f"ninfer-sample: {p}", err=True)
        sys.exit(1)
    click.echo(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
