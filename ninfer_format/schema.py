"""Typed records of the v3 JSON directory (spec section 2).

Records are closed (unknown members are errors), integers are strict (no bools, floats or
negatives) and bounded to U64. Cross-record rules (R6-R12) live in ``validate.py``; the JSON
Schema in ``schemas/ninfer-v3.schema.json`` is generated from these models.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    StringConstraints,
    model_validator,
)

U64_MAX = 2**64 - 1


def _check_shape(dims: list[int]) -> list[int]:
    if math.prod(dims) > U64_MAX:
        raise ValueError("element count does not fit in 64 bits")
    return dims


# Non-empty, no U+0000 (checked in Rust: a Python validator per ID costs seconds at 100k
# objects). Lone surrogates cannot reach here: the JSON text parser rejects them.
ID = Annotated[StrictStr, StringConstraints(min_length=1, pattern=r"^[^\x00]*$")]
U64 = Annotated[StrictInt, Field(ge=0, le=U64_MAX)]
PosU64 = Annotated[StrictInt, Field(ge=1, le=U64_MAX)]
Shape = Annotated[list[PosU64], Field(max_length=16), AfterValidator(_check_shape)]
ActivationPolicy = Literal["A16Only", "AllowA8", "AllowA4"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Tensor(Record):
    id: ID
    kind: Literal["tensor"]
    shape: Shape
    format: ID
    layout: ID
    offset: U64
    bytes: PosU64
    divisors: PosU64 | None = Field(
        default=None, description="EXT-ALL: number of stacked matrices with their own divisor"
    )

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


class Resource(Record):
    id: ID
    kind: Literal["resource"]
    encoding: ID
    offset: U64
    bytes: PosU64


Object = Annotated[Tensor | Resource, Field(discriminator="kind")]


class Part(Record):
    object: ID
    range: Annotated[list[U64], Field(min_length=2, max_length=2)]

    @model_validator(mode="after")
    def _ordered(self) -> Part:
        if not self.range[0] < self.range[1]:
            raise ValueError(f"range {self.range} must have begin < end")
        return self

    @property
    def elements(self) -> int:
        return self.range[1] - self.range[0]


class WholeBinding(Record):
    object: ID


class PartsBinding(Record):
    parts: Annotated[list[Part], Field(min_length=1)]


Binding = Annotated[WholeBinding | PartsBinding, Field(union_mode="left_to_right")]


class Use(Record):
    parameter: ID
    input: ID
    activation_policy: ActivationPolicy | None = None
    auxiliaries: dict[ID, Binding] | None = None


class Proposal(Record):
    domain: Literal["full", "indexed"]
    rows: PosU64 | None = None

    @model_validator(mode="after")
    def _rows_match_domain(self) -> Proposal:
        if self.domain == "full" and self.rows is not None:
            raise ValueError('domain "full" must not have rows')
        if self.domain == "indexed" and self.rows is None:
            raise ValueError('domain "indexed" requires rows')
        return self


class Component(Record):
    config: dict[str, Any]
    target: ID | None = None
    resources: dict[ID, ID] | None = None
    proposal: Proposal | None = None


class File(Record):
    path: ID | None
    payload_bytes: PosU64


class Directory(Record):
    components: dict[ID, Component]
    objects: Annotated[list[Object], Field(min_length=1)]
    bindings: dict[ID, Binding]
    uses: list[Use]
    files: Annotated[list[File], Field(min_length=1)]
    metadata: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None

    @property
    def payload_bytes(self) -> int:
        return sum(f.payload_bytes for f in self.files)

    def to_document(self) -> dict[str, Any]:
        """JSON-ready dict in the reference member order, optional members omitted when unset."""
        doc = self.model_dump(mode="json", exclude_none=True)
        doc["files"] = [f.model_dump(mode="json") for f in self.files]
        order = ["components", "objects", "bindings", "uses", "metadata", "provenance", "files"]
        return {key: doc[key] for key in order if key in doc}


def binding_objects(binding: WholeBinding | PartsBinding) -> list[str]:
    if isinstance(binding, WholeBinding):
        return [binding.object]
    return [p.object for p in binding.parts]
