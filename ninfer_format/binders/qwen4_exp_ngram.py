"""The hashed n-gram tables of Qwen4Exp's per-layer embeddings (PLE), derived from the config
exactly as transformers' ``Qwen4ExpTextNGramEmbedding`` derives them.

Each PLE layer has ``(ngram_size - 1) · heads_per_ngram`` hash heads. Head h of the p-th PLE
layer (p counts PLE layers, not decoder layers) owns a vocabulary of the
``(p · heads + h + 1)``-th prime at or above ``ngram_vocab_size_base``: every head of the model
hashes into its own prime-sized range. The heads' ranges are concatenated into one table whose
row count is rounded up to ``make_ngram_vocab_size_divisible_by``. The hash multipliers are
seeded per PLE layer with splitmix64.

transformers finds the n-th prime by trial division from the base each time; here the primes are
walked once, in order, with a Miller-Rabin test that is exact below 3.3·10^24 (far beyond the
int64 range the hash is computed in), so the sizes are the same numbers, found faster.
"""

from __future__ import annotations

import functools
import math

_MASK64 = (1 << 64) - 1
_SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
_SPLITMIX_M1 = 0xBF58476D1CE4E5B9
_SPLITMIX_M2 = 0x94D049BB133111EB
#: the seed stride between PLE layers (transformers' ``_PRIME_1``)
_LAYER_SEED_STRIDE = 10007
_INT64_MAX = (1 << 63) - 1
#: Miller-Rabin witnesses that decide primality exactly for every n < 3.3·10^24
_WITNESSES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(value: int) -> bool:
    if value < 2:
        return False
    for p in _WITNESSES:
        if value % p == 0:
            return value == p
    d, s = value - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _WITNESSES:
        x = pow(a, d, value)
        if x in (1, value - 1):
            continue
        for _ in range(s - 1):
            x = x * x % value
            if x == value - 1:
                break
        else:
            return False
    return True


@functools.lru_cache(maxsize=32)
def primes_from(base: int, count: int) -> tuple[int, ...]:
    """The first ``count`` primes at or above ``base``, ascending."""
    found: list[int] = []
    candidate = base
    while len(found) < count:
        if is_prime(candidate):
            found.append(candidate)
        candidate += 1
    return tuple(found)


def head_vocab_sizes(base: int, heads: int, ple_index: int) -> tuple[int, ...]:
    """The prime vocabulary of each hash head of the ``ple_index``-th PLE layer."""
    primes = primes_from(base, (ple_index + 1) * heads)
    return primes[ple_index * heads :]


def head_offsets(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Where each head's range starts in the layer's concatenated table."""
    return tuple(sum(sizes[:h]) for h in range(len(sizes)))


def table_rows(sizes: tuple[int, ...], divisor: int) -> int:
    """Rows of the layer's table: the heads' ranges, padded to a multiple of ``divisor``
    (transformers' float ``math.ceil`` expression, kept for identical results)."""
    return math.ceil(sum(sizes) / divisor) * divisor


def _splitmix64(value: int) -> int:
    value = (value + _SPLITMIX_GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _SPLITMIX_M1) & _MASK64
    value = ((value ^ (value >> 27)) * _SPLITMIX_M2) & _MASK64
    return (value ^ (value >> 31)) & _MASK64


def hash_multipliers(vocab: int, ngram_size: int, ple_index: int, seed: int) -> tuple[int, ...]:
    """The odd multiplier of each n-gram position (0 = the current token) of one PLE layer,
    bounded so that ``token · multiplier`` stays within int64."""
    half_bound = max(1, _INT64_MAX // max(vocab, 1) // 2)
    layer_seed = seed + _LAYER_SEED_STRIDE * ple_index
    values = (
        _splitmix64((layer_seed + _SPLITMIX_GAMMA * (position + 1)) & _MASK64)
        for position in range(ngram_size)
    )
    return tuple(2 * (v % half_bound) + 1 for v in values)
