"""Op families and their providers: ``resolve(family, op, **key)`` returns the callable that
serves ``op`` for ``key`` (device, dtypes, shapes), as the family's policy orders its
providers, skipping those whose library is not installed or that decline the key.

A provider is named by module and function and imported only when first resolved, so a
family can list a GPU library provider without the CPU path importing it. Each resolution is
logged once per (family, op, key) at INFO, which ``ninfer --log-level info`` prints.
``override`` forces one provider (benchmarks and tests compare providers with it);
``patched`` puts any callable in an op's place (the profile's ablation: an op replaced by an
empty output of the right shape).

Models resolve their ops on every call (so an override or a patch takes effect at once), and
an eager prefill chunk issues about fifteen ops a layer: a resolution already made is one
look-up in ``functools.cache``'s table (``benchmarks/op_resolve_bench.py``). The policy's
choice is a pure function of the key, so the memo holds until ``override`` or ``patched``
changes what an op resolves to; both clear it on entry and on exit (as declaring a family or
registering a provider does).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NoProvider",
    "Provider",
    "family",
    "override",
    "patched",
    "providers",
    "recording",
    "register",
    "resolve",
]

log = logging.getLogger("ninfer.ops")


class NoProvider(LookupError):
    """No provider the policy (or a forced choice) names serves the op for this key."""


@dataclass(frozen=True)
class Provider:
    """``module.function`` serves ``op`` of ``family``; ``requires``: top-level modules that
    must be importable (a library provider's library); ``accepts``: the key (device, shapes)
    it can take, as ``module.<accepts>(**key) -> bool`` (empty: any key)."""

    family: str
    op: str
    name: str
    module: str
    function: str
    requires: tuple[str, ...] = ()
    accepts: str = ""

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def load(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.module), self.function)

    def takes(self, key: dict[str, Any]) -> bool:
        if not self.accepts:
            return True
        return bool(getattr(importlib.import_module(self.module), self.accepts)(**key))


@dataclass
class _Family:
    #: op -> provider name -> provider
    providers: dict[str, dict[str, Provider]] = field(default_factory=dict)
    #: (op, **key) -> provider names, most preferred first: the family's policy table
    policy: Callable[..., Sequence[str]] | None = None


_FAMILIES: dict[str, _Family] = {}
#: (family, op, sorted key) -> the callable: what was walked and logged, whatever the order
#: the callers gave the keywords in
_RESOLVED: dict[tuple[str, str, tuple[tuple[str, Any], ...]], Callable[..., Any]] = {}
_FORCED: dict[tuple[str, str], str] = {}
_PATCHED: dict[tuple[str, str], Callable[..., Any]] = {}


def family(name: str, policy: Callable[..., Sequence[str]]) -> None:
    """Declare family ``name`` with its policy: ``policy(op, **key)`` -> provider names."""
    _FAMILIES.setdefault(name, _Family()).policy = policy
    _forget()


def register(provider: Provider) -> None:
    fam = _FAMILIES.setdefault(provider.family, _Family())
    fam.providers.setdefault(provider.op, {})[provider.name] = provider
    _forget()


def providers(family_name: str) -> dict[str, dict[str, Provider]]:
    """op -> name -> provider of a family (its modules imported: the family registers them)."""
    _load(family_name)
    return _FAMILIES[family_name].providers


def _load(family_name: str) -> _Family:
    if family_name not in _FAMILIES or _FAMILIES[family_name].policy is None:
        module = f"{__package__}.{family_name}"
        if importlib.util.find_spec(module) is None:
            raise LookupError(f"no op family {family_name!r}")
        importlib.import_module(module)
    return _FAMILIES[family_name]


@functools.cache
def resolve(family_name: str, op: str, /, **key: Any) -> Callable[..., Any]:
    """The callable serving ``op`` of ``family_name`` for ``key`` (keyword values hashable).

    Memoised by ``functools.cache`` on the call's arguments as given: a hit is the C wrapper's
    look-up, cheaper than calling an empty Python function with the same keywords."""
    return _resolve(family_name, op, key)


def _resolve(family_name: str, op: str, key: dict[str, Any]) -> Callable[..., Any]:
    """The policy's walk (or the patched callable), each key walked and logged once."""
    if (family_name, op) in _PATCHED:
        return _PATCHED[(family_name, op)]
    memo = (family_name, op, tuple(sorted(key.items())))
    if memo in _RESOLVED:
        return _RESOLVED[memo]
    fam = _load(family_name)
    table = fam.providers.get(op, {})
    forced = _FORCED.get((family_name, op))
    names = [forced] if forced else list(fam.policy(op, **key))  # type: ignore[misc]
    for name in names:
        provider = table.get(name)
        if provider is None:
            raise LookupError(f"{family_name}.{op}: the policy names no provider {name!r}")
        if provider.available() and provider.takes(key):
            fn = provider.load()
            log.info("%s.%s %s -> %s", family_name, op, _shown(key), name)
            _RESOLVED[memo] = fn
            return fn
    raise NoProvider(f"{family_name}.{op}: no provider of {names} takes {_shown(key)}")


@contextlib.contextmanager
def recording() -> Iterator[set[tuple[str, str]]]:
    """The (family, op) of every op the block resolves, in the set it yields once the block
    ends: the memo is dropped on entry, so each op the block uses is resolved (and memoised)
    in it. A patch or override inside the block drops the memo again: keep them out."""
    seen: set[tuple[str, str]] = set()
    _forget()
    try:
        yield seen
    finally:
        seen.update((family_name, op) for family_name, op, _ in _RESOLVED)


def _forget() -> None:
    """Drop every memoised resolution (an override or a patch changes what ops resolve to)."""
    resolve.cache_clear()
    _RESOLVED.clear()


def _shown(key: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(key.items())) or "any"


def override(family_name: str, op: str, name: str) -> contextlib.AbstractContextManager[None]:
    """Within the block ``op`` of ``family_name`` resolves to provider ``name`` only."""
    return _within(_FORCED, (family_name, op), name)


def patched(
    family_name: str, op: str, fn: Callable[..., Any]
) -> contextlib.AbstractContextManager[None]:
    """Within the block ``op`` of ``family_name`` resolves to ``fn``, whatever the key."""
    return _within(_PATCHED, (family_name, op), fn)


@contextlib.contextmanager
def _within(table: dict[tuple[str, str], Any], op: tuple[str, str], value: Any) -> Iterator[None]:
    """``table[op]`` is ``value`` within the block (the memo forgotten on entry and on exit),
    then what it was before."""
    previous = table.get(op)
    table[op] = value
    _forget()
    try:
        yield
    finally:
        if previous is None:
            table.pop(op, None)
        else:
            table[op] = previous
        _forget()
