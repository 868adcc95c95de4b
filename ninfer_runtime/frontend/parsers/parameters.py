"""Tool parameter schemas, and XML parameter values read as the JSON values they ask for.

A call in the XML form writes every argument as text; the tool's JSON schema says whether that
text stands for a string, a number, a boolean, null, an object or an array.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_INTEGER = re.compile(r"[+-]?\d+")


def tool_parameter_schemas(
    tools: Sequence[Mapping[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """function name -> {parameter name -> JSON schema}, from OpenAI-style or bare tools."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = fn.get("name")
        parameters = fn.get("parameters")
        if not isinstance(name, str):
            continue
        props = parameters.get("properties") if isinstance(parameters, Mapping) else None
        schemas[name] = dict(props) if isinstance(props, Mapping) else {}
    return schemas


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a schema admits, in its own order (``anyOf``/``oneOf`` flattened)."""
    if not isinstance(schema, Mapping):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types += [t for t in _schema_types(option) if t not in types]
    if types:
        return types
    if "properties" in schema:
        return ["object"]
    if "items" in schema:
        return ["array"]
    if isinstance(schema.get("enum"), list):
        names = {bool: "boolean", int: "integer", float: "number", str: "string"}
        return list(dict.fromkeys(names.get(type(v), "string") for v in schema["enum"]))
    return []


def _is_string_schema(schema: Any) -> bool:
    return _schema_types(schema) == ["string"]


_MISSING = object()


def _as_type(value: str, kind: str) -> Any:
    """``value`` read as JSON type ``kind``, or ``_MISSING`` when it is not one."""
    text = value.strip()
    if kind == "integer":
        if _INTEGER.fullmatch(text):
            return int(text)
        number = _as_type(text, "number")
        if isinstance(number, float) and number.is_integer():
            return int(number)
        return _MISSING
    if kind == "number":
        try:
            number = json.loads(text)
        except ValueError:
            return _MISSING
        ok = isinstance(number, int | float) and not isinstance(number, bool)
        return number if ok else _MISSING
    if kind == "boolean":
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, _MISSING)
    if kind == "null":
        return None if text.lower() in ("null", "none") else _MISSING
    if kind in ("object", "array"):
        expected = dict if kind == "object" else list
        try:
            parsed = json.loads(text)
        except ValueError:
            try:  # models sometimes write Python literals ({'a': True})
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return _MISSING
        return parsed if isinstance(parsed, expected) else _MISSING
    return _MISSING


def convert_parameter(value: str, schema: Any) -> Any:
    """An XML parameter value as the JSON value its schema asks for.

    Without a schema, or when the schema admits strings, the text stays a string: the model wrote
    text, and guessing a type would turn a zip code into a number. Otherwise each admitted type is
    tried in schema order; text that fits none stays a string.
    """
    types = _schema_types(schema)
    if not types or "string" in types:
        if "null" in types and value.strip().lower() == "null":
            return None
        return value
    for kind in types:
        converted = _as_type(value, kind)
        if converted is not _MISSING:
            return converted
    return value
