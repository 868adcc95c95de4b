"""benchmarks/gguf_import_bench.py: what a run leaves behind in a working directory."""

from __future__ import annotations

from tests.benchmarks import load_benchmark


def _bench():
    return load_benchmark("gguf_import_bench")


def test_a_given_workdir_keeps_the_files_the_run_did_not_write(tmp_path) -> None:
    bench = _bench()
    work = tmp_path / "mine"
    (work / "notes").mkdir(parents=True)
    (work / "notes" / "results.md").write_text("earlier numbers")
    (work / "model.gguf").write_bytes(b"not the bench's")
    bench.write_base(work / "base", bench.text_config(4, 1024, 1024))
    for name in ("synthetic.gguf", "synthetic.ninfer", "synthetic.ninfer.conversion.json"):
        (work / name).write_bytes(b"written by the run")
    bench._remove_written(work, made=False)
    left = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    assert left == ["model.gguf", "notes", "notes/results.md"]


def test_a_directory_the_run_made_is_removed_whole(tmp_path) -> None:
    bench = _bench()
    work = tmp_path / "made"
    work.mkdir()
    (work / "synthetic.gguf").write_bytes(b"x")
    bench._remove_written(work, made=True)
    assert not work.exists()
