"""``functional.top_k_ids`` ranks its scores on a device, as many rows at once as fit
``RANKED_TOP_K`` comparisons (``ranked_top_k_ids``: array math, no sort to synchronise with
the host), and sorts a row wider than that: either way a stable sort's choice, best first, a
tie won by the earlier index, -inf scores last; and GLM5Next's grouped router, which chooses with
it and scores each group by its two best values without a sort, gives the choice a sort
gives."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.functional import ranked_top_k_ids, top_k_ids
from ninfer_runtime.ops.moe.reference import grouped_route


def stable_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


@pytest.mark.parametrize(
    ("rows", "width", "k"), [(1, 5, 3), (8, 288, 8), (3, 40, 50), (5, 1000, 128)]
)
@pytest.mark.parametrize("ranked", [True, False], ids=["ranked", "sorted"])
def test_top_k_ids_is_a_stable_sorts_choice(rows: int, width: int, k: int, ranked: bool) -> None:
    choose = ranked_top_k_ids if ranked else top_k_ids
    rng = np.random.default_rng(width)
    ties = rng.integers(-3, 4, (rows, width)).astype(np.float32)  # many equal scores
    ties[rng.random((rows, width)) < 0.2] = -np.inf  # and unseen ones
    for scores in (ties, rng.standard_normal((rows, width)).astype(np.float32)):
        got = choose(scores, k)
        assert got.shape == (rows, min(k, width))
        np.testing.assert_array_equal(got, stable_top_k(scores, k))


def test_a_device_ranks_its_rows_a_share_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device (the strict one) 20 rows of 30 scores with room for 3 rows' ranking a
    call: ranked in 7 calls, a stable sort's choice; with room for less than one row: the
    sort (which the device waits for: refused inside a capture)."""
    from ninfer_runtime import functional
    from tests.strict_device import DeviceArray, capturing

    rng = np.random.default_rng(3)
    scores = rng.integers(-3, 4, (20, 30)).astype(np.float32)
    ranked = []

    def counted(part: np.ndarray, k: int) -> np.ndarray:
        ranked.append(part.shape[0])
        return ranked_top_k_ids(part, k)

    monkeypatch.setattr(functional, "RANKED_TOP_K", 3 * 30 * 30)
    monkeypatch.setattr(functional, "ranked_top_k_ids", counted)
    with capturing():
        got = top_k_ids(scores.view(DeviceArray), 5)
    assert ranked == [3] * 6 + [2]
    np.testing.assert_array_equal(np.asarray(got), stable_top_k(scores, 5))
    monkeypatch.setattr(functional, "RANKED_TOP_K", 30 * 30 - 1)
    with capturing(), pytest.raises(RuntimeError, match="argsort"):
        top_k_ids(scores.view(DeviceArray), 5)


def test_grouped_route_chooses_as_sorting_does() -> None:
    """8 groups of 32 experts, scores drawn from few values (ties within and across groups):
    the groups by the sum of their two best (a sort's two last), then the experts inside."""
    rng = np.random.default_rng(5)
    n, groups, per_group, top_k, topk_groups = 70, 8, 32, 8, 3
    logits = rng.integers(-4, 5, (n, groups * per_group)).astype(np.float32) / 2
    bias = np.zeros(groups * per_group, np.float32)
    top, weights = grouped_route(
        logits, bias, groups=groups, topk_groups=topk_groups, top_k=top_k,
        norm_topk_prob=True, scale=2.5,
    )  # fmt: skip
    choice = 1 / (1 + np.exp(-logits))
    group_score = np.sort(choice.reshape(n, groups, per_group), axis=-1)[..., -2:].sum(-1)
    best = stable_top_k(group_score, topk_groups)
    allowed = np.zeros((n, groups), bool)
    np.put_along_axis(allowed, best, True, axis=1)
    masked = np.where(np.repeat(allowed, per_group, axis=1), choice, -np.inf)
    want = stable_top_k(masked, top_k)
    np.testing.assert_array_equal(top, want)
    share = np.take_along_axis(choice, want, axis=1)
    np.testing.assert_allclose(weights, share / share.sum(-1, keepdims=True) * 2.5, rtol=1e-6)
