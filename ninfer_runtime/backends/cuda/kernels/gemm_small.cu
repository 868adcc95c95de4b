// Small-M products on tensor cores: y[m, r] = sum_k x[m, k] W[r, k] for M <= 8 * NT rows of x,
// reading the packed object in place (row_split q4/q5/q6/q8, NVFP4, bf16, and ggml's q4_k,
// q5_k and q6_k blocks).
//
// One mma.sync m16n8k16 multiplies a 16-row x 16-k tile of W (operand A, decoded from the
// packed codes straight into bf16 fragments) by a 16-k x 8 tile of xᵀ (operand B: eight
// activation rows). Every code value is an integer of at most 8 bits, exact in bf16; the group
// scale is applied to the fp32 result of the group's mmas. x is split as x = hi + lo, both
// bf16, so each product carries ~16 bits of x (error below 2^-16 |x|, far inside bf16
// tolerance) for two mmas per tile: the tensor pipe has room, the kernel is bound by memory.
// Without SPLIT (the production precision) only hi is multiplied: x rounded once to bf16
// (round to nearest even), one mma per tile.
// The split and the k order are done once per product (NAME_x, into fragment order), not by
// every warp that reads the same x.
//
// The sum over k may visit k in any order as long as A and B agree, so each lane's k-slots
// map to the weights that are cheapest to unpack from the bytes it loaded (F::PERM below).
// Thread (g, c) of a warp (g = lane / 4, c = lane % 4) owns rows g and g + 8 of each 16-row
// tile and the c-th quarter ("chunk") of every group; fragment slot i of mma j holds the
// chunk's weight PERM[j][i] (slots 2c, 2c+1, 2c+8, 2c+9 in the mma's numbering).
//
// Work split: a block's 4 warps take 4 consecutive tiles of 16 * R rows, walking U groups per
// iteration (all their loads issued before the first mma); gridDim.y splits
// the groups into S contiguous ranges. With S > 1 each block leaves its partial sums in
// `partial`, and the last block of a row range to finish (a counter per row range) adds the
// S partials in order: deterministic, and no second launch.

#define SMALL_WARPS 4

// --------------------------------------------------------------------- layout policies
// (what a policy provides: gemm_small_policy.cuh; the ggml K-quant ones: gemm_small_gguf.cuh)

// row_split_k128_v1, 4/5/6-bit codes: a group is 64 weights in 32 bytes, a chunk 16 weights
// (two words: nibble i of word w is weight 8w + i). Pair s of a word is (nibble s, nibble
// s + 4), which one shift and one mask place in the two halves of a bf16x2 word.
template <int BITS>
struct SmallRowSplit : PlainRows {
  static constexpr int GW = 64;
  static constexpr bool SCALED = true;
  struct Raw {
    uint2 q;
    u32 h;  // the chunk's high bits (q5: 16 bits, q6: 32 bits)
    float s;
  };
  static __device__ __forceinline__ void load(Raw& r, const SmallArgs& a, long long n, int q,
                                              int c) {
    const long long group = n * a.stride + q;
    r.q = __ldg(reinterpret_cast<const uint2*>(a.obj + group * 32) + c);
    r.s = f16_to_f32(__ldg(reinterpret_cast<const u16*>(a.obj + a.off2) + group));
    if (BITS == 5) r.h = __ldg(reinterpret_cast<const u16*>(a.obj + a.off1 + group * 8) + c);
    if (BITS == 6) r.h = __ldg(reinterpret_cast<const u32*>(a.obj + a.off1 + group * 16) + c);
  }
  // pair s (0..3) of word w (0..1): codes (8w + s, 8w + s + 4) as bf16 values
  static __device__ __forceinline__ u32 pair(const Raw& r, int w, int s) {
    constexpr u32 top = 1u << (BITS - 1);  // two's complement: flip the sign bit, subtract
    const u32 word = (w == 0 ? r.q.x : r.q.y) ^ (BITS == 4 ? 0x88888888u : 0u);
    u32 v = ((word >> (4 * s)) & 0x000F000Fu) | BF16_MAGIC2;
    if (BITS == 5) {
      // bits 8w .. 8w+7 of h are the chunk word's high bits; bit s -> 4, bit s+4 -> 20
      const u32 hb = (r.h >> (8 * w)) ^ 0xFFu;
      const u32 spread = (hb & 0x0Fu) | ((hb & 0xF0u) << 12);
      v |= ((spread >> s) & 0x00010001u) << 4;
    } else if (BITS == 6) {
      // bits 16w .. 16w+15 of h: two per weight; weight s -> bits 4-5, weight s+4 -> 20-21
      const u32 hb = (r.h >> (16 * w)) ^ 0xAAAAu;
      const u32 spread = (hb & 0xFFu) | ((hb & 0xFF00u) << 8);
      v |= ((spread >> (2 * s)) & 0x00030003u) << 4;
    }
    // (128 + (code ^ top)) - (128 + top) = code; 0x4300 + top is the bf16 128 + top
    constexpr u32 off = 0x4300u + top;
    return sub_bf16x2(v, off | (off << 16));
  }
  static __device__ __forceinline__ void frag(const Raw& r, int j, u32& lo, u32& hi) {
    lo = pair(r, j >> 1, 2 * (j & 1));
    hi = pair(r, j >> 1, 2 * (j & 1) + 1);
  }
  static __device__ __forceinline__ float scale(const Raw& r) { return r.s; }
  static __device__ __forceinline__ int perm(int j, int i) {
    // slots (2c, 2c+1) <- pair 2(j&1), slots (2c+8, 2c+9) <- pair 2(j&1)+1 of word j>>1
    const int s = 2 * (j & 1) + (i >> 1);
    return 8 * (j >> 1) + s + 4 * (i & 1);
  }
};

// row_split_k128_v1, q8: a group is 32 int8 codes in 32 bytes, a chunk 8 codes (two words);
// 128 + u needs 8 mantissa bits, so bytes go through float (exact) and pack to bf16.
struct SmallQ8 : PlainRows {
  static constexpr int GW = 32;
  static constexpr bool SCALED = true;
  struct Raw {
    uint2 q;
    float s;
  };
  static __device__ __forceinline__ void load(Raw& r, const SmallArgs& a, long long n, int q,
                                              int c) {
    const long long group = n * a.stride + q;
    r.q = __ldg(reinterpret_cast<const uint2*>(a.obj + group * 32) + c);
    r.s = f16_to_f32(__ldg(reinterpret_cast<const u16*>(a.obj + a.off2) + group));
  }
  // bytes (2p, 2p + 1) of word w as bf16 values of the signed codes
  static __device__ __forceinline__ u32 pair(const Raw& r, int w, int p) {
    const u32 word = (w == 0 ? r.q.x : r.q.y) ^ 0x80808080u;
    const float a = magic_byte(word, 2 * p) - (MAGIC_F + 128.f);
    const float b = magic_byte(word, 2 * p + 1) - (MAGIC_F + 128.f);
    return pack_bf16(a, b);
  }
  static __device__ __forceinline__ void frag(const Raw& r, int j, u32& lo, u32& hi) {
    lo = pair(r, j, 0);
    hi = pair(r, j, 1);
  }
  static __device__ __forceinline__ float scale(const Raw& r) { return r.s; }
  static __device__ __forceinline__ int perm(int j, int i) { return 4 * j + i; }
};

// contiguous bf16 rows (K % 64 == 0): a chunk is 16 weights in two 16-byte loads, no scale.
struct SmallBf16 : PlainRows {
  static constexpr int GW = 64;
  static constexpr bool SCALED = false;
  struct Raw {
    uint4 a, b;
  };
  static __device__ __forceinline__ void load(Raw& r, const SmallArgs& a, long long n, int q,
                                              int c) {
    const uint4* p = reinterpret_cast<const uint4*>(a.obj + (n * a.stride + q * 64LL) * 2) + 2 * c;
    r.a = __ldg(p);
    r.b = __ldg(p + 1);
  }
  static __device__ __forceinline__ void frag(const Raw& r, int j, u32& lo, u32& hi) {
    const uint4& u = j < 2 ? r.a : r.b;
    lo = (j & 1) ? u.z : u.x;
    hi = (j & 1) ? u.w : u.y;
  }
  static __device__ __forceinline__ float scale(const Raw&) { return 1.f; }
  static __device__ __forceinline__ int perm(int j, int i) { return 4 * j + i; }
};

// block_scale_k16_m128x4_v1 (NVFP4): E2M1 codes, two per byte (low nibble first), K / 2 bytes
// per row; one E4M3FN scale per 16 weights in the 128x4 swizzled plane; a float32 divisor per
// rpd rows. A group is 64 weights (32 bytes), so a thread's chunk of 16 is exactly one scale
// block. Each weight e2m1 * e4m3 has at most 2 + 4 significant bits and lies in [2^-10,
// 2688]: exact in bf16, so the fragments carry the scaled weights (no per-group scale step)
// and the divisor is applied to each row's sum.
__device__ __forceinline__ u32 mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Low and high bytes of the bf16 E2M1 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, as two
// 8-byte PRMT tables (bytes 0..3 in the first word).
#define E2M1_BF16_LO0 0xC0800000u
#define E2M1_BF16_LO1 0xC0804000u
#define E2M1_BF16_HI0 0x3F3F3F00u
#define E2M1_BF16_HI1 0x40404040u

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

struct SmallNvfp4 : PlainRows {  // (its own finish: the divisor)
  static constexpr int GW = 64;
  static constexpr bool SCALED = false;
  struct Raw {
    uint2 q;
    u32 s2;  // the chunk's block scale as a bf16 pair
  };
  static __device__ __forceinline__ void load(Raw& r, const SmallArgs& a, long long n, int q,
                                              int c) {
    const long long k = a.stride;
    r.q = __ldg(reinterpret_cast<const uint2*>(a.obj + n * (k >> 1) + 32LL * q) + c);
    const u32 s = __ldg(a.obj + a.off1 + nvfp4_scale_offset(n, 4LL * q + c, k));
    const u32 bits = __float_as_uint(e4m3_to_f32(s)) >> 16;  // exact: 4 significant bits
    r.s2 = bits | (bits << 16);
  }
  // weights (4h, 4h + 1) and (4h + 2, 4h + 3) of word w (h = 0, 1) as scaled bf16 pairs
  static __device__ __forceinline__ void quad(const Raw& r, int w, int h, u32& p01, u32& p23) {
    const u32 word = (w == 0 ? r.q.x : r.q.y) >> (16 * h);
    const u32 sel = word & 0x7777u;  // four magnitude indices, one per result byte
    const u32 lo = prmt(E2M1_BF16_LO0, E2M1_BF16_LO1, sel);
    const u32 hi = prmt(E2M1_BF16_HI0, E2M1_BF16_HI1, sel);
    // sign bits 3, 7, 11, 15 of the four codes -> bits 15 and 31 of each pair
    const u32 s01 = ((word << 12) & 0x8000u) | ((word << 24) & 0x80000000u);
    const u32 s23 = ((word << 4) & 0x8000u) | ((word << 16) & 0x80000000u);
    p01 = mul_bf16x2(prmt(lo, hi, 0x5140u) | s01, r.s2);
    p23 = mul_bf16x2(prmt(lo, hi, 0x7362u) | s23, r.s2);
  }
  // mma j takes chunk weights 4j .. 4j + 3: slots (2c, 2c+1) the first pair, (2c+8, 2c+9)
  // the second
  static __device__ __forceinline__ void frag(const Raw& r, int j, u32& lo, u32& hi) {
    quad(r, j >> 1, j & 1, lo, hi);
  }
  static __device__ __forceinline__ float scale(const Raw&) { return 1.f; }
  static __device__ __forceinline__ int perm(int j, int i) { return 4 * j + i; }
  static __device__ __forceinline__ float finish(float acc, const SmallArgs& a, long long n) {
    return acc / __ldg(reinterpret_cast<const float*>(a.obj + a.off2) + n / a.rpd);
  }
};

// Chunk c of k-group q of row xm of x (the chunk weights a lane's fragments take), or zeros
// for xm < 0.
template <class F>
__device__ __forceinline__ void load_x_chunk(const float* __restrict__ x, int ldx, int xm, int q,
                                             int c, float (&xs)[F::GW / 4]) {
  constexpr int CHUNK = F::GW / 4;
  if (xm < 0) {
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) xs[i] = 0.f;
    return;
  }
  const float4* src = reinterpret_cast<const float4*>(x + (long long)xm * ldx +
                                                      (long long)q * F::GW + c * CHUNK);
#pragma unroll
  for (int i = 0; i < CHUNK / 4; ++i) {
    const float4 v = __ldg(src + i);
    xs[4 * i] = v.x; xs[4 * i + 1] = v.y; xs[4 * i + 2] = v.z; xs[4 * i + 3] = v.w;
  }
}

// uint4 slots of x per lane, activation tile and group: one per mma, and for MINS layouts one
// more holding the group's sums of x for the lane's two result columns
template <class F>
struct XSlots {
  static constexpr int value = F::GW / 16 + (F::MINS ? 1 : 0);
};

// x in fragment order, made once per product by small_x_prep: for group q, activation
// tile t and lane (g, c), one uint4 per mma j holding the B fragment of row t * 8 + g at the
// chunk weights PERM[j][0..3] as (hi0, hi1, lo0, lo1): x = hi + lo, both bf16; for MINS
// layouts then (sum of the group's x in row t * 8 + 2c, in row t * 8 + 2c + 1, 0, 0) as float
// bits, the rows of the lane's accumulators.
template <class F>
__device__ __forceinline__ void prep_x(const float* __restrict__ x, int ldx, int m_rows,
                                       int groups, int nt, uint4* __restrict__ out) {
  constexpr int CHUNK = F::GW / 4, MMAS = F::GW / 16, SLOTS = XSlots<F>::value;
  const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= (long long)groups * nt * 32) return;  // (whole warps: groups * nt * 32 threads)
  const int lane = (int)(id & 31), t = (int)((id >> 5) % nt), q = (int)(id / (32LL * nt));
  const int m = t * 8 + (lane >> 2), c = lane & 3;
  const int xm = m >= m_rows ? -1 : m;
  float xs[CHUNK];
  load_x_chunk<F>(x, ldx, xm, q, c, xs);
#pragma unroll
  for (int j = 0; j < MMAS; ++j) {
    uint4 f;
    split_pair(xs[F::perm(j, 0)], xs[F::perm(j, 1)], f.x, f.z);
    split_pair(xs[F::perm(j, 2)], xs[F::perm(j, 3)], f.y, f.w);
    out[id * SLOTS + j] = f;
  }
  if (F::MINS) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) sum += xs[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // the 4 chunks of row m: lanes 4g .. 4g+3
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float s0 = __shfl_sync(0xffffffffu, sum, 8 * c), s1 = __shfl_sync(0xffffffffu, sum, 8 * c + 4);
    out[id * SLOTS + MMAS] = make_uint4(__float_as_uint(s0), __float_as_uint(s1), 0u, 0u);
  }
}

// The packed weights of groups q .. q+U-1 (those below q1) for rows n[r][0..1].
template <class F, int R, int U>
__device__ __forceinline__ void load_groups(typename F::Raw (&w)[U][R][2], const SmallArgs& a,
                                            const long long (&n)[R][2], int q, int q1, int c) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (q + u < q1) {
        F::load(w[u][r][0], a, n[r][0], q + u, c);
        F::load(w[u][r][1], a, n[r][1], q + u, c);
      }
}

// ------------------------------------------------------------------------------ driver
// put(row, m, value) for each accumulator inside the product: accumulator (i) of tile r,
// activation tile t is row g + 8 * (i >> 1) of the tile, activation row t * 8 + 2c + (i & 1)
template <int R, int NT, class Put>
__device__ __forceinline__ void each_result(const float (&acc)[R][NT][4], int tile0, int g,
                                            int c, int rows, int m_rows, Put put) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = tile0 + 16 * r + g + 8 * (i >> 1), m = t * 8 + 2 * c + (i & 1);
        if (row < rows && m < m_rows) put(row, m, acc[r][t][i]);
      }
}

template <class F, int NT, int R, int U, bool SPLIT>
__device__ __forceinline__ void small_gemm(const SmallArgs& a, int row0, int rows, int groups,
                                           const uint4* __restrict__ xf, int m_rows,
                                           float* __restrict__ y, int ldy,
                                           float* __restrict__ partial,
                                           unsigned* __restrict__ counters) {
  constexpr int MMAS = F::GW / 16, SLOTS = XSlots<F>::value;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int tile0 = (blockIdx.x * SMALL_WARPS + warp) * 16 * R;  // first row of the warp

  // groups of this block's K slice
  const int per = (groups + gridDim.y - 1) / gridDim.y;
  const int q0 = blockIdx.y * per, q1 = min(groups, q0 + per);

  long long n[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    n[r][0] = (long long)row0 + min(tile0 + 16 * r + g, rows - 1);
    n[r][1] = (long long)row0 + min(tile0 + 16 * r + g + 8, rows - 1);
  }
  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.f;

  // U groups per iteration, and the next iteration's loads issued before this one's mmas:
  // a warp always has the weights of U groups in flight
  typename F::Raw w[U][R][2], next[U][R][2];
  if (tile0 < rows) load_groups<F, R, U>(w, a, n, q0, q1, c);
  for (int q = q0; tile0 < rows && q < q1; q += U) {
    if (q + U < q1) load_groups<F, R, U>(next, a, n, q + U, q1, c);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (q + u >= q1) break;
      u32 bh[NT][MMAS][2], bl[NT][MMAS][2];
      float xsum[NT][2];  // MINS: the group's sums of x for the lane's result columns
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const uint4* src = xf + (((long long)(q + u) * NT + t) * 32 + lane) * SLOTS;
        const bool live = t * 8 + g < m_rows;
#pragma unroll
        for (int j = 0; j < MMAS; ++j) {
          const uint4 f = live ? __ldg(src + j) : make_uint4(0u, 0u, 0u, 0u);
          bh[t][j][0] = f.x; bh[t][j][1] = f.y; bl[t][j][0] = f.z; bl[t][j][1] = f.w;
        }
        if (F::MINS) {
          const uint4 f = __ldg(src + MMAS);  // (rows past m_rows hold zeros)
          xsum[t][0] = __uint_as_float(f.x);
          xsum[t][1] = __uint_as_float(f.y);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float part[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) part[t][i] = 0.f;
#pragma unroll
        for (int j = 0; j < MMAS; ++j) {
          u32 frag[4];
          F::frag(w[u][r][0], j, frag[0], frag[2]);  // row g: slots (2c, 2c+1), (2c+8, 2c+9)
          F::frag(w[u][r][1], j, frag[1], frag[3]);  // row g + 8
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            float* dst = F::SCALED ? part[t] : acc[r][t];
            mma_bf16(dst, frag, bh[t][j][0], bh[t][j][1]);
            if (SPLIT) mma_bf16(dst, frag, bl[t][j][0], bl[t][j][1]);
          }
        }
        if (F::SCALED) {
          const float s0 = F::scale(w[u][r][0]), s1 = F::scale(w[u][r][1]);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            acc[r][t][0] = fmaf(s0, part[t][0], acc[r][t][0]);
            acc[r][t][1] = fmaf(s0, part[t][1], acc[r][t][1]);
            acc[r][t][2] = fmaf(s1, part[t][2], acc[r][t][2]);
            acc[r][t][3] = fmaf(s1, part[t][3], acc[r][t][3]);
          }
        }
        if (F::MINS) {
          const float m0 = F::minimum(w[u][r][0]), m1 = F::minimum(w[u][r][1]);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            acc[r][t][0] = fmaf(-m0, xsum[t][0], acc[r][t][0]);
            acc[r][t][1] = fmaf(-m0, xsum[t][1], acc[r][t][1]);
            acc[r][t][2] = fmaf(-m1, xsum[t][0], acc[r][t][2]);
            acc[r][t][3] = fmaf(-m1, xsum[t][1], acc[r][t][3]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        w[u][r][0] = next[u][r][0];
        w[u][r][1] = next[u][r][1];
      }
  }

  if (gridDim.y == 1) {
    each_result<R, NT>(acc, tile0, g, c, rows, m_rows, [&](int row, int m, float v) {
      y[(long long)m * ldy + row] = F::finish(v, a, (long long)row0 + row);
    });
    return;
  }
  // partial[s][m][row] for this block's rows; the last block of the row range sums them
  const long long slice = (long long)m_rows * rows;
  each_result<R, NT>(acc, tile0, g, c, rows, m_rows, [&](int row, int m, float v) {
    partial[blockIdx.y * slice + (long long)m * rows + row] = v;
  });
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) {
    last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int first = blockIdx.x * SMALL_WARPS * 16 * R;
  const int count = min(rows - first, SMALL_WARPS * 16 * R);
  for (int e = threadIdx.x; e < count * m_rows; e += blockDim.x) {
    const int m = e / count, row = first + e % count;
    float s = 0.f;
    for (int k = 0; k < (int)gridDim.y; ++k)
      s += __ldcg(partial + k * slice + (long long)m * rows + row);
    y[(long long)m * ldy + row] = F::finish(s, a, (long long)row0 + row);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // ready for the next launch
}

#define DEFINE_SMALL_GEMM(NAME, POLICY)                                                       \
  template <int NT, int R, int U, bool SPLIT>                                                 \
  __global__ void __launch_bounds__(SMALL_WARPS * 32)                                         \
      NAME(const u8* __restrict__ obj, long long off1, long long off2, int stride, int rpd,   \
           int row0, int rows, int groups, const uint4* __restrict__ xf, int m_rows,          \
           float* __restrict__ y, int ldy, float* __restrict__ partial,                       \
           unsigned* __restrict__ counters) {                                                 \
    SmallArgs a{obj, off1, off2, stride, rpd};                                                \
    small_gemm<POLICY, NT, R, U, SPLIT>(a, row0, rows, groups, xf, m_rows, y, ldy, partial,   \
                                        counters);                                            \
  }                                                                                           \
  __global__ void NAME##_x(const float* __restrict__ x, int ldx, int m_rows, int groups,      \
                           int nt, uint4* __restrict__ out) {                                 \
    prep_x<POLICY>(x, ldx, m_rows, groups, nt, out);                                          \
  }

// ------------------------------------------------------------------ grouped products
// Groups of 8 * NT rows of x, each multiplied by the weights of one expert (the MoE
// prefill). x enters as bf16 (one mma a tile, as in every prefill product), made once per
// product by NAME_groups_x in the order the warps read it: for group g, k-group q,
// activation tile t, pair jj of mmas and lane (g', c), one uint4 holding the B fragments of
// mmas 2 jj and 2 jj + 1 (row t * 8 + g', the chunk weights PERM[j][0..3]). A k-group's
// fragments of one group (STAGE uint4) are contiguous, so a block copies them to shared
// memory in one coalesced cp.async sweep, a ring of stages some k-groups ahead, and its warps
// read them without bank conflicts (lanes take consecutive uint4): every warp of the block
// shares one copy, and no warp waits on a global load of x before its mmas.
// Tiles past a group's live rows (group_rows) are left unwritten: the product never reads
// them.
template <class F>
__device__ __forceinline__ void prep_x_groups(const float* __restrict__ x, int ldx,
                                              const int* __restrict__ x_rows,
                                              const int* __restrict__ group_rows, int groups,
                                              int nt, uint4* __restrict__ out) {
  constexpr int CHUNK = F::GW / 4, PAIRS = F::GW / 32;
  const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= (long long)groups * nt * 32) return;
  const long long g = blockIdx.y;
  const int lane = (int)(id & 31), t = (int)((id >> 5) % nt), q = (int)(id / (32LL * nt));
  if (group_rows && t * 8 >= __ldg(group_rows + g)) return;
  const int m = t * 8 + (lane >> 2), c = lane & 3;
  const long long row = g * 8 * nt + m;
  const int xm = x_rows ? __ldg(x_rows + row) : (int)row;
  float xs[CHUNK];
  load_x_chunk<F>(x, ldx, xm, q, c, xs);
  uint4* dst = out + ((g * groups + q) * nt + t) * PAIRS * 32 + lane;
#pragma unroll
  for (int jj = 0; jj < PAIRS; ++jj) {
    const int j = 2 * jj;
    uint4 f;
    f.x = pack_bf16(xs[F::perm(j, 0)], xs[F::perm(j, 1)]);
    f.y = pack_bf16(xs[F::perm(j, 2)], xs[F::perm(j, 3)]);
    f.z = pack_bf16(xs[F::perm(j + 1, 0)], xs[F::perm(j + 1, 1)]);
    f.w = pack_bf16(xs[F::perm(j + 1, 2)], xs[F::perm(j + 1, 3)]);
    dst[jj * 32] = f;
  }
}

// silu(gate) * up, as moe_silu_mul computes it
__device__ __forceinline__ float gated_silu(float gate, float up) {
  return gate * (0.5f * (1.f + tanhf(0.5f * gate))) * up;
}

// Tiles T0 .. T0 + C - 1 of one k-group: their x fragments from the stage, then C x R
// accumulations side by side (independent mma chains, so that the tensor pipe has several
// in flight; one 16-row tile's chain alone leaves it waiting), each group's sum scaled into
// acc.
template <class F, int NT, int R, int T0, int C>
__device__ __forceinline__ void group_tiles(float (&acc)[R][NT][4],
                                            const u32 (&frag)[R][F::GW / 16][4],
                                            const float (&s)[R][2], const uint4* stage,
                                            int lane) {
  constexpr int MMAS = F::GW / 16, PAIRS = MMAS / 2;
  static_assert(T0 + C <= NT, "tiles past the group");
  float part[C][R][4];
#pragma unroll
  for (int i = 0; i < C; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[i][r][e] = 0.f;
#pragma unroll
  for (int jj = 0; jj < PAIRS; ++jj) {
    uint4 f[C];
#pragma unroll
    for (int i = 0; i < C; ++i) f[i] = stage[((T0 + i) * PAIRS + jj) * 32 + lane];
#pragma unroll
    for (int h = 0; h < 2; ++h)  // mma 2 jj + h: words (x, y) or (z, w) of the fragment
#pragma unroll
      for (int i = 0; i < C; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const u32 b0 = h ? f[i].z : f[i].x, b1 = h ? f[i].w : f[i].y;
          mma_bf16(F::SCALED ? part[i][r] : acc[r][T0 + i], frag[r][2 * jj + h], b0, b1);
        }
  }
  if (!F::SCALED) return;
#pragma unroll
  for (int i = 0; i < C; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float* a = acc[r][T0 + i];
      a[0] = fmaf(s[r][0], part[i][r][0], a[0]);
      a[1] = fmaf(s[r][0], part[i][r][1], a[1]);
      a[2] = fmaf(s[r][1], part[i][r][2], a[2]);
      a[3] = fmaf(s[r][1], part[i][r][3], a[3]);
    }
}

// Tiles T .. END - 1 one at a time, those below `tiles`.
template <class F, int NT, int R, int T, int END>
__device__ __forceinline__ void tiles_singly(float (&acc)[R][NT][4],
                                             const u32 (&frag)[R][F::GW / 16][4],
                                             const float (&s)[R][2], const uint4* stage,
                                             int lane, int tiles) {
  if constexpr (T < END) {
    if (tiles > T) {
      group_tiles<F, NT, R, T, 1>(acc, frag, s, stage, lane);
      tiles_singly<F, NT, R, T + 1, END>(acc, frag, s, stage, lane, tiles);
    }
  }
}

// The live tiles from T0 on (`tiles` of them in all): chunks of C while whole chunks remain,
// then the fewer than C left one at a time. The branches fall between chunks, so within one
// the compiler interleaves its chains.
template <class F, int NT, int R, int C, int T0>
__device__ __forceinline__ void live_tiles(float (&acc)[R][NT][4],
                                           const u32 (&frag)[R][F::GW / 16][4],
                                           const float (&s)[R][2], const uint4* stage, int lane,
                                           int tiles) {
  if constexpr (T0 < NT) {
    if constexpr (T0 + C <= NT) {
      if (tiles >= T0 + C) {
        group_tiles<F, NT, R, T0, C>(acc, frag, s, stage, lane);
        live_tiles<F, NT, R, C, T0 + C>(acc, frag, s, stage, lane, tiles);
        return;
      }
    }
    constexpr int END = T0 + C <= NT ? T0 + C - 1 : NT;
    tiles_singly<F, NT, R, T0, END>(acc, frag, s, stage, lane, tiles);
  }
}

// One group's product: block x of the grid takes SMALL_WARPS * 16 * R weight rows (every
// warp of the block runs every k-group, so that all take part in the shared copies; rows
// past `rows` are clamped loads, never stored), the whole K (no split), one k-group a step
// with D k-groups in flight: the weights of the next D - 1 (or D, once this one's are
// decoded) in registers and their x in a ring of D shared-memory stages, so a load has D - 1
// steps of mmas to arrive in. Only the group's first `tiles` activation tiles are copied,
// multiplied and stored (the rest are padding), so a group can be as large as an expert's
// usual share of pairs at the cost of its live rows only: each weight is decoded once per
// group, for all its tiles, C at a time (live_tiles). `gated` (R = 2): a warp's two tiles
// are the same 16 rows of the gate (rows 0 .. rows - 1) and of the up projection (the next
// `rows` rows), and y gets silu(gate) * up.
template <class F, int NT, int R, int D, int C>
__device__ __forceinline__ void groups_gemm(const SmallArgs& a, int row0, int rows, int groups,
                                            int tiles, const uint4* __restrict__ xf,
                                            float* __restrict__ y, int ldy, bool gated) {
  constexpr int MMAS = F::GW / 16, PAIRS = MMAS / 2, STAGE = NT * PAIRS * 32;
  static_assert(R == 2, "the gated epilogue pairs a warp's two tiles");
  static_assert(D >= 2, "at least the next k-group in flight");
  __shared__ uint4 xs[D][STAGE];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int tile0 = (blockIdx.x * SMALL_WARPS + warp) * 16 * (gated ? 1 : R);

  long long n[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {  // gated: tile r at row r * rows + (the warp's 16 rows)
    const int first = gated ? tile0 : tile0 + 16 * r;
    const long long base = (long long)row0 + (gated ? (long long)r * rows : 0);
    n[r][0] = base + min(first + g, rows - 1);
    n[r][1] = base + min(first + g + 8, rows - 1);
  }
  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.f;

  const int live = tiles * PAIRS * 32;  // uint4 of a k-group's live tiles
  const auto stage = [&](int q, int buf) {  // k-group q's x into buffer buf (none past the end)
    if (q < groups) {
      const uint4* src = xf + (long long)q * STAGE;
      for (int i = threadIdx.x; i < live; i += SMALL_WARPS * 32)
        cp_async16(&xs[buf][i], src + i, true);
    }
    cp_commit();  // a group even when empty: the waits below count D - 2 younger ones
  };
  typename F::Raw w[D][1][R][2];  // k-group q's weights in slot q % D
#pragma unroll
  for (int d = 0; d < D; ++d) load_groups<F, R, 1>(w[d], a, n, d, groups, c);
#pragma unroll
  for (int d = 0; d + 1 < D; ++d) stage(d, d);
  for (int q0 = 0; q0 < groups; q0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int q = q0 + d;
      if (q >= groups) break;
      cp_wait<D - 2>();  // k-group q's x has landed for this thread ...
      __syncthreads();   // ... and every thread; all warps are past step q - 1's mmas
      stage(q + D - 1, (d + D - 1) % D);  // into the stage step q - 1 read
      // the k-group's weight fragments, decoded once for every activation tile; the slot
      // then takes k-group q + D's weights
      u32 frag[R][MMAS][4];
      float s[R][2];
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int j = 0; j < MMAS; ++j) {
          F::frag(w[d][0][r][0], j, frag[r][j][0], frag[r][j][2]);  // row g
          F::frag(w[d][0][r][1], j, frag[r][j][1], frag[r][j][3]);  // row g + 8
        }
        s[r][0] = F::SCALED ? F::scale(w[d][0][r][0]) : 1.f;
        s[r][1] = F::SCALED ? F::scale(w[d][0][r][1]) : 1.f;
      }
      load_groups<F, R, 1>(w[d], a, n, q + D, groups, c);
      live_tiles<F, NT, R, C, 0>(acc, frag, s, xs[d], lane, tiles);
    }
  }
  if (gated) {  // accumulator i of tile 0 and of tile 1: the same row of gate and up
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= tiles) break;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = tile0 + g + 8 * (i >> 1), m = t * 8 + 2 * c + (i & 1);
        if (row >= rows) continue;
        const float gate = F::finish(acc[0][t][i], a, (long long)row0 + row);
        const float up = F::finish(acc[1][t][i], a, (long long)row0 + rows + row);
        y[(long long)m * ldy + row] = gated_silu(gate, up);
      }
    }
    return;
  }
  each_result<R, NT>(acc, tile0, g, c, rows, 8 * tiles, [&](int row, int m, float v) {
    y[(long long)m * ldy + row] = F::finish(v, a, (long long)row0 + row);
  });
}

// Group g = blockIdx.z uses the object at base[group_expert[g]] (every expert one geometry,
// as for the expert GEMV), rows row0[e] .. row0[e] + rows - 1 (gated: twice as many, gate
// then up), and writes y rows g * 8 * NT onwards, those of its 8-row tiles that hold any of
// its group_rows[g] live rows (all 8 * NT without group_rows); a group whose expert is -1,
// or with no live rows, returns at once. NAME_groups_x writes every group's fragments,
// blockIdx.y being the group; with x_rows it gathers them: row g * 8 * NT + m is row
// x_rows[g * 8 * NT + m] of x (-1: a padding row, zeros), else x holds the groups' rows in
// order.
#define DEFINE_SMALL_GEMM_GROUPS(NAME, POLICY)                                                \
  template <int NT, int R, int D, int C>                                                      \
  __global__ void __launch_bounds__(SMALL_WARPS * 32)                                         \
      NAME##_groups(const u64* __restrict__ base, const int* __restrict__ row0,               \
                    const int* __restrict__ group_expert, const int* __restrict__ group_rows, \
                    long long off1, long long off2, int stride, int rpd, int rows,            \
                    int groups, const uint4* __restrict__ xf, float* __restrict__ y, int ldy, \
                    int gated) {                                                              \
    constexpr int STAGE = NT * (POLICY::GW / 32) * 32;                                        \
    const long long g = blockIdx.z;                                                           \
    const int e = __ldg(group_expert + g);                                                    \
    const int live = group_rows ? min(__ldg(group_rows + g), 8 * NT) : 8 * NT;                \
    if (e < 0 || live <= 0) return;                                                           \
    SmallArgs a{reinterpret_cast<const u8*>(__ldg(base + e)), off1, off2, stride, rpd};       \
    groups_gemm<POLICY, NT, R, D, C>(a, __ldg(row0 + e), rows, groups, (live + 7) / 8,       \
                                  xf + g * groups * STAGE, y + g * 8 * NT * ldy, ldy,         \
                                  gated != 0);                                                \
  }                                                                                           \
  __global__ void NAME##_groups_x(const float* __restrict__ x, int ldx,                      \
                                  const int* __restrict__ x_rows,                             \
                                  const int* __restrict__ group_rows, int groups, int nt,     \
                                  uint4* __restrict__ out) {                                  \
    prep_x_groups<POLICY>(x, ldx, x_rows, group_rows, groups, nt, out);                       \
  }

DEFINE_SMALL_GEMM(small_q4, SmallRowSplit<4>)
DEFINE_SMALL_GEMM(small_q5, SmallRowSplit<5>)
DEFINE_SMALL_GEMM(small_q6, SmallRowSplit<6>)
DEFINE_SMALL_GEMM(small_q8, SmallQ8)
DEFINE_SMALL_GEMM(small_nvfp4, SmallNvfp4)
DEFINE_SMALL_GEMM(small_bf16, SmallBf16)
DEFINE_SMALL_GEMM(small_gguf_q4_k, SmallGgufK<12>)
DEFINE_SMALL_GEMM(small_gguf_q5_k, SmallGgufK<13>)
DEFINE_SMALL_GEMM(small_gguf_q6_k, SmallGgufQ6K)

DEFINE_SMALL_GEMM_GROUPS(small_q4, SmallRowSplit<4>)
DEFINE_SMALL_GEMM_GROUPS(small_q5, SmallRowSplit<5>)
DEFINE_SMALL_GEMM_GROUPS(small_q6, SmallRowSplit<6>)
DEFINE_SMALL_GEMM_GROUPS(small_q8, SmallQ8)
DEFINE_SMALL_GEMM_GROUPS(small_nvfp4, SmallNvfp4)
DEFINE_SMALL_GEMM_GROUPS(small_bf16, SmallBf16)
