"""The tensor-core product's policies for ggml K-quant blocks (``kernels/gemm_small_gguf.cuh``)
built with the host compiler: for every row, group, lane chunk and fragment slot, the weight
the slot holds (scale x code - min, as the kernel applies them) against the numpy decoder's
value at the column the kernel pairs the slot with (``prep_x``: the chunk's x at
``perm(j, i)``), and every column of a row covered once. A wrong bit field, byte order or
permutation is caught without a GPU; the GPU suite runs the same policies in the kernel."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, LAYOUT
from ninfer_runtime.backends.cuda.compile import KERNEL_DIR
from ninfer_runtime.backends.cuda.kernels import SMALL_HEADERS
from tests.runtime.test_gguf_decode_host import _random_blocks

#: format -> the policy type the kernel instantiates for it (kernels/gemm_small.cu)
POLICIES = {
    "gguf_q4_k": "SmallGgufK<12>",
    "gguf_q5_k": "SmallGgufK<13>",
    "gguf_q6_k": "SmallGgufQ6K",
}
ROWS = 3

HARNESS = r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define __device__
#define __forceinline__ inline
struct uint2 { u32 x, y; };
struct uint4 { u32 x, y, z, w; };
template <class T> static T __ldg(const T* p) { T v; __builtin_memcpy(&v, p, sizeof(T)); return v; }
static float f16_to_f32(u16 h) { _Float16 f; __builtin_memcpy(&f, &h, 2); return (float)f; }
#include <cstdio>
#include <vector>
@HEADERS@
static float bf16(u32 half) {
  const u32 bits = half << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// per (row, group, chunk, mma, slot): the column the slot pairs with, and the weight it holds
template <class F>
static void run(const std::vector<u8>& in, int rows, int groups, FILE* out) {
  SmallArgs a{in.data(), 0, 0, (int)(in.size() / rows / F::BYTES), 1};
  for (int n = 0; n < rows; ++n)
    for (int q = 0; q < groups; ++q)
      for (int c = 0; c < 4; ++c) {
        typename F::Raw r;
        F::load(r, a, n, q, c);
        for (int j = 0; j < F::GW / 16; ++j) {
          u32 lo, hi;
          F::frag(r, j, lo, hi);
          const u32 words[2] = {lo, hi};
          for (int i = 0; i < 4; ++i) {
            const float code = bf16((words[i / 2] >> (16 * (i % 2))) & 0xFFFFu);
            const float w = F::scale(r) * code - F::minimum(r);
            const int column = q * F::GW + c * (F::GW / 4) + F::perm(j, i);
            fwrite(&n, 4, 1, out);
            fwrite(&column, 4, 1, out);
            fwrite(&w, 4, 1, out);
          }
        }
      }
}
int main(int argc, char** argv) {
  int rows = 0, groups = 0;
  sscanf(argv[1], "%d", &rows);
  sscanf(argv[2], "%d", &groups);
  FILE* f = fopen(argv[3], "rb");
  std::vector<u8> in;
  for (int c; (c = fgetc(f)) != EOF;) in.push_back((u8)c);
  fclose(f);
  FILE* out = fopen(argv[4], "wb");
  run<@POLICY@>(in, rows, groups, out);
  fclose(out);
  return 0;
}
"""


def _build(fmt: str, root: Path) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: the host build of the tensor-core GGUF policies cannot run")
    headers = "\n".join((KERNEL_DIR / h).read_text() for h in SMALL_HEADERS)
    source = root / f"{fmt}.cpp"
    source.write_text(HARNESS.replace("@HEADERS@", headers).replace("@POLICY@", POLICIES[fmt]))
    binary = root / fmt
    flags = ["-std=c++17", "-O1", "-ffp-contract=off"]
    built = subprocess.run(
        [compiler, *flags, "-o", str(binary), str(source)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    return binary


@pytest.mark.parametrize("fmt", sorted(POLICIES))
def test_fragments_hold_the_decoded_weights_of_their_columns(fmt: str, tmp_path: Path) -> None:
    ggml_type, values, _ = FORMAT_BLOCKS[fmt]
    blocks_per_row = 2
    blocks = _random_blocks(fmt, seed=ggml_type)[: ROWS * blocks_per_row]
    columns = blocks_per_row * values
    group = 16 if fmt == "gguf_q6_k" else 32
    (tmp_path / "in").write_bytes(blocks.tobytes())
    binary = _build(fmt, tmp_path)
    args = [str(ROWS), str(columns // group), str(tmp_path / "in"), str(tmp_path / "out")]
    subprocess.run([str(binary), *args], check=True)
    out = np.fromfile(tmp_path / "out", dtype=np.int32).reshape(-1, 3)
    rows, cols, got = out[:, 0], out[:, 1], out[:, 2].view(np.float32)
    w = codec_for(fmt, LAYOUT).decode(blocks.reshape(-1), (ROWS, columns))
    assert np.isfinite(w).all()
    covered = np.zeros((ROWS, columns), dtype=np.int64)
    np.add.at(covered, (rows, cols), 1)
    assert (covered == 1).all(), "every column of every row held by exactly one slot"
    np.testing.assert_array_equal(got.view(np.uint32), w[rows, cols].view(np.uint32))
