"""``gguf_import`` (notes 4): ggml blocks copied from a GGUF file into ``gguf_*`` objects, the
rows the GGUF adapter selects, streamed at disk speed (``block_copy``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ninfer_format.codecs.gguf_blocks import GGML_TYPE_TO_FORMAT
from ninfer_format.progress import Advance

from ..adapters import LogicalTensor
from ..adapters.qwen3_5_gguf import GgufTensor, untile_columns
from ..block_copy import BlockCopier
from ..errors import RecipeError
from ..plan import AuxiliaryValues, Parent
from ..recipe import GGUF_NATIVE, Choice
from ..sources import GgufSource
from .importer import Importer

_PLAIN_FLOAT_GGML = {"F32", "F16", "BF16", "F64"}
#: ggml types with no ``gguf_*`` format in the artifact registry (spec 6) that gguf-py
#: dequantizes: their values are stored as bf16 (MXFP4's E2M1 codes times power-of-two scales
#: exactly; Q4_1's and Q5_1's d q + m rounded once, the report shows the error)
_DEQUANTIZED_GGML = {"Q4_1", "Q5_1", "MXFP4"}


class GgufImport(Importer):
    """``gguf_import``: ggml blocks copied verbatim, rows selected by the GGUF adapter."""

    method = "gguf_import"
    streams = True

    def __init__(self, sources: Mapping[str, Any]) -> None:
        self.sources = sources
        self._copier = BlockCopier()

    def _source(self, choice: Choice) -> GgufSource:
        source = self.sources[choice.source]
        if not isinstance(source, GgufSource):
            raise RecipeError(
                f"{source.id}: gguf_import reads a .gguf file (--source {choice.source}=FILE.gguf)"
            )
        return source

    def resolve(self, tensor: LogicalTensor, choice: Choice) -> Choice:
        """The source tensor's own ``gguf_*`` format; plain float tensors, and those of the
        types the registry has no format for, are cast to bf16."""
        if choice.method != self.method:
            return choice
        source = self._source(choice)
        names = {p.tensor for p in tensor.pieces}
        if len(names) != 1 or not isinstance(tensor, GgufTensor) or tensor.transform:
            raise RecipeError(
                f"{tensor.name}: its values are transformed from GGUF; it cannot keep blocks"
            )
        name = names.pop()
        type_name = source.dtype(name)
        fmt = GGML_TYPE_TO_FORMAT.get(source.ggml_type(name))
        if type_name in _PLAIN_FLOAT_GGML or (fmt is None and type_name in _DEQUANTIZED_GGML):
            return Choice("bf16", "cast", "A16Only", choice.source, ())
        if fmt is None:
            raise RecipeError(
                f"{source.id}: {name} is {type_name}, which has no gguf_* format in the artifact "
                "registry"
            )
        if choice.format not in (GGUF_NATIVE, fmt):
            raise RecipeError(
                f"{source.id}: {name} is {type_name} ({fmt}), the recipe asks for {choice.format}"
            )
        return replace(choice, format=fmt)

    def copy(
        self, parent: Parent, write: Callable[[memoryview], None], advance: Advance
    ) -> list[bool]:
        """The selected rows' blocks, verbatim; flags members with a NaN or Inf block scale."""
        return self._copier.copy(self._source(parent.choice), parent, write, advance)

    def auxiliaries(self, parent: Parent, use: dict[str, Any]) -> AuxiliaryValues:
        """``input_columns`` for a weight whose input columns stay in llama.cpp's tiled order."""
        member = next(m for m in parent.members if m.name == use["parameter"])
        if not isinstance(member, GgufTensor) or member.tiled_columns is None:
            return {}
        columns = np.asarray(untile_columns(*member.tiled_columns), dtype="<i4")
        return {"input_columns": ("int32", (columns.size,), columns.tobytes())}
