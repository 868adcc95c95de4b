"""PLE's n-gram tables read row by row from the artifact (``ple_rows="streamed"``) on the tiny
Qwen4Exp checkpoint, converted lossless (bf16 tables) and with NF4 tables (in a set of small
files, so rows are read across file boundaries): the logits equal
the resident tables' exactly; a prompt reads exactly the stored bytes of the distinct rows its
n-grams hash to (hashed here independently, in plain Python), in one range per run of
adjacent rows and plane; a decode step and a prefix-cache hit read only the new tokens' rows;
the row cache never holds more than its capacity."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.engine import Engine
from ninfer_runtime.errors import ModelError
from ninfer_runtime.models import load_model
from ninfer_runtime.models.qwen4_exp import ple_rows
from ninfer_runtime.row_cache import RowCache
from ninfer_runtime.runner import ModelRunner
from tests.runtime.test_prefix_cache import _serve

tiny = pytest.importorskip("tests.tiny_qwen4_exp")
pytest.importorskip("torch")

NF4 = "nf4_g64_fp16"
STREAMED = {"ple_rows": "streamed"}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, torch_threads) -> dict[str, Path]:
    from ninfer_convert.pipeline import convert
    from ninfer_convert.recipes import qwen4_exp_bf16

    root = tmp_path_factory.mktemp("qwen4_exp_ple_rows")
    checkpoint = tiny.build(root / "checkpoint", mtp=False)
    nf4 = qwen4_exp_bf16.build()
    nf4.assign("text/layers/*/ple/ngram_table", format=NF4)
    out = {"bf16": root / "bf16.ninfer", NF4: root / "nf4.ninfer"}
    convert("qwen4_exp_bf16", {"base": str(checkpoint)}, out["bf16"])
    # files of 64 KiB: each NF4 table straddles two files of the set
    convert(nf4, {"base": str(checkpoint)}, out[NF4], shard_limit=1 << 16)
    return out


def _row_bytes(table_format: str, columns: int) -> int:
    """Stored bytes of one table row: bf16 words, or NF4 codes (the row padded to 128
    columns, two a byte) and one binary16 scale per 64 of those columns."""
    if table_format == "bf16":
        return 2 * columns
    padded = -(-columns // 128) * 128
    return padded // 2 + padded // 64 * 2


def _hashed_rows(ple, layer: int, tokens: list[int], start: int) -> set[int]:
    """The table rows positions ``start..`` of a fresh sequence ``tokens`` hash to: each
    position's n-grams of orders 2..n, a token at or before a pad read as the pad."""
    multipliers, pad = ple.multipliers(layer), ple.pad_token
    sizes, offsets = ple.head_vocab_sizes(layer), ple.head_offsets(layer)
    history = [pad] * (ple.ngram_size - 1) + list(tokens)
    rows = set()
    for t in range(ple.ngram_size - 1 + start, len(history)):
        window = []
        for j in range(ple.ngram_size):
            crossed = t - j < 0 or pad in history[t - j : t]
            window.append(pad if crossed else history[t - j])
        mixed = window[0] * multipliers[0]
        for order in range(2, ple.ngram_size + 1):
            mixed ^= window[order - 1] * multipliers[order - 1]
            for h in range((order - 2) * ple.heads_per_ngram, (order - 1) * ple.heads_per_ngram):
                rows.add(mixed % sizes[h] + offsets[h])
    return rows


def streamed_artifact(model):
    return next(iter(model.ple_tables.tables.values())).reader.artifact


def _expected_bytes(model, table_format: str, tokens: list[int], start: int) -> int:
    ple = model.config.ple
    per_row = _row_bytes(table_format, ple.embed_dim // ple.heads)
    return sum(len(_hashed_rows(ple, i, tokens, start)) * per_row for i in ple.layers)


def _runs(rows: set[int]) -> int:
    ordered = sorted(rows)
    return 1 + sum(b != a + 1 for a, b in itertools.pairwise(ordered))


def _prompt(model, n: int, seed: int) -> list[int]:
    ids = np.random.default_rng(seed).integers(0, model.config.vocab, n)
    ids[n // 2] = model.config.ple.pad_token  # an end of text inside: n-grams do not cross it
    return ids.tolist()


def _logits(model, prompt: list[int]) -> np.ndarray:
    """A prompt in chunks of 7, a two-lane step, then decode steps of both lanes."""
    runner = ModelRunner(model)
    pool = runner.new_pool(lanes=2, max_context=64, step_rows=4, page_tokens=16)
    first, second = pool.open(64), pool.open(64)
    rows = [runner.prefill(np.asarray(prompt[:19]), first, chunk=7).logits[0]]
    step = [np.asarray(prompt[19:22]), np.asarray(prompt[:5])]
    rows += runner.forward(step, [first, second]).logits
    for t in range(22, 28):
        step = [np.asarray(prompt[t : t + 1]), np.asarray(prompt[t - 17 : t - 16])]
        rows += runner.forward(step, [first, second]).logits
    return np.concatenate(rows)


@pytest.mark.parametrize("table_format", ["bf16", NF4])
def test_streamed_logits_equal_resident_logits(artifacts, table_format: str) -> None:
    resident = load_model(artifacts[table_format])
    assert resident.ple_tables is None  # auto: a tiny model's tables are held whole
    prompt = _prompt(resident, 40, seed=3)
    expected = _logits(resident, prompt)
    for capacity in (0, 1 << 20):  # every row read again each step, or kept
        streamed = load_model(
            artifacts[table_format], options={**STREAMED, "ple_cache_bytes": capacity}
        )
        reader = next(iter(streamed.ple_tables.tables.values())).reader
        assert reader.object.format == table_format
        if table_format == NF4:
            obj = reader.object
            assert len(streamed_artifact(streamed).segments(obj.offset, obj.bytes)) == 2
        np.testing.assert_array_equal(_logits(streamed, prompt), expected)
        assert streamed.ple_tables.counters().bytes > 0


def _decode_out_of_order(model, prompt: list[int]) -> np.ndarray:
    """Three lanes given out of their slots' order, each prefilled, then decode steps of all
    three: each step's logits."""
    runner = ModelRunner(model)
    pool = runner.new_pool(lanes=3, max_context=64, page_tokens=16)
    opened = [pool.open(64) for _ in range(3)]
    states = [opened[2], opened[0], opened[1]]
    assert [s.slot for s in states] != sorted(s.slot for s in states)
    for i, state in enumerate(states):
        runner.prefill(np.asarray(prompt[i : i + 9]), state, chunk=5)
    rows = []
    for t in range(12, 18):
        step = [np.asarray(prompt[t + i : t + i + 1]) for i in range(3)]
        rows += runner.forward(step, states).logits
    return np.concatenate(rows)


def test_streamed_decode_steps_stage_each_lane_at_its_own_slot(artifacts) -> None:
    """A streamed decode step's rows are staged lane by lane from each lane's slot (its
    n-gram context), whatever the slots' order: the logits equal the resident tables'."""
    resident = load_model(artifacts[NF4])
    prompt = _prompt(resident, 40, seed=9)
    streamed = load_model(artifacts[NF4], options=STREAMED)
    expected = _decode_out_of_order(resident, prompt)
    np.testing.assert_array_equal(_decode_out_of_order(streamed, prompt), expected)


@pytest.mark.parametrize("table_format", ["bf16", NF4])
def test_a_prompt_reads_the_bytes_of_its_distinct_rows(artifacts, table_format: str) -> None:
    model = load_model(artifacts[table_format], options=STREAMED)
    runner = ModelRunner(model)
    prompt = _prompt(model, 40, seed=4)
    state = runner.new_state(64)
    runner.forward([np.asarray(prompt)], [state])
    counters, ple = model.ple_tables.counters(), model.config.ple
    assert counters.bytes == _expected_bytes(model, table_format, prompt, 0)
    rows = [_hashed_rows(ple, i, prompt, 0) for i in ple.layers]
    assert counters.rows == sum(len(r) for r in rows)
    planes = 1 if table_format == "bf16" else 2  # NF4: codes, then scales
    assert counters.ranges == planes * sum(_runs(r) for r in rows)  # one pass per table

    # a decode step reads its token's rows: all of them with an empty cache
    model.ple_tables.reset_counters()
    model.ple_tables.cache.clear()
    token = [int(prompt[7])]
    runner.forward([np.asarray(token)], [state])
    fresh = _expected_bytes(model, table_format, prompt + token, len(prompt))
    assert model.ple_tables.counters().bytes == fresh
    assert model.ple_tables.counters().rows <= ple.heads * len(ple.layers)


def test_a_prefix_cache_hit_reads_only_the_new_tokens_rows(artifacts) -> None:
    engine = Engine(artifacts["bf16"], max_lanes=1, max_context=256, prefill_chunk=32,
                    prefix_cache=True, checkpoint_interval=32, model_options=STREAMED)  # fmt: skip
    model, tables = engine.model, engine.model.ple_tables
    rng = np.random.default_rng(6)
    system = rng.integers(0, 400, 70).tolist()
    _serve(engine, [system + rng.integers(0, 400, 5).tolist()], max_tokens=2)
    tables.reset_counters()
    tables.cache.clear()
    prompt = system + rng.integers(0, 400, 9).tolist()
    [(tokens, finished)] = _serve(engine, [prompt], max_tokens=3)
    cached = finished.usage.cached_tokens
    assert cached == 64
    # run: the prompt past the checkpoint, then the first two generated tokens
    expected = _expected_bytes(model, "bf16", prompt + tokens[:2], cached)
    assert tables.counters().bytes == expected


def test_the_row_cache_keeps_to_its_capacity(artifacts) -> None:
    model = load_model(artifacts[NF4])
    row = 4 * model.config.ple.embed_dim // model.config.ple.heads  # a decoded float32 row
    small = load_model(artifacts[NF4], options={**STREAMED, "ple_cache_bytes": 10 * row + 5})
    prompt = _prompt(model, 40, seed=8)
    np.testing.assert_array_equal(_logits(small, prompt), _logits(model, prompt))
    cache = small.ple_tables.cache
    assert len(cache) == 10 and cache.bytes == 10 * row <= cache.capacity

    lru = RowCache(2 * row)
    values = np.arange(3 * row // 4, dtype=np.float32).reshape(3, -1)
    lru.put("t", np.array([0, 1]), values[:2])
    out = np.zeros((1, values.shape[1]), np.float32)
    assert not lru.fill("t", np.array([0]), out).any()  # row 0 now the most recently used
    lru.put("t", np.array([2]), values[2:])  # row 1 goes
    assert lru.fill("t", np.array([0, 1, 2]), np.zeros((3, values.shape[1]))).tolist() == [
        False,
        True,
        False,
    ]


def test_modes_are_chosen_by_size_and_bad_options_refused(artifacts, monkeypatch) -> None:
    monkeypatch.setattr(ple_rows, "RESIDENT_LIMIT_BYTES", 0)
    assert load_model(artifacts["bf16"]).ple_tables is not None  # auto: over the limit
    assert load_model(artifacts["bf16"], options={"ple_rows": "resident"}).ple_tables is None
    with pytest.raises(ModelError, match="ple_rows 'sometimes': expected one of auto"):
        load_model(artifacts["bf16"], options={"ple_rows": "sometimes"})
    with pytest.raises(ModelError, match="ple_cache_bytes '1G': expected a byte count"):
        load_model(artifacts["bf16"], options={**STREAMED, "ple_cache_bytes": "1G"})
    with pytest.raises(ModelError, match="model option 'ple_rowz' is not built for qwen4_exp"):
        load_model(artifacts["bf16"], options={"ple_rowz": "streamed"})
