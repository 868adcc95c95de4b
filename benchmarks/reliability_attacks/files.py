"""The ``files`` family: hostile file sets (truncated, bit-flipped, mutated directory JSON,
broken and renamed parts, edited checksum keys) opened and used through the library and checked
with ``ninfer-inspect --verify --strict``.

A failure is an exception that is not an ``ArtifactError``, a hang, an "internal error" or
traceback from the inspector, or a strict verify that passes an artifact which then fails to
load or leaves objects unchecksummed. ``random_json_op`` is shared with the ``bodies`` family.
"""

from __future__ import annotations

import copy
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .bookkeeping import Budget, Tally, interleaved, short


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
        op = random_json_op(rng, fz, doc)
        ops.append(op)
        doc = fz.apply(doc, op)
    ascii_only = rng.random() < 0.5
    text = fz.dump(doc, ascii_only=ascii_only)
    return (
        f"{kind}, directory mutated by {short(ops, 300)} (ascii={ascii_only})",
        {**fs.files, fs.entry_name: fs.entry_with(text)},
    )


def random_json_op(rng: random.Random, fz: Any, doc: Any) -> tuple:
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
