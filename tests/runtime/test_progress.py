"""Loading weights and scoring a text show a progress bar on a terminal, and nothing elsewhere."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}


def _on_terminal(args: list[str]) -> str:
    """Everything the command writes to a 24x120 pseudo-terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=ENV)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the command closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert process.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def _piped(args: list[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_progress_on_a_terminal_only(
    artifact_path: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """``ninfer-perplexity``: the engine's weight loading (every command's) and the scoring."""
    text = tmp_path / "text.txt"
    text.write_text("The capital of France is Paris. " * 40)
    model = artifact_path("qwen3_5_bf16", "dense")
    command = [sys.executable, "-m", "ninfer_runtime.perplexity", str(model), "--text", str(text)]
    shown = _on_terminal(command)
    for bar in ("loading weights", "scoring"):
        assert re.search(rf"{bar}: +\d+%\|", shown), shown
    quiet = _piped(command)
    assert "loading weights" not in quiet and "%|" not in quiet, quiet
