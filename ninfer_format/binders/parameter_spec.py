"""A binder's expected parameter: its logical name, shape, role and Use inputs (spec 2.10).

Shared by every architecture binder: the name tables yield these records and the binding and
Use checks compare an artifact against them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Role(enum.Enum):
    """How a parameter is consumed, which decides the formats it may be stored in."""

    MATRIX = "matrix"  # multiplied with activations (or gathered): any float weight format
    VECTOR = "vector"  # norms: read elementwise, so a direct format
    FP32_VECTOR = "fp32 vector"  # GDN a_log / dt_bias: the recurrence needs full precision
    CONVOLUTION = "convolution"  # GDN short convolution, read elementwise: direct
    TOKEN_IDS = "token ids"  # proposal row -> token id map: int32 whole object


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    role: Role
    inputs: tuple[str, ...] = ()

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def _matrix(name: str, rows: int, cols: int, *inputs: str) -> ParamSpec:
    return ParamSpec(name, (rows, cols), Role.MATRIX, inputs)


def _vector(name: str, length: int) -> ParamSpec:
    return ParamSpec(name, (length,), Role.VECTOR)


def _fp32_vector(name: str, length: int) -> ParamSpec:
    return ParamSpec(name, (length,), Role.FP32_VECTOR)
