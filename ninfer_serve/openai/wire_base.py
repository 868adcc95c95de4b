"""What the OpenAI wire models share: their two strictness classes, and the schema
annotations for fields accepted only to be refused when set.

Validation is strict (no string-to-number coercion), as OpenAI's own API is. ``OpenModel``
ignores unknown fields (Chat's objects: clients send vendor extensions); ``ClosedModel``
refuses them (a 400 naming the field), as Responses and NInfer's own nested objects do.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, WithJsonSchema

from ..wire import WireModel

__all__ = ["NOT_FALSE", "NOT_TRUE", "UNSET", "ClosedModel", "OpenModel", "nullable"]


#: what the schema states for a field that is refused whenever it is set
UNSET = WithJsonSchema({"type": "null"})
#: ... and for a switch refused when it is on (off)
NOT_TRUE = WithJsonSchema({"enum": [False, None]})
NOT_FALSE = WithJsonSchema({"enum": [True, None]})


def nullable(schema: dict[str, Any]) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]})


class OpenModel(WireModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ClosedModel(WireModel):
    model_config = ConfigDict(strict=True, extra="forbid")
