import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_format.inspect_cli import main

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
