"""Streaming detokenization: token ids, one at a time, -> text deltas.

A byte-level BPE token can hold half of a multi-byte UTF-8 character, so plain ``decode`` of
each new id would emit broken text; ``DetokenizeStream`` holds ids back until their characters
are complete.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ninfer_runtime.frontend.tokenizer import Tokenizer

__all__ = ["DetokenizeStream"]


class DetokenizeStream:
    """Turns token ids, one at a time, into text deltas that never split a UTF-8 character.

    ``tokenizers.decoders.DecodeStream`` does the work through the vocabulary's own decoder
    (byte-level BPE, byte fallback, metaspace alike): it holds ids back while their text ends in
    an incomplete character. ``flush`` settles what is still held at the end of the output (an
    incomplete character becomes U+FFFD).

    With ``skip_special_tokens`` special tokens vanish from the text, except the structural
    markers (``<think>``, ``<tool_call>`` ...) the output parser needs.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = False) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=False)
        self._held: list[int] = []  # ids added since the last text came out

    def _skipped(self, token_id: int) -> bool:
        tok = self._tokenizer
        return self._skip and token_id in tok.special_ids and token_id not in tok.structural_ids

    def add(self, token_id: int) -> str:
        """Append one generated id; returns the text that became complete (maybe ``""``)."""
        if self._skipped(token_id):
            return ""
        text = self._stream.step(self._tokenizer.backend, token_id)
        if text is None:
            self._held.append(token_id)
            return ""
        self._held.clear()
        return text

    def add_many(self, token_ids: Iterable[int]) -> str:
        """Append several ids (e.g. an accepted speculative run); returns their joint delta."""
        return "".join(self.add(t) for t in token_ids)

    def flush(self) -> str:
        """End of output: whatever is still held (an incomplete character becomes U+FFFD)."""
        held, self._held = self._held, []
        return self._tokenizer.decode(held) if held else ""
