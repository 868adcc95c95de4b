// GGUF blocks read in place (layout gguf_blocks_v1): a [N, K] object is N rows of K / values
// ggml blocks back to back. TYPE is the ggml type id; gguf_group<TYPE> (gguf_decode.cuh)
// decodes one group of 32 consecutive values of a block exactly as the numpy decoder does.

#define GGUF_WARPS 8

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

// y[mm, r] = sum_k x[mm, k] W[row0 + r, k] for the m <= M rows of x: one warp per output row
// (blockIdx.x picks the block's rows), its lanes over the row's groups of 32 (neighbouring
// lanes read neighbouring bytes), float32 sums reduced across the warp at the end.
template <int TYPE, int M>
__device__ __forceinline__ void gguf_gemv_body(const u8* __restrict__ obj, int blocks_per_row,
                                               int row0, int rows, int m,
                                               const float* __restrict__ x, int ldx,
                                               float* __restrict__ y, int ldy) {
  constexpr int G = GgufBlock<TYPE>::values / 32, B = GgufBlock<TYPE>::bytes;
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * GGUF_WARPS + (threadIdx.x >> 5);
  if (r >= rows) return;
  const u8* row = obj + (long long)(row0 + r) * blocks_per_row * B;
  const int groups = blocks_per_row * G;
  float acc[M];
#pragma unroll
  for (int mm = 0; mm < M; ++mm) acc[mm] = 0.f;
  for (int g = lane; g < groups; g += 32) {
    float v[32];
    gguf_group<TYPE>(row + (g / G) * B, g % G, v);
#pragma unroll
    for (int mm = 0; mm < M; ++mm) {
      if (mm < m) {
        const float4* xs = reinterpret_cast<const float4*>(x + (long long)mm * ldx + 32 * g);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 t = __ldg(xs + j);
          s += v[4 * j] * t.x + v[4 * j + 1] * t.y + v[4 * j + 2] * t.z + v[4 * j + 3] * t.w;
        }
        acc[mm] += s;
      }
    }
  }
#pragma unroll
  for (int mm = 0; mm < M; ++mm) {
    float s = acc[mm];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0 && mm < m) y[(long long)mm * ldy + r] = s;
  }
}

template <int TYPE, int M>
__global__ void __launch_bounds__(GGUF_WARPS * 32)
    gguf_gemv(const u8* __restrict__ obj, int blocks_per_row, int row0, int rows, int m,
              const float* __restrict__ x, int ldx, float* __restrict__ y, int ldy) {
  gguf_gemv_body<TYPE, M>(obj, blocks_per_row, row0, rows, m, x, ldx, y, ldy);
}

// The experts' product, one unit a blockIdx.y: y[u * M + mm, r] = x[xrow + mm] . row
// row0[e] + r of the object at base[e], e = ids[u]. M = 1: units are (token, slot) pairs, xrow
// = u when x_per_unit (x holds a row a pair) else u / k; M > 1: units are groups of M pairs of
// one expert, xrow = u * M; a group past the real ones (expert -1) is skipped.
template <int TYPE, int M>
__global__ void __launch_bounds__(GGUF_WARPS * 32)
    gguf_gemv_experts(const long long* __restrict__ base, const int* __restrict__ row0,
                      const int* __restrict__ ids, int k, int x_per_unit, int blocks_per_row,
                      int rows, const float* __restrict__ x, int ldx, float* __restrict__ y,
                      int ldy) {
  const long long u = blockIdx.y;
  const int e = ids[u];
  if (e < 0) return;
  const long long xrow = M > 1 || x_per_unit ? u * M : u / k;
  gguf_gemv_body<TYPE, M>(reinterpret_cast<const u8*>(base[e]), blocks_per_row, row0[e], rows, M,
                          x + xrow * ldx, ldx, y + u * M * ldy, ldy);
}
