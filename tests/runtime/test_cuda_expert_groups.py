"""How a MoE prefill pass lays its (token, slot) pairs out for the grouped expert GEMV
(``moe_routing.PairGroups``, plain numpy: no GPU needed), and the grouped product it feeds,
emulated."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.cuda.moe import (
    GROUP_PAIRS,
    MAX_GRID_Y,
    TENSOR_GROUP_PAIRS,
    PairGroups,
    _held_groups,
)


def _route(rng: np.random.Generator, tokens: int, experts: int, k: int) -> np.ndarray:
    """Distinct experts per token, some experts far more popular than others."""
    weights = rng.dirichlet(np.full(experts, 0.3))
    return np.stack(
        [rng.choice(experts, size=k, replace=False, p=weights) for _ in range(tokens)]
    ).astype(np.int32)


@pytest.mark.parametrize(("tokens", "experts", "k"), [(1, 4, 2), (65, 10, 3), (700, 64, 8)])
@pytest.mark.parametrize("size", [GROUP_PAIRS, TENSOR_GROUP_PAIRS])
def test_every_pair_gets_its_own_row_in_a_group_of_its_expert(tokens, experts, k, size) -> None:
    rng = np.random.default_rng(tokens)
    ids = _route(rng, tokens, experts, k)
    g = PairGroups.of(ids, experts, size)
    flat = ids.reshape(-1)
    assert g.row.shape == (flat.size,) and len(set(g.row.tolist())) == flat.size
    # groups for the most a pass of this many pairs can need, sized without a read back
    assert g.expert.size == flat.size // size + experts
    assert g.rows == g.expert.size * size and g.row.max() < g.rows
    assert np.array_equal(g.expert[g.row // size], flat)  # each row's group: its expert
    real = g.expert[g.expert >= 0]
    assert np.all(g.expert[real.size :] == -1)  # the spare groups come last
    counts = np.bincount(flat, minlength=experts)
    assert np.array_equal(
        np.bincount(real, minlength=experts), -(-counts // size)
    )  # as few groups as an expert's pairs need
    assert np.all(np.diff(real) >= 0)  # an expert's groups one after another (L2 reuse)
    # a group's pairs fill its first rows, and live counts them (the rows a product computes)
    taken = g.source.reshape(-1, size) >= 0
    assert g.live.dtype == np.int32 and np.array_equal(g.live, taken.sum(axis=1))
    assert np.array_equal(taken, np.arange(size)[None, :] < g.live[:, None])
    assert np.all(g.live[g.expert < 0] == 0) and np.all(g.live[g.expert >= 0] > 0)


@pytest.mark.parametrize("size", [GROUP_PAIRS, TENSOR_GROUP_PAIRS])
def test_with_expert_parallelism_other_ranks_pairs_are_in_no_computed_group(size) -> None:
    """``_held_groups``: a rank holding experts 5..9 of 10 groups their pairs as
    ``PairGroups`` would, and puts every other pair in a group marked as padding (expert
    -1), which no product computes; each pair still has a row of its own."""
    from types import SimpleNamespace

    rng = np.random.default_rng(9)
    experts, held = 10, np.arange(10) >= 5
    ids = _route(rng, 300, experts, 3)
    table = SimpleNamespace(experts=experts, held=held.astype(np.float32))
    g = _held_groups(ids, table, size)
    flat = ids.reshape(-1)
    mine = held[flat]
    assert len(set(g.row.tolist())) == flat.size and g.row.max() < g.rows
    group = g.expert[g.row // size]
    assert np.array_equal(group[mine], flat[mine])  # this rank's pairs: their experts' groups
    assert np.all(group[~mine] == -1)  # the others': padding groups
    real = g.expert[g.expert >= 0]
    assert set(real.tolist()) <= set(np.flatnonzero(held).tolist())
    counts = np.bincount(flat[mine], minlength=experts)
    assert np.array_equal(np.bincount(real, minlength=experts), -(-counts // size))
    none = SimpleNamespace(experts=experts, held=None)  # one rank: PairGroups as they are
    assert np.array_equal(
        _held_groups(ids, none, size).expert, PairGroups.of(ids, experts, size).expert
    )


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


def test_sources_gather_the_rows_the_scatter_laid_out() -> None:
    """``x[source]`` (what the tensor-core groups read through their row indices) is the
    grouped layout ``xs[row] = repeat(x, k)``, and rows no pair takes read nothing (-1)."""
    rng = np.random.default_rng(3)
    tokens, experts, k, hidden = 90, 12, 3, 5
    ids = _route(rng, tokens, experts, k)
    g = PairGroups.of(ids, experts, GROUP_PAIRS)
    x = rng.standard_normal((tokens, hidden))
    src = g.source
    assert src.shape == (g.rows,) and src.dtype == np.int32
    taken = np.zeros(g.rows, dtype=bool)
    taken[g.row] = True
    assert np.all(src[~taken] == -1) and np.all(src[taken] >= 0)
    xs = np.zeros((g.rows, hidden))
    xs[g.row] = np.repeat(x, k, axis=0)
    np.testing.assert_array_equal(x[src[taken]], xs[taken])


def test_a_pass_never_needs_more_groups_than_a_launch_grid_holds() -> None:
    """A pass takes at most MAX_GRID_Y // k tokens: the groups it launches (the most it can
    need) stay within the grid's y dimension."""
    from ninfer_runtime.backends.cuda import moe

    k, experts = 8, 256
    tokens = min(moe.PREFILL_ROWS, MAX_GRID_Y // k)
    ids = np.tile(np.arange(k, dtype=np.int32), (tokens, 1))
    assert PairGroups.of(ids, experts, GROUP_PAIRS).expert.size <= MAX_GRID_Y


class _Launches:
    """Stands in for ``compile.function``: records each launch (no GPU needed)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple, tuple, tuple]] = []

    def __call__(self, family: str, name: str):
        from ninfer_runtime.backends.cuda.compile import FAMILIES

        assert name in FAMILIES[family], f"{name} is not compiled in {family}"

        def launch(grid, block, args) -> None:
            self.calls.append((family, name, grid, block, args))

        return launch


def _planes(fmt: str, shape: tuple[int, int]):
    from ninfer_runtime.backends.cuda import formats as F

    layout = "contiguous_le_v1" if fmt == "bf16" else "row_split_k128_v1"
    return F.planes(fmt, layout, shape)


@pytest.mark.parametrize("fmt", ["q4_g64_fp16", "q8_g32_fp16", "bf16"])
def test_grouped_tensor_core_launches(monkeypatch, fmt) -> None:
    """The grouped tensor-core product: one fragment pass over every group (grid y = the
    groups) into one buffer, then one product launch with the groups on grid z; kernels
    that the family compiles, arguments in the kernel's order and types."""
    from ninfer_runtime.backends.cuda import kernels

    launches = _Launches()
    monkeypatch.setattr(kernels, "function", launches)
    p = _planes(fmt, (1024, 2048))
    group_expert = np.array([0, 3, -1], dtype=np.int32)
    m = 8 * kernels.GROUP_TILES
    x = np.zeros((3 * m, p.x_width), dtype=np.float32)
    y = np.zeros((3 * m, 1024), dtype=np.float32)
    base, row0 = np.zeros(4, dtype=np.int64), np.zeros(4, dtype=np.int32)
    kernels.small_gemm_groups(base, row0, group_expert, p, 1024, x, y, 1024)
    (_, prep, pgrid, _, pargs), (_, gemm, grid, block, args) = launches.calls
    assert prep.endswith("_groups_x") and "_groups<" in gemm
    steps = kernels._small_groups(p)
    assert pgrid == (-(-steps * kernels.GROUP_TILES * 32 // 256), 3)
    r = kernels.GROUP_WEIGHT_TILES
    assert grid == (-(-1024 // (kernels.SMALL_WARPS * 16 * r)), 1, 3)
    assert block == (kernels.SMALL_WARPS * 32,)
    xf = pargs[-1]
    assert xf is args[-4] and xf.dtype == np.uint32
    assert xf.size == 3 * p.x_width * kernels.GROUP_TILES * 4  # 16 bytes a column a tile
    assert len(args) == 14 and len(pargs) == 7  # the kernels' parameters
    assert args[:3] == (base, row0, group_expert)
    assert args[4 : 4 + len(p.kernel_args())] == tuple(p.kernel_args())
    assert [int(a) for a in args[-6:-4]] == [1024, steps] and args[-3] is y
    assert all(isinstance(a, np.int32) for a in (pargs[1], pargs[4], pargs[5], *args[-2:]))
    assert int(args[-1]) == 0  # not gated
    # every row live: a null group-rows pointer to both kernels
    assert isinstance(args[3], np.uint64) and int(args[3]) == 0 and pargs[3] is args[3]
    live = np.array([40, 3, 0], dtype=np.int32)
    kernels.small_gemm_groups(base, row0, group_expert, p, 1024, x, y, 1024, group_rows=live)
    assert launches.calls[-1][4][3] is live and launches.calls[-2][4][3] is live
    # another compiled configuration names its kernel; one not compiled is refused
    tiles, depth, chunk = config = kernels.GROUP_CONFIGS[-1]
    kernels.small_gemm_groups(base, row0, group_expert, p, 1024, x, y, 1024, config=config)
    assert launches.calls[-1][1].endswith(f"_groups<{tiles}, {r}, {depth}, {chunk}>")
    with pytest.raises(ValueError, match="not compiled"):
        kernels.small_gemm_groups(base, row0, group_expert, p, 1024, x, y, 1024, config=(3, 2, 1))
    del launches.calls[2:]  # (the calls above)
    from ninfer_runtime.backends.cuda import moe

    assert moe.SHARED_GROUPS in kernels.GROUP_CONFIGS  # the shared expert's groups compile
    # gated: rows are the gate's (the up rows follow them), a warp takes 16 of them
    kernels.small_gemm_groups(base, row0, group_expert, p, 512, x, y, 1024, gated=True)
    _, _, grid, _, args = launches.calls[-1]
    assert grid == (-(-512 // (kernels.SMALL_WARPS * 16)), 1, 3) and int(args[-1]) == 1
    assert int(args[-6]) == 512
    # rows in order: a null row-index pointer (8 bytes of zeros)
    assert isinstance(pargs[2], np.uint64) and int(pargs[2]) == 0
    # gathered rows: the index array itself, x any rows of x_width columns
    x_rows = np.array([5, -1, 2] * m, dtype=np.int32)
    kernels.small_gemm_groups(base, row0, group_expert, p, 1024, x[:7], y, 1024, x_rows)
    assert launches.calls[4][4][2] is x_rows and launches.calls[4][4][0].shape[0] == 7


def test_grouped_gemv_launch(monkeypatch) -> None:
    from ninfer_runtime.backends.cuda import kernels, moe, moe_experts

    launches = _Launches()
    monkeypatch.setattr(moe_experts, "function", launches)  # (the expert GEMVs launch there)
    p = _planes("q4_g64_fp16", (1024, 2048))
    proj = moe.Projection(p, 1024, np.zeros(4, dtype=np.int64), np.zeros(4, dtype=np.int32))
    group_expert = np.array([1, -1], dtype=np.int32)
    x = np.zeros((2 * GROUP_PAIRS, p.x_width), dtype=np.float32)
    y = np.zeros((2 * GROUP_PAIRS, 1024), dtype=np.float32)
    moe.expert_groups_gemv(proj, group_expert, x, y, 1024)
    ((_, name, grid, block, args),) = launches.calls
    ks = kernels.default_k_split(p.code, 1024, p.units)
    r = kernels.ROWS_PER_WARP[GROUP_PAIRS]
    assert name == f"gemv_expert_groups_q4<{GROUP_PAIRS}, {r}, {ks}>"
    assert grid == (-(-1024 // (kernels.GEMV_WARPS // ks * r)), 2)
    assert block == (kernels.GEMV_WARPS * 32,)
    assert len(args) == 13 and args[2] is group_expert and args[-4] is x and args[-2] is y
