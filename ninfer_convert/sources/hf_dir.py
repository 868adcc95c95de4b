"""A local Hugging Face checkpoint directory as a tensor source.

The directory holds ``config.json``, one or more ``*.safetensors`` files (with or without
``model.safetensors.index.json``) and the frontend resources (tokenizer, chat template,
generation and preprocessor configs). Everything is checked when the source is opened, before
any tensor is read, so a broken download fails in the first second rather than an hour into a
conversion: every file named by the index must exist, every safetensors header must parse and
fit its file, every name the index lists must be in its file's header, and no tensor name may
appear in two files (``weight_index``, ``safetensors_header``).

Only the safetensors *headers* are read at open time; tensors are read one at a time through
``safetensors.safe_open``, which memory-maps each file, so a 27B checkpoint never has to fit in
memory.

Provenance digests are xxh3-64 (the ``xxhash`` package). Small files (``*.json``, ``*.jinja``,
``*.txt``, ``*.model``) are hashed whole. Weight files are recorded as their size plus the hash
of their safetensors header (the 8-byte length and the JSON that follows): the header pins
every tensor's name, dtype, shape and byte range, and a full-content hash would read the whole
checkpoint a second time, doubling the conversion's I/O. A weight file whose tensor bytes were
altered in place with an unchanged header is therefore not detected by the digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SourceError
from .base import TensorSource, missing_tensor, xxh3_file
from .hf_config import cache_origin, read_quantization, text_config_of
from .hf_resources import RESOURCE_FILES, read_resources
from .json_files import read_json, read_json_object
from .safetensors_header import HeaderTensor, WeightFile, read_safetensors_header
from .weight_index import INDEX_NAME, read_weight_table

if TYPE_CHECKING:
    import torch

__all__ = [
    "INDEX_NAME",
    "RESOURCE_FILES",
    "SMALL_FILE_SUFFIXES",
    "HFDirectorySource",
    "read_json",
    "read_safetensors_header",
]

#: suffixes of the files hashed whole for provenance
SMALL_FILE_SUFFIXES = frozenset({".json", ".jinja", ".txt", ".model"})


class HFDirectorySource(TensorSource):
    """Tensors, config and frontend resources of one local Hugging Face checkpoint directory."""

    def __init__(
        self,
        path: str | Path,
        *,
        repo_id: str | None = None,
        revision: str | None = None,
        commit: str | None = None,
        display_id: str | None = None,
        kind: str = "hf_directory",
    ) -> None:
        self.path = Path(path).expanduser().absolute()
        if not self.path.is_dir():
            raise SourceError(f"{self.path} is not a directory")
        cached_repo, cached_commit = cache_origin(self.path)
        self.repo_id = repo_id or cached_repo
        self.revision = revision
        self.commit = commit or cached_commit
        self.id = display_id or str(self.path)
        #: provenance kind: "hf_directory", or "hf_hub" when ``open_hub`` opened it
        self.kind = kind

        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise SourceError(
                f"{self.path} has no config.json; a Hugging Face checkpoint directory needs one"
            )
        #: the raw config.json
        self.config: dict[str, Any] = read_json_object(config_path)
        #: the language model's config: the nested ``text_config`` of a VLM checkpoint
        self.text_config: dict[str, Any] = text_config_of(self.config)
        vision = self.config.get("vision_config")
        self.vision_config: dict[str, Any] | None = vision if isinstance(vision, dict) else None

        self._files: dict[str, WeightFile] = {}
        self._tensors: dict[str, HeaderTensor] = {}
        self._open_weights()
        self._keys = sorted(self._tensors)
        self._handles: dict[str, Any] = {}

        self.resources: dict[str, bytes] = read_resources(self.path)
        #: config.json's ``quantization_config``, else ``hf_quant_config.json``; None if neither;
        #: and "modelopt", "compressed-tensors", or None (unquantized or a method we cannot
        #: import)
        self.quantization: dict[str, Any] | None
        self.quant_method: str | None
        self.quantization, self.quant_method = read_quantization(
            self.path, self.config, self.text_config
        )

    # -- weights -----------------------------------------------------------------------------

    def _open_weights(self) -> None:
        """Read the weight files' headers (a config-only subclass may skip them)."""
        files, tensors = read_weight_table(self.path)
        self._files.update(files)
        self._tensors.update(tensors)

    def _entry(self, name: str) -> HeaderTensor:
        entry = self._tensors.get(name)
        if entry is None:
            raise missing_tensor(name, self.id, self._keys)
        return entry

    def _handle(self, rel: str) -> Any:
        handle = self._handles.get(rel)
        if handle is None:
            from safetensors import safe_open

            try:
                handle = safe_open(str(self.path / rel), framework="pt")
            except Exception as exc:
                raise SourceError(f"cannot open {self.path / rel}: {exc}") from exc
            self._handles[rel] = handle
        return handle

    # -- TensorSource ------------------------------------------------------------------------

    def keys(self) -> list[str]:
        return list(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name).shape

    def dtype(self, name: str) -> str:
        return self._entry(name).dtype

    def file_of(self, name: str) -> str:
        """The weight file (relative to the directory) that holds ``name``."""
        return self._entry(name).file

    @property
    def weight_files(self) -> list[str]:
        """The safetensors files in use, relative to the directory."""
        return sorted(self._files)

    def load(self, name: str) -> torch.Tensor:
        entry = self._entry(name)
        handle = self._handle(entry.file)
        try:
            return handle.get_tensor(name)
        except Exception as exc:
            raise SourceError(
                f"cannot load tensor {name!r} ({entry.dtype} {list(entry.shape)}) from "
                f"{self.path / entry.file}: {exc}"
            ) from exc

    def provenance(self) -> dict[str, Any]:
        files: dict[str, dict[str, Any]] = {}
        for path in sorted(self.path.iterdir()):
            if path.suffix in SMALL_FILE_SUFFIXES and path.is_file():
                files[path.name] = {"xxh3_64": xxh3_file(path)}
        for rel, weight_file in sorted(self._files.items()):
            files[rel] = {"bytes": weight_file.size, "header_xxh3_64": weight_file.header_digest}
        return {
            "kind": self.kind,
            "path": str(self.path),
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "files": files,
        }

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the open safetensors handles (and their memory maps)."""
        self._handles.clear()

    def __enter__(self) -> HFDirectorySource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HFDirectorySource({self.id!r}, {len(self._keys)} tensors)"
