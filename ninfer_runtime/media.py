"""Media a request carries beside its text: the bytes as the client sent them.

An image is kept encoded (PNG, JPEG, ...) until the engine validates and decodes it; its
``digest`` names it for caches (the same bytes are the same image, whichever request or API
sent them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

__all__ = ["ImageInput"]


@dataclass(frozen=True)
class ImageInput:
    """One image of a request, its encoded file bytes (decoded by the engine)."""

    data: bytes

    @cached_property
    def digest(self) -> str:
        """The sha256 of ``data`` in hex."""
        return hashlib.sha256(self.data).hexdigest()

    def __repr__(self) -> str:  # never megabytes of bytes in a log line
        return f"ImageInput({len(self.data)} bytes)"
