"""``ninfer-convert`` as a user meets it: one-line errors, an intact target, honest messages."""

from __future__ import annotations

import errno
import json
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

import ninfer_format.writer as writer
from ninfer_convert.cli import main as convert_cli
from ninfer_convert.pipeline import convert, report_path
from ninfer_convert.recipe import available_recipes, load_recipe
from ninfer_format import Artifact

RECIPE = "tiny_q8"


class RecordingBars:
    """A progress-bar factory that keeps, per bar, its description, total and sum of steps."""

    def __init__(self):
        self.bars: list[list] = []

    @contextmanager
    def __call__(self, total, description, unit="B"):
        bar = [description, total, 0]
        self.bars.append(bar)
        yield lambda n, note="": bar.__setitem__(2, bar[2] + n)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_dense):
    """A finished conversion, sharded, whose files each test copies; and its progress."""
    folder = tmp_path_factory.mktemp("converted")
    bars = RecordingBars()
    out = folder / "m.ninfer"
    convert(RECIPE, {"base": str(tiny_dense)}, out, shard_limit=1 << 18, progress=bars)
    return folder, bars


@pytest.fixture
def existing(tmp_path, converted):
    """The target folder holding an earlier conversion: returns the entry path."""
    for f in converted[0].iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path / "m.ninfer"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


def _run(*args: object):
    return CliRunner().invoke(convert_cli, [str(a) for a in args])


def _convert_again(out: Path, source: Path, *extra: str):
    return _run("--recipe", RECIPE, "--source", source, "-o", out, "--quiet", *extra)


def _os_error(code: int, filename: object = None):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code), None if filename is None else str(filename))

    return fail


def _fail_on_rename_to(target: Path, code: int):
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst) == target:
            raise OSError(code, os.strerror(code), str(src), None, str(dst))
        return real(src, dst, *args, **kwargs)

    return replace


INJECTIONS = {
    "read-only folder": lambda out: (writer, "create_locked", _os_error(errno.EROFS, out)),
    "disk full": lambda out: (writer.ArtifactWriter, "_emit", _os_error(errno.ENOSPC)),
    "I/O error at the swap": lambda out: (os, "replace", _fail_on_rename_to(out, errno.EIO)),
}


@pytest.mark.parametrize("injection", INJECTIONS)
def test_os_errors_are_one_line_and_leave_the_target(existing, tiny_dense, monkeypatch, injection):
    before = _snapshot(existing.parent)
    monkeypatch.setattr(*INJECTIONS[injection](existing))
    result = _convert_again(existing, tiny_dense, "--force")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # no traceback
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ninfer-convert: error: {existing}: cannot write (")
    assert lines[0].endswith("; the target is unchanged")
    assert _snapshot(existing.parent) == before  # old artifact and its report, nothing else


def test_an_os_error_reading_the_source_is_one_line(existing, tiny_dense, monkeypatch):
    import ninfer_convert.pipeline as pipeline

    shard = tiny_dense / "model.safetensors"
    monkeypatch.setattr(pipeline, "open_sources", _os_error(errno.EIO, shard))
    result = _convert_again(existing, tiny_dense, "--force")
    assert result.exit_code == 1
    assert result.stderr == f"ninfer-convert: error: {shard}: Input/output error\n"


def test_a_report_never_describes_another_artifact(existing, tiny_dense, monkeypatch):
    """The report is swapped with the artifact: an error after the entry rename leaves the new
    artifact without a report, never beside the old one's."""
    report = report_path(existing)
    old_report = report.read_text()
    monkeypatch.setattr(os, "replace", _fail_on_rename_to(report, errno.EIO))
    result = _convert_again(existing, tiny_dense, "--force")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"ninfer-convert: error: {existing}: published, but a ")
    assert not report.exists() and old_report
    with Artifact.open(existing) as art:
        assert sorted(p.name for p in existing.parent.iterdir()) == [f.path.name for f in art.files]


def test_existing_output_names_force_then_force_replaces_it(existing, tiny_dense):
    result = _convert_again(existing, tiny_dense)
    assert result.exit_code == 1
    assert result.stderr == (
        f"ninfer-convert: error: {existing}: already exists; add --force to replace it\n"
    )
    result = _convert_again(existing, tiny_dense, "--force")
    assert result.exit_code == 0, result.output
    report = report_path(existing)
    assert result.stdout.strip() == f"wrote {existing} (report: {report})"
    with Artifact.open(existing) as art:
        assert json.loads(report.read_text())["artifact_id"] == art.artifact_id.hex()
        expected = sorted([f.path.name for f in art.files] + [report.name])
    assert sorted(p.name for p in existing.parent.iterdir()) == expected  # old parts gone


def test_list_recipes_shows_whole_descriptions():
    result = _run("--list-recipes")
    assert result.exit_code == 0
    listed = " ".join(result.stdout.split())
    for name in available_recipes():
        first_paragraph = load_recipe(name).description.split("\n\n")[0]
        assert f"{name} {' '.join(first_paragraph.split())}" in listed


def test_progress_reaches_the_totals(converted, tiny_dense):
    """convert and verify drive their bars to exactly the totals they announce."""
    from ninfer_convert.verify import verify_against_source

    folder, bars = converted
    verify_against_source(folder / "m.ninfer", {"base": str(tiny_dense)}, progress=bars)
    assert [b[0] for b in bars.bars] == ["converting", "checking bytes", "comparing"]
    assert all(total == done > 0 for _, total, done in bars.bars), bars.bars
