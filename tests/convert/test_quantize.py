"""torch quantizers (ninfer_convert.quantize) against the numpy codecs, golden vectors, errors.

The numpy codecs of ``ninfer_format`` are the oracle: every absmax method must give their
bytes exactly, on CPU and (marked ``gpu``) on CUDA. ``stored_scale_mse`` is checked for its
defining property (never worse than absmax, better on average) and against a small
independent numpy implementation of the grid that docs/quantization.md documents.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer_convert.errors import RecipeError
from ninfer_convert.quantize import METHODS, Method, _common, quantize
from ninfer_convert.quantize.mse import GRID, NEIGHBOURS, NVFP4_WINDOW
from ninfer_format import numeric as nm
from ninfer_format.codecs import codec_for
from ninfer_format.codecs import fp8_row as fp8_codec
from ninfer_format.codecs import nvfp4 as nvfp4_codec
from ninfer_format.codecs.row_split import CODECS, FORMATS, unpack_row_split

ROW_SPLIT = list(FORMATS)
FP8 = "fp8_e4m3fn_row_bf16"
AWKWARD_K = [1, 63, 64, 65, 129, 300]
CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)
DEVICES = ["cpu", CUDA]


def awkward_values(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Rows of very different magnitudes, plus an all-zero row, -0, tiny and subnormal
    values, and exact binary fractions that put ``x * inv`` on rounding ties."""
    rng = np.random.default_rng(seed)
    n, k = shape
    magnitude = rng.choice([1e-30, 1e-6, 1e-2, 1.0, 3e3], size=(n, 1))
    x = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    ties = rng.integers(-16, 17, size=shape).astype(np.float32) / 2  # multiples of 1/2
    mask = rng.random(shape) < 0.3
    x[mask] = ties[mask]
    x[0] = 0
    if n > 1:
        x[1, ::3] = -0.0
    if n > 2:
        x[2] = rng.standard_normal(k).astype(np.float32) * np.float32(1e-42)  # subnormals
    return x


def q(method: str, x: np.ndarray, fmt: str, device: str = "cpu", dtype=torch.float32, **kw):
    return quantize(method, torch.from_numpy(x).to(device=device, dtype=dtype), fmt, **kw)


def decode(fmt: str, data: bytes, shape: tuple[int, int], divisors: int = 1) -> np.ndarray:
    layout = {"nvfp4": "block_scale_k16_m128x4_v1", FP8: "row_scale_v1"}.get(
        fmt, "row_split_k128_v1"
    )
    raw = np.frombuffer(data, dtype=np.uint8)
    return codec_for(fmt, layout).decode(raw, shape, divisors).astype(np.float64)


# --- registry and errors ----------------------------------------------------------------------


def test_registry():
    assert set(METHODS) == {
        "cast",
        "grouped_absmax",
        "stored_scale_mse",
        "fp8_row_maxabs",
        "nvfp4_absmax",
    }
    for name, method in METHODS.items():
        assert isinstance(method, Method) and method.name == name
        assert method.formats and method.description and callable(method.function)
    assert set(METHODS["stored_scale_mse"].formats) == {*ROW_SPLIT, "nvfp4"}
    assert "nf4_g64_fp16" in METHODS["grouped_absmax"].formats


def test_unsupported_pairs_name_method_format_and_supported():
    x = torch.zeros(4, 64)
    with pytest.raises(RecipeError, match=r"'fp8_row_maxabs'.*'q4_g64_fp16'.*fp8_e4m3fn_row_bf16"):
        quantize("fp8_row_maxabs", x, "q4_g64_fp16")
    with pytest.raises(RecipeError, match=r"'grouped_absmax'.*'nvfp4'.*q4_g64_fp16"):
        quantize("grouped_absmax", x, "nvfp4")
    with pytest.raises(RecipeError, match="unknown quantization method 'gptq'"):
        quantize("gptq", x, "q4_g64_fp16")
    with pytest.raises(RecipeError, match="takes no parameter 'imatrix'"):
        quantize("stored_scale_mse", x, "q4_g64_fp16", imatrix="x.gguf")
    with pytest.raises(RecipeError, match="divisors"):
        quantize("grouped_absmax", x, "q4_g64_fp16", divisors=2)
    with pytest.raises(RecipeError, match="divisors"):
        quantize("stored_scale_mse", x, "q4_g64_fp16", divisors=2)
    with pytest.raises(TypeError):
        quantize("cast", np.zeros(3), "bf16")


@pytest.mark.parametrize(
    ("method", "fmt"),
    [
        ("cast", "bf16"),
        ("cast", "fp32"),
        ("grouped_absmax", "q4_g64_fp16"),
        ("grouped_absmax", "nf4_g64_fp16"),
        ("stored_scale_mse", "q8_g32_fp16"),
        ("stored_scale_mse", "nvfp4"),
        ("fp8_row_maxabs", FP8),
        ("nvfp4_absmax", "nvfp4"),
    ],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_is_a_recipe_error(method, fmt, bad):
    x = torch.zeros(256, 128)
    x[200, 7] = bad
    with pytest.raises(RecipeError, match="non-finite value"):
        quantize(method, x, fmt)


def test_fp64_beyond_float32_is_named():
    x = torch.zeros(2, 64, dtype=torch.float64)
    x[1, 5] = 1e300
    with pytest.raises(RecipeError, match=r"beyond the float32 range"):
        quantize("grouped_absmax", x, "q8_g32_fp16")


def test_shape_dtype_and_overflow_errors():
    with pytest.raises(RecipeError, match="rank-2"):
        quantize("grouped_absmax", torch.zeros(64), "q4_g64_fp16")
    with pytest.raises(RecipeError, match="floating-point"):
        quantize("grouped_absmax", torch.zeros(2, 64, dtype=torch.int32), "q4_g64_fp16")
    with pytest.raises(RecipeError, match="N % 128"):
        quantize("nvfp4_absmax", torch.zeros(64, 64), "nvfp4")
    with pytest.raises(RecipeError, match="divisors"):
        quantize("nvfp4_absmax", torch.zeros(256, 64), "nvfp4", divisors=3)
    with pytest.raises(RecipeError, match="overflows the binary16 scale"):
        quantize("grouped_absmax", torch.full((1, 64), 1e6), "q4_g64_fp16")
    with pytest.raises(RecipeError, match="overflows the binary16 scale"):
        quantize("stored_scale_mse", torch.full((1, 64), 1e6), "q4_g64_fp16")


# --- golden vectors (notes 2.1, 2.4, 2.5) -----------------------------------------------------


def grouped_parts(fmt: str, x: np.ndarray, method: str = "grouped_absmax", device="cpu"):
    data = q(method, x, fmt, device)
    return unpack_row_split(fmt, np.frombuffer(data, dtype=np.uint8), x.shape)


def test_golden_grouped():
    bf16 = torch.full((1, 64), 0.0, dtype=torch.bfloat16)
    bf16.view(torch.int16)[:] = 0x3636
    data = quantize("grouped_absmax", bf16, "q4_g64_fp16")
    _, scales = unpack_row_split("q4_g64_fp16", np.frombuffer(data, np.uint8), (1, 64))
    assert scales[0, 0] == 6

    x = np.array([[0x41A0B334, 0x417C7BFF]], dtype=np.uint32).view(np.float32)
    codes, scales = grouped_parts("q4_g64_fp16", x)
    assert scales[0, 0] == 0x41BD and codes.tolist() == [[7, 6]]

    x = np.array([[7, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5]], dtype=np.float32)
    codes, _ = grouped_parts("q4_g64_fp16", x)
    assert codes.tolist() == [[7, 0, 2, 2, 0, -2, -2]]

    x = np.array([[-7, -1, 0, 1, 7, 3.5, -3.5, 0.25]], dtype=np.float32)
    codes, scales = grouped_parts("q4_g64_fp16", x)
    assert scales[0, 0] == 0x3C00 and codes.tolist() == [[-7, -1, 0, 1, 7, 4, -4, 0]]

    x = np.array([[np.finfo(np.float32).tiny]], dtype=np.float32)
    _, scales = grouped_parts("q4_g64_fp16", x)
    assert scales[0, 0] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_golden_fp8(device):
    def parts(row):
        data = q("fp8_row_maxabs", np.array([row], dtype=np.float32), FP8, device)
        return fp8_codec.unpack_fp8_row(np.frombuffer(data, np.uint8), (1, len(row)))

    codes, scales = parts([448, 1.0625, 1.1875, -1.0625, -1.1875])
    assert scales[0] == 0x3F80 and codes[0].tolist() == [0x7E, 0x38, 0x3A, 0xB8, 0xBA]
    codes, scales = parts([2, -2, 1, -1])
    assert scales[0] == 0x3B92 and codes[0].tolist() == [0x7E, 0xFE, 0x76, 0xF6]
    codes, scales = parts([1, -0.0, 0.5, -1, -0.5])
    assert scales[0] == 0x3B12 and codes[0, 1] == 0x80


def test_golden_nvfp4_divisor():
    x = np.zeros((128, 64), dtype=np.float32)
    x[3, 5] = -0.5
    data = q("nvfp4_absmax", x, "nvfp4")
    _, _, divisors = nvfp4_codec.unpack_nvfp4(np.frombuffer(data, np.uint8), x.shape)
    assert divisors.tolist() == [5376.0]
    data = q("nvfp4_absmax", np.zeros((128, 64), np.float32), "nvfp4")
    assert nvfp4_codec.unpack_nvfp4(np.frombuffer(data, np.uint8), (128, 64))[2][0] == 1.0


# --- byte equality with the numpy codecs ------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ROW_SPLIT)
def test_grouped_absmax_matches_codec(fmt, device):
    for i, k in enumerate(AWKWARD_K):
        x = awkward_values((5, k), seed=i)
        assert q("grouped_absmax", x, fmt, device) == CODECS[fmt].encode(x), k


@pytest.mark.parametrize("device", DEVICES)
def test_nf4_ties_go_to_the_even_index(device):
    """Scale 1.0 (amax 1), so ``x * inv`` is ``x``: put values on every midpoint and next to it."""
    levels = nm.NF4_CODEBOOK.astype(np.float64)
    mid = ((levels[:-1] + levels[1:]) / 2).astype(np.float32)
    around = np.concatenate([mid, np.nextafter(mid, 2), np.nextafter(mid, -2), nm.NF4_CODEBOOK])
    x = np.zeros((1, 64 * 2), dtype=np.float32)
    x[0, : around.size] = around
    x[0, 0::64] = 1.0  # amax 1 in both groups
    data = q("grouped_absmax", x, "nf4_g64_fp16", device)
    assert data == CODECS["nf4_g64_fp16"].encode(x)
    codes, scales = unpack_row_split("nf4_g64_fp16", np.frombuffer(data, np.uint8), x.shape)
    assert (scales == 0x3C00).all()
    assert (codes[0, :64] == nm.nf4_nearest(x[0, :64])).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_input_dtypes(dtype, device):
    x = awkward_values((4, 130), seed=7).clip(-6e4, 6e4)
    t = torch.from_numpy(x).to(dtype)
    as_f32 = t.to(torch.float32).numpy()  # what the codecs see
    for fmt in ("q4_g64_fp16", "nf4_g64_fp16", "q8_g32_fp16"):
        assert quantize("grouped_absmax", t.to(device), fmt) == CODECS[fmt].encode(as_f32)
    assert quantize("fp8_row_maxabs", t.to(device), FP8) == fp8_codec.CODEC.encode(as_f32)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_matches_codec(device):
    rng = np.random.default_rng(3)
    for shape in [(1, 1), (3, 7), (6, 300)]:
        x = awkward_values(shape, seed=shape[1])
        assert q("fp8_row_maxabs", x, FP8, device) == fp8_codec.CODEC.encode(x)
    x = rng.standard_normal((4, 50)).astype(np.float32)
    x[1] *= np.float32(1e-39)  # scale is a BF16 subnormal: the reciprocal overflows to Inf
    x[2] = 0
    x[2, 3] = -0.0
    assert q("fp8_row_maxabs", x, FP8, device) == fp8_codec.CODEC.encode(x)
    # An fp32 source and its BF16 copy give the same bytes (the source is rounded first).
    as_bf16 = torch.from_numpy(x).to(torch.bfloat16).to(device)
    assert quantize("fp8_row_maxabs", as_bf16, FP8) == q("fp8_row_maxabs", x, FP8, device)


@pytest.mark.parametrize("device", DEVICES)
def test_e4m3fn_bytes_on_ties_and_subnormals(device):
    values = nm.E4M3FN_VALUES[:0x7F].astype(np.float64)
    mid = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    x = np.concatenate(
        [
            mid,
            np.nextafter(mid, np.float32(1000)),
            np.nextafter(mid, np.float32(-1)),
            values.astype(np.float32),
            np.random.default_rng(0).uniform(0, 448, 100_000).astype(np.float32),
            np.random.default_rng(1).uniform(0, 2**-6, 100_000).astype(np.float32),
        ]
    )
    x = np.concatenate([x, -x])
    got = _common.e4m3fn_bytes(torch.from_numpy(x).to(device)).cpu().numpy()
    assert (got == nm.f32_to_e4m3fn(x)).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("shape", "divisors"), [((128, 64), 1), ((256, 192), 2), ((384, 64), 3)])
def test_nvfp4_matches_codec(shape, divisors, device):
    x = awkward_values(shape, seed=divisors)
    x[:, :16] = 0  # all-zero blocks
    x[-128:] *= np.float32(1e3)  # matrices with different divisors
    expected = nvfp4_codec.CODEC.encode(x, divisors)
    assert q("nvfp4_absmax", x, "nvfp4", device, divisors=divisors) == expected


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_equals_unchunked(monkeypatch, device):
    x = awkward_values((256, 192), seed=11)
    whole = {
        (m, f): q(m, x, f, device)
        for m, f in [
            ("grouped_absmax", "q5_g64_fp16"),
            ("grouped_absmax", "q6_g64_fp16"),
            ("stored_scale_mse", "q4_g64_fp16"),
            ("stored_scale_mse", "nvfp4"),
            ("fp8_row_maxabs", FP8),
            ("nvfp4_absmax", "nvfp4"),
            ("cast", "bf16"),
        ]
    }
    monkeypatch.setattr(_common, "CHUNK_VALUES", {"cpu": 300, "cuda": 300})
    monkeypatch.setattr(_common, "SEARCH_CHUNK_VALUES", {"cpu": 300, "cuda": 300})
    for (method, fmt), data in whole.items():
        assert q(method, x, fmt, device) == data, (method, fmt)
    assert whole[("grouped_absmax", "q5_g64_fp16")] == CODECS["q5_g64_fp16"].encode(x)


# --- cast -------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cast_matches_codec(fmt, dtype, device):
    x = awkward_values((3, 40), seed=5).reshape(2, 3, 20)
    t = torch.from_numpy(x).to(dtype)
    source = t.numpy() if dtype != torch.bfloat16 else t.to(torch.float32).numpy()
    expected = codec_for(fmt, "contiguous_le_v1").encode(source)
    assert quantize("cast", t.to(device), fmt) == expected


def test_cast_keeps_bf16_words_and_rank0():
    words = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    bf16 = words.view(torch.bfloat16)
    data = quantize("cast", bf16, "bf16", allow_non_finite=True)  # every word incl. NaNs
    assert data == words.numpy().astype("<i2").tobytes()
    assert quantize("cast", torch.tensor(1.5), "fp32") == np.float32(1.5).tobytes()
    with pytest.raises(RecipeError, match="non-finite"):
        quantize("cast", bf16, "bf16")
    nan = np.array([np.nan, -np.inf], dtype=np.float32)
    kept = quantize("cast", torch.from_numpy(nan), "bf16", allow_non_finite=True)
    assert kept == codec_for("bf16", "contiguous_le_v1").encode(nan)


def test_cast_int32():
    ints = torch.tensor([[-(2**31), 0, 2**31 - 1]], dtype=torch.int64)
    assert quantize("cast", ints, "int32") == np.array([[-(2**31), 0, 2**31 - 1]], "<i4").tobytes()
    assert (
        quantize("cast", torch.tensor([3.0, -4.0]), "int32") == np.array([3, -4], "<i4").tobytes()
    )
    with pytest.raises(RecipeError, match="int32 range"):
        quantize("cast", torch.tensor([2**31]), "int32")
    with pytest.raises(RecipeError, match=r"non-integer value 0\.5"):
        quantize("cast", torch.tensor([1.0, 0.5]), "int32")
    with pytest.raises(RecipeError, match="int32 range"):
        quantize("cast", torch.tensor([3e9], dtype=torch.float64), "int32")


# --- stored_scale_mse -------------------------------------------------------------------------


def group_errors(fmt: str, x: np.ndarray, data: bytes, group: int, divisors: int = 1):
    r = decode(fmt, data, x.shape, divisors) - x.astype(np.float64)
    return (r * r).reshape(x.shape[0], -1, group).sum(axis=2)


@pytest.mark.parametrize("fmt", [*ROW_SPLIT, "nvfp4"])
def test_mse_never_worse_and_better_on_average(fmt):
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((256, 256)) * np.exp(rng.standard_normal((256, 1)))).astype(np.float32)
    x[rng.random(x.shape) < 0.02] *= 5  # outliers
    x[0] = 0
    if fmt == "nvfp4":
        group, absmax = 16, q("nvfp4_absmax", x, fmt)
    else:
        group, absmax = FORMATS[fmt].group, q("grouped_absmax", x, fmt)
    searched = q("stored_scale_mse", x, fmt)
    e_abs = group_errors(fmt, x, absmax, group)
    e_mse = group_errors(fmt, x, searched, group)
    assert (e_mse <= e_abs * (1 + 1e-12)).all()
    assert e_mse.sum() < 0.95 * e_abs.sum()
    if fmt == "nvfp4":  # same weight divisor as absmax
        assert searched[-4:] == absmax[-4:]
    else:  # all-zero groups keep scale +0
        _, scales = unpack_row_split(fmt, np.frombuffer(searched, np.uint8), x.shape)
        assert (scales[0] == 0).all() and (scales[1:] != 0).all()


def oracle_mse_words(fmt: str, x: np.ndarray) -> np.ndarray:
    """docs/quantization.md's grid for row_split formats, written independently in numpy."""
    spec = FORMATS[fmt]
    groups = x.reshape(-1, spec.group)
    amax = np.abs(groups).max(axis=1)
    qmax = 1 if spec.nf4 else spec.qmax

    def rounded(scale):
        with np.errstate(all="ignore"):
            w = nm.f32_to_f16(scale.astype(np.float32)).astype(np.int64)
        w[(w == 0) & (amax > 0)] = 1
        ok = np.isfinite(scale) & (scale > 0) & (w <= 0x7BFF) & (amax > 0)
        return np.where(ok, w, -1)

    def levels(w):
        s = nm.f16_to_f32(np.maximum(w, 0).astype(np.uint16))
        with np.errstate(divide="ignore"):
            inv = np.where(s == 0, np.float32(0), np.float32(1) / s)
        y = groups * inv[:, None]
        if spec.nf4:
            return nm.NF4_CODEBOOK[nm.nf4_nearest(y)], s
        return np.clip(np.rint(y), spec.qmin, spec.qmax), s

    def error(w):
        v, s = levels(w)
        r = groups.astype(np.float64) - (v * s[:, None]).astype(np.float64)
        return (r * r).sum(axis=1)

    w0 = rounded(amax.astype(np.float64) / qmax)
    w0[amax == 0] = 0
    best, best_e = w0.copy(), error(w0)

    def consider(w):
        nonlocal best, best_e
        e = error(np.where(w >= 0, w, best))
        better = (w >= 0) & (e < best_e)
        best, best_e = np.where(better, w, best), np.where(better, e, best_e)

    for i in [i for i in range(32, 68) if i != 64]:
        consider(rounded(amax.astype(np.float64) * i / (64 * qmax)))
    center = best.copy()
    for d in (-8, -4, -2, -1, 1, 2, 4, 8):
        w = center + d
        consider(np.where((amax > 0) & (w >= 1) & (w <= 0x7BFF), w, -1))
    v, _ = levels(best)
    v = v.astype(np.float64)
    with np.errstate(all="ignore"):
        fit = rounded((groups * v).sum(axis=1) / (v * v).sum(axis=1))
    consider(fit)
    for d in (-1, 1):
        consider(np.where((fit >= 0) & (fit + d >= 1) & (fit + d <= 0x7BFF), fit + d, -1))
    return best.reshape(x.shape[0], -1).astype(np.uint16)


@pytest.mark.parametrize("fmt", ["q4_g64_fp16", "q8_g32_fp16", "nf4_g64_fp16"])
def test_mse_follows_the_documented_grid(fmt):
    documented = {
        "grid": tuple(i for i in range(32, 68) if i != 64),
        "neighbours": (-8, -4, -2, -1, 1, 2, 4, 8),
        "nvfp4": (-8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3),
    }
    assert documented == {"grid": GRID, "neighbours": NEIGHBOURS, "nvfp4": NVFP4_WINDOW}
    x = awkward_values((24, 128), seed=23)
    _, scales = grouped_parts(fmt, x, "stored_scale_mse")
    assert (scales == oracle_mse_words(fmt, x)).all()


# --- CUDA: same bytes as CPU for the search too -----------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", [*ROW_SPLIT, "nvfp4"])
def test_mse_cuda_equals_cpu(fmt):
    x = awkward_values((256, 320), seed=31)
    divisors = {"divisors": 2} if fmt == "nvfp4" else {}
    cpu = q("stored_scale_mse", x, fmt, "cpu", **divisors)
    assert q("stored_scale_mse", x, fmt, "cuda", **divisors) == cpu


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_large_random_equals_codecs():
    """A few million values per format, where a rare rounding difference would show up."""
    rng = np.random.default_rng(41)
    x = (rng.standard_normal((1024, 2048)) * np.exp(rng.standard_normal((1024, 1)))).astype(
        np.float32
    )
    for fmt in ROW_SPLIT:
        assert q("grouped_absmax", x, fmt, "cuda") == CODECS[fmt].encode(x), fmt
    assert q("fp8_row_maxabs", x, FP8, "cuda") == fp8_codec.CODEC.encode(x)
    assert q("nvfp4_absmax", x, "nvfp4", "cuda", divisors=2) == nvfp4_codec.CODEC.encode(x, 2)
    for fmt in ("bf16", "fp32"):
        assert q("cast", x, fmt, "cuda") == codec_for(fmt, "contiguous_le_v1").encode(x)
