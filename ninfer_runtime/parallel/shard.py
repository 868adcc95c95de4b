"""Which share of a dimension one rank of a tensor-parallel model holds."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelError


class ShardError(ModelError):
    """A dimension does not split over the ranks."""


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``world``; with ``expert_parallel`` each routed expert of an MoE model
    is held whole by one rank, a contiguous ``world``-th of them a rank (EP), instead of every
    expert split over the ranks like a dense MLP."""

    rank: int
    world: int
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ShardError(f"rank {self.rank} is not one of {self.world} ranks")

    def units(self, count: int, what: str) -> range:
        """The rank's units of ``count`` equal ones (heads, rows): a contiguous ``count /
        world`` of them; where there are fewer units than ranks and ``world`` is a multiple
        of ``count``, each unit is shared (key/value heads under GQA): the one this rank's
        share of the other dimensions falls in."""
        w, r = self.world, self.rank
        if count % w == 0:
            per = count // w
            return range(r * per, (r + 1) * per)
        if w % count == 0:
            unit = r * count // w
            return range(unit, unit + 1)
        raise ShardError(f"{what}: {count} do not split over {w} ranks")

    def local(self, count: int, what: str) -> int:
        """How many of ``count`` units the rank holds (``len(units(count, what))``)."""
        return len(self.units(count, what))
