"""Pieces every quantizer shares: input checks, row chunking and exact torch rounding kernels.

Results must be bit-identical on CPU and CUDA and equal to the numpy reference codecs in
``ninfer_format``. Two rules make that hold:

* Anything that derives a *scale* (absmax divided by qmax, rounding to binary16/BF16/E4M3FN,
  reciprocals) runs on the host through the numpy helpers of ``ninfer_format.numeric``: the
  scale arrays are small (one value per group or row), and CUDA's division is not always
  correctly rounded (PyTorch turns a division by a host scalar into a reciprocal multiply).
* What runs on the device is elementwise IEEE arithmetic (one correctly rounded ``*``, ``/``,
  ``+`` per kernel; no fused multiply-add, no library reductions whose order could differ),
  exact comparisons, exact integer bit manipulation, and table lookups.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from ..errors import RecipeError

#: Values per chunk, by device type. Chunks bound the temporaries (about 12 bytes a value for
#: the absmax encoders, 32 for the scale search), whatever the matrix size. On the CPU,
#: temporaries that stay in cache win (2^20 was 3x faster than 2^24 on 16 cores); on CUDA,
#: fewer and larger launches win, the search most (2^24 took 0.6 of the time of 2^22).
CHUNK_VALUES = {"cpu": 1 << 20, "cuda": 1 << 22}
SEARCH_CHUNK_VALUES = {"cpu": 1 << 20, "cuda": 1 << 24}

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --- inputs -----------------------------------------------------------------------------------


def check_tensor(values: object) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor, got {type(values).__name__}")
    return values


def check_float(values: torch.Tensor, what: str) -> None:
    if values.dtype not in FLOAT_DTYPES:
        raise RecipeError(
            f"{what} needs floating-point values (bf16, fp16, fp32 or fp64), got {values.dtype}"
        )


def rank2(values: torch.Tensor, what: str) -> tuple[int, int]:
    if values.dim() != 2 or values.shape[0] == 0 or values.shape[1] == 0:
        shape = list(values.shape)
        raise RecipeError(f"{what} needs a non-empty rank-2 [N, K] tensor, got shape {shape}")
    return int(values.shape[0]), int(values.shape[1])


def chunk_values(device: torch.device, search: bool = False) -> int:
    table = SEARCH_CHUNK_VALUES if search else CHUNK_VALUES
    return table.get(device.type, table["cpu"])


def row_chunks(rows: int, columns: int, chunk_values: int, multiple: int = 1) -> Iterator[slice]:
    """Row slices of about ``chunk_values`` values each (a multiple of ``multiple`` rows)."""
    step = max(multiple, chunk_values // max(columns, 1) // multiple * multiple)
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


class NonFinite(Exception):
    """A chunk holds NaN/Inf (found cheaply through its absmax, which propagates NaN)."""


def as_f32(chunk: torch.Tensor) -> torch.Tensor:
    """The chunk as a contiguous float32 tensor: exact for bf16/fp16, RNE for fp64 (values
    beyond float32 become Inf and are then refused like Inf). May be the caller's own tensor:
    never modify it in place."""
    return chunk.to(torch.float32).contiguous()


def check_amax(amax: np.ndarray) -> None:
    """Every encoder takes an absmax first; NaN and Inf propagate into it, so checking the
    small absmax array replaces a separate ``isfinite`` pass over the whole input."""
    if not np.all(np.isfinite(amax)):
        raise NonFinite


def raise_non_finite(chunk: torch.Tensor, first_row: int) -> None:
    """Raise a ``RecipeError`` naming the first NaN/Inf of ``chunk`` (rows from
    ``first_row``), or the first fp64 value beyond the float32 range."""
    finite = torch.isfinite(chunk.to(torch.float32))
    flat = int(torch.argmin(finite.reshape(-1).to(torch.uint8)))
    index = list(np.unravel_index(flat, tuple(finite.shape))) if finite.dim() else []
    if index:
        index[0] += first_row
    where = "[" + ", ".join(str(int(i)) for i in index) + "]"
    value = float(chunk.reshape(-1)[flat])
    if np.isfinite(value):
        raise RecipeError(f"value {value!r} at {where} is beyond the float32 range")
    raise RecipeError(f"non-finite value {value} at {where}")


def host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def device_tensor(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(like.device)


# --- exact rounding kernels (device side) -----------------------------------------------------


def bf16_round_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int32 bit pattern of the RNE-nearest bfloat16, low half zero (finite input).

    Integer arithmetic on the pattern, like ``numeric.f32_to_bf16``: exact, immune to
    flush-to-zero, and the same on every device. Signed int32 addition wraps exactly like the
    unsigned one for finite floats (no carry leaves the 32 bits).
    """
    bits = x.view(torch.int32)
    rounded = bits + (0x7FFF + ((bits >> 16) & 1))
    return rounded & -65536


def bf16_words(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 words as int16 (RNE; NaN keeps its high payload, as numpy does)."""
    words = (bf16_round_bits(x) >> 16) & 0xFFFF
    nan = torch.isnan(x)
    if bool(nan.any()):
        high = (x.view(torch.int32) >> 16) & 0xFFFF
        quiet = torch.where((high & 0x7F) == 0, high | 0x40, high)
        words = torch.where(nan, quiet, words)
    return ((words ^ 0x8000) - 0x8000).to(torch.int16)


def e4m3fn_bytes(y: torch.Tensor) -> torch.Tensor:
    """Finite float32 in [-448, 448] -> E4M3FN bytes (uint8): nearest value, ties to the even
    code word, sign from signbit; the rule of ``numeric.f32_to_e4m3fn``.

    PyTorch's own float8_e4m3fn conversion is exactly that rule in range (checked against the
    numpy reference for every float32 of magnitude <= 448 on CPU, and by the tests on CUDA),
    and it is one pass instead of a dozen bit operations. Out of range it would give NaN, so
    callers clamp first.
    """
    return y.to(torch.float8_e4m3fn).view(torch.uint8)


def pass_thresholds(levels: np.ndarray) -> np.ndarray:
    """float32 thresholds ``t`` such that "x passes midpoint i" is exactly ``x > t[i]``.

    A value above the midpoint between levels i and i+1 moves to i+1; on the midpoint it
    moves only if i+1 is even (ties to the even index). ``torch.bucketize(x, t)`` then counts
    passed thresholds, which is the nearest-level index. Mirrors ``numeric.nearest_level``.
    """
    grid = np.asarray(levels, dtype=np.float32).astype(np.float64)
    out = []
    for i in range(len(grid) - 1):
        midpoint = (grid[i] + grid[i + 1]) / 2  # exact in float64
        t = np.float32(midpoint)
        if float(t) > midpoint or (float(t) == midpoint and (i + 1) % 2 == 0):
            t = np.nextafter(t, np.float32(-np.inf))
        out.append(t)
    return np.array(out, dtype=np.float32)


_TABLES: dict[tuple[str, str], torch.Tensor] = {}


def table(name: str, build: np.ndarray | None, device: torch.device) -> torch.Tensor:
    """A small constant array cached on ``device`` (lookups are exact on every device)."""
    key = (name, str(device))
    cached = _TABLES.get(key)
    if cached is None:
        if build is None:
            raise KeyError(name)
        cached = torch.from_numpy(np.array(build, copy=True)).to(device)
        _TABLES[key] = cached
    return cached


def tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis (a power of two) as a fixed pairwise tree of elementwise adds.

    ``torch.sum`` reduces in a device- and thread-dependent order; this order is the same
    everywhere, so float64 errors compare identically on CPU and CUDA.
    """
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t[..., 0]


def tree_sum_rows(t: torch.Tensor) -> torch.Tensor:
    """Like ``tree_sum`` over the first axis: adds whole contiguous halves (lane-major data)."""
    while t.shape[0] > 1:
        half = t.shape[0] // 2
        t = t[:half] + t[half:]
    return t[0]
