"""The geometry of a GLM5Next text model, as the model code reads it: the format's one reading
(``glm5_next_geometry``), which the binder checks artifacts with, a bad config turned into a
``ModelError``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next_geometry import (
    INDEXED_ATTENTION,
    LINEAR_ATTENTION,
    SPARSE,
    GeometryError,
    Glm5NextGeometry,
)

from ...errors import ModelError

__all__ = ["INDEXED_ATTENTION", "LINEAR_ATTENTION", "SPARSE", "Glm5NextGeometry", "read_config"]


def read_config(config: Mapping[str, Any]) -> Glm5NextGeometry:
    """The geometry of a text config, or one ``ModelError`` naming every bad member."""
    try:
        g = Glm5NextGeometry.from_config(config)
    except GeometryError as exc:
        raise ModelError(
            f"text config cannot define a GLM5Next model: {'; '.join(exc.problems)}"
        ) from None
    if g.indexer is not None and not g.indexer.always_select_tail:
        # without the open pool a query may see no token at all, which transformers then
        # resolves by attending over every token, future ones included
        raise ModelError(
            "text config member 'index_kpool_always_select_tail' must be true: the runtime "
            "always lets a query see the open pool it is in"
        )
    return g
