"""Anthropic Messages wire schemas (requests).

Shapes only, strictly typed; content blocks are checked one by one in ``messages.py`` so an
error names ``messages[2].content[1]``. Unknown top-level fields are ignored (Anthropic clients
add new optional fields often); known fields that would change the result but cannot be
honoured are declared so a request setting them is refused by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CountTokensRequest", "MessagesRequest"]


class _Open(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class Message(_Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class SystemBlock(_Open):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class Tool(_Open):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Open):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


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
    mcp_servers: list[dict[str, Any]] | None = None


class MessagesRequest(_Prompt):
    """POST /v1/messages."""

    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    container: str | dict[str, Any] | None = None


class CountTokensRequest(_Prompt):
    """POST /v1/messages/count_tokens."""
