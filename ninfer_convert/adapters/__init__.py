"""Architecture adapters: source checkpoint names -> the logical parameters of the v3 contract.

An adapter says, for every logical parameter, which source tensors hold it and which rows of
them (row selection is the only transform weights need, apart from the GDN convolution's
transpose), so float values and pre-encoded codes/scales move the same way.
"""

from . import glm5_next, qwen3_5, qwen4_exp  # noqa: F401  (registration)
from .base import LogicalTensor, SourcePiece, adapter_for, register_adapter

__all__ = ["LogicalTensor", "SourcePiece", "adapter_for", "register_adapter"]
