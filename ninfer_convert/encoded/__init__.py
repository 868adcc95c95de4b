"""Encoded imports: weights copied from an already quantized source instead of re-quantized.

Two methods, both chosen per parameter by the recipe:

``import_encoded`` (notes 2.6) keeps a pre-quantized safetensors checkpoint's words exactly:
NVFP4 codes, E4M3FN block scales and FP32 weight divisors, or FP8 E4M3FN codes and their BF16
row scales. Fields are detected per tensor from the names next to the unquantized ``P.weight``
(compressed-tensors ``weight_packed``/``weight_global_scale``/``input_global_scale``; ModelOpt
``weight`` U8/``weight_scale_2``/``input_scale``; FP8 ``weight`` F8_E4M3 + ``weight_scale``).
The adapter's row selection (query/gate interleave, ``in_proj_qkv`` split, fused experts) is
applied to code rows and scale rows together, so nothing is decoded on the way.

``gguf_import`` (notes 4) copies ggml blocks from a GGUF file into ``gguf_*`` objects (layout
``gguf_blocks_v1``), the rows the GGUF adapter selects, streamed at disk speed
(``block_copy``).

Everything that can be checked without reading codes (field names, dtypes, shapes, divisor and
activation-divisor words, packing compatibility, auxiliaries) is checked when the importer is
prepared, before the artifact writer opens; scale words are checked as each parent is read.
Every error names the source tensor at fault.

Modules: ``importer`` (the protocol the pipeline calls), ``import_encoded`` with its
``import_checks``, ``gguf_import``, ``fields`` (where a safetensors matrix's encoded fields are,
read as stored words) and ``decoded_view`` (those words decoded to float32). ``importers`` here
is the registry of import methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..recipe import Recipe
from .decoded_view import DecodedView, decode_fp8, decode_nvfp4, values_view
from .fields import FP8, NVFP4, Fields, detect_fields, weight_names
from .gguf_import import GgufImport
from .import_encoded import EncodedImport
from .importer import Importer

__all__ = [
    "FP8",
    "NVFP4",
    "DecodedView",
    "EncodedImport",
    "Fields",
    "GgufImport",
    "Importer",
    "decode_fp8",
    "decode_nvfp4",
    "detect_fields",
    "importers",
    "values_view",
    "weight_names",
]


def importers(sources: Mapping[str, Any], recipe: Recipe) -> dict[str, Importer]:
    """The import methods by name; any other method quantizes float values."""
    return {
        EncodedImport.method: EncodedImport(sources, recipe),
        GgufImport.method: GgufImport(sources),
    }
