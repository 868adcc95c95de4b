"""What the CUDA backend's residency holds of experts that expert offload prepares one at a
time (``split_moe.prepare_experts``): each expert a row window of its own of each stored bank
(only its rows, decoding to its weights), every window of a bank alike in layout planes (the
CUDA expert table reads all experts of a projection with one set of planes), gate and up
still one window where they are packed together; ``release`` forgets an expert's windows and
no other's, and a later prepare uploads them again. The residency runs on numpy here, so this
checks on any machine what the GPU will upload."""

from __future__ import annotations

import numpy as np

from ninfer_format import Artifact
from ninfer_format.codecs import codec_for
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


def test_each_expert_is_a_window_of_its_own_rows_and_goes_alone(artifact_path) -> None:
    art = Artifact.open(artifact_path("tiny_q4", "moe"))
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
