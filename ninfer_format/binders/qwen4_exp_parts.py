"""The parts Qwen4Exp adds to a Qwen3.5 MoE text model, each a record with its config reader:
hyper-connections, the QSA token indexer and the per-layer n-gram embeddings (PLE).

Readers follow ``config_reader``'s rule: each bad member is one line in the problem list and
the reader returns None; the checks are the invariants transformers' ``Qwen4ExpTextConfig``
validates and its modeling code assumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import qwen4_exp_ngram as ngram
from .config_reader import ConfigReader, show
from .qwen3_5_geometry import LINEAR_ATTENTION

#: hash heads of one PLE layer beyond this are an error line, not a prime search
MAX_NGRAM_HEADS = 65_536
#: the n-gram hash is computed in int64: a vocabulary base beyond this cannot be addressed
MAX_NGRAM_VOCAB_BASE = 1 << 48


@dataclass(frozen=True)
class HyperConnections:
    """``streams`` residual streams of width H, folded by a rank-``rank`` input mixer."""

    streams: int
    rank: int

    MEMBERS: ClassVar[dict[str, str]] = {"streams": "hc_count", "rank": "hc_lowrank"}


@dataclass(frozen=True)
class Indexer:
    """The QSA token indexer of an attention layer (one key head, ``heads`` query heads)."""

    heads: int
    kv_heads: int
    head_dim: int
    budget: int  # tokens a query selects from complete compressed blocks
    compress_ratio: int  # consecutive token keys averaged into one index block

    MEMBERS: ClassVar[dict[str, str]] = {
        "heads": "indexer_n_heads",
        "kv_heads": "indexer_kv_heads",
        "head_dim": "indexer_head_dim",
        "budget": "indexer_budget",
        "compress_ratio": "indexer_compress_ratio",
    }

    @property
    def block_topk(self) -> int:  # blocks a query keeps
        return self.budget // self.compress_ratio


@dataclass(frozen=True)
class Ple:
    """Per-layer embeddings: hashed n-grams of orders 2..``ngram_size`` on chosen layers."""

    layers: tuple[int, ...]  # zero-based decoder layer indices, ascending
    embed_dim: int  # E: every hash head's embedding, concatenated
    conv_kernel: int
    ngram_size: int
    heads_per_ngram: int
    vocab_base: int
    vocab_divisor: int
    seed: int
    pad_token: int  # eos_token_id (its first entry): what context before a segment reads as
    unigram_vocab: int  # the text vocab_size, which bounds the hash multipliers

    MEMBERS: ClassVar[dict[str, str]] = {
        "conv_kernel": "ple_conv_kernel_size",
        "ngram_size": "ngram_size",
        "heads_per_ngram": "heads_per_ngram",
        "vocab_base": "ngram_vocab_size_base",
        "vocab_divisor": "make_ngram_vocab_size_divisible_by",
    }

    @property
    def heads(self) -> int:  # hash heads of one PLE layer
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def head_dim(self) -> int:  # columns of each n-gram table
        return self.embed_dim // self.heads

    @property
    def conv_dilation(self) -> int:
        return self.ngram_size

    def index_of(self, layer: int) -> int:
        """Which PLE layer (0, 1, …) decoder layer ``layer`` is: it picks the primes and seed."""
        return self.layers.index(layer)

    def head_vocab_sizes(self, layer: int) -> tuple[int, ...]:
        return ngram.head_vocab_sizes(self.vocab_base, self.heads, self.index_of(layer))

    def head_offsets(self, layer: int) -> tuple[int, ...]:
        return ngram.head_offsets(self.head_vocab_sizes(layer))

    def table_rows(self, layer: int) -> int:
        return ngram.table_rows(self.head_vocab_sizes(layer), self.vocab_divisor)

    def multipliers(self, layer: int) -> tuple[int, ...]:
        index = self.index_of(layer)
        return ngram.hash_multipliers(self.unigram_vocab, self.ngram_size, index, self.seed)


def read_hyper_connections(c: ConfigReader, hidden: int | None) -> HyperConnections | None:
    streams, rank = (c.positive_int(key) for key in HyperConnections.MEMBERS.values())
    if streams is not None and streams < 2:
        c.error("hc_count", f"must be at least 2 (Qwen4Exp needs several streams), got {streams}")
        return None
    # The mixer factors a [hc·H, hc·H] map; a rank as wide as its input is no longer low rank.
    if streams is not None and rank is not None and hidden is not None and rank > streams * hidden:
        c.error("hc_lowrank", f"({rank}) exceeds hc_count × hidden_size ({streams * hidden})")
        return None
    return None if streams is None or rank is None else HyperConnections(streams, rank)


def read_indexer(c: ConfigReader, rotary_dim: int | None) -> Indexer | None:
    """Every attention layer builds an indexer, so all five members are required there."""
    values = {attribute: c.positive_int(key) for attribute, key in Indexer.MEMBERS.items()}
    if None in values.values():
        return None
    indexer = Indexer(**values)  # type: ignore[arg-type]
    before = len(c.problems)
    if indexer.kv_heads != 1:
        c.error("indexer_kv_heads", f"must be 1 (QSA has one key head), got {indexer.kv_heads}")
    if indexer.budget % indexer.compress_ratio:
        c.error(
            "indexer_budget",
            f"({indexer.budget}) must be a multiple of indexer_compress_ratio"
            f" ({indexer.compress_ratio}): whole blocks are selected",
        )
    if rotary_dim is not None and rotary_dim > indexer.head_dim:
        c.error(
            "indexer_head_dim",
            f"({indexer.head_dim}) is narrower than the attention's rotary width ({rotary_dim}),"
            " which the indexer's queries and keys rotate by",
        )
    return None if len(c.problems) > before else indexer


def read_ple(
    c: ConfigReader, layer_types: tuple[str, ...] | None, hidden: int | None, vocab: int | None
) -> Ple | None:
    """None without PLE layers (or after reporting); ``c`` carries transformers' defaults."""
    ids = c.values.get("ple_layer_ids")
    if ids is None or ids == []:
        return None
    if not isinstance(ids, list) or any(type(i) is not int for i in ids):
        c.error("ple_layer_ids", f"must be a list of integers, got {show(ids)}")
        return None
    layer_ids = sorted(set(ids))  # transformers' reading: one-indexed, deduplicated, sorted
    before = len(c.problems)
    if layer_types is not None:
        outside = [i for i in layer_ids if not 1 <= i <= len(layer_types)]
        if outside:
            c.error(
                "ple_layer_ids", f"must be one-indexed layers 1..{len(layer_types)}, got {outside}"
            )
        attention = [
            i for i in layer_ids if i not in outside and layer_types[i - 1] != LINEAR_ATTENTION
        ]
        if attention:
            c.error(
                "ple_layer_ids", f"names non-linear_attention layers {attention} (PLE is GDN-only)"
            )
    values = {attribute: c.positive_int(key) for attribute, key in Ple.MEMBERS.items()}
    embed_dim = c.positive_int("ple_embed_dim") if "ple_embed_dim" in c.values else hidden
    seed = c.values.get("seed")
    if type(seed) is not int or not 0 <= seed < 1 << 63:
        c.error("seed", f"must be a non-negative int64, got {show(seed)}")
    eos = c.values.get("eos_token_id")
    pad = eos[0] if isinstance(eos, list) and eos else eos
    if type(pad) is not int or pad < 0 or (vocab is not None and pad >= vocab):
        c.error("eos_token_id", f"must be a token id when PLE layers are enabled, got {show(eos)}")
    size, per_order, base = values["ngram_size"], values["heads_per_ngram"], values["vocab_base"]
    heads = None
    if size is not None and size < 2:
        c.error("ngram_size", f"must be at least 2 (orders 2..ngram_size are hashed), got {size}")
    elif size is not None and per_order is not None:
        heads = (size - 1) * per_order
        if heads > MAX_NGRAM_HEADS:
            c.error(
                "heads_per_ngram", f"gives {heads} hash heads a layer, more than {MAX_NGRAM_HEADS}"
            )
        elif embed_dim is not None and embed_dim % heads:
            c.error(
                "ple_embed_dim", f"({embed_dim}) must be a multiple of the {heads} n-gram heads"
            )
    if base is not None and base > MAX_NGRAM_VOCAB_BASE:
        c.error("ngram_vocab_size_base", f"({base}) exceeds {MAX_NGRAM_VOCAB_BASE}")
    if len(c.problems) > before or None in values.values() or embed_dim is None or vocab is None:
        return None
    layers = tuple(i - 1 for i in layer_ids)
    return Ple(layers, embed_dim, seed=seed, pad_token=pad, unigram_vocab=vocab, **values)  # type: ignore[arg-type]
