"""What a checkpoint directory's config says beyond its tensors: where it came from (a Hub
cache snapshot), the language model's config inside a VLM's, and its quantization."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .json_files import read_json_object

_CACHE_SNAPSHOT = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def cache_origin(path: Path) -> tuple[str | None, str | None]:
    """(repo id, commit) when ``path`` is a snapshot folder of the Hugging Face cache."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and _COMMIT.match(parts[-1]):
        match = _CACHE_SNAPSHOT.match(parts[-3])
        if match:
            return f"{match['org']}/{match['name']}", parts[-1]
    return None, None


def text_config_of(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: the nested ``text_config`` of a VLM checkpoint."""
    nested = config.get("text_config")
    if not isinstance(nested, dict):
        return config
    text = dict(nested)
    # VLM wrappers (qwen3_5, qwen3_5_moe) keep tie_word_embeddings at the top level only.
    if "tie_word_embeddings" not in text and "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return text


def normalize_quant_method(
    quant_config: dict[str, Any] | None, has_modelopt_file: bool
) -> str | None:
    """Map a checkpoint's quantization description onto the importers the converter has.

    ModelOpt exports (``nvidia/*-NVFP4``) announce themselves either with ``hf_quant_config.json``
    or with ``quant_method: modelopt``; compressed-tensors spells its name with a hyphen or an
    underscore depending on the version. Any other method ("fp8", "gptq", ...) yields None,
    while ``quantization`` stays set, so a recipe can tell "unquantized" from "unsupported".
    """
    method = quant_config.get("quant_method") if quant_config else None
    if isinstance(method, str):
        normalized = method.strip().lower().replace("_", "-")
        if normalized == "modelopt":
            return "modelopt"
        if normalized == "compressed-tensors":
            return "compressed-tensors"
    if has_modelopt_file and method is None:
        return "modelopt"
    return None


def read_quantization(
    directory: Path, config: dict[str, Any], text_config: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """(description, method): config.json's ``quantization_config`` (top level, else the text
    config's), else ``hf_quant_config.json``, None if neither; and the normalized method."""
    raw = config.get("quantization_config")
    if not isinstance(raw, dict):
        raw = text_config.get("quantization_config")
    modelopt_path = directory / "hf_quant_config.json"
    modelopt = read_json_object(modelopt_path) if modelopt_path.is_file() else None
    quant = raw if isinstance(raw, dict) else modelopt
    method = normalize_quant_method(raw if isinstance(raw, dict) else None, modelopt is not None)
    return quant, method
