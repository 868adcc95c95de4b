// GGUF blocks read in place (layout gguf_blocks_v1): a [N, K] object is N rows of K / values
// ggml blocks back to back. TYPE is the ggml type id; gguf_group<TYPE> (gguf_decode.cuh)
// decodes one group of 32 consecutive values of a block exactly as the numpy decoder does.

// GGUF_WARPS, the warps of a GEMV block, comes from the launcher (gguf_blocks.WARPS) in the
// prelude: each warp stages two chunks of R rows, up to 35 KB a block (q8_0).

// out[i, :] = W[rows[i], :], as float32 or as bf16 words (rounded to nearest even): one
// thread per group of 32 values.
__device__ __forceinline__ void store_group(float* out, const float v[32]) {
  float4* o = reinterpret_cast<float4*>(out);
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
}
__device__ __forceinline__ void store_group(u16* out, const float v[32]) {
  uint4* o = reinterpret_cast<uint4*>(out);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    u32 w[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int e = 8 * j + 2 * t;
      w[t] = (u32)f32_to_bf16_rn(v[e]) | ((u32)f32_to_bf16_rn(v[e + 1]) << 16);
    }
    o[j] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int TYPE, typename T>
__device__ __forceinline__ void gguf_dequant_body(const u8* __restrict__ obj, int blocks_per_row,
                                                  const int* __restrict__ rows, int nrows, int k,
                                                  T* __restrict__ out) {
  constexpr int G = GgufBlock<TYPE>::values / 32, B = GgufBlock<TYPE>::bytes;
  const int groups = k / 32;
  const long long total = (long long)nrows * groups;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long i = e / groups;
    const int g = (int)(e - i * groups);
    const u8* block = obj + ((long long)rows[i] * blocks_per_row + g / G) * B;
    float v[32];
    gguf_group<TYPE>(block, g % G, v);
    store_group(out + i * k + 32LL * g, v);
  }
}

template <int TYPE>
__global__ void gguf_dequant_rows(const u8* __restrict__ obj, int blocks_per_row,
                                  const int* __restrict__ rows, int nrows, int k,
                                  float* __restrict__ out) {
  gguf_dequant_body<TYPE>(obj, blocks_per_row, rows, nrows, k, out);
}

template <int TYPE>
__global__ void gguf_dequant_rows_bf16(const u8* __restrict__ obj, int blocks_per_row,
                                       const int* __restrict__ rows, int nrows, int k,
                                       u16* __restrict__ out) {
  gguf_dequant_body<TYPE>(obj, blocks_per_row, rows, nrows, k, out);
}

// y[mm, r] = sum_k x[mm, k] W[row0 + r, k] for the m <= M rows of x. A warp owns R
// consecutive output rows (blockIdx.x picks the block's) and walks them in chunks of about
// 1,024 values, two chunks in flight: while it works on one, cp.async copies every row's next
// chunk of blocks into the other half of its shared memory (coalesced 16-byte copies, R rows'
// at once). Each lane takes one group of 32 values of each row from there: with one x row,
// its dot product with the x values it loaded once for all R rows (gguf_dot); with more, the
// R rows' groups decoded once and each x row's values loaded once for all of them. Float32
// sums, reduced across the warp at the end. A copy starts at the 16-byte boundary below its blocks and may read up to 15 bytes
// past an object's last row: device allocations are rounded up to 512 bytes, so that stays
// inside the allocation.
template <int TYPE>
struct GgufChunk {
  static constexpr int values = GgufBlock<TYPE>::values;
  static constexpr int blocks = values >= 1024 ? 1 : 1024 / values;  // 32 groups: one a lane
  static constexpr int units = (blocks * GgufBlock<TYPE>::bytes + 15) / 16 + 1;  // 16-byte units
};

// the first byte of row r's chunk at block b0 (rows past the end copy the last row, never
// written)
__device__ __forceinline__ const u8* gguf_chunk_start(const u8* obj, long long row_bytes,
                                                      int row, int b0, int block_bytes) {
  return obj + (long long)row * row_bytes + (long long)b0 * block_bytes;
}

template <int TYPE, int R>
__device__ __forceinline__ void gguf_issue_chunk(uint4 (*stage)[GgufChunk<TYPE>::units],
                                                 const u8* obj, long long row_bytes, int row0,
                                                 int first, int rows, int b0, int nb, int lane) {
  constexpr int B = GgufBlock<TYPE>::bytes;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const u8* p = gguf_chunk_start(obj, row_bytes, row0 + min(first + r, rows - 1), b0, B);
    const uint4* a = reinterpret_cast<const uint4*>(reinterpret_cast<unsigned long long>(p) & ~15ull);
    const int n16 = ((int)(p - reinterpret_cast<const u8*>(a)) + nb * B + 15) / 16;
    for (int i = lane; i < n16; i += 32) cp_async16(&stage[r][i], a + i, true);
  }
}

template <int TYPE, int M, int R>
__device__ __forceinline__ void gguf_gemv_body(const u8* __restrict__ obj, int blocks_per_row,
                                               int row0, int rows, int m,
                                               const float* __restrict__ x, int ldx,
                                               float* __restrict__ y, int ldy) {
  using C = GgufChunk<TYPE>;
  constexpr int G = GgufBlock<TYPE>::values / 32, B = GgufBlock<TYPE>::bytes;
  __shared__ uint4 stage[2][GGUF_WARPS][R][C::units];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int first = (blockIdx.x * GGUF_WARPS + warp) * R;
  if (first >= rows) return;
  const long long row_bytes = (long long)blocks_per_row * B;
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int mm = 0; mm < M; ++mm) acc[r][mm] = 0.f;
  gguf_issue_chunk<TYPE, R>(stage[0][warp], obj, row_bytes, row0, first, rows, 0,
                            min(C::blocks, blocks_per_row), lane);
  cp_commit();
  for (int b0 = 0, c = 0; b0 < blocks_per_row; b0 += C::blocks, ++c) {
    const int nb = min(C::blocks, blocks_per_row - b0), next = b0 + C::blocks;
    if (next < blocks_per_row)
      gguf_issue_chunk<TYPE, R>(stage[(c + 1) & 1][warp], obj, row_bytes, row0, first, rows, next,
                                min(C::blocks, blocks_per_row - next), lane);
    cp_commit();  // (an empty group at the last chunk keeps the count of groups in flight)
    cp_wait<1>();
    __syncwarp();
    uint4 (*here)[C::units] = stage[c & 1][warp];
    const int g = lane;  // this lane's group of the chunk
    if (g < nb * G) {
      const int col = (b0 * G + g) * 32;
      if (M == 1) {
        float xv[32];
        const float4* xs = reinterpret_cast<const float4*>(x + col);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 t = __ldg(xs + j);
          xv[4 * j] = t.x, xv[4 * j + 1] = t.y, xv[4 * j + 2] = t.z, xv[4 * j + 3] = t.w;
        }
        const float xsum = gguf_dot_prepare<TYPE>(xv);
        // unrolled, rows decoded whole (not factored) need too many registers
#pragma unroll(GgufFactored<TYPE>::value ? R : 1)
        for (int r = 0; r < R; ++r) {
          const u8* p = gguf_chunk_start(obj, row_bytes, row0 + min(first + r, rows - 1), b0, B);
          const int lead = (int)(reinterpret_cast<unsigned long long>(p) & 15ull);
          acc[r][0] += gguf_dot<TYPE>(reinterpret_cast<const u8*>(here[r]) + lead + (g / G) * B,
                                      g % G, xv, xsum);
        }
      } else {  // the R rows' groups decoded first, so that each x load serves all of them
        float v[R][32];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const u8* p = gguf_chunk_start(obj, row_bytes, row0 + min(first + r, rows - 1), b0, B);
          const int lead = (int)(reinterpret_cast<unsigned long long>(p) & 15ull);
          gguf_group<TYPE>(reinterpret_cast<const u8*>(here[r]) + lead + (g / G) * B, g % G, v[r]);
        }
#pragma unroll
        for (int mm = 0; mm < M; ++mm) {
          if (mm < m) {
            const float4* xs = reinterpret_cast<const float4*>(x + (long long)mm * ldx + col);
            float s[R];
#pragma unroll
            for (int r = 0; r < R; ++r) s[r] = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const float4 t = __ldg(xs + j);
#pragma unroll
              for (int r = 0; r < R; ++r)
                s[r] += v[r][4 * j] * t.x + v[r][4 * j + 1] * t.y + v[r][4 * j + 2] * t.z +
                        v[r][4 * j + 3] * t.w;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][mm] += s[r];
          }
        }
      }
    }
    __syncwarp();  // every lane is done with this half before the next copy into it
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int mm = 0; mm < M; ++mm) {
      float s = acc[r][mm];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0 && mm < m && first + r < rows) y[(long long)mm * ldy + first + r] = s;
    }
}

template <int TYPE, int M, int R>
__global__ void __launch_bounds__(GGUF_WARPS * 32)
    gguf_gemv(const u8* __restrict__ obj, int blocks_per_row, int row0, int rows, int m,
              const float* __restrict__ x, int ldx, float* __restrict__ y, int ldy) {
  gguf_gemv_body<TYPE, M, R>(obj, blocks_per_row, row0, rows, m, x, ldx, y, ldy);
}

// The experts' product, one unit a blockIdx.y: y[u * M + mm, r] = x[xrow + mm] . row
// row0[e] + r of the object at base[e], e = ids[u]. M = 1: units are (token, slot) pairs, xrow
// = u when x_per_unit (x holds a row a pair) else u / k; M > 1: units are groups of M pairs of
// one expert, xrow = u * M; a group past the real ones (expert -1) is skipped.
template <int TYPE, int M, int R>
__global__ void __launch_bounds__(GGUF_WARPS * 32)
    gguf_gemv_experts(const long long* __restrict__ base, const int* __restrict__ row0,
                      const int* __restrict__ ids, int k, int x_per_unit, int blocks_per_row,
                      int rows, const float* __restrict__ x, int ldx, float* __restrict__ y,
                      int ldy) {
  const long long u = blockIdx.y;
  const int e = ids[u];
  if (e < 0) return;
  const long long xrow = M > 1 || x_per_unit ? u * M : u / k;
  gguf_gemv_body<TYPE, M, R>(reinterpret_cast<const u8*>(base[e]), blocks_per_row, row0[e], rows, M,
                          x + xrow * ldx, ldx, y + u * M * ldy, ldy);
}
