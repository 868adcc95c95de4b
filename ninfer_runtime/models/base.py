"""What every architecture offers the runner and the bench: its math, never its bookkeeping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import ModelError
from ..memory_kinds import MemoryKind
from ..ops.attention.memory import AttentionPages
from ..state import ContextPool

if TYPE_CHECKING:
    from ..backends import Backend
    from .batch import Batch

Array = Any


@dataclass
class ForwardOutput:
    """Per lane, in the order the lanes were given.

    ``logits[i]`` is [T_i, V] (or [1, V] when only the last row was asked for);
    ``hidden[i]`` is [T_i, H], the post-final-norm hidden states the MTP head consumes.
    ``last_logits`` is [lanes, V], every lane's last logits row in one array, when the model
    computed them as one (a decode step, ``last_only``), so a sampler need not gather them;
    ``None`` otherwise.
    """

    logits: list[Array]
    hidden: list[Array]
    last_logits: Array | None = None


class Model(Protocol):
    """A loaded architecture on a backend: the surface ``ModelRunner`` and ``ninfer-bench``
    use. Lanes, batches, prefill chunks and decode-step capture are the runner's; a model
    only computes. ``config`` has at least ``vocab`` and ``hidden``; ``layers``,
    ``token_embedding`` and ``output_head`` are read by the bench to count a step's bytes.
    A model whose every layer with slot states saves them at a lane's marks
    (``batch.Mark``) says so with ``checkpoints_inside_reads = True`` (absent: False)."""

    config: Any
    backend: Backend
    layers: Sequence[Any]
    token_embedding: Any
    output_head: Any

    @property
    def has_mtp(self) -> bool: ...

    def state_specs(self) -> tuple[list[MemoryKind], MemoryKind | None]:
        """What each layer, and the MTP layer (None: no MTP), keeps per sequence: the memory
        kind of each (``memory_kinds``), which the context pool allocates."""
        ...

    def rope(self, positions: np.ndarray) -> tuple[Array, Array]:
        """Device cos/sin rows of host positions ((None, None): no attention)."""
        ...

    def rope_table(self, positions: int) -> tuple[Array, Array] | None:
        """Device cos/sin tables of positions ``0 .. positions - 1`` (None: no attention)."""
        ...

    def embed(self, ids: Array) -> Array:
        """Token ids [N] -> input embeddings [N, H]."""
        ...

    def hidden_states(
        self, ids: Array, batch: Batch, pool: ContextPool, embeddings: Array | None = None
    ) -> Array:
        """Token ids [N] laid out by ``batch`` -> post-final-norm hidden states [N, H];
        ``embeddings`` [N, H], when given, stand in for the ids' (images placed among them)."""
        ...

    def logits(self, hidden: Array) -> Array:
        """[N, H] -> [N, V]."""
        ...

    def mtp_logits(
        self, hidden: Array, next_ids: Array, batch: Batch, memory: AttentionPages
    ) -> Array:
        """The MTP block's draft logits for main-model hidden rows and the tokens after them."""
        ...

    def mtp_hidden(
        self, hidden: Array, next_ids: Array, batch: Batch, memory: AttentionPages
    ) -> Array:
        """The MTP block's post-norm output rows (``logits`` of them are its draft logits)."""
        ...

    @property
    def has_proposal_head(self) -> bool:
        """Whether the artifact holds an indexed proposal head (spec 5.6) for the drafter."""
        ...

    def propose(self, hidden: Array, *, optimized: bool = True) -> Array:
        """The drafter's most likely next token for each MTP output row -> int [N]; over
        the proposal head's rows when there is one and ``optimized``, else the full head."""
        ...

    def commit(self, pool: ContextPool, slots: Array, counts: Array) -> None:
        """After a verification forward: fold lane i's first ``counts[i]`` tokens into the
        recurrent states of the sequence in slot ``slots[i]``."""
        ...


class WithoutMtp:
    """The MTP part of ``Model`` for an architecture whose MTP block this runtime does not run
    (transformers defines none): speculation is refused before any of it is called.
    ``architecture`` names the model in the refusals."""

    architecture: str

    @property
    def has_mtp(self) -> bool:
        return False

    @property
    def has_proposal_head(self) -> bool:
        return False

    def mtp_logits(self, *_: Any, **__: Any) -> Array:
        raise ModelError(
            f"{self.architecture} has no MTP block in this runtime (transformers defines none)"
        )

    mtp_hidden = mtp_logits

    def propose(self, hidden: Array, *, optimized: bool = True) -> Array:
        raise ModelError(f"{self.architecture} has no MTP drafter")


def require_parameters(
    artifact: Any, names: Sequence[str], what: str = "parameter(s) the model needs"
) -> None:
    """Refuses in one line an artifact that binds not all of ``names``."""
    missing = [n for n in names if n not in artifact.bindings]
    if missing:
        raise ModelError(f"artifact lacks {len(missing)} {what}, e.g. {missing[0]}")


def prepare_parameters(
    model: Any, artifact: Any, backend: Backend, names: Sequence[str], expert_offload: Any
) -> Mapping[str, Any]:
    """``names`` prepared on ``backend``, less the routed experts ``expert_offload`` (an
    ``expert_offload.ExpertOffload``, or None) plans into host memory: planned from every
    name before any weight is prepared (``model.state_specs()`` must answer by then)."""
    if expert_offload is not None:
        held = expert_offload.plan_load(model, artifact, names)
        names = [n for n in names if not held(n)]
    return backend.prepare(artifact, names)
