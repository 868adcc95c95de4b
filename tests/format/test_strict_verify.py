"""``ninfer-inspect --verify --strict`` against edits that keep every object's bytes intact."""

import json
import struct

import pytest
from click.testing import CliRunner

from ninfer_format import Artifact, ArtifactWriter, ResourceSpec
from ninfer_format.declaration import declaration_digest
from ninfer_format.inspect_cli import main
from ninfer_format.resources import encode_resource
from ninfer_format.sample import write_sample
from ninfer_format.schema import Directory
from ninfer_format.validate import target_cycles

from .helpers import small_artifact


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


# the toy artifacts of ``helpers`` name no architecture, so strict always adds this line
NO_BINDER = "error: strict: binder: no binder for architecture"


def error_lines(out):
    return [
        line
        for line in out.splitlines()
        if line.startswith("error: ") and not line.startswith(NO_BINDER)
    ]


def edit_directory(path, edit):
    """Apply ``edit`` to the parsed JSON directory and write it back into the same reserved
    space (padded with spaces): framing, payload and byte checksums stay as they were."""
    data = bytearray(path.read_bytes())
    json_bytes = struct.unpack("<Q", data[8:16])[0]
    document = json.loads(data[32 : 32 + json_bytes])
    edit(document)
    text = json.dumps(document, separators=(",", ":")).encode()
    assert len(text) <= json_bytes
    data[32 : 32 + json_bytes] = text + b" " * (json_bytes - len(text))
    path.write_bytes(bytes(data))


def strip_write_time_records(document):
    """What an artifact written before declarations and the id were recorded looks like."""
    del document["provenance"]["declarations"]
    del document["provenance"]["artifact_id"]


@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "s.ninfer"
    write_sample(path)
    return path


def q4_objects(path):
    with Artifact.open(path) as art:
        return [o.id for o in art.directory.objects if getattr(o, "format", "") == "q4_g64_fp16"]


def relabel_q4_as_nf4(document):
    for obj in document["objects"]:
        if obj.get("format") == "q4_g64_fp16":
            obj["format"] = "nf4_g64_fp16"


def test_a_fresh_sample_passes_strict(sample):
    code, out = run(sample, "--verify", "--strict", "--no-objects")
    assert code == 0, out
    assert "warning" not in out


def test_q4_relabelled_nf4_is_refused(sample):
    relabelled = q4_objects(sample)
    assert relabelled  # the sample has q4 objects to relabel
    edit_directory(sample, relabel_q4_as_nf4)
    code, out = run(sample, "--verify", "--strict", "--no-objects")
    assert code == 1
    assert len(error_lines(out)) == len(relabelled)  # one line per object, nothing else
    for oid in relabelled:
        assert f"error: object {oid!r}: declared as tensor nf4_g64_fp16/row_split_k128_v1 " in out
    assert "which is not the declaration it was written with (provenance.declarations)" in out
    assert f"{50} of 50 objects checksummed" in out  # every byte digest still matched


def test_without_declarations_a_relabel_passes_with_a_note(sample):
    edit_directory(sample, lambda d: (strip_write_time_records(d), relabel_q4_as_nf4(d)))
    code, out = run(sample, "--verify", "--strict", "--no-objects")
    assert code == 0, out  # what docs/inspect.md says strict cannot see
    assert "warning: provenance.declarations is absent (written by an older writer)" in out


def test_an_artifact_from_before_the_declarations_still_verifies(sample):
    edit_directory(sample, strip_write_time_records)
    code, out = run(sample, "--verify", "--strict", "--no-objects")
    assert code == 0, out
    assert error_lines(out) == []
    assert "warning: provenance.declarations is absent (written by an older writer)" in out
    assert "warning: provenance.artifact_id is absent (written by an older writer)" in out
    code, out = run(sample, "--verify", "--strict", "--json")
    doc = json.loads(out)
    assert doc["valid"] is True and len(doc["warnings"]) == 2


@pytest.mark.parametrize("removed", ["declarations", "artifact_id"])
def test_one_write_time_record_removed_fails_strict(sample, removed):
    """The writer records both: one without the other was removed, not an older writer."""
    kept = "artifact_id" if removed == "declarations" else "declarations"

    def edit(document):
        del document["provenance"][removed]
        relabel_q4_as_nf4(document)

    edit_directory(sample, edit)
    code, out = run(sample, "--verify", "--strict", "--no-objects")
    assert code == 1, out
    assert (
        f"error: strict: provenance.{removed} is absent, but provenance.{kept} is recorded "
        "and the writer records both: it was removed after writing" in out
    )
    assert "older writer" not in out


def test_a_null_checksum_is_refused(tmp_path):
    path = tmp_path / "m.ninfer"
    small_artifact(path)
    edit_directory(path, lambda d: d["provenance"]["checksums"].update({"w.b": None}))
    code, out = run(path, "--verify", "--strict")
    assert code == 1
    assert error_lines(out) == [
        "error: object 'w.b': provenance.checksums holds null, expected an xxh3-64 digest "
        "(16 lowercase hex digits)"
    ]
    assert run(path, "--verify")[0] == 1  # not a matter of strictness: nothing checked w.b


def zstd_artifact(path):
    frame = encode_resource("zstd_v1", b'{"vocab": "' + b"ab" * 500 + b'"}')
    with ArtifactWriter(
        path,
        components={
            "text": {"config": {"model_type": "toy"}, "resources": {"tokenizer.json": "r"}}
        },
        objects=[ResourceSpec("r", "zstd_v1", len(frame))],
        bindings={},
    ) as w:
        w.write("r", frame)


def relabel_raw(document):
    document["objects"][0]["encoding"] = "raw_bytes_v1"


def test_a_zstd_resource_relabelled_raw_is_refused(tmp_path):
    path = tmp_path / "m.ninfer"
    zstd_artifact(path)
    assert error_lines(run(path, "--verify", "--strict")[1]) == []
    edit_directory(path, relabel_raw)
    code, out = run(path, "--verify", "--strict")
    assert code == 1
    assert error_lines(out) == [
        "error: object 'r': declared as resource raw_bytes_v1, which is not the declaration it "
        "was written with (provenance.declarations): its format, layout, shape or encoding "
        "was changed"
    ]


def test_a_zstd_frame_declared_raw_is_refused_even_without_declarations(tmp_path):
    path = tmp_path / "m.ninfer"
    zstd_artifact(path)
    edit_directory(path, lambda d: (strip_write_time_records(d), relabel_raw(d)))
    code, out = run(path, "--verify")
    assert code == 0  # a raw resource may hold any bytes...
    code, out = run(path, "--verify", "--strict")
    assert code == 1  # ...but these are a compressed tokenizer no reader can use
    assert error_lines(out) == [
        "error: strict: object 'r': declared raw_bytes_v1 but starts with a zstd frame magic: "
        "compressed bytes under the raw encoding (readers take them as the file itself)"
    ]


def test_an_edited_artifact_id_is_refused(tmp_path):
    path = tmp_path / "m.ninfer"
    small_artifact(path, artifact_id=bytes(range(16)))
    data = bytearray(path.read_bytes())
    data[16] ^= 0xFF  # first byte of the header's artifact_id
    path.write_bytes(bytes(data))
    code, out = run(path, "--verify", "--strict")
    assert code == 1
    assert error_lines(out) == [
        "error: artifact_id: the header holds ff0102030405060708090a0b0c0d0e0f but "
        "provenance.artifact_id records 000102030405060708090a0b0c0d0e0f: the id was changed "
        "after writing"
    ]


def test_an_artifact_id_edited_in_the_entry_only_is_refused(tmp_path):
    path = tmp_path / "m.ninfer"
    tensors = {f"w.{i}": ((64, 64), "bf16", "contiguous_le_v1") for i in range(4)}
    small_artifact(path, shard_limit=4096 * 3, tensors=tensors, artifact_id=bytes(range(16)))
    assert path.with_name("m.ninfer.part-0001").exists()
    edit_directory(path, lambda d: d["provenance"].update({"artifact_id": "ab" * 16}))
    data = bytearray(path.read_bytes())
    data[16:32] = bytes.fromhex("ab" * 16)  # header and record agree; the part does not
    path.write_bytes(bytes(data))
    code, out = run(path, "--verify", "--strict")
    assert code == 1
    assert "m.ninfer.part-0001" in out and "artifact_id" in out
    assert "provenance.artifact_id records" not in out


def test_a_text_mtp_target_cycle_is_refused(sample):
    edit_directory(sample, lambda d: d["components"]["text"].update({"target": "mtp"}))
    code, out = run(sample, "--verify", "--no-objects")
    assert code == 0  # the generic schema allows it (spec section 8)...
    code, out = run(sample, "--verify", "--strict", "--no-objects")
    assert code == 1  # ...but no chain of targets ends at a main component
    assert error_lines(out) == [
        "error: strict: components['mtp'].target: the targets form a cycle 'mtp' -> 'text' -> "
        "'mtp'; a chain of targets must end at a component without one"
    ]


def test_target_cycles_are_reported_once_each():
    def component(target=None):
        return {"config": {}} | ({"target": target} if target else {})

    directory = Directory.model_validate(
        {
            "components": {
                "text": component(),
                "a": component("b"),
                "b": component("c"),
                "c": component("b"),  # a leads into the b <-> c loop
                "d": component("d"),
                "e": component("text"),
            },
            "objects": [{"id": "r", "kind": "resource", "encoding": "x", "offset": 0, "bytes": 1}],
            "bindings": {},
            "uses": [],
            "files": [{"path": None, "payload_bytes": 1}],
        }
    )
    cycles = target_cycles(directory)
    assert len(cycles) == 2
    assert cycles[0].startswith("components['b'].target: the targets form a cycle 'b' -> 'c' ->")
    assert cycles[0].endswith(" 'b'; a chain of targets must end at a component without one")
    assert cycles[1].startswith("components['d'].target: the targets form a cycle 'd' -> 'd';")


def test_the_declaration_digest_covers_every_declared_member():
    tensor = {"id": "w", "kind": "tensor", "shape": [8, 64], "format": "q4_g64_fp16"}
    tensor |= {"layout": "row_split_k128_v1", "offset": 0, "bytes": 512}
    parsed = Directory.model_validate(
        {
            "components": {"text": {"config": {}}},
            "objects": [tensor],
            "bindings": {},
            "uses": [],
            "files": [{"path": None, "payload_bytes": 512}],
        }
    ).objects[0]
    assert declaration_digest(parsed) == declaration_digest(tensor)  # reader == writer
    assert declaration_digest(tensor | {"offset": 256, "id": "v"}) == declaration_digest(tensor)
    variants = [
        {"shape": [64, 8]},
        {"format": "nf4_g64_fp16"},
        {"layout": "other_v1"},
        {"divisors": 2},
    ]
    digests = {declaration_digest(tensor | v) for v in variants} | {declaration_digest(tensor)}
    assert len(digests) == len(variants) + 1
    raw = {"kind": "resource", "encoding": "raw_bytes_v1"}
    assert declaration_digest(raw) != declaration_digest(raw | {"encoding": "zstd_v1"})
