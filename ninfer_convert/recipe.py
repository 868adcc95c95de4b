"""The recipe API: which format and method each logical parameter gets, and how parents pack.

A recipe is a small Python module in ``recipes/`` that builds a ``Recipe``::

    recipe = Recipe("qwen3_6_27b", "Q4/Q5 text projections, Q6 vocabulary")
    recipe.assign("text/layers/*/attention/query", format="q4_g64_fp16")
    recipe.assign("text/token_embedding", "text/output_head", format="q6_g64_fp16")

Patterns are ``fnmatch`` globs over logical names (spec 5.2); later rules override the fields
they set. Parameters no rule touches keep their direct default (bf16; fp32 for ``gdn/a_log`` and
``gdn/dt_bias``). Parameters packed together (spec 5.2 groups) share one parent object when
their choices agree; ``separate`` keeps parameters out of packing.
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
}
POLICIES = ("A16Only", "AllowA8", "AllowA4")
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
    proposal_format: str = "q4_g64_fp16"

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
            and format not in DIRECT | QUANTIZED
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
            fields["method"] = DEFAULT_METHOD.get(format, "import_encoded")
        if params:
            fields["params"] = tuple(sorted(params.items()))
        self.rules.append(_Rule(tuple(patterns), fields))
        return self

    def separate(self, *patterns: str) -> Recipe:
        """Keep matching parameters in objects of their own (never packed)."""
        self.separated.extend(patterns)
        return self

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
        return chosen

    def is_separate(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.separated)

    def unmatched_rules(self) -> list[str]:
        return [", ".join(r.patterns) for r in self.rules if not r.matched]


def available_recipes() -> list[str]:
    import recipes

    return sorted(
        m.name for m in pkgutil.iter_modules(recipes.__path__) if not m.name.startswith("_")
    )


def load_recipe(name: str) -> Recipe:
    """Import ``recipes.<name>`` and build its recipe (``build()`` returns a fresh one)."""
    if name not in available_recipes():
        known = ", ".join(available_recipes())
        raise RecipeError(f"unknown recipe {name!r}; known recipes: {known}")
    module = importlib.import_module(f"recipes.{name}")
    recipe = module.build()
    if not isinstance(recipe, Recipe):
        raise RecipeError(f"recipes.{name}.build() must return a Recipe")
    return recipe


def matching(names: Iterable[str], pattern: str) -> list[str]:
    return [n for n in names if fnmatch.fnmatchcase(n, pattern)]
