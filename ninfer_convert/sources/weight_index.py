"""Which safetensors file of a checkpoint directory holds which tensor.

With ``model.safetensors.index.json`` the index decides: every file it names must exist and
lie inside the directory, and every tensor it places must be in that file's header. Without
one, every ``*.safetensors`` file is read and no tensor name may appear in two of them. Either
way only headers are read, so a broken download fails before any tensor is.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SourceError
from .json_files import read_json_object
from .safetensors_header import HeaderTensor, WeightFile, read_safetensors_header

INDEX_NAME = "model.safetensors.index.json"

#: relative file name -> its header; tensor name -> where it is stored
WeightTable = tuple[dict[str, WeightFile], dict[str, HeaderTensor]]


def read_weight_table(directory: Path) -> WeightTable:
    """The weight files of ``directory`` and the tensors they hold, by index or by scan."""
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        return _read_indexed(directory, index_path)
    return _read_scanned(directory)


def _read_indexed(directory: Path, index_path: Path) -> WeightTable:
    index = read_json_object(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise SourceError(f"{index_path}: 'weight_map' must map tensor names to file names")
    names = sorted(set(weight_map.values()))
    for rel in names:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise SourceError(f"{index_path} names {rel!r}, which is outside the directory")
    missing = [rel for rel in names if not (directory / rel).is_file()]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise SourceError(
            f"{index_path} lists {len(missing)} weight file(s) missing from {directory}: "
            f"{shown} (incomplete download?)"
        )
    files = {rel: read_safetensors_header(directory / rel, rel) for rel in names}
    tensors: dict[str, HeaderTensor] = {}
    for name, rel in weight_map.items():
        entry = files[rel].tensors.get(name)
        if entry is None:
            raise SourceError(
                f"{index_path} places tensor {name!r} in {rel}, but that file does not hold it"
            )
        tensors[name] = entry
    return files, tensors


def _read_scanned(directory: Path) -> WeightTable:
    paths = sorted(directory.glob("*.safetensors"))
    if not paths:
        raise SourceError(f"{directory} has no *.safetensors files (and no {INDEX_NAME})")
    files: dict[str, WeightFile] = {}
    tensors: dict[str, HeaderTensor] = {}
    for path in paths:
        weight_file = read_safetensors_header(path, path.name)
        files[path.name] = weight_file
        for name, entry in weight_file.tensors.items():
            other = tensors.get(name)
            if other is not None:
                raise SourceError(
                    f"tensor {name!r} is stored in both {other.file} and {path.name} in "
                    f"{directory}; without {INDEX_NAME} the files must not overlap "
                    "(remove the stale copy or add an index)"
                )
            tensors[name] = entry
    return files, tensors
