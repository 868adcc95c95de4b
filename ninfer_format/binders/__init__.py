"""Architecture binders: config-derived parameter names, shapes, formats and uses (spec 2.10).

Importing this package registers every built-in binder.
"""

from . import glm5_next, qwen3_5, qwen4_exp  # noqa: F401  (registration)
from .registry import BinderReport, bind, register_binder, registered_model_types

__all__ = ["BinderReport", "bind", "register_binder", "registered_model_types"]
