"""The indexed proposal head: a shortlist of vocabulary rows that drafters score cheaply.

A ranking file (little-endian int64 counts, one row of ``vocab_size``; row 0 is used) orders
the tokens; special tokens are always kept. The shortlist's rows of the base output head become
``proposal/head`` and the row -> token map ``proposal/token_ids`` (int32).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import RecipeError, SourceError

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
