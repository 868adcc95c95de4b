"""Shared by the CPU and GPU tests of multi-row steps: a runner's speculative rounds beside
plain decoding of the same tokens, and short prompt chunks run as one compiled step beside
prefill chunks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ninfer_runtime.backends.base import to_numpy
from ninfer_runtime.ops.delta_rule.memory import GdnSlots


def host(a: Any) -> np.ndarray:
    return np.asarray(to_numpy(a))


def gdn_layers(pool: Any) -> list[GdnSlots]:
    return [layer for layer in pool.layers if isinstance(layer, GdnSlots)]


def _two_runners(path: Path, make_backend: Callable[[], Any]) -> tuple[Any, Any]:
    """Two runners of the artifact, each on a backend of its own."""
    from ninfer_runtime.models import load_model
    from ninfer_runtime.runner import ModelRunner

    return tuple(ModelRunner(load_model(path, make_backend())) for _ in range(2))


def _state_error(pool_a: Any, states_a: list, pool_b: Any, states_b: list) -> float:
    """Max |Δ| of the GDN states (recurrent and conv) of paired sequences, relative to the
    first one's magnitude."""
    worst = 0.0
    for a, b in zip(gdn_layers(pool_a), gdn_layers(pool_b), strict=True):
        for sa, sb in zip(states_a, states_b, strict=True):
            for x, y in ((a.recurrent, b.recurrent), (a.conv, b.conv)):
                xa, xb = host(x[sa.slot]), host(y[sb.slot])
                worst = max(worst, float(np.abs(xa - xb).max() / (np.abs(xa).max() + 1e-30)))
    return worst


def speculate_against_decoding(
    path: Path, make_backend: Callable[[], Any], *, lanes: int, k: int, rounds: int, seed: int
) -> tuple[float, float, float]:
    """``rounds`` speculative rounds of ``lanes`` lanes (each accepting a random prefix of its
    drafts) beside a runner that decodes the same tokens one step at a time. -> (max |Δ| of
    the verified logits vs the decode steps', max |logit|, max |Δ| of the GDN states after
    the last commit relative to their magnitude)."""
    plain, spec = _two_runners(path, make_backend)
    rng = np.random.default_rng(seed)
    vocab = plain.model.config.vocab
    plain_pool = plain.new_pool(lanes=lanes, max_context=256)
    spec_pool = spec.new_pool(lanes=lanes, max_context=256, draft_tokens=k)
    plain_states, spec_states, pending = [], [], []
    for i in range(lanes):
        prompt = rng.integers(0, vocab, 3 + 4 * i)
        a, b = plain_pool.open(256), spec_pool.open(256)
        logits = host(plain.forward([prompt], [a]).logits[0])
        out = spec.forward([prompt], [b])
        spec.mtp_prefill(out.hidden[0], prompt[1:], b)
        plain_states.append(a)
        spec_states.append(b)
        pending.append(int(np.argmax(logits[-1])))

    err = scale = 0.0
    for _ in range(rounds):
        proposal = spec.speculate(spec_states, pending, k)
        verified = host(proposal.logits).reshape(lanes, k + 1, -1)
        kept = [int(m) for m in rng.integers(0, k + 1, lanes)]
        kept[0] = k  # every row of lane 0 is compared
        feed = [
            [pending[i], *(int(t) for t in proposal.drafts[i, : kept[i]])] for i in range(lanes)
        ]
        for j in range(k + 1):
            live = [i for i in range(lanes) if j < len(feed[i])]
            out = plain.forward([[feed[i][j]] for i in live], [plain_states[i] for i in live])
            for i, row in zip(live, out.logits, strict=True):
                row = host(row)[0]
                err = max(err, float(np.abs(row - verified[i, j]).max()))
                scale = max(scale, float(np.abs(row).max()))
                if j == kept[i]:
                    pending[i] = int(np.argmax(row))  # both runners go on with this token
        spec.commit(spec_states, [list(feed[i][1:]) for i in range(lanes)])
        for a, b in zip(plain_states, spec_states, strict=True):
            assert a.length == b.length
    return err, scale, _state_error(plain_pool, plain_states, spec_pool, spec_states)


def short_chunks_against_prefill(
    path: Path, make_backend: Callable[[], Any], *, lanes: int, tokens: int, seed: int
) -> tuple[float, float, float]:
    """Each lane's prompt as a prefill chunk, then ``tokens`` more per lane as one compiled
    multi-row step of every lane, then a decode step, beside a runner that prefills the
    same chunks (its pool runs no multi-row steps). -> (max |Δ| of the tail and decode
    logits, max |logit|, max relative |Δ| of the GDN states)."""
    plain, rows = _two_runners(path, make_backend)
    rng = np.random.default_rng(seed)
    vocab = plain.model.config.vocab
    plain_pool = plain.new_pool(lanes=lanes, max_context=256)
    rows_pool = rows.new_pool(lanes=lanes, max_context=256, step_rows=tokens)
    plain_states = [plain_pool.open(256) for _ in range(lanes)]
    rows_states = [rows_pool.open(256) for _ in range(lanes)]
    tails = [rng.integers(0, vocab, tokens) for _ in range(lanes)]
    for i in range(lanes):
        head = rng.integers(0, vocab, tokens + 1 + 5 * i)  # longer than a step: a chunk
        plain.forward([head], [plain_states[i]], last_only=True)
        rows.forward([head], [rows_states[i]], last_only=True)
    out = rows.forward(tails, rows_states)
    if not any(key[0] == "rows" for key in rows.steps.made()):
        raise AssertionError("the short chunks did not run as a compiled multi-row step")
    err = scale = 0.0
    nxt = []
    for i in range(lanes):
        expected = host(plain.forward([tails[i]], [plain_states[i]]).logits[0])
        got = host(out.logits[i])
        err = max(err, float(np.abs(got - expected).max()))
        scale = max(scale, float(np.abs(expected).max()))
        nxt.append([int(np.argmax(expected[-1]))])
    after = plain.forward(nxt, plain_states).logits, rows.forward(nxt, rows_states).logits
    for a, b in zip(*after, strict=True):
        err = max(err, float(np.abs(host(a) - host(b)).max()))
    assert [a.length for a in plain_states] == [b.length for b in rows_states]
    return err, scale, _state_error(plain_pool, plain_states, rows_pool, rows_states)
