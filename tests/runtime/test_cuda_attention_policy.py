"""How decode and prefill attention split their work (plain Python: no GPU needed)."""

from __future__ import annotations

import pytest

from ninfer_runtime.backends.cuda import attention, prefill_attention


def test_one_pair_takes_the_smallest_chunks_up_to_the_split_limit() -> None:
    assert attention.split_policy(40) == (64, 1)
    assert attention.split_policy(4096) == (64, 64)
    assert attention.split_policy(16384) == (64, 256)
    assert attention.split_policy(20032) == (128, 157)


@pytest.mark.parametrize("group", range(1, 41))
def test_a_group_is_served_in_the_fewest_equal_shares_the_kernel_takes(group: int) -> None:
    parts = attention.group_parts(group)
    assert group % parts == 0 and group // parts <= attention.MAX_GROUP
    assert all(group % p or group // p > attention.MAX_GROUP for p in range(1, parts))
    assert attention.group_parts(12) == 2 and attention.group_parts(6) == 1  # Qwen4Exp, 3.5


def test_many_lanes_take_longer_chunks() -> None:
    # 8 lanes x 4 kv heads at 16k: 32 pairs x 32 splits of 512 tokens (1,024 blocks)
    assert attention.split_policy(16384, 32) == (512, 32)
    assert attention.split_policy(16384, 16) == (256, 64)  # 4 lanes: 1,024 blocks
    assert attention.split_policy(16384, 8) == (256, 64)  # 2 lanes: 512 blocks
    assert attention.split_policy(1024, 32) == (64, 16)


def test_one_lane_of_a_few_kv_heads_takes_fewer_longer_chunks() -> None:
    # the 27B's 4 kv heads at 16k: 256-token splits, 256 blocks (measured 18-23% faster than
    # 64-token ones)
    assert attention.split_policy(16384, 4) == (256, 64)
    assert attention.split_policy(1024, 4) == (64, 16)  # short contexts: the 64-token floor


@pytest.mark.parametrize("pairs", [1, 3, 32, 2048])
@pytest.mark.parametrize("ctx", [1, 127, 128, 129, 5000, 65536, 262144, 10**6])
def test_splits_cover_the_context_within_the_limits(ctx: int, pairs: int) -> None:
    chunk, splits = attention.split_policy(ctx, pairs)
    assert chunk % 64 == 0 and chunk >= 64 and 1 <= splits <= attention.MAX_SPLITS
    assert (splits - 1) * chunk < ctx <= splits * chunk


def test_prefill_split_count() -> None:
    assert prefill_attention.split_count(blocks=1000, max_tiles=500, sms=132, per_sm=1) == 1
    assert prefill_attention.split_count(blocks=4, max_tiles=100, sms=132, per_sm=1) == 12
    assert prefill_attention.split_count(blocks=4, max_tiles=4000, sms=132, per_sm=1) == 64
    assert prefill_attention.split_count(blocks=4, max_tiles=3, sms=132, per_sm=1) == 1


@pytest.mark.parametrize("itemsize", [4, 2, 1])
@pytest.mark.parametrize("d", prefill_attention.HEAD_DIMS)
def test_prefill_tiles_fit_in_shared_memory(d: int, itemsize: int) -> None:
    """Q rows and two float K/V tiles (float32 pools), or one float tile each plus two raw
    staging tiles (bf16, E4M3), within what one block may take."""
    bn, rows = prefill_attention.tile_keys(d), prefill_attention.ROWS
    floats = rows * (d + 16) + bn * (d + 16) + bn * (d + 4)
    if itemsize == 4:
        want = 4 * (floats + bn * (d + 16) + bn * (d + 4))
    else:
        want = 4 * floats + 2 * 2 * bn * d * itemsize
    assert prefill_attention.smem_bytes(d, itemsize) == want <= prefill_attention.MAX_SHARED
    assert prefill_attention.smem_bytes(256, 4) == 205_824  # the 27B's head dim: 1 block/SM


@pytest.mark.parametrize("splits", [None, 1, 5, 10**6])
@pytest.mark.parametrize(
    ("tokens", "group", "nkv", "d", "start"),
    [(2048, 6, 4, 256, 129024), (5, 6, 4, 256, 3000), (1, 8, 2, 128, 777), (300, 4, 2, 64, 0)],
)
def test_prefill_launch_covers_every_key_tile(
    tokens: int, group: int, nkv: int, d: int, start: int, splits: int | None
) -> None:
    shape = prefill_attention.launch_shape(
        tokens, group, nkv, d, start, itemsize=2, sms=132, splits=splits
    )
    tiles = -(-(start + tokens) // prefill_attention.tile_keys(d))
    assert shape.row_blocks == -(-(tokens * group) // prefill_attention.ROWS)
    assert 1 <= shape.splits <= (splits or prefill_attention.MAX_SPLITS)
    # every tile in exactly one split, and no split past the last tile
    assert (
        (shape.splits - 1) * shape.tiles_per_split < tiles <= shape.splits * shape.tiles_per_split
    )
    if splits is None and shape.row_blocks * nkv >= 2 * 132:
        assert shape.splits == 1  # the rows alone fill the device
