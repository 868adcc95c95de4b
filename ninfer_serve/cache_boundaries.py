"""Prompt positions where other requests are likely to branch off this one.

The prefix cache keeps a checkpoint at the end of each prompt; a second request that shares
only the first part of it (the same system prompt and tools, a different question) resumes
from the deepest checkpoint at or before where the two differ. So the server tells the engine
where a conversation's prompt has its seams (``CacheBoundary``), and the engine keeps the
few worth most:

- ``boundary``: the end of the leading system message together with the tool definitions
  (templates write the tools into the system block; without a system message, the tools'
  end is taken with the first message's opening), and the ends of the last few earlier
  messages, each found by rendering the first k messages with the chat template (no
  generation prompt) and tokenizing: a position is kept only when those tokens are a prefix
  of the whole prompt's tokens (a template that renders a message differently once later
  ones follow, or a tokenization that merges across the seam, gives none);
- ``breakpoint``: the places a client marked (Anthropic ``cache_control``, NInfer's
  ``prompt_cache_breakpoint``), after a whole message or inside one after a number of
  characters of its text. A place inside a message is found by rendering the conversation
  with a marker there and tokenizing the text before it; tokens that merge across the
  place are left to the far side, so the position is where the two tokenizations agree.

The work is bounded: at most ``MAX_RENDERS`` renders a request (the client's places first),
and seams are not looked for in prompts shorter than ``MIN_PROMPT_TOKENS`` (a checkpoint
costs a recurrent-state snapshot, worth it only when it saves a long prefill).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.engine import CacheBoundary

__all__ = [
    "EARLIER_MESSAGES",
    "MAX_CACHE_BREAKPOINTS",
    "MAX_RENDERS",
    "MIN_BOUNDARY_TOKENS",
    "MIN_PROMPT_TOKENS",
    "Breakpoint",
    "conversation_boundaries",
    "token_breakpoints",
]

#: client breakpoints a request may give (the engine keeps at most four new checkpoints)
MAX_CACHE_BREAKPOINTS = 16
#: renders (each also a tokenization of the rendered prefix) per request, at most
MAX_RENDERS = 6
#: structural seams are looked for only in prompts at least this long ...
MIN_PROMPT_TOKENS = 256
#: ... and kept only this far into the prompt (an earlier one saves too little)
MIN_BOUNDARY_TOKENS = 64
#: the ends of this many of the latest earlier messages are tried (older ones are covered by
#: the checkpoints earlier turns kept)
EARLIER_MESSAGES = 3
#: written into a message's text where a client marked a place inside it, then looked for
#: in the rendered prompt (private-use characters: no real text holds them)
_MARKER = "\ue000\ue0ff\ue000"

Render = Callable[[list[dict[str, Any]]], str]
Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class Breakpoint:
    """A place a client marked: after the first ``messages`` messages as the template
    renders them (``offset`` None), or inside message ``messages - 1``, after ``offset``
    characters of its text (its text parts joined): before the images that follow there,
    or with ``past_images`` (a mark on an image) after them."""

    messages: int
    offset: int | None = None
    past_images: bool = False


#: the start of the first message's text: where tool definitions end when no system message
#: comes first (a template renders no conversation without a message, so the tools' end is
#: taken with the first message's opening, which requests that share the tools share too)
_BEFORE_FIRST = Breakpoint(1, 0)


def _marked(content: Any, offset: int, past_images: bool = False) -> Any:
    """``content`` with the marker after ``offset`` characters of its text (its text parts
    joined; image parts, which hold none, stay where they are), before the images met there
    or, ``past_images``, after them; None for content of other parts."""
    if isinstance(content, str):
        if _MARKER in content:
            return None
        offset = min(max(offset, 0), len(content))
        return content[:offset] + _MARKER + content[offset:]
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        return None
    texts = [p.get("text") for p in content if p.get("type") != "image"]
    if not all(isinstance(t, str) and _MARKER not in t for t in texts):
        return None
    offset = min(max(offset, 0), sum(map(len, texts)))  # type: ignore[arg-type]
    # every place with ``offset`` characters before it, in order: (part, characters into
    # that text part), or (part, None): a part of its own before that part
    places: list[tuple[int, int | None]] = []
    before = 0
    for i, part in enumerate(content):
        if part.get("type") == "image":
            if before == offset:
                places.append((i, None))
            continue
        if before <= offset <= before + len(part["text"]):
            places.append((i, offset - before))
        before += len(part["text"])
    if before == offset:
        places.append((len(content), None))
    at, cut = places[-1] if past_images else places[0]
    out = list(content)
    if cut is None:
        out.insert(at, {"type": "text", "text": _MARKER})
    else:
        text = content[at]["text"]
        out[at] = {**content[at], "text": text[:cut] + _MARKER + text[cut:]}
    return out


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _leading_system(messages: Sequence[Mapping[str, Any]]) -> int:
    return 1 if messages and messages[0].get("role") in ("system", "developer") else 0


def _message_end(render: Render, encode: Encode, messages: list[dict[str, Any]], k: int,
                 ids: Sequence[int]) -> int | None:  # fmt: skip
    """Tokens of the first ``k`` messages rendered, when they are a prefix of ``ids``."""
    try:
        prefix = encode(render(messages[:k]))
    except Exception:  # a template may refuse a partial conversation (no user message yet)
        return None
    if len(prefix) < len(ids) and list(ids[: len(prefix)]) == prefix:
        return len(prefix)
    return None


def _inside_message(render: Render, encode: Encode, messages: list[dict[str, Any]],
                    place: Breakpoint, ids: Sequence[int]) -> int | None:  # fmt: skip
    """Tokens before ``place.offset`` characters of message ``place.messages - 1``."""
    index = place.messages - 1
    if place.offset is None:
        return None
    content = _marked(messages[index].get("content"), place.offset, place.past_images)
    if content is None:
        return None
    marked = dict(messages[index], content=content)
    try:
        rendered = render([*messages[:index], marked])
    except Exception:
        return None
    cut = rendered.find(_MARKER)
    if cut < 0:
        return None
    return _shared_prefix(encode(rendered[:cut]), ids) or None


def conversation_boundaries(
    render: Render,
    encode: Encode,
    messages: list[dict[str, Any]],
    ids: Sequence[int],
    *,
    has_tools: bool,
    breakpoints: Sequence[Breakpoint] = (),
) -> list[CacheBoundary]:
    """The seams of a chat prompt ``ids`` (``messages`` rendered): the client's
    ``breakpoints`` first, then the structural ones. ``render`` renders a prefix of the
    conversation with the request's tools and template arguments and no generation prompt;
    ``encode`` tokenizes."""
    found: dict[int, CacheBoundary] = {}
    renders = 0

    def keep(position: int | None, kind: str) -> None:
        if position is not None and 0 < position < len(ids) and position not in found:
            found[position] = CacheBoundary(position, kind)  # type: ignore[arg-type]

    for place in breakpoints:
        if renders >= MAX_RENDERS:
            break
        if not 0 <= place.messages <= len(messages):
            continue
        renders += 1
        if place.messages == 0:  # before the first message: the tools' end
            keep(_inside_message(render, encode, messages, _BEFORE_FIRST, ids), "breakpoint")
        elif place.offset is None:
            keep(_message_end(render, encode, messages, place.messages, ids), "breakpoint")
        else:
            keep(_inside_message(render, encode, messages, place, ids), "breakpoint")
    if len(ids) < MIN_PROMPT_TOKENS:
        return sorted(found.values(), key=lambda b: b.position)
    leading = _leading_system(messages)
    candidates = [leading] if (leading or has_tools) else []
    earliest = max(leading + 1, len(messages) - EARLIER_MESSAGES)
    candidates += range(len(messages) - 1, earliest - 1, -1)
    for k in candidates:
        if renders >= MAX_RENDERS:
            break
        renders += 1
        if k == 0:  # tools and no system message: up to the first message's text
            position = _inside_message(render, encode, messages, _BEFORE_FIRST, ids)
        else:
            position = _message_end(render, encode, messages, k, ids)
        if position is not None and position >= MIN_BOUNDARY_TOKENS:
            keep(position, "boundary")
    return sorted(found.values(), key=lambda b: b.position)


def token_breakpoints(positions: Sequence[int], prompt_tokens: int) -> list[CacheBoundary]:
    """A raw prompt's client breakpoints, given as token counts: those inside the prompt."""
    inside = sorted({p for p in positions if 0 < p < prompt_tokens})
    return [CacheBoundary(p, "breakpoint") for p in inside]
