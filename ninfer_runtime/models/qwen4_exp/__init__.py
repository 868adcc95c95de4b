"""Qwen4Exp (``qwen4_exp``, ``qwen4_exp_text``): Qwen3.5's hybrid GDN + gated attention with
MoE, plus hyper-connection streams, per-layer n-gram embeddings (PLE) and the QSA indexer.
Served on the CPU backend (the CUDA path is written on the array module but not yet run on a
GPU)."""

from ..registry import register_model
from .model import Qwen4ExpModel, load_qwen4_exp

register_model("qwen4_exp", "qwen4_exp_text")(load_qwen4_exp)

__all__ = ["Qwen4ExpModel", "load_qwen4_exp"]
