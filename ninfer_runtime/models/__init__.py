"""Model code per architecture, and the registry that picks it from an artifact."""

from .base import ForwardOutput, Model
from .registry import known_architectures, load_model, register_model

__all__ = ["ForwardOutput", "Model", "known_architectures", "load_model", "register_model"]
