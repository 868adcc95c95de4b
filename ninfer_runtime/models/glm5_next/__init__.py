"""GLM5Next ("GLM-5.3-Flash"; ``glm5_next``, ``glm5_next_text``): Kimi Delta Attention and
latent attention with a DSA token indexer, clamped MLP and grouped MoE feed-forward blocks,
hyper-connection residual streams; served on the CPU backend (the CUDA path is written on
the array module but not yet run on a GPU)."""

from .model import Glm5NextModel, load_glm5_next

__all__ = ["Glm5NextModel", "load_glm5_next"]
