"""The Jinja environment chat templates run in, set up the way Hugging Face sets it up.

Sandboxed, ``trim_blocks`` and ``lstrip_blocks``, a ``tojson`` that does not HTML-escape,
``fromjson``, ``raise_exception``, ``strftime_now`` and a no-op ``{% generation %}`` block, so
an artifact's ``chat_template.jinja`` renders here exactly as in ``transformers``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any

__all__ = ["TemplateRaised", "template_environment"]


class TemplateRaised(Exception):
    """``raise_exception`` inside a template: the template's own verdict on the request."""


def _raise_exception(message: object) -> None:
    raise TemplateRaised(str(message))


def _tojson(
    value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """JSON as the model saw it in training: no HTML escaping, non-ASCII kept."""
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _fromjson(text: str) -> Any:
    """Parse a JSON string inside a template (tool-call arguments kept as strings)."""
    return json.loads(text)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@cache
def template_environment() -> Any:
    """One sandboxed Jinja environment for all templates (compiling is the costly part)."""
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}`` marks assistant text for training masks; rendering ignores it."""

        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        extensions=[GenerationBlock, loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters["fromjson"] = _fromjson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
