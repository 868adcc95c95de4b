"""Weight residency: each parent object uploaded once, as stored or tile packed.

Large row_split q4/q5/q8 objects are tile packed at upload (``tiles.py``: the same bits in the order
the decode products read fastest), except those of MoE blocks, whose expert kernels read the
stored layout. A logical parameter becomes either

* a ``PackedWeight``: one or more row ranges (``Segment``) of resident parent objects whose
  layout a GEMV kernel reads in place (parts bound by whole rows: Q|K|V packs, gate|up,
  stacked experts), so no dequantized copy of a projection ever stays on the device; or
* a ``DenseWeight``: a float32 device array, for what the model only reads as an array (norm
  vectors, ``a_log``, 1-D tensors) and for bindings no kernel can read in place (element
  ranges that cut rows, layouts without a kernel); the latter are logged.

Which rows make up each parameter (plans, a tensor-parallel rank's share) is worked out in
``weight_plans``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ninfer_format.codecs.slicing import slice_object, stored_divisors
from ninfer_format.progress import Advance, terminal_bar
from ninfer_format.schema import Tensor

from .formats import Planes, planes
from .tiles import PACK_FROM_WEIGHTS, PACKED_AT_ANY_SIZE, TILED_CODES, pack_tiles, tiled_planes

# The weight kinds and the plans are re-exported: the tests name them through this module
from .weight_kinds import DenseWeight, PackedWeight, Parent, Segment
from .weight_plans import (  # noqa: F401
    Cut,
    Share,
    keeps_layout,
    matrix_shape,
    plan_segments,
    rank_share,
    rows_of_plan,
)

log = logging.getLogger("ninfer.cuda")

#: bytes per host -> device copy while streaming an object (bounds pinned staging)
UPLOAD_CHUNK = 64 << 20


@dataclass
class LoadReport:
    objects: int = 0
    bytes: int = 0
    seconds: float = 0.0
    dense_fallbacks: list[str] = field(default_factory=list)


class Residency:
    """Uploads parents on demand, once each, and builds weights from them."""

    def __init__(self, xp: Any):
        self.xp = xp
        self.parents: dict[str, Parent] = {}
        #: the keys of ``parents`` that are cuts of an object (``_cut``), not whole objects
        self.cuts: set[str] = set()
        self.report = LoadReport()
        #: while ``streaming``: where cuts are kept in host memory between uploads
        self._kept: Any = None

    @contextmanager
    def streaming(self, kept: Any) -> Iterator[None]:
        """Cuts made meanwhile (streamed experts) are read from, or kept in, ``kept``
        (``expert_streaming.PinnedCuts``) instead of being cut from the banks each time; a
        prepare ``kept`` has learnt is rebuilt from its kept cuts without planning."""
        self._kept = kept
        try:
            yield
        finally:
            self._kept = None

    def release(self, weights: Iterable[Any]) -> None:
        """Forget the cuts (row windows, ``_cut``) that ``weights`` are built on, so that
        their device memory goes with the last weight that holds it: expert offload's
        streamed experts once their window is done, an expert placed back in host memory.
        Whole objects stay cached (other weights share them); a later ``prepare`` of the
        same rows uploads them again."""
        gone = {id(seg.parent) for w in weights for seg in getattr(w, "segments", ())}
        for key in [k for k in self.cuts if id(self.parents[k]) in gone]:
            del self.parents[key]
            self.cuts.discard(key)

    def prepare(self, artifact: Any, names: Iterable[str]) -> dict[str, Any]:
        return self.prepare_groups(artifact, [list(names)])[0]

    def prepare_groups(self, artifact: Any, groups: list[list[str]]) -> list[dict[str, Any]]:
        """``prepare`` of each group of names. While ``streaming``, the groups the kept
        copies have learnt are rebuilt without planning, their cuts uploaded together: one
        copy a run of cuts kept side by side (a prefill window's experts, ~1 MB a cut)."""
        kept = self._kept
        rebuilds = [None if kept is None else kept.rebuilds.get(tuple(g)) for g in groups]
        self._upload_kept(
            {
                key: p
                for r in rebuilds
                if r is not None
                for key, p in r.cuts
                if key not in self.parents
            }
        )
        out = []
        for names, rebuild in zip(groups, rebuilds, strict=True):
            if rebuild is not None:
                out.append(rebuild.weights_on([self.parents[key] for key, _ in rebuild.cuts]))
                continue
            made = self._planned(artifact, names)
            if kept is not None and all(keeps_layout(n) for n in names):
                kept.learn(names, made)
            out.append(made)
        return out

    def _upload_kept(self, cuts: dict[str, Planes]) -> None:
        """Resident parents for kept cuts (key -> planes, in their stored layout): each run
        of them that lies side by side in host memory copied into one device buffer of the
        same layout, each cut a view of it."""
        for host, placed in self._kept.runs(list(cuts)) if cuts else ():
            data = self._to_device(host)
            for key, offset in placed:
                size = self._kept.get(key).size
                self.parents[key] = Parent(key, data[offset : offset + size], cuts[key])
                self.cuts.add(key)
                self.report.objects += 1
                self.report.bytes += size

    def _planned(self, artifact: Any, names: list[str]) -> dict[str, Any]:
        plans = {name: plan_segments(artifact, name) for name in names}
        shares = {name: rank_share(artifact, name, plans[name]) for name in names}
        whole = [n for n in names if shares[n] is None and plans[n]]
        windows = self._windows(artifact, whole, plans)
        needed = sorted({oid for n in whole for oid, _, _ in plans[n]} - set(windows))
        kept = {oid for n in names if keeps_layout(n) for oid, _, _ in plans[n] or ()}
        self._upload(artifact, [oid for oid in needed if oid not in self.parents], kept)
        out: dict[str, Any] = {}
        for name in names:
            plan, share = plans[name], shares[name]
            if share is not None:
                out[name] = self._share(artifact, name, share)
                continue
            if plan is None:
                out[name] = self._dense(artifact, name)
                continue
            shape = tuple(int(d) for d in artifact.binder_report.parameters[name])
            segments = [self._segment(windows, oid, row0, rows) for oid, row0, rows in plan]
            out[name] = PackedWeight(segments, (shape[0], shape[1]), self._columns(artifact, name))
        return out

    def _windows(
        self, artifact: Any, names: list[str], plans: dict[str, Any]
    ) -> dict[str, tuple[Parent, int]]:
        """The objects of which parameters ``names`` (held whole) use a run of rows only (a
        rank's experts of a bank, under expert parallelism): each uploaded as that run (from
        its first used row to its last), ``(parent, first row)``; an object whose layout
        cannot be cut there is left to the whole upload."""
        spans: dict[str, tuple[int, int, str]] = {}
        for name in names:
            for oid, row0, rows in plans[name]:
                lo, hi, first = spans.get(oid, (row0, row0 + rows, name))
                spans[oid] = (min(lo, row0), max(hi, row0 + rows), first)
        out: dict[str, tuple[Parent, int]] = {}
        for oid, (lo, hi, name) in spans.items():
            total, columns = matrix_shape(artifact.objects[oid]) or (0, 0)
            if oid in self.parents or (lo, hi) == (0, total):
                continue
            parent = self._cut(artifact, Cut(oid, lo, hi - lo, (0, columns)), name)
            if parent is not None:
                out[oid] = (parent, lo)
        return out

    def _segment(
        self, windows: dict[str, tuple[Parent, int]], oid: str, row0: int, rows: int
    ) -> Segment:
        if oid in windows:
            parent, first = windows[oid]
            return Segment(parent, row0 - first, rows)
        return Segment(self.parents[oid], row0, rows)

    def _columns(self, artifact: Any, name: str) -> Any:
        columns = artifact.input_columns(name)
        return None if columns is None else self.xp.asarray(columns)

    def _share(self, artifact: Any, name: str, share: Share) -> Any:
        """A tensor-parallel rank's share: its cuts of the stored objects, each uploaded as an
        object of its own (the rank holds no other rows or columns of them); decoded where the
        layout cannot be cut there."""
        parents = [self._cut(artifact, cut, name) for cut in share.cuts or ()]
        if share.cuts is None or any(p is None for p in parents):
            return self._dense(artifact, name)
        segments = [Segment(p, 0, cut.rows) for p, cut in zip(parents, share.cuts, strict=True)]
        columns = self._columns(artifact, name) if share.by_rows else None
        return PackedWeight(segments, (share.shape[0], share.shape[1]), columns)

    def _cut(self, artifact: Any, cut: Cut, name: str) -> Parent | None:
        if cut.key in self.parents:
            return self.parents[cut.key]
        obj = artifact.objects[cut.object_id]
        shape = matrix_shape(obj)
        rows = (cut.row0, cut.row0 + cut.rows)
        host = None if self._kept is None else self._kept.get(cut.key)
        if host is None:
            data = slice_object(
                obj.format, obj.layout, artifact.raw(obj.id), shape, rows, cut.columns
            )
            if data is None:
                return None
            kept = self._kept
            host = np.frombuffer(data, dtype=np.uint8) if kept is None else kept.keep(cut.key, data)
        part = (cut.rows, cut.columns[1] - cut.columns[0])
        # an NVFP4 cut holds the divisors of the stacked matrices its rows come from
        divisors = stored_divisors(obj.format, obj.layout, part, host.size)
        parent = self._resident(
            cut.key,
            self._to_device(host),
            planes(obj.format, obj.layout, part, divisors),
            tile=not keeps_layout(name),
        )
        self.parents[cut.key] = parent
        self.cuts.add(cut.key)
        self.report.objects += 1
        self.report.bytes += host.size
        return parent

    def _to_device(self, host: np.ndarray) -> Any:
        """A device copy of ``host`` bytes, on the current stream (pinned ``host``: the copy
        is a DMA the host only issues)."""
        if self.xp is np:
            return host.copy()
        out = self.xp.empty(host.size, dtype=self.xp.uint8)
        out.set(host, stream=self.xp.cuda.get_current_stream())
        return out

    def _dense(self, artifact: Any, name: str) -> DenseWeight:
        values = artifact.parameter(name, in_order=True)
        if values.ndim == 2:
            self.report.dense_fallbacks.append(name)
            log.info("%s: no in-place kernel for its binding; kept as a float32 copy", name)
        return DenseWeight(self.xp.asarray(values, dtype=self.xp.float32))

    def _resident(self, object_id: str, data: Any, p: Planes, tile: bool) -> Parent:
        """The parent of stored bytes ``data``, tile packed where ``tile`` and the layout and
        size call for it (the stored copy is then released)."""
        large = p.code in PACKED_AT_ANY_SIZE or p.rows * p.columns >= PACK_FROM_WEIGHTS
        if tile and large and p.code in TILED_CODES and not p.tiled:
            data = pack_tiles(self.xp, data, p.code, p.rows, p.columns)
            p = tiled_planes(p.code, p.rows, p.columns)
        return Parent(object_id, data, p)

    def _upload(self, artifact: Any, object_ids: list[str], kept: set[str]) -> None:
        """Upload objects; those in ``kept`` stay in their stored layout."""
        if not object_ids:
            return
        objects = [artifact.objects[oid] for oid in object_ids]
        total = sum(int(obj.bytes) for obj in objects)
        start = time.perf_counter()
        with terminal_bar(total, "upload", "B") as advance:
            for obj in objects:
                self.parents[obj.id] = self._resident(
                    obj.id,
                    self._stream(artifact, obj, advance),
                    planes(obj.format, obj.layout, matrix_shape(obj), int(obj.divisors or 1)),
                    tile=obj.id not in kept,
                )
        self.xp.cuda.Device().synchronize()
        seconds = time.perf_counter() - start
        self.report.objects += len(objects)
        self.report.bytes += total
        self.report.seconds += seconds
        log.info(
            "uploaded %d objects, %.2f GB in %.2f s (%.2f GB/s)",
            len(objects),
            total / 1e9,
            seconds,
            total / 1e9 / max(seconds, 1e-9),
        )

    def _stream(self, artifact: Any, obj: Tensor, advance: Advance) -> Any:
        raw = artifact.raw(obj.id)  # a view of the memory map: pages are read as copied
        data = self.xp.empty(int(obj.bytes), dtype=self.xp.uint8)
        for a in range(0, raw.size, UPLOAD_CHUNK):
            b = min(a + UPLOAD_CHUNK, raw.size)
            data[a:b].set(raw[a:b])
            advance(b - a)
        return data
