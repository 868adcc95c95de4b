"""Which small-M kernel the linear family's policy picks for a product (plain Python: no GPU
needed)."""

from __future__ import annotations

import pytest

from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import kernels
from ninfer_runtime.ops.linear import product_key, served_by

ROW_SPLIT = "row_split_k128_v1"


def uses_tensor_cores(p: F.Planes, rows: int, m: int) -> bool:
    return served_by(product_key(p, rows, m)) == "tensor_cores"


def planes(fmt: str, shape: tuple[int, int]) -> F.Planes:
    layout = "contiguous_le_v1" if fmt == "bf16" else ROW_SPLIT
    return F.planes(fmt, layout, shape)


@pytest.mark.parametrize("fmt", ["q4_g64_fp16", "q5_g64_fp16", "q8_g32_fp16", "bf16"])
def test_one_row_always_runs_the_gemv(fmt: str) -> None:
    p = planes(fmt, (34816, 5120))
    assert not uses_tensor_cores(p, 34816, 1)


def test_large_4_bit_products_use_tensor_cores_from_two_rows() -> None:
    p = planes("q4_g64_fp16", (34816, 5120))  # a 27B MLP gate|up
    assert uses_tensor_cores(p, 34816, 2)


def test_small_products_stay_on_the_gemv() -> None:
    shared_expert = planes("q8_g32_fp16", (1024, 2048))  # 35B-A3B shared expert gate|up
    assert not any(uses_tensor_cores(shared_expert, 1024, m) for m in range(1, 9))
    router = planes("bf16", (256, 2048))
    assert not any(uses_tensor_cores(router, 256, m) for m in range(1, 9))


def test_rows_of_a_slice_count_not_the_whole_object() -> None:
    p = planes("q4_g64_fp16", (34816, 5120))
    assert uses_tensor_cores(p, 34816, 2)
    assert not uses_tensor_cores(p, 512, 2)


def test_beyond_the_gemv_rows_only_the_tensor_core_kernel_runs() -> None:
    p = planes("q8_g32_fp16", (1024, 2048))
    assert uses_tensor_cores(p, 1024, kernels.MAX_GEMV_ROWS + 1)


def test_layouts_without_a_tensor_core_kernel_never_use_it() -> None:
    p = planes("nf4_g64_fp16", (34816, 5120))
    assert not any(uses_tensor_cores(p, 34816, m) for m in range(1, 9))


def test_nvfp4_uses_tensor_cores_from_one_row_on_large_objects() -> None:
    p = F.planes("nvfp4", "block_scale_k16_m128x4_v1", (34816, 5120))
    assert uses_tensor_cores(p, 34816, 1)
    assert not uses_tensor_cores(p, 1024, 1)
    assert uses_tensor_cores(p, 1024, 2)


def test_kernel_args_are_the_planes_in_launch_order_and_widths() -> None:
    import numpy as np

    p = F.planes("nvfp4", "block_scale_k16_m128x4_v1", (512, 320), 2)
    off1, off2, stride, rpd = p.kernel_args()
    assert (off1, off2, stride, rpd) == (p.off1, p.off2, p.stride, 256)
    assert [type(a) for a in p.kernel_args()] == [np.int64, np.int64, np.int32, np.int32]


@pytest.mark.parametrize("fmt", ["gguf_q4_k", "gguf_q5_k", "gguf_q6_k"])
def test_gguf_k_quants_run_several_rows_on_tensor_cores(fmt: str) -> None:
    """ggml K-quant blocks: one row on the GEMV, two or more on the tensor cores (the GGUF
    GEMV reads x again for every row); the MoE's grouped product does not read them."""
    p = F.planes(fmt, "gguf_blocks_v1", (5120, 17408))
    assert not uses_tensor_cores(p, 5120, 1)
    assert all(uses_tensor_cores(p, 5120, m) for m in (2, 8, 64))
    assert not kernels.has_grouped_product(p)


@pytest.mark.parametrize("fmt", ["gguf_q8_0", "gguf_iq2_xxs", "gguf_q3_k"])
def test_other_gguf_types_stay_on_the_gemv(fmt: str) -> None:
    p = F.planes(fmt, "gguf_blocks_v1", (5120, 17408))
    assert not kernels.has_tensor_cores(p)
    assert not any(uses_tensor_cores(p, 5120, m) for m in range(1, 9))
