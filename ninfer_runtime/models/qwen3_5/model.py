"""Qwen3.5 / Qwen3.6 text model (dense and MoE), notes 5.1:

    h = token_embedding[ids]
    for each layer:  h = h + mixer(RMSNorm_1p(h))      mixer = GDN or gated attention
                     h = h + ffn(RMSNorm_1p(h))        ffn = dense MLP or MoE
    hidden = RMSNorm_1p(h; final_norm)                 (what the MTP head consumes)
    logits = output_head hidden

RMSNorm_1p is the zero-centred norm ``x / rms(x) * (1 + w)``. Each residual add is done
together with the norm that reads its result (``add_norm``), so a layer hands its ffn output
to the next layer (or the final norm) still pending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...backends import Backend, Weight
from ...errors import EngineError, ModelError
from ...state import (
    PAGE_TOKENS,
    ContextPool,
    GdnSpec,
    KvSpec,
    LayerPool,
    SequenceState,
    single_sequence_pool,
)
from ..base import ForwardOutput
from ..batch import Batch, DecodeIndex, Lane
from ..registry import register_model
from .attention import GatedAttention, Rotary
from .config import FULL_ATTENTION, LINEAR_ATTENTION, Qwen35Config
from .gdn import GatedDeltaNet
from .mlp import DenseMlp, SparseMoe
from .mtp import MtpHead

Array = Any


def add_norm(
    backend: Backend, h: Array, delta: Array | None, w: Array, eps: float
) -> tuple[Array, Array]:
    """``h + delta`` and its RMSNorm_1p in one op; ``delta`` None: nothing to add."""
    if delta is None:
        return h, backend.rms_norm(h, w, eps, offset=1.0)
    return backend.add_rms_norm(h, delta, w, eps, offset=1.0)


class DecoderLayer:
    """Pre-norm residual block: a token mixer, then a feed-forward block."""

    def __init__(
        self,
        prefix: str,
        layer_type: str,
        c: Qwen35Config,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        self.backend, self.eps = backend, c.eps
        self.input_norm = backend.array(weights[prefix + "input_norm"])
        self.post_attention_norm = backend.array(weights[prefix + "post_attention_norm"])
        self.mixer: GatedAttention | GatedDeltaNet
        if layer_type == FULL_ATTENTION:
            assert c.attention is not None
            self.mixer = GatedAttention(prefix, c.attention, c.eps, backend, weights)
        else:
            assert c.gdn is not None
            self.mixer = GatedDeltaNet(prefix, c.gdn, c.eps, backend, weights)
        self.ffn: DenseMlp | SparseMoe = (
            SparseMoe(prefix, c.moe, backend, weights)
            if c.moe
            else DenseMlp(prefix, backend, weights)
        )

    @staticmethod
    def parameter_names(prefix: str, layer_type: str, c: Qwen35Config) -> list[str]:
        names = [prefix + "input_norm", prefix + "post_attention_norm"]
        if layer_type == FULL_ATTENTION:
            names += GatedAttention.parameter_names(prefix)
        else:
            names += GatedDeltaNet.parameter_names(prefix)
        if c.moe:
            names += SparseMoe.parameter_names(prefix, c.moe)
        else:
            names += DenseMlp.parameter_names(prefix)
        return names

    def __call__(
        self, h: Array, pending: Array | None, batch: Batch, memory: LayerPool
    ) -> tuple[Array, Array]:
        """The residual stream ``h`` with ``pending`` (the previous layer's ffn output, None
        before the first layer) not yet added -> the same pair after this layer."""
        be, eps = self.backend, self.eps
        h, x = add_norm(be, h, pending, self.input_norm, eps)
        mixed = self.mixer(x, batch, memory)  # type: ignore[arg-type]
        h, x = add_norm(be, h, mixed, self.post_attention_norm, eps)
        return h, self.ffn(x)


class Qwen35Model:
    """The runnable model: weights prepared on a backend once, state kept outside."""

    def __init__(self, artifact: Any, backend: Backend):
        self.config = c = Qwen35Config.from_text_config(artifact.components["text"].config)
        self.backend = backend
        for kind in c.layer_types:
            if kind not in (FULL_ATTENTION, LINEAR_ATTENTION):
                raise ModelError(f"unknown layer type {kind!r} in the text config")
        with_mtp = "mtp" in artifact.components
        if c.attention is None and (with_mtp or FULL_ATTENTION in c.layer_types):
            raise ModelError("full attention (a layer or the mtp block) needs num_attention_heads")
        names = self.parameter_names(c, with_mtp)
        missing = [n for n in names if n not in artifact.bindings]
        if missing:
            raise ModelError(
                f"artifact lacks {len(missing)} parameter(s) the model needs, e.g. {missing[0]}"
            )
        w = backend.prepare(artifact, names)
        self.token_embedding = w["text/token_embedding"]
        self.output_head = w["text/output_head"]
        self.final_norm = backend.array(w["text/final_norm"])
        self.layers = [
            DecoderLayer(f"text/layers/{i}/", kind, c, backend, w)
            for i, kind in enumerate(c.layer_types)
        ]
        self.rotary = Rotary(c.attention, backend.xp) if c.attention else None
        self.mtp = (
            MtpHead(c, backend, w, self.token_embedding, self.output_head) if with_mtp else None
        )
        self._steps: dict[tuple[int, int], Any] = {}

    @staticmethod
    def parameter_names(c: Qwen35Config, with_mtp: bool) -> list[str]:
        names = ["text/token_embedding", "text/output_head", "text/final_norm"]
        for i, kind in enumerate(c.layer_types):
            names += DecoderLayer.parameter_names(f"text/layers/{i}/", kind, c)
        if with_mtp:
            names += MtpHead.parameter_names(c)
        return names

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    # ------------------------------------------------------------------------- state
    def state_specs(self) -> tuple[list[KvSpec | GdnSpec], KvSpec | None]:
        """What each layer (and the MTP layer, if any) keeps per sequence."""
        c = self.config
        specs: list[KvSpec | GdnSpec] = []
        for kind in c.layer_types:
            if kind == FULL_ATTENTION:
                assert c.attention is not None
                specs.append(KvSpec(c.attention.kv_heads, c.attention.head_dim))
            else:
                assert c.gdn is not None
                g = c.gdn
                specs.append(
                    GdnSpec(g.value_heads, g.key_dim, g.value_dim, g.conv_channels, g.conv_kernel)
                )
        mtp = None
        if self.mtp is not None and c.attention is not None:
            mtp = KvSpec(c.attention.kv_heads, c.attention.head_dim)
        return specs, mtp

    def new_pool(
        self,
        *,
        slots: int,
        pages: int,
        max_context: int,
        page_tokens: int = PAGE_TOKENS,
        kv_dtype: str = "float32",
    ) -> ContextPool:
        specs, mtp = self.state_specs()
        return ContextPool(
            specs,
            self.backend.xp,
            slots=slots,
            pages=pages,
            max_context=max_context,
            mtp=mtp,
            page_tokens=page_tokens,
            kv_dtype=kv_dtype,
        )

    def new_state(self, max_context: int) -> SequenceState:
        """A sequence of up to ``max_context`` tokens in a pool of its own."""
        specs, mtp = self.state_specs()
        pool = single_sequence_pool(specs, self.backend.xp, max_context, mtp=mtp)
        return pool.open(max_context)

    # ----------------------------------------------------------------------- forward
    def forward(
        self,
        tokens_per_lane: Sequence[Array],
        states: Sequence[SequenceState],
        *,
        last_only: bool = False,
    ) -> ForwardOutput:
        """Advance every lane by its tokens; lanes share projections, not memory."""
        be = self.backend
        lanes, ids = self._plan(tokens_per_lane, states)
        pool = states[0].pool
        if all(lane.tokens == 1 for lane in lanes):
            logits, h = self._decode_step(pool, len(lanes))(
                np.concatenate(ids).astype(np.int32),
                np.asarray([s.slot for s in states], dtype=np.int32),
                np.asarray([s.length for s in states], dtype=np.int32),
            )
            for state in states:
                state.length += 1
            rows = [slice(i, i + 1) for i in range(len(lanes))]
            return ForwardOutput([logits[r] for r in rows], [h[r] for r in rows], logits)

        positions = np.concatenate([np.arange(ln.start, ln.start + ln.tokens) for ln in lanes])
        batch = self._batch(lanes, positions)
        h = self._hidden(be.xp.asarray(np.concatenate(ids)), batch, pool)
        for lane, state in zip(lanes, states, strict=True):
            state.length += lane.tokens

        hidden = [h[lane.rows] for lane in lanes]
        if last_only:
            last = be.xp.asarray([lane.rows.stop - 1 for lane in lanes])
            logits = be.linear(h[last], self.output_head)
            return ForwardOutput([logits[i : i + 1] for i in range(len(lanes))], hidden, logits)
        logits = be.linear(h, self.output_head)
        return ForwardOutput([logits[lane.rows] for lane in lanes], hidden)

    def prefill(self, tokens: Array, state: SequenceState, *, chunk: int = 512) -> ForwardOutput:
        """A whole prompt through ``forward`` in chunks of ``chunk`` tokens, so activations stay
        bounded; returns the last chunk's logits and every chunk's hidden rows."""
        tokens = np.asarray(tokens)
        self._check_capacity(0, len(tokens), state)
        hidden, out = [], None
        for a in range(0, len(tokens), chunk):
            out = self.forward([tokens[a : a + chunk]], [state])
            hidden.append(out.hidden[0])
        if out is None:
            raise EngineError("prefill needs at least one token")
        return ForwardOutput(out.logits, [self.backend.xp.concatenate(hidden)])

    def mtp_logits(
        self,
        hidden: Array,
        next_token_ids: Array,
        state: SequenceState,
        *,
        start: int | None = None,
    ) -> Array:
        """Draft logits for the tokens after ``next_token_ids`` (see ``MtpHead``).

        Row i pairs main-model hidden state ``start + i`` with the token at ``start + i + 1``;
        ``start`` defaults to the MTP cache length, so successive calls continue the sequence
        (pass an earlier ``start`` to overwrite rejected draft entries).
        """
        if self.mtp is None:
            raise ModelError("artifact has no mtp component")
        if state.pool.mtp is None:
            raise EngineError("this state was made without an MTP cache")
        start = state.mtp_length if start is None else start
        ids = np.asarray(next_token_ids).reshape(-1)
        t = len(ids)
        if hidden.shape != (t, self.config.hidden):
            raise EngineError(
                f"mtp_logits: hidden is {tuple(hidden.shape)}, expected ({t}, {self.config.hidden})"
                " (one row per next token)"
            )
        if not 0 <= start <= state.mtp_length:
            raise EngineError(f"mtp_logits: start {start} outside 0..{state.mtp_length}")
        if start + t > state.max_context:
            raise EngineError(
                f"mtp_logits: {t} entries from slot {start} exceed max_context {state.max_context}"
            )
        self._check_ids(ids, "mtp_logits")
        assert self.rotary is not None
        positions = np.arange(start + 1, start + 1 + t)  # positions of the embedded tokens
        batch = self._batch([Lane(slice(0, t), start, state)], positions)
        assert state.pool.mtp is not None
        logits = self.mtp(hidden, self.backend.xp.asarray(ids), batch, state.pool.mtp)
        state.mtp_length = start + t
        return logits

    # ----------------------------------------------------------------------- decoding
    def _decode_step(self, pool: ContextPool, lanes: int) -> Any:
        """The decode step for ``lanes`` lanes of ``pool``, made once: the backend may
        capture it (a CUDA graph per lane count) and replay it every token."""
        key = (id(pool), lanes)
        step = self._steps.get(key)
        if step is None:
            if self.rotary is not None:
                self.rotary.table(pool.max_context)  # sized before any capture
            step = self.backend.compile_step(
                lambda ids, slots, positions: self._decode_rows(pool, ids, slots, positions),
                lanes,
            )
            self._steps = {k: v for k, v in self._steps.items() if k[0] == id(pool)}
            self._steps[key] = step
        return step

    def _decode_rows(
        self, pool: ContextPool, ids: Array, slots: Array, positions: Array
    ) -> tuple[Array, Array]:
        """One token for each row, every index on the device: (logits, hidden) [N, ...]."""
        be = self.backend
        cos = sin = None
        if self.rotary is not None:
            cos_table, sin_table = self.rotary.table(pool.max_context)
            cos, sin = cos_table[positions], sin_table[positions]
        batch = Batch((), cos, sin, DecodeIndex(slots, positions, pool.page_table))
        h = self._hidden(ids, batch, pool)
        return be.linear(h, self.output_head), h

    # --------------------------------------------------------------------- internals
    def _hidden(self, ids: Array, batch: Batch, pool: ContextPool) -> Array:
        """Token ids [N] through the embedding, every layer and the final norm -> [N, H]."""
        h, pending = self.backend.embedding(ids, self.token_embedding), None
        for layer, memory in zip(self.layers, pool.layers, strict=True):
            h, pending = layer(h, pending, batch, memory)
        return add_norm(self.backend, h, pending, self.final_norm, self.config.eps)[1]

    def _batch(self, lanes: list[Lane], positions: np.ndarray) -> Batch:
        cos, sin = self.rotary(positions) if self.rotary is not None else (None, None)
        return Batch(tuple(lanes), cos, sin)

    def _plan(
        self, tokens_per_lane: Sequence[Array], states: Sequence[SequenceState]
    ) -> tuple[list[Lane], list[np.ndarray]]:
        if len(tokens_per_lane) != len(states):
            raise EngineError(
                f"forward got {len(tokens_per_lane)} token lanes but {len(states)} states"
            )
        if not states:
            raise EngineError("forward needs at least one lane")
        if len({id(s) for s in states}) != len(states):
            raise EngineError("the same state appears in two lanes of one forward call")
        lanes, ids, row = [], [], 0
        for i, (tokens, state) in enumerate(zip(tokens_per_lane, states, strict=True)):
            toks = np.asarray(tokens).reshape(-1)
            if len(state.pool.layers) != len(self.layers):
                raise EngineError(
                    f"lane {i}: state has {len(state.pool.layers)} layers, the model "
                    f"{len(self.layers)} (made by another model?)"
                )
            self._check_capacity(i, len(toks), state)
            self._check_ids(toks, f"lane {i}")
            if state.pool is not states[0].pool:
                raise EngineError(f"lane {i}: its state lives in another context pool")
            if state.slot < 0:
                raise EngineError(f"lane {i}: its state was closed")
            lanes.append(Lane(slice(row, row + len(toks)), state.length, state))
            ids.append(toks.astype(np.int64))
            row += len(toks)
        return lanes, ids

    @staticmethod
    def _check_capacity(lane: int, tokens: int, state: SequenceState) -> None:
        if tokens == 0:
            raise EngineError(f"lane {lane}: no tokens to process")
        if tokens > state.free:
            raise EngineError(
                f"lane {lane}: {tokens} tokens do not fit: the state holds {state.length} of "
                f"max_context {state.max_context} ({state.free} free)"
            )

    def _check_ids(self, ids: np.ndarray, where: str) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab):
            bad = int(ids.max()) if ids.max() >= self.config.vocab else int(ids.min())
            raise EngineError(
                f"{where}: token id {bad} outside the vocabulary 0..{self.config.vocab - 1}"
            )


@register_model("qwen3_5_text", "qwen3_5_moe_text")
def load_qwen3_5(artifact: Any, backend: Backend) -> Qwen35Model:
    return Qwen35Model(artifact, backend)
