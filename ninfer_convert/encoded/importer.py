"""The import method protocol: what the pipeline asks of an importer around planning and
writing."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ninfer_format.progress import Advance

from ..adapters import LogicalTensor
from ..plan import AuxiliaryValues, Parent
from ..recipe import Choice


class Importer:
    """An import method: what the pipeline asks of it around planning and writing."""

    method = ""
    #: True: ``copy`` streams a parent's bytes into the writer; False: ``encode`` returns them
    streams = False

    def resolve(self, tensor: LogicalTensor, choice: Choice) -> Choice:
        """The final choice for one parameter (e.g. a GGUF tensor's own block format)."""
        return choice

    def prepare(self, logical: Mapping[str, LogicalTensor], choices: Mapping[str, Choice]) -> None:
        """Check every parameter this method imports, before anything is written."""

    def stacking(self, members: Sequence[LogicalTensor], choice: Choice) -> int:
        """plan.Stacking: may these members share a parent, with how many divisors."""
        return 1

    def lossless(self, name: str) -> bool:
        """Whether the artifact keeps every source word of ``name`` (verify compares exactly)."""
        return True

    def encode(self, parent: Parent) -> tuple[bytes, np.ndarray]:
        """The parent's object bytes and the decoded source values it should reproduce."""
        raise NotImplementedError

    def copy(
        self, parent: Parent, write: Callable[[memoryview], None], advance: Advance
    ) -> list[bool]:
        """Stream the parent's object bytes through ``write`` (``advance`` gets each chunk's
        size); returns, per stacked member, whether a stored value is NaN or Inf (the decoded
        object reproduces the source words exactly, so that is its only error)."""
        raise NotImplementedError

    def auxiliaries(self, parent: Parent, use: dict[str, Any]) -> AuxiliaryValues:
        return {}
