"""What every request body's model shares: strict types, and validation that stops early.

Why stop early: pydantic checks every item of a list and every value of a dict, and reports a
problem for each bad one. A 1 MiB body whose ``messages`` holds half a million integers would
build half a million error objects (and Litestar a message for each), seconds of work on the
event loop that every other request waits behind. Each list, dict, set and tuple of a request
model is therefore checked up to its first bad item (pydantic's ``fail_fast``); the error names
that item, which is all a client needs to fix its request. A model that refuses unknown fields
refuses many of them as one problem, for the same reason.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, model_validator
from pydantic_core import CoreSchema, PydanticCustomError

from .errors import SHOWN_PROBLEMS, shown

__all__ = ["WireModel"]

#: pydantic-core schema types that validate items one by one and take ``fail_fast``
_COLLECTIONS = frozenset({"list", "dict", "set", "frozenset", "tuple"})
#: keys of a core schema whose values are data (JSON Schema, defaults, allowed values) or
#: serializers, never validators
_NOT_VALIDATORS = frozenset({"metadata", "default", "expected", "serialization"})


def _fail_fast(node: Any) -> None:
    """Set ``fail_fast`` on every collection schema in a core schema, in place."""
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")  # a mapping of field names may have a field "type"
            if isinstance(kind, str) and kind in _COLLECTIONS:
                node["fail_fast"] = True
            stack.extend(v for k, v in node.items() if k not in _NOT_VALIDATORS)
        elif isinstance(node, list | tuple):
            stack.extend(node)


@cache
def _names(model: type[BaseModel]) -> frozenset[str]:
    """The keys a body may use for ``model``'s fields (names and aliases)."""
    fields = model.model_fields
    return frozenset(fields) | {f.alias for f in fields.values() if f.alias}


class WireModel(BaseModel):
    """Base of the request models: strict (no string-to-number coercion) and fail-fast."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_fields(cls, data: Any) -> Any:
        """Many unknown fields in a model that refuses them: one problem, not one each."""
        if cls.model_config.get("extra") != "forbid" or not isinstance(data, dict):
            return data
        if len(data) <= SHOWN_PROBLEMS:  # too few keys for many unknown ones
            return data
        known = _names(cls)
        unknown = [key for key in data if key not in known]
        if len(unknown) <= SHOWN_PROBLEMS:
            return data  # pydantic names each
        first = ", ".join(shown(str(key), 40) for key in unknown[:SHOWN_PROBLEMS])
        raise PydanticCustomError(
            "extra_forbidden",
            "{count} unknown fields, the first {first}",
            {"count": len(unknown), "first": first},
        )

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[BaseModel], handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        schema = handler(source)
        _fail_fast(schema)
        return schema
