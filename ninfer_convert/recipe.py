"""The recipe API: which format and method each logical parameter gets, and how parents pack.

A recipe is a small Python module in ``ninfer_convert/recipes/`` that builds a ``Recipe``::

    recipe = Recipe("qwen3_6_27b", "Q4/Q5 text projections, Q6 vocabulary")
    recipe.assign("text/layers/*/attention/query", format="q4_g64_fp16")
    recipe.assign("text/token_embedding", "text/output_head", format="q6_g64_fp16")

Patterns are ``fnmatch`` globs over logical names (spec 5.2); later rules override the fields
they set. Parameters no rule touches keep their direct default (bf16; fp32 for ``gdn/a_log`` and
``gdn/dt_bias``). Parameters packed together (spec 5.2 groups) share one parent object when
their choices agree; ``separate`` keeps parameters out of packing.

Encoded imports copy a pre-quantized checkpoint instead of quantizing (notes 2.6, 4)::

    recipe.assign("text/layers/*/mlp/*", format="nvfp4", method="import_encoded",
                  policy="AllowA4", source="quantized")
    recipe.stack_divisors("text/layers/*/moe/experts/*")   # one divisor per stacked expert
    recipe.assign("text/layers/*/mlp/*", format="gguf", method="gguf_import",
                  policy="AllowA8", source="gguf")          # "gguf": the block's own format
"""

from __future__ import annotations

import fnmatch
import importlib
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import RecipeError

DIRECT = {"bf16", "fp32", "int32"}
#: format placeholder of ``gguf_import``: each parameter keeps its GGUF tensor's block format
GGUF_NATIVE = "gguf"
QUANTIZED = {
    "q4_g64_fp16",
    "q5_g64_fp16",
    "q6_g64_fp16",
    "q8_g32_fp16",
    "nf4_g64_fp16",
    "nvfp4",
    "fp8_e4m3fn_row_bf16",
}
DEFAULT_METHOD = {
    "nvfp4": "nvfp4_absmax",
    "fp8_e4m3fn_row_bf16": "fp8_row_maxabs",
    **{f: "cast" for f in DIRECT},
    **{f: "grouped_absmax" for f in QUANTIZED if f.endswith("_fp16")},
    GGUF_NATIVE: "gguf_import",
}
POLICIES = ("A16Only", "AllowA8", "AllowA4")
#: the import methods and the formats they can produce (checked when a choice is made)
IMPORT_FORMATS = {
    "import_encoded": ("nvfp4", "fp8_e4m3fn_row_bf16"),
    "gguf_import": (GGUF_NATIVE,),
}
ROLE_DEFAULT = {"fp32 vector": "fp32", "token ids": "int32"}


@dataclass(frozen=True)
class Choice:
    """What one parameter becomes."""

    format: str = "bf16"
    method: str = "cast"
    policy: str = "A16Only"
    source: str = "base"  # the --source role the values are read from
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def pack_key(self) -> tuple[Any, ...]:
        return (self.format, self.method, self.policy, self.source, self.params)


@dataclass
class _Rule:
    patterns: tuple[str, ...]
    fields: dict[str, Any]
    matched: bool = False


@dataclass
class Recipe:
    name: str
    description: str
    components: tuple[str, ...] = ("text", "mtp")
    rules: list[_Rule] = field(default_factory=list)
    separated: list[str] = field(default_factory=list)
    stacked: list[str] = field(default_factory=list)
    proposal_format: str = "q4_g64_fp16"
    #: True: a full-vocabulary proposal head (every row of the output head, in id order: an
    #: indexed proposal of vocab_size rows) in ``proposal_format`` even without ``--proposal``
    full_proposal: bool = False
    #: False when every weight comes from other sources and the base directory may hold only
    #: config.json and the tokenizer files (GGUF import)
    base_weights: bool = True

    def assign(
        self,
        *patterns: str,
        format: str | None = None,
        method: str | None = None,
        policy: str | None = None,
        source: str | None = None,
        **params: Any,
    ) -> Recipe:
        """Set the given fields for every parameter matching one of ``patterns``."""
        if not patterns:
            raise RecipeError(f"recipe {self.name}: assign() needs at least one pattern")
        if policy is not None and policy not in POLICIES:
            raise RecipeError(f"recipe {self.name}: policy {policy!r} is not one of {POLICIES}")
        if (
            format is not None
            and format not in DIRECT | QUANTIZED | {GGUF_NATIVE}
            and not format.startswith("gguf_")
        ):
            raise RecipeError(f"recipe {self.name}: unknown format {format!r}")
        fields: dict[str, Any] = {
            k: v
            for k, v in (
                ("format", format),
                ("method", method),
                ("policy", policy),
                ("source", source),
            )
            if v is not None
        }
        if format is not None and method is None:
            fields["method"] = DEFAULT_METHOD.get(
                format, "gguf_import" if format.startswith("gguf_") else "import_encoded"
            )
        if params:
            fields["params"] = tuple(sorted(params.items()))
        self.rules.append(_Rule(tuple(patterns), fields))
        return self

    def separate(self, *patterns: str) -> Recipe:
        """Keep matching parameters in objects of their own (never packed)."""
        self.separated.extend(patterns)
        return self

    def stack_divisors(self, *patterns: str) -> Recipe:
        """Let NVFP4-imported members of one packing group (an MoE expert bank) share a parent
        although their weight divisors differ: the parent keeps one divisor per stacked member
        (EXT-ALL ``divisors``). Needs members of equal rows, a multiple of 128 each; otherwise,
        and for members not matching, only bit-identical divisors share a parent."""
        self.stacked.extend(patterns)
        return self

    def stacks_divisors(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.stacked)

    def choice(self, name: str, role: str) -> Choice:
        fmt = ROLE_DEFAULT.get(role, "bf16")
        chosen = Choice(format=fmt, method="cast")
        for rule in self.rules:
            if any(fnmatch.fnmatchcase(name, p) for p in rule.patterns):
                rule.matched = True
                chosen = replace(chosen, **rule.fields)
        if role != "matrix" and chosen.format not in DIRECT:
            raise RecipeError(
                f"recipe {self.name}: {name} is a {role} and must stay a direct format "
                f"(bf16/fp32), not {chosen.format}"
            )
        self._check_choice(name, chosen)
        return chosen

    def _check_choice(self, name: str, chosen: Choice) -> None:
        """Combinations no rule may produce: caught here, before any source is read."""
        allowed = IMPORT_FORMATS.get(chosen.method)
        gguf_format = chosen.format == GGUF_NATIVE or chosen.format.startswith("gguf_")
        if (
            allowed is not None
            and chosen.format not in allowed
            and not (chosen.method == "gguf_import" and gguf_format)
        ):
            raise RecipeError(
                f"recipe {self.name}: {name}: method {chosen.method} produces "
                f"{' or '.join(allowed)}, not {chosen.format}"
            )
        if gguf_format and chosen.method != "gguf_import":
            raise RecipeError(
                f"recipe {self.name}: {name}: {chosen.format} blocks can only be imported "
                "(method gguf_import)"
            )
        if chosen.policy == "AllowA4" and chosen.format != "nvfp4":
            raise RecipeError(
                f"recipe {self.name}: {name}: AllowA4 needs an nvfp4 weight, not {chosen.format}"
            )

    def is_separate(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.separated)

    def unmatched_rules(self) -> list[str]:
        return [", ".join(r.patterns) for r in self.rules if not r.matched]


def available_recipes() -> list[str]:
    from . import recipes

    return sorted(
        m.name for m in pkgutil.iter_modules(recipes.__path__) if not m.name.startswith("_")
    )


def load_recipe(name: str) -> Recipe:
    """Import ``ninfer_convert.recipes.<name>`` and build its recipe (``build()`` returns a
    fresh one)."""
    if name not in available_recipes():
        known = ", ".join(available_recipes())
        raise RecipeError(f"unknown recipe {name!r}; known recipes: {known}")
    module = importlib.import_module(f"{__package__}.recipes.{name}")
    recipe = module.build()
    if not isinstance(recipe, Recipe):
        raise RecipeError(f"recipes.{name}.build() must return a Recipe")
    return recipe


def matching(names: Iterable[str], pattern: str) -> list[str]:
    return [n for n in names if fnmatch.fnmatchcase(n, pattern)]
