"""The artifact's tokenizer: text <-> token ids, special tokens, EOS ids and sampling defaults.

Everything comes from the artifact's frontend resources (``tokenizer.json``,
``tokenizer_config.json``, ``generation_config.json``), so the engine never needs the original
checkpoint directory or ``transformers`` at serving time; ``tokenizers`` runs the BPE.

Streaming needs more than ``decode``: ``detokenize_stream`` hands out a ``DetokenizeStream``
(``detokenize``) whose text deltas never split a character. The structural token strings live in
``markers``, the byte-level alphabet in ``byte_level`` and the reading of generation_config's
sampling fields in ``generation_defaults``; the markers and ``byte_to_unicode`` are re-exported
here, where their callers import them from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.frontend._errors import artifact_error
from ninfer_runtime.frontend._resources import (
    GENERATION_CONFIG,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    read_json_object,
    read_text,
    template_tokens,
)
from ninfer_runtime.frontend.byte_level import byte_to_unicode, unicode_to_byte
from ninfer_runtime.frontend.detokenize import DetokenizeStream
from ninfer_runtime.frontend.generation_defaults import sampling_defaults
from ninfer_runtime.frontend.markers import (
    ARG_KEY_CLOSE,
    ARG_KEY_OPEN,
    ARG_VALUE_CLOSE,
    ARG_VALUE_OPEN,
    ENDOFTEXT,
    IM_END,
    IM_START,
    STRUCTURAL_TOKENS,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
)

__all__ = [
    "ARG_KEY_CLOSE",
    "ARG_KEY_OPEN",
    "ARG_VALUE_CLOSE",
    "ARG_VALUE_OPEN",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "DetokenizeStream",
    "SpecialTokens",
    "Tokenizer",
    "byte_to_unicode",
]


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the ChatML / Qwen structural tokens; ``None`` where the vocabulary lacks one."""

    im_start: int | None
    im_end: int | None
    endoftext: int | None
    think_open: int | None
    think_close: int | None
    tool_call_open: int | None
    tool_call_close: int | None
    tool_response_open: int | None
    tool_response_close: int | None


class Tokenizer:
    """Encode, decode and describe the artifact's vocabulary.

    Build with ``from_resources``; the constructor takes already-parsed pieces so tests can make
    one without an artifact.
    """

    def __init__(
        self,
        backend: Any,
        *,
        tokenizer_config: Mapping[str, Any] | None = None,
        generation_config: Mapping[str, Any] | None = None,
    ) -> None:
        from tokenizers import decoders

        self._backend = backend
        tokenizer_config = tokenizer_config or {}
        generation_config = generation_config or {}

        added = _added_tokens(backend, tokenizer_config)
        self._added_content: dict[int, str] = {i: content for i, (content, _) in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, (_, sp) in added.items() if sp)
        #: Public token domain: one past the largest id (model ids run from 0; added ids may
        #: leave gaps, so the count of tokens is not enough).
        self.vocab_size: int = max(
            backend.get_vocab_size(with_added_tokens=False), max(added, default=-1) + 1
        )

        self.special = SpecialTokens(
            im_start=self.token_id(IM_START),
            im_end=self.token_id(IM_END),
            endoftext=self.token_id(ENDOFTEXT),
            think_open=self.token_id(THINK_OPEN),
            think_close=self.token_id(THINK_CLOSE),
            tool_call_open=self.token_id(TOOL_CALL_OPEN),
            tool_call_close=self.token_id(TOOL_CALL_CLOSE),
            tool_response_open=self.token_id(TOOL_RESPONSE_OPEN),
            tool_response_close=self.token_id(TOOL_RESPONSE_CLOSE),
        )
        #: The ids that write ``</think>``, which ends reasoning (one special id for Qwen).
        self.think_close_ids: tuple[int, ...] = tuple(self.encode(THINK_CLOSE))
        self.structural_ids: frozenset[int] = frozenset(
            i for i in (self.token_id(t) for t in STRUCTURAL_TOKENS) if i is not None
        )
        #: Special-token strings the chat template sees (``bos_token``, ``eos_token``, ...).
        self.template_tokens: dict[str, str] = template_tokens(tokenizer_config)
        self.eos_token_ids: tuple[int, ...] = self._eos_ids(generation_config)
        self.generation_defaults: dict[str, float | int] = sampling_defaults(generation_config)
        max_length = tokenizer_config.get("model_max_length")
        #: The context length the tokenizer was published with (HF uses 1e30 for "unset").
        self.model_max_length: int | None = (
            int(max_length)
            if isinstance(max_length, int | float) and 0 < max_length < 2**40
            else None
        )
        self._byte_level = isinstance(backend.decoder, decoders.ByteLevel)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_resources(cls, resources: Mapping[str, bytes]) -> Tokenizer:
        """Build from the artifact's ``components.text.resources`` (role -> raw bytes)."""
        from tokenizers import Tokenizer as Backend

        text = read_text(resources, TOKENIZER_JSON)
        if text is None:
            raise artifact_error(TOKENIZER_JSON, "missing; the text component needs a tokenizer")
        try:
            backend = Backend.from_str(text)
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise artifact_error(TOKENIZER_JSON, f"cannot be loaded: {exc}") from None
        return cls(
            backend,
            tokenizer_config=read_json_object(resources, TOKENIZER_CONFIG),
            generation_config=read_json_object(resources, GENERATION_CONFIG),
        )

    def _eos_ids(self, generation_config: Mapping[str, Any]) -> tuple[int, ...]:
        """EOS ids: generation_config first (it lists ``<|im_end|>`` for chat models), then the
        tokenizer_config ``eos_token`` string.
        """
        value = generation_config.get("eos_token_id")
        if value is not None:
            ids = value if isinstance(value, list) else [value]
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise artifact_error(
                    GENERATION_CONFIG, f"eos_token_id must be an id or a list of ids, got {value!r}"
                )
            return tuple(dict.fromkeys(ids))
        content = self.template_tokens.get("eos_token")
        if content is not None:
            token = self.token_id(content)
            if token is None:
                raise artifact_error(
                    TOKENIZER_CONFIG, f"eos_token {content!r} is not in vocabulary"
                )
            return (token,)
        return ()

    # -- encode / decode ----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it (from a template) become their ids.

        No BOS/EOS is added: chat templates write every special token themselves. The batch
        call releases the GIL while it runs (the single one does not), so a long prompt encoded
        in a worker thread does not stall the server's event loop.
        """
        (encoding,) = self._backend.encode_batch([text], add_special_tokens=False)
        return list(encoding.ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a cut-off character) becomes U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, content: str) -> int | None:
        """The id of a single token by its text, or ``None`` if it is not one token."""
        return self._backend.token_to_id(content)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of ``token_id`` (byte-level alphabet for BPE tokens)."""
        return self._backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token contributes to the output text.

        Added tokens contribute their content; byte-level BPE tokens map their alphabet back to
        bytes. Other decoders fall back to ``decode`` of the single token.
        """
        content = self._added_content.get(token_id)
        if content is not None:
            return content.encode("utf-8")
        if self._byte_level:
            piece = self._backend.id_to_token(token_id)
            if piece is None:
                return b""
            table = unicode_to_byte()
            out = bytearray()
            for char in piece:
                b = table.get(char)
                if b is None:
                    out += char.encode("utf-8")
                else:
                    out.append(b)
            return bytes(out)
        return self.decode([token_id]).encode("utf-8")

    def detokenize_stream(self, *, skip_special_tokens: bool = False) -> DetokenizeStream:
        """A fresh incremental decoder for one request's output."""
        return DetokenizeStream(self, skip_special_tokens=skip_special_tokens)

    @property
    def backend(self) -> Any:
        """The ``tokenizers.Tokenizer`` underneath."""
        return self._backend


def _added_tokens(backend: Any, tokenizer_config: Mapping[str, Any]) -> dict[int, tuple[str, bool]]:
    """id -> (content, special) for every added token, from both files (config wins on flags)."""
    added: dict[int, tuple[str, bool]] = {
        int(i): (token.content, bool(token.special))
        for i, token in backend.get_added_tokens_decoder().items()
    }
    decoder = tokenizer_config.get("added_tokens_decoder") or {}
    if isinstance(decoder, Mapping):
        for key, entry in decoder.items():
            if isinstance(entry, Mapping) and str(key).isdigit():
                content = entry.get("content")
                if isinstance(content, str):
                    added[int(key)] = (content, bool(entry.get("special", False)))
    return added
