"""The CUDA backend's ``gguf_*`` decoders (``kernels/gguf_decode.cuh``, written to compile for
the device and the host alike) built with the host compiler and checked bit for bit against
the numpy decoder on random blocks of all 18 types, so a wrong bit field or operation order
is caught without a GPU. (The GPU suite checks the same decoders inside the kernels.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ninfer_format.codecs import codec_for, gguf_blocks
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, LAYOUT
from ninfer_runtime.backends.cuda.compile import KERNEL_DIR
from ninfer_runtime.backends.cuda.gguf_tables import source
from tests.gguf_terms import term_magnitudes

N_BLOCKS = 37
#: scale words every type sees in its first blocks: +0, -0, the smallest and the largest
#: subnormal, the smallest normal (gg_f16's edge cases)
EDGE_SCALES = (0x0000, 0x8000, 0x0001, 0x83FF, 0x0400)

HARNESS = r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#include <cstdio>
#include <vector>
%(tables)s
%(decoders)s
// each group's 32 values, or with x (32 floats a group) each group's gguf_dot with its x
template <int T>
static void run(const std::vector<u8>& in, const float* x, FILE* out) {
  const int blocks = (int)in.size() / GgufBlock<T>::bytes;
  for (int n = 0, e = 0; n < blocks; ++n)
    for (int g = 0; g < GgufBlock<T>::values / 32; ++g, ++e) {
      const u8* block = in.data() + (size_t)n * GgufBlock<T>::bytes;
      if (x == nullptr) {
        float v[32];
        gguf_group<T>(block, g, v);
        fwrite(v, 4, 32, out);
      } else {
        float xg[32];
        for (int j = 0; j < 32; ++j) xg[j] = x[32 * e + j];
        const float xsum = gguf_dot_prepare<T>(xg);
        const float dot = gguf_dot<T>(block, g, xg, xsum);
        fwrite(&dot, 4, 1, out);
      }
    }
}
static std::vector<u8> slurp(const char* path) {
  FILE* f = fopen(path, "rb");
  std::vector<u8> in;
  for (int c; (c = fgetc(f)) != EOF;) in.push_back((u8)c);
  fclose(f);
  return in;
}
int main(int argc, char** argv) {
  int type = 0;
  sscanf(argv[1], "%%d", &type);
  const std::vector<u8> in = slurp(argv[2]);
  const std::vector<u8> xs = argc > 4 ? slurp(argv[4]) : std::vector<u8>();
  const float* x = argc > 4 ? reinterpret_cast<const float*>(xs.data()) : nullptr;
  FILE* out = fopen(argv[3], "wb");
  switch (type) {
%(cases)s
  }
  fclose(out);
  return 0;
}
"""


def _scale_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite binary16 words of either sign, zero and subnormals up to about 8 in magnitude
    (large enough to reach every exponent path, small enough that no value overflows)."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << np.uint16(15)
    exponent = rng.integers(0, 18, n, dtype=np.uint16) << np.uint16(10)
    bits = sign | exponent | rng.integers(0, 1024, n, dtype=np.uint16)
    bits[: len(EDGE_SCALES)] = EDGE_SCALES
    return bits


def _random_blocks(fmt: str, seed: int) -> np.ndarray:
    """Random block bytes with finite scales; d and dmin drawn independently."""
    _, _, block_bytes = FORMAT_BLOCKS[fmt]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(N_BLOCKS, block_bytes), dtype=np.uint8)
    if fmt == "gguf_iq1_m":  # its scale is spread over four words: set_scales knows how
        gguf_blocks.set_scales(fmt, blocks, _scale_bits(rng, N_BLOCKS))
    block_type = next(bt for bt in gguf_blocks._BLOCK_TYPES if bt.format == fmt)
    for _, offset in block_type.f16_fields:
        bits = _scale_bits(rng, N_BLOCKS)
        blocks[:, offset] = (bits & np.uint16(0xFF)).astype(np.uint8)
        blocks[:, offset + 1] = (bits >> np.uint16(8)).astype(np.uint8)
    return blocks


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: the host build of the GGUF decoders cannot be checked")
    root = tmp_path_factory.mktemp("gguf_host")
    types = sorted(t for t, _, _ in FORMAT_BLOCKS.values())
    (root / "decode.cpp").write_text(
        HARNESS
        % {
            "tables": source(),
            "decoders": (KERNEL_DIR / "gguf_decode.cuh").read_text(),
            "cases": "\n".join(f"    case {t}: run<{t}>(in, x, out); break;" for t in types),
        }
    )
    binary = root / "decode"
    flags = ["-std=c++17", "-O2", "-ffp-contract=off"]
    built = subprocess.run(
        [compiler, *flags, "-o", str(binary), str(root / "decode.cpp")],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    return binary


@pytest.mark.parametrize("fmt", sorted(FORMAT_BLOCKS))
def test_host_decoders_match_the_numpy_decoder(fmt: str, decoder: Path, tmp_path: Path) -> None:
    ggml_type, values, _ = FORMAT_BLOCKS[fmt]
    blocks = _random_blocks(fmt, seed=ggml_type)
    (tmp_path / "in").write_bytes(blocks.tobytes())
    subprocess.run(
        [str(decoder), str(ggml_type), str(tmp_path / "in"), str(tmp_path / "out")], check=True
    )
    got = np.fromfile(tmp_path / "out", dtype=np.float32)
    assert got.size == N_BLOCKS * values
    want = codec_for(fmt, LAYOUT).decode(blocks.reshape(-1), (N_BLOCKS, values)).reshape(-1)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", sorted(FORMAT_BLOCKS))
def test_host_group_dot_products_are_within_float32_rounding(
    fmt: str, decoder: Path, tmp_path: Path
) -> None:
    """``gguf_dot`` (the GEMV's per-group product, factored for some types) against the
    float64 product with the numpy decoder's values, within float32 rounding of the
    magnitudes it sums (``term_magnitudes``)."""
    ggml_type, values, _ = FORMAT_BLOCKS[fmt]
    blocks = _random_blocks(fmt, seed=ggml_type + 1)
    groups = N_BLOCKS * values // 32
    x = np.random.default_rng(ggml_type).standard_normal((groups, 32)).astype(np.float32)
    (tmp_path / "in").write_bytes(blocks.tobytes())
    (tmp_path / "x").write_bytes(x.tobytes())
    args = [str(decoder), str(ggml_type), str(tmp_path / "in"), str(tmp_path / "out")]
    subprocess.run([*args, str(tmp_path / "x")], check=True)
    got = np.fromfile(tmp_path / "out", dtype=np.float32).astype(np.float64)
    shape = (N_BLOCKS, values)
    w = codec_for(fmt, LAYOUT).decode(blocks.reshape(-1), shape).astype(np.float64)
    want = (x * w.reshape(groups, 32)).sum(axis=1)
    terms = term_magnitudes(fmt, blocks, shape).reshape(groups, 32)
    bound = 2e-6 * (np.abs(x) * terms).sum(axis=1) + 1e-30
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)


def test_the_gguf_gemv_takes_every_row_count_the_backend_gives_it() -> None:
    """Launches of up to ``MAX_GEMV_ROWS`` rows, and the MoE's groups of that many pairs, each
    have a compiled GGUF kernel (importing the launchers needs no GPU)."""
    from ninfer_runtime.backends.cuda import gguf_blocks, kernels, moe

    assert max(gguf_blocks.ROWS_PER_WARP) == kernels.MAX_GEMV_ROWS
    assert gguf_blocks.EXPERT_GROUP == moe.GROUP_PAIRS
