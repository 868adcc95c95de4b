"""Tensor parallelism: how a model's ranks combine their shares (``collective``) and which
share of a dimension each rank holds (``Shard``). What splits how is each architecture's
(``models/<arch>/shard.py``)."""

from .collective import Collective, CollectiveError, Solo, ThreadGroup
from .shard import Shard, ShardError

__all__ = ["Collective", "CollectiveError", "Shard", "ShardError", "Solo", "ThreadGroup"]
