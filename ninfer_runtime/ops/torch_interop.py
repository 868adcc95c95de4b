"""How a provider on a torch-based kernel library shares CuPy's arrays and stream: DLPack
views (no copies) and torch's current stream set to CuPy's, so the library's launches are
ordered with the engine's own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["on_cupy_stream", "view"]


def view(a: Any) -> Any:
    """A torch tensor on the same memory as the CuPy array ``a`` (made contiguous first)."""
    import cupy as cp
    import torch

    return torch.from_dlpack(cp.ascontiguousarray(a))


@contextlib.contextmanager
def on_cupy_stream() -> Iterator[None]:
    """Within the block torch launches on CuPy's current stream, without autograd."""
    import cupy as cp
    import torch

    stream = cp.cuda.get_current_stream()
    on_stream = (
        torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr))
        if stream.ptr
        else contextlib.nullcontext()  # both libraries' default: the legacy stream
    )
    with on_stream, torch.no_grad():
        yield
