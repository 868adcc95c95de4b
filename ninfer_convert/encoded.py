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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ninfer_format.codecs.fp8_row import pack_fp8_row
from ninfer_format.codecs.gguf_blocks import GGML_TYPE_TO_FORMAT
from ninfer_format.codecs.nvfp4 import TILE_ROWS, pack_nvfp4
from ninfer_format.numeric import E2M1_VALUES, E4M3FN_VALUES, bf16_to_f32, f32_to_bf16
from ninfer_format.progress import Advance

from .adapters import LogicalTensor, SourcePiece
from .adapters.qwen3_5_gguf import GgufTensor, untile_columns
from .block_copy import BlockCopier
from .block_fp8 import block_size, decode_block_fp8
from .errors import RecipeError
from .plan import AuxiliaryValues, Parent
from .recipe import GGUF_NATIVE, Choice, Recipe
from .sources import GgufSource

NVFP4 = "nvfp4"
FP8 = "fp8_e4m3fn_row_bf16"
NVFP4_BLOCK = 16
_PACKED, _SCALE, _GLOBAL, _SCALE_2, _SCALE_INV = (
    "_packed",
    "_scale",
    "_global_scale",
    "_scale_2",
    "_scale_inv",
)
_PLAIN_FLOAT_GGML = {"F32", "F16", "BF16", "F64"}
#: ggml types with no ``gguf_*`` format in the artifact registry (spec 6) that gguf-py
#: dequantizes: their values are stored as bf16 (MXFP4's E2M1 codes times power-of-two scales
#: exactly; Q4_1's and Q5_1's d q + m rounded once, the report shows the error)
_DEQUANTIZED_GGML = {"Q4_1", "Q5_1", "MXFP4"}


# --- field detection ------------------------------------------------------------------------


def _input_name(weight: str, suffix: str) -> str:
    """``P.weight`` -> ``P.input_scale``; fused ``X.up_proj`` -> ``X.up_proj_input_scale``."""
    if weight.endswith(".weight"):
        return f"{weight[: -len('.weight')]}.{suffix}"
    return f"{weight}_{suffix}"


@dataclass(frozen=True)
class Fields:
    """Where one encoded matrix lives in a safetensors source (notes 2.6 field table)."""

    kind: str  # "nvfp4-ct", "nvfp4-modelopt", "fp8-row", "fp8-tensor", "fp8-block"
    weight: str  # the unquantized name the adapter uses (``P.weight``)
    codes: str
    scales: str
    divisor: str | None = None  # NVFP4 weight divisor (as is, or the reciprocal: ModelOpt)
    activation: str | None = None  # input divisor (as is, or the reciprocal: ModelOpt)

    @property
    def format(self) -> str:
        return NVFP4 if self.kind.startswith("nvfp4") else FP8

    @property
    def reciprocal(self) -> bool:
        """ModelOpt stores multipliers (``weight_scale_2``, ``input_scale``): divisor = 1/x."""
        return self.kind == "nvfp4-modelopt"


def detect_fields(
    source: Any, names: set[str], weight: str, *, decoding: bool = False
) -> Fields | None:
    """The encoding of ``weight`` in ``source`` (detection order of notes 2.6), None if plain.
    Block FP8 is only found when ``decoding`` (its words cannot be imported)."""
    if weight + _SCALE_INV in names and decoding:
        return Fields("fp8-block", weight, weight, weight + _SCALE_INV)
    if weight + _SCALE_INV in names:
        raise RecipeError(
            f"{source.id}: {weight} is block-FP8 ({weight + _SCALE_INV}); its words cannot be "
            "imported (decode it and re-quantize instead)"
        )
    if weight + _PACKED in names:
        return Fields(
            "nvfp4-ct",
            weight,
            weight + _PACKED,
            weight + _SCALE,
            weight + _GLOBAL,
            _present(names, _input_name(weight, "input_global_scale")),
        )
    if weight not in names:
        return None
    dtype = source.dtype(weight)
    if dtype == "U8":
        return Fields(
            "nvfp4-modelopt",
            weight,
            weight,
            weight + _SCALE,
            weight + _SCALE_2,
            _present(names, _input_name(weight, "input_scale")),
        )
    if dtype == "F8_E4M3":
        scale = weight + _SCALE
        per_tensor = scale in names and np.prod(source.shape(scale), dtype=np.int64) == 1
        return Fields("fp8-tensor" if per_tensor else "fp8-row", weight, weight, scale)
    return None


def _present(names: set[str], name: str) -> str | None:
    return name if name in names else None


def weight_names(source: Any) -> set[str]:
    """The source's tensor names plus ``P.weight`` for every compressed-tensors
    ``P.weight_packed``: the names an adapter for unquantized checkpoints looks for."""
    names = set(source.keys())
    return names | {n[: -len(_PACKED)] for n in names if n.endswith(_PACKED)}


# --- raw words --------------------------------------------------------------------------------


def _words(source: Any, name: str) -> np.ndarray:
    """A tensor's stored words as unsigned integers (bytes for U8/F8, u16 for BF16)."""
    t = source.load(name)
    if t.dtype in (torch.float8_e4m3fn, torch.uint8, torch.int8):
        return t.view(torch.uint8).numpy()
    if t.dtype in (torch.bfloat16, torch.float16, torch.int16):
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float32, torch.int32):
        return t.view(torch.int32).numpy().view(np.uint32)
    raise RecipeError(f"{source.id}: {name} has dtype {t.dtype}, not an encoded field")


def _require(source: Any, name: str | None, dtypes: tuple[str, ...], what: str) -> str:
    if name is None or name not in source:
        raise RecipeError(f"{source.id}: {what} {name} is missing")
    dtype = source.dtype(name)
    if dtype not in dtypes:
        raise RecipeError(
            f"{source.id}: {name} ({what}) is {dtype}, expected {' or '.join(dtypes)}"
        )
    return name


def _scalars(source: Any, name: str, reciprocal: bool, what: str) -> np.ndarray:
    """A divisor field as float32 values (``f32(1/x)`` for ModelOpt multipliers), checked
    finite and > 0; one value, or one per expert of a fused bank."""
    values = source.load(name).to(torch.float32).reshape(-1).numpy().astype(np.float32)
    if reciprocal:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            values = np.float32(1) / values
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        raise RecipeError(
            f"{source.id}: {name} gives {what} {values[bad][0]!r}; it must be finite and > 0"
        )
    return values


# --- decoding (the report's and verify's reference) -------------------------------------------


def decode_nvfp4(packed: np.ndarray, scales: np.ndarray, divisor: np.ndarray) -> np.ndarray:
    """``e2m1(c) * e4m3(s) / d`` in float32, as the nvfp4 codec computes it.

    ``packed`` is ``[..., rows, K/2]`` bytes (low nibble first), ``scales`` ``[..., rows, K/16]``,
    ``divisor`` broadcasts against ``[..., rows, 1]``.
    """
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    blocks = codes.reshape(*codes.shape[:-1], -1, NVFP4_BLOCK)
    with np.errstate(all="ignore"):
        values = E2M1_VALUES[blocks] * E4M3FN_VALUES[scales][..., None]
        values = values / np.asarray(divisor, dtype=np.float32)[..., None, None]
    return values.reshape(codes.shape).astype(np.float32)


def decode_fp8(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``e4m3(c) * s`` in float32 with the source's own row scale (F32 or BF16 values)."""
    with np.errstate(all="ignore"):
        return E4M3FN_VALUES[codes] * np.asarray(scale, dtype=np.float32)[..., None]


def _row_scale_values(source: Any, fields: Fields, rows: int) -> np.ndarray:
    """FP8 row scales as float32 values ``[rows]`` (a per-tensor scalar repeated)."""
    values = source.load(fields.scales).to(torch.float32).reshape(-1).numpy()
    return np.full(rows, values[0], np.float32) if values.size == 1 else values


class DecodedView:
    """A safetensors source seen as float tensors under unquantized names (``P.weight``).

    Encoded matrices decode to float32 exactly as the artifact codec would decode the same
    words; plain tensors pass through. Used to cast from a quantized checkpoint, for the
    conversion report's error of imported parameters, and by ``verify``.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.id = source.id
        self._names = set(source.keys())
        self._keys = weight_names(source)
        self._cache: tuple[str, torch.Tensor] | None = None

    def keys(self) -> list[str]:
        return sorted(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def fields(self, name: str) -> Fields | None:
        return detect_fields(self.source, self._names, name, decoding=True)

    def load(self, name: str) -> torch.Tensor:
        if self._cache is not None and self._cache[0] == name:
            return self._cache[1]
        fields = self.fields(name)
        if fields is None:
            return self.source.load(name)
        values = torch.from_numpy(self._decode(fields))
        self._cache = (name, values)  # the adapter reads one tensor once per piece
        return values

    def _decode(self, fields: Fields) -> np.ndarray:
        codes = _words(self.source, fields.codes)
        if fields.kind == "fp8-block":
            multipliers = self.source.load(fields.scales).to(torch.float32).numpy()
            block = block_size(self.source)
            flat = codes.reshape(-1, codes.shape[-1])
            values = decode_block_fp8(flat, multipliers, block, f"{self.id}: {fields.scales}")
            return values.reshape(codes.shape)
        if fields.format == FP8:
            rows = codes.reshape(-1, codes.shape[-1]).shape[0]
            scale = _row_scale_values(self.source, fields, rows)
            return decode_fp8(codes.reshape(rows, -1), scale).reshape(codes.shape)
        scales = _words(self.source, fields.scales)
        divisor = _scalars(self.source, fields.divisor, fields.reciprocal, "a weight divisor")
        if divisor.size > 1:  # fused bank [E, N, K/2]: one divisor per expert
            divisor = divisor.reshape(-1, *([1] * (codes.ndim - 2)))
        return decode_nvfp4(codes, scales, divisor[..., 0] if divisor.size == 1 else divisor)


def values_view(source: Any) -> Any:
    """How the converter reads float values from a source: decoded if it is safetensors."""
    return source if isinstance(source, GgufSource) else DecodedView(source)


# --- import_encoded ---------------------------------------------------------------------------


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
            _check_header(source, f, tensor)
        _check_rows(source, fields, tensor)
        if choice.format == FP8:
            lossless = all(source.dtype(f.scales) == "BF16" for f in fields.values())
            return _Prepared(fields, None, None, None, lossless)
        divisors, activations, missing = set(), [], None
        for piece in tensor.pieces:
            f = fields[piece.tensor]
            index = _expert_index(source, f, piece)
            words = _scalars(source, f.divisor, f.reciprocal, "a weight divisor")  # type: ignore[arg-type]
            divisors.add(words[min(index, words.size - 1)].tobytes())
            if f.activation is None:
                missing = missing or f.weight
            else:
                act = _scalars(source, f.activation, f.reciprocal, "an activation divisor")
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
        codes = _words(source, f.codes)
        codes = codes.reshape(-1, codes.shape[-1])
        if f.format == FP8:
            scales = _row_scale_values(source, f, codes.shape[0])
            _check_fp8(source, f, codes, scales)
            return codes, scales
        scales = _words(source, f.scales)
        scales = scales.reshape(-1, scales.shape[-1])
        _check_nvfp4_scales(source, f.scales, scales)
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


def _expert_index(source: Any, f: Fields, piece: SourcePiece) -> int:
    """Which expert of a fused rank-3 bank a piece reads (0 for an ordinary matrix)."""
    shape = source.shape(f.codes)
    if len(shape) < 3 or piece.rows is None:
        return 0
    per = shape[-2]
    first, last = piece.rows[0] // per, (piece.rows[1] - 1) // per
    if first != last:
        raise RecipeError(f"{source.id}: rows {piece.rows} of {f.codes} span two experts")
    return first


def _check_header(source: Any, f: Fields, tensor: LogicalTensor) -> None:
    """Dtypes and shapes of every field, from the safetensors header alone."""
    k = tensor.shape[-1]
    if f.format == FP8:
        _require(source, f.codes, ("F8_E4M3",), "FP8 codes")
        _require(source, f.scales, ("BF16", "F32"), "FP8 row scale")
        shape, scale = source.shape(f.codes), source.shape(f.scales)
        per_row = scale in (shape[:-1], (*shape[:-1], 1))
        if shape[-1] != k or not (per_row or int(np.prod(scale, dtype=np.int64)) == 1):
            raise RecipeError(
                f"{source.id}: {f.codes} {list(shape)} / {f.scales} {list(scale)} do not hold "
                f"FP8 rows of {k} values with one scale per row (or per tensor)"
            )
        return
    _require(source, f.codes, ("U8",), "NVFP4 codes")
    _require(source, f.scales, ("F8_E4M3",), "NVFP4 block scales")
    _require(source, f.divisor, ("F32",), "NVFP4 weight divisor")
    if f.activation is not None:
        _require(source, f.activation, ("F32",), "activation divisor")
    shape, scale = source.shape(f.codes), source.shape(f.scales)
    if shape[-1] * 2 != k or scale != (*shape[:-1], k // NVFP4_BLOCK):
        raise RecipeError(
            f"{source.id}: {f.codes} {list(shape)} / {f.scales} {list(scale)} do not hold "
            f"NVFP4 rows of {k} values ([rows, {k // 2}] codes, [rows, {k // NVFP4_BLOCK}] "
            "scales)"
        )
    experts = shape[0] if len(shape) >= 3 else 1
    for name in (f.divisor, f.activation):
        if name is not None and int(np.prod(source.shape(name), dtype=np.int64)) not in (
            1,
            experts,
        ):
            raise RecipeError(
                f"{source.id}: {name} has shape {list(source.shape(name))}; expected one value"
                + (f" or one per expert ({experts})" if experts > 1 else "")
            )


def _check_rows(source: Any, fields: dict[str, Fields], tensor: LogicalTensor) -> None:
    """The pieces select existing rows, as many as the parameter has."""
    total = 0
    for piece in tensor.pieces:
        f = fields[piece.tensor]
        rows = int(np.prod(source.shape(f.codes)[:-1], dtype=np.int64))
        start, stop = piece.rows if piece.rows is not None else (0, rows)
        if stop > rows:
            raise RecipeError(
                f"{source.id}: {f.codes} has {rows} rows; {tensor.name} needs rows up to {stop}"
            )
        total += stop - start
    if total != tensor.shape[0]:
        raise RecipeError(
            f"{source.id}: {', '.join(fields)} give {total} rows for {tensor.name}, "
            f"which has {tensor.shape[0]}"
        )


def _where(mask: np.ndarray) -> str:
    index = tuple(int(i) for i in np.argwhere(mask)[0])
    return f"{int(mask.sum())} word(s), first at {list(index)}"


def _check_nvfp4_scales(source: Any, name: str, scales: np.ndarray) -> None:
    bad = (scales >= 0x80) | (scales == 0x7F)
    if bad.any():
        raise RecipeError(
            f"{source.id}: {name} holds invalid E4M3FN block scales (sign bit set or NaN 0x7F): "
            + _where(bad)
        )


def _check_fp8(source: Any, f: Fields, codes: np.ndarray, scales: np.ndarray) -> None:
    nan = (codes & 0x7F) == 0x7F
    if nan.any():
        raise RecipeError(f"{source.id}: {f.codes} holds NaN E4M3FN codes: {_where(nan)}")
    bad = ~np.isfinite(scales) | (scales < 0) | np.signbit(scales)
    if bad.any():
        raise RecipeError(
            f"{source.id}: {f.scales} holds negative or non-finite row scales: {_where(bad)}"
        )
    zero_rows = scales == 0
    if zero_rows.any() and ((codes[zero_rows] & 0x7F) != 0).any():
        raise RecipeError(f"{source.id}: {f.codes} has non-zero codes in rows whose scale is 0")


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


# --- gguf_import ------------------------------------------------------------------------------


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


def importers(sources: Mapping[str, Any], recipe: Recipe) -> dict[str, Importer]:
    """The import methods by name; any other method quantizes float values."""
    return {
        EncodedImport.method: EncodedImport(sources, recipe),
        GgufImport.method: GgufImport(sources),
    }
