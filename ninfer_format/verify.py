"""Deep verification: read every byte of an artifact and check what the directory promises.

Checks per object: the recorded xxh3-64 checksum of its bytes and digest of its declaration
(format, layout, shape or encoding: see ``declaration``), then for a tensor the lazy rules
R13/R14 and the codec's scan of code words, scales and in-object padding, for a resource its
decoding (unknown encoding, corrupt ``zstd_v1`` frame, a zstd frame declared raw). The header's
artifact_id must be the one recorded in ``provenance.artifact_id``, and component targets must
not form a cycle (a warning). Digest bookkeeping is checked too: a digest that is not 16 hex
digits is an error; a key that names no object, an object without a digest and an artifact
with no checksums at all are warnings (such an artifact is valid, project decision 7, but
``strict`` does not pass it). Artifacts written before declarations and the id were recorded
get a note instead: a warning that ``strict`` does not turn into an error, so they still pass
(one of the two without the other was removed after writing: a warning).
With ``strict`` also the padding outside objects (header gap, part header pages, gaps between
objects) must be zero.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import xxhash

from .codecs import Finding
from .declaration import declaration_digest, describe_declaration
from .errors import ArtifactError
from .progress import Advance
from .reader import Artifact
from .schema import Tensor
from .validate import target_cycles

HASH_CHUNK = 64 << 20
DIGEST = re.compile(r"[0-9a-f]{16}")  # xxh3-64 as the writer prints it
ARTIFACT_ID = re.compile(r"[0-9a-f]{32}")
#: every zstd frame starts with these bytes (RFC 8878); no JSON or template text does
ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass
class VerifyReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # warnings that strict does not turn into errors: what an older writer did not record
    notes: list[str] = field(default_factory=list)
    checked_bytes: int = 0
    checksummed: int = 0  # objects whose digest was recorded and recomputed
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors


def _digest(artifact: Artifact, offset: int, length: int) -> str:
    hasher = xxhash.xxh3_64()
    for index, at, _, n in artifact.segments(offset, length):
        for start in range(0, n, HASH_CHUNK):
            hasher.update(artifact.read_file(index, at + start, min(HASH_CHUNK, n - start)))
    return hasher.hexdigest()


def bytes_to_check(artifact: Artifact) -> int:
    """The total that ``verify`` reports progress against: every object's bytes."""
    return sum(obj.bytes for obj in artifact.directory.objects)


def verify(
    artifact: Artifact, *, strict: bool = False, progress: Advance | None = None
) -> VerifyReport:
    """``progress(n)`` is called with the bytes of each object once it is checked."""
    report = VerifyReport()
    started = time.perf_counter()
    _check_artifact_id(artifact, report)
    report.warnings.extend(target_cycles(artifact.directory))
    checksums = _recorded_digests(artifact, report, "checksums", "checksum", _no_checksums)
    declarations = _recorded_digests(
        artifact,
        report,
        "declarations",
        "declaration digest",
        lambda r: _write_time_record_absent(
            artifact,
            r,
            "declarations",
            "a format, layout, shape or encoding changed after writing cannot be detected",
        ),
    )
    for obj in artifact.directory.objects:
        where = f"object {obj.id!r}"
        try:
            expected = checksums.get(obj.id)
            if expected is not None:
                report.checksummed += 1
                if _digest(artifact, obj.offset, obj.bytes) != expected:
                    report.errors.append(f"{where}: checksum mismatch (recorded {expected!r})")
            declared = declarations.get(obj.id)
            if declared is not None and declaration_digest(obj) != declared:
                # reading the bytes as they are now declared would only add noise
                report.errors.append(
                    f"{where}: declared as {describe_declaration(obj)}, which is not the "
                    "declaration it was written with (provenance.declarations): its format, "
                    "layout, shape or encoding was changed"
                )
            elif isinstance(obj, Tensor):
                _scan(artifact, obj, report)
            else:
                _check_resource(artifact, obj.id, obj.encoding, report)
        except ArtifactError as exc:
            report.errors.extend(f"{where}: {p}" if obj.id not in p else p for p in exc.problems)
        report.checked_bytes += obj.bytes
        if progress is not None:
            progress(obj.bytes)
    if strict:
        try:
            report.warnings.extend(_outside_padding(artifact))
        except ArtifactError as exc:
            report.errors.extend(exc.problems)
    report.seconds = time.perf_counter() - started
    return report


def _no_checksums(report: VerifyReport) -> None:
    # valid (project decision 7: other writers record no digests), but nothing checked the
    # bytes, so strict, which turns warnings into errors, cannot pass it
    report.warnings.append("provenance.checksums is absent: no object's bytes were checked")


#: what the writer records together about the artifact as written
WRITE_TIME_RECORDS = ("declarations", "artifact_id")


def _write_time_record_absent(
    artifact: Artifact, report: VerifyReport, member: str, consequence: str
) -> None:
    """A note when no write-time record is there (an older writer: such artifacts still pass
    strict); a warning when another one is, since the writer records them all together, so
    this one was removed after writing."""
    present = [m for m in WRITE_TIME_RECORDS if m != member and m in artifact.provenance]
    if not present:
        report.notes.append(
            f"provenance.{member} is absent (written by an older writer): {consequence}"
        )
        return
    report.warnings.append(
        f"provenance.{member} is absent, but provenance.{present[0]} is recorded and the "
        f"writer records both: it was removed after writing, and {consequence}"
    )


def _recorded_digests(
    artifact: Artifact,
    report: VerifyReport,
    member: str,
    noun: str,
    when_absent: Callable[[VerifyReport], None],
) -> dict[str, str]:
    """``provenance.<member>`` (object id -> 16 hex digits), with an error for every value that
    is not a digest (a null would otherwise leave its object unchecked without a word), and a
    warning for every digest that checks nothing and every object it leaves unchecked (a
    damaged key would otherwise drop its object silently)."""
    provenance = artifact.provenance
    if member not in provenance:
        when_absent(report)
        return {}
    recorded = provenance[member]
    if not isinstance(recorded, dict):
        report.warnings.append(f"provenance.{member} is not an object: no {noun} was checked")
        return {}
    for key in sorted(set(recorded) - set(artifact.objects)):
        report.warnings.append(f"provenance.{member}: {key!r} names no object")
    digests = {}
    for obj in artifact.directory.objects:
        if obj.id not in recorded:
            report.warnings.append(f"object {obj.id!r}: no {noun} in provenance.{member}")
            continue
        value = recorded[obj.id]
        if isinstance(value, str) and DIGEST.fullmatch(value):
            digests[obj.id] = value
        else:
            report.errors.append(
                f"object {obj.id!r}: provenance.{member} holds {_shown(value)}, expected an "
                "xxh3-64 digest (16 lowercase hex digits)"
            )
    return digests


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_artifact_id(artifact: Artifact, report: VerifyReport) -> None:
    """The header's id is free (any 16 bytes, spec section 1.3); what binds it to the directory
    is the copy the writer records, and the parts' headers (checked when they are read)."""
    provenance = artifact.provenance
    if "artifact_id" not in provenance:
        _write_time_record_absent(
            artifact,
            report,
            "artifact_id",
            "an artifact_id changed in the header cannot be detected",
        )
        return
    recorded, actual = provenance["artifact_id"], artifact.artifact_id.hex()
    if not isinstance(recorded, str) or not ARTIFACT_ID.fullmatch(recorded):
        report.errors.append(
            f"provenance.artifact_id: holds {_shown(recorded)}, expected 32 lowercase hex digits"
        )
    elif recorded != actual:
        report.errors.append(
            f"artifact_id: the header holds {actual} but provenance.artifact_id records "
            f"{recorded}: the id was changed after writing"
        )


def _check_resource(
    artifact: Artifact, object_id: str, encoding: str, report: VerifyReport
) -> None:
    data = artifact.decoded_resource(object_id)
    if encoding == "raw_bytes_v1" and data[:4] == ZSTD_FRAME_MAGIC:
        report.warnings.append(
            f"object {object_id!r}: declared raw_bytes_v1 but starts with a zstd frame magic: "
            "compressed bytes under the raw encoding (readers take them as the file itself)"
        )


def _scan(artifact: Artifact, obj: Tensor, report: VerifyReport) -> None:
    codec = artifact.codec(obj.id)
    findings: list[Finding] = codec.scan(artifact.raw(obj.id), tuple(obj.shape), obj.divisors or 1)
    for f in findings:
        (report.errors if f.severity == "error" else report.warnings).append(
            f"object {obj.id!r}: {f.message}"
        )


def _nonzero(view: np.ndarray) -> bool:
    return bool(view.size) and bool(np.any(view))


def _outside_padding(artifact: Artifact) -> list[str]:
    """Bytes no object owns: they should be zero (project decision 3)."""
    found = []
    entry = artifact.files[0]
    gap_start = 32 + artifact.json_bytes
    if _nonzero(artifact.read_file(0, gap_start, entry.payload_start - gap_start)):
        found.append(f"{entry.path.name}: non-zero bytes between the directory and the payload")
    for f in artifact.files[1:]:
        if _nonzero(artifact.read_file(f.index, 32, f.payload_start - 32)):
            found.append(f"{f.path.name}: non-zero bytes in the header page")
    end = 0
    for obj in [*artifact.directory.objects, None]:
        start = artifact.payload_bytes if obj is None else obj.offset
        if start > end and _nonzero(artifact.read(end, start - end)):
            found.append(f"payload: non-zero padding in [{end}, {start})")
        if obj is not None:
            end = obj.offset + obj.bytes
    return found
