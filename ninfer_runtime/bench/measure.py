"""The measuring half of ``ninfer-bench``: decode and prefill rates beside their floors.

Decode is memory-bound, so its floor is the bytes one step must move (every weight read
once, the routed experts' share of the MoE weights, each lane's K/V up to its context, GDN
states read and written) at the bandwidth of a device-to-device copy measured in the same
run. Prefill is compute-bound; its floor is the projections' FLOPs at the rate of a large
half-precision cuBLAS matrix product measured the same way. "% of floor" is floor time over
measured time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..models.batch import Batch, DecodeIndex
from ..models.qwen3_5.mlp import SparseMoe
from ..ops import registry
from ..runner import ModelRunner
from ..state import store_kv

#: bytes of the buffer the copy-bandwidth probe copies: well beyond the GPU's 50 MB L2, and
#: beyond a CPU's last-level cache (a 2 GiB copy on the CPU took most of a tiny CPU run)
COPY_BYTES = 2 << 30
CPU_COPY_BYTES = 128 << 20

#: per-position acceptance rates at which the speculative table gives the implied tok/s
ACCEPTANCE_RATES = (0.0, 0.5, 0.68, 0.8, 1.0)


@dataclass
class DecodeResult:
    lanes: int
    context: int
    tokens_per_s: float
    step_ms: float
    bytes_per_step: int
    floor_ms: float

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_ms / self.step_ms


def expected_tokens(rate: float, draft_tokens: int) -> float:
    """Tokens a lane gains per round when each draft is accepted with probability ``rate``
    (given the ones before it): sum of rate**j for j = 0..K."""
    return sum(rate**j for j in range(draft_tokens + 1))


@dataclass
class SpecResult:
    """A speculative round (``speculate`` + ``commit``) against a plain decode step."""

    lanes: int
    context: int
    draft_tokens: int
    step_ms: float
    round_ms: float
    bytes_per_round: int
    floor_ms: float

    @property
    def ratio(self) -> float:
        return self.round_ms / self.step_ms

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_ms / self.round_ms

    @property
    def plain_tokens_per_s(self) -> float:
        return 1e3 * self.lanes / self.step_ms

    def tokens_per_s(self, rate: float) -> float:
        """What rounds give at per-position acceptance ``rate``."""
        return 1e3 * self.lanes * expected_tokens(rate, self.draft_tokens) / self.round_ms

    def speedup(self, rate: float) -> float:
        return self.tokens_per_s(rate) / self.plain_tokens_per_s


@dataclass
class DraftStepResult:
    """One MTP draft step (block + head) scoring the proposal rows and the full vocabulary."""

    lanes: int
    context: int
    proposal_rows: int
    optimized_ms: float
    full_ms: float
    optimized_bytes: int
    full_bytes: int
    floor_bw: float

    @property
    def optimized_floor_ms(self) -> float:
        return 1e3 * self.optimized_bytes / self.floor_bw

    @property
    def full_floor_ms(self) -> float:
        return 1e3 * self.full_bytes / self.floor_bw


@dataclass
class AcceptanceResult:
    """Greedy generation of the demo prompts with rounds of K drafts and without."""

    draft_tokens: int
    prompts: int
    tokens: int
    acceptance: float
    tokens_per_round: float
    tokens_per_s: float
    plain_tokens_per_s: float
    same_tokens: bool

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s


@dataclass
class PrefillResult:
    tokens: int
    chunk: int
    tokens_per_s: float
    seconds: float
    flops: float
    floor_s: float

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_s / self.seconds


def _sync(xp: Any) -> None:
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


def _median_seconds(xp: Any, fn: Any, repeats: int = 5) -> float:
    """Median wall time of ``fn()`` with the device drained around it, after one warm-up."""
    times = []
    for _ in range(repeats + 1):
        _sync(xp)
        start = time.perf_counter()
        fn()
        _sync(xp)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def copy_bandwidth(xp: Any) -> float:
    """Bytes per second read plus written by a large device-to-device copy."""
    size = COPY_BYTES if hasattr(xp, "cuda") else CPU_COPY_BYTES
    src = xp.ones(size // 4, dtype=xp.float32)
    dst = xp.empty_like(src)

    def copy() -> None:
        dst[...] = src

    return 2 * size / _median_seconds(xp, copy)


def matmul_rate(xp: Any) -> float:
    """FLOP/s of a large float16 product on the GPU (tensor cores), float32 on the CPU."""
    gpu = hasattr(xp, "cuda")
    n, dtype = (8192, xp.float16) if gpu else (1024, xp.float32)
    a = xp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype=dtype)
    return 2 * n**3 / _median_seconds(xp, lambda: a @ a)


# -------------------------------------------------------------------------------- bytes
def weight_bytes(w: Any) -> int:
    """Stored bytes a full read of one prepared weight touches."""
    segments = getattr(w, "segments", None)
    if segments is not None:
        return sum(s.parent.data.nbytes * s.rows // s.parent.planes.rows for s in segments)
    array = getattr(w, "array", w)
    return int(array.nbytes)


def _weights_of(block: Any) -> list[Any]:
    return [v for v in vars(block).values() if hasattr(v, "shape") and len(v.shape) == 2]


def _layer_bytes(layer: Any, rows: int) -> int:
    """Weight bytes one decoder layer reads for a batch of ``rows`` rows."""
    total = sum(weight_bytes(w) for w in _weights_of(layer.mixer))
    if isinstance(layer.ffn, SparseMoe):
        m = layer.ffn.weights
        experts = len(m.experts)
        # distinct experts a batch touches, on average, with uniform routing
        touched = experts * (1 - (1 - m.top_k / experts) ** rows)
        per_expert = sum(weight_bytes(w) for w in vars(m.experts[0]).values())
        shared = sum(weight_bytes(w) for w in vars(m.shared).values())
        total += int(touched * per_expert) + shared
        total += weight_bytes(m.router) + weight_bytes(m.shared_score)
    else:
        total += sum(weight_bytes(w) for w in _weights_of(layer.ffn))
    return total


def _main_weight_bytes(model: Any, rows: int) -> int:
    """The main model's weights for ``rows`` rows: every layer, the head, embedding rows."""
    embedding_row = weight_bytes(model.token_embedding) // model.config.vocab
    layers = sum(_layer_bytes(layer, rows) for layer in model.layers)
    return weight_bytes(model.output_head) + rows * embedding_row + layers


def _context_bytes(model: Any, lanes: int, context: int, kv_dtype: str) -> int:
    """Each lane's K/V up to ``context`` tokens read, its GDN states read and written."""
    from ..state import ContextPool

    specs, _ = model.state_specs()
    per_token = ContextPool.page_bytes_of(specs, None, 1, kv_dtype)
    return lanes * (context * per_token + 2 * ContextPool.slot_bytes_of(specs))


def decode_step_bytes(
    model: Any, lanes: int, context: int, kv_dtype: str = "float32", weights: Any = None
) -> int:
    """Bytes one decode step of ``lanes`` lanes at ``context`` tokens must move. ``weights``:
    the weight bytes a step of so many rows reads (``active_bytes.ActiveWeights``, which
    reads the architecture's description); by default Qwen3.5's prepared weights."""
    read = _main_weight_bytes(model, lanes) if weights is None else weights(lanes)
    return int(read + _context_bytes(model, lanes, context, kv_dtype))


def draft_head(model: Any, optimized: bool) -> Any:
    """The head a draft step scores with: the proposal rows when asked and present."""
    if optimized and model.proposal_head is not None:
        return model.proposal_head
    return model.output_head


def draft_step_bytes(
    model: Any, lanes: int, context: int, kv_dtype: str = "float32", *, optimized: bool = True
) -> int:
    """Bytes one MTP draft step moves: the block's weights (input projection and its decoder
    layer), its K/V up to ``context`` per lane, and the head it scores with."""
    from ..state import ContextPool

    _, mtp = model.state_specs()
    block = model.mtp.block
    weights = weight_bytes(model.mtp.input_projection) + _layer_bytes(block, lanes)
    kv = lanes * context * ContextPool.page_bytes_of([], mtp, 1, kv_dtype)
    return int(weights + kv + weight_bytes(draft_head(model, optimized)))


def round_bytes(
    model: Any,
    lanes: int,
    context: int,
    draft_tokens: int,
    kv_dtype: str = "float32",
    *,
    optimized: bool = True,
) -> int:
    """Bytes one speculative round moves: K draft steps, then one verification of K+1 rows
    per lane (the main weights read once, each lane's K/V and GDN states as a decode step)."""
    rows = lanes * (draft_tokens + 1)
    verify = _main_weight_bytes(model, rows) + _context_bytes(model, lanes, context, kv_dtype)
    draft = draft_step_bytes(model, lanes, context, kv_dtype, optimized=optimized)
    return int(verify + draft_tokens * draft)


def prefill_flops(model: Any, tokens: int, past: int = 0, weights: Any = None) -> float:
    """Multiply-add FLOPs of the projections (2 per weight per token; MoE: active experts),
    plus the causal attention products, for ``tokens`` tokens read after ``past`` tokens
    already in the context (a prefix resumed from a checkpoint). ``weights``: an
    ``active_bytes.ActiveWeights``, whose count of the projections is used instead (the
    sparse attention of those architectures is not counted)."""
    if weights is not None:
        return weights.flops(tokens)
    params = 0
    for layer in model.layers:
        params += sum(int(np.prod(w.shape)) for w in _weights_of(layer.mixer))
        if isinstance(layer.ffn, SparseMoe):
            m = layer.ffn.weights
            ex = sum(int(np.prod(w.shape)) for w in vars(m.experts[0]).values())
            params += m.top_k * ex + sum(int(np.prod(w.shape)) for w in vars(m.shared).values())
        else:
            params += sum(int(np.prod(w.shape)) for w in _weights_of(layer.ffn))
    flops = 2.0 * params * tokens
    a = model.config.attention
    if a is not None:
        full = sum(1 for t in model.config.layer_types if t == "full_attention")
        # each new token attends to the past and, on average, half of the new tokens
        flops += full * 2 * 2 * a.heads * a.head_dim * tokens * (past + tokens / 2)
    return flops


# ------------------------------------------------------------------------------ timing
def _fill_random(pool: Any, xp: Any, seed: int) -> None:
    """Random K/V pages and states: timing on zeros would flatter the hardware."""
    rng = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else xp.random
    for layer in [*pool.layers, *([pool.mtp] if pool.mtp is not None else [])]:
        for name in ("k", "v", "recurrent", "conv"):
            a = getattr(layer, name, None)
            if a is not None:
                values = rng.standard_normal(a.shape, dtype=xp.float32) * xp.float32(0.05)
                a[...] = store_kv(values, a.dtype) if name in ("k", "v") else values


def decode_rate(
    runner: ModelRunner,
    lanes: int,
    context: int,
    *,
    steps: int = 32,
    warmup: int = 4,
    floor_bw: float,
    kv_dtype: str = "float32",
    weights: Any = None,
) -> DecodeResult:
    """``weights``: as ``decode_step_bytes``."""
    model, xp = runner.model, runner.backend.xp
    room = context + warmup + steps + 1
    pool = runner.new_pool(lanes=lanes, max_context=room, kv_dtype=kv_dtype)
    states = [pool.open(room) for _ in range(lanes)]
    _fill_random(pool, xp, lanes * 7919 + context)
    for s in states:
        pool.advance(s, context)  # as if a prompt of `context` tokens had been read
    rng = np.random.default_rng(0)
    vocab = model.config.vocab
    for _ in range(warmup):
        runner.forward([rng.integers(0, vocab, 1) for _ in range(lanes)], states)
    _sync(xp)
    start = time.perf_counter()
    for _ in range(steps):
        runner.forward([rng.integers(0, vocab, 1) for _ in range(lanes)], states)
    _sync(xp)
    step = (time.perf_counter() - start) / steps
    moved = decode_step_bytes(model, lanes, context, kv_dtype, weights)
    return DecodeResult(lanes, context, lanes / step, 1e3 * step, moved, 1e3 * moved / floor_bw)


def prefill_rate(
    runner: ModelRunner, tokens: int, *, chunk: int, flop_rate: float, weights: Any = None
) -> PrefillResult:
    """``weights``: as ``prefill_flops``."""
    xp = runner.backend.xp
    ids = np.random.default_rng(1).integers(0, runner.model.config.vocab, tokens)
    # warm: the same prompt once first, so every chunk size it takes (the last one's too) has
    # met its library plans and memory, as in a server that has run a while; as a served
    # prompt, logits of the last row only
    warm = runner.new_state(tokens + 1)
    runner.prefill(ids, warm, chunk=chunk, last_only=True)
    del warm
    state = runner.new_state(tokens + 1)
    _sync(xp)
    start = time.perf_counter()
    runner.prefill(ids, state, chunk=chunk, last_only=True)
    _sync(xp)
    seconds = time.perf_counter() - start
    flops = prefill_flops(runner.model, tokens, weights=weights)
    return PrefillResult(tokens, chunk, tokens / seconds, seconds, flops, flops / flop_rate)


@dataclass
class PrefillSegment:
    """Part of one long prompt's prefill: tokens ``start .. end - 1``, read after ``start``
    tokens already in the context (their attention FLOPs grow with it)."""

    start: int
    end: int
    seconds: float
    flops: float
    floor_s: float

    @property
    def tokens_per_s(self) -> float:
        return (self.end - self.start) / self.seconds

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_s / self.seconds


def long_prefill(
    runner: ModelRunner,
    tokens: int,
    *,
    chunk: int,
    flop_rate: float,
    segments: int = 8,
    kv_dtype: str = "float32",
    weights: Any = None,
) -> list[PrefillSegment]:
    """One ``tokens``-token prompt prefilled in chunks of ``chunk``, timed in ``segments``
    parts of whole chunks: where the time goes as the context grows (``weights``: as
    ``prefill_flops``)."""
    xp, model = runner.backend.xp, runner.model
    ids = np.random.default_rng(2).integers(0, model.config.vocab, tokens)
    warm = runner.new_state(min(tokens, chunk) + 1)
    runner.forward([ids[: min(tokens, chunk)]], [warm], last_only=True)  # compile, plan
    del warm
    pool = runner.new_pool(lanes=1, max_context=tokens + 1, kv_dtype=kv_dtype)
    state = pool.open(tokens + 1)
    chunks = -(-tokens // chunk)
    bounds = sorted(
        {min(tokens, chunk * round(chunks * i / segments)) for i in range(1, segments + 1)}
    )
    out, start = [], 0
    for end in bounds:
        if end <= start:
            continue
        _sync(xp)
        began = time.perf_counter()
        for a in range(start, end, chunk):
            runner.forward([ids[a : min(a + chunk, end)]], [state], last_only=True)
        _sync(xp)
        flops = prefill_flops(model, end - start, past=start, weights=weights)
        out.append(
            PrefillSegment(start, end, time.perf_counter() - began, flops, flops / flop_rate)
        )
        start = end
    return out


def profile_prefill(runner: ModelRunner, tokens: int, *, past: int = 0) -> dict[str, float]:
    """Where a prefill chunk's time goes, by ablation (as ``profile_decode``): one chunk of
    ``tokens`` tokens after ``past`` tokens of context, timed whole and with each backend op
    of the prefill path replaced by an empty output of its shape. ``host_issue``: when the
    host had issued the whole chunk (``forward`` returned; the device may still be working).
    Near ``chunk``, the chunk is bound by the host, and an op's empty output then costs the
    host about what the op did: the ablation says little."""
    xp, model = runner.backend.xp, runner.model
    ids = np.random.default_rng(3).integers(0, model.config.vocab, past + tokens)

    def chunk_times() -> tuple[float, float]:  # ms: (whole, until the host had issued it)
        state = runner.new_state(past + tokens + 1)
        if past:
            runner.prefill(ids[:past], state, chunk=tokens, last_only=True)
        _sync(xp)
        began = time.perf_counter()
        runner.forward([ids[past:]], [state], last_only=True)
        issued = time.perf_counter()
        _sync(xp)
        return 1000 * (time.perf_counter() - began), 1000 * (issued - began)

    chunk_times()  # compile, plan
    host_issue = chunk_times()[1]
    spent = _ablate(runner.backend, PREFILL_OPS, lambda: chunk_times()[0], "chunk")
    return {"chunk": spent.pop("chunk"), "host_issue": host_issue, **spent}


def as_row(result: Any) -> dict[str, Any]:
    """A result's fields and derived figures (its properties), as ``--json`` writes them."""
    derived = {
        n: getattr(result, n) for n, v in vars(type(result)).items() if isinstance(v, property)
    }
    row = {**asdict(result), **derived}
    if isinstance(result, SpecResult):
        row["tokens_per_s_at"] = {f"{a:g}": result.tokens_per_s(a) for a in ACCEPTANCE_RATES}
        row["speedup_at"] = {f"{a:g}": result.speedup(a) for a in ACCEPTANCE_RATES}
    return row


# ------------------------------------------------------------------ speculative decoding
def _speculating_pool(
    runner: ModelRunner, lanes: int, room: int, draft_tokens: int, kv_dtype: str, seed: int
) -> tuple[Any, list[Any]]:
    """A pool of ``lanes`` sequences of ``room`` tokens for rounds of ``draft_tokens``,
    random K/V, states and kept hidden rows."""
    xp = runner.backend.xp
    pool = runner.new_pool(
        lanes=lanes, max_context=room, kv_dtype=kv_dtype, draft_tokens=draft_tokens
    )
    states = [pool.open(room) for _ in range(lanes)]
    _fill_random(pool, xp, seed)
    rng = np.random.default_rng(seed)
    pool.draft_hidden[...] = xp.asarray(rng.standard_normal(pool.draft_hidden.shape), xp.float32)
    return pool, states


def spec_round_rate(
    runner: ModelRunner,
    lanes: int,
    context: int,
    draft_tokens: int,
    *,
    step_ms: float,
    floor_bw: float,
    rounds: int = 16,
    warmup: int = 3,
    kv_dtype: str = "float32",
    optimized_head: bool = True,
) -> SpecResult:
    """Median time of a round (``speculate`` then ``commit``) of ``lanes`` lanes at
    ``context`` tokens, against a plain step of ``step_ms``. Every round commits all its
    drafts (the most the commit replays) so the lanes advance by K+1 tokens a round."""
    k = draft_tokens
    room = context + (warmup + rounds + 1) * (k + 1)
    _, states = _speculating_pool(runner, lanes, room, k, kv_dtype, lanes * 7919 + context + k)
    for s in states:  # as if the prompt's `context` tokens were read, MTP entries included
        s.length, s.mtp_length, s.draft_carry = context, context - 1, []
    pending = np.random.default_rng(k).integers(0, runner.model.config.vocab, lanes)
    xp, times = runner.backend.xp, []
    for _ in range(warmup + rounds):
        _sync(xp)
        start = time.perf_counter()
        proposal = runner.speculate(states, pending, k, optimized_head=optimized_head)
        runner.commit(states, [list(d) for d in proposal.drafts])
        _sync(xp)
        times.append(time.perf_counter() - start)
        pending = proposal.targets[:, k]
    round_ms = 1e3 * float(np.median(times[warmup:]))
    moved = round_bytes(runner.model, lanes, context, k, kv_dtype, optimized=optimized_head)
    return SpecResult(lanes, context, k, step_ms, round_ms, moved, 1e3 * moved / floor_bw)


def draft_step_rate(
    runner: ModelRunner,
    lanes: int,
    context: int,
    *,
    floor_bw: float,
    repeats: int = 16,
    kv_dtype: str = "float32",
) -> DraftStepResult:
    """One MTP draft step of ``lanes`` lanes at ``context`` MTP entries (the block, then its
    most likely token), compiled as the round's steps are, scoring the proposal head's rows
    and the full vocabulary."""
    model, be = runner.model, runner.backend
    xp = be.xp
    room = context + 2
    pool, _ = _speculating_pool(runner, lanes, room, 1, kv_dtype, lanes + context)
    hidden = xp.ascontiguousarray(pool.draft_hidden[:lanes, 0])
    table = model.rope_table(room + 1)
    args = (
        np.arange(lanes, dtype=np.int32),
        np.full(lanes, context, dtype=np.int32),
        np.random.default_rng(lanes).integers(0, model.config.vocab, lanes).astype(np.int32),
    )

    def ms(optimized: bool) -> float:
        def step(slots: Any, entries: Any, ids: Any) -> Any:
            index = DecodeIndex(slots, entries, pool.page_table)
            cos, sin = (table[0][entries + 1], table[1][entries + 1]) if table else (None, None)
            x = model.mtp_hidden(hidden, ids, Batch((), cos, sin, index), pool.mtp)
            return model.propose(x, optimized=optimized)

        compiled = be.compile_step(step, [(lanes,)] * 3)
        return 1e3 * _median_seconds(xp, lambda: compiled(*args), repeats)

    rows = model.proposal_head.shape[0] if model.proposal_head is not None else 0
    return DraftStepResult(
        lanes,
        context,
        rows,
        ms(True),
        ms(False),
        draft_step_bytes(model, lanes, context, kv_dtype, optimized=True),
        draft_step_bytes(model, lanes, context, kv_dtype, optimized=False),
        floor_bw,
    )


#: the demo prompts acceptance is measured on (chat messages, greedy)
DEMO_PROMPTS = (
    "What is the capital of France?",
    "Hello!",
    "What is two plus two?",
    "Tell me a joke.",
)


def _generate_all(engine: Any, max_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy answers to the demo prompts, one at a time: their token ids and decode seconds."""
    from ..engine import Finished, GenerationRequest, TokenEvent
    from ..frontend.sampling import SamplingParams

    answers, seconds = [], 0.0
    for prompt in DEMO_PROMPTS:
        request = GenerationRequest(
            messages=[{"role": "user", "content": prompt}],
            sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        )
        ids = []
        for event in engine.generate(request):
            if isinstance(event, TokenEvent):
                ids.append(event.token_id)
            elif isinstance(event, Finished):
                seconds += event.decode_seconds
        answers.append(ids)
    return answers, seconds


def measure_acceptance(
    artifact: Any,
    backend: str,
    draft_tokens: list[int],
    *,
    max_tokens: int = 64,
    kv_dtype: str = "float32",
) -> list[AcceptanceResult]:
    """Measured acceptance and tok/s of greedy generation on ``DEMO_PROMPTS`` through an
    ``Engine`` with rounds of each K in ``draft_tokens``, against the same without."""
    from ..engine import Engine
    from ..speculative import SpecConfig

    def engine(spec: SpecConfig | None) -> Engine:
        return Engine(artifact, backend=backend, max_lanes=1, kv_dtype=kv_dtype, spec=spec)

    reference = engine(None)
    _generate_all(reference, 4)  # warm-up: compiled steps, caches
    plain, plain_s = _generate_all(reference, max_tokens)
    del reference  # its weights go before the next engine loads its own
    tokens = sum(len(a) for a in plain)
    out = []
    for k in draft_tokens:
        spec = engine(SpecConfig(draft_tokens=k))
        _generate_all(spec, 4)
        stats = spec.spec_stats
        assert stats is not None
        rounds, accepted, drafted = stats.rounds, stats.accepted, stats.drafted
        answers, seconds = _generate_all(spec, max_tokens)  # counted from here
        rounds, accepted = stats.rounds - rounds, stats.accepted - accepted
        drafted = stats.drafted - drafted
        del spec
        generated = sum(len(a) for a in answers)
        out.append(
            AcceptanceResult(
                k,
                len(DEMO_PROMPTS),
                generated,
                accepted / drafted if drafted else 0.0,
                1 + accepted / rounds if rounds else 0.0,
                generated / seconds,
                tokens / plain_s,
                answers == plain,
            )
        )
    return out


#: backend ops the profile takes out one at a time, with the shape of what each returns
PROFILED_OPS: dict[str, Any] = {
    "linear": lambda x, w, **_: (x.shape[0], w.shape[0]),
    "rms_norm": lambda x, *_, **__: x.shape,
    "gated_rms_norm": lambda x, *_, **__: x.shape,
    "rope": lambda x, *_, **__: x.shape,
    "attention_decode": lambda q, *_, **__: q.shape,
    "gdn_decode": lambda mixed, *_, value_heads, value_dim, **__: (
        mixed.shape[0],
        value_heads,
        value_dim,
    ),
    "moe": lambda _backend, x, *_, **__: x.shape,
}
#: the ops of a prefill chunk's path (products, norms, RoPE, attention over the lane's cache,
#: the GDN convolution and chunked scan, MoE)
PREFILL_OPS: dict[str, Any] = {
    "linear": PROFILED_OPS["linear"],
    "rms_norm": PROFILED_OPS["rms_norm"],
    "gated_rms_norm": PROFILED_OPS["gated_rms_norm"],
    "rope": PROFILED_OPS["rope"],
    "attention_pages": lambda q, *_, **__: q.shape,
    "gdn_prefill": lambda x, *_, value_heads, value_dim, **__: (
        x.shape[0],
        value_heads,
        value_dim,
    ),
    "moe": PROFILED_OPS["moe"],
}
#: a round's ops: a decode step's, and the verification's recurrent pair
ROUND_OPS: dict[str, Any] = {
    **PROFILED_OPS,
    "gdn_verify": PROFILED_OPS["gdn_decode"],
    "gdn_commit": lambda *_, **__: (),
}


def profile_decode(
    runner: ModelRunner, lanes: int, context: int, *, steps: int = 16
) -> dict[str, float]:
    """Where a decode step's time goes, by ablation: the step (as it really runs, CUDA graph
    replays included) is timed whole, then once with each backend op replaced by an empty
    output of the right shape; an op's share is the difference. ``rest`` is the step with
    every listed op removed (elementwise glue, embedding, K/V writes, sampling input)."""

    def step_ms() -> float:  # a runner of its own: a fresh capture with the ops as they are now
        fresh = ModelRunner(runner.model)
        return decode_rate(fresh, lanes, context, steps=steps, floor_bw=1.0).step_ms

    return _ablate(runner.backend, PROFILED_OPS, step_ms, "step")


def profile_round(
    runner: ModelRunner, lanes: int, context: int, draft_tokens: int, *, rounds: int = 8
) -> dict[str, float]:
    """``profile_decode`` for a speculative round (``speculate`` + ``commit``), with the
    verification's recurrent ops (``gdn_verify``, ``gdn_commit``) among the ablated ones."""

    def round_ms() -> float:
        fresh = ModelRunner(runner.model)
        return spec_round_rate(
            fresh, lanes, context, draft_tokens, step_ms=0.0, floor_bw=1.0, rounds=rounds
        ).round_ms

    return _ablate(runner.backend, ROUND_OPS, round_ms, "round")


#: profiled ops served by an op family rather than a backend method: (family, op)
FAMILY_OPS = {
    "attention_pages": ("attention", "prefill"),
    "attention_decode": ("attention", "decode"),
    "gdn_prefill": ("delta_rule", "prefill"),
    "gdn_decode": ("delta_rule", "decode"),
    "gdn_verify": ("delta_rule", "verify"),
    "gdn_commit": ("delta_rule", "commit"),
    "moe": ("moe", "block"),
    "rms_norm": ("norm", "rms_norm"),
    "gated_rms_norm": ("norm", "gated_rms_norm"),
}


def _ablate(be: Any, ops: dict[str, Any], measure: Any, whole: str) -> dict[str, float]:
    xp = be.xp

    def hollow(shape_of: Any) -> Any:
        return lambda *a, **k: xp.zeros(shape_of(*a, **k), dtype=xp.float32)

    @contextlib.contextmanager
    def without(names: list[str]) -> Iterator[None]:
        """The named ops replaced by empty outputs of their shapes within the block."""
        with contextlib.ExitStack() as stack:
            for name in names:
                if name in FAMILY_OPS:
                    stack.enter_context(registry.patched(*FAMILY_OPS[name], hollow(ops[name])))
                else:
                    setattr(be, name, hollow(ops[name]))
                    stack.callback(delattr, be, name)
            yield

    out = {whole: measure()}
    for name in ops:
        with without([name]):
            out[name] = out[whole] - measure()
    with without(list(ops)):
        out["rest"] = measure()
    return out
