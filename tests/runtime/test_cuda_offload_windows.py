"""What the CUDA backend's residency holds of experts that expert offload prepares one at a
time (``split_moe.prepare_experts``): each expert a row window of its own of each stored bank
(only its rows, decoding to its weights), every window of a bank alike in layout planes (the
CUDA expert table reads all experts of a projection with one set of planes), gate and up
still one window where they are packed together; ``release`` forgets an expert's windows and
no other's, and a later prepare uploads them again. So for row_split q4, NVFP4 (whole 128-row
scale tiles; a window keeps the weight divisors of the experts it holds) and fp8 row-scaled
banks alike. The residency runs on numpy here, so this checks on any machine what the GPU will
upload."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_format.codecs import codec_for
from ninfer_format.schema import Tensor
from ninfer_runtime.backends.cuda.weights import PackedWeight, Residency
from ninfer_runtime.expert_offload.split_moe import expert_names, prepare_experts

LAYER, EXPERTS = 1, (0, 2, 3)  # not a run: expert 1 stays in host memory


class NumpyBackend:
    """The CUDA backend's prepare and release on numpy."""

    def __init__(self) -> None:
        self.residency = Residency(np)

    def prepare(self, artifact, names):
        return self.residency.prepare(artifact, names)

    def release(self, weights) -> None:
        self.residency.release(weights)


@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_nvfp4", "tiny_fp8"])
def test_each_expert_is_a_window_of_its_own_rows_and_goes_alone(artifact_path, recipe) -> None:
    art = Artifact.open(artifact_path(recipe, "moe"))
    backend = NumpyBackend()
    prepared = prepare_experts(backend, art, LAYER, EXPERTS)
    residency = backend.residency
    assert set(residency.parents) == residency.cuts  # no whole bank was uploaded
    for name in ("gate", "up", "down"):
        planes = set()
        for e, weights in prepared.items():
            full = expert_names(LAYER, e)
            weight = weights[next(n for n in full if n.endswith(name))]
            assert isinstance(weight, PackedWeight) and len(weight.segments) == 1
            (seg,) = weight.segments
            parent = seg.parent
            planes.add(parent.planes)
            obj = art.objects[parent.object_id.split("[")[0]]
            codec = codec_for(obj.format, obj.layout)
            rows, columns = parent.planes.rows, parent.planes.columns
            # the window holds this expert's rows only (gate|up: both of its, packed)
            assert obj.format == codec.format and rows < int(obj.shape[0])
            assert parent.data.nbytes == codec.encoded_size((rows, columns))
            assert rows == sum(
                w.shape[0] for w in weights.values() if w.segments[0].parent is parent
            )
            values = codec.decode(parent.data, (rows, columns)).reshape(rows, columns)
            want = art.parameter(f"text/layers/{LAYER}/moe/experts/{e}/{name}", in_order=True)
            np.testing.assert_array_equal(values[seg.row0 : seg.row0 + seg.rows], want)
        assert len(planes) == 1, name  # one set of planes: one expert table projection
    gate, up = (prepared[0][expert_names(LAYER, 0)[i]].segments[0] for i in (0, 1))
    assert gate.parent is up.parent and up.row0 == gate.row0 + gate.rows  # fused gate|up

    kept = {id(s.parent) for e in (0, 3) for w in prepared[e].values() for s in w.segments}
    before = {id(p) for p in residency.parents.values()}
    backend.release(prepared[2].values())
    after = {id(p) for p in residency.parents.values()}
    assert after == before - {id(s.parent) for w in prepared[2].values() for s in w.segments}
    assert kept <= after and residency.cuts == set(residency.parents)
    again = prepare_experts(backend, art, LAYER, [2])[2]
    old = {id(s.parent) for w in prepared[2].values() for s in w.segments}
    assert not old & {id(s.parent) for w in again.values() for s in w.segments}


def test_an_nvfp4_window_keeps_the_divisors_of_the_experts_it_holds() -> None:
    """An imported NVFP4 bank has one weight divisor per expert (``stack_divisors``): a
    window of experts 1 and 2 is an object of two stacked matrices, and its planes read
    each expert's rows with that expert's divisor."""
    codec = codec_for("nvfp4", "block_scale_k16_m128x4_v1")
    values = np.random.default_rng(0).standard_normal((4 * 256, 128)).astype(np.float32)
    values *= np.repeat([1.0, 30.0, 0.2, 5.0], 256)[:, None].astype(np.float32)
    data = np.frombuffer(codec.encode(values, 4), dtype=np.uint8)
    bank = Tensor(
        id="weight/bank",
        kind="tensor",
        shape=[1024, 128],
        format=codec.format,
        layout=codec.layout,
        offset=0,
        bytes=data.size,
        divisors=4,
    )
    art = SimpleNamespace(objects={bank.id: bank}, raw=lambda object_id: data)

    names = ["moe/experts/1/gate_up", "moe/experts/2/gate_up"]
    plans = {names[0]: [(bank.id, 256, 256)], names[1]: [(bank.id, 512, 256)]}
    windows = Residency(np)._windows(art, names, plans)
    parent, first = windows[bank.id]
    assert first == 256 and parent.planes.rows == 512
    assert parent.planes.rows_per_divisor == 256
    assert parent.data.nbytes == codec.encoded_size((512, 128), 2)
    whole = codec.decode(data, (1024, 128), 4)
    np.testing.assert_array_equal(codec.decode(parent.data, (512, 128), 2), whole[256:768])


@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_nvfp4"])
def test_streamed_windows_are_kept_and_read_again_without_cutting(
    artifact_path, recipe, monkeypatch
) -> None:
    """``Residency.streaming``: a streamed expert's windows are cut from the banks once and
    kept (in pinned host memory on the GPU, ``expert_streaming.PinnedCuts``); preparing the
    expert again after its release uploads the kept bytes, cutting and planning nothing, and
    the weights are the same rows of the same bytes. Past the allowance nothing is kept, and
    outside ``streaming`` nothing is read from or added to the kept copies."""
    from ninfer_runtime.backends.cuda import weights as residency_module
    from ninfer_runtime.backends.cuda.expert_streaming import PinnedCuts

    art = Artifact.open(artifact_path(recipe, "moe"))
    cut = residency_module.slice_object
    calls: list[int] = []

    def counted(*args):
        calls.append(1)
        return cut(*args)

    monkeypatch.setattr(residency_module, "slice_object", counted)
    names = expert_names(LAYER, 2)

    def bytes_of(prepared):
        return {n: bytes(w.segments[0].parent.data) for n, w in prepared.items()}

    def shapes_of(prepared):
        return {
            n: (w.shape, [(s.parent.planes, s.row0, s.rows) for s in w.segments])
            for n, w in prepared.items()
        }

    residency = Residency(np)
    kept = PinnedCuts(1 << 30, lambda n: np.empty(n, dtype=np.uint8))
    with residency.streaming(kept):
        first = residency.prepare(art, names)
    made = len(calls)
    assert made and len(kept) == made and kept.used > 0
    residency.release(first.values())
    planned: list[int] = []
    plan = residency_module.plan_segments
    monkeypatch.setattr(
        residency_module, "plan_segments", lambda *args: planned.append(1) or plan(*args)
    )
    with residency.streaming(kept):
        again = residency.prepare(art, names)
    assert len(calls) == made  # every window from its kept copy
    assert not planned  # rebuilt as it was made: nothing planned again
    assert bytes_of(again) == bytes_of(first)
    assert shapes_of(again) == shapes_of(first)
    residency.release(again.values())
    plain = residency.prepare(art, names)  # not streaming: cut again, nothing kept
    assert len(calls) == 2 * made and len(kept) == made and planned
    assert bytes_of(plain) == bytes_of(first)

    none = PinnedCuts(0, lambda n: np.empty(n, dtype=np.uint8))
    fresh = Residency(np)
    with fresh.streaming(none):
        assert bytes_of(fresh.prepare(art, names)) == bytes_of(first)
    assert len(none) == 0 and none.used == 0


@pytest.mark.parametrize("small_blocks", [False, True])
@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_nvfp4"])
def test_a_window_of_kept_experts_uploads_in_one_copy_a_run(
    artifact_path, recipe, small_blocks, monkeypatch
) -> None:
    """Kept cuts lie side by side in pinned blocks in the order they were kept, so a window
    of experts prepared again (``prepare_groups``) uploads one copy a run of them: one for
    a window kept together, one a cut where blocks hold about one cut each. Each weight is
    the same rows of the same bytes as when it was cut."""
    from ninfer_runtime.backends.cuda import expert_streaming
    from ninfer_runtime.backends.cuda.expert_streaming import PinnedCuts

    if small_blocks:
        monkeypatch.setattr(expert_streaming, "SLAB_BYTES", 2 * expert_streaming.ALIGN)
    art = Artifact.open(artifact_path(recipe, "moe"))
    groups = [expert_names(LAYER, e) for e in range(4)]

    def contents(made):
        return [
            {n: [(bytes(s.parent.data), s.row0, s.rows) for s in w.segments] for n, w in m.items()}
            for m in made
        ]

    residency = Residency(np)
    kept = PinnedCuts(1 << 30, lambda n: np.zeros(n, dtype=np.uint8))
    with residency.streaming(kept):
        first = residency.prepare_groups(art, groups)
    residency.release([w for m in first for w in m.values()])
    copies: list[int] = []
    upload = residency._to_device
    monkeypatch.setattr(residency, "_to_device", lambda h: copies.append(h.size) or upload(h))
    with residency.streaming(kept):
        again = residency.prepare_groups(art, groups)
    assert contents(again) == contents(first)
    cuts = len({s.parent.object_id for m in again for w in m.values() for s in w.segments})
    assert cuts > 1 and len(copies) == (cuts if small_blocks else 1), copies


def test_runs_split_where_kept_cuts_are_not_side_by_side() -> None:
    from ninfer_runtime.backends.cuda.expert_streaming import ALIGN, PinnedCuts

    kept = PinnedCuts(1 << 20, lambda n: np.zeros(n, dtype=np.uint8))
    for i, size in enumerate([10, ALIGN, 3 * ALIGN + 1, 7]):
        kept.keep(f"c{i}", bytes([i + 1]) * size)
    runs = kept.runs(["c3", "c0", "c1"])  # c2 left out: c0 and c1 one run, c3 another
    assert [[key for key, _ in cuts] for _, cuts in runs] == [["c0", "c1"], ["c3"]]
    (host, cuts), (tail, _) = runs
    assert cuts == [("c0", 0), ("c1", ALIGN)] and host.size == 2 * ALIGN
    assert bytes(host[:10]) == b"\x01" * 10 and bytes(host[ALIGN:]) == b"\x02" * ALIGN
    assert bytes(tail) == b"\x04" * 7 and bytes(kept.get("c2")) == b"\x03" * (3 * ALIGN + 1)
    assert len(kept) == 4 and kept.used == ALIGN + ALIGN + 4 * ALIGN + ALIGN


class MappedStandIn:
    """What ``mapped_weights`` asks of CuPy, on numpy: a "device view" of pinned bytes is a
    record of the host address it was given and what keeps the bytes alive."""

    asnumpy = staticmethod(np.asarray)
    uint8 = np.uint8

    class cuda:
        class Device:
            id = 0

        @staticmethod
        def UnownedMemory(ptr, size, owner, device_id):
            return SimpleNamespace(ptr=ptr, size=size, owner=owner, device_id=device_id)

        @staticmethod
        def MemoryPointer(memory, offset):
            return SimpleNamespace(memory=memory, ptr=memory.ptr + offset)

    @staticmethod
    def ndarray(shape, dtype, memptr):
        return SimpleNamespace(shape=shape, data=memptr)


@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_nvfp4"])
def test_mapped_experts_are_the_device_weights_on_pinned_bytes(
    artifact_path, recipe, monkeypatch
) -> None:
    """``MappedWeights.of``: a prepared expert's weights on pinned copies of their windows,
    the same planes and rows, one copy a window (gate and up packed in one stay one), at the
    copies' host addresses; mapping it again copies nothing more, and a prefill window that
    then streams the expert uploads the kept bytes, cutting nothing; a float32 copy cannot be
    mapped."""
    from ninfer_runtime.backends.cuda import weights as residency_module
    from ninfer_runtime.backends.cuda.expert_streaming import PinnedCuts
    from ninfer_runtime.backends.cuda.mapped_weights import MappedWeights, MappingError
    from ninfer_runtime.backends.cuda.weights import DenseWeight

    art = Artifact.open(artifact_path(recipe, "moe"))
    names = expert_names(LAYER, 2)
    kept = PinnedCuts(0, lambda n: np.empty(n, dtype=np.uint8))  # no allowance: pinned anyway
    mapped = MappedWeights(MappedStandIn, kept)
    residency = Residency(np)
    prepared = residency.prepare(art, names)
    got = mapped.of(prepared)
    parents = {id(s.parent) for w in prepared.values() for s in w.segments}
    assert len(kept) == len(parents) and kept.used > 0
    for name, w in prepared.items():
        on_host = got[name]
        assert on_host.shape == w.shape
        for seg, host_seg in zip(w.segments, on_host.segments, strict=True):
            assert (host_seg.row0, host_seg.rows) == (seg.row0, seg.rows)
            assert host_seg.parent.planes == seg.parent.planes
            view = host_seg.parent.data
            copy = kept.get(seg.parent.object_id)
            assert view.data.ptr == copy.ctypes.data
            assert np.shares_memory(view.data.memory.owner, copy)  # kept alive by the view
            assert bytes(copy) == bytes(seg.parent.data)
    assert len({id(s.parent) for w in got.values() for s in w.segments}) == len(parents)
    used = kept.used
    mapped.of(residency.prepare(art, names))
    assert kept.used == used  # the same windows: nothing copied again

    cut = residency_module.slice_object
    calls: list[int] = []
    monkeypatch.setattr(residency_module, "slice_object", lambda *a: calls.append(1) or cut(*a))
    window = Residency(np)
    with window.streaming(kept):
        streamed = window.prepare(art, names)
    assert not calls  # every window uploaded from the mapped copies
    assert {n: bytes(w.segments[0].parent.data) for n, w in streamed.items()} == {
        n: bytes(w.segments[0].parent.data) for n, w in prepared.items()
    }
    with pytest.raises(MappingError, match="float32 copy"):
        mapped.of({"norm": DenseWeight(np.zeros(4, dtype=np.float32))})
