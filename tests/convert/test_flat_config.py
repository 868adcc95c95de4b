"""A checkpoint saved by ``Qwen3_5ForCausalLM`` keeps its text config at the top level of
config.json (no ``text_config``): it converts to the same artifact config and the same greedy
tokens as the nested layout of a VLM wrapper, and ``ninfer`` holds ``--max-context`` to the
model's positions in both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from ninfer_convert.pipeline import convert
from ninfer_format import Artifact
from ninfer_runtime.cli import fit_context
from ninfer_runtime.cli import main as ninfer_cli

FRONTEND = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def nested_layout(flat: Path, folder: Path) -> Path:
    """The same weights as a ``Qwen3_5ForConditionalGeneration`` checkpoint would hold them:
    the text config under ``text_config``, the language model under ``model.language_model.``."""
    folder.mkdir()
    text = json.loads((flat / "config.json").read_text())
    tied = text.pop("tie_word_embeddings")
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": tied,
    }
    (folder / "config.json").write_text(json.dumps(config))
    weights = {
        (k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
        for k, v in load_file(flat / "model.safetensors").items()
    }
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    for name in (*FRONTEND, "generation_config.json"):
        shutil.copy(flat / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, tiny_dense) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("flat_config")
    assert "text_config" not in json.loads((tiny_dense / "config.json").read_text())
    nested = nested_layout(tiny_dense, root / "nested")
    paths = {"flat": root / "flat.ninfer", "nested": root / "nested.ninfer"}
    convert("qwen3_5_bf16", {"base": str(tiny_dense)}, paths["flat"], components=("text",))
    convert("qwen3_5_bf16", {"base": str(nested)}, paths["nested"], components=("text",))
    return paths


def ninfer(*args: object):
    return CliRunner().invoke(ninfer_cli, [str(a) for a in args])


def test_flat_and_nested_configs_give_the_same_model(artifacts):
    configs = {}
    for layout, path in artifacts.items():
        with Artifact.open(path) as art:
            configs[layout] = art.components["text"].config
    assert configs["flat"]["max_position_embeddings"] == 4096
    assert configs["nested"]["max_position_embeddings"] == 4096
    assert configs["flat"]["rope_parameters"] == configs["nested"]["rope_parameters"]
    tokens = {}
    for layout, path in artifacts.items():
        result = ninfer(path, "--raw", "--prompt", "Once upon a time", "--greedy",
                        "--max-tokens", "12", "--print-token-ids")  # fmt: skip
        assert result.exit_code == 0, result.output
        tokens[layout] = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(tokens["flat"]) == 12 and tokens["flat"] == tokens["nested"]


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_max_context_beyond_the_models_positions_is_refused(artifacts, layout):
    result = ninfer(artifacts[layout], "--prompt", "Hi", "--max-context", "100000")
    assert result.exit_code == 1, result.output
    assert result.output == (
        "ninfer: error: --max-context 100000 is more than the model's 4096 positions "
        "(its max_position_embeddings); give 4096 or less\n"
    )
    assert ninfer(artifacts[layout], "--prompt", "Hi", "--max-context", "4096").exit_code == 0


def test_the_default_context_is_cut_to_the_models_positions():
    assert fit_context(None, 1024) == 1024
    assert fit_context(None, 262144) == 4096
    assert fit_context(None, None) == 4096
    assert fit_context(8192, 262144) == 8192
