"""A local Hugging Face checkpoint directory as a tensor source.

The directory holds ``config.json``, one or more ``*.safetensors`` files (with or without
``model.safetensors.index.json``) and the frontend resources (tokenizer, chat template,
generation and preprocessor configs). Everything is checked when the source is opened, before
any tensor is read, so a broken download fails in the first second rather than an hour into a
conversion: every file named by the index must exist, every safetensors header must parse and
fit its file, every name the index lists must be in its file's header, and no tensor name may
appear in two files.

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

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SourceError
from .base import TensorSource, missing_tensor, xxh3_file, xxh3_hex

if TYPE_CHECKING:
    import torch

INDEX_NAME = "model.safetensors.index.json"

#: resource role -> file name; the roles are the file names the artifact keeps
RESOURCE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
)

#: suffixes of the files hashed whole for provenance
SMALL_FILE_SUFFIXES = frozenset({".json", ".jinja", ".txt", ".model"})

#: safetensors refuses headers above 100 MB; anything larger means the length word is garbage
_MAX_HEADER_BYTES = 100_000_000

_CACHE_SNAPSHOT = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class _Tensor:
    file: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _WeightFile:
    size: int
    header_digest: str
    tensors: dict[str, _Tensor]


def read_json(path: Path) -> Any:
    """Parse one JSON file; any failure becomes a ``SourceError`` that names the file."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{path} is not valid JSON: {exc}") from exc


def _read_json_object(path: Path) -> dict[str, Any]:
    value = read_json(path)
    if not isinstance(value, dict):
        raise SourceError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value


def read_safetensors_header(path: Path, rel: str) -> _WeightFile:
    """Read and check one safetensors header without touching the tensor bytes.

    The checks are the ones that would otherwise surface as an obscure error from the Rust
    reader in the middle of a conversion: a header that does not parse, a tensor entry without
    dtype/shape/offsets, or byte ranges that run past the end of a truncated file.
    """

    def bad(why: str) -> SourceError:
        return SourceError(f"{path} is not a valid safetensors file: {why}")

    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            prefix = stream.read(8)
            if len(prefix) < 8:
                raise bad(f"only {len(prefix)} bytes long")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_HEADER_BYTES or 8 + header_len > size:
                raise bad(f"header length {header_len} does not fit the {size}-byte file")
            header = stream.read(header_len)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        entries = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"header is not JSON ({exc})") from exc
    if not isinstance(entries, dict):
        raise bad("header is not a JSON object")

    data_bytes = size - 8 - header_len
    tensors: dict[str, _Tensor] = {}
    for name, entry in entries.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = tuple(entry["shape"])
            begin, end = entry["data_offsets"]
            valid = (
                isinstance(dtype, str)
                and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(begin, int)
                and isinstance(end, int)
                and 0 <= begin <= end
            )
        except (TypeError, KeyError, ValueError):
            valid = False
        if not valid:
            raise bad(f"malformed header entry for tensor {name!r}: {entry!r}")
        if end > data_bytes:
            raise bad(
                f"tensor {name!r} ends at byte {end} of the data section, which holds only "
                f"{data_bytes} bytes (truncated download?)"
            )
        tensors[name] = _Tensor(rel, dtype, shape)
    return _WeightFile(size, xxh3_hex(prefix + header), tensors)


def _cache_origin(path: Path) -> tuple[str | None, str | None]:
    """(repo id, commit) when ``path`` is a snapshot folder of the Hugging Face cache."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and _COMMIT.match(parts[-1]):
        match = _CACHE_SNAPSHOT.match(parts[-3])
        if match:
            return f"{match['org']}/{match['name']}", parts[-1]
    return None, None


def _normalize_quant_method(
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
        cached_repo, cached_commit = _cache_origin(self.path)
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
        self.config: dict[str, Any] = _read_json_object(config_path)
        #: the language model's config: the nested ``text_config`` of a VLM checkpoint
        self.text_config: dict[str, Any] = self._text_config()
        vision = self.config.get("vision_config")
        self.vision_config: dict[str, Any] | None = vision if isinstance(vision, dict) else None

        self._files: dict[str, _WeightFile] = {}
        self._tensors: dict[str, _Tensor] = {}
        self._open_weights()
        self._keys = sorted(self._tensors)
        self._handles: dict[str, Any] = {}

        self.resources: dict[str, bytes] = self._read_resources()
        self.quantization: dict[str, Any] | None
        self.quant_method: str | None
        self._read_quantization()

    # -- config ------------------------------------------------------------------------------

    def _text_config(self) -> dict[str, Any]:
        nested = self.config.get("text_config")
        if not isinstance(nested, dict):
            return self.config
        text = dict(nested)
        # VLM wrappers (qwen3_5, qwen3_5_moe) keep tie_word_embeddings at the top level only.
        if "tie_word_embeddings" not in text and "tie_word_embeddings" in self.config:
            text["tie_word_embeddings"] = self.config["tie_word_embeddings"]
        return text

    def _read_quantization(self) -> None:
        raw = self.config.get("quantization_config")
        if not isinstance(raw, dict):
            raw = self.text_config.get("quantization_config")
        modelopt_path = self.path / "hf_quant_config.json"
        modelopt = _read_json_object(modelopt_path) if modelopt_path.is_file() else None
        quant = raw if isinstance(raw, dict) else modelopt
        #: config.json's ``quantization_config``, else ``hf_quant_config.json``; None if neither
        self.quantization = quant
        #: "modelopt", "compressed-tensors", or None (unquantized or a method we cannot import)
        self.quant_method = _normalize_quant_method(
            raw if isinstance(raw, dict) else None, modelopt is not None
        )

    # -- weights -----------------------------------------------------------------------------

    def _open_weights(self) -> None:
        index_path = self.path / INDEX_NAME
        if index_path.is_file():
            self._open_indexed(index_path)
        else:
            self._open_scanned()

    def _open_indexed(self, index_path: Path) -> None:
        index = _read_json_object(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise SourceError(f"{index_path}: 'weight_map' must map tensor names to file names")
        files = sorted(set(weight_map.values()))
        for rel in files:
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise SourceError(f"{index_path} names {rel!r}, which is outside the directory")
        missing = [rel for rel in files if not (self.path / rel).is_file()]
        if missing:
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            raise SourceError(
                f"{index_path} lists {len(missing)} weight file(s) missing from {self.path}: "
                f"{shown} (incomplete download?)"
            )
        for rel in files:
            self._files[rel] = read_safetensors_header(self.path / rel, rel)
        for name, rel in weight_map.items():
            entry = self._files[rel].tensors.get(name)
            if entry is None:
                raise SourceError(
                    f"{index_path} places tensor {name!r} in {rel}, but that file does not hold it"
                )
            self._tensors[name] = entry

    def _open_scanned(self) -> None:
        paths = sorted(self.path.glob("*.safetensors"))
        if not paths:
            raise SourceError(f"{self.path} has no *.safetensors files (and no {INDEX_NAME})")
        for path in paths:
            weight_file = read_safetensors_header(path, path.name)
            self._files[path.name] = weight_file
            for name, entry in weight_file.tensors.items():
                other = self._tensors.get(name)
                if other is not None:
                    raise SourceError(
                        f"tensor {name!r} is stored in both {other.file} and {path.name} in "
                        f"{self.path}; without {INDEX_NAME} the files must not overlap "
                        "(remove the stale copy or add an index)"
                    )
                self._tensors[name] = entry

    def _entry(self, name: str) -> _Tensor:
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

    # -- resources ---------------------------------------------------------------------------

    def _read_resources(self) -> dict[str, bytes]:
        resources: dict[str, bytes] = {}
        for role in RESOURCE_FILES:
            path = self.path / role
            if path.is_file():
                try:
                    resources[role] = path.read_bytes()
                except OSError as exc:
                    raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if "chat_template.jinja" not in resources:
            template = self._embedded_chat_template()
            if template is not None:
                resources["chat_template.jinja"] = template.encode("utf-8")
        return resources

    def _embedded_chat_template(self) -> str | None:
        """The chat template older checkpoints keep inside a JSON file instead of a .jinja file.

        transformers < 4.43 wrote it into ``tokenizer_config.json``; processors of VLMs wrote
        ``chat_template.json``. A list of named templates (the multi-template form) yields the
        one named "default".
        """
        for file_name in ("tokenizer_config.json", "chat_template.json"):
            path = self.path / file_name
            if not path.is_file():
                continue
            template = _read_json_object(path).get("chat_template")
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
