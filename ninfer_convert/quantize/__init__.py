"""Quantizers: torch tensors (CPU or CUDA) -> complete encoded object bytes in a CORE layout.

``quantize(method, values, format)`` is the one entry point the pipeline uses; ``METHODS``
says which method encodes which formats. Every method gives the same bytes on CPU and CUDA,
and the absmax methods the same bytes as the numpy reference codecs of ``ninfer_format``
(which stay the oracle). The output is ready for the artifact writer: ``contiguous_le_v1``
for direct formats, ``row_split_k128_v1`` for q4/q5/q6/q8/nf4, ``block_scale_k16_m128x4_v1``
for nvfp4, ``row_scale_v1`` for fp8_e4m3fn_row_bf16.

Method parameters (``**params``) are checked by name: ``cast`` takes ``allow_non_finite``;
the others take none. Failures a recipe can cause (wrong format, shape, non-finite values,
scale overflow) are ``RecipeError``s whose message the caller prefixes with the parameter name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import RecipeError
from . import _common, cast, fp8_row, grouped, mse, nvfp4

__all__ = ["METHODS", "Method", "quantize"]

#: encodes ``values`` as ``format``; gets ``divisors`` only if the method takes it
Encoder = Callable[..., bytes]


@dataclass(frozen=True)
class Method:
    name: str
    formats: tuple[str, ...]
    function: Encoder
    description: str
    params: tuple[str, ...] = ()
    takes_divisors: bool = False


def _mse(values: torch.Tensor, format: str, divisors: int = 1) -> bytes:
    if format == nvfp4.FORMAT:
        return mse.stored_scale_mse_nvfp4(values, divisors)
    if divisors != 1:
        raise RecipeError(f"format {format!r} takes no divisors (only nvfp4 does)")
    return mse.stored_scale_mse_grouped(values, format)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "cast",
            cast.CAST_FORMATS,
            cast.cast,
            "direct copy/rounding (RNE) to bf16, fp32 or checked int32",
            params=("allow_non_finite",),
        ),
        Method(
            "grouped_absmax",
            grouped.ROW_SPLIT_FORMATS,
            grouped.grouped_absmax,
            "spec 3.2 reference: f16(f32(amax/qmax)) scale, reciprocal-multiply RNE codes",
        ),
        Method(
            "stored_scale_mse",
            (*grouped.ROW_SPLIT_FORMATS, nvfp4.FORMAT),
            _mse,
            "search of stored scale words for least squared error, never worse than absmax",
            takes_divisors=True,
        ),
        Method(
            "fp8_row_maxabs",
            (fp8_row.FORMAT,),
            fp8_row.fp8_row_maxabs,
            "spec 3.4 reference: BF16 row scale amax/448, E4M3FN RNE codes",
        ),
        Method(
            "nvfp4_absmax",
            (nvfp4.FORMAT,),
            nvfp4.nvfp4_absmax,
            "notes 2.5: d_w = 2688/amax per matrix, E4M3FN block scales, E2M1 codes",
            takes_divisors=True,
        ),
    )
}


def quantize(
    method: str, values: torch.Tensor, format: str, *, divisors: int = 1, **params: object
) -> bytes:
    """Encode ``values`` (bf16/fp16/fp32, fp64 or integers for ``cast``) with ``method`` into
    ``format``'s CORE layout; the work runs on ``values.device``.

    ``divisors`` > 1 (nvfp4 only) stacks that many independently scaled matrices along N.
    """
    chosen = METHODS.get(method)
    if chosen is None:
        raise RecipeError(f"unknown quantization method {method!r} (known: {sorted(METHODS)})")
    if format not in chosen.formats:
        raise RecipeError(
            f"method {method!r} cannot encode format {format!r} "
            f"(supported: {', '.join(chosen.formats)})"
        )
    unknown = sorted(set(params) - set(chosen.params))
    if unknown:
        takes = ", ".join(chosen.params) or "none"
        raise RecipeError(
            f"method {method!r} takes no parameter {', '.join(map(repr, unknown))} "
            f"(it takes: {takes})"
        )
    if isinstance(divisors, bool) or not isinstance(divisors, int) or divisors < 1:
        raise RecipeError(f"divisors must be an integer >= 1, got {divisors!r}")
    values = _common.check_tensor(values)
    if not chosen.takes_divisors and divisors != 1:
        raise RecipeError(
            f"method {method!r} with format {format!r} takes no divisors (only nvfp4 does), "
            f"got divisors={divisors}"
        )
    extra = {"divisors": divisors} if chosen.takes_divisors else {}
    with torch.no_grad():
        return chosen.function(values, format, **extra, **params)
