"""``RowReader``: rows read by their byte ranges equal the whole object's decoded rows; ranges
the page cache holds are copied by the calling thread (no pool of threads contending for the
interpreter's lock), the ones that would wait for the disk are read after, and a file system
that refuses cached-only reads is read as before."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from ninfer_format import Artifact, ArtifactWriter, TensorSpec
from ninfer_format.codecs import codec_for
from ninfer_runtime import row_reader
from ninfer_runtime.row_reader import RowReader

ROWS, WIDTH = 600, 64


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """An artifact of one bf16 [ROWS, WIDTH] table bound whole as ``p.t``, and its values."""
    path = tmp_path_factory.mktemp("rows") / "t.ninfer"
    values = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32)
    codec = codec_for("bf16", "contiguous_le_v1")
    encoded = codec.encode(values)
    with ArtifactWriter(
        path,
        components={"text": {"config": {"model_type": "toy"}}},
        objects=[TensorSpec("w.t", (ROWS, WIDTH), "bf16", "contiguous_le_v1")],
        bindings={"p.t": {"object": "w.t"}},
        uses=[],
        metadata={"name": "toy"},
    ) as w:
        w.write("w.t", encoded)
    artifact = Artifact.open(path)
    return artifact, codec.decode(encoded, (ROWS, WIDTH))


def scattered(n: int) -> np.ndarray:
    """``n`` distinct rows, none adjacent: ``n`` ranges."""
    return np.arange(0, 2 * n, 2)


def test_scattered_rows_equal_the_decoded_tables_rows(table):
    artifact, whole = table
    rows = scattered(row_reader.PARALLEL_RANGES + 10)
    reader = RowReader(artifact, "p.t")
    np.testing.assert_array_equal(reader.read(rows), whole[rows])
    assert reader.counters.ranges == rows.size and reader.counters.rows == rows.size


def test_cached_ranges_are_read_without_the_threads(table, monkeypatch):
    """Many ranges, every one held by the page cache (a file system answering cached-only
    reads in full, whatever this machine's temporary directory offers): one thread."""
    artifact, whole = table
    preadv = os.preadv
    asked_nowait = []

    def all_cached(fd, buffers, offset, flags=0):
        asked_nowait.append(bool(flags))
        return preadv(fd, buffers, offset)

    def no_threads():
        raise AssertionError("cached ranges went to the thread pool")

    monkeypatch.setattr(row_reader, "NOWAIT", 8)
    monkeypatch.setattr(row_reader.os, "preadv", all_cached)
    monkeypatch.setattr(row_reader, "_readers", no_threads)
    rows = scattered(row_reader.PARALLEL_RANGES * 2)
    np.testing.assert_array_equal(RowReader(artifact, "p.t").read(rows), whole[rows])
    assert asked_nowait == [True] * rows.size  # each range asked once, cached-only


def test_ranges_that_would_wait_are_read_after(table, monkeypatch):
    """Every other range 'not cached': those are read the ordinary way, in threads when
    there are enough of them, and the values are the table's."""
    artifact, whole = table
    preadv = os.preadv
    asked_nowait = []

    def half_cached(fd, buffers, offset, flags=0):
        if flags:
            asked_nowait.append(offset)
            if len(asked_nowait) % 2:
                raise BlockingIOError(errno.EAGAIN, "would block")
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(row_reader, "NOWAIT", 8)
    monkeypatch.setattr(row_reader.os, "preadv", half_cached)
    rows = scattered(row_reader.PARALLEL_RANGES * 3)
    np.testing.assert_array_equal(RowReader(artifact, "p.t").read(rows), whole[rows])
    assert len(asked_nowait) == rows.size


def test_a_file_system_without_cached_only_reads_is_read_as_before(table, monkeypatch):
    artifact, whole = table
    preadv = os.preadv

    def refused(fd, buffers, offset, flags=0):
        if flags:
            raise OSError(errno.EOPNOTSUPP, "not supported")
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(row_reader, "NOWAIT", 8)
    monkeypatch.setattr(row_reader.os, "preadv", refused)
    reader = RowReader(artifact, "p.t")
    rows = scattered(20)
    np.testing.assert_array_equal(reader.read(rows), whole[rows])
    assert not reader._nowait  # asked once, then never again
    np.testing.assert_array_equal(reader.read(rows + 1), whole[rows + 1])
