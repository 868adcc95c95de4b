"""Synthetic ``.ninfer`` v3 artifacts: random but valid encoded weights at any geometry.

No checkpoint is read and nothing is quantized: every object's bytes are drawn directly as
codes and scales of its format, in chunks of a few MB, so a full-size artifact (17 GB for the
27B geometry) is written with bounded memory at near disk speed. Parameters are packed into
parents exactly as a real conversion with the same recipe packs them (``plan_parents``,
``bindings_and_uses``), so object shapes, bindings and uses match a converted artifact.

Value distributions (so a forward pass stays finite and activations keep their scale):

- matrices decode to values of standard deviation ~ 1/sqrt(K) (K = input width): random code
  bytes, and scale words (binary16 / E4M3FN / BF16) chosen from the code distribution's RMS;
- zero-centred norms (RMSNorm_1p: gain ``1 + w``) get ``w`` ~ 0 (gain ~ 1); the GDN output
  norm (plain gain) ~ 1; the GDN convolution ~ N(0, 1/sqrt(T));
- ``gdn/a_log`` = log U(1, 16), ``gdn/dt_bias`` ~ N(0, 0.5), both fp32;
- NVFP4 AllowA4 uses get an activation divisor (fp32 auxiliary) like an import would.

Components: text, and the MTP block (``mtp/*``, in the recipe's MTP formats) when the recipe
lists it (every shipped recipe does). With MTP, the indexed proposal head (spec 5.6) too:
``proposal/head`` [Ns, H] in the recipe's proposal format and ``proposal/token_ids`` = 0 ..
Ns - 1 (the synthetic tokenizer's tokens first); Ns defaults to ``DEFAULT_ROWS`` capped by
the vocabulary.

Fewer layers (``layers``): the geometry's config cut to that many decoder layers at full width,
keeping one of every kind of layer (``architectures.reduce_layers``); n-gram tables may be
shrunk for disk (``ple_rows_scale``). Provenance then says which layers were kept, their kinds,
how many layers of each kind the whole model has, and the whole model's stored weight and
routed-expert bytes (at full table size), so ``ninfer-bench run`` can extrapolate.

Provenance records ``"synthetic": true`` with the geometry, recipe, seed, components and
proposal rows.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ninfer_convert.adapters import LogicalTensor, SourcePiece
from ninfer_convert.errors import RecipeError
from ninfer_convert.plan import (
    Auxiliary,
    Parent,
    attach_auxiliaries,
    bindings_and_uses,
    plan_parents,
)
from ninfer_convert.proposal import DEFAULT_ROWS
from ninfer_convert.recipe import DEFAULT_METHOD, Choice, Recipe, load_recipe
from ninfer_convert.recipes._gguf_mixes import MIXES, mix_recipe
from ninfer_format import ArtifactWriter, ResourceSpec, TensorSpec
from ninfer_format.codecs import codec_for
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, set_scales
from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_format.codecs.nvfp4 import CODEC as NVFP4_CODEC
from ninfer_format.codecs.nvfp4 import TILE_ROWS
from ninfer_format.codecs.row_split import FORMATS as ROW_SPLIT_FORMATS
from ninfer_format.codecs.row_split import row_split_geometry
from ninfer_format.framing import DEFAULT_SHARD_LIMIT
from ninfer_format.numeric import E2M1_VALUES, E4M3FN_VALUES, NF4_CODEBOOK, NF4_ZERO_CODE
from ninfer_format.progress import ProgressBar, silent
from ninfer_format.writer import place_objects

from ..expert_offload.plan import routed_expert
from .architectures import architecture_of, reduce_layers, scale_ple_rows
from .geometries import GEOMETRIES

__all__ = ["RecipeError", "plan_synthetic", "write_synthetic"]  # RecipeError: for the CLI

#: bytes per ``write`` call (and per generated temporary)
CHUNK_BYTES = 4 << 20

#: the activation divisor of synthetic AllowA4 uses: 6 * 448 / (an activation amax of 8)
ACTIVATION_DIVISOR = np.float32(6 * 448 / 8)


@dataclass
class SyntheticPlan:
    """Everything fixed before the first byte: what ``write_synthetic`` streams."""

    geometry: str
    recipe: Recipe
    text_config: dict[str, Any]
    components: dict[str, Any]
    logical: dict[str, LogicalTensor]
    parents: list[Parent]
    auxiliaries: list[Auxiliary]
    bindings: dict[str, Any]
    uses: list[dict[str, Any]]
    resources: dict[str, bytes]
    specs: list[TensorSpec | ResourceSpec]
    proposal_rows: int = 0
    #: with fewer layers: ``Reduction.as_provenance()`` and the whole model's bytes
    reduction: dict[str, Any] | None = None

    @property
    def objects(self) -> list[dict[str, Any]]:
        """Object records with placement (offsets, bytes), as the writer will lay them out."""
        return place_objects(self.specs)

    @property
    def payload_bytes(self) -> int:
        last = self.objects[-1]
        return int(last["offset"] + last["bytes"])

    @property
    def weight_bytes(self) -> int:
        return sum(r["bytes"] for r in self.objects if r["kind"] == "tensor")

    def bytes_by_component(self) -> dict[str, int]:
        """Weight bytes per component (``text``, ``mtp``, ``proposal``), auxiliaries aside."""
        sizes = {r["id"]: r["bytes"] for r in self.objects}
        out: dict[str, int] = {}
        for p in self.parents:
            component = p.members[0].name.split("/", 1)[0]
            out[component] = out.get(component, 0) + sizes[p.id]
        return out

    def bytes_by_parameter(self) -> dict[str, int]:
        """Stored bytes of each logical parameter (a packed parent's shared out by elements)."""
        sizes = {r["id"]: r["bytes"] for r in self.objects}
        out: dict[str, int] = {}
        for p in self.parents:
            elements = sum(math.prod(m.shape) for m in p.members)
            for m in p.members:
                out[m.name] = sizes[p.id] * math.prod(m.shape) // max(elements, 1)
        return out

    def bytes_by_format(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.objects:
            if r["kind"] == "tensor":
                out[r["format"]] = out.get(r["format"], 0) + r["bytes"]
        return out


# --------------------------------------------------------------------------- resources


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map (what a byte-level BPE vocabulary holds)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def text_resources() -> dict[str, bytes]:
    """A minimal byte-level BPE tokenizer (256 byte tokens, no merges, the Qwen specials) and
    the other three text resources; ids stay below every geometry's vocabulary."""
    vocab = {c: i for i, c in enumerate(_byte_alphabet())}
    added = [
        {"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    ]  # fmt: skip
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}  # fmt: skip
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": [],
        },
    }  # fmt: skip
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "model_max_length": 262144,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    generation = {"eos_token_id": [256 + SPECIAL_TOKENS.index("<|im_end|>"), 256],
                  "do_sample": False}  # fmt: skip
    return {
        "tokenizer.json": json.dumps(tokenizer).encode(),
        "tokenizer_config.json": json.dumps(config, indent=2).encode(),
        "chat_template.jinja": CHATML.encode(),
        "generation_config.json": json.dumps(generation, indent=2).encode(),
    }


# --------------------------------------------------------------------------- planning


def _recipe(formats: str | Recipe, geometry: str) -> Recipe:
    """A recipe, by name or given; also a GGUF type mix (``recipes._gguf_mixes``) by name."""
    if isinstance(formats, Recipe):
        return formats
    if formats in MIXES:
        return mix_recipe(formats, GEOMETRIES[geometry])
    return load_recipe(formats)


def _stacking(recipe: Recipe) -> Callable[[Sequence[LogicalTensor], Choice], int]:
    """What ``EncodedImport.stacking`` answers for a checkpoint whose divisors are equal
    within every packing group: expert banks of ``stack_divisors`` keep one per member."""

    def stacking(members: Sequence[LogicalTensor], choice: Choice) -> int:
        if choice.method != "import_encoded" or choice.format != "nvfp4":
            return 1
        rows = {m.shape[0] for m in members}
        if (
            all(recipe.stacks_divisors(m.name) for m in members)
            and len(rows) == 1
            and rows.pop() % TILE_ROWS == 0
        ):
            return len(members)
        return 1

    return stacking


def proposal_rows_for(geometry: str, rows: int | None, mtp: bool) -> int:
    """Rows of the synthetic proposal head: ``rows`` as asked (0: none), by default
    ``DEFAULT_ROWS`` capped by the vocabulary when there is a drafter to read it."""
    vocab = int(GEOMETRIES[geometry]["vocab_size"])
    if rows is None:
        return min(DEFAULT_ROWS, vocab) if mtp else 0
    if rows and not mtp:
        raise ValueError("a proposal head needs the mtp component (its drafter)")
    if not 0 <= rows <= vocab:
        raise ValueError(f"proposal rows {rows} must be in 0..{vocab} (the vocabulary)")
    return rows


def _logical(spec: Any) -> LogicalTensor:
    """The parameter as a tensor of its own; the proposal's token ids are 0 .. Ns - 1."""
    if spec.name == "proposal/token_ids":
        ids = tuple(range(spec.shape[0]))
        return LogicalTensor(spec.name, spec.shape, spec.role.value, (), (), constant=ids)
    piece = (SourcePiece(spec.name),)
    return LogicalTensor(spec.name, spec.shape, spec.role.value, spec.inputs, piece)


def _choice(recipe: Recipe, tensor: LogicalTensor) -> Choice:
    if tensor.name == "proposal/token_ids":
        return Choice(format="int32", method="cast")
    if tensor.name == "proposal/head":
        fmt = recipe.proposal_format
        return Choice(format=fmt, method=DEFAULT_METHOD[fmt])
    return recipe.choice(tensor.name, tensor.role)


def _whole_model_bytes(plan: SyntheticPlan, kinds: list[str], whole: dict[str, int]) -> dict:
    """The whole model's text weight and routed-expert bytes, from the kept layers: each kind's
    mean layer bytes times its layers in the whole model, plus what no layer holds."""
    weights: dict[int | None, int] = {}
    experts: dict[int, int] = {}
    for name, size in plan.bytes_by_parameter().items():
        if not name.startswith("text/"):
            continue
        parts = name.split("/")
        layer = int(parts[2]) if parts[1] == "layers" else None
        weights[layer] = weights.get(layer, 0) + size
        if routed_expert(name) is not None:
            experts[layer] = experts.get(layer, 0) + size  # type: ignore[index]
    out = {"weights": weights.pop(None, 0), "experts": 0}
    for kind, count in whole.items():
        layers = [i for i, k in enumerate(kinds) if k == kind]
        out["weights"] += count * sum(weights.get(i, 0) for i in layers) // len(layers)
        out["experts"] += count * sum(experts.get(i, 0) for i in layers) // len(layers)
    return out


def plan_synthetic(
    geometry: str,
    formats: str | Recipe,
    *,
    mtp: bool = True,
    proposal_rows: int | None = None,
    layers: int | None = None,
    ple_rows_scale: float = 1.0,
) -> SyntheticPlan:
    """Parents, bindings, uses, auxiliaries and object specs, without generating any bytes.
    ``mtp``: the MTP component when the recipe has one (and the bench runs one for the
    architecture); ``proposal_rows``: see ``proposal_rows_for``; ``layers``: that many
    decoder layers at full width (every kind kept); ``ple_rows_scale``: n-gram tables of
    about that share of their rows."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r} (known: {', '.join(GEOMETRIES)})")
    recipe = _recipe(formats, geometry)
    reduction = reduce_layers(GEOMETRIES[geometry], layers)
    config = scale_ple_rows(reduction.config, ple_rows_scale)
    arch = architecture_of(config)
    comps = tuple(c for c in recipe.components if c == "text" or (c == "mtp" and mtp and arch.mtp))
    rows = proposal_rows_for(geometry, proposal_rows, "mtp" in comps)
    logical = {s.name: _logical(s) for s in arch.parameters(config, comps, rows or None)}
    choices = {name: _choice(recipe, t) for name, t in logical.items()}
    parents = plan_parents(logical, recipe, choices=choices, stacking=_stacking(recipe))
    bindings, uses = bindings_and_uses(parents)

    def provide(parent: Parent, use: dict[str, Any]) -> Any:
        if parent.choice.format == "nvfp4" and use.get("activation_policy") == "AllowA4":
            return {"activation_input_divisor": ("fp32", (), ACTIVATION_DIVISOR.tobytes())}
        return {}

    auxiliaries = attach_auxiliaries(parents, uses, provide)
    resources = {f"resource/text/{role}": data for role, data in text_resources().items()}
    components: dict[str, Any] = {
        "text": {
            "config": {**config, "architectures": [arch.architecture]},
            "resources": {rid.rsplit("/", 1)[1]: rid for rid in resources},
        }
    }
    if rows:
        components["text"]["proposal"] = {"domain": "indexed", "rows": rows}
    if "mtp" in comps:
        components["mtp"] = {
            "config": {"architectures": [arch.mtp_architecture]},
            "target": "text",
        }
    specs: list[TensorSpec | ResourceSpec] = [
        ResourceSpec(rid, "raw_bytes_v1", len(data)) for rid, data in resources.items()
    ]
    specs += [TensorSpec(p.id, p.shape, p.choice.format, p.layout, p.divisors) for p in parents]
    specs += [TensorSpec(a.id, a.shape, a.format, "contiguous_le_v1") for a in auxiliaries]
    plan = SyntheticPlan(
        geometry, recipe, config, components, logical, parents, auxiliaries, bindings, uses,
        resources, specs, rows,
    )  # fmt: skip
    if layers is not None or ple_rows_scale != 1:
        # the whole model's bytes at the real table size: sized on an unscaled plan
        sizing = (
            plan
            if ple_rows_scale == 1
            else plan_synthetic(
                geometry, recipe, mtp=mtp, proposal_rows=proposal_rows, layers=layers
            )
        )
        whole = _whole_model_bytes(sizing, reduction.kinds, reduction.whole_kinds)
        plan.reduction = {
            **reduction.as_provenance(),
            "ple_rows_scale": ple_rows_scale if config.get("ple_layer_ids") else 1.0,
            "whole_bytes": whole,
        }
    return plan


# --------------------------------------------------------------------------- generation


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.frombuffer(rng.bytes(n), dtype=np.uint8).copy()


def _row_chunks(rows: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    step = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def _zeros(n: int) -> Iterator[bytes]:
    while n > 0:
        step = min(n, CHUNK_BYTES)
        yield bytes(step)
        n -= step


def _lane_mask(columns: int, padded: int, bits: int) -> np.ndarray:
    """Per-row byte mask of a plane holding ``bits`` per lane: 1 bits on real columns."""
    valid = np.arange(padded) < columns
    return np.packbits(np.repeat(valid, bits), bitorder="little")


def _code_rms(format: str) -> float:
    spec = ROW_SPLIT_FORMATS[format]
    if spec.nf4:
        return float(np.sqrt(np.mean(NF4_CODEBOOK.astype(np.float64) ** 2)))
    levels = np.arange(-(1 << (spec.bits - 1)), 1 << (spec.bits - 1), dtype=np.float64)
    if spec.bits == 8:
        levels[0] = 0  # -128 is illegal: drawn as 0
    return float(np.sqrt(np.mean(levels**2)))


def _f16_scales(rng: np.random.Generator, shape: tuple[int, ...], target: float) -> np.ndarray:
    """Positive normal binary16 words near ``target`` (mantissa jitter of about +-6%)."""
    base = int(np.float16(target).view(np.uint16))
    jitter = rng.integers(-64, 65, size=shape, dtype=np.int32)
    return (base + jitter).astype("<u2")


def _row_split(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    fmt = ROW_SPLIT_FORMATS[parent.choice.format]
    rows, columns = parent.shape
    geo = row_split_geometry(fmt.name, (rows, columns))
    padded = geo.columns < geo.padded_columns
    base_bits = 8 if fmt.bits == 8 else 4
    base_row = geo.base_bytes // rows
    mask = _lane_mask(columns, geo.padded_columns, base_bits)
    fill = (~mask & (NF4_ZERO_CODE * 0x11 if fmt.nf4 else 0)).astype(np.uint8)
    for a, b in _row_chunks(rows, base_row):
        chunk = _random_bytes(rng, (b - a) * base_row).reshape(b - a, base_row)
        if fmt.bits == 8:
            chunk[chunk == 0x80] = 0
        if padded:
            chunk &= mask
            chunk |= fill
        yield chunk
    yield from _zeros(geo.high_offset - geo.base_bytes)
    if geo.high_bytes:
        high_row = geo.high_bytes // rows
        high_mask = _lane_mask(columns, geo.padded_columns, fmt.bits - 4)
        for a, b in _row_chunks(rows, high_row):
            chunk = _random_bytes(rng, (b - a) * high_row).reshape(b - a, high_row)
            if padded:
                chunk &= high_mask
            yield chunk
    yield from _zeros(geo.scale_offset - geo.high_offset - geo.high_bytes)
    target = 1.0 / (math.sqrt(columns) * _code_rms(fmt.name))
    for a, b in _row_chunks(rows, 2 * geo.groups_per_row):
        words = np.zeros((b - a, geo.groups_per_row), dtype="<u2")
        words[:, : geo.real_groups] = _f16_scales(rng, (b - a, geo.real_groups), target)
        yield words


#: E4M3FN block scales drawn from [8, 16): bytes 0x50..0x57 (exponent 3, any mantissa)
_NVFP4_SCALE_BYTES = np.arange(0x50, 0x58, dtype=np.uint8)


def nvfp4_divisor(columns: int) -> float:
    """The weight divisor that makes random codes and scales decode with std ~ 1/sqrt(K)."""
    e2m1_rms = float(np.sqrt(np.mean(E2M1_VALUES.astype(np.float64) ** 2)))
    scales = E4M3FN_VALUES[_NVFP4_SCALE_BYTES].astype(np.float64)
    return e2m1_rms * float(np.sqrt(np.mean(scales**2))) * math.sqrt(columns)


def _nvfp4(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    geo = NVFP4_CODEC.geometry(parent.shape, parent.divisors or 1)
    for start in range(0, geo.code_bytes, CHUNK_BYTES):
        yield _random_bytes(rng, min(CHUNK_BYTES, geo.code_bytes - start))
    yield from _zeros(geo.scale_offset - geo.code_bytes)
    for start in range(0, geo.scale_bytes, CHUNK_BYTES):
        n = min(CHUNK_BYTES, geo.scale_bytes - start)
        yield _random_bytes(rng, n) % np.uint8(8) + np.uint8(0x50)
    divisor = np.float32(nvfp4_divisor(geo.columns))
    yield np.full(geo.divisors, divisor, dtype="<f4")


def _fp8_row(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    rows, columns = parent.shape
    finite = E4M3FN_VALUES[np.isfinite(E4M3FN_VALUES)].astype(np.float64)
    rms = float(np.sqrt(np.mean(finite**2)))
    for a, b in _row_chunks(rows, columns):
        chunk = _random_bytes(rng, (b - a) * columns)
        chunk[(chunk & 0x7F) == 0x7F] -= 1  # NaN codes -> the largest finite magnitude
        yield chunk
    yield from _zeros((-(rows * columns)) % 256)
    target = np.float32(1.0 / (math.sqrt(columns) * rms))
    base = int(target.view(np.uint32) >> 16)
    yield (base + rng.integers(-8, 9, size=rows, dtype=np.int32)).astype("<u2")


@functools.cache
def _gguf_scale(fmt: str) -> float:
    """The RMS of the values of random ``fmt`` blocks whose scale fields are all 1.0 (values
    are linear in d and dmin together, so this sets the scale for any target)."""
    _, values_per_block, block_bytes = FORMAT_BLOCKS[fmt]
    blocks = _random_bytes(np.random.default_rng(0), 64 * block_bytes).reshape(64, block_bytes)
    set_scales(fmt, blocks, np.full(64, 0x3C00, dtype=np.uint16))
    values = codec_for(fmt, GGUF_LAYOUT).decode(blocks.reshape(-1), (64, values_per_block))
    return float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))


def _gguf(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    """Random ggml blocks whose scale fields make the values' std ~ 1/sqrt(K)."""
    fmt = parent.choice.format
    _, values, block_bytes = FORMAT_BLOCKS[fmt]
    columns = parent.shape[-1]
    rows = math.prod(parent.shape[:-1])
    row_bytes = columns // values * block_bytes
    target = 1.0 / (math.sqrt(columns) * _gguf_scale(fmt))
    for a, b in _row_chunks(rows, row_bytes):
        blocks = _random_bytes(rng, (b - a) * row_bytes).reshape(-1, block_bytes)
        set_scales(fmt, blocks, _f16_scales(rng, (blocks.shape[0],), target))
        yield blocks


def _bf16_words(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 words by rounding to nearest (values are finite)."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def _vector_values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("gdn/a_log"):
        return np.log(rng.uniform(1.0, 16.0, size=shape))
    if name.endswith("gdn/dt_bias"):
        return rng.normal(0.0, 0.5, size=shape)
    if name.endswith("gdn/norm"):  # plain gain
        return 1.0 + 0.05 * rng.standard_normal(shape)
    if name.endswith("gdn/convolution"):
        return rng.normal(0.0, 1.0 / math.sqrt(shape[0]), size=shape)
    return 0.05 * rng.standard_normal(shape)  # zero-centred norms: gain 1 + w ~ 1


def _direct(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    fmt = parent.choice.format
    for member in parent.stacked:
        if member.role == "matrix":
            rows, columns = member.shape
            for a, b in _row_chunks(rows, 4 * columns):
                x = rng.standard_normal((b - a, columns), dtype=np.float32)
                x *= np.float32(1.0 / math.sqrt(columns))
                yield _bf16_words(x) if fmt == "bf16" else x.astype("<f4")
            continue
        if fmt == "int32":  # the proposal's token ids
            yield np.asarray(member.constant or np.zeros(member.shape), dtype="<i4")
            continue
        values = _vector_values(member.name, member.shape, rng).astype(np.float32)
        yield _bf16_words(values) if fmt == "bf16" else values.astype("<f4")


def parent_chunks(parent: Parent, seed: int) -> Iterator[bytes | np.ndarray]:
    """The parent's object bytes, in chunks of at most about ``CHUNK_BYTES``."""
    rng = np.random.default_rng([seed, int(parent.id.rsplit("/", 1)[1])])
    fmt = parent.choice.format
    if fmt in ROW_SPLIT_FORMATS:
        return _row_split(parent, rng)
    if fmt == "nvfp4":
        return _nvfp4(parent, rng)
    if fmt == "fp8_e4m3fn_row_bf16":
        return _fp8_row(parent, rng)
    if fmt in ("bf16", "fp32", "int32"):
        return _direct(parent, rng)
    if fmt in FORMAT_BLOCKS:
        return _gguf(parent, rng)
    raise ValueError(f"{parent.id}: synthetic {fmt} objects are not supported")


# --------------------------------------------------------------------------- writing


@dataclass
class SynthesisReport:
    path: str
    geometry: str
    recipe: str
    payload_bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / 1e6 / self.seconds if self.seconds else 0.0


def write_synthetic(
    path: str | Path,
    geometry: str,
    formats: str | Recipe,
    seed: int = 0,
    overwrite: bool = False,
    *,
    mtp: bool = True,
    proposal_rows: int | None = None,
    layers: int | None = None,
    ple_rows_scale: float = 1.0,
    shard_limit: int = DEFAULT_SHARD_LIMIT,
    progress: ProgressBar = silent,
) -> SynthesisReport:
    """Write a synthetic artifact of ``geometry`` with the formats of recipe ``formats``
    (``mtp``, ``proposal_rows``, ``layers``, ``ple_rows_scale``: as ``plan_synthetic``);
    ``progress`` shows the weight bytes written (``terminal_bar`` draws a bar)."""
    started = time.perf_counter()
    path = Path(path)
    plan = plan_synthetic(
        geometry, formats, mtp=mtp, proposal_rows=proposal_rows, layers=layers,
        ple_rows_scale=ple_rows_scale,
    )  # fmt: skip
    provenance = {
        "converter": "ninfer-bench synth",
        "synthetic": True,
        "source": "synthetic",
        "geometry": geometry,
        "recipe": plan.recipe.name,
        "seed": seed,
        "components": sorted(plan.components),
        "proposal_rows": plan.proposal_rows,
    }
    if plan.reduction is not None:
        provenance["reduced"] = plan.reduction
    sizes = {r["id"]: r["bytes"] for r in plan.objects}
    total = sum(sizes.values())
    with (
        ArtifactWriter(
            path,
            components=plan.components,
            objects=plan.specs,
            bindings=plan.bindings,
            uses=plan.uses,
            metadata={"name": path.stem, "synthetic": True},
            provenance=provenance,
            shard_limit=shard_limit,
            overwrite=overwrite,
        ) as writer,
        progress(total, "writing", "B") as advance,
    ):
        for rid, data in plan.resources.items():
            writer.write(rid, data)
        for parent in plan.parents:
            for chunk in parent_chunks(parent, seed):
                writer.write(parent.id, chunk)
            advance(sizes[parent.id])
        for aux in plan.auxiliaries:
            writer.write(aux.id, aux.data)
        payload = writer.directory.payload_bytes
    return SynthesisReport(
        str(path), geometry, plan.recipe.name, payload, time.perf_counter() - started
    )
