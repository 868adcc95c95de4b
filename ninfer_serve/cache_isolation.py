"""Which prefix-cache namespace a request reads and writes (``[context_cache] isolation``).

A shared prefix cache tells a client something about the others: a request whose prompt
starts like another client's comes back with that prefix in ``cached_tokens`` and answers
sooner. The engine keeps entries under a salt and a request finds only entries made with
its own, so the server picks the salt:

- ``none``: one shared cache; a request's ``cache_salt`` (vLLM's field), when given, puts it
  in that salt's namespace, shared only with requests that give the same salt;
- ``salt``: only requests that give the same ``cache_salt`` share; a request without one gets
  a namespace of its own (its next turn does not resume either) and keeps no extra
  checkpoints, since nobody else could use them;
- ``api_key``: every request is salted with a hash of the API key it presented
  (``Authorization: Bearer`` or ``x-api-key``; its ``cache_salt`` splits that further), so
  clients with different keys never share; one that presents no key is private as under
  ``salt``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .generation import Job

__all__ = ["MAX_CACHE_SALT", "Isolation", "cache_salt", "isolate", "presented_key"]

Isolation = Literal["none", "salt", "api_key"]
#: characters of a request's ``cache_salt``, at most
MAX_CACHE_SALT = 256


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key a request presented (``x-api-key``, else a bearer token), if any."""
    key = headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def cache_salt(mode: Isolation, given: str | None, key: str | None) -> tuple[str | None, bool]:
    """(the salt a request's cache entries go under, whether it shares them with anyone):
    ``given`` is its ``cache_salt``, ``key`` the API key it presented."""
    if mode == "api_key" and key is not None:
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
        return (f"key:{digest}" if given is None else f"key:{digest}:{given}"), True
    if mode == "none" or given is not None:
        return (None if given is None else f"salt:{given}"), True
    return f"private:{secrets.token_hex(16)}", False


def isolate(job: Job, mode: Isolation, headers: Mapping[str, str]) -> None:
    """Put ``job`` (its ``cache_salt`` as the client gave it) in its namespace."""
    job.cache_salt, job.cache_shared = cache_salt(mode, job.cache_salt, presented_key(headers))
