"""``import_encoded`` (notes 2.6): a pre-quantized safetensors checkpoint's NVFP4 or FP8 words
kept exactly, the adapter's row selection applied to code rows and scale rows together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_format.codecs.fp8_row import pack_fp8_row
from ninfer_format.codecs.nvfp4 import TILE_ROWS, pack_nvfp4
from ninfer_format.numeric import bf16_to_f32, f32_to_bf16

from ..adapters import LogicalTensor
from ..errors import RecipeError
from ..plan import AuxiliaryValues, Parent
from ..recipe import Choice, Recipe
from ..sources import GgufSource
from .decoded_view import decode_fp8, decode_nvfp4
from .fields import (
    FP8,
    NVFP4,
    Fields,
    detect_fields,
    divisor_values,
    row_scale_values,
    stored_words,
)
from .import_checks import (
    check_fp8_words,
    check_header,
    check_nvfp4_scales,
    check_rows,
    expert_index,
)
from .importer import Importer


@dataclass
class _Member:
    """One member's rows after the adapter's selection: words and the values they mean."""

    codes: np.ndarray  # NVFP4: packed bytes [rows, K/2]; FP8: bytes [rows, K]
    scales: np.ndarray  # NVFP4: E4M3 bytes [rows, K/16]; FP8: float32 source scales [rows]
    divisor: np.float32 | None  # NVFP4 weight divisor


@dataclass(frozen=True)
class _Prepared:
    fields: dict[str, Fields]  # source tensor -> fields
    divisor: np.float32 | None  # NVFP4 weight divisor (bit-identical over the pieces)
    activation: np.float32 | None  # smallest input divisor over the pieces, if all have one
    missing_activation: str | None  # a source tensor with no input divisor
    lossless: bool = True  # False: F32 FP8 row scales rounded to BF16


class EncodedImport(Importer):
    """``import_encoded`` from safetensors sources (notes 2.6)."""

    method = "import_encoded"

    def __init__(self, sources: Mapping[str, Any], recipe: Recipe) -> None:
        self.sources = sources
        self.recipe = recipe
        self._names: dict[str, set[str]] = {}
        self._prepared: dict[str, _Prepared] = {}
        self._choices: dict[str, Choice] = {}

    def _source(self, choice: Choice) -> Any:
        source = self.sources[choice.source]
        if isinstance(source, GgufSource):
            raise RecipeError(
                f"{source.id}: import_encoded reads safetensors checkpoints; "
                "use method gguf_import for a GGUF file"
            )
        if choice.source not in self._names:
            self._names[choice.source] = set(source.keys())
        return source

    def _fields(self, tensor: LogicalTensor, choice: Choice) -> dict[str, Fields]:
        source = self._source(choice)
        names = self._names[choice.source]
        if tensor.transpose:
            raise RecipeError(f"{tensor.name}: a transposed parameter cannot be imported encoded")
        out = {}
        for piece in tensor.pieces:
            if piece.tensor in out:
                continue
            fields = detect_fields(source, names, piece.tensor)
            if fields is None:
                raise RecipeError(
                    f"{source.id}: {piece.tensor} (for {tensor.name}) is not an NVFP4 or FP8 "
                    "encoded tensor; import_encoded needs one"
                )
            if fields.format != choice.format:
                raise RecipeError(
                    f"{source.id}: {piece.tensor} (for {tensor.name}) is {fields.format}, "
                    f"but the recipe imports it as {choice.format}"
                )
            out[piece.tensor] = fields
        return out

    def resolve(self, tensor: LogicalTensor, choice: Choice) -> Choice:
        self._fields(tensor, choice)  # the format check, early
        return choice

    def prepare(self, logical: Mapping[str, LogicalTensor], choices: Mapping[str, Choice]) -> None:
        for name, tensor in logical.items():
            if choices[name].method == self.method:
                self._choices[name] = choices[name]
                self._prepared[name] = self._prepare(tensor, choices[name])

    def _prepare(self, tensor: LogicalTensor, choice: Choice) -> _Prepared:
        source = self._source(choice)
        fields = self._fields(tensor, choice)
        for f in fields.values():
            check_header(source, f, tensor)
        check_rows(source, fields, tensor)
        if choice.format == FP8:
            lossless = all(source.dtype(f.scales) == "BF16" for f in fields.values())
            return _Prepared(fields, None, None, None, lossless)
        divisors, activations, missing = set(), [], None
        for piece in tensor.pieces:
            f = fields[piece.tensor]
            index = expert_index(source, f, piece)
            words = divisor_values(source, f.divisor, f.reciprocal, "a weight divisor")  # type: ignore[arg-type]
            divisors.add(words[min(index, words.size - 1)].tobytes())
            if f.activation is None:
                missing = missing or f.weight
            else:
                act = divisor_values(source, f.activation, f.reciprocal, "an activation divisor")
                activations.append(act[min(index, act.size - 1)])
        if len(divisors) > 1:
            raise RecipeError(
                f"{source.id}: the pieces of {tensor.name} have different weight divisors; "
                "one parameter needs one divisor"
            )
        divisor = np.frombuffer(divisors.pop(), np.float32)[0]
        activation = None if missing else np.float32(min(activations))
        return _Prepared(fields, divisor, activation, missing)

    def lossless(self, name: str) -> bool:
        """Whether the artifact keeps every source word of ``name`` (verify compares exactly)."""
        return self._prepared[name].lossless

    def stacking(self, members: Sequence[LogicalTensor], choice: Choice) -> int:
        """Bit-identical divisors share one; a stack_divisors group keeps one per member."""
        if choice.method != self.method or choice.format != NVFP4:
            return 1
        stacked = _unique(members)
        words = {self._prepared[m.name].divisor.tobytes() for m in stacked}  # type: ignore[union-attr]
        rows = {m.shape[0] for m in stacked}
        if (
            all(self.recipe.stacks_divisors(m.name) for m in stacked)
            and len(rows) == 1
            and rows.pop() % TILE_ROWS == 0
        ):
            return len(stacked)
        return 1 if len(words) == 1 else 0

    def encode(self, parent: Parent) -> tuple[bytes, np.ndarray]:
        source = self._source(parent.choice)
        members = [self._member(source, m) for m in parent.stacked]
        codes = np.concatenate([m.codes for m in members])
        if parent.choice.format == FP8:
            words = _bf16_scale_words(source, parent, np.concatenate([m.scales for m in members]))
            reference = np.concatenate([decode_fp8(m.codes, m.scales) for m in members])
            return pack_fp8_row(codes, words), reference
        scales = np.concatenate([m.scales for m in members])
        divisors = np.array([m.divisor for m in members], dtype=np.float32)
        if parent.divisors is None:
            divisors = divisors[:1]  # planning made sure they are bit-identical
        nibbles = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(codes.shape[0], -1)
        reference = np.concatenate([decode_nvfp4(m.codes, m.scales, m.divisor) for m in members])
        return pack_nvfp4(nibbles, scales, divisors), reference

    def _member(self, source: Any, tensor: LogicalTensor) -> _Member:
        prepared = self._prepared[tensor.name]
        codes, scales = [], []
        loaded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for piece in tensor.pieces:
            f = prepared.fields[piece.tensor]
            if piece.tensor not in loaded:
                loaded[piece.tensor] = self._load_checked(source, f)
            c, s = loaded[piece.tensor]
            rows = slice(*piece.rows) if piece.rows is not None else slice(None)
            codes.append(c[rows])
            scales.append(s[rows])
        return _Member(np.concatenate(codes), np.concatenate(scales), prepared.divisor)

    def _load_checked(self, source: Any, f: Fields) -> tuple[np.ndarray, np.ndarray]:
        """2-D codes and scales (FP8: float32 row scale values) after the word checks."""
        codes = stored_words(source, f.codes)
        codes = codes.reshape(-1, codes.shape[-1])
        if f.format == FP8:
            scales = row_scale_values(source, f, codes.shape[0])
            check_fp8_words(source, f, codes, scales)
            return codes, scales
        scales = stored_words(source, f.scales)
        scales = scales.reshape(-1, scales.shape[-1])
        check_nvfp4_scales(source, f.scales, scales)
        return codes, scales

    def auxiliaries(self, parent: Parent, use: dict[str, Any]) -> AuxiliaryValues:
        """AllowA4 uses of NVFP4 imports: the source's activation divisor (a parent of several
        sources: the smallest, so no member's activations overflow the shared scale)."""
        if parent.choice.format != NVFP4 or use.get("activation_policy") != "AllowA4":
            return {}
        prepared = [self._prepared[m.name] for m in parent.stacked]
        for p, m in zip(prepared, parent.stacked, strict=True):
            if p.activation is None:
                raise RecipeError(
                    f"{self.sources[parent.choice.source].id}: {p.missing_activation} (for "
                    f"{m.name}) has no input_scale / input_global_scale: supply an activation "
                    "divisor for AllowA4 (or import with policy AllowA8)"
                )
        value = np.float32(min(p.activation for p in prepared))  # type: ignore[type-var]
        return {"activation_input_divisor": ("fp32", (), value.astype("<f4").tobytes())}


def _unique(members: Sequence[LogicalTensor]) -> list[LogicalTensor]:
    out, seen = [], set()
    for m in members:
        if m.identity not in seen:
            seen.add(m.identity)
            out.append(m)
    return out


def _bf16_scale_words(source: Any, parent: Parent, scales: np.ndarray) -> np.ndarray:
    """Row scales as BF16 words: exact for BF16 sources, RNE-rounded for F32 ones (a
    per-tensor ModelOpt scale; not bit-exact, the report shows the difference)."""
    words = f32_to_bf16(scales.astype(np.float32))
    lost = ((words == 0) & (scales > 0)) | ~np.isfinite(bf16_to_f32(words))
    if lost.any():
        names = ", ".join(m.name for m in parent.members)
        raise RecipeError(
            f"{source.id}: the FP8 row scales of {names} do not fit BF16 (underflow/overflow)"
        )
    return words
