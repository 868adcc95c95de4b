"""Reliability benchmark: attack ninfer for a bounded time and count what breaks.

Five attack families share the ``--seconds`` budget: each gets an equal share of what is left
when it starts (time one family does not use goes to the next; the server's start-up is shared
by the families that use it) and runs at least one case, so a share shorter than one case is
overrun by that case only.

* ``files``: hostile file sets (truncated, bit-flipped, mutated directory JSON, broken and
  renamed parts, edited checksum keys) opened and used through the library and checked with
  ``ninfer-inspect --verify --strict``. A failure is an exception that is not an
  ``ArtifactError``, a hang, an "internal error" or traceback from the inspector, or a strict
  verify that passes an artifact which then fails to load or leaves objects unchecksummed.
* ``kills``: ``ninfer-convert --force`` of the bundled model over an existing artifact
  (sharded and single-file), killed with SIGKILL at random times, killed at the N-th rename
  and failed with EIO at the N-th rename. A failure is a target that is not the old or the new
  artifact whole, a report that describes another artifact, a traceback for an OS error, or
  stray files that a later completed run leaves in place.
* ``overload``: concurrent chat, responses and messages requests (some abandoned by the
  client) against a live ``ninfer-serve`` with one lane and two queue places, then one large
  prompt. A failure is a 5xx other than 503/504/529, a hang, ``/health`` not answering within
  1 s, or ``ninfer_requests_total`` not counting every request.
* ``bodies``: malformed bodies to every POST endpoint (deep nesting, truncation, huge
  strings, every field given every wrong type, non-UTF-8). A failure is a 5xx, a hang, an
  error body that is not the protocol's JSON error shape with a code, or one that echoes the
  input (over 64 KiB).
* ``schema``: schemathesis against the live server's ``/openapi.json`` with its default
  checks, for the family's share of the budget.

    python benchmarks/reliability.py --seconds 120
    python benchmarks/reliability.py --seconds 600 --only files,bodies --seed 7

Prints one table (family, cases, failures, the first failures with what reproduces them) and
exits 1 when anything failed. docs/reliability.md records the results.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

BUNDLED = ROOT / "models" / "tiny-qwen3_5"
#: Run in this order whatever --only says: the overload family's large prompt may keep the
#: shared server busy for a while, so it comes last.
FAMILIES = ("files", "kills", "bodies", "schema", "overload")
SHOWN_FAILURES = 3


# ------------------------------------------------------------------------------ bookkeeping


@dataclass
class Budget:
    """A deadline on the monotonic clock."""

    deadline: float

    @classmethod
    def of(cls, seconds: float) -> Budget:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def spent(self) -> bool:
        return self.left() <= 0


@dataclass
class Tally:
    family: str
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def case(self, problem: str | None = None) -> None:
        """Count one case; ``problem`` (with its reproduction) makes it a failure."""
        with self._lock:
            self.cases += 1
            if problem:
                self.failures.append(problem)

    def count(self, cases: int) -> None:
        """Count cases run elsewhere (their failures come through ``fail``)."""
        with self._lock:
            self.cases += cases

    def fail(self, problem: str) -> None:
        """A failure found outside any single case (e.g. a counter checked at the end)."""
        with self._lock:
            self.failures.append(problem)


def interleaved(*streams: Iterator[Any]) -> Iterator[Any]:
    """One item of each stream in turn; a stream that ends drops out."""
    live = list(streams)
    while live:
        for stream in list(live):
            try:
                yield next(stream)
            except StopIteration:
                live.remove(stream)


def short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} chars)"


# ---------------------------------------------------------------------- 1. hostile file sets


def hostile_file_sets(rng: random.Random) -> Iterator[tuple[str, dict[str, Any]]]:
    """(description, file set) forever: the fuzz tests' named cases once, interleaved with
    random truncations, flips, JSON mutations, renames and checksum-key edits."""
    from tests.format import test_fuzz as fz

    return interleaved(
        _named_cases(fz),
        *(_random(rng, fz, make) for make in (_truncation, _flip, _json_mutation)),
        *(_random(rng, fz, make) for make in (_rename, _checksum_key)),
    )


def _named_cases(fz: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    single, sharded = fz.base("single"), fz.base("sharded")
    for name, edit in fz.TEXT_CASES.items():
        yield (
            f"single, directory text {name!r}",
            {single.entry_name: single.entry_with(edit(fz._text(single)))},
        )
    for name, edit in fz.DOCUMENT_CASES.items():
        doc = edit(copy.deepcopy(single.document))
        yield f"single, document {name!r}", {single.entry_name: single.entry_with(fz.dump(doc))}
    for name, build in fz.FILE_SET_CASES.items():
        yield f"sharded, file set {name!r}", build()
    for kind, fs in (("single", single), ("sharded", sharded)):
        for name, edit in fz.ENTRY_CASES.items():
            yield f"{kind}, entry {name!r}", {**fs.files, fs.entry_name: edit(fs)}
    for name, (edit, _, _) in fz.LAZY_CASES.items():
        doc = copy.deepcopy(single.document)
        edit(doc)
        with tempfile.TemporaryDirectory(prefix="ninfer-reliability-") as d:
            entry = Path(d) / single.entry_name
            fz.write_raw(entry, doc, {0: single.payload}, artifact_id=single.artifact_id)
            yield f"single, object {name!r}", {p.name: p.read_bytes() for p in Path(d).iterdir()}


def _random(rng: random.Random, fz: Any, make: Callable) -> Iterator[tuple[str, dict[str, Any]]]:
    kinds = ["single", "sharded", "zoo", "sample"]
    while True:
        kind = rng.choice(kinds)
        yield make(rng, fz, kind, fz.base(kind))


def _truncation(rng: random.Random, fz: Any, kind: str, fs: Any) -> tuple[str, dict]:
    name = rng.choice(fs.names)
    cut = rng.randrange(len(fs.files[name]))
    return f"{kind}, {name} truncated to {cut} bytes", {**fs.files, name: fs.files[name][:cut]}


def _flip(rng: random.Random, fz: Any, kind: str, fs: Any) -> tuple[str, dict]:
    region, name, start, end = rng.choice(fz._regions(fs))
    count = rng.randint(1, min(8, end - start))
    changes = [(at, rng.randint(1, 255)) for at in rng.sample(range(end - start), count)]
    where = [(start + at, mask) for at, mask in changes]
    files = {**fs.files, name: fz._flipped(fs.files[name], start, changes)}
    return f"{kind}, {name} {region} bytes XORed (offset, mask) {where}", files


def _json_mutation(rng: random.Random, fz: Any, kind: str, fs: Any) -> tuple[str, dict]:
    doc: Any = copy.deepcopy(fs.document)
    ops = []
    for _ in range(rng.randint(1, 3)):
        if not isinstance(doc, dict | list):
            break
        op = _random_op(rng, fz, doc)
        ops.append(op)
        doc = fz.apply(doc, op)
    ascii_only = rng.random() < 0.5
    text = fz.dump(doc, ascii_only=ascii_only)
    return (
        f"{kind}, directory mutated by {short(ops, 300)} (ascii={ascii_only})",
        {**fs.files, fs.entry_name: fs.entry_with(text)},
    )


def _random_op(rng: random.Random, fz: Any, doc: Any) -> tuple:
    path = rng.choice(fz.json_paths(doc))
    target = fz._container(doc, path)
    values = [*fz.NASTY, *fz.STRINGS, *fz.HUGE]
    kinds = ["replace", "replace"] + (["delete"] if path else [])
    if type(target) is int:
        kinds += ["shift", "shift"]
    if isinstance(target, dict):
        kinds.append("add")
    if isinstance(target, list) and len(target) > 1:
        kinds += ["duplicate", "swap"]
    kind = rng.choice(kinds)
    if kind == "replace":
        return (kind, path, copy.deepcopy(rng.choice(values)))
    if kind == "shift":
        return (kind, path, rng.choice([-4097, -256, -17, -1, 1, 17, 255, 256, 4096, 2**64]))
    if kind == "add":
        return (kind, path, rng.choice(fz.MEMBERS), copy.deepcopy(rng.choice(values)))
    if kind == "swap":
        return (kind, path, *rng.sample(range(len(target)), 2))
    if kind == "duplicate":
        return (kind, path, rng.randrange(len(target)))
    return (kind, path)


#: New part names: in the directory any (over 255 bytes too), on disk only creatable ones.
LONG_NAMES = ["x" * 256, "p" * 300, "é" * 130]
SHORT_NAMES = ["renamed.part", "part\x01", " ", "-", "m.ninfer.part-9999"]


def _rename(rng: random.Random, fz: Any, kind: str, fs: Any) -> tuple[str, dict]:
    """The entry renamed on disk, a part renamed on disk, or a part renamed in the directory
    (to names over 255 bytes among others)."""
    how = rng.choice(["entry", "part-on-disk", "part-in-directory"])
    if how == "entry" or len(fs.names) == 1:
        new = rng.choice(["x.ninfer", "m", "y" * 200 + ".ninfer"])
        files = dict(fs.files)
        entry = files.pop(fs.entry_name)
        return f"{kind}, entry renamed to {new!r}", {new: entry, **files}
    index = rng.randrange(1, len(fs.names))
    new = rng.choice(SHORT_NAMES if how == "part-on-disk" else SHORT_NAMES + LONG_NAMES)
    if how == "part-on-disk":
        files = {n: (None if n == fs.names[index] else d) for n, d in fs.files.items()}
        files.setdefault(new, fs.files[fs.names[index]])
        return f"{kind}, {fs.names[index]} renamed on disk to {new!r}", files
    doc = copy.deepcopy(fs.document)
    doc["files"][index]["path"] = new
    files = {**fs.files, fs.entry_name: fs.entry_with(fz.dump(doc))}
    return f"{kind}, files[{index}].path set to {short(new, 40)} in the directory", files


def _checksum_key(rng: random.Random, fz: Any, kind: str, fs: Any) -> tuple[str, dict]:
    """One character of one checksum key changed: that object's checksum names no object."""
    doc = copy.deepcopy(fs.document)
    sums = doc["provenance"]["checksums"]
    key = rng.choice(sorted(sums))
    at = rng.randrange(len(key))
    new = key[:at] + chr(ord(key[at]) ^ 1) + key[at + 1 :]
    sums[new] = sums.pop(key)
    files = {**fs.files, fs.entry_name: fs.entry_with(fz.dump(doc))}
    return f"{kind}, checksum key {key!r} changed to {new!r}", files


def _library_problem(fz: Any, entry: Path) -> str | None:
    """Open and use everything; a non-project exception, a hang, or strict verify passing
    something that then fails to load or is left unchecked."""
    try:
        outcome = fz.touch(entry, seconds=10)
    except (Exception, fz.Hang) as exc:
        return f"library raised {type(exc).__name__}: {short(str(exc))}"
    report = outcome.report
    if report is None or not report.ok or report.warnings or outcome.binder_errors:
        return None  # found invalid: what the library promises
    loads = [f"{step}: {short(str(e), 100)}" for step, e in outcome.failures if step != "verify"]
    if loads:
        return f"strict verify passed, then {loads[0]}"
    with fz.Artifact.open(entry) as art:
        total = len(art.objects)
    if report.checksummed != total:
        return f"strict verify passed with {report.checksummed} of {total} objects checksummed"
    return None


def _cli_problem(fz: Any, entry: Path) -> str | None:
    from click.testing import CliRunner

    try:
        with fz.guarded(10):
            result = CliRunner().invoke(fz.inspect_main, [str(entry), "--verify", "--strict"])
    except fz.Hang:
        return "ninfer-inspect --verify --strict hung"
    try:
        text = result.output + result.stderr
    except ValueError:
        text = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"ninfer-inspect raised {type(result.exception).__name__}"
    if "internal error" in text or "Traceback" in text:
        line = next(ln for ln in text.splitlines() if "internal error" in ln or "Trace" in ln)
        return f"ninfer-inspect: {short(line)}"
    if result.exit_code not in (0, 1, 2):  # valid, invalid, missing entry
        return f"ninfer-inspect exit status {result.exit_code}"
    return None


def attack_files(budget: Budget, rng: random.Random, work: Path, tally: Tally) -> None:
    from tests.format import test_fuzz as fz

    for number, (what, files) in enumerate(hostile_file_sets(rng)):
        if budget.spent() and tally.cases:
            return
        with fz.materialized(files) as entry:
            problem = _library_problem(fz, entry) or _cli_problem(fz, entry)
        tally.case(problem and f"{problem} <- case {number}: {what}")


# ------------------------------------------------------------------- 2. killed conversions

#: Runs ``ninfer-convert`` with ``os.replace``/``os.rename`` counted (one line per call in the
#: log) and, at call ``at``, the process SIGKILLed ("kill") or the call failed with EIO ("eio").
LAUNCHER = """
import errno, os, signal, sys
mode, at, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
calls = [0]
def faulty(real):
    def rename(src, dst, *args, **kwargs):
        calls[0] += 1
        with open(log, "a") as fh:
            fh.write(f"{calls[0]} {os.fspath(dst)}\\n")
        if calls[0] == at and mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if calls[0] == at and mode == "eio":
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(src))
        return real(src, dst, *args, **kwargs)
    return rename
os.replace, os.rename = faulty(os.replace), faulty(os.rename)
sys.argv = ["ninfer-convert", *sys.argv[4:]]
from ninfer_convert.cli import main
main()
"""
OLD_RECIPE, NEW_RECIPE = "qwen3_5_bf16", "tiny_q8"
LAYOUTS = {"sharded": 256 * 1024, "single": 0}


@dataclass
class Run:
    status: int | None  # None: killed by us
    stderr: str
    renames: int
    seconds: float


def _convert(target: Path, recipe: str, limit: int, mode: str, at: int, kill_after: float) -> Run:
    log = target.parent / "renames.log"
    log.unlink(missing_ok=True)
    args = ["--recipe", recipe, "--source", str(BUNDLED), "-o", str(target), "--force"]
    args += ["--shard-limit", str(limit), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, mode, str(at), str(log), *args],
        cwd=target.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    killed = False
    try:
        _, stderr = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate()
        killed = True
    renames = len(log.read_text().splitlines()) if log.exists() else 0
    log.unlink(missing_ok=True)
    status = None if killed else proc.returncode
    return Run(status, stderr, renames, time.monotonic() - started)


def _artifact_files(entry: Path) -> set[str]:
    """Names the entry's directory lists, plus its report (empty if the entry is unreadable)."""
    from ninfer_format import Artifact
    from ninfer_format.errors import ArtifactError

    try:
        with Artifact.open(entry) as art:
            parts = {f.path for f in art.directory.files if f.path}
    except ArtifactError:
        return set()
    return {entry.name, f"{entry.name}.conversion.json", *parts}


def _whole(entry: Path) -> tuple[str | None, str]:
    """(problem, recipe): the target must open, verify strictly and match its report."""
    from ninfer_format import Artifact
    from ninfer_format.errors import ArtifactError
    from ninfer_format.verify import verify

    try:
        with Artifact.open(entry) as art:
            report = verify(art, strict=True)
            recipe = str(art.provenance.get("recipe"))
            artifact_id = art.artifact_id.hex()
    except ArtifactError as exc:
        return f"target does not open: {short(str(exc), 200)}", ""
    if not report.ok:
        return f"target fails verification: {short(report.errors[0], 200)}", recipe
    if recipe not in (OLD_RECIPE, NEW_RECIPE):
        return f"target holds recipe {recipe!r}", recipe
    sidecar = entry.with_name(entry.name + ".conversion.json")
    try:
        described = json.loads(sidecar.read_text()).get("artifact_id")
    except FileNotFoundError:  # no report is better than a wrong one
        described = artifact_id
    except (OSError, ValueError):
        described = None
    if described != artifact_id:
        return f"{sidecar.name} describes artifact {described}, the entry is {artifact_id}", recipe
    return None, recipe


def _stray(entry: Path) -> list[str]:
    keep = _artifact_files(entry) | {"renames.log"}
    return sorted(p.name for p in entry.parent.iterdir() if p.name not in keep)


def _describe_strays(entry: Path, strays: list[str]) -> str:
    """How many are temporary files, parts of a replaced artifact, or other; with examples."""
    groups: dict[str, list[str]] = {}
    for name in strays:
        if name.startswith(f".{entry.name}"):
            kind = "temporary files"
        elif name.startswith(f"{entry.name}.part-"):
            kind = "parts the new artifact does not list"
        else:
            kind = "other files"
        groups.setdefault(kind, []).append(name)
    return "; ".join(f"{len(v)} {k} (e.g. {v[0]})" for k, v in groups.items())


def _restore(entry: Path, pristine: Path) -> None:
    """Put the old artifact back; hidden temporary files stay, for later runs to clean."""
    for p in entry.parent.iterdir():
        if p.name.startswith(entry.name):
            p.unlink()
    for p in pristine.iterdir():
        shutil.copy2(p, entry.parent / p.name)


def _fault_plan() -> Iterator[tuple[str, str, int]]:
    """(layout, mode, at) forever: a kill before each rename in turn, an EIO at each rename
    in turn and a kill at a random time, interleaved; three sharded cases to one single-file.
    Each rename stream starts at the second rename, the first with one file already replaced;
    ``attack_kills`` wraps ``at`` past the last rename round to the first."""
    at = {(mode, layout): 2 for mode in ("kill", "eio") for layout in LAYOUTS}
    for turn in itertools.count():
        layout = "sharded" if turn % 4 < 3 else "single"
        mode = ("kill", "eio", "random")[turn % 3]
        if mode == "random":
            yield layout, mode, 0
        else:
            yield layout, mode, at[(mode, layout)]
            at[(mode, layout)] += 1


def attack_kills(budget: Budget, rng: random.Random, work: Path, tally: Tally) -> None:
    seconds = 2.5  # one conversion, until one is timed
    renames = dict.fromkeys(LAYOUTS, 0)  # how many a complete run makes, once seen
    pristine: dict[str, Path] = {}
    for layout, mode, at in _fault_plan():
        if not pristine or (layout not in pristine and budget.left() >= 3 * seconds):
            pristine[layout], seconds = _build_pristine(work / f"old-{layout}", LAYOUTS[layout])
        if tally.cases and budget.left() < 2 * seconds:  # this case and the closing run
            break
        if layout not in pristine:
            continue
        if mode != "random" and renames[layout]:
            at = (at - 1) % renames[layout] + 1  # every rename had its turn: go round again
        target = work / layout / "m.ninfer"
        target.parent.mkdir(exist_ok=True)
        _restore(target, pristine[layout])
        before = set(_stray(target))
        if mode == "random":
            delay = rng.uniform(0.2, seconds * 1.1)
            run = _convert(target, NEW_RECIPE, LAYOUTS[layout], "none", 0, delay)
            what = f"{layout}: SIGKILL after {delay:.2f} s"
        else:
            run = _convert(target, NEW_RECIPE, LAYOUTS[layout], mode, at, budget.left())
            what = f"{layout}: {'SIGKILL before' if mode == 'kill' else 'EIO at'} rename {at}"
        if run.status == 0:
            seconds, renames[layout] = run.seconds, run.renames
            if mode != "random":
                what += f" (not reached: a complete run makes {run.renames})"
        problem = _check_run(target, run, mode)
        tally.case(problem and f"{problem} <- {what}")
        new_strays = set(_stray(target)) - before
        if new_strays and run.status != 0:
            tally.notes.append(f"{what}: left {len(new_strays)} stray files")
    for layout in pristine:  # a complete run after the faults: do later runs clean up?
        if budget.left() < seconds:
            break
        target = work / layout / "m.ninfer"
        run = _convert(target, NEW_RECIPE, LAYOUTS[layout], "none", 0, budget.left())
        problem = _check_run(target, run, "none")
        tally.case(problem and f"{problem} <- {layout}: a complete run after the faults")


def _build_pristine(folder: Path, limit: int) -> tuple[Path, float]:
    """The old artifact, kept aside to restore before each case; and how long it took."""
    folder.mkdir(parents=True, exist_ok=True)
    run = _convert(folder / "m.ninfer", OLD_RECIPE, limit, "none", 0, 120)
    if run.status != 0:
        raise RuntimeError(f"could not convert the bundled model:\n{run.stderr}")
    return folder, run.seconds


def _check_run(target: Path, run: Run, mode: str) -> str | None:
    problem, recipe = _whole(target)
    if problem:
        return problem
    if run.status == 0 and recipe != NEW_RECIPE:
        return "the run succeeded but the target is the old artifact"
    if "Traceback" in run.stderr:
        last = run.stderr.strip().splitlines()[-1]
        return f"ninfer-convert printed a traceback ({short(last, 120)})"
    if run.status is not None and run.status != 0 and mode == "eio":
        lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
        if len(lines) != 1:
            return f"ninfer-convert said {len(lines)} lines for one OS error"
    strays = _stray(target) if run.status == 0 else []
    if strays:
        return f"a completed run left stray files: {_describe_strays(target, strays)}"
    return None


# --------------------------------------------------------------------------- live server

SERVER_ARGS = ("--max-context", "256", "--max-concurrency", "1", "--max-pending-requests", "2")
SERVER_ARGS += ("--pending-timeout-ms", "1000")
ALLOWED_5XX = {503, 504, 529}
HTTP_FAMILIES = ("bodies", "schema", "overload")


class LiveServer:
    """One ``ninfer-serve`` for the HTTP families, started on first use."""

    def __init__(self, work: Path):
        self.work = work
        self.server: Any = None

    def get(self) -> Any:
        if self.server is None or self.server.process.poll() is not None:
            from ninfer_convert.pipeline import convert
            from tests.serve.conftest import Server

            artifact = self.work / "serve" / "tiny.ninfer"
            if not artifact.exists():
                artifact.parent.mkdir(parents=True, exist_ok=True)
                convert("qwen3_5_bf16", {"base": str(BUNDLED)}, artifact)
            self.server = Server(artifact, *SERVER_ARGS)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop(timeout=10)

    def tracebacks(self) -> list[str]:
        if self.server is None:
            return []
        return [ln for ln in self.server.lines if ln.startswith("Traceback")]


def _error_shape_problem(path: str, status: int, body: bytes) -> str | None:
    """The protocol's JSON error shape, with a code (Anthropic: ``error.type``)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{status} body is not JSON: {short(body[:80])}"
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return f"{status} body is not an error object: {short(body[:120])}"
    if path.startswith("/v1/messages"):
        if doc.get("type") != "error" or not error.get("type"):
            return f"{status} body is not Anthropic's error shape: {short(body[:120])}"
    elif not error.get("code"):
        return f"{status} error without a code: {short(body[:160])}"
    if len(body) > 64 * 1024:
        return f"{status} error body of {len(body)} bytes echoes the input"
    return None


# ------------------------------------------------------------------------------ 3. overload

PROMPT = "tell me a joke about the weather in paris"
#: Concurrent clients of the storm: many times the server's one lane and two queue places.
CLIENTS = 12
#: A storm request unanswered this long hangs: an answer takes under a second, a queued
#: request is refused after the server's 1 s pending timeout.
HANG_SECONDS = 10.0


def _storm_request(rng: random.Random, model: str) -> tuple[str, dict[str, Any]]:
    stream = rng.random() < 0.5
    tokens = rng.choice([8, 32, 128])
    text = f"{PROMPT} {rng.randrange(10**6)}"
    kind = rng.choice(["chat", "responses", "messages"])
    if kind == "chat":
        return "/v1/chat/completions", {
            "model": model, "stream": stream, "max_tokens": tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}],
        }  # fmt: skip
    if kind == "responses":
        body = {"model": model, "stream": stream, "max_output_tokens": tokens, "input": text}
        return "/v1/responses", body
    return "/v1/messages", {
        "model": model, "stream": stream, "max_tokens": tokens,
        "messages": [{"role": "user", "content": text}],
    }  # fmt: skip


def _total_requests(url: str) -> float:
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ninfer_requests_total{")
    )


#: GET /health every 0.2 s with a 1 s timeout, one "status seconds" line per probe. A process
#: of its own, so the storm's client threads cannot delay it (they hold this process's GIL).
PROBE = """
import http.client, sys, time
host, port = sys.argv[1], int(sys.argv[2])
while True:
    started = time.monotonic()
    try:
        connection = http.client.HTTPConnection(host, port, timeout=1.0)
        connection.request("GET", "/health")
        status = connection.getresponse().status
        connection.close()
    except OSError as exc:
        status = type(exc).__name__
    print(status, round(time.monotonic() - started, 3), flush=True)
    time.sleep(0.2)
"""


class HealthProbe:
    """Probes /health while in use; ``slow`` lists the answers that were late or not 200."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.command = [sys.executable, "-c", PROBE, host, port]
        self.answers: list[tuple[str, float]] = []

    def __enter__(self) -> HealthProbe:
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait()
        self.reader.join()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            status, seconds = line.split()
            self.answers.append((status, float(seconds)))

    @property
    def probes(self) -> int:
        return len(self.answers)

    @property
    def slow(self) -> list[str]:
        return [f"{s} after {t:.2f} s" for s, t in self.answers if s != "200" or t > 1.0]


def attack_overload(budget: Budget, rng: random.Random, live: LiveServer, tally: Tally) -> None:
    server = live.get()
    before = _total_requests(server.url)
    storm = Budget.of(max(budget.left() * 0.5, 1.0))
    sent = [0]
    lock = threading.Lock()

    def client(seed: int) -> None:
        local = random.Random(seed)
        while not storm.spent():
            path, body = _storm_request(local, server.model)
            abandon = local.random() < 0.15  # leaves while queued or running
            timeout = local.uniform(0.1, 0.5) if abandon else HANG_SECONDS
            with lock:
                sent[0] += 1
            what = f"POST {path} {short(json.dumps(body), 200)}"
            tally.case(_storm_problem(server.url, path, body, timeout, abandon, what))

    with HealthProbe(server.url) as probe, ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, [rng.randrange(2**32) for _ in range(CLIENTS)]))
    if probe.slow:
        tally.fail(f"/health late or failing {len(probe.slow)} of {probe.probes} times during "
                   f"the storm (first: {probe.slow[0]})")  # fmt: skip
    expected = before + sent[0]
    deadline = time.monotonic() + min(5.0, budget.left())  # cancellations settle
    while _total_requests(server.url) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    counted = _total_requests(server.url)
    if counted != expected:
        tally.fail(
            f"ninfer_requests_total counted {counted - before:.0f} of {sent[0]} storm requests "
            "(some abandoned by the client) <- --only overload"
        )
    _large_prompt(budget, rng, server, tally)


def _storm_problem(
    url: str, path: str, body: dict, timeout: float, abandon: bool, what: str
) -> str | None:
    import httpx

    try:
        with httpx.stream("POST", f"{url}{path}", json=body, timeout=timeout) as response:
            data = response.read()
    except httpx.TimeoutException:
        return None if abandon else f"no answer within {timeout:.0f} s <- {what}"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {short(str(exc))} <- {what}"
    if response.status_code >= 500 and response.status_code not in ALLOWED_5XX:
        return f"{response.status_code} {short(data[:120])} <- {what}"
    return None


#: A prompt far beyond the context: it must be refused without freezing the server.
LARGE_PROMPT_BYTES = 4 << 20
#: Byte -> letter or space: random words, so the tokenizer's word cache cannot shortcut them.
LETTERS = bytes((b"abcdefghijklmnopqrstuvwxyz" * 10 + b" " * 60)[i] for i in range(256))


def _large_prompt(budget: Budget, rng: random.Random, server: Any, tally: Tally) -> None:
    import httpx

    if budget.left() < 3:
        return
    text = rng.randbytes(LARGE_PROMPT_BYTES).translate(LETTERS).decode()
    body = {"model": server.model, "messages": [{"role": "user", "content": text}]}
    what = f"POST /v1/chat/completions with a {LARGE_PROMPT_BYTES >> 20} MiB prompt"
    problems = []
    wait = max(budget.left(), 1.0)
    with HealthProbe(server.url) as probe:
        try:
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=wait)
            if response.status_code >= 500 and response.status_code not in ALLOWED_5XX:
                problems.append(f"answered {response.status_code}")
        except httpx.TimeoutException:
            problems.append(f"no answer within {wait:.1f} s")
    if probe.slow:
        problems.append(f"/health late or failing {len(probe.slow)} of {probe.probes} times "
                        f"(first: {probe.slow[0]})")  # fmt: skip
    tally.case(problems and f"{'; '.join(problems)} <- {what}")


# ------------------------------------------------------------------------ 4. malformed bodies


def _templates(model: str) -> dict[str, dict[str, Any]]:
    """A valid, field-rich body for every POST endpoint (small outputs: the context is 256)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    chat = {
        "model": model, "max_tokens": 4, "temperature": 0.5, "stream": False, "tools": [tool],
        "tool_choice": "auto", "response_format": {"type": "text"}, "stop": ["x"],
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
    }  # fmt: skip
    responses = {
        "model": model, "max_output_tokens": 4, "instructions": "be brief", "store": False,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low"},
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [], "content": [
                {"type": "reasoning_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
    }  # fmt: skip
    messages = {
        "model": model, "max_tokens": 4, "system": "be brief", "stop_sequences": ["x"],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
        ],
    }  # fmt: skip
    completions = {
        "model": model, "prompt": ["hi", "ok"], "max_tokens": 4, "temperature": 0.5, "n": 1,
        "echo": True, "logprobs": 2, "stop": ["x"], "seed": 1, "stream": False,
    }  # fmt: skip
    return {
        "/v1/chat/completions": chat,
        "/v1/completions": completions,
        "/tokenize": {"model": model, "messages": chat["messages"], "return_token_strs": True},
        "/detokenize": {"model": model, "tokens": [1, 2, 3]},
        "/v1/responses": responses,
        "/v1/responses/input_tokens": {k: v for k, v in responses.items() if k != "store"},
        "/v1/responses/resp_0/cancel": {},
        "/v1/messages": messages,
        "/v1/messages/count_tokens": {k: v for k, v in messages.items() if k != "max_tokens"},
    }


def _deep(depth: int, closed: bool = True) -> bytes:
    return b"[" * depth + (b"]" * depth if closed else b"")


def hostile_bodies(rng: random.Random, model: str) -> Iterator[tuple[str, str, bytes]]:
    """(path, description, body) forever: fixed hostile bodies for every endpoint, every field
    of every template given every wrong type, and random mutations, interleaved."""
    from tests.format import test_fuzz as fz

    templates = _templates(model)

    def fixed() -> Iterator[tuple[str, str, bytes]]:
        for path, body in templates.items():
            text = json.dumps(body).encode()
            inner = json.dumps({**body, "messages": "@"}).encode().replace(b'"@"', _deep(1000))
            cases = {
                "1000 nested arrays": _deep(1000),
                "1000 nested arrays, truncated": _deep(1000, closed=False),
                "1000 nested objects": b'{"a":' * 1000 + b"1" + b"}" * 1000,
                "messages nested 1000 deep": inner,
                "empty body": b"",
                "null": b"null",
                "an array": b"[]",
                "a string": b'"x"',
                "truncated at 1 byte": b"{",
                "truncated at half": text[: len(text) // 2],
                "trailing garbage": text + b"x",
                "UTF-16 BOM": b"\xff\xfe" + text,
                "single quotes": text.replace(b'"', b"'"),
                "a 2 MiB model name": json.dumps({**body, "model": "m" * (2 << 20)}).encode(),
                "invalid UTF-8 in a string": text.replace(b"hi", b"h\xffi"),
                "a lone surrogate escape": text.replace(b"hi", b"\\ud800"),
                "raw surrogate bytes": text.replace(b"hi", b"h\xed\xa0\x80i"),
                "a 64 KiB string": text.replace(b"hi", b"h" * (64 << 10)),
            }
            for name, hostile in cases.items():
                yield path, name, hostile

    def wrong_types() -> Iterator[tuple[str, str, bytes]]:
        for path, body in templates.items():
            for where in fz.json_paths(body)[1:]:
                for value in fz.NASTY:
                    mutated = fz.apply(copy.deepcopy(body), ("replace", where, value))
                    yield path, f"{'.'.join(map(str, where))} = {value!r}", fz.dump(mutated)

    def mutations() -> Iterator[tuple[str, str, bytes]]:
        while True:
            path = rng.choice(list(templates))
            body: Any = copy.deepcopy(templates[path])
            ops = []
            for _ in range(rng.randint(1, 3)):
                if isinstance(body, dict | list):
                    ops.append(_random_op(rng, fz, body))
                    body = fz.apply(body, ops[-1])
            yield path, f"template mutated by {short(ops, 200)}", fz.dump(body)

    return interleaved(fixed(), wrong_types(), mutations())


def attack_bodies(budget: Budget, rng: random.Random, live: LiveServer, tally: Tally) -> None:
    server = live.get()
    bodies = hostile_bodies(rng, server.model)
    lock = threading.Lock()

    def worker() -> None:
        import httpx

        with httpx.Client(base_url=server.url, timeout=30) as client:
            while not budget.spent() or not tally.cases:
                with lock:
                    path, what, body = next(bodies)
                tally.case(_body_problem(client, path, what, body))

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(worker) for _ in range(2)]:
            future.result()
    answered_500 = sum(f.startswith("500 ") for f in tally.failures)
    logged = len(live.tracebacks())
    if answered_500 > logged:
        tally.fail(f"{answered_500} answers were 500, the server log holds {logged} "
                   "tracebacks (every 500 must log one)")  # fmt: skip


def _body_problem(client: Any, path: str, what: str, body: bytes) -> str | None:
    import httpx

    what = f"POST {path} with {what} ({len(body)} bytes)"
    headers = {"content-type": "application/json"}
    try:
        response = client.post(path, content=body, headers=headers)
    except httpx.TimeoutException:
        return f"no answer within 30 s <- {what}"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__} <- {what}"
    status = response.status_code
    if status >= 500 and status not in ALLOWED_5XX:
        return f"{status} on {path} <- {what}"
    if status >= 400:
        problem = _error_shape_problem(path, status, response.content)
        return problem and f"{problem} <- {what}"
    return None


# ---------------------------------------------------------------------------- 5. schemathesis

CASES_LINE = re.compile(r"(\d+) generated")


def attack_schema(budget: Budget, rng: random.Random, live: LiveServer, tally: Tally) -> None:
    server = live.get()
    seconds = max(int(budget.left()) - 3, 3)
    report = live.work / "schemathesis.json"
    cli = Path(sys.executable).parent / "schemathesis"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.serve.schemathesis_hooks",
        "NINFER_TEST_MODEL": server.model,
        "PYTHONPATH": str(ROOT),
    }
    seed = rng.randrange(2**31)
    command = [
        str(cli), "run", f"{server.url}/openapi.json", "--max-time", str(seconds),
        "--seed", str(seed), "--request-timeout", "30", "--workers", "2", "--no-color",
        "--report", "ndjson", "--report-ndjson-path", str(report),
    ]  # fmt: skip
    try:
        result = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 60
        )
        output = result.stdout
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        tally.fail(f"schemathesis ran past its budget of {seconds} s")
    cases, failures = _schemathesis_counts(report, output or "")
    tally.count(cases)
    for failure in failures:
        tally.fail(f"{failure} <- schemathesis run URL/openapi.json --seed {seed}")
    if not cases:
        tally.fail(f"schemathesis ran no case: {short((output or '')[-300:], 300)}")


def _schemathesis_counts(report: Path, output: str) -> tuple[int, list[str]]:
    """Cases generated and one line per distinct failure, from the ndjson event stream."""
    cases = 0
    failures: dict[str, None] = {}
    try:
        events = [json.loads(line) for line in report.read_text().splitlines() if line]
    except (OSError, ValueError):
        events = []
    for event in events:
        recorder = (event.get("ScenarioFinished") or {}).get("recorder") or {}
        recorded = recorder.get("cases") or {}
        cases += len(recorded)
        for case_id, checks in (recorder.get("checks") or {}).items():
            for check in checks:
                if check.get("status") != "failure":
                    continue
                case = (recorded.get(case_id) or {}).get("value") or {}
                info = (check.get("failure_info") or {}).get("failure") or {}
                where = f"{case.get('method', '')} {case.get('path', '')}"
                failures[f"{check.get('name')}: {where}: {short(info.get('title', ''), 60)}"] = None
    if not cases:
        cases = sum(int(n) for n in CASES_LINE.findall(output))
    return cases, list(failures)


# -------------------------------------------------------------------------------------- main


def run(families: list[str], seconds: float, seed: int) -> list[Tally]:
    total = Budget.of(seconds)
    tallies = []
    with tempfile.TemporaryDirectory(prefix="ninfer-reliability-") as tmp:
        work = Path(tmp)
        live = LiveServer(work)
        try:
            for i, family in enumerate(families):
                tally = Tally(family)
                started = time.monotonic()
                try:
                    if family in HTTP_FAMILIES:
                        live.get()  # its start-up shared by the families left, not this one's
                    share = Budget.of(total.left() / (len(families) - i))
                    _attack(family, share, random.Random(f"{seed}:{family}"), work, live, tally)
                except Exception as exc:  # the harness itself broke: say so, keep going
                    tally.fail(f"harness error: {type(exc).__name__}: {short(str(exc), 300)}")
                tally.seconds = time.monotonic() - started
                tallies.append(tally)
        finally:
            traces = live.tracebacks()
            live.stop()
    if traces:
        for tally in tallies:
            if tally.family in HTTP_FAMILIES:
                tally.notes.append(f"the server logged {len(traces)} tracebacks")
                break
    return tallies


def _attack(family: str, budget: Budget, rng: random.Random, work: Path, live: LiveServer,
            tally: Tally) -> None:  # fmt: skip
    if family == "files":
        attack_files(budget, rng, work, tally)
    elif family == "kills":
        attack_kills(budget, rng, work, tally)
    elif family == "overload":
        attack_overload(budget, rng, live, tally)
    elif family == "bodies":
        attack_bodies(budget, rng, live, tally)
    else:
        attack_schema(budget, rng, live, tally)


def kinds(failures: list[str]) -> dict[str, list[str]]:
    """Failures grouped by what went wrong (numbers and quoted names aside), first seen first."""
    groups: dict[str, list[str]] = {}
    for failure in failures:
        what = failure.split(" <- ")[0]
        key = re.sub(r"'[^']*'|[0-9a-f]{8,}|\d+", "_", what)[:50]
        groups.setdefault(key, []).append(failure)
    return groups


def print_table(tallies: list[Tally], seconds: float, seed: int) -> None:
    """One row per family; below it the first failure of each of the first few kinds."""
    print(f"ninfer reliability: budget {seconds:.0f} s, seed {seed}")
    head = f"{'family':<9} {'cases':>6} {'failures':>8} {'seconds':>7}"
    print(f"{head}  first failures (reproduction)")
    for t in tallies:
        groups = list(kinds(t.failures).values())
        shown = [f"[{len(g)}x] {g[0]}" for g in groups[:SHOWN_FAILURES]]
        if len(groups) > SHOWN_FAILURES:
            shown.append(f"... and {len(groups) - SHOWN_FAILURES} more kinds")
        shown += [f"note: {n}" for n in t.notes[:2]]
        first = shown[0] if shown else "-"
        print(f"{t.family:<9} {t.cases:>6} {len(t.failures):>8} {t.seconds:>7.1f}  {first}")
        for line in shown[1:]:
            print(f"{'':<35}{line}")


def write_report(path: Path, tallies: list[Tally], seconds: float, seed: int) -> None:
    families = {
        t.family: {"cases": t.cases, "seconds": round(t.seconds, 1), "failures": t.failures,
                   "notes": t.notes}
        for t in tallies
    }  # fmt: skip
    doc = {"budget_seconds": seconds, "seed": seed, "families": families}
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120, help="total time budget")
    parser.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families")
    parser.add_argument("--seed", type=int, default=0, help="seed for every random choice")
    parser.add_argument("--report", type=Path, help="also write every failure to this JSON file")
    args = parser.parse_args(argv)
    chosen = {f.strip() for f in args.only.split(",") if f.strip()}
    families = [f for f in FAMILIES if f in chosen]
    unknown = sorted(chosen - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    tallies = run(families, args.seconds, args.seed)
    print_table(tallies, args.seconds, args.seed)
    if args.report:
        write_report(args.report, tallies, args.seconds, args.seed)
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
