"""How decode attention splits a long context (plain Python: no GPU needed)."""

from __future__ import annotations

import pytest

from ninfer_runtime.backends.cuda import attention


def test_one_pair_takes_the_smallest_chunks_up_to_the_split_limit() -> None:
    assert attention.split_policy(40) == (64, 1)
    assert attention.split_policy(4096) == (64, 64)
    assert attention.split_policy(16384) == (64, 256)
    assert attention.split_policy(20032) == (128, 157)


def test_many_lanes_take_longer_chunks() -> None:
    # 8 lanes x 4 kv heads at 16k: 32 pairs x 32 splits of 512 tokens
    assert attention.split_policy(16384, 32) == (512, 32)
    assert attention.split_policy(16384, 8) == (128, 128)
    assert attention.split_policy(1024, 32) == (64, 16)


@pytest.mark.parametrize("pairs", [1, 3, 32, 2048])
@pytest.mark.parametrize("ctx", [1, 127, 128, 129, 5000, 65536, 262144, 10**6])
def test_splits_cover_the_context_within_the_limits(ctx: int, pairs: int) -> None:
    chunk, splits = attention.split_policy(ctx, pairs)
    assert chunk % 64 == 0 and chunk >= 64 and 1 <= splits <= attention.MAX_SPLITS
    assert (splits - 1) * chunk < ctx <= splits * chunk
