"""Test helpers: write raw file sets byte by byte, independent of the project's writer."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ninfer_format import ArtifactWriter, ResourceSpec, TensorSpec
from ninfer_format.codecs import codec_for
from ninfer_format.framing import ENTRY_MAGIC, PART_MAGIC, align_up

EXAMPLES = Path(__file__).resolve().parents[2] / "tests" / "data" / "spec-examples"
ARTIFACT_ID = bytes(range(16))


def load_example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text())


def write_raw(
    entry: Path,
    document: dict[str, Any] | bytes,
    payload: dict[int, bytes] | None = None,
    *,
    json_bytes: int | None = None,
    artifact_id: bytes = ARTIFACT_ID,
) -> None:
    """Write a file set for ``document`` with sparse zero payload plus ``payload`` patches.

    ``payload`` maps logical offsets to bytes. ``json_bytes`` pads the JSON with spaces (the
    upstream examples use 65504).
    """
    text = document if isinstance(document, bytes) else json.dumps(document).encode()
    json_bytes = json_bytes or len(text)
    text = text + b" " * (json_bytes - len(text))
    files = document["files"] if isinstance(document, dict) else [{"path": None}]
    sizes = [f.get("payload_bytes", 0) for f in files]
    start = align_up(32 + json_bytes, 4096)
    handles = []
    with entry.open("wb") as fh:
        fh.write(ENTRY_MAGIC + struct.pack("<Q", json_bytes) + artifact_id + text)
        fh.truncate(start + sizes[0])
    handles.append((entry, start))
    for i, f in enumerate(files[1:], start=1):
        part = entry.with_name(f["path"])
        with part.open("wb") as fh:
            fh.write(PART_MAGIC + struct.pack("<Q", i) + artifact_id)
            fh.truncate(4096 + sizes[i])
        handles.append((part, 4096))
    logical = [sum(sizes[:i]) for i in range(len(sizes))]
    for offset, data in (payload or {}).items():
        while data:
            i = max(k for k in range(len(sizes)) if logical[k] <= offset)
            room = logical[i] + sizes[i] - offset
            path, first = handles[i]
            with path.open("r+b") as fh:
                fh.seek(first + offset - logical[i])
                fh.write(data[:room])
            offset, data = offset + room, data[room:]


RNG = np.random.default_rng(0)


def small_artifact(path, *, shard_limit=0, tensors=None, **kwargs):
    """A directory of a few tensors plus one resource; returns the values written."""
    custom = tensors is not None
    tensors = tensors or {
        "w.a": ((4, 8), "bf16", "contiguous_le_v1"),
        "w.b": ((3, 130), "q5_g64_fp16", "row_split_k128_v1"),
        "w.c": ((), "fp32", "contiguous_le_v1"),
        "w.d": ((128, 64), "nvfp4", "block_scale_k16_m128x4_v1"),
    }
    tokenizer = b'{"model": "tiny"}'
    specs = [ResourceSpec("r.tok", "raw_bytes_v1", len(tokenizer))]
    specs += [TensorSpec(i, shape, f, lay) for i, (shape, f, lay) in tensors.items()]
    encoded = {"r.tok": tokenizer}
    for i, (shape, f, lay) in tensors.items():
        values = RNG.standard_normal(shape).astype(np.float32)
        encoded[i] = codec_for(f, lay).encode(values)
    components = {
        "text": {"config": {"model_type": "toy"}, "resources": {"tokenizer.json": "r.tok"}}
    }
    bindings = {
        "p.a": {"object": "w.a"},
        "p.ab": {
            "parts": [{"object": "w.a", "range": [8, 16]}, {"object": "w.b", "range": [0, 130]}]
        },
    }
    uses = [{"parameter": "p.a", "input": "x", "activation_policy": "A16Only"}]
    if custom:
        bindings, uses = {}, []
    with ArtifactWriter(
        path,
        components=components,
        objects=specs,
        bindings=bindings,
        uses=uses,
        metadata={"name": "toy"},
        shard_limit=shard_limit,
        **kwargs,
    ) as w:
        for spec in specs:
            w.write(spec.id, encoded[spec.id])
    return encoded
