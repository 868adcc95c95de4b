"""schemathesis fuzzes every operation of our published OpenAPI schema: no 5xx, no hang, every
status code and content type an operation answers is one its schema documents, every body the
schema calls valid is accepted, and an ``Allow`` header lists exactly the documented methods.

Runs the schemathesis CLI against a real server (short context so a generated request with a
huge ``max_tokens`` still ends quickly). The seed is fixed for a reproducible CI run; set
``NINFER_FUZZ_SEED`` to explore other inputs, ``NINFER_FUZZ_EXAMPLES`` to go deeper.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, Server, start_server

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "positive_data_acceptance",
    "allow_header_conformance",
)


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-context", "256", "--max-concurrency", "2")


def test_fuzz_the_openapi_schema(server):
    cli = Path(sys.executable).parent / "schemathesis"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.serve.schemathesis_hooks",
        "NINFER_TEST_MODEL": server.model,
    }
    result = subprocess.run(
        [
            str(cli), "run", f"{server.url}/openapi.json",
            "--checks", ",".join(CHECKS),
            "--phases", "coverage,fuzzing",
            "--max-examples", os.environ.get("NINFER_FUZZ_EXAMPLES", "25"),
            "--seed", os.environ.get("NINFER_FUZZ_SEED", "20261129"),
            "--request-timeout", "30",
            # one worker: CPython 3.11 < 3.11.9 can fail ast.parse in two threads at once
            # (SystemError "AST constructor recursion depth mismatch"), which hypothesis
            # calls while describing a strategy
            "--workers", "1",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    report = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and "failed" not in result.stdout.split("SUMMARY")[-1]
    assert "Traceback" not in server.log, server.log
