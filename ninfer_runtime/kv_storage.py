"""How keys and values are stored in page memory (``kv_dtype``): the storage dtype of each
name and the encoders and decoders between it and float32, for any array module.

``auto`` (the engine's and the command lines' default) is each backend's own choice
(``resolve_kv_dtype``). One place for the rules the CPU reference, the pool's writes and the
GPU ``kv_write`` kernel share bit for bit; any paged memory kind storing values ``kv_dtype``
reads them here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_format.numeric import E4M3FN_MAX, E4M3FN_VALUES

from .arrays import array_module
from .errors import EngineError

Array = Any

#: how K/V may be stored: name -> the pools' dtype (bfloat16 as uint16 words, fp8_e4m3 as
#: unscaled E4M3FN bytes); the one place that maps a ``kv_dtype`` to its storage
KV_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(np.uint16),
    "fp8_e4m3": np.dtype(np.uint8),
}


#: the setting that leaves the choice to the backend (its class attribute ``kv_dtype``)
AUTO = "auto"
#: what a ``kv_dtype`` setting may say
KV_SETTINGS = (AUTO, *KV_DTYPES)


def resolve_kv_dtype(kv_dtype: str, backend: str | Any) -> str:
    """``kv_dtype``, or for ``auto`` the backend's own (a name or an instance; its class
    attribute ``kv_dtype``: the CPU reference float32, CUDA bfloat16, the precision production
    engines store; a backend that states none stores float32). An unknown name is refused in
    one line."""
    if kv_dtype == AUTO:
        from .backends import backend_class

        return getattr(backend_class(backend), "kv_dtype", "float32")
    if kv_dtype not in KV_DTYPES:
        raise EngineError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_SETTINGS)}")
    return kv_dtype


def kv_storage_dtype(kv_dtype: str) -> np.dtype:
    """The pool dtype that holds K/V stored as ``kv_dtype``; a clear error for an unknown one."""
    if kv_dtype not in KV_DTYPES:
        raise EngineError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
    return KV_DTYPES[kv_dtype]


def kv_value_bytes(kv_dtype: str) -> int:
    """Bytes per stored key/value element."""
    return kv_storage_dtype(kv_dtype).itemsize


def to_bf16_words(x: Array) -> Array:
    """float32 -> bfloat16 words (uint16), round to nearest even; a NaN stays a NaN (the same
    rule as ``ninfer_format.numeric.f32_to_bf16`` and the GPU ``kv_write`` kernel)."""
    xp = array_module(x)
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    high = bits >> 16
    rounded = (bits + 0x7FFF + (high & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    nan_word = xp.where((high & 0x7F) == 0, high | 0x40, high)
    return xp.where(nan, nan_word, rounded).astype(xp.uint16)


def from_bf16_words(words: Array) -> Array:
    """bfloat16 words (uint16) -> float32, exactly."""
    xp = array_module(words)
    return (words.astype(xp.uint32) << 16).view(xp.float32)


def to_e4m3_bytes(x: Array) -> Array:
    """float32 -> E4M3FN bytes (uint8), unscaled: round to nearest even, magnitudes beyond 448
    (infinities too) saturate to +-448, a NaN becomes the NaN byte with its sign.

    The rule of ``ninfer_format.numeric.f32_to_e4m3fn`` and of the GPU ``kv_write`` kernel,
    written for any array module (that one takes numpy only, and prefill writes device arrays
    into the pool): normal codes round the float32 pattern to 3 fraction bits, codes below
    2^-6 are ``rint(|x| * 512)``.
    """
    xp = array_module(x)
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    nan = xp.isnan(x)
    magnitude = xp.where(nan, xp.float32(0), xp.minimum(xp.abs(x), xp.float32(E4M3FN_MAX)))
    bits = magnitude.view(xp.uint32)
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20
    normal = rounded.astype(xp.int32) - ((127 - 7) << 3)
    subnormal = xp.rint(magnitude * xp.float32(512)).astype(xp.int32)
    code = xp.where(magnitude >= xp.float32(2.0**-6), normal, subnormal)
    code = xp.where(nan, 0x7F, code).astype(xp.uint8)
    return code | (xp.signbit(x).astype(xp.uint8) << 7)


def from_e4m3_bytes(codes: Array) -> Array:
    """E4M3FN bytes (uint8) -> float32, exactly (both NaN bytes give the same NaN)."""
    xp = array_module(codes)
    return xp.take(xp.asarray(E4M3FN_VALUES), codes)


_ENCODERS = {np.dtype(np.uint16): to_bf16_words, np.dtype(np.uint8): to_e4m3_bytes}
_DECODERS = {np.dtype(np.uint16): from_bf16_words, np.dtype(np.uint8): from_e4m3_bytes}


def store_kv(values: Array, dtype: Any) -> Array:
    """float32 keys/values in the pool's storage dtype."""
    encode = _ENCODERS.get(np.dtype(dtype))
    return values if encode is None else encode(values)


def load_kv(stored: Array) -> Array:
    """Keys/values from the pool as float32."""
    decode = _DECODERS.get(np.dtype(stored.dtype))
    return stored if decode is None else decode(stored)


def gather_kv(stored: Array, pages: Array, length: int) -> Array:
    """Tokens ``0 .. length - 1`` of a sequence from one pool array ``[pages, PAGE, Nkv, D]``
    as float32 ``[length, Nkv, D]``: token t is row ``t % PAGE`` of page ``pages[t // PAGE]``
    (``pages``: the sequence's page ids in order, an int array on the pool's device; or
    [N, pages], N sequences' rows of the page table: then [N, length, Nkv, D])."""
    xp = array_module(stored)
    positions = xp.arange(length)
    per_page = stored.shape[1]
    return load_kv(stored[pages[..., positions // per_page], positions % per_page])


def gather_kv_at(stored: Array, pages: Array, tokens: Array) -> Array:
    """Row i's tokens ``tokens[i]`` [T, J] from one pool array ``[pages, PAGE, ...]`` as
    float32 [T, J, ...]: of one sequence (``pages`` its page ids) or each of its own
    (``pages`` [T, pages], T sequences' rows of the page table)."""
    per_page = stored.shape[1]
    which = tokens // per_page
    if pages.ndim == 2:
        pages = pages[array_module(stored).arange(tokens.shape[0])[:, None], which]
    else:
        pages = pages[which]
    return load_kv(stored[pages, tokens % per_page])
