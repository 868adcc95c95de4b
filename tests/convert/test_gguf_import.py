"""gguf_import: ggml blocks copied verbatim from a GGUF file (recipe qwen3_8_27b_gguf).

The tiny GGUF is written here from the tiny HF checkpoint the way llama.cpp's converter lays a
``qwen35`` model out (notes 4.3): renamed tensors, norms stored as ``1 + w``, GDN value heads
tiled (file head ``r * nk + k`` = grouped head ``k * ratio + r``), ``ssm_a = -exp(A_log)``,
``ssm_conv1d`` as ``[channels, taps]``. Projections are Q8_0/Q4_0 from ``gguf.quants.quantize``,
``ffn_down`` raw blocks (Q4_K, Q5_K, Q6_K, IQ2_XXS by layer: random bytes, small finite
``d`` and ``dmin``), the head F32.
``gguf.quants.dequantize`` of the same blocks is the value oracle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from safetensors.torch import load_file

from ninfer_convert.errors import SourceError
from ninfer_convert.pipeline import convert
from ninfer_convert.verify import verify_against_source
from ninfer_format import Artifact
from ninfer_format.numeric import bf16_to_f32, f32_to_bf16
from ninfer_format.verify import verify

NK, RATIO, DK, DV, HEADS, HEAD_DIM = 2, 2, 32, 64, 2, 64  # tiny_checkpoints geometry
KG = NK * DK
#: bytes of a block, where its float16 scales lie and how many (d, and Q4_K's and Q5_K's dmin)
RANDOM_BLOCKS = {
    T.Q4_K: (144, 0, 2),
    T.Q5_K: (176, 0, 2),
    T.Q6_K: (210, 208, 1),
    T.IQ2_XXS: (66, 0, 1),
}
#: the random ``ffn_down`` blocks of layer i: ``RANDOM_DOWN[i % 4]``
RANDOM_DOWN = tuple(RANDOM_BLOCKS)


def grouped_head(t: int) -> int:
    """The checkpoint's (grouped) value head stored at tiled position ``t``."""
    return (t % NK) * RATIO + t // NK


def tile_rows(x: np.ndarray, per_head: int) -> np.ndarray:
    heads = x.reshape(NK * RATIO, per_head, *x.shape[1:])
    return np.concatenate([heads[grouped_head(t)] for t in range(NK * RATIO)])


def tiled_columns() -> np.ndarray:
    return np.array([grouped_head(c // DV) * DV + c % DV for c in range(NK * RATIO * DV)])


def raw_blocks(qtype: T, rows: int, k: int, seed: int) -> np.ndarray:
    """Random ``qtype`` blocks of a ``[rows, k]`` matrix, their scales small and finite."""
    size, at, scales = RANDOM_BLOCKS[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * k // 256, size), dtype=np.uint8)
    values = rng.uniform(0.0005, 0.002, (blocks.shape[0], scales)).astype(np.float16)
    blocks[:, at : at + 2 * scales] = values.view(np.uint8)
    return blocks.reshape(rows, -1)


class GgufBuilder:
    """Collects (name, values or blocks, type) and writes the file; keeps blocks for the oracle."""

    def __init__(self, only: T | None = None, types: dict[str, T] | None = None) -> None:
        self.tensors: dict[str, tuple[np.ndarray, T]] = {}
        self.only = only  # one quantization type for every quantized tensor
        self.types = types or {}  # a tensor's own type, over both
        self.path: Path | None = None  # the file written (a split's first part)

    def float32(self, name: str, x: np.ndarray) -> None:
        self.tensors[name] = (np.ascontiguousarray(x, dtype=np.float32), T.F32)

    def quantized(self, name: str, x: np.ndarray, qtype: T) -> None:
        qtype = self.types.get(name) or self.only or qtype
        self.tensors[name] = (gguf.quants.quantize(x.astype(np.float32), qtype), qtype)

    def raw(self, name: str, blocks: np.ndarray, qtype: T) -> None:
        self.tensors[name] = (blocks, qtype)

    def values(self, name: str) -> np.ndarray:
        data, qtype = self.tensors[name]
        return data if qtype == T.F32 else gguf.quants.dequantize(data, qtype)

    def write(
        self,
        path: Path,
        header: dict[str, int],
        extra: dict[str, tuple[str, object]],
        split: int = 0,
        arch: str = "qwen35",
    ) -> Path:
        """``split``: at most this many tensors a part (gguf-py names the parts
        ``NAME-0000i-of-0000n.gguf``; the first one is returned)."""
        writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split)
        for key, value in header.items():
            writer.add_uint32(f"{arch}.{key}", value)
        for key, (kind, value) in extra.items():
            if kind == "strings":
                writer.add_array(key, list(value))  # type: ignore[call-overload]
            elif kind == "ints":
                writer.add_array(key, [int(v) for v in value])  # type: ignore[union-attr]
            else:
                getattr(writer, f"add_{kind}")(key, value)
        for name, (data, qtype) in self.tensors.items():
            writer.add_tensor(name, data, raw_dtype=None if qtype == T.F32 else qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return writer.format_shard_names(path)[0]


def _layer(b: GgufBuilder, sd: dict, hf: str, blk: str, index: int, faithful: bool) -> None:
    """One HF layer (``hf`` prefix) as GGUF tensors ``blk`` (``faithful``: ``ffn_down`` too
    quantized from the checkpoint's weights, instead of random blocks)."""
    w = {k[len(hf) :]: v.float().numpy() for k, v in sd.items() if k.startswith(hf)}
    b.float32(blk + "attn_norm.weight", w["input_layernorm.weight"] + 1)
    b.float32(blk + "post_attention_norm.weight", w["post_attention_layernorm.weight"] + 1)
    if "mlp.gate.weight" in w:  # MoE: llama.cpp's expert banks, router and shared expert
        experts = sorted({int(k.split(".")[2]) for k in w if k.startswith("mlp.experts.")})
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            bank = np.stack([w[f"mlp.experts.{e}.{theirs}.weight"] for e in experts])
            b.quantized(blk + f"ffn_{ours}_exps.weight", bank, T.Q8_0)
            b.quantized(blk + f"ffn_{ours}_shexp.weight", w[f"mlp.shared_expert.{theirs}.weight"],
                        T.Q8_0)  # fmt: skip
        b.float32(blk + "ffn_gate_inp.weight", w["mlp.gate.weight"])
        b.float32(blk + "ffn_gate_inp_shexp.weight", w["mlp.shared_expert_gate.weight"][0])
    else:
        b.quantized(blk + "ffn_gate.weight", w["mlp.gate_proj.weight"], T.Q4_0)
        up = T.Q8_0 if index == 2 else T.Q4_0
        b.quantized(blk + "ffn_up.weight", w["mlp.up_proj.weight"], up)
        if faithful:
            b.quantized(blk + "ffn_down.weight", w["mlp.down_proj.weight"], T.Q8_0)
        else:
            qtype = RANDOM_DOWN[index % len(RANDOM_DOWN)]
            b.raw(blk + "ffn_down.weight", raw_blocks(qtype, 128, 256, seed=index), qtype)
    if "self_attn.q_proj.weight" in w:
        for ours, theirs, qtype in (("q", "q", T.Q8_0), ("k", "k", T.Q8_0), ("v", "v", T.Q8_0)):
            b.quantized(blk + f"attn_{ours}.weight", w[f"self_attn.{theirs}_proj.weight"], qtype)
        b.quantized(blk + "attn_output.weight", w["self_attn.o_proj.weight"], T.Q8_0)
        b.float32(blk + "attn_q_norm.weight", w["self_attn.q_norm.weight"] + 1)
        b.float32(blk + "attn_k_norm.weight", w["self_attn.k_norm.weight"] + 1)
        return
    qkv = w["linear_attn.in_proj_qkv.weight"]
    qkv = np.concatenate([qkv[: 2 * KG], tile_rows(qkv[2 * KG :], DV)])
    b.quantized(blk + "attn_qkv.weight", qkv, T.Q4_0)
    b.quantized(blk + "attn_gate.weight", tile_rows(w["linear_attn.in_proj_z.weight"], DV), T.Q8_0)
    b.quantized(blk + "ssm_alpha.weight", tile_rows(w["linear_attn.in_proj_a.weight"], 1), T.Q8_0)
    b.float32(blk + "ssm_beta.weight", tile_rows(w["linear_attn.in_proj_b.weight"], 1))
    b.float32(blk + "ssm_a", tile_rows(-np.exp(w["linear_attn.A_log"]), 1))
    b.float32(blk + "ssm_dt.bias", tile_rows(w["linear_attn.dt_bias"], 1))
    conv = w["linear_attn.conv1d.weight"][:, 0, :]
    b.float32(
        blk + "ssm_conv1d.weight", np.concatenate([conv[: 2 * KG], tile_rows(conv[2 * KG :], DV)])
    )
    b.float32(blk + "ssm_norm.weight", w["linear_attn.norm.weight"])
    b.quantized(
        blk + "ssm_out.weight", w["linear_attn.out_proj.weight"][:, tiled_columns()], T.Q8_0
    )


def build_gguf(
    hf_dir: Path,
    path: Path,
    *,
    faithful: bool = False,
    extra: dict[str, tuple[str, object]] | None = None,
    split: int = 0,
    types: dict[str, T] | None = None,
    **header_changes: int,
) -> GgufBuilder:
    """The tiny GGUF; ``faithful``: every projection Q8_0 from the checkpoint's own weights
    (a file that answers as the checkpoint does, to within Q8_0's error); ``extra``: more
    metadata, full key -> (kind, value) with kind uint32, float32, string, strings or ints;
    ``types``: the type of named quantized tensors, over the others' choice."""
    sd = load_file(hf_dir / "model.safetensors")
    config = json.loads((hf_dir / "config.json").read_text())
    layers = config["num_hidden_layers"]
    b = GgufBuilder(T.Q8_0 if faithful else None, types)
    b.quantized("token_embd.weight", sd["model.embed_tokens.weight"].numpy(), T.Q8_0)
    b.float32("output.weight", sd["lm_head.weight"].numpy())
    b.float32("output_norm.weight", sd["model.norm.weight"].numpy() + 1)
    for i in range(layers):
        _layer(b, sd, f"model.layers.{i}.", f"blk.{i}.", i, faithful)
    mtp = f"blk.{layers}."
    _layer(b, sd, "mtp.layers.0.", mtp, layers, faithful)
    b.quantized(mtp + "nextn.eh_proj.weight", sd["mtp.fc.weight"].numpy(), T.Q8_0)
    for ours, theirs in (("enorm", "pre_fc_norm_embedding"), ("hnorm", "pre_fc_norm_hidden")):
        b.float32(mtp + f"nextn.{ours}.weight", sd[f"mtp.{theirs}.weight"].numpy() + 1)
    b.float32(mtp + "nextn.shared_head_norm.weight", sd["mtp.norm.weight"].numpy() + 1)
    moe = config["model_type"] == "qwen3_5_moe_text"
    widths = {
        "expert_count": config.get("num_experts"),
        "expert_used_count": config.get("num_experts_per_tok"),
        "expert_feed_forward_length": config.get("moe_intermediate_size"),
        "expert_shared_feed_forward_length": config.get("shared_expert_intermediate_size"),
    }
    header = {
        "embedding_length": 128,
        **(widths if moe else {"feed_forward_length": 256}),
        "attention.head_count": HEADS,
        "attention.head_count_kv": 1,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "ssm.conv_kernel": 4,
        "ssm.state_size": DK,
        "ssm.group_count": NK,
        "ssm.time_step_rank": NK * RATIO,
        "ssm.inner_size": NK * RATIO * DV,
        "full_attention_interval": 2,
        "block_count": layers + 1,
        **{k.replace("__", "."): v for k, v in header_changes.items()},
    }
    arch = "qwen35moe" if moe else "qwen35"
    extra = {k.replace("qwen35.", f"{arch}.", 1): v for k, v in (extra or {}).items()}
    b.path = b.write(path, header, extra, split, arch)
    return b


def config_only(hf_dir: Path, out: Path) -> Path:
    """The base directory a GGUF user has: config.json and the tokenizer files, no weights."""
    out.mkdir()
    for name in (
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        shutil.copy(hf_dir / name, out / name)
    return out


def bf16(x: np.ndarray) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16(np.asarray(x, dtype=np.float32)))


@pytest.fixture(scope="module")
def gguf_file(tiny_dense, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    builder = build_gguf(tiny_dense, root / "tiny.gguf")
    return root / "tiny.gguf", builder, config_only(tiny_dense, root / "base")


def test_qwen3_8_27b_gguf_copies_blocks(tmp_path, tiny_dense, gguf_file):
    path, b, base = gguf_file
    out = tmp_path / "g.ninfer"
    specs = {"base": str(base), "gguf": str(path)}
    report = convert("qwen3_8_27b_gguf", specs, out)
    with Artifact.open(out) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert not art.binder_report.warnings, art.binder_report.warnings
        checked = verify(art, strict=True)
        assert checked.ok and not checked.warnings, checked.errors + checked.warnings
        _check_blocks(art, b)
        _check_values(art, load_file(tiny_dense / "model.safetensors"))
        assert {"text", "mtp"} == set(art.components)
    assert verify_against_source(out, specs)["errors"] == []
    imported = [p for p in report.parameters if p.method == "gguf_import"]
    assert imported and all(p.rmse == 0 for p in imported)


def _formats(art: Artifact, name: str) -> tuple[str, str]:
    b = art.bindings[name]
    oid = b.object if hasattr(b, "object") else b.parts[0].object
    return oid, art.objects[oid].format


def _check_blocks(art: Artifact, b: GgufBuilder) -> None:
    """Block-copied parameters decode to exactly gguf-py's values of the same rows."""
    q = b.values("blk.1.attn_q.weight").reshape(HEADS, 2, HEAD_DIM, -1)
    np.testing.assert_array_equal(
        art.parameter("text/layers/1/attention/query"), q[:, 0].reshape(-1, 128)
    )
    np.testing.assert_array_equal(
        art.parameter("text/layers/1/attention/gate"), q[:, 1].reshape(-1, 128)
    )
    qkv = b.values("blk.0.attn_qkv.weight")
    value = qkv[2 * KG :].reshape(NK * RATIO, DV, -1)
    grouped = np.concatenate(
        [value[next(t for t in range(4) if grouped_head(t) == h)] for h in range(4)]
    )
    np.testing.assert_array_equal(art.parameter("text/layers/0/gdn/value"), grouped)
    np.testing.assert_array_equal(art.parameter("text/layers/0/gdn/key"), qkv[KG : 2 * KG])
    np.testing.assert_array_equal(
        art.parameter("text/layers/2/mlp/down"), b.values("blk.2.ffn_down.weight")
    )
    np.testing.assert_array_equal(
        art.parameter("mtp/input_projection"), b.values("blk.4.nextn.eh_proj.weight")
    )
    np.testing.assert_array_equal(
        art.parameter("text/token_embedding"), b.values("token_embd.weight")
    )
    for i in range(4):
        want = f"gguf_{RANDOM_DOWN[i].name.lower()}"
        assert _formats(art, f"text/layers/{i}/mlp/down")[1] == want
    assert _formats(art, "text/layers/0/gdn/query")[1] == "gguf_q4_0"
    # gate|up share a parent where both are Q4_0 (layer 0), not where the types differ (layer 2)
    assert _formats(art, "text/layers/0/mlp/gate")[0] == _formats(art, "text/layers/0/mlp/up")[0]
    assert _formats(art, "text/layers/2/mlp/gate")[0] != _formats(art, "text/layers/2/mlp/up")[0]
    # ssm_out keeps its tiled columns; its Use says where each column's input comes from
    np.testing.assert_array_equal(
        art.parameter("text/layers/0/gdn/output"), b.values("blk.0.ssm_out.weight")
    )
    (use,) = [u for u in art.uses if u.parameter == "text/layers/0/gdn/output"]
    assert use.activation_policy == "AllowA8"
    columns = art.tensor(use.auxiliaries["input_columns"].object)
    assert columns.dtype == np.int32
    np.testing.assert_array_equal(columns, tiled_columns())


def _check_values(art: Artifact, sd: dict) -> None:
    """Parameters read as values match the HF checkpoint (norm shift, untiling, A_log)."""

    def hf(name: str) -> np.ndarray:
        return sd[name].float().numpy()

    def close(actual: np.ndarray, expected: np.ndarray, **tolerance: float) -> None:
        """Values rounded to bf16 after an f32 shift: within one bf16 step."""
        np.testing.assert_allclose(actual, expected, **{"rtol": 2**-8, "atol": 1e-6, **tolerance})

    close(art.parameter("text/final_norm"), bf16(hf("model.norm.weight")))
    close(
        art.parameter("text/layers/1/attention/query_norm"),
        bf16(hf("model.layers.1.self_attn.q_norm.weight")),
    )
    close(art.parameter("mtp/embedding_norm"), bf16(hf("mtp.pre_fc_norm_embedding.weight")))
    p = "model.layers.0.linear_attn."
    np.testing.assert_array_equal(
        art.parameter("text/layers/0/gdn/norm"), bf16(hf(p + "norm.weight"))
    )
    np.testing.assert_array_equal(art.parameter("text/layers/0/gdn/dt_bias"), hf(p + "dt_bias"))
    close(art.parameter("text/layers/0/gdn/a_log"), hf(p + "A_log"), rtol=1e-5)
    conv = hf(p + "conv1d.weight")[:, 0, :].T
    np.testing.assert_array_equal(art.parameter("text/layers/0/gdn/convolution"), bf16(conv))
    np.testing.assert_array_equal(
        art.parameter("text/layers/0/gdn/b_projection"), bf16(hf(p + "in_proj_b.weight"))
    )
    close(art.parameter("text/layers/0/gdn/a_projection"), hf(p + "in_proj_a.weight"), atol=0.02)
    assert (
        _formats(art, "text/output_head")[1] == "bf16"
    )  # an F32 matrix has no blocks to keep: cast
    np.testing.assert_array_equal(art.parameter("text/output_head"), bf16(hf("lm_head.weight")))
    z = art.parameter("text/layers/0/gdn/z")
    close(z, hf(p + "in_proj_z.weight"), atol=0.02)


def test_types_without_a_format_come_in_as_bf16(tmp_path, tiny_dense):
    """Q4_1, Q5_1 and MXFP4 have no gguf_* format in the registry: their tensors come in as
    bf16 of gguf's dequantized values (MXFP4 exactly, the others rounded once); the rest keep
    their blocks."""
    types = {
        "blk.0.ffn_gate.weight": T.Q4_1,
        "blk.1.ffn_up.weight": T.Q5_1,
        "blk.3.ffn_gate.weight": T.MXFP4,
    }
    b = build_gguf(tiny_dense, tmp_path / "t.gguf", faithful=True, types=types)
    out = tmp_path / "g.ninfer"
    specs = {"base": str(config_only(tiny_dense, tmp_path / "base")), "gguf": str(b.path)}
    report = convert("qwen3_8_27b_gguf", specs, out)
    logical = {
        "blk.0.ffn_gate.weight": "text/layers/0/mlp/gate",
        "blk.1.ffn_up.weight": "text/layers/1/mlp/up",
        "blk.3.ffn_gate.weight": "text/layers/3/mlp/gate",
    }
    with Artifact.open(out) as art:
        assert verify(art, strict=True).ok
        for name, param in logical.items():
            assert _formats(art, param)[1] == "bf16"
            np.testing.assert_array_equal(art.parameter(param), bf16(b.values(name)))
        mxfp4 = b.values("blk.3.ffn_gate.weight")
        np.testing.assert_array_equal(art.parameter("text/layers/3/mlp/gate"), mxfp4)
        assert _formats(art, "text/layers/0/mlp/up")[1] == "gguf_q8_0"
    methods = {p.name: p.method for p in report.parameters}
    assert {methods[param] for param in logical.values()} == {"cast"}
    assert verify_against_source(out, specs)["errors"] == []


def test_header_must_match_the_config(tmp_path, tiny_dense, gguf_file):
    path = tmp_path / "bad.gguf"
    build_gguf(tiny_dense, path, embedding_length=256, ssm__group_count=4)
    specs = {"base": str(gguf_file[2]), "gguf": str(path)}
    with pytest.raises(SourceError, match=r"qwen35\.embedding_length = 256 .*implies 128"):
        convert("qwen3_8_27b_gguf", specs, tmp_path / "x.ninfer")
    assert not list(tmp_path.glob("x.ninfer*"))


def test_gguf_source_is_required(tmp_path, gguf_file):
    with pytest.raises(SourceError, match="--source gguf="):
        convert("qwen3_8_27b_gguf", {"base": str(gguf_file[2])}, tmp_path / "x.ninfer")
