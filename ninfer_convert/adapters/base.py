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


#: says whether a checkpoint's tensor names and text config hold an MTP block
MtpPresence = Callable[[set[str], Mapping[str, Any]], bool]


def _mtp_prefix(keys: set[str], text_config: Mapping[str, Any]) -> bool:
    """Qwen3.5's layout: the MTP block's tensors are ``mtp.*``."""
    return any(k.startswith("mtp.") for k in keys)


@dataclass(frozen=True)
class Architecture:
    """The class names an artifact's component records give a model type (spec 5.1)."""

    text: str
    mtp: str


@dataclass(frozen=True)
class _Registration:
    adapter: Adapter
    architecture: Architecture
    has_mtp: MtpPresence


_REGISTERED: dict[str, _Registration] = {}


def register_adapter(
    architectures: Mapping[str, Architecture],
    *,
    has_mtp: MtpPresence = _mtp_prefix,
) -> Callable[[Adapter], Adapter]:
    """The adapter of each model type in ``architectures`` (and the class names its artifacts
    record); ``has_mtp``: where this architecture keeps its MTP block."""

    def decorate(fn: Adapter) -> Adapter:
        for model_type, architecture in architectures.items():
            _REGISTERED[model_type] = _Registration(fn, architecture, has_mtp)
        return fn

    return decorate


def _registration(model_type: str) -> _Registration:
    try:
        return _REGISTERED[model_type]
    except KeyError:
        raise RecipeError(
            f"no architecture adapter for model_type {model_type!r} "
            f"(known: {', '.join(sorted(_REGISTERED))})"
        ) from None


def has_mtp_weights(model_type: str, keys: set[str], text_config: Mapping[str, Any]) -> bool:
    """Whether a checkpoint of ``model_type`` with these tensor names holds an MTP block."""
    found = _REGISTERED.get(model_type)
    return (found.has_mtp if found else _mtp_prefix)(keys, text_config)


def architecture_of(model_type: str) -> Architecture:
    return _registration(model_type).architecture


def adapter_for(model_type: str) -> Adapter:
    return _registration(model_type).adapter
