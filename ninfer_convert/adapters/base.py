"""Shared types of the architecture adapters and their registry."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..errors import RecipeError


class Loader(Protocol):
    def load(self, name: str) -> torch.Tensor: ...


@dataclass(frozen=True)
class SourcePiece:
    """Rows ``[start, stop)`` of a source tensor viewed as 2-D ``[-1, last_dim]`` (None = all).

    A 1-D tensor's rows are its elements, so a fused bias splits like its fused weight.
    """

    tensor: str
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class LogicalTensor:
    """One logical parameter and where its values come from."""

    name: str
    shape: tuple[int, ...]
    role: str  # ParamSpec role value: "matrix", "vector", "fp32 vector", ...
    inputs: tuple[str, ...]
    pieces: tuple[SourcePiece, ...]
    transpose: bool = False  # GDN convolution: source [C, 1, T] -> logical [T, C]
    gather: tuple[int, ...] | None = None  # rows picked after loading (the proposal head)
    constant: tuple[int, ...] | None = None  # int32 values not read from any source

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def identity(self) -> tuple[object, ...]:
        """Equal for parameters holding the same values (such parameters share rows)."""
        return (self.pieces, self.transpose, self.gather, self.constant)

    def load(self, source: Loader) -> torch.Tensor:
        """The parameter's values in the source dtype, in the logical shape."""
        if self.constant is not None:
            return torch.tensor(self.constant, dtype=torch.int32).reshape(self.shape)
        chunks = []
        for piece in self.pieces:
            x = source.load(piece.tensor)
            if piece.rows is not None:
                rows = x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x
                x = rows[piece.rows[0] : piece.rows[1]]
            chunks.append(x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x)
        x = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=0)
        if self.transpose:
            x = x.reshape(self.shape[1], self.shape[0]).t().contiguous()
        if self.gather is not None:
            x = x.reshape(-1, x.shape[-1])[torch.tensor(self.gather, dtype=torch.long)]
        if x.numel() != self.elements:
            raise RecipeError(
                f"{self.name}: source gives {x.numel()} values, the parameter has {self.elements}"
            )
        return x.reshape(self.shape)


class Adapter(Protocol):
    """Source tensor names, text config and components -> logical name -> LogicalTensor.

    ``vision_config`` (the vision component's config) is needed when "vision" is selected.
    """

    def __call__(
        self,
        keys: set[str],
        text_config: Mapping[str, Any],
        components: tuple[str, ...],
        vision_config: Mapping[str, Any] | None = None,
    ) -> dict[str, LogicalTensor]: ...


_ADAPTERS: dict[str, Adapter] = {}


def register_adapter(*model_types: str) -> Callable[[Adapter], Adapter]:
    def decorate(fn: Adapter) -> Adapter:
        for model_type in model_types:
            _ADAPTERS[model_type] = fn
        return fn

    return decorate


def adapter_for(model_type: str) -> Adapter:
    try:
        return _ADAPTERS[model_type]
    except KeyError:
        raise RecipeError(
            f"no architecture adapter for model_type {model_type!r} "
            f"(known: {', '.join(sorted(_ADAPTERS))})"
        ) from None
