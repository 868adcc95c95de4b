"""Publishing is atomic: whatever instant a writer dies, the target is the old or the new
artifact, whole, and the next run of the same target succeeds and removes what was left.

Failures are injected at every call that changes the directory (``os.replace``, ``os.rename``,
``os.unlink``): as an exception (I/O error, Ctrl-C) in this process, and as a real kill of a
forked writer (no ``finally``, no cleanup, locks dropped by the kernel).
"""

from __future__ import annotations

import errno
import gc
import json
import os
import shutil
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from ninfer_format import Artifact, ArtifactWriter, TargetExists, TensorSpec, WriteError
from ninfer_format.verify import verify

MUTATIONS = ("replace", "rename", "unlink")
SIDECAR = ".report.json"
OLD = (1).to_bytes(16, "little")  # the artifact id of the one being replaced (seed 1)
#: entry payload 4096 bytes, then parts of 4096 bytes: a 16 KiB tensor spans four files
SHARDED = 8192


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    """Durability is not under test here; fsync would only make each of the runs slow."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture(autouse=True)
def _collector_paused():
    """The patched calls below are process-wide, and the cyclic collector runs finalizers of
    other tests' garbage (``shutil.rmtree`` of a temporary directory) wherever it happens to
    start: one of those would take the injected failure instead of the writer (a Ctrl-C there
    is printed as an ignored exception). Paused, it leaves that garbage for after the test."""
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()


def _values(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"w.{i}": rng.standard_normal(1024).astype(np.float32) for i in range(n)}


def _write(path: Path, seed: int, *, tensors: int, shard_limit: int, overwrite: bool) -> bytes:
    """One artifact of ``tensors`` 4 KiB fp32 tensors and a sidecar naming its id."""
    artifact_id = seed.to_bytes(16, "little")
    values = _values(seed, tensors)
    specs = [TensorSpec(i, (1024,), "fp32", "contiguous_le_v1") for i in values]
    with ArtifactWriter(
        path,
        components={"text": {"config": {"model_type": "toy"}}},
        objects=specs,
        bindings={},
        shard_limit=shard_limit,
        overwrite=overwrite,
        artifact_id=artifact_id,
    ) as writer:
        for object_id, v in values.items():
            writer.write(object_id, v)
        writer.add_sidecar(SIDECAR, json.dumps({"artifact_id": artifact_id.hex()}).encode())
    return artifact_id


def _which(path: Path, versions: dict[bytes, dict[str, np.ndarray]]) -> bytes:
    """The artifact id at ``path``, after checking every byte of it is that version's."""
    with Artifact.open(path) as art:
        assert art.artifact_id in versions, "neither the old nor the new artifact"
        expected = versions[art.artifact_id]
        assert sorted(art.objects) == sorted(expected)
        for object_id, v in expected.items():
            np.testing.assert_array_equal(art.tensor(object_id), v)
        report = verify(art, strict=True)
        assert report.ok and not report.warnings, report.errors + report.warnings
        sidecar = path.with_name(path.name + SIDECAR)
        if sidecar.exists():  # it may be missing after a kill, but never another artifact's
            assert json.loads(sidecar.read_text())["artifact_id"] == art.artifact_id.hex()
        return art.artifact_id


def _listed(path: Path) -> list[str]:
    """The files the entry at ``path`` uses, and its sidecar."""
    with Artifact.open(path) as art:
        return sorted([f.path.name for f in art.files] + [path.name + SIDECAR])


class Injected(BaseException):
    """Raised by a patched call at the chosen moment."""


def _inject(monkeypatch: pytest.MonkeyPatch, at: int, failure) -> dict[str, int]:
    """Make the ``at``-th directory change (counting from 1) of this thread call ``failure``
    instead (another thread's calls are not the writer's)."""
    calls = {"n": 0}
    writer_thread = threading.get_ident()
    for name in MUTATIONS:
        real = getattr(os, name)

        def patched(*args, _real=real, **kwargs):
            if threading.get_ident() != writer_thread:
                return _real(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] == at:
                failure()
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, patched)
    return calls


#: (old artifact, new artifact) as (tensors, shard limit); every pair replaces across layouts
LAYOUTS = {
    "sharded-to-sharded": ((4, SHARDED), (4, SHARDED)),
    "more-parts": ((2, SHARDED), (5, SHARDED)),
    "sharded-to-single": ((4, SHARDED), (3, 0)),
    "single-to-sharded": ((3, 0), (4, SHARDED)),
}


def _setup(tmp_path: Path, layout: str, replaced_before: bool) -> tuple[Path, dict, tuple]:
    """The old artifact in place; ``replaced_before``: it was itself a replacement (so its
    parts carry a generation suffix and the new one gets the plain names)."""
    (old_n, old_limit), new = LAYOUTS[layout]
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "m.ninfer"
    if replaced_before:
        _write(path, 90, tensors=old_n, shard_limit=old_limit, overwrite=False)
    _write(path, 1, tensors=old_n, shard_limit=old_limit, overwrite=True)
    versions = {OLD: _values(1, old_n)}
    versions[(2).to_bytes(16, "little")] = _values(2, new[0])
    return path, versions, new


def _count_mutations(tmp_path: Path, layout: str, replaced_before: bool, monkeypatch) -> int:
    path, _, (n, limit) = _setup(tmp_path / "count", layout, replaced_before)
    with monkeypatch.context() as m:
        calls = _inject(m, 0, lambda: None)
        _write(path, 2, tensors=n, shard_limit=limit, overwrite=True)
    return calls["n"]


def _rerun_cleans_up(path: Path, tensors: int, shard_limit: int) -> None:
    new_id = _write(path, 3, tensors=tensors, shard_limit=shard_limit, overwrite=True)
    assert _which(path, {new_id: _values(3, tensors)}) == new_id
    assert sorted(p.name for p in path.parent.iterdir()) == _listed(path)


@pytest.fixture(params=[False, True], ids=["plain-names", "generation-names"])
def replaced_before(request):
    return request.param


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "failure",
    [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()],
    ids=["EIO", "ctrl-c"],
)
def test_failure_at_every_directory_change(tmp_path, monkeypatch, layout, replaced_before, failure):
    total = _count_mutations(tmp_path, layout, replaced_before, monkeypatch)
    assert total >= 3
    for at in range(1, total + 1):
        here = tmp_path / str(at)
        path, versions, (n, limit) = _setup(here, layout, replaced_before)

        def fail(failure=failure):
            raise failure

        with monkeypatch.context() as m:
            _inject(m, at, fail)
            try:
                _write(path, 2, tensors=n, shard_limit=limit, overwrite=True)
            except (WriteError, KeyboardInterrupt) as exc:
                if isinstance(exc, WriteError):
                    assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        if _which(path, versions) == OLD:  # a failure (not a kill) puts the old sidecar back
            assert path.with_name(path.name + SIDECAR).exists()
        _rerun_cleans_up(path, n, limit)


def test_the_failure_lands_in_the_writer_not_in_another_tests_leftovers(tmp_path, monkeypatch):
    """Other code in this process makes directory changes too: here a finalizer that removes
    an earlier test's temporary directory, run by the cyclic collector in the middle of the
    write (a Ctrl-C landing there is printed as an ignored exception, and the writer runs on
    unharmed). The injected failure is the writer's all the same."""
    path, versions, (n, limit) = _setup(tmp_path / "target", "sharded-to-sharded", False)
    leftover = tmp_path / "leftover"
    leftover.mkdir()
    (leftover / "file").write_bytes(b"x")

    class Cycle:
        pass

    garbage = Cycle()
    garbage.itself = garbage  # only the cyclic collector frees it
    weakref.finalize(garbage, shutil.rmtree, leftover, True)
    del garbage
    thresholds = gc.get_threshold()

    def interrupt():
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        _inject(m, 1, interrupt)
        gc.set_threshold(1)  # a collection at (nearly) every allocation, when enabled
        try:
            with pytest.raises(KeyboardInterrupt):
                _write(path, 2, tensors=n, shard_limit=limit, overwrite=True)
        finally:
            gc.set_threshold(*thresholds)
    assert _which(path, versions) == OLD
    gc.collect()
    assert not leftover.exists()  # collected once the writer is done


def _killed_writer(path: Path, at: int, tensors: int, shard_limit: int) -> int:
    """Fork a writer that dies (``os._exit``, no cleanup) at its ``at``-th directory change."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns into pytest
        try:
            mp = pytest.MonkeyPatch()
            _inject(mp, at, lambda: os._exit(137))
            _write(path, 2, tensors=tensors, shard_limit=shard_limit, overwrite=True)
            os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kill_at_every_directory_change(tmp_path, monkeypatch, layout, replaced_before):
    total = _count_mutations(tmp_path, layout, replaced_before, monkeypatch)
    seen = set()
    for at in range(1, total + 2):  # total + 1: the writer runs to the end
        here = tmp_path / str(at)
        path, versions, (n, limit) = _setup(here, layout, replaced_before)
        code = _killed_writer(path, at, n, limit)
        assert code == (0 if at > total else 137)
        seen.add(_which(path, versions))
        _rerun_cleans_up(path, n, limit)
    assert seen == set(versions), "the kills should land both before and after the swap"


def test_replacement_keeps_the_spec_names_when_they_are_free(tmp_path):
    path = tmp_path / "m.ninfer"
    _write(path, 1, tensors=4, shard_limit=SHARDED, overwrite=False)
    plain = _listed(path)
    assert "m.ninfer.part-0001" in plain
    _write(path, 2, tensors=4, shard_limit=SHARDED, overwrite=True)
    renamed = _listed(path)
    assert not set(renamed) & set(plain) - {"m.ninfer", "m.ninfer" + SIDECAR}
    assert all(n.startswith("m.ninfer.part-0") for n in renamed if "part" in n)
    _write(path, 3, tensors=4, shard_limit=SHARDED, overwrite=True)
    assert _listed(path) == plain  # the plain names were free again
    assert sorted(p.name for p in tmp_path.iterdir()) == plain


def test_refusal_leaves_the_target_and_names_the_argument(tmp_path):
    path = tmp_path / "m.ninfer"
    old = _write(path, 1, tensors=4, shard_limit=SHARDED, overwrite=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(TargetExists) as err:
        _write(path, 2, tensors=4, shard_limit=SHARDED, overwrite=False)
    assert str(err.value) == f"{path}: already exists (overwrite=True replaces it)"
    assert _which(path, {old: _values(1, 4)}) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_stale_temp_files_of_a_killed_run_are_removed_by_the_next(tmp_path):
    path = tmp_path / "m.ninfer"
    _write(path, 1, tensors=4, shard_limit=SHARDED, overwrite=False)
    assert _killed_writer(path, 1, 4, SHARDED) == 137  # dies before its first rename
    stale = sorted(p.name for p in tmp_path.glob(".m.ninfer*.tmp-*"))
    assert len(stale) == 5  # entry, three parts, sidecar: all full size
    unrelated = tmp_path / ".other.ninfer.tmp-0123abcd"
    unrelated.write_bytes(b"x")
    live = ArtifactWriter(
        path,
        components={"text": {"config": {"model_type": "toy"}}},
        objects=[TensorSpec("w", (4,), "fp32", "contiguous_le_v1")],
        bindings={},
        overwrite=True,
    )
    try:
        temps = list(tmp_path.glob(".m.ninfer*.tmp-*"))
        assert not {p.name for p in temps} & set(stale)  # removed when the next run started
        assert len(temps) == 1  # its own entry, which a concurrent run must leave alone
        _write(path, 3, tensors=4, shard_limit=SHARDED, overwrite=True)
        assert temps[0].exists(), "a live writer's temporary file was removed"
    finally:
        live.abort()
    assert unrelated.exists()  # another target's file is never touched


def test_names_too_long_for_the_file_system_are_refused_before_writing(tmp_path):
    path = tmp_path / ("m" * 235 + ".ninfer")  # 242 bytes: the entry fits, its parts do not
    with pytest.raises(WriteError, match=r"is too long: its temporary name takes \d+ bytes, the"):
        _write(path, 1, tensors=4, shard_limit=SHARDED, overwrite=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "error", [errno.ENOSPC, errno.EIO, errno.EROFS], ids=["ENOSPC", "EIO", "EROFS"]
)
@pytest.mark.parametrize("where", ["open", "write", "fsync"])
def test_os_errors_are_one_line_write_errors(tmp_path, monkeypatch, error, where):
    path = tmp_path / "m.ninfer"
    old = _write(path, 1, tensors=4, shard_limit=SHARDED, overwrite=False)
    before = sorted(p.name for p in tmp_path.iterdir())

    def fail(*args, **kwargs):
        raise OSError(error, os.strerror(error))

    import ninfer_format.writer as writer

    if where == "open":
        monkeypatch.setattr(writer, "create_locked", fail)
    elif where == "write":
        monkeypatch.setattr(writer.ArtifactWriter, "_emit", fail)
    else:
        monkeypatch.setattr(writer.os, "fsync", fail)
    with pytest.raises(WriteError) as err:
        _write(path, 2, tensors=4, shard_limit=SHARDED, overwrite=True)
    message = str(err.value)
    assert message.startswith(f"{path}: cannot write (") and os.strerror(error) in message
    assert message.endswith("the target is unchanged") and "\n" not in message
    assert _which(path, {old: _values(1, 4)}) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == before
