import json

import numpy as np
import pytest
import xxhash

from ninfer_format import (
    Artifact,
    ArtifactWriter,
    CodecError,
    FramingError,
    LookupFailed,
    MissingFile,
    PartFileError,
    ResourceError,
    ResourceSpec,
    TensorSpec,
    WriteError,
)
from ninfer_format.codecs import codec_for
from ninfer_format.resources import decode_resource, encode_resource

from .helpers import RNG, load_example, small_artifact, write_raw


def test_round_trip_single_file(tmp_path):
    path = tmp_path / "m.ninfer"
    encoded = small_artifact(path)
    with Artifact.open(path) as art:
        assert len(art.files) == 1
        assert art.metadata == {"name": "toy"}
        assert art.resource("tokenizer.json") == encoded["r.tok"]
        for oid in ("w.a", "w.b", "w.c", "w.d"):
            assert art.raw(oid).tobytes() == encoded[oid]
            obj = art.objects[oid]
            assert obj.offset % 256 == 0
            assert art.tensor(oid).shape == tuple(obj.shape)
        a = art.tensor("w.a")
        b = art.tensor("w.b")
        np.testing.assert_array_equal(art.parameter("p.a"), a)
        np.testing.assert_array_equal(
            art.parameter("p.ab"), np.concatenate([a.reshape(-1)[8:16], b.reshape(-1)[:130]])
        )
        assert art.parameter("p.ab", shape=(2, 69)).shape == (2, 69)
        checks = art.provenance["checksums"]
        assert checks["w.b"] == xxhash.xxh3_64_hexdigest(encoded["w.b"])
        # reference reservation: JSON padded to the payload start, no zero gap
        assert 32 + art.json_bytes == art.entry_payload_start
        assert art.entry_payload_start % 4096 == 0


def test_zero_copy_view_when_object_in_one_file(tmp_path):
    path = tmp_path / "m.ninfer"
    small_artifact(path)
    with Artifact.open(path) as art:
        view = art.raw("w.d")
        assert not view.flags.owndata and not view.flags.writeable


def test_sharded_round_trip_and_straddling_objects(tmp_path):
    path = tmp_path / "m.ninfer"
    limit = 4096 * 3
    tensors = {f"w.{i}": ((64, 64), "bf16", "contiguous_le_v1") for i in range(6)}
    encoded = small_artifact(path, shard_limit=limit, tensors=tensors)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "m.ninfer" and names[1] == "m.ninfer.part-0001"
    assert all(p.stat().st_size <= limit for p in tmp_path.iterdir())
    with Artifact.open(path) as art:
        assert len(art.files) > 2
        straddling = 0
        for oid, data in encoded.items():
            obj = art.objects[oid]
            straddling += len(art.segments(obj.offset, obj.bytes)) > 1
            assert art.raw(oid).tobytes() == data
        assert straddling > 0


def test_segments_worked_example_from_spec(tmp_path):
    doc = load_example("artifact-v3-mixed-sharded.json")
    path = tmp_path / "artifact-v3-mixed-sharded.ninfer"
    write_raw(path, doc, json_bytes=65504)
    with Artifact.open(path) as art:
        assert art.entry_payload_start == 65536
        assert [f.logical_start for f in art.files] == [0, 63934464, 127930368]
        assert art.segments(12836608, 63569920) == [
            (0, 12902144, 0, 51097856),
            (1, 4096, 51097856, 12472064),
        ]
        assert art.segments(76406784, 63569920) == [
            (1, 12476416, 0, 51523584),
            (2, 4096, 51523584, 12046336),
        ]
        assert art.segments(art.payload_bytes, 0) == []


def test_continuation_files_are_opened_lazily_and_checked(tmp_path):
    path = tmp_path / "m.ninfer"
    small_artifact(
        path,
        shard_limit=4096 * 3,
        tensors={f"w.{i}": ((64, 64), "bf16", "contiguous_le_v1") for i in range(6)},
    )
    last = sorted(tmp_path.glob("m.ninfer.part-*"))[-1]
    last.rename(tmp_path / "moved")
    with Artifact.open(path) as art:  # opening needs the entry only
        art.raw("w.0")
        with pytest.raises(PartFileError, match="missing"):
            art.raw("w.5")
    (tmp_path / "moved").rename(last)
    data = bytearray(last.read_bytes())
    data[20] ^= 1
    last.write_bytes(bytes(data))
    with Artifact.open(path) as art, pytest.raises(PartFileError, match="another artifact"):
        art.raw("w.5")
    data[20] ^= 1
    last.write_bytes(bytes(data[:-1]))
    with Artifact.open(path) as art, pytest.raises(PartFileError, match="bytes, expected"):
        art.raw("w.5")


def test_examples_open_with_synthesized_payload(tmp_path):
    for name in ("artifact-v3-text.json", "artifact-v3-mixed-sharded.json"):
        doc = load_example(name)
        payload = {}
        for obj in doc["objects"]:
            if obj["kind"] == "tensor" and obj["bytes"] < 10**6:
                codec = codec_for(obj["format"], obj["layout"])
                values = RNG.standard_normal(obj["shape"]).astype(np.float32)
                payload[obj["offset"]] = codec.encode(values)
        path = tmp_path / name.replace(".json", ".ninfer")
        write_raw(path, doc, payload, json_bytes=65504)
        with Artifact.open(path) as art:
            assert art.binder_report.ok, art.binder_report.errors
            for obj in doc["objects"]:
                if obj["offset"] in payload:
                    assert art.raw(obj["id"]).tobytes() == payload[obj["offset"]]
                    art.tensor(obj["id"])


def test_lazy_codec_checks(tmp_path):
    doc = load_example("artifact-v3-text.json")
    doc["objects"][4]["format"] = "exl3_mul1"
    doc["objects"][5]["bytes"] = 200
    path = tmp_path / "a.ninfer"
    write_raw(path, doc)
    with Artifact.open(path) as art:  # names are interpreted lazily
        with pytest.raises(CodecError, match="'exl3_mul1' is not implemented"):
            art.tensor("w.embedding")
        with pytest.raises(CodecError, match="bytes is 200"):
            art.tensor("w.final_norm")
        with pytest.raises(LookupFailed):
            art.tensor("nope")
        with pytest.raises(LookupFailed, match="resource"):
            art.tensor("r.tokenizer")


def test_entry_size_must_match(tmp_path):
    path = tmp_path / "a.ninfer"
    write_raw(path, load_example("artifact-v3-text.json"))
    with path.open("ab") as fh:
        fh.write(b"\0")
    with pytest.raises(FramingError, match="expected"):
        Artifact.open(path)
    with pytest.raises(MissingFile):
        Artifact.open(tmp_path / "absent.ninfer")


def test_writer_refuses_to_overwrite_and_cleans_up(tmp_path):
    path = tmp_path / "m.ninfer"
    small_artifact(path)
    before = path.read_bytes()
    with pytest.raises(WriteError, match="already exists"):
        small_artifact(path)
    assert path.read_bytes() == before
    small_artifact(path, overwrite=True)
    assert path.read_bytes() != before  # new artifact id and values
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ninfer"]


def test_writer_failure_leaves_nothing(tmp_path):
    path = tmp_path / "m.ninfer"
    specs = [
        TensorSpec("w.a", (4,), "fp32", "contiguous_le_v1"),
        TensorSpec("w.b", (4,), "fp32", "contiguous_le_v1"),
    ]
    comps = {"text": {"config": {}}}
    with (
        pytest.raises(RuntimeError),
        ArtifactWriter(path, components=comps, objects=specs, bindings={}) as w,
    ):
        w.write("w.a", np.zeros(4, np.float32))
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    with (
        pytest.raises(WriteError, match="not written"),
        ArtifactWriter(path, components=comps, objects=specs, bindings={}) as w,
    ):
        w.write("w.a", np.zeros(4, np.float32))
    assert list(tmp_path.iterdir()) == []
    with (
        pytest.raises(WriteError, match="out of order"),
        ArtifactWriter(path, components=comps, objects=specs, bindings={}) as w,
    ):
        w.write("w.b", np.zeros(4, np.float32))
    with (
        pytest.raises(WriteError, match="holds 16"),
        ArtifactWriter(path, components=comps, objects=specs, bindings={}) as w,
    ):
        w.write("w.a", np.zeros(5, np.float32))
    assert list(tmp_path.iterdir()) == []


def test_writer_validates_before_creating_files(tmp_path):
    path = tmp_path / "m.ninfer"
    specs = [TensorSpec("w.a", (4,), "fp32", "contiguous_le_v1")]
    with pytest.raises(WriteError) as err:
        ArtifactWriter(
            path,
            components={"text": {"config": {}}},
            objects=specs,
            bindings={"p": {"object": "nope"}},
        )
    assert any("'nope' does not exist" in p for p in err.value.problems)
    with pytest.raises(WriteError, match="not implemented"):
        ArtifactWriter(
            path,
            components={"text": {"config": {}}},
            objects=[TensorSpec("w", (4,), "fp99", "contiguous_le_v1")],
            bindings={},
        )
    with pytest.raises(WriteError, match="N % 128"):
        ArtifactWriter(
            path,
            components={"text": {"config": {}}},
            objects=[TensorSpec("w", (100, 64), "nvfp4", "block_scale_k16_m128x4_v1")],
            bindings={},
        )
    assert list(tmp_path.iterdir()) == []


def test_zstd_resource_round_trip(tmp_path):
    path = tmp_path / "m.ninfer"
    raw = json.dumps({"vocab": list(range(2000))}).encode()
    stored = encode_resource("zstd_v1", raw)
    assert len(stored) < len(raw)
    specs = [
        ResourceSpec("r", "zstd_v1", len(stored)),
        TensorSpec("w", (2,), "fp32", "contiguous_le_v1"),
    ]
    with ArtifactWriter(
        path,
        components={"text": {"config": {}, "resources": {"t.json": "r"}}},
        objects=specs,
        bindings={},
    ) as w:
        w.write("r", stored)
        w.write("w", np.ones(2, np.float32))
    with Artifact.open(path) as art:
        assert art.resource("t.json") == raw
        with pytest.raises(LookupFailed, match="no resource"):
            art.resource("other")


def _damaged(frame: bytes, how: str) -> bytes:
    if how == "truncated":
        return frame[:-3]
    if how == "trailing":
        return frame + b"\x00"
    middle = len(frame) // 2
    return frame[:middle] + bytes([frame[middle] ^ 0xFF]) + frame[middle + 1 :]


@pytest.mark.parametrize(
    "how, message",
    [
        ("truncated", "did not decompress full frame"),
        ("trailing", "1 bytes of unused data"),
        ("flipped", "doesn't match checksum"),
    ],
)
def test_zstd_resource_damage_is_an_error(how, message):
    frame = encode_resource("zstd_v1", json.dumps({"vocab": list(range(500))}).encode())
    with pytest.raises(ResourceError, match=message):
        decode_resource("zstd_v1", _damaged(frame, how))


def test_zstd_frame_must_declare_its_size():
    import zstandard

    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"{}" * 100)
    with pytest.raises(ResourceError, match="does not declare its content size"):
        decode_resource("zstd_v1", frame)


def test_large_sparse_layout_numbers(tmp_path):
    """Sharding math of a writer run at the spec's 2-file illustration scale (sparse files)."""
    path = tmp_path / "big.ninfer"
    n = 8_000_000_000  # 32e9 bytes of fp32: one page more than the entry can hold
    specs = [TensorSpec("w", (n,), "fp32", "contiguous_le_v1")]
    w = ArtifactWriter(path, components={"text": {"config": {}}}, objects=specs, bindings={})
    try:
        sizes = [f.payload_bytes for f in w.files]
        assert w.files[1].path == "big.ninfer.part-0001"
        assert sizes[0] == 32_000_000_000 - (32 + len(w._json))
        assert sum(sizes) == n * 4
    finally:
        w.abort()
    assert list(tmp_path.iterdir()) == []
