"""The kernels that read ``gguf_*`` blocks in place (``kernels/gguf.cu``) against the numpy
decoder, for all 18 block types: row dequantization bit for bit (float32, and bf16 as the
nearest-even rounding of those values), the GEMV for 1, 3 and 8 activation rows within the
float32 accumulation bound, ``product`` for a speculative verification's 20 rows, and the
tensor-core kernel for q4_k, q5_k and q6_k.
Shapes are awkward on purpose: rows not a multiple of the 8-warp block, several blocks a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, LAYOUT
from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import kernels
from ninfer_runtime.backends.cuda.weights import Parent
from ninfer_runtime.ops.linear import product_key, served_by
from tests.format.test_codecs_gguf import _random_blocks
from tests.gguf_terms import term_magnitudes

from .conftest import requires_gpu
from .test_kernels import check_close, product

pytestmark = requires_gpu

FORMATS = sorted(FORMAT_BLOCKS)
ROWS = 45


def _weight(fmt: str, seed: int = 0, k: int = 768) -> tuple[Any, np.ndarray]:
    """A resident ``[ROWS, k]`` object of random blocks (by default three 256-value blocks'
    worth of columns, whatever the block size), and its numpy decode."""
    parent, decoded, _ = _weight_and_terms(fmt, seed, k)
    return parent, decoded


def _weight_and_terms(fmt: str, seed: int = 0, k: int = 768) -> tuple[Any, np.ndarray, Any]:
    """``_weight`` and the magnitudes the GEMV sums (``term_magnitudes``)."""
    import cupy as cp

    _, values, _ = FORMAT_BLOCKS[fmt]
    blocks = _random_blocks(fmt, ROWS * k // values, seed)
    raw = blocks.reshape(-1)
    decoded = codec_for(fmt, LAYOUT).decode(raw, (ROWS, k))
    parent = Parent("test", cp.asarray(raw), F.planes(fmt, LAYOUT, (ROWS, k)))
    return parent, decoded, term_magnitudes(fmt, blocks, (ROWS, k))


def _bf16_rn(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_rows_is_exact(fmt: str) -> None:
    import cupy as cp

    parent, w = _weight(fmt)
    rows = np.array([44, 0, 7, 7, 31], dtype=np.int32)
    out = cp.empty((rows.size, w.shape[1]), dtype=cp.float32)
    kernels.dequant_rows(parent.data, parent.planes, cp.asarray(rows), out)
    np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint32), w[rows].view(np.uint32))
    words = cp.empty((rows.size, w.shape[1]), dtype=cp.uint16)
    kernels.dequant_rows(parent.data, parent.planes, cp.asarray(rows), words)
    np.testing.assert_array_equal(cp.asnumpy(words), _bf16_rn(w[rows]))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv(fmt: str, m: int) -> None:
    import cupy as cp

    parent, w, terms = _weight_and_terms(fmt, seed=m)
    x = np.random.default_rng(m).standard_normal((m, w.shape[1])).astype(np.float32)
    y = cp.full((m, ROWS - 5), np.nan, dtype=cp.float32)
    kernels.gemv(parent.data, parent.planes, 5, ROWS - 5, cp.asarray(x), y, y.shape[1])
    check_close(y, x, w[5:], terms=terms[5:])


@pytest.mark.parametrize(
    "fmt", ["gguf_q4_k", "gguf_q6_k", "gguf_q8_0", "gguf_iq2_xxs", "gguf_q2_0"]
)
@pytest.mark.parametrize("m", [1, 2, 5])
def test_gemv_of_rows_longer_than_a_chunk(fmt: str, m: int) -> None:
    """Rows of 2,304 values: two whole 1,024-value chunks the warp stages in shared memory and
    a partial one (for 18- and 34-byte blocks the chunk starts off a 16-byte boundary)."""
    import cupy as cp

    parent, w, terms = _weight_and_terms(fmt, seed=m, k=2304)
    x = np.random.default_rng(m).standard_normal((m, w.shape[1])).astype(np.float32)
    y = cp.full((m, ROWS - 2), np.nan, dtype=cp.float32)
    kernels.gemv(parent.data, parent.planes, 1, ROWS - 2, cp.asarray(x), y, y.shape[1])
    check_close(y, x, w[1:-1], terms=terms[1:-1])


@pytest.mark.parametrize(
    "fmt", ["gguf_q4_k", "gguf_q5_k", "gguf_q6_k", "gguf_iq2_xxs", "gguf_q8_0"]
)
def test_product_of_many_rows(fmt: str) -> None:
    """``product`` takes up to 64 rows (a verification), into a column slice of a wider
    output: on the tensor cores for q4_k, q5_k and q6_k, else 8 rows at a time by the GEMV."""
    import cupy as cp

    parent, w, terms = _weight_and_terms(fmt, seed=3)
    x = np.random.default_rng(3).standard_normal((20, w.shape[1])).astype(np.float32)
    out = cp.full((20, ROWS + 3), np.nan, dtype=cp.float32)
    product(parent.data, parent.planes, 0, ROWS, cp.asarray(x), out[:, 3:], ROWS + 3)
    tensor_cores = served_by(product_key(parent.planes, ROWS, 20)) == "tensor_cores"
    assert tensor_cores == (fmt in ("gguf_q4_k", "gguf_q5_k", "gguf_q6_k"))
    check_close(out[:, 3:], x, w, tensor_cores, terms)
    assert bool(cp.isnan(out[:, :3]).all())


@pytest.mark.parametrize("fmt", ["gguf_q4_k", "gguf_q5_k", "gguf_q6_k"])
@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 33, 64])
@pytest.mark.parametrize("split", [1, 3])
def test_tensor_core_product(fmt: str, m: int, split: int) -> None:
    """The tensor-core small-M kernel on ggml K-quant blocks (q4_k/q5_k mins taken apart
    with the group sums of x, q6_k's 16-value groups): every activation tile count, rows
    not a multiple of its 16-row tiles, K split into slices or not; rows past the object's
    last are never written."""
    import cupy as cp

    parent, w, terms = _weight_and_terms(fmt, seed=m + split, k=1024)
    x = np.random.default_rng(m).standard_normal((m, w.shape[1])).astype(np.float32)
    y = cp.full((m, ROWS), np.nan, dtype=cp.float32)
    kernels.small_gemm(parent.data, parent.planes, 4, ROWS - 7, cp.asarray(x), y, ROWS, split=split)
    check_close(y[:, : ROWS - 7], x, w[4:-3], True, terms[4:-3])
    assert bool(cp.isnan(y[:, ROWS - 7 :]).all())


@pytest.mark.parametrize("group", [1, 8])
def test_expert_products(group: int) -> None:
    """The experts' GEMV over ``gguf_*`` banks: each unit (a pair, or a group of 8 pairs)
    takes its expert's rows from that expert's object."""
    import cupy as cp

    from ninfer_runtime.backends.cuda import gguf_blocks

    experts = [_weight_and_terms("gguf_q4_k", seed=s) for s in range(3)]
    base = cp.asarray([p.data.data.ptr for p, _, _ in experts], dtype=cp.int64)
    row0 = cp.asarray([2, 0, 5], dtype=cp.int32)
    units = np.array([2, 0, 2, 1], dtype=np.int32)
    rows, k = 30, experts[0][1].shape[1]
    x = np.random.default_rng(9).standard_normal((units.size * group, k)).astype(np.float32)
    y = cp.full((units.size * group, rows), np.nan, dtype=cp.float32)
    gguf_blocks.experts_gemv(
        base,
        row0,
        experts[0][0].planes,
        cp.asarray(units),
        rows,
        cp.asarray(x),
        y,
        rows,
        group=group,
    )
    for u, e in enumerate(units):
        start = int(cp.asnumpy(row0)[e])
        w, terms = (a[start : start + rows] for a in experts[e][1:])
        check_close(y[u * group : (u + 1) * group], x[u * group : (u + 1) * group], w, terms=terms)
