"""Synthetic ``.ninfer`` v3 artifacts: random but valid encoded weights at any geometry.

No checkpoint is read and nothing is quantized: every object's bytes are drawn directly as
codes and scales of its format, in chunks of a few MB, so a full-size artifact (17 GB for the
27B geometry) is written with bounded memory at near disk speed. Parameters are packed into
parents exactly as a real conversion with the same recipe packs them (``plan_parents``,
``bindings_and_uses``), so object shapes, bindings and uses match a converted artifact.

Values are drawn so a forward pass stays finite and activations keep their scale (the
distributions: ``chunks``); NVFP4 AllowA4 uses get an activation divisor (fp32 auxiliary)
like an import would.

Components: text, and the MTP block (``mtp/*``, in the recipe's MTP formats) when the recipe
lists it (every shipped recipe does). With MTP, the indexed proposal head (spec 5.6) too:
``proposal/head`` [Ns, H] in the recipe's proposal format and ``proposal/token_ids`` = 0 ..
Ns - 1 (the synthetic tokenizer's tokens first); Ns defaults to ``DEFAULT_ROWS`` capped by
the vocabulary. With ``vision``, a Qwen3.5 vision component (``vision``: the released tower's
geometry, its image processor config, Qwen's vision tokens in the tokenizer).

Fewer layers (``layers``): the geometry's config cut to that many decoder layers at full width,
keeping one of every kind of layer (``architectures.reduce_layers``); n-gram tables may be
shrunk for disk (``ple_rows_scale``). Provenance then says which layers were kept, their kinds,
how many layers of each kind the whole model has, and the whole model's stored weight and
routed-expert bytes (at full table size), so ``ninfer-bench run`` can extrapolate.

Provenance records ``"synthetic": true`` with the geometry, recipe, seed, components and
proposal rows.

The package, one job a module: ``resources`` (the tokenizer and the other text resources),
``plan`` (objects, bindings and uses: ``plan_synthetic``), ``vision`` (the vision component),
``chunks`` (one object's random encoded bytes: ``parent_chunks``) and ``writer``
(``write_synthetic``).
"""

from __future__ import annotations

from ninfer_convert.errors import RecipeError  # for the CLI

from .chunks import CHUNK_BYTES, nvfp4_divisor, parent_chunks
from .plan import ACTIVATION_DIVISOR, SyntheticPlan, plan_synthetic, proposal_rows_for
from .resources import CHATML, SPECIAL_TOKENS, text_resources
from .writer import SynthesisReport, write_synthetic

__all__ = [
    "ACTIVATION_DIVISOR",
    "CHATML",
    "CHUNK_BYTES",
    "SPECIAL_TOKENS",
    "RecipeError",
    "SynthesisReport",
    "SyntheticPlan",
    "nvfp4_divisor",
    "parent_chunks",
    "plan_synthetic",
    "proposal_rows_for",
    "text_resources",
    "write_synthetic",
]
