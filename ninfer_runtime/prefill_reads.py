"""A step's prefill chunk: which lanes read which spans of their prompts.

The scheduler asks for one chunk a step, shared by the lanes still reading their prompts.
Where each lane's read ends depends only on the lane (the chunk size, where its checkpoints
go, a scored prompt's bound), never on the lanes beside it, so a prompt is read in the same
spans, and gives the same numbers, whatever company it keeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .lane import Lane, Read
from .logprobs import PROMPT_LOGPROB_CHUNK

#: the prefill chunk of a backend that states none (``prefill_chunk`` class attribute)
PREFILL_CHUNK = 512


def default_prefill_chunk(backend: Any) -> int:
    """The prefill chunk of ``backend`` (a name or an instance) when the engine is given
    none: its class attribute ``prefill_chunk`` (the CPU 512, CUDA 2048), known before the
    backend exists."""
    from .backends import backend_class

    return int(getattr(backend_class(backend), "prefill_chunk", PREFILL_CHUNK))


def prefill_reads(
    lanes: Iterable[Lane],
    *,
    prefill_chunk: int,
    checkpoint_interval: int | None,
    inside: bool = False,
) -> list[Read]:
    """This step's prefill chunk: at most ``prefill_chunk`` tokens, shared by the ``lanes``
    (in the order they were admitted) still reading their prompts, oldest first: the oldest
    reads what it would alone, and the next ones join while their whole next read fits in
    what is left (requests that resume from a shared prefix each read a short tail: one
    forward reads them all, each weight streamed once). A read is never cut to fit, so a
    prompt's chunks end where they would alone and its numbers do not depend on the company
    it keeps. A lane scoring its prompt reads alone (every row's logits are computed).
    ``checkpoint_interval``: None without a prefix cache (no checkpoint ends a read);
    ``inside``: checkpoints are kept inside reads (``chunk_end``)."""
    reading = [a for a in lanes if a.prefilled < len(a.prompt_ids)]
    budget, reads = prefill_chunk, []
    for a in reading:
        scoring = a.prompt_scores is not None
        end = chunk_end(
            a, prefill_chunk=prefill_chunk, checkpoint_interval=checkpoint_interval, inside=inside
        )
        if reads and (scoring or end - a.prefilled > budget):
            continue
        reads.append((a, a.prefilled, end))
        budget -= end - a.prefilled
        if scoring or budget <= 0:
            break
    return reads


def chunk_end(
    a: Lane, *, prefill_chunk: int, checkpoint_interval: int | None, inside: bool = False
) -> int:
    """Where lane ``a``'s next prefill read ends: at most ``prefill_chunk`` tokens on,
    where a checkpoint goes (unless ``inside``: the model keeps checkpoints inside a read,
    ``lane_checkpoints.LaneCheckpoints.marks``), and a scored prompt's chunks stay
    bounded."""
    start, prompt = a.prefilled, a.prompt_ids
    end = min(start + prefill_chunk, len(prompt))
    if a.prompt_scores is not None:  # every row's logits are computed: keep them bounded
        end = min(end, start + PROMPT_LOGPROB_CHUNK)
    if checkpoint_interval is not None and not inside:
        end = min(end, (start // checkpoint_interval + 1) * checkpoint_interval)
        end = min([end, *(p for p in a.plan if p > start)])
    return end
