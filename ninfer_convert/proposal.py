"""The indexed proposal head: a shortlist of vocabulary rows that drafters score cheaply.

A ranking file (little-endian int64 counts, one row of ``vocab_size``; row 0 is used) orders
the tokens; special tokens are always kept. The shortlist's rows of the base output head become
``proposal/head`` and the row -> token map ``proposal/token_ids`` (int32); ``add_proposal_head``
puts both in the logical map with their choices.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ninfer_format.binders.proposal_head import DRAFTERS

from .adapters import LogicalTensor
from .errors import RecipeError, SourceError
from .recipe import DEFAULT_METHOD, Choice, Recipe

DEFAULT_ROWS = 131072


def read_ranking(path: Path, vocab_size: int) -> np.ndarray:
    """Row 0 of the ranking file as int64 counts (length ``vocab_size``)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SourceError(
            f"{path}: cannot read the proposal ranking file: {exc.strerror}"
        ) from None
    row_bytes = vocab_size * 8
    if size == 0 or size % row_bytes:
        raise SourceError(
            f"{path}: {size} bytes is not a whole number of int64 rows of vocab_size "
            f"{vocab_size} ({row_bytes} bytes each)"
        )
    return np.fromfile(path, dtype="<i8", count=vocab_size)


def token_domain(resources: dict[str, bytes]) -> tuple[int, set[int]]:
    """Public token count (max id + 1) and the special token ids of the tokenizer files."""
    special: set[int] = set()
    count = 0
    if "tokenizer.json" in resources:
        tok = json.loads(resources["tokenizer.json"])
        vocab = (tok.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, dict) and vocab:
            count = max(vocab.values()) + 1
        for added in tok.get("added_tokens") or []:
            count = max(count, added["id"] + 1)
            if added.get("special"):
                special.add(added["id"])
    if "tokenizer_config.json" in resources:
        decoder = json.loads(resources["tokenizer_config.json"]).get("added_tokens_decoder") or {}
        for key, entry in decoder.items():
            count = max(count, int(key) + 1)
            if isinstance(entry, dict) and entry.get("special"):
                special.add(int(key))
    if count == 0:
        raise SourceError("the proposal head needs tokenizer.json to know the token domain")
    return count, special


def select_shortlist(
    counts: np.ndarray, rows: int, token_count: int, forced: set[int]
) -> np.ndarray:
    """``rows`` unique token ids, most frequent first (ties by id); ``forced`` always included."""
    forced = {t for t in forced if t < token_count}
    if not 0 < rows <= token_count:
        raise RecipeError(
            f"--proposal-rows {rows} must be in [1, {token_count}] (the token domain)"
        )
    if len(forced) > rows:
        raise RecipeError(f"--proposal-rows {rows} cannot hold the {len(forced)} special tokens")
    candidates = counts[:token_count]
    order = np.argsort(-candidates, kind="stable")
    is_forced = np.zeros(token_count, dtype=bool)
    is_forced[list(forced)] = True
    chosen = order[~is_forced[order]][: rows - len(forced)]
    union = np.concatenate([chosen, np.fromiter(sorted(forced), dtype=np.int64)])
    union = union[np.argsort(-candidates[union], kind="stable")]
    return union.astype(np.int32)


@dataclass(frozen=True)
class ProposalRequest:
    """``--proposal RANKING_FILE --proposal-rows N``; ``ranking`` None: the first ``rows``
    token ids in order, what a recipe's ``full_proposal`` asks for (every row of the head)."""

    ranking: Path | None
    rows: int = DEFAULT_ROWS


def add_proposal_head(
    request: ProposalRequest,
    logical: dict[str, LogicalTensor],
    choices: dict[str, Choice],
    base: Any,
    config: Mapping[str, Any],
    components: tuple[str, ...],
    recipe: Recipe,
) -> None:
    """``proposal/head`` (rows of the output head's source; spec 5.6: used at each drafter's
    final hidden state) and ``proposal/token_ids`` (row -> token id)."""
    head = logical["text/output_head"]
    inputs = tuple(f"{d}/final_hidden" for d in DRAFTERS if d in components)
    fmt = recipe.proposal_format
    choices["proposal/head"] = Choice(
        format=fmt, method=DEFAULT_METHOD[fmt], source=choices["text/output_head"].source
    )
    if request.ranking is None:  # rows in id order: the head's values in the proposal format
        gather = tuple(range(request.rows))
    else:
        count, special = token_domain(base.resources)
        vocab = int(config["vocab_size"])
        ranking = read_ranking(request.ranking, vocab)
        ids = select_shortlist(ranking, request.rows, min(count, vocab), special)
        gather = tuple(int(i) for i in ids)
    logical["proposal/head"] = LogicalTensor(
        "proposal/head", (request.rows, head.shape[1]), "matrix", inputs, head.pieces,
        gather=gather,
    )  # fmt: skip
    logical["proposal/token_ids"] = LogicalTensor(
        "proposal/token_ids", (request.rows,), "token ids", (), (), constant=gather
    )
    choices["proposal/token_ids"] = Choice(format="int32", method="cast")
