"""The kept-block copy of ``gguf_import`` (``block_copy``): stored bytes streamed from the GGUF
file through one buffer into the writer.

The tiny GGUF of ``test_gguf_import`` is converted with a buffer of under 1000 bytes, so every
object takes many chunks and most chunks end inside a row range, and a query parameter's
per-head row ranges (pieces) share a chunk. The expected object is the selected rows of
``raw_blocks`` (the memory-mapped view) concatenated, built here without the copier.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner

from ninfer_convert import block_copy
from ninfer_convert.cli import main as convert_cli
from ninfer_convert.errors import SourceError
from ninfer_convert.pipeline import convert, open_sources, plan, prepare
from ninfer_convert.recipe import load_recipe
from ninfer_convert.sources import GgufSource
from ninfer_format import Artifact
from ninfer_format.verify import verify

from .test_gguf_import import build_gguf, config_only

RECIPE = "qwen3_8_27b_gguf"
SMALL_CHUNK = 997  # bytes: rounded down to whole blocks, never a divisor of a row range


@pytest.fixture(scope="module")
def tiny(tiny_dense, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("gguf_copy")
    build_gguf(tiny_dense, root / "tiny.gguf")
    return {"base": str(config_only(tiny_dense, root / "base")), "gguf": str(root / "tiny.gguf")}


class Bars:
    """Records each bar's total and every step."""

    def __init__(self) -> None:
        self.bars: list[tuple[str, int, str, list[int]]] = []

    @contextmanager
    def __call__(self, total: int, description: str, unit: str = "B"):
        steps: list[int] = []
        self.bars.append((description, total, unit, steps))
        yield lambda n, note="": steps.append(n)


def _expected_objects(specs: dict[str, str]) -> dict[str, bytes]:
    """Each gguf_import parent's bytes: its members' selected rows of the stored blocks."""
    recipe = load_recipe(RECIPE)
    prepared = prepare(recipe, open_sources(specs, recipe))
    parents = plan(prepared)[0]
    source = prepared.sources["gguf"]
    out = {}
    for parent in parents:
        if parent.choice.method != "gguf_import":
            continue
        rows = [
            source.raw_blocks(piece.tensor)[piece.rows[0] : piece.rows[1]]
            for member in parent.stacked
            for piece in member.pieces
        ]
        out[parent.id] = np.concatenate(rows).tobytes()
    return out


def test_a_many_chunk_copy_keeps_every_byte_and_checksum(tiny, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(block_copy, "COPY_BYTES", SMALL_CHUNK)
    bars = Bars()
    out = tmp_path / "small.ninfer"
    report = convert(RECIPE, tiny, out, progress=bars)
    expected = _expected_objects(tiny)
    multi_piece = [
        o
        for o in report.objects
        if o.get("method") == "gguf_import" and "query" in o["parameters"][0]
    ]
    assert multi_piece, "a parent made of several row ranges is part of the test"
    with Artifact.open(out) as art:
        checked = verify(art, strict=True)
        assert checked.ok and checked.checksummed == len(art.objects), checked.errors
        recorded = art.provenance["checksums"]
        for object_id, data in expected.items():
            assert len(data) > 2 * SMALL_CHUNK, object_id  # several chunks each
            assert art.raw(object_id).tobytes() == data, object_id
            assert recorded[object_id] == xxhash.xxh3_64_hexdigest(data), object_id
    imported = [p for p in report.parameters if p.method == "gguf_import"]
    assert imported and all(p.rmse == p.max_abs == p.relative == 0 for p in imported)
    # one bar over bytes, stepped chunk by chunk, ending exactly at its total
    ((description, total, unit, steps),) = bars.bars
    assert (description, unit) == ("converting", "B")
    assert sum(steps) == total == sum(o["bytes"] for o in report.objects if o["kind"] == "tensor")
    assert len(steps) > sum(len(d) for d in expected.values()) // SMALL_CHUNK


def test_the_buffer_size_does_not_change_the_artifact(tiny, tmp_path, monkeypatch) -> None:
    convert(RECIPE, tiny, tmp_path / "big.ninfer")
    monkeypatch.setattr(block_copy, "COPY_BYTES", SMALL_CHUNK)
    convert(RECIPE, tiny, tmp_path / "small.ninfer")
    with (
        Artifact.open(tmp_path / "big.ninfer") as big,
        Artifact.open(tmp_path / "small.ninfer") as small,
    ):
        assert big.provenance["checksums"] == small.provenance["checksums"]


def test_a_nan_block_scale_shows_in_the_report_and_in_verify(tiny, tmp_path, monkeypatch) -> None:
    """A NaN ``d`` in a late block of a kept tensor (past the first chunks): the report says
    NaN for that parameter alone, as decoding it would, and verify flags the object."""
    bad = tmp_path / "nan.gguf"
    bad.write_bytes(Path(tiny["gguf"]).read_bytes())
    name = "blk.1.ffn_down.weight"  # Q5_K, one 176-byte block per row, d at byte 0
    _, offset, _ = GgufSource(bad).block_range(name, 100, 101)
    with bad.open("r+b") as fh:
        fh.seek(offset)
        fh.write(np.array([0x7E00], "<u2").tobytes())  # binary16 NaN
    monkeypatch.setattr(block_copy, "COPY_BYTES", SMALL_CHUNK)
    out = tmp_path / "nan.ninfer"
    report = convert(RECIPE, {**tiny, "gguf": str(bad)}, out)
    errors = {p.name: (p.rmse, p.max_abs, p.relative) for p in report.parameters}
    assert all(np.isnan(errors["text/layers/1/mlp/down"]))
    assert errors["text/layers/2/mlp/down"] == (0.0, 0.0, 0.0)
    with Artifact.open(out) as art:
        findings = verify(art)
    assert not findings.ok
    assert any("NaN or Inf `d` scale" in e and "row 100" in e for e in findings.errors)


def test_a_cut_gguf_is_refused_in_one_line(tiny, tmp_path) -> None:
    cut = tmp_path / "cut.gguf"
    data = Path(tiny["gguf"]).read_bytes()
    cut.write_bytes(data[: len(data) - 4096])
    out = tmp_path / "cut.ninfer"
    args = ["--recipe", RECIPE, "--source", f"base={tiny['base']}", "--source", f"gguf={cut}"]
    result = CliRunner().invoke(convert_cli, [*args, "-o", str(out), "--quiet"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "cut.gguf" in lines[0] and "truncated" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_a_file_cut_after_opening_is_refused_in_one_line(tiny, tmp_path) -> None:
    """The copy reads the file itself, not the map made when it was opened: a file that
    shrank since is one SourceError naming it and where it ends."""
    cut = tmp_path / "shrinks.gguf"
    cut.write_bytes(Path(tiny["gguf"]).read_bytes())
    source = GgufSource(cut)
    part, offset, nbytes = source.block_range("blk.3.ffn_down.weight", 0, 128)
    with cut.open("r+b") as fh:
        fh.truncate(offset + nbytes // 2)
    buffer = bytearray(nbytes)
    with pytest.raises(SourceError, match=rf"shrinks\.gguf: ends at byte {offset + nbytes // 2}"):
        source.read_into(part, offset, memoryview(buffer))
    source.read_into(part, offset, memoryview(buffer)[: nbytes // 2])  # what is left reads


def test_a_file_replaced_after_opening_is_refused_in_one_line(tiny, tmp_path) -> None:
    """The copy opens the path again: a different file now under that name (same size, other
    bytes) is refused rather than copied into the artifact."""
    path = tmp_path / "replaced.gguf"
    data = Path(tiny["gguf"]).read_bytes()
    path.write_bytes(data)
    source = GgufSource(path)
    part, offset, nbytes = source.block_range("blk.3.ffn_down.weight", 0, 128)
    other = tmp_path / "other.gguf"
    other.write_bytes(data[:offset] + bytes(nbytes) + data[offset + nbytes :])
    other.replace(path)
    with pytest.raises(SourceError, match=r"replaced\.gguf: replaced by another file"):
        source.read_into(part, offset, memoryview(bytearray(nbytes)))


def test_a_refused_read_ahead_hint_does_not_stop_the_copy(tiny, monkeypatch) -> None:
    """Some file systems refuse posix_fadvise; the read goes on without the hint."""

    def refuse(*args: object) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr("os.posix_fadvise", refuse, raising=False)
    source = GgufSource(tiny["gguf"])
    part, offset, nbytes = source.block_range("blk.3.ffn_down.weight", 0, 2)
    buffer = bytearray(nbytes)
    source.read_into(part, offset, memoryview(buffer))
    assert bytes(buffer) == Path(tiny["gguf"]).read_bytes()[offset : offset + nbytes]


def test_buffers_are_filled_full_in_order_across_extents() -> None:
    """Every byte of every extent is read once, in order; each buffer but the last is full,
    and a buffer goes on from one extent (or part, or member) into the next."""
    block, capacity = 30, 240
    runs = [
        block_copy.Extent(0, 0, 1000, 10 * block),
        block_copy.Extent(0, 0, 9000, 3 * block),
        block_copy.Extent(1, 1, 60, 20 * block),
    ]
    schedule = block_copy.fills(runs, capacity)
    read = [(r.member, r.part, r.offset + i) for f in schedule for r in f for i in range(r.nbytes)]
    wanted = [(e.member, e.part, e.offset + i) for e in runs for i in range(e.nbytes)]
    assert read == wanted
    for reads in schedule:
        starts = [0]
        for r in reads:
            starts.append(starts[-1] + r.nbytes)
        assert [r.start for r in reads] == starts[:-1]  # back to back from the buffer's start
        assert all(r.nbytes % block == 0 for r in reads)
    assert [sum(r.nbytes for r in f) for f in schedule] == [240, 240, 240, 240, 30]
    assert [len(f) for f in schedule] == [1, 3, 1, 1, 1]  # 60 + 90 + 90 in the second
