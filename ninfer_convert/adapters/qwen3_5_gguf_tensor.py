"""A Qwen3.5 logical parameter read from GGUF tensors, with llama.cpp's changes undone on load.

Row selection (the pieces) moves the same rows for a block-copying import and a float load;
what only a float load can undo is here: RMSNorm weights stored as ``1 + w`` (``MINUS_ONE``),
``ssm_a = -exp(A_log)`` (``A_LOG``), and ``ssm_out``'s tiled input columns, which a
block-copied tensor keeps (its Use gets the ``input_columns`` auxiliary instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SourceError
from .base import Loader, LogicalTensor

MINUS_ONE, A_LOG = "minus_one", "a_log"


@dataclass(frozen=True)
class GgufTensor(LogicalTensor):
    """A logical parameter read from GGUF tensors, with llama.cpp's changes undone on load."""

    transform: str = ""  # "", MINUS_ONE or A_LOG
    #: (key heads, value heads per key head, head width) when the input columns are tiled
    tiled_columns: tuple[int, int, int] | None = None

    def load(self, source: Loader) -> torch.Tensor:
        """Float32 values in the logical shape and order (columns untiled too)."""
        loaded: dict[str, torch.Tensor] = {}
        chunks = []
        for piece in self.pieces:
            if piece.tensor not in loaded:
                x = source.load(piece.tensor).to(torch.float32)
                loaded[piece.tensor] = (
                    x.reshape(-1, 1) if x.dim() == 1 else x.reshape(-1, x.shape[-1])
                )
            x = loaded[piece.tensor]
            chunks.append(x if piece.rows is None else x[piece.rows[0] : piece.rows[1]])
        x = torch.cat(chunks)
        if self.transpose:
            x = x.reshape(self.shape[1], self.shape[0]).t()
        x = self._transform(x.contiguous())
        if self.tiled_columns is not None:
            index = torch.tensor(untile_columns(*self.tiled_columns))
            x = torch.empty_like(x).index_copy_(1, index, x)
        return x.reshape(self.shape)

    def _transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.transform == MINUS_ONE:
            return x - 1
        if self.transform == A_LOG:
            if not bool((x < 0).all()):
                raise SourceError(
                    f"{self.pieces[0].tensor}: ssm_a must be negative everywhere "
                    f"(it is -exp(A_log)), for {self.name}"
                )
            return torch.log(-x)
        return x


def untile_columns(key_heads: int, ratio: int, width: int) -> list[int]:
    """``input_columns``: stored column ``c`` (tiled head ``t = c // width``) reads grouped
    input element ``((t % nk) * ratio + t // nk) * width + c % width`` (notes 4.3)."""
    return [
        ((c // width % key_heads) * ratio + c // width // key_heads) * width + c % width
        for c in range(key_heads * ratio * width)
    ]
