import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_format import Artifact, ArtifactWriter, ResourceSpec
from ninfer_format.inspect_cli import main
from ninfer_format.resources import encode_resource

from .helpers import load_example, small_artifact, write_raw


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def artifact(tmp_path):
    path = tmp_path / "m.ninfer"
    small_artifact(path)
    return path


def test_text_summary(artifact):
    code, out = run(artifact)
    assert code == 0, out
    for needle in (
        "artifact_id",
        "components",
        "w.b",
        "q5_g64_fp16",
        "row_split_k128_v1",
        "[3, 130]",
        "totals per format",
        "no binder for architecture",
        "valid",
    ):
        assert needle in out


def test_json_document(artifact):
    code, out = run(artifact, "--json", "--verify")
    assert code == 0
    doc = json.loads(out)
    assert doc["valid"] is True
    assert doc["verify"]["checksummed_objects"] == 5
    assert {o["id"] for o in doc["objects"]} == {"r.tok", "w.a", "w.b", "w.c", "w.d"}
    assert doc["formats"]["q5_g64_fp16"]["objects"] == 1
    assert doc["files"][0]["file_size"] == artifact.stat().st_size


def test_verify_finds_a_flipped_payload_byte(artifact):
    with EditedBytes(artifact) as data:
        data[-5] ^= 0xFF  # inside the last object (nvfp4 scales/divisor)
    code, out = run(artifact, "--verify")
    assert code == 1
    assert "checksum mismatch" in out
    assert "INVALID" in out


class EditedBytes:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.data = bytearray(self.path.read_bytes())
        return self.data

    def __exit__(self, *exc):
        self.path.write_bytes(bytes(self.data))


def test_dump_object_and_parameter(artifact, tmp_path):
    out = tmp_path / "a.npy"
    code, text = run(artifact, "--dump", "w.b", "-o", out)
    assert code == 0, text
    assert np.load(out).shape == (3, 130)
    code, _ = run(artifact, "--dump", "p.ab", "-o", out)
    assert code == 0 and np.load(out).shape == (138,)
    code, text = run(artifact, "--dump", "nope", "-o", out)
    assert code == 2


def test_exit_status_for_usage_and_missing_file(tmp_path, artifact):
    assert run(tmp_path / "absent.ninfer")[0] == 2
    assert run(artifact, "--dump", "w.b")[0] == 2
    assert run(artifact, "--bogus")[0] == 2


def test_invalid_artifact_lists_problems(tmp_path):
    doc = load_example("artifact-v3-text.json")
    doc["objects"][1]["offset"] = 3
    doc["uses"][0]["parameter"] = "nope"
    path = tmp_path / "bad.ninfer"
    write_raw(path, doc)
    code, out = run(path)
    assert code == 1
    assert out.count("error:") == 2
    code, out = run(path, "--json")
    assert code == 1 and len(json.loads(out)["errors"]) == 2


def test_garbage_file_is_invalid_without_traceback(tmp_path):
    path = tmp_path / "junk.ninfer"
    path.write_bytes(b"\x00" * 100)
    proc = subprocess.run(
        [sys.executable, "-m", "ninfer_format.inspect_cli", str(path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "not a .ninfer v3 entry" in proc.stdout


def test_strict_reports_nonzero_padding(artifact):
    with Artifact.open(artifact) as art:
        gap = art.objects["w.a"].offset - 1  # byte before an aligned tensor is padding
        pos = art.entry_payload_start + gap
        assert art.objects["r.tok"].offset + art.objects["r.tok"].bytes <= gap
    with EditedBytes(artifact) as data:
        data[pos] = 7
    assert run(artifact, "--verify")[0] == 0
    code, out = run(artifact, "--strict")
    assert code == 1 and "non-zero padding" in out


def _edit_directory(path, old: bytes, new: bytes, after: bytes = b"") -> None:
    """Replace the first ``old`` after ``after`` in the entry's JSON (same length: the
    framing and every checksum stay as they were)."""
    assert len(old) == len(new)
    with EditedBytes(path) as data, Artifact.open(path) as art:
        start = data.index(after, 32) if after else 32
        at = data.index(old, start)
        assert at + len(old) <= 32 + art.json_bytes
        data[at : at + len(old)] = new


def test_verify_decodes_resources_an_unknown_encoding_fails(tmp_path):
    artifact = tmp_path / "m.ninfer"
    with ArtifactWriter(  # written so (a relabel is caught before decoding: test_strict_verify)
        artifact,
        components={"text": {"config": {}, "resources": {"tokenizer.json": "r.tok"}}},
        objects=[ResourceSpec("r.tok", "raw_bytes_v9", 2)],
        bindings={},
    ) as w:
        w.write("r.tok", b"{}")
    code, out = run(artifact)
    assert code == 0 and "resource encoding 'raw_bytes_v9' is unknown" in out
    code, out = run(artifact, "--verify")
    assert code == 1
    assert "error: object 'r.tok': resource encoding 'raw_bytes_v9' is not implemented" in out


def test_verify_decodes_resources_a_corrupt_zstd_frame_fails(tmp_path):
    path = tmp_path / "m.ninfer"
    frame = bytearray(encode_resource("zstd_v1", b'{"vocab": "' + b"ab" * 500 + b'"}'))
    frame[len(frame) // 2] ^= 0xFF  # recorded checksum is of these bytes: it matches
    with ArtifactWriter(
        path,
        components={"text": {"config": {}, "resources": {"tokenizer.json": "r"}}},
        objects=[ResourceSpec("r", "zstd_v1", len(frame))],
        bindings={},
    ) as w:
        w.write("r", frame)
    code, out = run(path, "--verify", "--strict")
    assert code == 1
    assert "error: object 'r': zstd_v1 resource does not decompress" in out
    assert "1 of 1 objects checksummed" in out  # the checksum alone did not see it


def test_strict_flags_a_damaged_checksum_key(artifact):
    _edit_directory(artifact, b'"w.b":"', b'"w.x":"', after=b'"checksums"')
    code, out = run(artifact, "--verify")
    assert code == 0  # every recorded digest still matches...
    assert "warning: provenance.checksums: 'w.x' names no object" in out
    assert "warning: object 'w.b': no checksum in provenance.checksums" in out
    code, out = run(artifact, "--verify", "--strict")
    assert code == 1  # ...but strict does not let an object go unchecked
    assert "error: strict: object 'w.b': no checksum in provenance.checksums" in out
    assert "4 of 5 objects checksummed" in out


def test_strict_flags_an_artifact_without_digests(artifact):
    # "checksums" -> "checksumz": the same length, so framing stays valid and no digest remains
    _edit_directory(artifact, b'"checksums"', b'"checksumz"')
    code, out = run(artifact, "--verify")
    assert code == 0  # valid without digests (project decision 7)...
    assert "warning: provenance.checksums is absent: no object's bytes were checked" in out
    code, out = run(artifact, "--verify", "--strict")
    assert code == 1  # ...but strict does not pass bytes that nothing checked
    assert "error: strict: provenance.checksums is absent" in out


def test_a_part_name_over_the_file_name_limit_is_an_artifact_error(tmp_path):
    doc = {
        "components": {"text": {"config": {"model_type": "toy"}}},
        "objects": [{"id": "w", "kind": "tensor", "shape": [2048], "format": "fp32",
                     "layout": "contiguous_le_v1", "offset": 0, "bytes": 8192}],
        "bindings": {},
        "uses": [],
        "files": [{"path": None, "payload_bytes": 4096}, {"path": "p", "payload_bytes": 4096}],
    }  # fmt: skip
    path = tmp_path / "long.ninfer"
    write_raw(path, doc, json_bytes=4064)
    doc["files"][1]["path"] = "p" * 300  # no file system holds that name: patch it in
    text = json.dumps(doc).encode()
    with EditedBytes(path) as data:
        data[32 : 32 + 4064] = text + b" " * (4064 - len(text))
    code, out = run(path, "--verify")
    assert code == 1 and "internal error" not in out
    assert "error: object 'w': files[1].path 'pppp" in out
    assert "is 300 bytes, longer than the 255-byte file-name limit" in out


def test_a_directory_is_named_as_one(tmp_path, artifact):
    result = CliRunner().invoke(main, [str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"ninfer-inspect: {tmp_path}: is a directory; an artifact is opened by its entry "
        "file (here: m.ninfer)"
    )


def test_verify_progress_on_a_terminal_only(artifact):
    import fcntl
    import os
    import pty
    import struct
    import termios

    command = [sys.executable, "-m", "ninfer_format.inspect_cli", str(artifact), "--verify"]
    piped = subprocess.run(command, capture_output=True, text=True)
    assert piped.returncode == 0 and piped.stderr == ""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=follower) as proc:
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            drawn += chunk
    os.close(leader)
    assert proc.returncode == 0
    assert b"verifying" in drawn and b"100%" in drawn


def test_progress_is_silent_without_tqdm(monkeypatch):
    from ninfer_format.progress import terminal_bar

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    with terminal_bar(10, "verifying", "B") as advance:
        advance(4)
        advance(6, "note")
