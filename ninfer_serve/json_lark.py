"""JSON schemas as Lark for llguidance: the JSON answer grammar and the pieces other grammars
(forced tool calls) build on.

Two rules keep a weak model from writing until ``max_tokens`` (``structured.py`` says why):
separators are fixed (``", "`` and ``": "``) with no other whitespace, and an object schema that
lists its properties admits only those (``closed_objects``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "LEAD_WHITESPACE",
    "closed_objects",
    "json_answer_lark",
    "lark_literal",
    "styled_schema",
]

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: the whitespace a grammar lets the model write before its answer (bounded: no loop on it)
LEAD_WHITESPACE = r"/[ \t\r\n]{0,8}/"
# keywords whose values are subschemas (a map of them, one, or a list), the places where an
# object schema can sit; data keywords (const, enum, default, examples) are never walked
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_ONE = ("additionalProperties", "items", "additionalItems", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
# siblings of "$ref" that make it a merge of two object schemas rather than a plain reference
_OBJECT_KEYWORDS = ("properties", "patternProperties", "additionalProperties", "required", "allOf")


def lark_literal(text: str) -> str:
    """A Lark string literal (JSON escapes are valid Lark escapes). JSON leaves DEL (U+007F)
    as it is, which llguidance's lexer refuses inside a literal, so it is escaped too."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def styled_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema with its objects closed and ninfer's JSON layout. The caller's ``x-guidance``
    options are kept except whitespace: flexible whitespace or a pattern of it would let the
    model loop on spaces, so the fixed separators are the only whitespace."""
    out = closed_objects(schema)
    options = out.get("x-guidance")
    if options is None or isinstance(options, Mapping):
        options = {**_JSON_STYLE, "lenient": True, **(options or {})}
        options["whitespace_flexible"] = False
        options.pop("whitespace_pattern", None)
        out["x-guidance"] = options
    return out


def json_answer_lark(schema: Mapping[str, Any] | None) -> str:
    """The Lark grammar of a JSON answer: bounded leading whitespace, then one value of
    ``schema`` (``None``: any JSON object), then the end of output."""
    body = styled_schema(schema if schema is not None else {"type": "object"})
    return f"start: {LEAD_WHITESPACE} answer\nanswer: %json {json.dumps(body)}\n"


def closed_objects(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` in which every object schema that lists its properties (or
    property patterns) and says nothing of others gets ``additionalProperties: false``.

    Required names missing from ``properties`` are listed there with any value, so closing
    never makes a required key unsatisfiable. Object schemas that are parts of a merge (the
    members of an ``allOf``, the schema holding it, a ``$ref`` with object keywords beside it,
    and the definitions those refer to) stay open: llguidance intersects the parts, and each
    closed part would refuse the other parts' keys.
    """
    # a JSON round trip, not deepcopy: one dict reached at two places (aliased in the caller's
    # schema) must become two, or closing one place would close the other
    root = json.loads(json.dumps(schema))
    nodes = dict(_walk(root, "#"))
    merged = _merged_paths(nodes)
    for path, node in nodes.items():
        if path in merged or "additionalProperties" in node or "unevaluatedProperties" in node:
            continue
        props = node.get("properties")
        patterns = node.get("patternProperties")
        if not isinstance(props, dict) and not isinstance(patterns, dict):
            continue
        required = node.get("required")
        required = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        unlisted = [n for n in required if not isinstance(props, dict) or n not in props]
        if unlisted and isinstance(patterns, dict):
            continue  # a pattern may be what admits the name; leave the object as written
        if unlisted:
            props.update({name: {} for name in unlisted})  # a dict here: no patterns
        node["additionalProperties"] = False
    return root


def _walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, subschema) for ``node`` and every subschema under it."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _SCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, dict):
            for name, child in value.items():
                yield from _walk(child, f"{path}/{key}/{_pointer_escape(name)}")
    for key in _SCHEMA_ONE:
        yield from _walk(node.get(key), f"{path}/{key}")
    for key in _SCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            for i, child in enumerate(value):
                yield from _walk(child, f"{path}/{key}/{i}")


def _pointer_escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _merged_paths(nodes: Mapping[str, dict[str, Any]]) -> set[str]:
    """Pointers of the object schemas that take part in a merge (see ``closed_objects``)."""
    merged: set[str] = set()
    for path, node in nodes.items():
        parts = node.get("allOf")
        if isinstance(parts, list) and len(parts) > 1:
            merged.add(path)
            merged.update(f"{path}/allOf/{i}" for i in range(len(parts)))
        if isinstance(node.get("$ref"), str) and any(k in node for k in _OBJECT_KEYWORDS):
            merged.add(path)
    # a merged part that is a reference merges its target too (and so on along a chain)
    pending = list(merged)
    while pending:
        ref = nodes.get(pending.pop(), {}).get("$ref")
        if isinstance(ref, str) and ref in nodes and ref not in merged:
            merged.add(ref)
            pending.append(ref)
    return merged
