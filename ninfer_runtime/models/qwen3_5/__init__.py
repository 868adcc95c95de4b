"""Qwen3.5 / Qwen3.6 (``qwen3_5_text``, ``qwen3_5_moe_text``): hybrid Gated DeltaNet + gated
attention, dense or MoE feed-forward, optional MTP head."""

from .model import Qwen35Model, load_qwen3_5

__all__ = ["Qwen35Model", "load_qwen3_5"]
