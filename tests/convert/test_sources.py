"""Checkpoint sources: HF directories (single, sharded, unindexed, VLM), the Hub cache, GGUF.

Everything runs offline. The HF fixtures come from a tiny random Qwen3.5 model saved by
transformers itself (so the layouts are the real ones), built once per module; GGUF fixtures
are written with gguf-py's writer, plus a hand-built file for Q2_0, which gguf-py cannot write.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
gguf = pytest.importorskip("gguf")

import xxhash  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

from ninfer_convert.errors import ConvertError, SourceError  # noqa: E402
from ninfer_convert.sources import (  # noqa: E402
    GgufSource,
    HFDirectorySource,
    TensorSource,
    open_hub,
    open_source,
    parse_repo_spec,
)

TEXT_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    vocab_size=256,
    tie_word_embeddings=False,
)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny random Qwen3.5 dense model saved whole and sharded; its state dict."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**TEXT_CONFIG))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # default init leaves norms at 0/1: make every tensor distinctive
    single = tmp_path_factory.mktemp("single")
    sharded = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="50KB")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"single": single, "sharded": sharded, "state": state}


def _copy_config(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")


# -- HF directory: layouts --------------------------------------------------------------------


def test_single_file_checkpoint(tiny: dict[str, Any]) -> None:
    source = HFDirectorySource(tiny["single"])
    state = tiny["state"]
    assert isinstance(source, TensorSource)
    assert source.keys() == sorted(state)
    assert source.text_config is source.config
    assert source.text_config["model_type"] == "qwen3_5_text"
    assert source.vision_config is None
    assert source.quantization is None and source.quant_method is None
    assert source.weight_files == ["model.safetensors"]
    for name, tensor in state.items():
        assert source.shape(name) == tuple(tensor.shape)
        assert source.dtype(name) == "F32"
        loaded = source.load(name)
        assert loaded.dtype == tensor.dtype and torch.equal(loaded, tensor), name
    assert source.shape("model.layers.0.linear_attn.in_proj_qkv.weight") == (128, 64)
    assert source.shape("model.layers.1.self_attn.q_proj.weight") == (128, 64)
    assert "generation_config.json" in source.resources
    assert "tokenizer.json" not in source.resources


def test_sharded_checkpoint_with_index(tiny: dict[str, Any]) -> None:
    source = HFDirectorySource(tiny["sharded"])
    assert (tiny["sharded"] / "model.safetensors.index.json").is_file()
    assert len(source.weight_files) > 2
    assert source.keys() == sorted(tiny["state"])
    for name, tensor in tiny["state"].items():
        assert torch.equal(source.load(name), tensor), name
    index = json.loads((tiny["sharded"] / "model.safetensors.index.json").read_text())
    name = "model.layers.1.mlp.down_proj.weight"
    assert source.file_of(name) == index["weight_map"][name]


def test_two_files_without_index(tiny: dict[str, Any], tmp_path: Path) -> None:
    _copy_config(tiny["single"], tmp_path)
    state = tiny["state"]
    names = sorted(state)
    half = len(names) // 2
    safetensors_torch.save_file({n: state[n] for n in names[:half]}, tmp_path / "a.safetensors")
    safetensors_torch.save_file({n: state[n] for n in names[half:]}, tmp_path / "b.safetensors")
    source = HFDirectorySource(tmp_path)
    assert source.weight_files == ["a.safetensors", "b.safetensors"]
    assert source.keys() == names
    assert source.file_of(names[-1]) == "b.safetensors"
    assert torch.equal(source.load(names[0]), state[names[0]])
    assert torch.equal(source.load(names[-1]), state[names[-1]])


def test_vlm_config_and_bf16(tiny: dict[str, Any], tmp_path: Path) -> None:
    text = json.loads((tiny["single"] / "config.json").read_text())
    del text["tie_word_embeddings"]
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 2},
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = {
        k.replace("model.", "model.language_model.", 1): v.to(torch.bfloat16)
        for k, v in tiny["state"].items()
    }
    safetensors_torch.save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    source = HFDirectorySource(tmp_path)
    assert source.config["model_type"] == "qwen3_5"
    assert source.text_config["model_type"] == "qwen3_5_text"
    assert source.text_config["tie_word_embeddings"] is True
    assert source.text_config["hidden_size"] == 64
    assert source.vision_config == config["vision_config"]
    name = "model.language_model.layers.0.linear_attn.A_log"
    assert source.dtype(name) == "BF16"
    loaded = source.load(name)
    assert loaded.dtype == torch.bfloat16 and torch.equal(loaded, weights[name])


def test_resources_and_chat_template(tiny: dict[str, Any], tmp_path: Path) -> None:
    _copy_config(tiny["single"], tmp_path)
    shutil.copy(tiny["single"] / "model.safetensors", tmp_path)
    tokenizer_config = {"model_max_length": 1024, "chat_template": TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (tmp_path / "tokenizer.json").write_bytes(b'{"version": "1.0"}')
    (tmp_path / "preprocessor_config.json").write_text("{}")
    source = HFDirectorySource(tmp_path)
    assert source.resources["chat_template.jinja"] == TEMPLATE.encode()
    assert source.resources["tokenizer.json"] == b'{"version": "1.0"}'
    assert set(source.resources) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
    }
    # A chat_template.jinja file wins over the embedded copy.
    (tmp_path / "chat_template.jinja").write_text("FILE")
    assert HFDirectorySource(tmp_path).resources["chat_template.jinja"] == b"FILE"


def test_quantization_detection(tiny: dict[str, Any], tmp_path: Path) -> None:
    config = json.loads((tiny["single"] / "config.json").read_text())
    shutil.copy(tiny["single"] / "model.safetensors", tmp_path)

    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "nvfp4"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = HFDirectorySource(tmp_path)
    assert source.quant_method == "compressed-tensors"
    assert source.quantization == config["quantization_config"]

    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = HFDirectorySource(tmp_path)
    assert source.quant_method is None and source.quantization["quant_method"] == "fp8"

    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    modelopt = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(modelopt))
    source = HFDirectorySource(tmp_path)
    assert source.quant_method == "modelopt" and source.quantization == modelopt


def test_quantized_storage_dtypes(tiny: dict[str, Any], tmp_path: Path) -> None:
    """ModelOpt NVFP4 names and storage types come through as safetensors dtype strings."""
    _copy_config(tiny["single"], tmp_path)
    prefix = "model.layers.0.mlp.down_proj."
    codes = torch.randint(0, 256, (64, 64), dtype=torch.uint8)
    scales = torch.rand(64, 8).to(torch.float8_e4m3fn)
    tensors = {
        prefix + "weight": codes,
        prefix + "weight_scale": scales,
        prefix + "weight_scale_2": torch.tensor(0.5),
        prefix + "input_scale": torch.tensor(2.0),
    }
    safetensors_torch.save_file(tensors, tmp_path / "model.safetensors")
    source = HFDirectorySource(tmp_path)
    names = source.keys()
    dtypes = {name: source.dtype(name) for name in names}
    assert dtypes == {
        prefix + "input_scale": "F32",
        prefix + "weight": "U8",
        prefix + "weight_scale": "F8_E4M3",
        prefix + "weight_scale_2": "F32",
    }
    assert source.shape(prefix + "weight_scale_2") == ()
    assert torch.equal(source.load(prefix + "weight"), codes)
    loaded = source.load(prefix + "weight_scale")
    assert loaded.dtype == torch.float8_e4m3fn
    assert torch.equal(loaded.view(torch.uint8), scales.view(torch.uint8))


def test_provenance(tiny: dict[str, Any]) -> None:
    source = HFDirectorySource(tiny["sharded"])
    record = source.provenance()
    json.dumps(record)
    assert record["kind"] == "hf_directory"
    assert record["path"] == str(tiny["sharded"])
    config_bytes = (tiny["sharded"] / "config.json").read_bytes()
    assert record["files"]["config.json"] == {"xxh3_64": xxhash.xxh3_64_hexdigest(config_bytes)}
    assert "model.safetensors.index.json" in record["files"]
    first = source.weight_files[0]
    raw = (tiny["sharded"] / first).read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    assert record["files"][first] == {
        "bytes": len(raw),
        "header_xxh3_64": xxhash.xxh3_64_hexdigest(raw[: 8 + header_len]),
    }


# -- HF directory: errors ---------------------------------------------------------------------


def test_missing_and_invalid_config(tiny: dict[str, Any], tmp_path: Path) -> None:
    shutil.copy(tiny["single"] / "model.safetensors", tmp_path)
    with pytest.raises(SourceError, match=r"no config\.json"):
        HFDirectorySource(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SourceError, match=r"config\.json is not valid JSON"):
        HFDirectorySource(tmp_path)
    with pytest.raises(SourceError, match="not a directory"):
        HFDirectorySource(tmp_path / "nope")


def test_no_weights(tiny: dict[str, Any], tmp_path: Path) -> None:
    _copy_config(tiny["single"], tmp_path)
    with pytest.raises(SourceError, match=r"no \*\.safetensors"):
        HFDirectorySource(tmp_path)


def test_corrupt_safetensors(tiny: dict[str, Any], tmp_path: Path) -> None:
    _copy_config(tiny["single"], tmp_path)
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!garbage!")
    with pytest.raises(SourceError, match=r"model\.safetensors is not a valid safetensors file"):
        HFDirectorySource(tmp_path)
    target.write_bytes(b"\xff" * 64)  # absurd header length
    with pytest.raises(SourceError, match="header length"):
        HFDirectorySource(tmp_path)
    good = (tiny["single"] / "model.safetensors").read_bytes()
    target.write_bytes(good[: len(good) - 1000])  # truncated download
    with pytest.raises(SourceError, match="truncated"):
        HFDirectorySource(tmp_path)


def test_index_names_missing_file(tiny: dict[str, Any], tmp_path: Path) -> None:
    shutil.copytree(tiny["sharded"], tmp_path, dirs_exist_ok=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    gone = index["weight_map"]["model.norm.weight"]
    (tmp_path / gone).unlink()
    with pytest.raises(SourceError, match=f"missing from .*{gone}") as info:
        HFDirectorySource(tmp_path)
    assert "model.safetensors.index.json" in str(info.value)


def test_index_names_tensor_absent_from_file(tiny: dict[str, Any], tmp_path: Path) -> None:
    shutil.copytree(tiny["sharded"], tmp_path, dirs_exist_ok=True)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.extra.weight"] = index["weight_map"]["model.norm.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"'model\.extra\.weight'.*does not hold it"):
        HFDirectorySource(tmp_path)


def test_duplicate_tensor_names(tiny: dict[str, Any], tmp_path: Path) -> None:
    _copy_config(tiny["single"], tmp_path)
    state = tiny["state"]
    safetensors_torch.save_file(dict(state), tmp_path / "a.safetensors")
    safetensors_torch.save_file(
        {"model.norm.weight": state["model.norm.weight"]}, tmp_path / "b.safetensors"
    )
    with pytest.raises(
        SourceError, match=r"'model\.norm\.weight' is stored in both a\.safetensors and b"
    ):
        HFDirectorySource(tmp_path)


def test_missing_tensor_names_the_source(tiny: dict[str, Any]) -> None:
    source = HFDirectorySource(tiny["single"])
    with pytest.raises(SourceError, match=r"model\.norm\.weights") as info:
        source.load("model.norm.weights")
    message = str(info.value)
    assert str(tiny["single"]) in message and "did you mean 'model.norm.weight'" in message
    with pytest.raises(SourceError):
        source.shape("nope")
    assert issubclass(SourceError, ConvertError)


# -- Hub ----------------------------------------------------------------------------------------


def test_parse_repo_spec() -> None:
    assert parse_repo_spec("org/name@abc") == ("org/name", "abc")
    assert parse_repo_spec("Qwen/Qwen3.6-27B") == ("Qwen/Qwen3.6-27B", None)
    assert parse_repo_spec("org/name@refs/pr/3") == ("org/name", "refs/pr/3")
    for bad in ("name", "org/name/extra", "org/name@", "/name", "org/na me"):
        with pytest.raises(SourceError, match="not a Hugging Face repo id"):
            parse_repo_spec(bad)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache under tmp, offline, whatever huggingface_hub read at import."""
    cache = tmp_path / "hf_home" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    return cache


def test_hub_offline_not_cached(offline_cache: Path) -> None:
    with pytest.raises(SourceError) as info:
        open_hub("org/name@rev1")
    message = str(info.value)
    assert message.startswith(
        "cannot fetch org/name@rev1: not in the Hugging Face cache and the Hub is unreachable "
        "(HF_HUB_OFFLINE=1?); download it on a connected machine with `hf download org/name"
    )
    assert "or pass a local directory" in message and str(offline_cache) in message
    with pytest.raises(SourceError, match="cannot fetch org/name: not in the Hugging Face cache"):
        open_source("org/name")


def test_hub_network_failure_is_a_source_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(*args: Any, **kwargs: Any) -> str:
        raise LocalEntryNotFoundError("Got: ConnectError: Name or service not known")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(SourceError, match="the Hub is unreachable"):
        open_hub("org/name")
    with pytest.raises(SourceError, match="names revision 'a' but revision='b'"):
        open_hub("org/name@a", revision="b")


def test_hub_cached_snapshot_opens_offline(tiny: dict[str, Any], offline_cache: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = offline_cache / "models--org--name"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(tiny["single"], snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)

    source = open_source("org/name")
    assert isinstance(source, HFDirectorySource)
    assert source.id == "org/name"
    assert source.keys() == sorted(tiny["state"])
    record = source.provenance()
    assert record["kind"] == "hf_hub"
    assert (record["repo_id"], record["revision"], record["commit"]) == ("org/name", None, commit)
    assert "model.safetensors" in record["files"]

    pinned = open_hub("org/name", revision=commit)
    assert pinned.id == f"org/name@{commit}" and pinned.commit == commit
    # The snapshot folder opened as a plain path still knows where it came from.
    local = HFDirectorySource(snapshot)
    assert (local.repo_id, local.commit, local.kind) == ("org/name", commit, "hf_directory")


def test_open_source_dispatch(tiny: dict[str, Any], tmp_path: Path) -> None:
    assert isinstance(open_source(str(tiny["single"])), HFDirectorySource)
    with pytest.raises(SourceError, match="neither a local checkpoint directory"):
        open_source(str(tmp_path / "weights.bin"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match="neither a local checkpoint directory"):
        open_source(str(tmp_path / "notes.txt"))
    with pytest.raises(SourceError, match="no such GGUF file"):
        open_source(str(tmp_path / "model.gguf"))


# -- GGUF -----------------------------------------------------------------------------------------


def _q4_k_blocks(rng: np.random.Generator, rows: int, blocks_per_row: int) -> np.ndarray:
    """Random Q4_K blocks whose f16 d/dmin fields (bytes 0-3) are small and finite."""
    blocks = rng.integers(0, 256, size=(rows * blocks_per_row, 144), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, size=(rows * blocks_per_row, 2)).astype(np.float16)
    blocks[:, 0:4] = scales.view(np.uint8)
    return blocks.reshape(rows, blocks_per_row * 144)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    f32 = rng.standard_normal((3, 32)).astype(np.float32)
    f16 = rng.standard_normal((4, 8)).astype(np.float16)
    q8_values = rng.standard_normal((2, 3, 64)).astype(np.float32)  # a rank-3 "expert bank"
    q8 = gguf.quants.quantize(q8_values, QT.Q8_0)
    q4k = _q4_k_blocks(rng, rows=4, blocks_per_row=2)
    norm = rng.standard_normal(64).astype(np.float32)
    bf16_bits = (rng.standard_normal((2, 16)).astype(np.float32).view(np.uint32) >> 16).astype(
        np.uint16
    )

    writer = gguf.GGUFWriter(str(path), arch="qwen35")
    writer.add_block_count(2)
    writer.add_string("general.name", "tiny")
    writer.add_token_list(["a", "b", "<|im_end|>"])
    writer.add_chat_template(TEMPLATE)
    writer.add_tensor("blk.0.ffn_down.weight", f32)
    writer.add_tensor("blk.0.attn_k.weight", f16)
    writer.add_tensor("blk.0.ffn_gate_exps.weight", q8, raw_dtype=QT.Q8_0)
    writer.add_tensor("token_embd.weight", q4k, raw_dtype=QT.Q4_K)
    writer.add_tensor("output_norm.weight", norm)
    writer.add_tensor("blk.0.ssm_a", bf16_bits.view(np.uint8), raw_dtype=QT.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {
        "path": path,
        "f32": f32,
        "f16": f16,
        "q8": q8,
        "q8_values": q8_values,
        "q4k": q4k,
        "norm": norm,
        "bf16_bits": bf16_bits,
    }


def test_gguf_tensors(gguf_file: dict[str, Any]) -> None:
    source = open_source(str(gguf_file["path"]))
    assert isinstance(source, GgufSource) and isinstance(source, TensorSource)
    assert source.keys() == sorted(
        [
            "blk.0.ffn_down.weight",
            "blk.0.attn_k.weight",
            "blk.0.ffn_gate_exps.weight",
            "token_embd.weight",
            "output_norm.weight",
            "blk.0.ssm_a",
        ]
    )
    assert source.shape("blk.0.ffn_down.weight") == (3, 32)
    assert source.shape("blk.0.ffn_gate_exps.weight") == (2, 3, 64)
    assert source.shape("token_embd.weight") == (4, 512)
    assert source.shape("output_norm.weight") == (64,)
    assert source.dtype("token_embd.weight") == "Q4_K"
    assert source.ggml_type("token_embd.weight") == 12
    assert source.dtype("blk.0.ffn_gate_exps.weight") == "Q8_0"
    assert source.dtype("blk.0.attn_k.weight") == "F16"
    assert source.dtype("output_norm.weight") == "F32"

    raw = source.raw_blocks("token_embd.weight")
    assert raw.dtype == np.uint8 and raw.shape == (4, 288)
    assert np.array_equal(raw, gguf_file["q4k"])
    expected = gguf.quants.dequantize(gguf_file["q4k"], QT.Q4_K)
    assert np.isfinite(expected).all()
    loaded = source.load("token_embd.weight")
    assert loaded.dtype == torch.float32 and loaded.shape == (4, 512)
    assert np.array_equal(loaded.numpy(), expected)

    bank = source.raw_blocks("blk.0.ffn_gate_exps.weight")
    assert bank.shape == (6, 68)  # 2*3 rows of two 34-byte Q8_0 blocks
    assert np.array_equal(bank, gguf_file["q8"].reshape(6, 68))
    values = source.load("blk.0.ffn_gate_exps.weight").numpy()
    assert np.array_equal(values, gguf.quants.dequantize(gguf_file["q8"], QT.Q8_0))
    assert np.abs(values - gguf_file["q8_values"]).max() < 0.05

    assert np.array_equal(source.load("blk.0.ffn_down.weight").numpy(), gguf_file["f32"])
    f16 = source.load("blk.0.attn_k.weight")
    assert f16.dtype == torch.float32
    assert np.array_equal(f16.numpy(), gguf_file["f16"].astype(np.float32))
    assert np.array_equal(
        source.raw_blocks("output_norm.weight").view(np.float32)[0], gguf_file["norm"]
    )

    assert (source.dtype("blk.0.ssm_a"), source.shape("blk.0.ssm_a")) == ("BF16", (2, 16))
    widened = (gguf_file["bf16_bits"].astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(source.load("blk.0.ssm_a").numpy(), widened)

    with pytest.raises(SourceError, match=r"'blk\.0\.ffn_up\.weight' is not in"):
        source.load("blk.0.ffn_up.weight")


def test_gguf_metadata_and_provenance(gguf_file: dict[str, Any]) -> None:
    source = GgufSource(gguf_file["path"])
    assert source.architecture == "qwen35"
    assert source.metadata["general.name"] == "tiny"
    assert source.metadata["qwen35.block_count"] == 2
    assert source.metadata["tokenizer.ggml.tokens"] == ["a", "b", "<|im_end|>"]
    assert source.metadata["tokenizer.chat_template"] == TEMPLATE
    assert not any(key.startswith("GGUF.") for key in source.metadata)
    record = source.provenance()
    json.dumps(record)
    assert record["kind"] == "gguf" and record["architecture"] == "qwen35"
    entry = record["files"]["tiny.gguf"]
    assert entry["bytes"] == gguf_file["path"].stat().st_size
    assert len(entry["header_xxh3_64"]) == 16


def _write_gguf(
    path: Path, arch: str, tensors: list[tuple[str, tuple[int, ...], int, bytes]]
) -> None:
    """A minimal GGUF v3 writer, for ggml types gguf-py's writer does not know (Q2_0)."""

    def gstr(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
    head += gstr("general.architecture") + struct.pack("<I", 8) + gstr(arch)
    data, offset = b"", 0
    for name, ne, ggml_type, raw in tensors:
        head += gstr(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, ggml_type, offset)
        padded = raw + b"\0" * (-len(raw) % 32)
        data += padded
        offset += len(padded)
    path.write_bytes(head + b"\0" * (-len(head) % 32) + data)


def test_gguf_q2_0(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rows, cols = 3, 128
    blocks = rng.integers(0, 256, size=(rows * cols // 64, 18), dtype=np.uint8)
    d = rng.uniform(0.01, 0.02, size=blocks.shape[0]).astype(np.float16)
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    path = tmp_path / "q2.gguf"
    _write_gguf(path, "qwen35", [("blk.0.attn_qkv.weight", (cols, rows), 42, blocks.tobytes())])

    source = GgufSource(path)
    name = "blk.0.attn_qkv.weight"
    assert (source.dtype(name), source.ggml_type(name), source.shape(name)) == (
        "Q2_0",
        42,
        (3, 128),
    )
    assert np.array_equal(source.raw_blocks(name), blocks.reshape(rows, -1))
    # Independent decode: code j of a block is bits 2*(j%4).. of byte 2 + j//4; w = (code-1)*d.
    j = np.arange(64)
    codes = (blocks[:, 2 + j // 4] >> (2 * (j % 4))) & 3
    expected = (codes.astype(np.float32) - 1) * d.astype(np.float32)[:, None]
    assert np.array_equal(source.load(name).numpy(), expected.reshape(rows, cols))


def test_gguf_errors(gguf_file: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 60)
    with pytest.raises(SourceError, match=r"bad\.gguf is not a readable GGUF file"):
        GgufSource(bad)
    bad.write_bytes(b"")
    with pytest.raises(SourceError, match=r"bad\.gguf is not a readable GGUF file"):
        GgufSource(bad)
    good = gguf_file["path"].read_bytes()
    bad.write_bytes(good[:200])  # cut inside the key/values
    with pytest.raises(SourceError, match=r"bad\.gguf"):
        GgufSource(bad)
    bad.write_bytes(good[: len(good) - 100])  # cut inside the tensor data
    with pytest.raises(SourceError, match="truncated"):
        GgufSource(bad)
