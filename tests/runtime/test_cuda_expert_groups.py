"""How a MoE prefill pass lays its (token, slot) pairs out for the grouped expert GEMV
(``moe.PairGroups``, plain numpy: no GPU needed), and the grouped product it feeds, emulated."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.cuda.moe import GROUP_PAIRS, MAX_GRID_Y, PairGroups


def _route(rng: np.random.Generator, tokens: int, experts: int, k: int) -> np.ndarray:
    """Distinct experts per token, some experts far more popular than others."""
    weights = rng.dirichlet(np.full(experts, 0.3))
    return np.stack(
        [rng.choice(experts, size=k, replace=False, p=weights) for _ in range(tokens)]
    ).astype(np.int32)


@pytest.mark.parametrize(("tokens", "experts", "k"), [(1, 4, 2), (65, 10, 3), (700, 64, 8)])
def test_every_pair_gets_its_own_row_in_a_group_of_its_expert(tokens, experts, k) -> None:
    rng = np.random.default_rng(tokens)
    ids = _route(rng, tokens, experts, k)
    g = PairGroups.of(ids, experts, GROUP_PAIRS)
    flat = ids.reshape(-1)
    assert g.row.shape == (flat.size,) and len(set(g.row.tolist())) == flat.size
    # groups for the most a pass of this many pairs can need, sized without a read back
    assert g.expert.size == flat.size // GROUP_PAIRS + experts
    assert g.rows == g.expert.size * GROUP_PAIRS and g.row.max() < g.rows
    assert np.array_equal(g.expert[g.row // GROUP_PAIRS], flat)  # each row's group: its expert
    real = g.expert[g.expert >= 0]
    assert np.all(g.expert[real.size :] == -1)  # the spare groups come last
    counts = np.bincount(flat, minlength=experts)
    assert np.array_equal(
        np.bincount(real, minlength=experts), -(-counts // GROUP_PAIRS)
    )  # as few groups as an expert's pairs need
    assert np.all(np.diff(real) >= 0)  # an expert's groups one after another (L2 reuse)


def test_the_grouped_product_equals_one_product_per_pair() -> None:
    """``y[g * M + m] = W_{expert[g]} x[g * M + m]`` on rows laid out by the groups, read back
    in pair order, equals each pair's own product (what ``moe_prefill`` relies on)."""
    rng = np.random.default_rng(0)
    tokens, experts, k, hidden, inter = 50, 6, 2, 16, 12
    ids = _route(rng, tokens, experts, k)
    w = rng.standard_normal((experts, inter, hidden))
    x = rng.standard_normal((tokens, hidden))
    g = PairGroups.of(ids, experts, GROUP_PAIRS)
    xs = np.zeros((g.rows, hidden))
    xs[g.row] = np.repeat(x, k, axis=0)
    ys = np.zeros((g.expert.size, GROUP_PAIRS, inter))
    real = g.expert >= 0  # the kernel's blocks of a spare group return at once
    ys[real] = np.einsum(
        "gih,gmh->gmi", w[g.expert[real]], xs.reshape(-1, GROUP_PAIRS, hidden)[real]
    )
    y = ys.reshape(g.rows, inter)[g.row]
    want = np.einsum("pih,ph->pi", w[ids.reshape(-1)], np.repeat(x, k, axis=0))
    np.testing.assert_allclose(y, want, rtol=1e-12)


def test_a_pass_never_needs_more_groups_than_a_launch_grid_holds() -> None:
    """A pass takes at most MAX_GRID_Y // k tokens: the groups it launches (the most it can
    need) stay within the grid's y dimension."""
    from ninfer_runtime.backends.cuda import moe

    k, experts = 8, 256
    tokens = min(moe.PREFILL_ROWS, MAX_GRID_Y // k)
    ids = np.tile(np.arange(k, dtype=np.int32), (tokens, 1))
    assert PairGroups.of(ids, experts, GROUP_PAIRS).expert.size <= MAX_GRID_Y
