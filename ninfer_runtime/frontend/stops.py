"""When to stop a request: EOS ids, stop token ids, and stop strings in the streamed text.

Stop strings are matched on the detokenized text, where one may span several tokens. The matcher
never releases text that could still turn out to be the start of a stop string: it holds back the
longest suffix that is a prefix of one, so a client never sees the first half of a stop string
that the next token completes. On a match the text is cut at the stop string (kept only with
``include_stop_str_in_output``).

Which match wins does not depend on how the text was split into deltas: the match that ends
first (the one a character-by-character stream would complete first), and of those the one that
starts first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ninfer_runtime.frontend.parsers.markers import _held_suffix

if TYPE_CHECKING:
    from ninfer_runtime.frontend.sampling import SamplingParams

__all__ = ["StopMatcher", "StopReason", "StopStep"]


@dataclass(frozen=True)
class StopReason:
    """Why generation ended: ``eos`` / ``stop_token`` (value = id) or ``stop_string`` (value = the
    string). OpenAI reports all three as ``finish_reason: "stop"``; ``value`` feeds vLLM's
    ``stop_reason`` and Anthropic's ``stop_sequence``."""

    kind: Literal["eos", "stop_token", "stop_string"]
    value: int | str


@dataclass(frozen=True)
class StopStep:
    """Result of feeding text: what may be shown now, and the stop if one matched."""

    text: str
    stop: StopReason | None = None


class StopMatcher:
    """Per-request stop state. Check each token id first (``check_token``), then feed its text."""

    def __init__(
        self,
        stop: Sequence[str] = (),
        stop_token_ids: Iterable[int] = (),
        eos_token_ids: Iterable[int] = (),
        *,
        ignore_eos: bool = False,
        include_stop_str_in_output: bool = False,
    ) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(dict.fromkeys(stop))
        self._stop_ids = frozenset(stop_token_ids)
        self._eos_ids = frozenset(() if ignore_eos else eos_token_ids)
        self._include = include_stop_str_in_output
        self._held = ""
        self.stopped: StopReason | None = None

    @classmethod
    def from_params(cls, params: SamplingParams, eos_token_ids: Iterable[int]) -> StopMatcher:
        """The matcher for a request: its stop fields plus the model's EOS ids."""
        return cls(
            params.stop,
            params.stop_token_ids,
            eos_token_ids,
            ignore_eos=params.ignore_eos,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )

    @property
    def held(self) -> str:
        """Text currently held back as a possible stop-string start."""
        return self._held

    def is_stop_token(self, token_id: int) -> bool:
        """Whether ``check_token`` would stop on this id (it records nothing)."""
        return token_id in self._eos_ids or token_id in self._stop_ids

    def check_token(self, token_id: int) -> StopReason | None:
        """A stop by token id, decided before the token's text is shown (its text is dropped)."""
        if token_id in self._eos_ids:
            self.stopped = StopReason("eos", token_id)
        elif token_id in self._stop_ids:
            self.stopped = StopReason("stop_token", token_id)
        else:
            return None
        return self.stopped

    def feed(self, text: str, *, matching: bool = True) -> StopStep:
        """Add streamed text; returns the part that is safe to show (and the stop, if matched).

        ``matching=False`` (the output is still shorter than ``min_tokens``): no stop string
        ends it yet, but a possible start of one is still held back, so a stop string that
        the next tokens complete is found then."""
        if self.stopped is not None:
            raise RuntimeError(f"StopMatcher.feed after the request stopped ({self.stopped})")
        buf = self._held + text
        if not self._stops:
            self._held = ""
            return StopStep(buf)
        match: tuple[int, int, str] | None = None  # (end, start, string)
        for stop in self._stops if matching else ():
            start = buf.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if match is None or candidate[:2] < match[:2]:
                    match = candidate
        if match is not None:
            end, start, stop = match
            self._held = ""
            self.stopped = StopReason("stop_string", stop)
            return StopStep(buf[: end if self._include else start], self.stopped)
        keep = _held_suffix(buf, self._stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return StopStep(buf[: len(buf) - keep])

    def flush(self) -> str:
        """End without a stop-string match: release the held text."""
        held, self._held = self._held, ""
        return held
