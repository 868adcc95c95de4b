"""Pillow, the vision extra's one dependency, imported in one place so a missing extra is one
line naming it (the text path never imports this package)."""

from __future__ import annotations

try:
    from PIL import Image, ImageOps, UnidentifiedImageError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("image input needs the vision extra: pip install 'ninfer[vision]'") from exc

__all__ = ["Image", "ImageOps", "UnidentifiedImageError"]
