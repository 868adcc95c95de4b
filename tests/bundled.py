"""The bundled model's checkpoint (``models/tiny-qwen3_5``), as the tests name it."""

from __future__ import annotations

from pathlib import Path

BUNDLED = Path(__file__).resolve().parents[1] / "models" / "tiny-qwen3_5"
