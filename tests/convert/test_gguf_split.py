"""A split GGUF (gguf-py's writer with ``split_max_tensors``, named as llama.cpp's gguf-split
names the parts): given its first part, every part's tensors are read, and the conversion
equals the single file's."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ninfer_convert.errors import SourceError
from ninfer_convert.pipeline import convert
from ninfer_convert.sources import GgufSource
from ninfer_format import Artifact

from .test_gguf_import import build_gguf, config_only
from .test_gguf_lone import metadata


@pytest.fixture(scope="module")
def files(tiny_dense, tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    meta = metadata(tiny_dense)
    whole = build_gguf(tiny_dense, root / "whole.gguf", faithful=True, extra=meta).path
    first = build_gguf(tiny_dense, root / "tiny.gguf", faithful=True, extra=meta, split=20).path
    return whole, first, config_only(tiny_dense, root / "base")


def test_the_parts_hold_what_the_single_file_holds(files) -> None:
    whole, first, _ = files
    one, split = GgufSource(whole), GgufSource(first)
    parts = split.provenance()["files"]
    assert len(parts) >= 3 and first.name in parts
    assert split.keys() == one.keys()
    for name in one.keys():  # noqa: SIM118 (a source, not a dict)
        np.testing.assert_array_equal(split.raw_blocks(name), one.raw_blocks(name))
    assert split.get("qwen35.embedding_length") == one.get("qwen35.embedding_length")


def test_a_split_gguf_converts_as_the_single_file(files, tmp_path) -> None:
    whole, first, base = files
    for name, gguf in (("whole", whole), ("split", first)):
        convert("qwen3_8_27b_gguf", {"base": str(base), "gguf": str(gguf)}, tmp_path / name)
    convert("qwen3_8_27b_gguf", {"base": str(first)}, tmp_path / "alone")  # metadata: part 1
    with (
        Artifact.open(tmp_path / "whole") as a,
        Artifact.open(tmp_path / "split") as b,
        Artifact.open(tmp_path / "alone") as c,
    ):
        assert set(a.bindings) == set(b.bindings) == set(c.bindings)
        for name in a.bindings:
            np.testing.assert_array_equal(a.parameter(name), b.parameter(name))
            np.testing.assert_array_equal(a.parameter(name), c.parameter(name))


def test_a_later_part_or_a_missing_one_is_refused(files, tmp_path) -> None:
    _, first, _ = files
    second = first.with_name(first.name.replace("-00001-of-", "-00002-of-"))
    with pytest.raises(SourceError, match=r"is part 2 of a \d+-part GGUF: give the first part"):
        GgufSource(second)
    lonely = tmp_path / first.name
    shutil.copy(first, lonely)  # the first part without the others beside it
    with pytest.raises(SourceError, match=r"-00002-of-\d{5}\.gguf: no such GGUF file"):
        GgufSource(lonely)
