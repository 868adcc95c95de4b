"""Reading the artifact's frontend resources (``components.text.resources``, role = file name).

The roles are the original Hugging Face file names (spec §5.7); the bytes are verbatim file
contents. Decoding lives here once so every consumer reports a broken file the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ninfer_runtime.frontend._errors import artifact_error

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE = "chat_template.jinja"


def read_text(resources: Mapping[str, bytes], role: str) -> str | None:
    """The resource as UTF-8 text, or ``None`` when the artifact does not carry it."""
    raw = resources.get(role)
    if raw is None:
        return None
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise artifact_error(role, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_json_object(resources: Mapping[str, bytes], role: str) -> dict[str, Any]:
    """The resource parsed as a JSON object; ``{}`` when absent (every such file is optional)."""
    text = read_text(resources, role)
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise artifact_error(role, f"invalid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(value, dict):
        raise artifact_error(role, f"expected a JSON object, found {type(value).__name__}")
    return value


def token_content(value: object) -> str | None:
    """The text of a special-token entry: HF writes either a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def template_tokens(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The special-token strings a chat template sees (``bos_token``, ``eos_token``, ...)."""
    tokens = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        content = token_content(tokenizer_config.get(key))
        if content is not None:
            tokens[key] = content
    return tokens
