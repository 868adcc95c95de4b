"""The engine's token scores in OpenAI's log-probability shapes (Chat, Responses, legacy).

The engine scores tokens (``TokenEvent.logprob`` / ``top_logprobs``, ``PromptLogprobs``; what
the numbers are is in docs/runtime.md); this module only names them. A token is shown by its
exact bytes, the piece it adds to the output (``Tokenizer.token_bytes``), and by those bytes
decoded as UTF-8 with U+FFFD for a character it holds only part of: a token that ends inside
a multi-byte character reads ``"\\ufffd"`` while its ``bytes`` carry the real bytes, so the
``bytes`` of consecutive tokens joined are the text.

Shapes:

* Chat (``chat_logprobs``) and Responses (``text_logprobs``): a list of ``{"token",
  "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}``;
* legacy Completions (``completion_logprobs``): parallel lists ``tokens``,
  ``token_logprobs``, ``top_logprobs`` (one ``{token: logprob}`` object per token) and
  ``text_offset`` (where each token starts in the text, in characters).
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Protocol

from ninfer_runtime.engine import PromptLogprobs, TokenEvent
from ninfer_runtime.logprobs import TopLogprobs

__all__ = [
    "FLOOR",
    "Scored",
    "chat_logprobs",
    "completion_logprobs",
    "prompt_scored",
    "scored",
    "text_logprobs",
]

#: what a log-probability too small for a float (-inf) is shown as: JSON has no infinity,
#: and clients parse these fields as numbers (vLLM shows the same)
FLOOR = -9999.0
#: (token id, its log-probability, the most likely tokens at its position); the first token
#: of a scored prompt has neither (nothing predicts it)
Scored = tuple[int, float | None, TopLogprobs | None]


class _Tokenizer(Protocol):
    def token_bytes(self, token_id: int) -> bytes: ...


def scored(tokens: Iterable[TokenEvent]) -> list[Scored]:
    """Generated tokens as ``Scored`` (their scores None when the request asked for none)."""
    return [(t.token_id, t.logprob, t.top_logprobs) for t in tokens]


def prompt_scored(prompt: PromptLogprobs) -> list[Scored]:
    """A scored prompt as ``Scored``, its first token without scores."""
    return list(zip(prompt.token_ids, prompt.logprobs, prompt.top_logprobs, strict=True))


@lru_cache(maxsize=1 << 16)
def _piece(tokenizer: _Tokenizer, token_id: int) -> tuple[str, tuple[int, ...]]:
    """(the token as text, its exact bytes); top-k lists repeat the same few tokens, and the
    byte mapping is Python work per character, hence the cache."""
    raw = tokenizer.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), tuple(raw)


def _number(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def _alternative(tokenizer: _Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text, raw = _piece(tokenizer, token_id)
    return {"token": text, "logprob": _number(logprob), "bytes": list(raw)}


def _entry(tokenizer: _Tokenizer, item: Scored) -> dict[str, Any]:
    token_id, logprob, top = item
    entry = _alternative(tokenizer, token_id, FLOOR if logprob is None else logprob)
    entry["top_logprobs"] = [_alternative(tokenizer, t, lp) for t, lp in top or ()]
    return entry


def text_logprobs(tokenizer: _Tokenizer, tokens: Iterable[Scored]) -> list[dict[str, Any]]:
    """Chat's ``logprobs.content`` items, the Responses ``output_text`` part's ``logprobs``
    and its stream events' (the same objects)."""
    return [_entry(tokenizer, item) for item in tokens]


def chat_logprobs(tokenizer: _Tokenizer, tokens: Iterable[Scored]) -> dict[str, Any]:
    """A Chat choice's (or streamed chunk's) ``logprobs`` object."""
    return {"content": text_logprobs(tokenizer, tokens), "refusal": None}


def completion_logprobs(
    tokenizer: _Tokenizer, tokens: Sequence[Scored], text_offset: int = 0
) -> dict[str, Any]:
    """A legacy Completions choice's ``logprobs``; ``text_offset`` is where the first token
    starts in the choice's text (after an echoed prompt, say). A token that begins inside a
    character another token began starts where that character does."""
    offsets = []
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token_id, _, _ in tokens:
        offsets.append(text_offset)
        text_offset += len(decoder.decode(bytes(_piece(tokenizer, token_id)[1])))
    top: list[dict[str, float] | None] = []
    for _, logprob, best in tokens:
        if logprob is None:
            top.append(None)
            continue
        shown: dict[str, float] = {}
        for token_id, value in best or ():
            shown.setdefault(_piece(tokenizer, token_id)[0], _number(value))
        top.append(shown)
    return {
        "tokens": [_piece(tokenizer, t)[0] for t, _, _ in tokens],
        "token_logprobs": [None if lp is None else _number(lp) for _, lp, _ in tokens],
        "top_logprobs": top,
        "text_offset": offsets,
    }
