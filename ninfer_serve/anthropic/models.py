"""Anthropic Messages wire schemas (requests).

Shapes only, strictly typed; content blocks are checked one by one in ``messages.py`` so an
error names ``messages[2].content[1]``. Unknown top-level fields are ignored (Anthropic clients
add new optional fields often); known fields that would change the result but cannot be
honoured are declared so a request setting them is refused by name.

The published OpenAPI schema is generated from these models; where ``messages.py`` checks a
value itself (so that its refusal names the block or field), the model states the accepted
values for the schema. Rules across fields (a ``tool_choice`` naming a tool that is in
``tools``, a thinking budget below ``max_tokens``) cannot be stated; docs/serve.md lists them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, GetJsonSchemaHandler, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from ..cache_isolation import MAX_CACHE_SALT
from ..limits import MAX_STOP
from ..wire import WireModel

__all__ = ["CountTokensRequest", "MessagesRequest"]


class _Open(WireModel):
    model_config = ConfigDict(strict=True, extra="allow")


def _block(kind: str, **fields: dict[str, Any]) -> dict[str, Any]:
    """The schema of a content block of type ``kind`` with the required ``fields``."""
    return {
        "type": "object",
        "properties": {"type": {"const": kind}, **fields},
        "required": ["type", *fields],
    }


_STRING = {"type": "string"}
_TEXT = _block("text", text=_STRING)
_TOOL_RESULT = _block("tool_result", tool_use_id=_STRING)
# a tool result's text blocks may leave their text out (it reads as empty)
_TOOL_RESULT["properties"]["content"] = {
    "anyOf": [_STRING, {"type": "array", "items": _block("text")}, {"type": "null"}]
}
#: the blocks ``messages.py`` reads, by role. Image blocks (``content.py``) are left out:
#: whether one is valid (decodable data, a model that takes images) cannot be stated here
_BLOCKS = {
    "user": [_TEXT, _TOOL_RESULT],
    "assistant": [
        _TEXT,
        _block("thinking", thinking=_STRING),
        _block("redacted_thinking"),
        _block(
            "tool_use",
            id=_STRING,
            name={"type": "string", "minLength": 1},
            input={"type": "object"},
        ),
    ],
}


#: ``stop_sequences``: at most ``MAX_STOP`` (checked in ``messages.py``), none empty
_STOP_SEQUENCES = WithJsonSchema(
    {
        "anyOf": [
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "maxItems": MAX_STOP,
            },
            {"type": "null"},
        ]
    }
)


class Message(_Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # the blocks a message may hold depend on its role
        return {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "role": {"const": role},
                        "content": {
                            "anyOf": [_STRING, {"type": "array", "items": {"anyOf": blocks}}]
                        },
                    },
                    "required": ["role", "content"],
                }
                for role, blocks in _BLOCKS.items()
            ]
        }


class SystemBlock(_Open):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class Tool(_Open):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]
    # client tools only; server tools (web search ...) are refused
    type: Annotated[str | None, WithJsonSchema({"enum": ["custom", None]})] = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Open):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, json_schema_extra={"minimum": 1})


class OutputFormat(_Open):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Open):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "max"] | None = None


class _Prompt(_Open):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None
    mcp_servers: list[dict[str, Any]] | None = Field(None, json_schema_extra={"maxItems": 0})


class MessagesRequest(_Prompt):
    """POST /v1/messages."""

    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: Annotated[list[str] | None, _STOP_SEQUENCES] = None
    stream: bool | None = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    container: str | dict[str, Any] | None = None
    #: the prefix-cache namespace (``cache_isolation.py``): only requests with the same salt
    #: share cached prefixes
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)


class CountTokensRequest(_Prompt):
    """POST /v1/messages/count_tokens."""

    # not part of what is counted, but a client may send its Messages body as it is, and an
    # enabled thinking's budget must be below it there too
    max_tokens: int | None = Field(None, ge=1)
