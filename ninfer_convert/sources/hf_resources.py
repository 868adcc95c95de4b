"""The frontend resources of a checkpoint directory (tokenizer, chat template, generation and
preprocessor configs), read as bytes under the file names the artifact keeps."""

from __future__ import annotations

from pathlib import Path

from ..errors import SourceError
from .json_files import read_json_object

#: resource role -> file name; the roles are the file names the artifact keeps
RESOURCE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
)


def read_resources(directory: Path) -> dict[str, bytes]:
    """Every resource file ``directory`` holds; a chat template kept inside a JSON file
    becomes ``chat_template.jinja``."""
    resources: dict[str, bytes] = {}
    for role in RESOURCE_FILES:
        path = directory / role
        if path.is_file():
            try:
                resources[role] = path.read_bytes()
            except OSError as exc:
                raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if "chat_template.jinja" not in resources:
        template = embedded_chat_template(directory)
        if template is not None:
            resources["chat_template.jinja"] = template.encode("utf-8")
    return resources


def embedded_chat_template(directory: Path) -> str | None:
    """The chat template older checkpoints keep inside a JSON file instead of a .jinja file.

    transformers < 4.43 wrote it into ``tokenizer_config.json``; processors of VLMs wrote
    ``chat_template.json``. A list of named templates (the multi-template form) yields the
    one named "default".
    """
    for file_name in ("tokenizer_config.json", "chat_template.json"):
        path = directory / file_name
        if not path.is_file():
            continue
        template = read_json_object(path).get("chat_template")
        if isinstance(template, list):
            named = {
                item.get("name"): item.get("template")
                for item in template
                if isinstance(item, dict)
            }
            template = named.get("default")
        if isinstance(template, str):
            return template
    return None
