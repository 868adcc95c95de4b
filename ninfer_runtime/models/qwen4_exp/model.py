"""Qwen4Exp text model (``qwen4_exp``, ``qwen4_exp_text``): Qwen3.5's Gated DeltaNet and gated
attention layers with MoE, on ``hc`` hyper-connection streams, with per-layer n-gram
embeddings on chosen GDN layers and the QSA token indexer on every attention layer.

    streams = [embed(ids)] · hc                       (hyper_connections.expand)
    for each layer:  streams = layer(streams, ids)    (layer.py)
    hidden  = final_connection(streams)               the mixed streams; no final norm
    logits  = output_head hidden

Served on the backends in ``SERVED_BACKENDS``. The math is written on the backend's array
module: on CUDA the products, norms, Gated DeltaNet, K/V writes and MoE run on the kernels
Qwen3.5 uses, the connections, PLE and QSA as array math (PLE's n-gram hashing on the host
for prompts and, with streamed tables, before each decode step: ``stage_decode``; on the
device in resident tables' decode steps). A decode step reads positions on the host only
past QSA's budget (each row attends over its own length): on CUDA a decode step within the
budget is captured as a CUDA graph, other steps run eagerly (``step_variant``). There is no
MTP block (transformers defines none for Qwen4Exp, so an artifact's ``mtp`` component is not
run). PLE's n-gram tables are held whole or read row by row from the artifact (``ple_rows``:
the model options ``ple_rows`` and ``ple_cache_bytes``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backends import Backend
from ...backends.base import to_numpy
from ...errors import ModelError
from ...functional import ranked_rows
from ...memory_kinds import MemoryKind
from ...ops.attention.memory import KvSpec
from ...ops.delta_rule.memory import GdnSpec
from ...state import ContextPool
from ..base import WithoutMtp, prepare_parameters, require_parameters
from ..batch import Batch, token_bucket
from ..qwen3_5.attention import Rotary
from ..registry import check_backend
from .config import INDEXED_ATTENTION, read_config
from .hyper_connections import HyperConnection, expand
from .layer import DecoderLayer
from .memory import IndexedKvSpec, PleGdnSpec, PleState
from .ple_rows import DEFAULT_CACHE_BYTES, StreamedTables, choose_mode, table_names
from .qsa import ALL, SELECTED, selects_all

Array = Any
FINAL = "text/final_connection/"
#: the backends Qwen4Exp is served on: array-generic math with the reference and kernel
#: providers on the device; cuda since tests/gpu/test_qwen4_exp_cuda.py passed on an H100
SERVED_BACKENDS = ("cpu", "cuda")


class Qwen4ExpModel(WithoutMtp):
    """The model's math: weights prepared on a backend once, state kept outside."""

    architecture = "Qwen4Exp"
    #: a prefill read may keep checkpoints inside it (``batch.Mark``): its Gated DeltaNets
    #: save their states at each mark, and PLE its own (QSA's pages hold no slot state)
    checkpoints_inside_reads = True

    def __init__(
        self,
        artifact: Any,
        backend: Backend,
        ple_rows: str = "auto",
        ple_cache_bytes: int = DEFAULT_CACHE_BYTES,
        expert_offload: Any = None,
    ):
        """``expert_offload`` (an ``expert_offload.ExpertOffload``): the routed experts it
        plans into host memory are not prepared here; it splits each MoE block."""
        # which steps read the host is said step by step (``step_variant``)
        check_backend("Qwen4Exp", backend, SERVED_BACKENDS, None)
        self.config = g = read_config(artifact.components["text"].config)
        self.backend = backend
        names = self.parameter_names()
        require_parameters(artifact, names)
        tables = table_names(g)
        #: the n-gram tables read from disk (``ple_rows`` streamed); None: held whole
        self.ple_tables = None
        if choose_mode(ple_rows, artifact, tables) == "streamed":
            self.ple_tables = StreamedTables(artifact, tables, ple_cache_bytes)
            names = [n for n in names if n not in self.ple_tables.tables]
        # streamed n-gram tables stay in host memory, outside expert offload's budget
        w = dict(prepare_parameters(self, artifact, backend, names, expert_offload))
        if self.ple_tables is not None:
            w.update(self.ple_tables.tables)
        self.token_embedding = w["text/token_embedding"]
        self.output_head = w["text/output_head"]
        self.final_connection = HyperConnection(
            FINAL, g.hyper, g.eps, backend, w, with_inject=False
        )
        self.rotary = Rotary(g.attention, backend.xp) if g.attention else None
        self.layers = [DecoderLayer(i, g, backend, w) for i in range(g.layers)]
        if expert_offload is not None:
            expert_offload.attach(self.layers)

    def parameter_names(self) -> list[str]:
        g = self.config
        names = ["text/token_embedding", "text/output_head"]
        names += HyperConnection.parameter_names(FINAL, with_inject=False)
        for i in range(g.layers):
            names += DecoderLayer.parameter_names(i, g)
        return names

    def state_specs(self) -> tuple[list[MemoryKind], MemoryKind | None]:
        """Per layer: K/V and index-key pages for attention, GDN slots (with PLE's states on
        PLE layers); no MTP layer."""
        g = self.config
        specs: list[MemoryKind] = []
        for i, kind in enumerate(g.layer_types):
            if kind == INDEXED_ATTENTION:
                assert g.attention is not None and g.indexer is not None
                kv = KvSpec(g.attention.kv_heads, g.attention.head_dim)
                ix = g.indexer
                specs.append(
                    IndexedKvSpec(kv, ix.head_dim, g.attention.rotary_dim, ix.compress_ratio)
                )
                continue
            assert g.gdn is not None
            d = g.gdn
            gdn = GdnSpec(d.value_heads, d.key_dim, d.value_dim, d.conv_channels, d.conv_kernel)
            if g.ple is None or i not in g.ple.layers:
                specs.append(gdn)
                continue
            p = g.ple
            rows = (p.conv_kernel - 1) * p.conv_dilation
            state = PleState(g.streams_width, rows, p.ngram_size - 1, p.pad_token)
            specs.append(PleGdnSpec(gdn, state))
        return specs, None

    def step_variant(self, kind: str, last_position: int) -> tuple[Any, bool]:
        """A compiled step's path and whether it may be captured, from the last position
        its rows reach (host-known): QSA selects every token up to its budget (``ALL``: the
        plain causal ops) and past it scores the blocks of the tokens in the step's
        ``token_bucket`` (``(SELECTED, bucket)``). A decode step reads nothing back
        (streamed n-gram rows are read before it, ``stage_decode``; a multi-row step's PLE
        hashes on the host), so it may be captured: past the budget while the indexer ranks
        a row's blocks on the device (``functional.ranked_rows``; past that it sorts, which
        waits for the device)."""
        g, decode = self.config, kind == "decode"
        if g.indexer is None:
            return None, decode
        if selects_all(g.indexer, last_position):
            return ALL, decode
        bucket = token_bucket(last_position)
        ranked = ranked_rows(bucket // g.indexer.compress_ratio) > 0
        return (SELECTED, bucket), decode and ranked

    def stage_decode(self, pool: ContextPool, ids: np.ndarray, slots: np.ndarray) -> None:
        """Before a decode step of lanes in ``slots`` reading ``ids`` (host int32 [lanes]):
        the streamed n-gram tables' rows of every PLE layer, hashed and read on the host and
        moved in one upload into each layer's ``staged`` rows, where the step reads them;
        nothing with resident tables. Every PLE layer keeps the same n-gram context (the
        lane's last ids), so one read of it serves them all."""
        if self.ple_tables is None:
            return
        pairs = [
            (layer.ple, memory)
            for layer, memory in zip(self.layers, pool.layers, strict=True)
            if layer.ple is not None
        ]
        if not pairs:
            return
        contexts = to_numpy(pairs[0][1].ple_context)[slots]  # type: ignore[attr-defined]
        history = np.concatenate([contexts, ids[:, None].astype(np.int32)], axis=1)
        rows = self.backend.xp.asarray(np.stack([ple.staged_rows(history) for ple, _ in pairs]))
        for (ple, memory), layer_rows in zip(pairs, rows, strict=True):
            memory.staged(ple.ple.embed_dim)[: ids.shape[0]] = layer_rows  # type: ignore[attr-defined]

    # ------------------------------------------------------------------------ positions
    def rope(self, positions: np.ndarray) -> tuple[Array, Array]:
        """Device cos/sin rows of host ``positions`` ([N], or [3, N] M-RoPE positions of a
        prompt with images); (None, None) without attention."""
        return self.rotary(positions) if self.rotary is not None else (None, None)

    def rope_table(self, positions: int) -> tuple[Array, Array] | None:
        return self.rotary.table(positions) if self.rotary is not None else None

    # ---------------------------------------------------------------------------- math
    def embed(self, ids: Array) -> Array:
        return self.backend.embedding(ids, self.token_embedding)

    def hidden_states(
        self, ids: Array, batch: Batch, pool: ContextPool, embeddings: Array | None = None
    ) -> Array:
        """Token ids [N] through the embedding, every layer and the final connection ->
        [N, H]. ``embeddings``, when given, replace the ids' rows (a prompt's, its images'
        rows placed); PLE still hashes the ids, image placeholders included, as transformers
        does."""
        h = self.embed(ids) if embeddings is None else embeddings
        streams = expand(h, self.config.hyper.streams)
        for layer, memory in zip(self.layers, pool.layers, strict=True):
            streams = layer(streams, ids, batch, memory)
        return self.final_connection(streams)[0]

    def logits(self, hidden: Array) -> Array:
        return self.backend.linear(hidden, self.output_head)

    def commit(self, pool: ContextPool, slots: Array, counts: Array) -> None:
        """After a multi-row step: fold each lane's first ``counts[i]`` rows into the
        recurrent states (GDN and PLE) of the sequence in slot ``slots[i]``."""
        for layer, memory in zip(self.layers, pool.layers, strict=True):
            layer.commit(memory, slots, counts)


def load_qwen4_exp(
    artifact: Any,
    backend: Backend,
    collective: Any = None,
    expert_parallel: bool = False,
    ple_rows: str = "auto",
    ple_cache_bytes: int = DEFAULT_CACHE_BYTES,
    expert_offload: Any = None,
) -> Qwen4ExpModel:
    if collective is not None and getattr(collective, "world", 1) > 1:
        raise ModelError("Qwen4Exp does not run tensor-parallel yet")
    return Qwen4ExpModel(artifact, backend, ple_rows, ple_cache_bytes, expert_offload)
