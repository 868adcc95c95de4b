"""Numeric formats and storage layouts, registered by name."""

from . import direct, fp8_row, gguf_blocks, nvfp4, row_split  # noqa: F401  (registration)
from .registry import Finding, TensorCodec, all_codecs, codec_for, register

__all__ = ["Finding", "TensorCodec", "all_codecs", "codec_for", "register"]
