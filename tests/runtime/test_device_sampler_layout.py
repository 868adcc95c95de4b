"""The CUDA sampler's parameter block, checked without a GPU: sized by the product's lanes."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from ninfer_runtime.backends.cuda import sampling
from ninfer_runtime.lane_limits import MAX_LANES


def test_the_block_holds_every_lane_of_each_field_aligned_and_apart() -> None:
    assert sampling.MAX_LANES == MAX_LANES == 64
    spans = sorted(
        (offset, offset + MAX_LANES * np.dtype(dtype).itemsize)
        for offset, dtype in sampling._LAYOUT.values()
    )
    assert all(start % 8 == 0 for start, _ in spans)  # float64 / uint64 fields stay aligned
    assert all(end <= nxt for (_, end), (nxt, _) in pairwise(spans))
    assert spans[0][0] == 0 and spans[-1][1] == sampling._BYTES
