"""Checkpoint sources: where a conversion reads its tensors, config and frontend resources.

``open_source(spec)`` picks the source from what ``spec`` is: a local Hugging Face checkpoint
directory, a ``.gguf`` file, or a Hub repo id ``org/name[@revision]`` (resolved through the
local Hub cache). Every failure to open or read a source is a ``SourceError`` naming the path,
repo or tensor at fault.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SourceError
from .base import TensorSource
from .gguf_file import GgufSource
from .hf_dir import HFDirectorySource
from .hub import looks_like_repo_spec, open_hub, parse_repo_spec

__all__ = [
    "GgufSource",
    "HFDirectorySource",
    "SourceError",
    "TensorSource",
    "open_hub",
    "open_source",
    "parse_repo_spec",
]


def open_source(spec: str | Path) -> TensorSource:
    """Open a checkpoint by path or repo id.

    Local paths win over repo ids: ``org/name`` that exists on disk is opened as a directory,
    so a checkout never silently triggers a download.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        return HFDirectorySource(path)
    if path.suffix.lower() == ".gguf":
        return GgufSource(path)
    text = str(spec)
    if not path.exists() and looks_like_repo_spec(text):
        return open_hub(text)
    raise SourceError(
        f"{text!r} is neither a local checkpoint directory, a .gguf file nor a Hugging Face "
        "repo id (org/name[@revision])"
    )
