"""Deep verification: read every byte of an artifact and check what the directory promises.

Checks per object: the recorded xxh3-64 checksum, then for a tensor the lazy rules R13/R14
and the codec's scan of code words, scales and in-object padding, for a resource its decoding
(unknown encoding, corrupt ``zstd_v1`` frame). Checksum bookkeeping is checked too: a key that
names no object, an object without a digest and an artifact with no digests at all are
warnings (such an artifact is valid, project decision 7, but ``strict`` does not pass it).
With ``strict`` also the padding outside objects (header gap, part header pages, gaps between
objects) must be zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import xxhash

from .codecs import Finding
from .errors import ArtifactError
from .progress import Advance
from .reader import Artifact
from .schema import Tensor

HASH_CHUNK = 64 << 20


@dataclass
class VerifyReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
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
    checksums = _recorded_checksums(artifact, report)
    for obj in artifact.directory.objects:
        where = f"object {obj.id!r}"
        try:
            expected = checksums.get(obj.id)
            if expected is not None:
                report.checksummed += 1
                if _digest(artifact, obj.offset, obj.bytes) != expected:
                    report.errors.append(f"{where}: checksum mismatch (recorded {expected!r})")
            if isinstance(obj, Tensor):
                _scan(artifact, obj, report)
            else:
                artifact.decoded_resource(obj.id)
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


def _recorded_checksums(artifact: Artifact, report: VerifyReport) -> dict[str, object]:
    """``provenance.checksums``, with a warning for every digest that checks nothing and every
    object it leaves unchecked (a damaged key would otherwise drop its object silently)."""
    provenance = artifact.provenance
    if "checksums" not in provenance:
        # valid (project decision 7: other writers record no digests), but nothing checked the
        # bytes, so strict, which turns warnings into errors, cannot pass it
        report.warnings.append("provenance.checksums is absent: no object's bytes were checked")
        return {}
    checksums = provenance["checksums"]
    if not isinstance(checksums, dict):
        report.warnings.append("provenance.checksums is not an object: no checksum was checked")
        return {}
    for key in sorted(set(checksums) - set(artifact.objects)):
        report.warnings.append(f"provenance.checksums: {key!r} names no object")
    for obj in artifact.directory.objects:
        if obj.id not in checksums:
            report.warnings.append(f"object {obj.id!r}: no checksum in provenance.checksums")
    return checksums


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
