"""Speculative decoding with the MTP drafter on the CPU reference: exact.

* runner: a verified row's logits equal a plain one-token decode step's, and after every
  commit the GDN states equal plain decoding's, bit for bit;
* engine: greedy output with ``spec`` equals greedy output without it, token for token,
  whatever the drafts (an oracle drafter makes rounds accept long prefixes, so EOS, stop
  strings, stop tokens and max_tokens land inside rounds);
* the sampling rule keeps the target's distribution (chi-square).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_convert.pipeline import convert
from ninfer_runtime.engine import Engine, Finished, GenerationRequest, OutputEvent, TokenEvent
from ninfer_runtime.errors import EngineError
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.models import load_model
from ninfer_runtime.ops.delta_rule.memory import GdnSlots
from ninfer_runtime.runner import ModelRunner
from ninfer_runtime.speculative import SpecConfig, accept_draft, accept_greedy
from tests.tiny_checkpoints import build


@pytest.fixture(scope="module")
def bundled(bundled_bf16: Path) -> Path:
    return bundled_bf16


# ------------------------------------------------------------------------------- runner
def _prefilled(runner: ModelRunner, pool, prompt: np.ndarray, *, drafter: bool):
    state = pool.open(pool.max_context)
    out = runner.forward([prompt], [state])
    if drafter:
        runner.mtp_prefill(out.hidden[0], prompt[1:], state)
    return state, int(np.argmax(out.logits[0][-1]))


@pytest.mark.parametrize(("kind", "k", "lanes"), [("dense", 1, 1), ("dense", 5, 3), ("moe", 3, 8)])
def test_rounds_match_plain_decoding_bit_for_bit(artifact_path, kind, k, lanes) -> None:
    """Random accepted prefixes, including none and all: every verified row equals a plain
    decode step of the same token, and every GDN state equals plain decoding's."""
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", kind)))
    pool = runner.new_pool(lanes=2 * lanes, max_context=96, draft_tokens=k)
    rng = np.random.default_rng(k)
    vocab = runner.model.config.vocab
    spec, plain, pending = [], [], []
    for i in range(lanes):
        prompt = rng.integers(0, vocab, 2 + 5 * i)
        s, first = _prefilled(runner, pool, prompt, drafter=True)
        p, _ = _prefilled(runner, pool, prompt, drafter=False)
        spec.append(s), plain.append(p), pending.append(first)
    gdn = [layer for layer in pool.layers if isinstance(layer, GdnSlots)]
    for _ in range(6):
        proposal = runner.speculate(spec, pending, k)
        verified = np.asarray(proposal.logits).reshape(lanes, k + 1, -1)
        accepted = [list(d[: rng.integers(0, k + 1)]) for d in proposal.drafts]
        runner.commit(spec, accepted)
        for i, state in enumerate(plain):
            for j, token in enumerate([pending[i], *accepted[i]]):
                row = runner.forward([np.array([token])], [state]).logits[0][-1]
                assert np.array_equal(row, verified[i, j])
                assert proposal.targets[i, j] == np.argmax(row)
            pending[i] = int(proposal.targets[i, len(accepted[i])])
        for layer in gdn:
            for s, p in zip(spec, plain, strict=True):
                assert np.array_equal(layer.recurrent[s.slot], layer.recurrent[p.slot])
                assert np.array_equal(layer.conv[s.slot], layer.conv[p.slot])
        assert [s.length for s in spec] == [p.length for p in plain]


def test_speculate_checks_its_lanes(artifact_path) -> None:
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", "dense")))
    pool = runner.new_pool(lanes=2, max_context=16, draft_tokens=2)
    state, first = _prefilled(runner, pool, np.array([3, 4, 5]), drafter=False)
    with pytest.raises(EngineError, match=r"out of step.*mtp_prefill"):
        runner.speculate([state], [first], 2)
    with pytest.raises(EngineError, match="not made for 4 drafts"):
        runner.speculate([state], [first], 4)
    plain_pool = runner.new_pool(lanes=1, max_context=16)
    with pytest.raises(EngineError, match="without draft_tokens"):
        runner.mtp_prefill(
            np.zeros((1, runner.model.config.hidden), np.float32), [], plain_pool.open(16)
        )


# ------------------------------------------------------------------------------- engine
class OracleDrafter:
    """Drafts the plain run's own next tokens, a share of them made wrong on purpose, so
    rounds accept long prefixes and reject at every position. It stands in for the
    model's ``propose``, which a round calls once per draft position."""

    def __init__(self, engine: Engine, expected: dict[str, list[int]], accuracy: float):
        self.engine, self.expected, self.accuracy = engine, expected, accuracy
        self.rng = np.random.default_rng(0)
        self.columns: list[np.ndarray] = []
        model, runner = engine.model, engine.runner
        speculate = runner.speculate

        def drafted(hidden, *, optimized=True):
            return np.asarray(self.columns.pop(0), dtype=np.int64)

        def planned(states, pending, k, **kw):
            by_state = {id(a.state): a for a in engine.scheduler.active.values()}
            rows = []
            for state in states:
                a = by_state[id(state)]
                ahead = self.expected[a.request.request_id][len(a.generated) :][:k]
                ahead = ahead + [0] * (k - len(ahead))
                wrong = self.rng.random(k) > self.accuracy
                vocab = model.config.vocab
                rows.append(
                    [(t + 1) % vocab if w else t for t, w in zip(ahead, wrong, strict=True)]
                )
            self.columns = list(np.asarray(rows).T)
            return speculate(states, pending, k, **kw)

        model.propose = drafted
        runner.speculate = planned


def _run(engine: Engine, prompts, **sampling) -> dict[str, tuple[list[int], str, Finished]]:
    ids = {}
    for prompt in prompts:
        params = SamplingParams(**{"temperature": 0.0, **sampling})
        request = GenerationRequest(prompt_ids=prompt, sampling=params, parse_output=False)
        ids[engine.submit(request)] = ([], [], None)
    while engine.has_work:
        for event in engine.step():
            tokens, text, _ = ids[event.request_id]
            if isinstance(event, TokenEvent):
                tokens.append(event.token_id)
            elif isinstance(event, OutputEvent):
                text.append(event.event.text)
            elif isinstance(event, Finished):
                ids[event.request_id] = (tokens, text, event)
    return {rid: (t, "".join(x), f) for rid, (t, x, f) in ids.items()}


def _same_outputs(artifact: Path, prompts, k: int, accuracy: float, **sampling):
    plain = _run(Engine(artifact, max_lanes=8, max_context=192), prompts, **sampling)
    engine = Engine(artifact, max_lanes=8, max_context=192, spec=SpecConfig(draft_tokens=k))
    expected = {}
    OracleDrafter(engine, expected, accuracy)
    # the oracle reads the plain run's tokens under the spec run's request ids
    plain_ids = [plain[rid][0] for rid in plain]
    original = engine.submit

    def submit(request, **kw):
        rid = original(request, **kw)
        expected[rid] = plain_ids[len(expected)]
        return rid

    engine.submit = submit
    spec = _run(engine, prompts, **sampling)
    for a, b in zip(plain.values(), spec.values(), strict=True):
        assert a[0] == b[0]  # token ids
        assert a[1] == b[1]  # text
        assert (a[2].reason, a[2].stop) == (b[2].reason, b[2].stop)
        assert b[2].usage.accepted_draft_tokens + b[2].usage.rejected_draft_tokens > 0
    return engine, plain


def _prompts(lanes: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 400, 1 + 7 * i).tolist() for i in range(lanes)]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_output_is_unchanged_dense(artifact_path, k) -> None:
    engine, _ = _same_outputs(
        artifact_path("qwen3_5_bf16", "dense"), _prompts(8), k, 0.75,
        max_tokens=128, ignore_eos=True,
    )  # fmt: skip
    stats = engine.spec_stats
    assert 0.3 < stats.acceptance_rate < 0.95  # long prefixes accepted, and rejections
    assert stats.accepted_per_position[-1] > 0  # some rounds kept every draft
    assert stats.drafted == stats.rounds * k


@pytest.mark.parametrize("k", [2, 5])
def test_greedy_output_is_unchanged_moe(artifact_path, k) -> None:
    _same_outputs(
        artifact_path("qwen3_5_bf16", "moe"), _prompts(5, seed=1), k, 0.8,
        max_tokens=61, ignore_eos=True,
    )  # fmt: skip


def test_stops_land_inside_rounds(artifact_path) -> None:
    """EOS (not ignored), a stop token and a stop string taken from the plain output's
    middle, and max_tokens that is no multiple of the round: both runs end identically."""
    art = artifact_path("qwen3_5_bf16", "dense")
    prompts = _prompts(3, seed=2)
    free = _run(Engine(art, max_context=192), prompts, max_tokens=90, ignore_eos=True)
    tokens, text, _ = next(iter(free.values()))
    _same_outputs(art, prompts, 4, 0.9, max_tokens=90, stop_token_ids=[tokens[37]])
    _same_outputs(art, prompts, 3, 0.9, max_tokens=90, stop=[text[50:53]], ignore_eos=True)
    _same_outputs(art, prompts, 5, 0.9, max_tokens=47)


def test_bundled_model_greedy_output_is_unchanged(bundled) -> None:
    """The bundled model's own drafter, every K: the chat answers equal plain decoding's."""
    questions = ["What is the capital of France?", "Tell me a joke.", "Hello!"]
    requests = [
        GenerationRequest(
            messages=[{"role": "user", "content": q}], sampling=SamplingParams(temperature=0.0)
        )
        for q in questions
    ]

    def answers(spec):
        engine = Engine(bundled, max_context=256, spec=spec)
        out = []
        for request in requests:
            out.append([e.token_id for e in engine.generate(request) if isinstance(e, TokenEvent)])
        return out, engine

    plain, _ = answers(None)
    for k in range(1, 6):
        got, engine = answers(SpecConfig(draft_tokens=k))
        assert got == plain
        assert engine.spec_stats.rounds > 0


def test_sampled_requests_are_reproducible_with_a_seed(artifact_path) -> None:
    art = artifact_path("qwen3_5_bf16", "dense")
    engine = Engine(art, max_context=128, spec=SpecConfig(draft_tokens=3))
    params = dict(temperature=0.8, top_p=0.9, repetition_penalty=1.2, seed=7, max_tokens=40)
    a = _run(engine, _prompts(2), **params)
    b = _run(engine, _prompts(2), **params)
    assert [v[0] for v in a.values()] == [v[0] for v in b.values()]
    assert all(len(v[0]) == 40 for v in a.values())


# ------------------------------------------------------------------------- the rules
def test_accept_greedy() -> None:
    assert accept_greedy([4, 5, 6], [4, 5, 9, 1]) == [4, 5, 9]
    assert accept_greedy([4, 5, 6], [4, 5, 6, 1]) == [4, 5, 6, 1]
    assert accept_greedy([4, 5, 6], [7, 5, 6, 1]) == [7]


def _chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


#: the chi-square distribution's 0.999 quantile by degrees of freedom
CHI2_QUANTILE_999 = {5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124, 9: 27.877}
CHI2_5DOF_999 = CHI2_QUANTILE_999[5]


def test_the_sampling_rule_keeps_the_target_distribution() -> None:
    """Draft x ~ q, then accept or resample: the kept token is distributed as p (chi-square
    over 6 tokens, 40,000 trials), for a q unlike p and for the drafter's point mass."""
    p = np.array([0.30, 0.05, 0.25, 0.10, 0.20, 0.10])
    rng = np.random.default_rng(0)
    for q in (np.array([0.05, 0.40, 0.05, 0.30, 0.10, 0.10]), np.eye(6)[2]):
        drafts = rng.choice(6, size=40_000, p=q)
        counts = np.zeros(6)
        for x in drafts:
            replaced = accept_draft(p, q, int(x), rng)
            counts[int(x) if replaced is None else replaced] += 1
        assert _chi_square(counts, p) < CHI2_5DOF_999
        # keeping every draft would give q, which the test tells apart from p
        assert _chi_square(np.bincount(drafts, minlength=6).astype(float), p) > 100 * CHI2_5DOF_999


def test_sampled_rounds_keep_the_distribution() -> None:
    """The rule as a round applies it, with temperature, top-k and a repetition penalty:
    the kept first token follows the plain sampler's distribution at that position, and
    the second (when the first draft was kept) the distribution after it, the penalty
    counting the kept draft."""
    from ninfer_runtime.frontend.sampling import Sampler
    from ninfer_runtime.speculative import accept_sampled

    rng = np.random.default_rng(4)
    rows = rng.normal(1.0, 0.7, (3, 9)).astype(np.float32)  # a round of K = 2 over 9 tokens
    prompt = [8]
    fields = dict(temperature=1.3, top_k=7, repetition_penalty=3.0)
    plain = Sampler(SamplingParams(**fields), prompt)
    ids0, p0 = plain.probabilities(rows[0])
    # drafts: the most likely first token (then a candidate after it, where the penalty for
    # having drafted it matters), and an unlikely second one
    draft = [int(ids0[np.argmax(p0)]), int(ids0[np.argmin(p0)])]
    rows[1, draft[0]] = rows[1].max() + 0.5
    ids1, p1 = plain.probabilities(rows[1], extra=draft[:1])
    first, second = np.zeros(len(ids0)), np.zeros(len(ids1))
    for seed in range(8000):
        kept = accept_sampled(Sampler(SamplingParams(seed=seed, **fields), prompt), draft, rows)
        first[list(ids0).index(kept[0])] += 1
        if kept[0] == draft[0]:
            second[list(ids1).index(kept[1])] += 1
    assert second.sum() > 1000
    assert _chi_square(first, p0) < CHI2_QUANTILE_999[len(ids0) - 1]
    assert _chi_square(second, p1) < CHI2_QUANTILE_999[len(ids1) - 1]


# ------------------------------------------------------------------------------ errors
def test_an_artifact_without_mtp_is_refused(tmp_path) -> None:
    source = build(tmp_path / "ck", mtp=False)
    art = tmp_path / "no-mtp.ninfer"
    convert("qwen3_5_bf16", {"base": str(source)}, art)
    with pytest.raises(EngineError, match=r"no-mtp.ninfer: the artifact has no mtp component"):
        Engine(art, spec=SpecConfig())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": "dflash"}, "'dflash' is not available yet"),
        ({"method": "eagle"}, "expected 'mtp' or 'off'"),
        ({"draft_tokens": 6}, "1..5"),
        ({"draft_tokens": 0}, "1..5"),
        ({"proposal_head": "tiny"}, "'optimized' or 'full'"),
    ],
)
def test_bad_settings(fields, message) -> None:
    with pytest.raises(EngineError, match=message):
        SpecConfig(**fields)
