"""Qwen3.5 split over the ranks of a tensor-parallel run (Megatron-style, one all-reduce per
block output):

* gated attention: query and gate heads split; key/value heads split, or shared where there
  are fewer of them than ranks; the output projection's input columns split alike;
* Gated DeltaNet: key and value heads split (each rank's value heads read its key heads, the
  ratio kept), and with them the convolution channels of each of q, k and v, z, a, b,
  ``a_log`` and ``dt_bias``; the output projection's columns split alike;
* the dense MLP, each routed expert and the shared expert: gate and up rows split, down
  columns split; with expert parallelism (``Shard.expert_parallel``) each routed expert is
  instead held whole by one rank, ranks taking contiguous runs of experts (a rank computes
  the top-k pairs of its own experts, and the block's all-reduce sums them with the others');
* the output head: vocabulary rows split, each rank's logits gathered;
* everything else (embedding, norms, router, shared score, the MTP block's input
  projection, the proposal head) whole on every rank.

A rank's model is the same math on the local geometry (``local_config``), its block outputs
summed over the ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...parallel import Shard, ShardError
from .config import Qwen35Config

#: how a parameter splits, by its last path parts: the axis, then its blocks along that axis
#: as (geometry field counting the block's units, geometry field giving a unit's width); a
#: rank takes its units of each block. Names not here are whole on every rank.
_HEADS = ("attention", "heads", "head_dim")
_KV_HEADS = ("attention", "kv_heads", "head_dim")
_KEY_HEADS = ("gdn", "key_heads", "key_dim")
_VALUE_HEADS = ("gdn", "value_heads", "value_dim")
_VALUES = ("gdn", "value_heads", None)  # one entry a value head
_ROWS = (None, None, None)  # every row a unit
SPLITS: dict[str, tuple[int, tuple[tuple[str | None, str | None, str | None], ...]]] = {
    "attention/query": (0, (_HEADS,)),
    "attention/gate": (0, (_HEADS,)),
    "attention/key": (0, (_KV_HEADS,)),
    "attention/value": (0, (_KV_HEADS,)),
    "attention/output": (1, (_HEADS,)),
    "gdn/query": (0, (_KEY_HEADS,)),
    "gdn/key": (0, (_KEY_HEADS,)),
    "gdn/value": (0, (_VALUE_HEADS,)),
    "gdn/z": (0, (_VALUE_HEADS,)),
    "gdn/b_projection": (0, (_VALUES,)),
    "gdn/a_projection": (0, (_VALUES,)),
    "gdn/a_log": (0, (_VALUES,)),
    "gdn/dt_bias": (0, (_VALUES,)),
    "gdn/convolution": (1, (_KEY_HEADS, _KEY_HEADS, _VALUE_HEADS)),  # [K, q | k | v]
    "gdn/output": (1, (_VALUE_HEADS,)),
    "text/output_head": (0, (_ROWS,)),  # vocabulary rows: the logits are gathered
    "gate": (0, (_ROWS,)),  # mlp/, moe/experts/<e>/ and moe/shared/
    "up": (0, (_ROWS,)),
    "down": (1, (_ROWS,)),
}
#: the names ending in gate/up/down that are a gated MLP's (attention/gate is a head split)
_MLP_PARENTS = ("mlp", "shared")


def split_of(name: str, expert_parallel: bool = False) -> tuple[int, tuple[Any, ...]] | None:
    """``SPLITS``' entry for a parameter name, None if it is whole on the ranks that hold it
    (a routed expert's, with ``expert_parallel``)."""
    parts = name.split("/")
    two = "/".join(parts[-2:])
    if two in SPLITS:
        return SPLITS[two]
    expert = parts[-3:-2] == ["experts"]
    if expert and expert_parallel:
        return None
    mlp = len(parts) >= 2 and (parts[-2] in _MLP_PARENTS or expert)
    return SPLITS.get(parts[-1]) if mlp else None


def local_config(c: Qwen35Config, shard: Shard) -> Qwen35Config:
    """The geometry rank ``shard`` computes (its heads; with expert parallelism, its run of
    routed experts); ``ShardError`` naming the field when one does not split."""
    attention, gdn, moe = c.attention, c.gdn, c.moe
    if moe is not None and shard.expert_parallel:
        per = _split_evenly(moe, "experts", shard)
        moe = dataclasses.replace(moe, owned=(shard.rank * per, (shard.rank + 1) * per))
    if attention is not None:
        attention = dataclasses.replace(
            attention,
            heads=_split_evenly(attention, "heads", shard),
            kv_heads=shard.local(attention.kv_heads, attention.MEMBERS["kv_heads"]),
        )
    if gdn is not None:
        gdn = dataclasses.replace(
            gdn,
            key_heads=_split_evenly(gdn, "key_heads", shard),
            value_heads=_split_evenly(gdn, "value_heads", shard),
        )
    return dataclasses.replace(c, attention=attention, gdn=gdn, moe=moe)


def _split_evenly(section: Any, count_field: str, shard: Shard) -> int:
    """A count of the geometry split over the ranks; the error names its config member."""
    count, world = getattr(section, count_field), shard.world
    if count % world:
        member = section.MEMBERS[count_field]
        raise ShardError(f"{member}: {count} do not split over {world} ranks")
    return count // world


def shard_index(
    name: str, length: int, c: Qwen35Config, shard: Shard
) -> tuple[int, np.ndarray] | None:
    """``(axis, indices)``: the rank's share of parameter ``name``, whose ``axis`` is
    ``length`` long, as the sorted indices along that axis it takes (by ``SPLITS``); None
    where the rank holds it whole."""
    split = split_of(name, shard.expert_parallel)
    if split is None or shard.world == 1:
        return None
    axis, blocks = split
    index, start = [], 0
    for section, count_field, width_field in blocks:
        geometry = getattr(c, section) if section else None
        count = getattr(geometry, count_field) if geometry else length
        width = getattr(geometry, width_field) if width_field else 1
        units = shard.units(count, f"{name} ({count_field or 'rows'})")
        index.append(np.arange(start + units.start * width, start + units.stop * width))
        start += count * width
    if start != length:
        raise ShardError(f"{name}: {length} along axis {axis}, the geometry says {start}")
    return axis, np.concatenate(index)


def shard_parameter(name: str, values: np.ndarray, c: Qwen35Config, shard: Shard) -> np.ndarray:
    """The rank's share of parameter ``name`` (its full ``values``), by ``SPLITS``."""
    split = split_of(name, shard.expert_parallel)
    share = None if split is None else shard_index(name, np.shape(values)[split[0]], c, shard)
    if share is None:
        return values
    axis, index = share
    return np.take(np.asarray(values), index, axis=axis)


class ShardedArtifact:
    """An artifact whose ``parameter`` gives one rank's share of each parameter; everything
    else is the artifact's."""

    def __init__(self, artifact: Any, config: Qwen35Config, shard: Shard):
        self._artifact, self._config, self.shard = artifact, config, shard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._artifact, name)

    def parameter(self, name: str, **options: Any) -> np.ndarray:
        full = self._artifact.parameter(name, **options)
        return shard_parameter(name, full, self._config, self.shard)

    def share(self, name: str) -> tuple[int, np.ndarray] | None:
        """``(axis, indices)`` of parameter ``name`` this rank takes (``shard_index``), None
        where it holds it whole: a backend that reads packed rows in place takes a split by
        rows (axis 0) as those rows of the stored objects, and decodes ``parameter`` for any
        other."""
        split = split_of(name, self.shard.expert_parallel)
        if split is None:
            return None
        shape = self._artifact.binder_report.parameters[name]
        return shard_index(name, int(shape[split[0]]), self._config, self.shard)
