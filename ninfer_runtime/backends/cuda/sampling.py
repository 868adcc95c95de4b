"""On-device token selection (``kernels/sampling.cu``): only token ids cross to the host.

``sample`` launches one 1024-thread block per lane (N <= 64 lanes) that applies greedy /
temperature / top_k / top_p / min_p exactly as the reference ``Sampler.probabilities`` does and
draws by Gumbel-max from a counter-based hash of (seed, counter, token id), so a seeded lane
reproduces its tokens whatever else is in the batch (not the host sampler's tokens: the random
streams differ). Every parameter lives in device memory and the launcher never synchronises,
so the launch can be captured in a CUDA graph; ``DeviceSampler`` owns those arrays.

Penalties stay on the host: ``supports(params)`` is False for a lane that needs them.

``score`` gives log-probabilities the same way: one block a row, two passes over it, and only
the asked-for numbers cross to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...lane_limits import MAX_LANES
from .compile import function, register_family

if TYPE_CHECKING:  # the request's parameters, read here, never built
    from ...frontend.sampling_params import SamplingParams

__all__ = ["MAX_LANES", "MAX_SCORED_TOP", "THREADS", "DeviceSampler", "sample", "score", "supports"]

#: must match SAMPLE_THREADS in kernels/sampling.cu
THREADS = 1024
_MASK64 = (1 << 64) - 1

#: must match SCORE_MAX_TOP in kernels/sampling.cu
MAX_SCORED_TOP = 20

register_family("sampling", ["sample_tokens", "score_tokens"])

#: the parameter block, MAX_LANES entries of each, in this order: name -> dtype
_FIELDS: dict[str, type] = {
    "seeds": np.uint64,
    "counters": np.uint64,
    "top_p": np.float64,
    "min_p": np.float64,
    "temperature": np.float32,
    "top_k": np.int32,
}
#: name -> (byte offset, dtype) in the block; every offset stays 8-byte aligned
_LAYOUT: dict[str, tuple[int, type]] = {}
_BYTES = 0
for _name, _dtype in _FIELDS.items():
    _LAYOUT[_name] = (_BYTES, _dtype)
    _BYTES += MAX_LANES * np.dtype(_dtype).itemsize


def supports(params: SamplingParams) -> bool:
    """Whether the device sampler can take this lane (penalties need the host sampler)."""
    return (
        params.presence_penalty == 0.0
        and params.frequency_penalty == 0.0
        and params.repetition_penalty == 1.0
    )


def sample(
    logits: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    seeds: Any,
    counters: Any,
    out: Any,
) -> Any:
    """``out[i]`` = the token drawn for row i of ``logits`` (float32 ``[N, V]``, rows may be
    strided, unit column stride) with lane i's parameters: float32 ``temperature`` (<= 0:
    greedy), int32 ``top_k`` (0: off), float64 ``top_p`` (1: off), float64 ``min_p`` (0: off),
    uint64 ``seeds`` and ``counters`` (device arrays of at least N). ``out``: int32 ``[N]``;
    -1 marks a row without a finite logit. Returns ``out``; never synchronises."""
    n, vocab = logits.shape
    if not 0 < n <= MAX_LANES:
        raise ValueError(f"sample: {n} lanes (1..{MAX_LANES} supported)")
    if logits.dtype != np.float32 or logits.strides[1] != 4:
        raise ValueError("sample: logits must be float32 with unit column stride")
    function("sampling", "sample_tokens")(
        (n,),
        (THREADS,),
        (
            logits,
            np.int64(logits.strides[0] // 4),
            np.int32(vocab),
            temperature,
            top_k,
            top_p,
            min_p,
            seeds,
            counters,
            out,
        ),
    )
    return out


def score(logits: Any, chosen: Sequence[int] | Any, k: int) -> np.ndarray:
    """float64 ``[N, 1 + 2k]`` on the host: per row of ``logits`` (float32 ``[N, V]``, rows
    may be strided, unit column stride) the log-probability of token ``chosen[i]``, those of
    the row's ``k`` most likely tokens (largest first, ties lowest id first) and their ids,
    as ``ninfer_runtime.logprobs.log_softmax`` defines them (the normaliser summed in
    float64). ``k`` <= ``MAX_SCORED_TOP``. ``chosen``: host ids, or an integer CuPy array
    (the sampler's, unread: an id outside the vocabulary scores NaN)."""
    import cupy as cp

    n, vocab = logits.shape
    if not 0 <= k <= MAX_SCORED_TOP:
        raise ValueError(f"score: k = {k} (0..{MAX_SCORED_TOP} supported)")
    if logits.dtype != np.float32 or logits.strides[1] != 4:
        raise ValueError("score: logits must be float32 with unit column stride")
    if isinstance(chosen, cp.ndarray):
        ids = chosen.astype(cp.int32, copy=False)
        if ids.shape != (n,):
            raise ValueError(f"score: {n} rows need {n} token ids, not {ids.shape}")
    else:
        host = np.asarray(chosen, dtype=np.int64)
        if host.shape != (n,) or (n and not (host.min() >= 0 and host.max() < vocab)):
            raise ValueError(f"score: {n} rows need {n} token ids in 0..{vocab - 1}")
        ids = cp.asarray(host.astype(np.int32))
    out = cp.empty((n, 1 + 2 * k), cp.float64)
    if n:
        function("sampling", "score_tokens")(
            (n,),
            (THREADS,),
            (
                logits,
                np.int64(logits.strides[0] // 4),
                np.int32(vocab),
                ids,
                np.int32(k),
                out,
            ),
        )
    return out.get()


class DeviceSampler:
    """Device-resident parameters for up to ``MAX_LANES`` lanes and the output ids.

    ``set_lanes`` (host side, outside graph capture) writes every lane of a step and uploads
    the whole parameter block in one copy (``set_lane``: one lane, one copy);
    ``sample`` only launches, so it can be captured and the graph replayed after later
    ``set_lanes`` / ``advance`` calls. A lane never set samples at temperature 1 with no
    filters, seed 0, counter 0.
    """

    def __init__(self) -> None:
        import cupy as cp

        self._host = np.zeros(_BYTES, np.uint8)
        self._device = cp.zeros(_BYTES, cp.uint8)
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, Any] = {}
        for name, (offset, dtype) in _LAYOUT.items():
            size = MAX_LANES * np.dtype(dtype).itemsize
            self.host[name] = self._host[offset : offset + size].view(dtype)
            self.device[name] = self._device[offset : offset + size].view(dtype)
        self.host["temperature"][:] = 1.0
        self.host["top_p"][:] = 1.0
        self._device.set(self._host)
        self.out = cp.zeros(MAX_LANES, cp.int32)

    supports = staticmethod(supports)

    def set_lanes(self, lanes: Sequence[tuple[SamplingParams, int, int]]) -> None:
        """Lane i samples with ``lanes[i] = (params, seed, counter)``, all lanes uploaded in
        one copy; lanes past ``len(lanes)`` keep what they had."""
        if len(lanes) > MAX_LANES:
            raise IndexError(f"{len(lanes)} lanes (at most {MAX_LANES})")
        if not all(supports(params) for params, _, _ in lanes):
            raise ValueError("penalties are applied by the host sampler, not DeviceSampler")
        for i, (params, seed, counter) in enumerate(lanes):
            self._write(i, params, seed, counter)
        self._device.set(self._host)

    def set_lane(self, i: int, params: SamplingParams, seed: int, counter: int) -> None:
        """Lane ``i`` samples with ``params`` from the stream (seed, counter); a request
        without a seed gets a random one from the caller. Seeds are taken modulo 2^64."""
        self._write(i, params, seed, counter)
        self._device.set(self._host)

    def _write(self, i: int, params: SamplingParams, seed: int, counter: int) -> None:
        if not 0 <= i < MAX_LANES:
            raise IndexError(f"lane {i} out of range 0..{MAX_LANES - 1}")
        if not supports(params):
            raise ValueError("penalties are applied by the host sampler, not DeviceSampler")
        h = self.host
        h["temperature"][i] = params.temperature
        h["top_k"][i] = min(params.top_k, np.iinfo(np.int32).max)
        h["top_p"][i] = params.top_p
        h["min_p"][i] = params.min_p
        h["seeds"][i] = seed & _MASK64
        h["counters"][i] = counter & _MASK64

    def advance(self, lanes: int = MAX_LANES) -> None:
        """Counter += 1 on the first ``lanes`` lanes (one upload): the next token's stream."""
        self.host["counters"][:lanes] += np.uint64(1)
        self._device.set(self._host)

    def sample(self, logits: Any) -> Any:
        """int32 ``[N]`` token ids for the N rows of ``logits`` (a view of ``self.out``,
        overwritten by the next call)."""
        n = logits.shape[0]
        d = self.device
        out = self.out[:n]
        return sample(
            logits,
            d["temperature"],
            d["top_k"],
            d["top_p"],
            d["min_p"],
            d["seeds"],
            d["counters"],
            out,
        )
