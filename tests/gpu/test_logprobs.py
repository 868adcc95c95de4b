"""Log-probabilities on the CUDA backend against the CPU reference.

* ``token_logprobs`` on CuPy rows (the scoring kernel up to 20 tops, the general path
  beyond): the same top ids as on numpy (ties lowest id first) and values within float32
  summation-order rounding (1e-5), the vocabulary of the 27B and a grammar-masked row too;
* the engine on the bundled model (default settings: bf16 prefill products, CUDA graphs):
  prompt and generated tokens' log-probabilities within ``TOL`` + ``RTOL``·|value| of the
  CPU engine's, the same top-1 wherever the CPU's top two are further apart than ``TOL``; a
  lane scored on the device beside one asking for none (only the asking lane's rows are
  read), and a lane with a penalty (scored from the row the host sampler copies);
* speculative rounds (greedy: scored on the verified rows where they are) report within
  that bound of plain CUDA decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.logprobs import log_softmax, token_logprobs
from tests.bundled import BUNDLED

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

#: |Δ| of a log-probability between the backends: ``TOL`` plus ``RTOL`` of its size. The GPU
#: rounds activations, and in prefill attention q, k, v and the probabilities, to bf16 (unit
#: roundoff 2^-9 a rounding); a log-probability of -16 is a logit gap of 16 to the row's
#: top built through those roundings, so its error grows with it. With bf16 prefill attention
#: one H100 run measured 0.104 on a prompt position (55f6b41); since the products also take
#: x in bf16 (the production precision of issue 41), 0.270 (b92e5c0, H100: -4.80 against the
#: CPU's -5.07; 0.174 with NINFER_CUDA_PREFILL=float32, so about a third of it is the
#: prefill products' rounding), while generated tokens stay within 5e-3. The bound keeps a
#: quarter in hand; an error of position (a row's scores given to its neighbour) costs nats
TOL, RTOL = 0.30, 0.01
TEXT = (
    "The capital of France is Paris. The capital of Italy is Rome. "
    "A tiny model answers tiny questions, and the fox jumps over the lazy dog again."
)


@pytest.mark.parametrize("vocab", [50, 1000, 248_320])
def test_the_helper_on_the_device_equals_numpy(vocab: int) -> None:
    import cupy as cp

    rng = np.random.default_rng(vocab)
    rows = (rng.standard_normal((8, vocab)) * 3).astype(np.float32)
    rows[1, rng.choice(vocab, 6, replace=False)] = rows[1].max()  # tied best tokens
    rows[2, :] = 0.5  # all tied
    chosen = rng.integers(0, vocab, 8).tolist()
    tops = [0, 1, 5, 20, 20, 3, 7, 20]
    expected = token_logprobs(rows, chosen, tops)
    padded = cp.asarray(np.pad(rows, ((0, 0), (1, 2))))[:, 1 : vocab + 1]  # strided rows
    got = token_logprobs(padded, chosen, tops)
    for e, g in zip(expected, got, strict=True):
        assert [t for t, _ in g.top] == [t for t, _ in e.top]
        np.testing.assert_allclose([v for _, v in g.top], [v for _, v in e.top], atol=1e-5)
        assert abs(g.logprob - e.logprob) < 1e-5
    # the ids as the device sampler leaves them (int32 on the device, unread): the same;
    # its -1 (a row without a finite logit) scores NaN, not a read before the row
    assert token_logprobs(padded, cp.asarray(chosen, dtype=cp.int32), tops) == got
    unread = cp.asarray([-1, *chosen[1:]], dtype=cp.int32)
    assert np.isnan(token_logprobs(padded, unread, tops)[0].logprob)
    reference = log_softmax(rows.astype(np.float64))
    assert abs(got[3].logprob - reference[3, chosen[3]]) < 1e-5
    assert [t for t, _ in got[2].top] == [0, 1, 2, 3, 4][: tops[2]]


def test_masked_rows_and_more_than_twenty_tops_on_the_device() -> None:
    """A grammar's mask (most of the row -inf) through the kernel, and 25 tops (beyond the
    kernel's 20: the general path) on the device: both as on numpy."""
    import cupy as cp

    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((3, 5000)) * 2).astype(np.float32)
    rows[0, rng.choice(5000, 4950, replace=False)] = -np.inf
    chosen = [int(np.flatnonzero(np.isfinite(rows[0]))[0]), 7, 4999]
    for tops in ([20, 20, 0], [25, 1, 25]):
        expected = token_logprobs(rows, chosen, tops)
        got = token_logprobs(cp.asarray(rows), chosen, tops)
        for e, g in zip(expected, got, strict=True):
            assert [t for t, _ in g.top] == [t for t, _ in e.top]
            np.testing.assert_allclose([v for _, v in g.top], [v for _, v in e.top], atol=1e-5)
            assert abs(g.logprob - e.logprob) < 1e-5


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("logprobs_bundled") / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, out)
    return out


def scored_run(engine: Any, prompt: list[int], samplings: list[dict]) -> list[dict]:
    """Requests in flight together; per request its PromptLogprobs event (or None) and its
    token events."""
    from ninfer_runtime.engine import (
        Failed,
        Finished,
        GenerationRequest,
        PromptLogprobs,
        TokenEvent,
    )
    from ninfer_runtime.frontend import SamplingParams

    out: dict[str, dict] = {}
    for fields in samplings:
        params = SamplingParams(**{"max_tokens": 24, "ignore_eos": True, **fields})
        rid = engine.submit(GenerationRequest(prompt_ids=prompt, sampling=params))
        out[rid] = {"prompt": None, "tokens": []}
    done = 0
    while done < len(samplings):
        for event in engine.step():
            assert not isinstance(event, Failed), event
            if isinstance(event, PromptLogprobs):
                out[event.request_id]["prompt"] = event
            elif isinstance(event, TokenEvent):
                out[event.request_id]["tokens"].append(event)
            elif isinstance(event, Finished):
                done += 1
    return list(out.values())


def compare(
    got: list[tuple[float, Any]], ref: list[tuple[float, Any]], case: str, what: str
) -> None:
    """(logprob, top) pairs position by position: within TOL + RTOL·|value|, the same top-1
    unless the reference's top two are within TOL of each other."""
    worst, excess, ties = 0.0, (0.0, 0, 0.0, 0.0), 0
    for position, ((g, g_top), (r, r_top)) in enumerate(zip(got, ref, strict=True)):
        assert len(g_top) == len(r_top)
        for gv, rv in [(g, r), *((gv, rv) for (_, gv), (_, rv) in zip(g_top, r_top, strict=True))]:
            worst = max(worst, abs(gv - rv))
            excess = max(excess, (abs(gv - rv) / (TOL + RTOL * abs(rv)), position, gv, rv))
        if len(r_top) > 1 and r_top[0][1] - r_top[1][1] < TOL:
            ties += 1
        else:
            assert g_top[0][0] == r_top[0][0], f"{what}: top-1 {g_top[0]} vs {r_top[0]}"
    ratio, position, gv, rv = excess
    assert ratio < 1, f"{what}: position {position}: {gv:.4f} vs {rv:.4f} ({ratio:.2f} of bound)"
    REPORT.append((case, f"{what} max |Δ|, of bound (ties)", f"{worst:.2e}, {ratio:.2f} ({ties})"))


def generated(run: dict, upto: int) -> list[tuple[float, Any]]:
    return [(e.logprob, e.top_logprobs) for e in run["tokens"][:upto]]


def same_prefix(a: dict, b: dict) -> int:
    ids = [[e.token_id for e in r["tokens"]] for r in (a, b)]
    return next((i for i, (x, y) in enumerate(zip(*ids, strict=False)) if x != y), len(ids[0]))


def test_the_engine_on_cuda_matches_the_cpu(artifact: Path) -> None:
    from ninfer_runtime.engine import Engine

    samplings = [
        {"temperature": 0.0, "logprobs": 5, "prompt_logprobs": 5},  # scored on the device
        {"temperature": 0.0},  # asks for none, in the same steps
        {"temperature": 0.0, "logprobs": 3, "repetition_penalty": 1.3},  # the host sampler
    ]
    cpu = Engine(artifact, max_context=256)
    prompt = cpu.tokenizer.encode(TEXT)
    expected = [scored_run(cpu, prompt, [s])[0] for s in samplings]
    got = scored_run(Engine(artifact, backend="cuda", max_context=256), prompt, samplings)
    ref_prompt, got_prompt = expected[0]["prompt"], got[0]["prompt"]
    assert got_prompt.token_ids == tuple(prompt) and got_prompt.logprobs[0] is None
    compare(
        list(zip(got_prompt.logprobs[1:], got_prompt.top_logprobs[1:], strict=True)),
        list(zip(ref_prompt.logprobs[1:], ref_prompt.top_logprobs[1:], strict=True)),
        "logprobs cuda vs cpu",
        "prompt",
    )
    assert got[1]["prompt"] is None
    assert all(e.logprob is None and e.top_logprobs is None for e in got[1]["tokens"])
    for i, what in ((0, "generated (device)"), (2, "generated (host, penalty)")):
        n = same_prefix(got[i], expected[i])
        assert n >= 4, f"{what}: the backends' tokens part after {n}"
        compare(generated(got[i], n), generated(expected[i], n), "logprobs cuda vs cpu", what)


def test_speculative_rounds_report_what_plain_decoding_does(artifact: Path) -> None:
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.speculative import SpecConfig

    sampling = {"temperature": 0.0, "logprobs": 4}
    kw = dict(backend="cuda", max_context=256)
    plain_engine = Engine(artifact, **kw)
    prompt = plain_engine.tokenizer.encode(TEXT)
    (plain,) = scored_run(plain_engine, prompt, [sampling])
    spec_engine = Engine(artifact, spec=SpecConfig(draft_tokens=3), **kw)
    (spec,) = scored_run(spec_engine, prompt, [sampling])
    assert spec_engine.spec_stats.accepted > 0
    n = same_prefix(spec, plain)
    assert n >= 4
    compare(generated(spec, n), generated(plain, n), "logprobs cuda spec vs plain", "generated")
