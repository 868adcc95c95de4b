"""Where the repository and the bundled model are, for the families that start ``ninfer-convert``,
``ninfer-serve`` or schemathesis in it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "models" / "tiny-qwen3_5"
