"""Launch geometry of the GDN prefill kernels (plain Python: no GPU needed)."""

from __future__ import annotations

import pytest

from ninfer_runtime.backends.cuda import gdn_prefill
from ninfer_runtime.backends.cuda.prefill_attention import MAX_SHARED


@pytest.mark.parametrize("dk", gdn_prefill.KEY_DIMS)
@pytest.mark.parametrize("dv", [4, 16, 36, 64, 128, 256])
def test_every_block_fits_the_shared_memory_two_blocks_an_sm_for_the_qwen_heads(
    dk: int, dv: int
) -> None:
    sizes = {
        kind: gdn_prefill.shared_bytes(kind, dk, dv) for kind in ("prepare", "states", "output")
    }
    assert all(0 < size <= MAX_SHARED for size in sizes.values()), sizes
    if dk == dv == 128:  # the 27B / 35B-A3B heads: two blocks share an SM
        assert all(2 * size <= MAX_SHARED for size in sizes.values()), sizes


def test_prepare_region_holds_both_its_phases() -> None:
    """kT and qT, then the [u | w] system, share one region: it must take the larger."""
    chunk, cp, tp = gdn_prefill.CHUNK, gdn_prefill.CHUNK + 4, gdn_prefill.CHUNK + 8
    for dk, dv in ((16, 256), (128, 16), (128, 128)):
        head = 4 * (2 * chunk + chunk * cp)
        region = gdn_prefill.shared_bytes("prepare", dk, dv) - head
        assert region >= 4 * 2 * dk * tp and region >= 4 * chunk * (dv + dk + 1)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="expected prepare, states or output"):
        gdn_prefill.shared_bytes("solve", 128, 128)
