"""Reliability (fuzz) tests of the reader: whatever file set it is given, opening it and touching
everything it exposes either works or raises an ``ArtifactError`` subclass -- never another
exception type, never a hang, never a huge allocation.

"Touching everything" (``touch``) means: ``Artifact.open``, ``objects``, ``binder_report``,
``raw`` of every object, ``tensor`` of every tensor, ``parameter`` of every binding,
``resource`` of every component role, and ``verify(strict=True)``. Every step runs under a
wall-clock alarm and an address-space limit, so a hang or a huge allocation fails the test
instead of stalling or swapping the machine.

The inputs are mutations of a few valid artifacts written by the project's writer: truncated
files, flipped bytes, mutated JSON documents (rewritten byte by byte, independent of the
writer) and broken file sets. Hypothesis runs derandomized and without an example database,
so CI sees the same examples on every run.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import json
import math
import os
import shutil
import signal
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from ninfer_format import ArtifactWriter, ResourceSpec, TensorSpec
from ninfer_format.codecs import all_codecs
from ninfer_format.errors import (
    ArtifactError,
    CodecError,
    DirectoryError,
    FramingError,
    MissingFile,
    PartFileError,
    ResourceError,
)
from ninfer_format.framing import ENTRY_MAGIC, PART_MAGIC, V2_ENTRY_MAGIC, align_up
from ninfer_format.inspect_cli import main as inspect_main
from ninfer_format.reader import Artifact
from ninfer_format.resources import encode_resource
from ninfer_format.sample import write_sample
from ninfer_format.schema import Tensor
from ninfer_format.verify import VerifyReport, verify

from . import helpers
from .helpers import small_artifact, write_raw

try:
    import resource as _rlimit
except ImportError:  # not POSIX: no address-space guard
    _rlimit = None  # type: ignore[assignment]

#: Wall-clock seconds one ``touch`` may take; the inputs are tiny, so anything near this hangs.
TOUCH_SECONDS = 20.0
#: Address space one ``touch`` may add on top of what the process already maps.
ALLOCATION_HEADROOM = 1 << 30


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------------------ the contract


class Hang(BaseException):
    """The alarm fired. A BaseException, so no ``except Exception`` in the library eats it."""


def _address_space() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


@contextlib.contextmanager
def guarded(seconds: float = TOUCH_SECONDS) -> Iterator[None]:
    """Fail with ``Hang`` after ``seconds``; a huge allocation fails with ``MemoryError``."""
    use_alarm = (
        hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    limit = None
    used = _address_space() if _rlimit is not None else None
    if used is not None:
        soft, hard = _rlimit.getrlimit(_rlimit.RLIMIT_AS)
        wanted = used + ALLOCATION_HEADROOM
        if (soft == _rlimit.RLIM_INFINITY or wanted < soft) and (
            hard == _rlimit.RLIM_INFINITY or wanted <= hard
        ):
            limit = (soft, hard)
            _rlimit.setrlimit(_rlimit.RLIMIT_AS, (wanted, hard))
    previous = None
    if use_alarm:

        def fire(signum: int, frame: object) -> None:
            raise Hang(f"still running after {seconds} s")

        previous = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if limit is not None:
            _rlimit.setrlimit(_rlimit.RLIMIT_AS, limit)


@dataclass
class Outcome:
    opened: bool
    #: (step, error) for every step that raised, e.g. ``("open", ...)``, ``("tensor w.a", ...)``
    failures: list[tuple[str, ArtifactError]] = field(default_factory=list)
    report: VerifyReport | None = None
    binder_errors: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[ArtifactError]:
        return [e for _, e in self.failures]

    def raised(self, kind: type[ArtifactError]) -> bool:
        return any(isinstance(e, kind) for e in self.errors)

    def messages(self) -> list[str]:
        return [f"{step}: {p}" for step, e in self.failures for p in e.problems]


def touch(entry: Path, seconds: float = TOUCH_SECONDS) -> Outcome:
    """Open ``entry`` and use everything; only ``ArtifactError`` is caught (per step)."""
    with guarded(seconds):
        try:
            art = Artifact.open(entry)
        except ArtifactError as exc:
            return Outcome(False, [("open", exc)])
        outcome = Outcome(True)

        def attempt(step: str, action: Callable[[], Any]) -> Any:
            try:
                return action()
            except ArtifactError as exc:
                outcome.failures.append((step, exc))
                return None

        with art:
            objects = attempt("objects", lambda: art.objects) or {}
            attempt("records", lambda: (art.metadata, art.provenance, art.uses, art.components))
            report = attempt("binder", lambda: art.binder_report)
            if report is not None:
                outcome.binder_errors = list(report.errors)
            for oid, obj in objects.items():
                attempt(f"raw {oid}", lambda oid=oid: art.raw(oid))
                if isinstance(obj, Tensor):
                    attempt(f"tensor {oid}", lambda oid=oid: art.tensor(oid))
            for name in list(art.bindings):
                attempt(f"parameter {name}", lambda name=name: art.parameter(name))
            for cid, comp in art.components.items():
                for role, oid in (comp.resources or {}).items():
                    step = f"resource {oid}"
                    attempt(step, lambda role=role, cid=cid: art.resource(role, cid))
            outcome.report = attempt("verify", lambda: verify(art, strict=True))
    # The binder's last-resort guard turns a crash into a report line; it calls that a bug.
    assert not any("failed internally" in e for e in outcome.binder_errors), outcome.binder_errors
    return outcome


# ------------------------------------------------------------------------- base artifacts


@dataclass(frozen=True)
class FileSet:
    """The bytes of a valid artifact's files (entry first) and where things are in them."""

    files: dict[str, bytes]
    document: dict[str, Any]
    json_bytes: int

    @property
    def entry_name(self) -> str:
        return next(iter(self.files))

    @property
    def entry(self) -> bytes:
        return self.files[self.entry_name]

    @property
    def names(self) -> list[str]:
        return list(self.files)

    @property
    def artifact_id(self) -> bytes:
        return self.entry[16:32]

    @property
    def payload_start(self) -> int:
        return align_up(32 + self.json_bytes, 4096)

    def file_payload_start(self, name: str) -> int:
        return self.payload_start if name == self.entry_name else 4096

    def logical_start(self, name: str) -> int:
        sizes = [f["payload_bytes"] for f in self.document["files"]]
        return sum(sizes[: self.names.index(name)])

    def logical(self, name: str, at: int) -> int | None:
        """Logical payload offset of byte ``at`` of file ``name`` (None outside the payload)."""
        first = self.file_payload_start(name)
        return None if at < first else self.logical_start(name) + at - first

    @property
    def payload(self) -> bytes:
        return b"".join(data[self.file_payload_start(n) :] for n, data in self.files.items())

    def owner(self, logical: int) -> str | None:
        for obj in self.document["objects"]:
            if obj["offset"] <= logical < obj["offset"] + obj["bytes"]:
                return obj["id"]
        return None

    def entry_with(self, text: bytes, *, json_bytes: int | None = None) -> bytes:
        """An entry with another directory text and this set's entry payload (byte by byte)."""
        json_bytes = len(text) if json_bytes is None else json_bytes
        text = text + b" " * (json_bytes - len(text))
        start = align_up(32 + json_bytes, 4096)
        head = ENTRY_MAGIC + struct.pack("<Q", json_bytes) + self.artifact_id + text
        return head + bytes(max(start - len(head), 0)) + self.entry[self.payload_start :]


def _read_set(entry: Path) -> FileSet:
    data = entry.read_bytes()
    (json_bytes,) = struct.unpack_from("<Q", data, 8)
    document = json.loads(data[32 : 32 + json_bytes])
    files = {entry.name: data}
    for f in document["files"][1:]:
        files[f["path"]] = (entry.parent / f["path"]).read_bytes()
    return FileSet(files, document, json_bytes)


SHARDED_TENSORS = {f"w.{i}": ((64, 64), "bf16", "contiguous_le_v1") for i in range(4)}


def _zoo(path: Path) -> None:
    """One object of every registered codec (random bytes), a zstd resource, parts bindings."""
    rng = np.random.default_rng(1)
    specs: list[TensorSpec | ResourceSpec] = []
    data: dict[str, bytes] = {}
    tokenizer = encode_resource("zstd_v1", b'{"model": "zoo"}' * 8)
    specs.append(ResourceSpec("r.zstd", "zstd_v1", len(tokenizer)))
    data["r.zstd"] = tokenizer
    specs.append(ResourceSpec("r.raw", "raw_bytes_v1", 3))
    data["r.raw"] = b"abc"
    bindings: dict[str, Any] = {}
    for codec in all_codecs():
        shape = (128, 64) if codec.format == "nvfp4" else (2, 256)
        oid = f"z.{codec.format}"
        spec = TensorSpec(oid, shape, codec.format, codec.layout)
        specs.append(spec)
        data[oid] = rng.integers(0, 256, codec.encoded_size(shape), dtype=np.uint8).tobytes()
        bindings[f"p.{codec.format}"] = {"object": oid}
    bindings["p.mix"] = {
        "parts": [
            {"object": "z.bf16", "range": [3, 70]},
            {"object": "z.gguf_q4_k", "range": [0, 256]},
            {"object": "z.bf16", "range": [0, 1]},
        ]
    }
    components = {
        "text": {
            "config": {"model_type": "zoo"},
            "resources": {"tokenizer.json": "r.zstd", "x.txt": "r.raw"},
        }
    }
    with ArtifactWriter(
        path,
        components=components,
        objects=specs,
        bindings=bindings,
        shard_limit=4096 * 3,
        artifact_id=ID_A,
    ) as w:
        for spec in specs:
            w.write(spec.id, data[spec.id])


ID_A, ID_B = bytes(range(16, 32)), bytes(range(32, 48))
BUILDERS: dict[str, Callable[[Path], object]] = {
    "single": lambda p: small_artifact(p, artifact_id=ID_A),
    "sharded": lambda p: small_artifact(
        p, shard_limit=4096 * 3, tensors=SHARDED_TENSORS, artifact_id=ID_A
    ),
    "foreign": lambda p: small_artifact(
        p, shard_limit=4096 * 3, tensors=SHARDED_TENSORS, artifact_id=ID_B
    ),
    "zoo": _zoo,
    "sample": write_sample,
}


@functools.cache
def base(kind: str) -> FileSet:
    """A valid artifact, built once; its values do not depend on which tests ran before."""
    shared_rng = helpers.RNG
    helpers.RNG = np.random.default_rng(list(BUILDERS).index(kind))
    try:
        with tempfile.TemporaryDirectory(prefix="ninfer-fuzz-base-") as d:
            entry = Path(d) / "m.ninfer"
            BUILDERS[kind](entry)
            return _read_set(entry)
    finally:
        helpers.RNG = shared_rng


Replacement = bytes | None | str  # file content, None = absent, "dir" / "fifo"


@functools.cache
def scratch() -> Path:
    """One directory per process for the file sets under test (creating and removing a
    directory per example costs more than the example itself on some file systems)."""
    path = Path(tempfile.mkdtemp(prefix="ninfer-fuzz-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def materialized(files: dict[str, Replacement]) -> Iterator[Path]:
    """Write a file set into the scratch directory; yields the entry path (the first name)."""
    where = scratch()
    for old in where.iterdir():
        content = files.get(old.name)
        if not (isinstance(content, bytes) and old.is_file()):
            _remove(old)
    for name, content in files.items():
        target = where / name
        if content == "dir":
            target.mkdir()
        elif content == "fifo":
            os.mkfifo(target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
    yield where / next(iter(files))


def touch_files(files: dict[str, Replacement], seconds: float = TOUCH_SECONDS) -> Outcome:
    with materialized(files) as entry:
        return touch(entry, seconds)


def record(outcome: Outcome) -> Outcome:
    """Tell hypothesis's statistics how far an input got (``--hypothesis-show-statistics``)."""
    if not currently_in_test_context():
        return outcome
    if not outcome.opened:
        event("refused at open", type(outcome.errors[0]).__name__)
    elif outcome.failures:
        event("opened, then", sorted({type(e).__name__ for e in outcome.errors}))
    else:
        event("opened, then", "no errors")
    return outcome


def test_base_artifacts_are_clean():
    for kind in BUILDERS:
        outcome = touch_files(dict(base(kind).files))
        assert outcome.opened and not outcome.errors, (kind, outcome.messages())
        assert outcome.report is not None and outcome.report.checksummed > 0
        if kind != "zoo":  # the zoo holds random code words: scans may report them
            assert outcome.report.ok and not outcome.report.warnings, outcome.report
    sharded = base("sharded")
    assert len(sharded.files) >= 4
    parts = sharded.document["files"]
    ends = np.cumsum([f["payload_bytes"] for f in parts])
    straddling = [
        o["id"]
        for o in sharded.document["objects"]
        if any(o["offset"] < e < o["offset"] + o["bytes"] for e in ends)
    ]
    assert len(straddling) >= 3, straddling


# ---------------------------------------------------------------------------- 1. truncation

BOUNDARIES: dict[str, Callable[[FileSet, str], int]] = {
    "empty": lambda fs, n: 0,
    "magic-1": lambda fs, n: 7,
    "magic": lambda fs, n: 8,
    "field-1": lambda fs, n: 15,
    "field": lambda fs, n: 16,
    "header-1": lambda fs, n: 31,
    "header": lambda fs, n: 32,
    "inside-json": lambda fs, n: 32 + fs.json_bytes // 2 if n == fs.entry_name else 2048,
    "json-1": lambda fs, n: 31 + fs.json_bytes if n == fs.entry_name else 4095,
    "payload-start": lambda fs, n: fs.file_payload_start(n),
    "inside-payload": lambda fs, n: (fs.file_payload_start(n) + len(fs.files[n])) // 2,
    "one-short": lambda fs, n: len(fs.files[n]) - 1,
}


def _check_truncated(fs: FileSet, name: str, cut: int) -> None:
    files: dict[str, Replacement] = dict(fs.files)
    files[name] = fs.files[name][:cut]
    outcome = touch_files(files)
    if name == fs.entry_name:
        assert not outcome.opened and outcome.raised(FramingError), outcome.messages()
    else:  # a continuation file is checked when first needed: every part holds object bytes
        assert outcome.opened and outcome.raised(PartFileError), outcome.messages()


@pytest.mark.parametrize("where", list(BOUNDARIES))
@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_truncated_entry_at_boundaries(kind, where):
    fs = base(kind)
    _check_truncated(fs, fs.entry_name, BOUNDARIES[where](fs, fs.entry_name))


@pytest.mark.parametrize("where", list(BOUNDARIES))
def test_truncated_part_at_boundaries(where):
    fs = base("sharded")
    for name in fs.names[1:]:
        _check_truncated(fs, name, BOUNDARIES[where](fs, name))


@fuzz_settings(60)
@given(data=st.data(), kind=st.sampled_from(["single", "sharded", "zoo"]))
def test_truncated_anywhere(data, kind):
    fs = base(kind)
    name = data.draw(st.sampled_from(fs.names), label="file")
    cut = data.draw(st.integers(0, len(fs.files[name]) - 1), label="cut")
    _check_truncated(fs, name, cut)


# ---------------------------------------------------------------------------- 2. byte flips


def _regions(fs: FileSet) -> list[tuple[str, str, int, int]]:
    """(region, file, start, end): headers, JSON, part header pages and payloads."""
    out = [
        ("header", fs.entry_name, 0, 32),
        ("json", fs.entry_name, 32, 32 + fs.json_bytes),
        ("payload", fs.entry_name, fs.payload_start, len(fs.entry)),
    ]
    for name in fs.names[1:]:
        out += [
            ("part-header", name, 0, 32),
            ("part-page", name, 32, 4096),
            ("payload", name, 4096, len(fs.files[name])),
        ]
    return out


def flips(size: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    """1-8 distinct positions below ``size``, each XORed with a non-zero mask."""
    return st.lists(
        st.tuples(st.integers(0, size - 1), st.integers(1, 255)),
        min_size=1,
        max_size=min(8, size),
        unique_by=lambda t: t[0],
    )


def _flipped(data: bytes, start: int, changes: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for at, mask in changes:
        out[start + at] ^= mask
    return bytes(out)


def _check_flips(fs: FileSet, region: str, name: str, start: int, changes: list) -> None:
    files: dict[str, Replacement] = dict(fs.files)
    files[name] = _flipped(fs.files[name], start, changes)
    outcome = record(touch_files(files))
    positions = [start + at for at, _ in changes]
    if region == "header":
        if any(p < 8 for p in positions):
            assert not outcome.opened and outcome.raised(FramingError)
        elif all(p >= 16 for p in positions):  # artifact_id: checked against the parts only
            assert outcome.opened
            assert outcome.raised(PartFileError) == (len(fs.files) > 1), outcome.messages()
    elif region == "part-header":  # magic, part_index and artifact_id are all checked
        assert outcome.opened and outcome.raised(PartFileError), outcome.messages()
    elif region == "part-page":
        assert outcome.opened and not outcome.errors, outcome.messages()
        assert outcome.report is not None
        assert any("header page" in w for w in outcome.report.warnings), outcome.report
    elif region == "payload":
        assert outcome.opened, outcome.messages()
        report = outcome.report
        assert report is not None, outcome.messages()
        owners = {fs.owner(fs.logical(name, p)) for p in positions}  # type: ignore[arg-type]
        for oid in owners - {None}:
            assert any(e.startswith(f"object {oid!r}: checksum mismatch") for e in report.errors), (
                oid,
                report.errors,
            )
        if None in owners:  # a flip in a gap between objects: strict verify sees the padding
            assert any("non-zero padding" in w for w in report.warnings), report.warnings


@fuzz_settings(200)
@given(data=st.data(), kind=st.sampled_from(["single", "sharded", "zoo"]))
def test_byte_flips(data, kind):
    fs = base(kind)
    region, name, start, end = data.draw(st.sampled_from(_regions(fs)), label="region")
    changes = data.draw(flips(end - start), label="flips")
    _check_flips(fs, region, name, start, changes)


@fuzz_settings(40)
@given(data=st.data())
def test_payload_flips_inside_sample(data):
    """The sample covers every CORE codec and the Qwen3.5 binder; flips are in the payload."""
    fs = base("sample")
    region, name, start, end = _regions(fs)[2]
    changes = data.draw(flips(end - start), label="flips")
    _check_flips(fs, region, name, start, changes)


# ------------------------------------------------------------------------ 3. JSON mutations

HUGE = [-1, 0, 1, 255, 256, 4095, 4096, 2**31, 2**32, 2**63, 2**64 - 1, 2**64, 10**30, -(2**64)]
STRINGS = [
    *["", "\x00", "w\x00a", "\ud800", "\udfff", "\ufeff", ".", "..", "a/b", "a\\b", "m.ninfer"],
    *["m.ninfer.part-0001", "tensor", "resource", "text", "mtp", "bf16", "fp32", "int32", "nvfp4"],
    *["contiguous_le_v1", "row_split_k128_v1", "raw_bytes_v1", "zstd_v1", "gguf_q4_k"],
    *["q5_g64_fp16", "full", "indexed", "A16Only", "AllowA4", "w.a", "w.b", "w.0", "r.tok"],
    *["qwen3_5_text", "qwen3_5_moe_text", "full_attention", "linear_attention"],
]
MEMBERS = [
    *["components", "objects", "bindings", "uses", "files", "metadata", "provenance", "id"],
    *["kind", "shape", "format", "layout", "offset", "bytes", "encoding", "divisors", "object"],
    *["range", "parts", "path", "payload_bytes", "config", "target", "resources", "proposal"],
    *["domain", "rows", "parameter", "input", "activation_policy", "auxiliaries", "name"],
    *["checksums", "model_type", "hidden_size", "vocab_size", "num_hidden_layers", "layer_types"],
]
NASTY: list[Any] = [
    *["1", "", "\x00", "\ud800", 1.0, 1.5, -0.0, 1e300, math.nan, math.inf, True, False, None],
    *[[], [1], [[]], {}, {"a": 1}, {"object": "w.a"}, -1, 0, 2**64 - 1, 2**64, 10**30],
]

ints = st.one_of(st.integers(), st.sampled_from(HUGE), st.integers(0, 2**64))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(STRINGS),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(MEMBERS), st.text(max_size=6)), kids, max_size=4),
    ),
    max_leaves=12,
)

Path_ = tuple[str | int, ...]


def json_paths(value: Any, prefix: Path_ = ()) -> list[Path_]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += json_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += json_paths(child, (*prefix, i))
    return out


def _container(doc: Any, path: Path_) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def apply(doc: Any, op: tuple) -> Any:
    """Apply one mutation; the root path replaces the whole document."""
    kind, path, *args = op
    if kind == "replace" and not path:
        return args[0]
    parent = _container(doc, path[:-1]) if path else None
    if kind == "replace":
        parent[path[-1]] = args[0]
    elif kind == "delete":
        del parent[path[-1]]
    elif kind == "shift":
        parent[path[-1]] += args[0]
    elif kind == "add":
        _container(doc, path)[args[0]] = args[1]
    elif kind == "swap":
        seq = _container(doc, path)
        seq[args[0]], seq[args[1]] = seq[args[1]], seq[args[0]]
    elif kind == "duplicate":
        seq = _container(doc, path)
        seq.insert(args[0], copy.deepcopy(seq[args[0]]))
    return doc


@st.composite
def mutation(draw: st.DrawFn, doc: Any, under: Path_ = ()) -> tuple:
    paths = [p for p in json_paths(doc) if p[: len(under)] == under] or json_paths(doc)
    path = draw(st.sampled_from(paths), label="path")
    target = _container(doc, path)
    kinds = ["replace", "replace"]
    if path:
        kinds.append("delete")
    if type(target) is int:
        kinds += ["shift", "shift", "retype"]
    if isinstance(target, str):
        kinds += ["retype", "retype"]
    if isinstance(target, dict):
        kinds.append("add")
    if isinstance(target, list) and target:
        kinds += ["duplicate"] + (["swap"] if len(target) > 1 else [])
    kind = draw(st.sampled_from(kinds), label="op")
    if kind == "replace":
        return (kind, path, draw(json_values, label="value"))
    if kind == "retype":  # a value of the same type: keeps the schema, breaks meanings
        same = st.sampled_from(STRINGS) | st.text(max_size=8) if isinstance(target, str) else ints
        return ("replace", path, draw(same, label="value"))
    if kind == "shift":
        delta = draw(st.sampled_from([-4097, -256, -17, -1, 1, 17, 255, 256, 4096, 2**64]))
        return (kind, path, delta)
    if kind == "add":
        key = draw(st.one_of(st.sampled_from(MEMBERS), st.text(max_size=6)), label="key")
        return (kind, path, key, draw(json_values, label="value"))
    if kind == "swap":
        i, j = draw(st.lists(st.integers(0, len(target) - 1), min_size=2, max_size=2, unique=True))
        return (kind, path, i, j)
    if kind == "duplicate":
        return (kind, path, draw(st.integers(0, len(target) - 1)))
    return (kind, path)


def dump(doc: Any, ascii_only: bool = True) -> bytes:
    """JSON text of ``doc``; NaN/Infinity come out as literals, lone surrogates as escapes
    (``ascii_only``) or as the raw (invalid UTF-8) bytes."""
    text = json.dumps(doc, ensure_ascii=ascii_only, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


def touch_document(fs: FileSet, text: bytes, json_bytes: int | None = None) -> Outcome:
    files: dict[str, Replacement] = dict(fs.files)
    files[fs.entry_name] = fs.entry_with(text, json_bytes=json_bytes)
    return record(touch_files(files))


@st.composite
def mutated_text(draw: st.DrawFn, kind: str, under: Path_ = ()) -> bytes:
    doc = copy.deepcopy(base(kind).document)
    for _ in range(draw(st.integers(1, 3), label="mutations")):
        if not isinstance(doc, dict | list):
            break
        doc = apply(doc, draw(mutation(doc, under)))
    return dump(doc, ascii_only=draw(st.booleans(), label="ascii"))


@fuzz_settings(300)
@given(data=st.data(), kind=st.sampled_from(["single", "sharded", "zoo"]))
def test_json_mutations(data, kind):
    touch_document(base(kind), data.draw(mutated_text(kind), label="text"))


@fuzz_settings(80)
@given(data=st.data())
def test_json_mutations_of_binder_config(data):
    """Mutations of the Qwen3.5 sample's components, so the binder sees odd configs."""
    text = data.draw(mutated_text("sample", ("components",)), label="text")
    touch_document(base("sample"), text)


def test_every_member_gets_every_wrong_type():
    """Deterministic sweep: each path of the single-file document replaced by each NASTY
    value, deleted, and given an extra member; every variant must end in the contract."""
    fs = base("single")
    doc = fs.document
    rejected = 0
    for path in json_paths(doc):
        variants: list[tuple] = [("replace", path, value) for value in NASTY]
        if path:
            variants.append(("delete", path))
        if isinstance(_container(doc, path), dict):
            variants.append(("add", path, "zzz", 1))
        for op in variants:
            outcome = touch_document(fs, dump(apply(copy.deepcopy(doc), op)))
            rejected += not outcome.opened
    assert rejected > 100


def _text(fs: FileSet) -> bytes:
    return json.dumps(fs.document).encode()


def _sub(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def edit(text: bytes) -> bytes:
        assert old in text, old
        return text.replace(old, new, 1)

    return edit


def _deep(opening: bytes, closing: bytes, depth: int, leaf: bytes = b"1") -> bytes:
    return opening * depth + leaf + closing * depth


DEEP_CONFIG = b'"model_type": "toy", "deep": '
SURROGATE_PAIR = b'"\\ud83d\\ude00"'  # a valid escaped code point (U+1F600)

#: Raw-text edits of the single-file directory; each must be refused at open.
TEXT_CASES: dict[str, Callable[[bytes], bytes]] = {
    "duplicate-root-member": _sub(b'{"components"', b'{"uses": [], "components"'),
    "duplicate-object-member": _sub(b'"id": "w.a"', b'"id": "w.a", "id": "w.a"'),
    "duplicate-config-member": _sub(b'"model_type": "toy"', b'"model_type": 1, "model_type": 1'),
    "duplicate-binding-name": _sub(b'"p.a": {"object": "w.a"}', b'"p.a": {}, "p.a": {}'),
    "duplicate-file-member": _sub(b'"path": null', b'"path": null, "path": null'),
    "nan-offset": _sub(b'"offset": 256', b'"offset": NaN'),
    "infinity-bytes": _sub(b'"bytes": 64', b'"bytes": Infinity'),
    "minus-infinity-config": _sub(b'"model_type": "toy"', b'"model_type": -Infinity'),
    "float-overflow-config": _sub(b'"model_type": "toy"', b'"model_type": 1e400'),
    "float-offset": _sub(b'"offset": 256', b'"offset": 256.0'),
    "exponent-offset": _sub(b'"offset": 256', b'"offset": 2.56e2'),
    "huge-offset": _sub(b'"offset": 256', b'"offset": 18446744073709551616'),
    "5000-digit-number": _sub(b'"model_type": "toy"', b'"model_type": ' + b"9" * 5000),
    "bom": lambda t: b"\xef\xbb\xbf" + t,
    "invalid-utf8": _sub(b'"name": "toy"', b'"name": "t\xffy"'),
    "overlong-utf8": _sub(b'"name": "toy"', b'"name": "t\xc0\xafy"'),
    "raw-surrogate-bytes": _sub(b'"name": "toy"', b'"name": "t\xed\xa0\x80y"'),
    "nul-escape-in-id": lambda t: t.replace(b'"w.a"', b'"w\\u0000a"'),
    "raw-nul-in-string": _sub(b'"name": "toy"', b'"name": "t\x00y"'),
    "lone-surrogate-id": lambda t: t.replace(b'"w.a"', b'"w\\ud800"'),
    "lone-low-surrogate-config": _sub(b'"model_type": "toy"', b'"model_type": "\\udc00"'),
    "lone-surrogate-member-name": _sub(b'"model_type": "toy"', b'"\\ud800": 1'),
    "100000-brackets-in-config": _sub(
        b'"model_type": "toy"', DEEP_CONFIG + _deep(b"[", b"]", 100000)
    ),
    "100000-objects-in-config": _sub(
        b'"model_type": "toy"', DEEP_CONFIG + _deep(b'{"a":', b"}", 100000)
    ),
    "100000-brackets-root": lambda t: _deep(b"[", b"]", 100000),
    "100000-open-brackets-root": lambda t: b"[" * 100000,
    "100000-objects-root": lambda t: _deep(b'{"a":', b"}", 100000),
    "200-levels-in-metadata": _sub(
        b'"name": "toy"', b'"name": "toy", "x": ' + _deep(b"[", b"]", 200)
    ),
    # Nesting the parser accepts, plus a \ud8xx escape anywhere (here a valid surrogate pair).
    **{
        f"{depth}-levels-with-surrogate-escape": _sub(
            b'"model_type": "toy"', DEEP_CONFIG + _deep(b"[", b"]", depth, SURROGATE_PAIR)
        )
        for depth in (450, 600, 800)
    },
    "trailing-garbage": lambda t: t + b"x",
    "nul-padding": lambda t: t + b"\x00" * 16,
    "second-document": lambda t: t + t,
    "root-array": lambda t: b"[" + t + b"]",
    "root-string": lambda t: b'"x"',
    "root-null": lambda t: b"null",
    "whitespace-only": lambda t: b" " * 64,
    "truncated-text": lambda t: t[: len(t) // 2],
}


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_directory_text_cases(case):
    fs = base("single")
    outcome = touch_document(fs, TEXT_CASES[case](_text(fs)))
    assert not outcome.opened and outcome.raised(DirectoryError), outcome.messages()


def test_empty_directory_text():
    fs = base("single")
    outcome = touch_document(fs, b"", json_bytes=0)
    assert not outcome.opened and outcome.raised(FramingError), outcome.messages()


def _bump(doc: dict, path: Path_, value: Any) -> dict:
    return apply(doc, ("replace", path, value))


#: Structural edits of the single-file document that open-time validation (R4-R12) rejects.
DOCUMENT_CASES: dict[str, Callable[[dict], Any]] = {
    "unsorted-objects": lambda d: apply(d, ("swap", ("objects",), 1, 2)),
    "overlapping-objects": lambda d: _bump(d, ("objects", 2, "offset"), 256),
    "duplicate-object": lambda d: apply(d, ("duplicate", ("objects",), 1)),
    "object-past-payload": lambda d: _bump(d, ("objects", 4, "bytes"), 10**6),
    "offset-2**64-1": lambda d: _bump(d, ("objects", 4, "offset"), 2**64 - 1),
    "offset-2**64": lambda d: _bump(d, ("objects", 4, "offset"), 2**64),
    "bytes-2**64": lambda d: _bump(d, ("objects", 4, "bytes"), 2**64),
    "bytes-zero": lambda d: _bump(d, ("objects", 4, "bytes"), 0),
    "offset-negative": lambda d: _bump(d, ("objects", 0, "offset"), -1),
    "offset-10**30": lambda d: _bump(d, ("objects", 0, "offset"), 10**30),
    "shape-17-dims": lambda d: _bump(d, ("objects", 1, "shape"), [1] * 17),
    "shape-overflow": lambda d: _bump(d, ("objects", 1, "shape"), [2**32, 2**32]),
    "shape-zero": lambda d: _bump(d, ("objects", 1, "shape"), [4, 0]),
    "part-range-past-end": lambda d: _bump(d, ("bindings", "p.ab", "parts", 0, "range"), [8, 33]),
    "part-range-empty": lambda d: _bump(d, ("bindings", "p.ab", "parts", 0, "range"), [8, 8]),
    "part-range-reversed": lambda d: _bump(d, ("bindings", "p.ab", "parts", 0, "range"), [9, 8]),
    "part-range-2**64": lambda d: _bump(d, ("bindings", "p.ab", "parts", 0, "range"), [0, 2**64]),
    "part-range-three": lambda d: _bump(d, ("bindings", "p.ab", "parts", 0, "range"), [0, 1, 2]),
    "part-of-resource": lambda d: _bump(d, ("bindings", "p.ab", "parts", 0, "object"), "r.tok"),
    "binding-both-forms": lambda d: _bump(d, ("bindings", "p.a", "parts"), []),
    "files-sum-overflow": lambda d: _append_file(d, {"path": "x", "payload_bytes": 2**64 - 1}),
    "part-path-dotdot": lambda d: _append_file(d, {"path": "..", "payload_bytes": 1}),
    "part-path-slash": lambda d: _append_file(d, {"path": "a/b", "payload_bytes": 1}),
    "part-path-is-entry": lambda d: _append_file(d, {"path": "m.ninfer", "payload_bytes": 1}),
    "part-path-null": lambda d: _append_file(d, {"path": None, "payload_bytes": 1}),
    "entry-path-not-null": lambda d: _bump(d, ("files", 0, "path"), "m.ninfer"),
    "metadata-name-empty": lambda d: _bump(d, ("metadata", "name"), ""),
    "metadata-name-nul": lambda d: _bump(d, ("metadata", "name"), "a\x00"),
    "no-text-component": lambda d: {**d, "components": {"vision": d["components"]["text"]}},
    "resource-role-to-tensor": lambda d: _bump(
        d, ("components", "text", "resources", "tokenizer.json"), "w.a"
    ),
    "extra-root-member": lambda d: {**d, "zzz": {}},
    "missing-objects": lambda d: {k: v for k, v in d.items() if k != "objects"},
    "empty-id": lambda d: _bump(d, ("objects", 0, "id"), ""),
    "kind-unknown": lambda d: _bump(d, ("objects", 0, "kind"), "blob"),
}


def _append_file(doc: dict, record: dict) -> dict:
    doc["files"].append(record)
    return doc


@pytest.mark.parametrize("case", list(DOCUMENT_CASES))
def test_directory_structure_cases(case):
    fs = base("single")
    doc = DOCUMENT_CASES[case](copy.deepcopy(fs.document))
    outcome = touch_document(fs, dump(doc))
    assert not outcome.opened and outcome.raised(DirectoryError), outcome.messages()


# ----------------------------------------------------------------------- 4. file-set problems


def _sharded_with(**changes: Replacement) -> dict[str, Replacement]:
    """The sharded base with files replaced: keys are part numbers ``p1``.. or ``entry``."""
    fs = base("sharded")
    files: dict[str, Replacement] = dict(fs.files)
    for key, content in changes.items():
        files[fs.entry_name if key == "entry" else fs.names[int(key[1:])]] = content
    return files


def _foreign(index: int) -> bytes:
    return base("foreign").files[base("foreign").names[index]]


def _reindexed(index: int, new_index: int) -> bytes:
    data = base("sharded").files[base("sharded").names[index]]
    return data[:8] + struct.pack("<Q", new_index) + data[16:]


FILE_SET_CASES: dict[str, Callable[[], dict[str, Replacement]]] = {
    "missing-first-part": lambda: _sharded_with(p1=None),
    "missing-last-part": lambda: _sharded_with(p4=None),
    "part-from-another-artifact": lambda: _sharded_with(p2=_foreign(2)),
    "part-with-wrong-index": lambda: _sharded_with(p2=_reindexed(2, 3)),
    "part-with-index-zero": lambda: _sharded_with(p1=_reindexed(1, 0)),
    "parts-swapped": lambda: _sharded_with(
        p1=base("sharded").files["m.ninfer.part-0002"],
        p2=base("sharded").files["m.ninfer.part-0001"],
    ),
    "short-part": lambda: _sharded_with(p3=base("sharded").files["m.ninfer.part-0003"][:-1]),
    "long-part": lambda: _sharded_with(p3=base("sharded").files["m.ninfer.part-0003"] + b"\x00"),
    "empty-part": lambda: _sharded_with(p3=b""),
    "part-is-a-directory": lambda: _sharded_with(p2="dir"),
    "part-with-entry-magic": lambda: _sharded_with(
        p1=ENTRY_MAGIC + base("sharded").files["m.ninfer.part-0001"][8:]
    ),
}


@pytest.mark.parametrize("case", list(FILE_SET_CASES))
def test_broken_file_sets(case):
    outcome = touch_files(FILE_SET_CASES[case]())
    assert outcome.opened and outcome.raised(PartFileError), outcome.messages()


def test_part_with_right_header_but_foreign_payload():
    """Same artifact_id and index, other bytes: only the checksums can tell."""
    fs = base("sharded")
    name = fs.names[2]
    foreign = _foreign(2)
    outcome = touch_files(_sharded_with(p2=fs.files[name][:4096] + foreign[4096:]))
    assert outcome.opened and not outcome.errors, outcome.messages()
    assert outcome.report is not None
    assert any("checksum mismatch" in e for e in outcome.report.errors), outcome.report


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_part_that_is_a_fifo_does_not_hang():
    """A named pipe in place of a part: opening it for reading blocks until a writer comes."""
    outcome = touch_files(_sharded_with(p2="fifo"), seconds=1)
    assert outcome.opened and outcome.raised(PartFileError), outcome.messages()


ENTRY_CASES: dict[str, Callable[[FileSet], Replacement]] = {
    "entry-is-a-directory": lambda fs: "dir",
    "entry-is-empty": lambda fs: b"",
    "entry-missing": lambda fs: None,
    "v2-magic": lambda fs: V2_ENTRY_MAGIC + fs.entry[8:],
    "part-magic": lambda fs: PART_MAGIC + fs.entry[8:],
    "v4-magic": lambda fs: ENTRY_MAGIC[:7] + b"\x04" + fs.entry[8:],
    "json-bytes-zero": lambda fs: fs.entry[:8] + bytes(8) + fs.entry[16:],
    "json-bytes-2**64-1": lambda fs: fs.entry[:8] + b"\xff" * 8 + fs.entry[16:],
    "json-bytes-past-end": lambda fs: (
        fs.entry[:8] + struct.pack("<Q", len(fs.entry)) + fs.entry[16:]
    ),
    "entry-one-byte-longer": lambda fs: fs.entry + b"\x00",
}


@pytest.mark.parametrize("kind", ["single", "sharded"])
@pytest.mark.parametrize("case", list(ENTRY_CASES))
def test_broken_entries(kind, case):
    fs = base(kind)
    files: dict[str, Replacement] = dict(fs.files)
    files[fs.entry_name] = ENTRY_CASES[case](fs)
    outcome = touch_files(files)
    assert not outcome.opened, outcome
    expected = MissingFile if case in ("entry-is-a-directory", "entry-missing") else FramingError
    assert outcome.raised(expected), outcome.messages()
    if case == "v2-magic":
        assert "v2" in outcome.messages()[0]


# ------------------------------------------------------ 5. lazily interpreted object errors


def _single_with(edit: Callable[[dict], None], patch: dict[int, bytes] | None = None) -> Outcome:
    """The single-file artifact rewritten by ``write_raw`` after editing its document."""
    fs = base("single")
    doc = copy.deepcopy(fs.document)
    edit(doc)
    payload = {0: fs.payload, **(patch or {})}
    with tempfile.TemporaryDirectory(prefix="ninfer-fuzz-") as d:
        entry = Path(d) / fs.entry_name
        write_raw(entry, doc, payload, artifact_id=fs.artifact_id)
        return touch(entry)


def _object(doc: dict, oid: str) -> dict:
    return next(o for o in doc["objects"] if o["id"] == oid)


def _set(oid: str, **members: Any) -> Callable[[dict], None]:
    return lambda doc: _object(doc, oid).update(members)


LAZY_CASES: dict[str, tuple[Callable[[dict], None], str, type[ArtifactError]]] = {
    "unknown-encoding": (_set("r.tok", encoding="brotli_v9"), "r.tok", ResourceError),
    "zstd-of-raw-bytes": (_set("r.tok", encoding="zstd_v1"), "r.tok", ResourceError),
    "unknown-format": (_set("w.a", format="bf17"), "w.a", CodecError),
    "unknown-layout": (_set("w.a", layout="spiral_v1"), "w.a", CodecError),
    "incompatible-layout": (_set("w.a", layout="row_split_k128_v1"), "w.a", CodecError),
    "nvfp4-in-contiguous": (
        _set("w.d", format="bf16", layout="block_scale_k16_m128x4_v1"),
        "w.d",
        CodecError,
    ),
    "bytes-too-small": (_set("w.a", bytes=63), "w.a", CodecError),
    "bytes-too-large": (_set("w.a", bytes=65), "w.a", CodecError),
    "shape-disagrees": (_set("w.a", shape=[4, 9]), "w.a", CodecError),
    "scalar-nvfp4": (
        _set("w.c", format="nvfp4", layout="block_scale_k16_m128x4_v1"),
        "w.c",
        CodecError,
    ),
    "misaligned-offset": (_set("w.a", offset=257), "w.a", CodecError),
    "misaligned-by-128": (_set("w.a", offset=384), "w.a", CodecError),
    "bytes-of-other-shape": (_set("w.b", shape=[3, 257]), "w.b", CodecError),
    "shape-not-for-layout": (_set("w.d", shape=[64, 128]), "w.d", CodecError),
    "divisors-on-bf16": (_set("w.a", divisors=2), "w.a", CodecError),
}


@pytest.mark.parametrize("case", list(LAZY_CASES))
def test_lazily_interpreted_objects(case):
    edit, oid, error = LAZY_CASES[case]
    outcome = _single_with(edit)
    assert outcome.opened, outcome.messages()
    failing = [e for step, e in outcome.failures if step.endswith(f" {oid}")]
    assert failing and all(isinstance(e, error) for e in failing), outcome.messages()
    assert all(not s.endswith(f" {oid}") for s, _ in outcome.failures if s.startswith("raw"))
    if error is CodecError:
        assert outcome.report is not None
        assert any(e.startswith(f"object {oid!r}") for e in outcome.report.errors), outcome.report


def _zstd_frame(content_size: int) -> bytes:
    """A zstd frame whose header declares ``content_size`` bytes, with a 1-byte raw block."""
    header = b"\x28\xb5\x2f\xfd" + bytes([0b1110_0000]) + struct.pack("<Q", content_size)
    return header + struct.pack("<I", (1 << 3) | 1)[:3] + b"x"


@pytest.mark.parametrize("declared", [2**20, 2**32 - 1, 2**40, 2**64 - 1])
def test_zstd_resource_declaring_a_huge_content_size(declared):
    """17 stored bytes must not make the reader allocate what the frame header claims."""
    frame = _zstd_frame(declared)

    def edit(doc: dict) -> None:
        _object(doc, "r.tok").update(encoding="zstd_v1", bytes=len(frame))

    outcome = _single_with(edit, {0: frame})
    assert outcome.opened and outcome.raised(ResourceError), outcome.messages()


@pytest.mark.parametrize("declared", [2**33, 2**40])
def test_object_straddling_into_a_huge_declared_part(declared):
    """files[1] declares ``declared`` bytes but the part is missing: reading an object that
    starts in the entry and runs into that part must fail on the part, not allocate first."""
    fs = base("single")
    doc = copy.deepcopy(fs.document)
    doc["objects"].pop()  # drop w.d, so the entry's payload ends in a gap
    doc["files"].append({"path": "m.ninfer.part-0001", "payload_bytes": declared})
    big = {"id": "r.big", "kind": "resource", "encoding": "raw_bytes_v1", "offset": 2000}
    doc["objects"].append({**big, "bytes": declared // 2})
    doc["components"]["text"]["resources"]["big.bin"] = "r.big"
    outcome = touch_document(fs, dump(doc))
    assert outcome.opened, outcome.messages()
    failed = dict(outcome.failures)
    assert isinstance(failed.get("raw r.big"), PartFileError), outcome.messages()
    assert isinstance(failed.get("resource r.big"), PartFileError), outcome.messages()


def test_parts_binding_cannot_amplify_memory():
    """Parts may reuse ranges (spec 2.5), but 1.5 MB of directory must not make
    ``parameter`` build a 1.3 GB array: 40000 parts each naming all 8192 elements of w.d."""
    fs = base("single")
    doc = copy.deepcopy(fs.document)
    doc["bindings"]["p.big"] = {"parts": [{"object": "w.d", "range": [0, 8192]}] * 40000}
    files: dict[str, Replacement] = {fs.entry_name: fs.entry_with(dump(doc))}
    file_bytes = len(files[fs.entry_name])  # type: ignore[arg-type]
    with materialized(files) as entry, Artifact.open(entry) as art, guarded():
        try:
            values = art.parameter("p.big")
        except ArtifactError:
            return
        assert values.nbytes <= 64 * file_bytes, (values.nbytes, file_bytes)


# ----------------------------------------------------------------------------------- 6. CLI


def _run_cli(entry: Path) -> None:
    for extra in ([], ["--verify", "--strict", "--json"]):
        with guarded():
            result = CliRunner().invoke(inspect_main, [str(entry), *extra], catch_exceptions=False)
        try:
            stderr = result.stderr
        except ValueError:  # older click: stderr mixed into output
            stderr = ""
        assert result.exit_code in (0, 1), (extra, result.exit_code, result.output)
        assert "internal error" not in result.output + stderr, (extra, result.output, stderr)
        if "--json" in extra:
            json.loads(result.stdout)


def _cli_files(fs: FileSet, how: str, data: st.DataObject) -> dict[str, Replacement]:
    files: dict[str, Replacement] = dict(fs.files)
    if how == "truncate":
        name = data.draw(st.sampled_from(fs.names))
        files[name] = fs.files[name][: data.draw(st.integers(0, len(fs.files[name]) - 1))]
    elif how == "flip":
        _, name, start, end = data.draw(st.sampled_from(_regions(fs)))
        files[name] = _flipped(fs.files[name], start, data.draw(flips(end - start)))
    elif how == "json":
        kind = "single" if len(fs.files) == 1 else "sharded"
        files[fs.entry_name] = fs.entry_with(data.draw(mutated_text(kind)))
    elif how == "drop-part" and len(fs.files) > 1:
        files[data.draw(st.sampled_from(fs.names[1:]))] = None
    return files


@fuzz_settings(12)
@given(
    data=st.data(),
    kind=st.sampled_from(["single", "sharded"]),
    how=st.sampled_from(["truncate", "flip", "json", "drop-part"]),
)
def test_cli_on_mutated_artifacts(data, kind, how):
    with materialized(_cli_files(base(kind), how, data)) as entry:
        _run_cli(entry)


@pytest.mark.parametrize(
    "case",
    ["100000-brackets-in-config", "600-levels-with-surrogate-escape", "bom", "nan-offset"],
)
def test_cli_on_bad_directory_text(case):
    fs = base("single")
    files: dict[str, Replacement] = dict(fs.files)
    files[fs.entry_name] = fs.entry_with(TEXT_CASES[case](_text(fs)))
    with materialized(files) as entry:
        _run_cli(entry)


@pytest.mark.parametrize("case", ["missing-last-part", "part-from-another-artifact", "short-part"])
def test_cli_on_broken_file_sets(case):
    with materialized(FILE_SET_CASES[case]()) as entry:
        _run_cli(entry)


@pytest.mark.parametrize("case", ["unknown-encoding", "unknown-format", "misaligned-offset"])
def test_cli_on_lazily_broken_objects(case):
    fs = base("single")
    doc = copy.deepcopy(fs.document)
    LAZY_CASES[case][0](doc)
    with tempfile.TemporaryDirectory(prefix="ninfer-fuzz-") as d:
        entry = Path(d) / fs.entry_name
        write_raw(entry, doc, {0: fs.payload}, artifact_id=fs.artifact_id)
        _run_cli(entry)
