"""Tensor parallelism: how a model's ranks combine their shares (``collective``), which share
of a dimension each rank holds (``Shard``), and how rank 0's scheduler has the other ranks
make the same calls (``mirror``). What splits how is each architecture's
(``models/<arch>/shard.py``)."""

from .collective import Collective, CollectiveError, Solo, ThreadGroup
from .mirror import Leader, follow
from .shard import Shard, ShardError

__all__ = [
    "Collective",
    "CollectiveError",
    "Leader",
    "Shard",
    "ShardError",
    "Solo",
    "ThreadGroup",
    "follow",
]
