// Decode attention over a paged KV pool (split-K "flash decoding"), and the KV-cache write.
//
// Pools are [pages, PAGE, Nkv, D]: float32, bf16 words (u16) or unscaled E4M3FN bytes (u8);
// token t of the sequence in slot s lives in page page_table[s, t / PAGE], row t % PAGE. Each
// lane i has one query token that attends over tokens 0..positions[i]. The reference is
// array_ops.attention_decode.
//
// attn_partial: grid (N, Nkv, SPLITS), ATTN_WARPS warps. A block takes one kv head, the G
// query heads that read it, and the tokens [split * chunk, split * chunk + chunk) clipped to
// the lane's position. Each warp runs an online softmax over its own tokens (a whole D-wide
// row per warp: coalesced loads, dot products finished with shuffles); the warps' states are
// merged through shared memory into one partial (m, l, acc[D]) per query head. Scores are
// kept in the log2 domain (q is pre-scaled by scale * log2(e)) so every exponential is exp2f.
// attn_combine: grid (N, Nq), D threads: merges the used splits of each query head.

#define ATTN_WARPS 4
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f

// The D / 32 columns of a row that `lane` holds, element c: float rows are read as float4
// pieces interleaved across the warp (each load instruction covers 512 contiguous bytes);
// bf16 and E4M3 rows as one load of D / 32 contiguous elements (at most 16 bytes) per lane.
template <int D, typename T>
__device__ __forceinline__ int column(int lane, int c) {
  constexpr int VEC = D / 32;
  if (sizeof(T) == 4 && VEC >= 4) return ((c >> 2) * 32 + lane) * 4 + (c & 3);
  return lane * VEC + c;
}

// A lane's D / 32 elements of one K or V row as stored: rows are kept in registers in this
// form and decoded where they are used, so narrower storage keeps proportionally more rows in
// flight for the same registers.
template <int D, typename T>
struct RowBits {
  static constexpr int WORDS = (D / 32) * (int)sizeof(T) >= 4 ? (D / 32) * (int)sizeof(T) / 4 : 1;
  u32 w[WORDS];
};

template <int D, typename T>
__device__ __forceinline__ void load_bits(const T* __restrict__ row, int lane,
                                          RowBits<D, T>& b) {
  constexpr int VEC = D / 32, BYTES = VEC * (int)sizeof(T);
  if constexpr (sizeof(T) == 4 && VEC >= 4) {  // interleaved float4 pieces (see column)
#pragma unroll
    for (int p = 0; p < VEC / 4; ++p) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(row) + p * 32 + lane);
      b.w[4 * p] = u.x;
      b.w[4 * p + 1] = u.y;
      b.w[4 * p + 2] = u.z;
      b.w[4 * p + 3] = u.w;
    }
  } else if constexpr (BYTES == 16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(row) + lane);
    b.w[0] = u.x;
    b.w[1] = u.y;
    b.w[2] = u.z;
    b.w[3] = u.w;
  } else if constexpr (BYTES == 8) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(row) + lane);
    b.w[0] = u.x;
    b.w[1] = u.y;
  } else if constexpr (BYTES == 4) {
    b.w[0] = __ldg(reinterpret_cast<const u32*>(row) + lane);
  } else if constexpr (BYTES == 2) {
    b.w[0] = __ldg(reinterpret_cast<const u16*>(row) + lane);
  } else {
    b.w[0] = __ldg(reinterpret_cast<const u8*>(row) + lane);
  }
}

template <int D, typename T>
__device__ __forceinline__ void decode_row(const RowBits<D, T>& b, float (&x)[D / 32]) {
  constexpr int VEC = D / 32;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) x[c] = __uint_as_float(b.w[c]);
  } else if constexpr (sizeof(T) == 2) {
    if constexpr (VEC == 1) {
      x[0] = bf16_to_f32(b.w[0]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC / 2; ++j) bf16x2(b.w[j], x[2 * j], x[2 * j + 1]);
    }
  } else {  // E4M3FN bytes, decoded in pairs (one conversion instruction per pair on sm_89+)
    if constexpr (VEC == 1) {
      x[0] = e4m3_to_f32(b.w[0]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC / 2; ++j)
        e4m3x2_to_f32(b.w[j / 2] >> (16 * (j & 1)), x[2 * j], x[2 * j + 1]);
    }
  }
}

// ws_acc [N, Nkv, SPLITS, G, D] and ws_ml [N, Nkv, SPLITS, G, 2] (m in log2 units, l): the
// unnormalised partials. A split that starts past the position writes m = -inf, l = 0.
// Three blocks per SM where q and the accumulators leave room (G * D / 32 <= 48, e.g. the
// 27B's D 256 with 6 query heads per kv head): without the bound the bf16 instance there
// takes 208 registers and only two blocks fit.
template <int D, int G>
__host__ __device__ constexpr int attn_min_blocks() {
  return G * (D / 32) <= 48 ? 3 : 1;
}

template <int D, int G, typename T>
__global__ void __launch_bounds__(ATTN_WARPS * 32, attn_min_blocks<D, G>())
    attn_partial(const float* __restrict__ q, const T* __restrict__ k_pages,
                 const T* __restrict__ v_pages, const int* __restrict__ page_table,
                 const int* __restrict__ slots, const int* __restrict__ positions, int nkv,
                 int page, int max_pages, int chunk, float scale, float* __restrict__ ws_acc,
                 float* __restrict__ ws_ml) {
  constexpr int VEC = D / 32;
  // tokens per warp per step (that many K and V rows in flight per warp): fewer when q and
  // the accumulators already take many registers, twice as many for 1- and 2-byte storage
  constexpr int UNROLL = (G * VEC > 16 ? 2 : 4) * (sizeof(T) == 4 ? 1 : 2);
  __shared__ float s_acc[ATTN_WARPS][G][D];
  __shared__ float s_m[ATTN_WARPS][G], s_l[ATTN_WARPS][G];

  const int i = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long part = ((long long)(i * nkv + h) * gridDim.z + split) * G;  // (i, h, split, 0)
  const int start = split * chunk;
  // inclusive; a position past the table's reach attends to every token it names (as the
  // reference does), so nothing is read beyond the table
  const int end = min(min(positions[i], max_pages * page - 1), start + chunk - 1);
  if (start > end) {
    if (threadIdx.x < G) {
      ws_ml[(part + threadIdx.x) * 2] = NEG_INF;
      ws_ml[(part + threadIdx.x) * 2 + 1] = 0.f;
    }
    return;
  }

  // q of the group in registers, pre-scaled into the log2 domain
  float qr[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float* qh = q + ((long long)i * nkv * G + h * G + g) * D;
#pragma unroll
    for (int c = 0; c < VEC; ++c) qr[g][c] = qh[column<D, T>(lane, c)] * (scale * LOG2E);
  }

  const int* table = page_table + (long long)slots[i] * max_pages;
  const long long token_stride = (long long)nkv * D;
  float m[G], l[G], acc[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = NEG_INF;
    l[g] = 0.f;
#pragma unroll
    for (int c = 0; c < VEC; ++c) acc[g][c] = 0.f;
  }

  // page ids of the step's tokens, fetched one step ahead so the row loads do not wait on them
  int pg[UNROLL];
  int t0 = start + warp * UNROLL;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) pg[u] = t0 + u <= end ? table[(t0 + u) / page] : 0;
  for (; t0 <= end; t0 += ATTN_WARPS * UNROLL) {
    RowBits<D, T> kb[UNROLL], vb[UNROLL];  // all zero bits decode to 0 in every storage type
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int t = t0 + u;
      if (t <= end) {
        const long long off =
            ((long long)pg[u] * page + t % page) * token_stride + (long long)h * D;
        load_bits<D>(k_pages + off, lane, kb[u]);
        load_bits<D>(v_pages + off, lane, vb[u]);
      } else {
#pragma unroll
        for (int j = 0; j < RowBits<D, T>::WORDS; ++j) kb[u].w[j] = vb[u].w[j] = 0u;
      }
    }
    const int next = t0 + ATTN_WARPS * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) pg[u] = next + u <= end ? table[(next + u) / page] : 0;
    float s[UNROLL][G];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float kx[VEC];
      decode_row<D>(kb[u], kx);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < VEC; ++c) dot = fmaf(qr[g][c], kx[c], dot);
        s[u][g] = dot;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
        for (int g = 0; g < G; ++g) s[u][g] += __shfl_xor_sync(0xFFFFFFFFu, s[u][g], off);
      }
    }
    // s becomes the step's probabilities p (unnormalised); acc is rescaled to the new max
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (t0 + u <= end) mx = fmaxf(mx, s[u][g]);
      const float alpha = exp2f(m[g] - mx);  // 0 on the first step (m = -inf)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        s[u][g] = t0 + u <= end ? exp2f(s[u][g] - mx) : 0.f;
        l[g] = u == 0 ? fmaf(l[g], alpha, s[0][g]) : l[g] + s[u][g];
      }
#pragma unroll
      for (int c = 0; c < VEC; ++c) acc[g][c] *= alpha;
      m[g] = mx;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float vx[VEC];
      decode_row<D>(vb[u], vx);
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int c = 0; c < VEC; ++c) acc[g][c] = fmaf(s[u][g], vx[c], acc[g][c]);
    }
  }

  // merge the warps (a warp with no tokens has m = -inf, l = 0, acc = 0; warp 0 always has
  // the split's first token, so the merged max is finite)
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) s_acc[warp][g][column<D, T>(lane, c)] = acc[g][c];
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * D; e += ATTN_WARPS * 32) {
    const int g = e / D, d = e % D;
    float mx = NEG_INF;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) mx = fmaxf(mx, s_m[w][g]);
    float a = 0.f, sum = 0.f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) {
      const float wt = s_m[w][g] == NEG_INF ? 0.f : exp2f(s_m[w][g] - mx);
      a = fmaf(s_acc[w][g][d], wt, a);
      sum = fmaf(s_l[w][g], wt, sum);
    }
    ws_acc[(part + g) * D + d] = a;
    if (d == 0) {
      ws_ml[(part + g) * 2] = mx;
      ws_ml[(part + g) * 2 + 1] = sum;
    }
  }
}

#define MAX_SPLITS 256  // must match MAX_SPLITS in attention.py

// Sum (or max) over the block's D threads; every thread gets the result.
template <int D, bool MAX>
__device__ __forceinline__ float block_reduce(float x, float* s_red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float y = __shfl_xor_sync(0xFFFFFFFFu, x, off);
    x = MAX ? fmaxf(x, y) : x + y;
  }
  if (D == 32) return x;
  if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = x;
  __syncthreads();
  x = s_red[0];
#pragma unroll
  for (int w = 1; w < D / 32; ++w) x = MAX ? fmaxf(x, s_red[w]) : x + s_red[w];
  __syncthreads();  // s_red is reused by the next reduction
  return x;
}

// out [N, Nq, D]: block (i, j) merges the splits of lane i that hold tokens (those up to its
// position), query head j; the threads first share out the splits' weights, then thread d
// sums column d (independent loads, unrolled so several are in flight).
template <int D>
__global__ void __launch_bounds__(D)
    attn_combine(const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
                 const int* __restrict__ positions, int nkv, int group, int splits, int chunk,
                 int max_context, float* __restrict__ out) {
  __shared__ float s_w[MAX_SPLITS];
  __shared__ float s_red[D / 32];
  const int i = blockIdx.x, j = blockIdx.y, d = threadIdx.x;
  const int h = j / group, g = j % group;
  const int last = min(positions[i], max_context - 1);
  const int used = last < 0 ? 0 : min(last / chunk + 1, splits);
  const long long base = (long long)(i * nkv + h) * splits * group + g;  // (i, h, 0, g)
  float mx = NEG_INF;
  for (int s = d; s < used; s += D) mx = fmaxf(mx, ws_ml[(base + (long long)s * group) * 2]);
  mx = block_reduce<D, true>(mx, s_red);
  float sum = 0.f;
  for (int s = d; s < used; s += D) {
    const long long e = (base + (long long)s * group) * 2;
    const float m = ws_ml[e];
    const float wt = m == NEG_INF ? 0.f : exp2f(m - mx);
    s_w[s] = wt;
    sum = fmaf(ws_ml[e + 1], wt, sum);
  }
  sum = block_reduce<D, false>(sum, s_red);  // its barrier also publishes s_w
  float a = 0.f;
#pragma unroll 8
  for (int s = 0; s < used; ++s) a = fmaf(ws_acc[(base + (long long)s * group) * D + d], s_w[s], a);
  // no visible token (a negative position): 0 / 0 = NaN, as the reference's softmax gives
  out[((long long)i * nkv * group + j) * D + d] = a / sum;
}

// float32 -> E4M3FN byte, unscaled (ninfer_runtime.state.to_e4m3_bytes): round to nearest
// even, magnitudes beyond 448 saturate (the format has no infinity), NaN keeps its sign.
// Normal codes round the float32 pattern to 3 fraction bits (a carry into the exponent is
// the right answer); below 2^-6 the codes are the multiples of 2^-9.
__device__ __forceinline__ u8 f32_to_e4m3(float f) {
  const u32 bits = __float_as_uint(f), sign = (bits >> 24) & 0x80u;
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (u8)(sign | 0x7Fu);
  const float a = fminf(fabsf(f), 448.f);
  const u32 m = __float_as_uint(a);
  const u32 code = a >= 0.015625f ? ((m + 0x7FFFFu + ((m >> 20) & 1u)) >> 20) - (120u << 3)
                                  : (u32)__float2int_rn(a * 512.f);
  return (u8)(sign | code);
}

__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(u16* p, float x) { *p = f32_to_bf16_rn(x); }
__device__ __forceinline__ void store(u8* p, float x) { *p = f32_to_e4m3(x); }

// Row i of k, v [N, Nkv, D] (float32) goes to token positions[i] of slot slots[i]. A position
// outside the table's reach (negative, or >= max_pages * page) writes nothing.
template <typename T>
__global__ void kv_write(T* __restrict__ k_pages, T* __restrict__ v_pages,
                         const int* __restrict__ page_table, const int* __restrict__ slots,
                         const int* __restrict__ positions, const float* __restrict__ k,
                         const float* __restrict__ v, int n, int row_width, int page,
                         int max_pages) {
  const long long total = (long long)n * row_width;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const int i = (int)(e / row_width), r = (int)(e % row_width);
    const int pos = positions[i];
    if (pos < 0 || pos >= max_pages * page) continue;
    const long long pg = page_table[(long long)slots[i] * max_pages + pos / page];
    const long long dst = (pg * page + pos % page) * row_width + r;
    store(k_pages + dst, k[e]);
    store(v_pages + dst, v[e]);
  }
}
