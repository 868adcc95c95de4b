"""Chat template rendering: OpenAI-style messages and tools -> the prompt text.

Templates are Jinja, run the way Hugging Face runs them (``template_environment``), so an
artifact's ``chat_template.jinja`` renders here exactly as in ``transformers``. Without one,
ninfer's own template is used: GLM-5 framing for a GLM5Next artifact
(``templates/glm5_chat.jinja``), else Qwen3.5-style ChatML (``templates/qwen3_5_chatml.jinja``).
``ChatTemplate.chat_format`` says which family's conventions (tool-call form, effort levels)
the template follows.

Thinking off is honoured even by a template that opens the think block unconditionally: a
generation prompt that still ends inside ``<think>`` is closed with ``</think>``, and in a GLM
template without a thinking switch each user turn ends with ``/nothink`` (``ChatFormat``).

Messages and tools are checked before rendering (``chat_messages``) so a bad request fails with
a ``RequestError`` naming the message and field, never with a Jinja traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import resources as importlib_resources
from typing import Any

from ninfer_runtime.frontend._errors import EngineError, request_error
from ninfer_runtime.frontend._resources import (
    CHAT_TEMPLATE,
    TOKENIZER_CONFIG,
    read_json_object,
    read_text,
    template_tokens,
)
from ninfer_runtime.frontend.chat_format import ChatFormat, detect_chat_format
from ninfer_runtime.frontend.chat_messages import ROLES, normalize_messages, normalize_tools
from ninfer_runtime.frontend.markers import THINK_CLOSE, THINK_OPEN
from ninfer_runtime.frontend.template_environment import TemplateRaised, template_environment

__all__ = [
    "BUILTIN_TEMPLATE",
    "GLM_BUILTIN_TEMPLATE",
    "ROLES",
    "ChatTemplate",
    "normalize_messages",
    "normalize_tools",
]

BUILTIN_TEMPLATE = "qwen3_5_chatml.jinja"
GLM_BUILTIN_TEMPLATE = "glm5_chat.jinja"
#: text ``model_type``s whose built-in template is GLM's
_GLM_MODEL_TYPES = frozenset({"glm5_next", "glm5_next_text"})
#: Variables the caller sets through dedicated arguments; chat_template_kwargs may not.
_RESERVED = frozenset({"messages", "tools", "add_generation_prompt"})


def builtin_template_source(name: str = BUILTIN_TEMPLATE) -> str:
    """The text of one of ninfer's own templates."""
    return (
        importlib_resources.files("ninfer_runtime.frontend")
        .joinpath("templates", name)
        .read_text(encoding="utf-8")
    )


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(
        self,
        source: str,
        *,
        origin: str = CHAT_TEMPLATE,
        special_tokens: Mapping[str, str] | None = None,
        builtin: bool = False,
    ) -> None:
        from jinja2 import TemplateSyntaxError

        self.source = source
        self.origin = origin
        self.builtin = builtin
        self.special_tokens = dict(special_tokens or {})
        #: the family whose tool-call form and effort levels the template follows
        self.chat_format: ChatFormat = detect_chat_format(source)
        try:
            self._template = template_environment().from_string(source)
        except TemplateSyntaxError as exc:
            raise EngineError(
                f"chat template {origin}: syntax error at line {exc.lineno}: {exc.message}"
            ) from None

    @classmethod
    def builtin_chatml(cls, special_tokens: Mapping[str, str] | None = None) -> ChatTemplate:
        """ninfer's Qwen3.5-style ChatML template."""
        return cls.builtin(BUILTIN_TEMPLATE, special_tokens)

    @classmethod
    def builtin(
        cls, name: str = BUILTIN_TEMPLATE, special_tokens: Mapping[str, str] | None = None
    ) -> ChatTemplate:
        """One of ninfer's own templates (``BUILTIN_TEMPLATE``, ``GLM_BUILTIN_TEMPLATE``)."""
        return cls(
            builtin_template_source(name),
            origin=f"built-in {name}",
            special_tokens=special_tokens,
            builtin=True,
        )

    @classmethod
    def from_resources(
        cls,
        resources: Mapping[str, bytes],
        *,
        override: str | None = None,
        model_type: str | None = None,
    ) -> ChatTemplate:
        """The template to use for an artifact.

        Precedence: ``override`` (a user's ``--chat-template`` file text) > the artifact's
        ``chat_template.jinja`` > a template embedded in ``tokenizer_config.json`` (older
        checkpoints) > the built-in one for the text ``model_type`` (GLM-5's for GLM5Next,
        ChatML otherwise).
        """
        config = read_json_object(resources, TOKENIZER_CONFIG)
        tokens = template_tokens(config)
        if override is not None:
            return cls(override, origin="override template", special_tokens=tokens)
        source = read_text(resources, CHAT_TEMPLATE)
        if source is not None:
            return cls(source, origin=CHAT_TEMPLATE, special_tokens=tokens)
        embedded = config.get("chat_template")
        if isinstance(embedded, list):
            embedded = {
                item.get("name"): item.get("template")
                for item in embedded
                if isinstance(item, Mapping)
            }.get("default")
        if isinstance(embedded, str):
            return cls(embedded, origin=f"{TOKENIZER_CONFIG} chat_template", special_tokens=tokens)
        glm = model_type in _GLM_MODEL_TYPES
        return cls.builtin(GLM_BUILTIN_TEMPLATE if glm else BUILTIN_TEMPLATE, tokens)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        enable_thinking: bool | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``.

        ``enable_thinking`` (when not ``None``) is passed to the template like any other
        ``chat_template_kwargs`` entry; giving it both ways with different values is refused.
        Off, a generation prompt the template left inside ``<think>`` is closed (templates
        without a thinking switch open the block unconditionally). ``continue_final_message``
        leaves the last (assistant) message open so the model continues it (assistant prefill).
        """
        if continue_final_message and add_generation_prompt:
            raise request_error(
                "continue_final_message and add_generation_prompt cannot both be set",
                "continue_final_message",
            )
        variables = self._variables(enable_thinking, chat_template_kwargs)
        normalized = normalize_messages(messages)
        thinking_off = variables.get("enable_thinking", True) is False
        suffix = self.chat_format.no_think_suffix
        if suffix and thinking_off:
            normalized = [_with_suffix(m, suffix) if m["role"] == "user" else m for m in normalized]
        if continue_final_message and normalized[-1]["role"] != "assistant":
            raise request_error(
                "continue_final_message needs the last message to be an assistant message",
                f"messages[{len(normalized) - 1}].role",
            )
        variables.update(
            messages=normalized,
            tools=normalize_tools(tools),
            add_generation_prompt=add_generation_prompt,
        )
        text = self._call(self._template.render, variables)
        if continue_final_message:
            text = _cut_after_final(text, normalized[-1])
        elif add_generation_prompt and thinking_off:
            text = _close_open_think(text)
        return text

    def _variables(
        self, enable_thinking: bool | None, kwargs: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        variables: dict[str, Any] = {"bos_token": "", "eos_token": ""}
        variables.update(self.special_tokens)
        extra = dict(kwargs or {})
        clash = sorted(_RESERVED.intersection(extra))
        if clash:
            raise request_error(
                f"chat_template_kwargs may not set {', '.join(clash)}; use the request fields",
                "chat_template_kwargs",
            )
        if enable_thinking is not None:
            if "enable_thinking" in extra and bool(extra["enable_thinking"]) != enable_thinking:
                raise request_error(
                    "enable_thinking is given twice with different values "
                    "(top level and chat_template_kwargs)",
                    "enable_thinking",
                )
            extra["enable_thinking"] = enable_thinking
        variables.update(extra)
        return variables

    def _call(self, render: Callable[..., str], variables: dict[str, Any]) -> str:
        from jinja2 import TemplateError

        try:
            return render(**variables)
        except TemplateRaised as exc:
            raise request_error(
                f"chat template rejected the conversation: {exc}", "messages"
            ) from None
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise request_error(
                f"chat template {self.origin} failed on this conversation: "
                f"{type(exc).__name__}: {exc}",
                "messages",
            ) from None


def _with_suffix(message: dict[str, Any], suffix: str) -> dict[str, Any]:
    """A user message whose text ends with ``suffix`` (added unless it does already)."""
    content = message.get("content")
    if isinstance(content, str):
        text = content if content.endswith(suffix) else content + suffix
        return {**message, "content": text}
    if isinstance(content, list) and not _plain_text(content).endswith(suffix):
        return {**message, "content": [*content, {"type": "text", "text": suffix}]}
    return message


def _close_open_think(prompt: str) -> str:
    """Thinking off: a prompt that ends inside an opened ``<think>`` gets its ``</think>``."""
    if prompt.rstrip().endswith(THINK_OPEN):
        return prompt + THINK_CLOSE
    return prompt


def _cut_after_final(text: str, final: Mapping[str, Any]) -> str:
    """Drop what the template wrote after the final message's text (its end-of-turn marker)."""
    content = _plain_text(final.get("content")).rstrip()
    if not content:
        raise request_error(
            "continue_final_message needs the last message to have text to continue",
            "messages",
        )
    at = text.rfind(content)
    if at < 0:
        raise request_error(
            "continue_final_message: the template does not reproduce the final message verbatim",
            "messages",
        )
    return text[: at + len(content)]


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p if isinstance(p, str) else str(p.get("text", ""))
            for p in content
            if isinstance(p, str) or (isinstance(p, Mapping) and p.get("type") == "text")
        )
    return ""
