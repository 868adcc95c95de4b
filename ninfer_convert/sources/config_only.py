"""A base checkpoint directory read for its config and tokenizer files, weights optional.

A conversion whose recipe reads no weights from the base (a GGUF import takes every weight
from the .gguf file, notes 4.5) still needs the base's config.json and frontend files; the
directory need not hold safetensors, and if it does they are opened as usual.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SourceError
from .hf_dir import HFDirectorySource
from .weight_index import INDEX_NAME


class ConfigOnlySource(HFDirectorySource):
    """A checkpoint directory whose weight files are read only when it has some."""

    def _open_weights(self) -> None:
        if (self.path / INDEX_NAME).is_file() or any(self.path.glob("*.safetensors")):
            super()._open_weights()


def open_config_only(spec: str | Path) -> HFDirectorySource:
    """The local base directory ``spec``, opened for its config (a repo id is refused)."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise SourceError(f"{spec}: a GGUF import needs a local base directory (config.json)")
    return ConfigOnlySource(path)
