// Causal prefill attention of one lane over its keys/values in the paged pool, flash style:
// no [T, S] score matrix, an online softmax over tiles of keys. The reference is
// array_ops.attention_pages (array_ops.attention over the gathered, decoded rows).
//
// q [T, Nq, D] float32; pools k/v [pages, PAGE, Nkv, D] in the pool's storage type KV (float32,
// bf16 words u16 or unscaled E4M3FN bytes u8, as attention.cu reads them for decode); token t
// of the lane is row t % PAGE of page pages[t / PAGE]. Query i (position start + i) sees keys
// 0..start+i; query head j reads kv head j / G (G = Nq / Nkv). For kv head h the queries that
// read it form T*G rows r = t*G + g (token-major), so a block's rows are a few consecutive
// tokens of all G heads and every K/V tile it loads serves all of them.
//
// prefill_attention: grid (Nkv, ceil(T*G / PF_ROWS), splits), PF_WARPS warps of 16 rows. K/V
// tiles of BN keys are double-buffered by cp.async, each row fetched from its page: float32
// rows straight into the float tiles the products read; narrower rows into a raw staging
// buffer, decoded to float32 into the (single) float tiles once the tile has arrived. Both
// products run on tensor cores with float32 accumulation; scores are in the log2 domain (q is
// pre-scaled by scale * log2(e) as it is staged). PREC picks operand precision:
//   PF_SPLIT_QK  Q.K^T in 3xTF32 (m16n8k8, x = hi + lo: about float32), P.V in TF32. Score
//                errors are what grows with the scores' magnitude (peaked attention): split
//                scores keep the error near the P.V rounding where plain TF32 or bf16 scores
//                reach 1e-2;
//   PF_SPLIT     both products in 3xTF32 (the backend with TF32 off: float32 comparisons).
// prefill_attention_bf16 (the bf16 prefill precision): the same grid, rows, masking and
// softmax, Q.K^T in 3xBF16 (mma.sync m16n8k16: x = hi + lo, both bf16, hi*hi + hi*lo + lo*hi:
// about 16 mantissa bits; 2xBF16 where the pool stores bf16 or E4M3, whose keys are exact in
// bf16) and P.V on bf16 P and V. Its operands are made once per block rather than by every
// warp in its inner loop: Q split into bf16 pairs as it is staged, and each K/V tile, copied
// raw into a single staging buffer, converted to K pairs (hi, lo) and V key pairs per column
// in the layout the fragments read, after which the next tile's copy starts and overlaps the
// products; the inner loops are shared-memory loads and mmas only.
// With splits > 1 each block takes only a range of its key tiles and writes unnormalised
// partials (O, m, l); prefill_combine merges them (short chunks over long contexts would
// otherwise leave most of the GPU idle).

#define PF_WARPS 4
#define PF_ROWS (PF_WARPS * 16)
#define PF_NEG_INF __int_as_float(0xff800000)

#define PF_SPLIT_QK 1
#define PF_SPLIT 2

// Tile geometry, mirrored by prefill_attention.py (tile_keys, smem_bytes). Row strides in
// floats: Q and K fragments are read as float4 by lanes (g, tig) at row g, column 4*tig, so
// a stride of 16 mod 32 words puts rows g and g+1 in different bank halves; V fragments are
// read at rows 2*tig (+1), column 4*g, so a stride of 4 mod 32 spreads them over all banks.
// Storage narrower than float32 (NARROW) keeps one float tile of K and of V and stages the
// raw rows ([2][BN][D] elements of KV each, unpadded) for the double buffering instead.
template <int D, typename KV>
struct PfTile {
  static constexpr int BN = D <= 64 ? 64 : 32;
  static constexpr int QS = D + 16;
  static constexpr int KS = D + 16;
  static constexpr int VS = D + 4;
  static constexpr bool NARROW = sizeof(KV) < 4;
  static constexpr int FLOAT_BUFS = NARROW ? 1 : 2;
  static constexpr int CHUNK = 16 / (int)sizeof(KV);  // elements of one 16-byte copy
  // where a tile's copies land: the float tiles themselves, or the raw staging rows
  static constexpr int KSTAGE = NARROW ? D : KS;
  static constexpr int VSTAGE = NARROW ? D : VS;
};

// Four stored elements (8 bytes of bf16 words, 4 of E4M3 bytes, in shared memory) as floats
template <typename KV>
__device__ __forceinline__ float4 pf_decode4(const KV* p) {
  float4 x;
  if constexpr (sizeof(KV) == 2) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    bf16x2(w.x, x.x, x.y);
    bf16x2(w.y, x.z, x.w);
  } else {
    const u32 w = *reinterpret_cast<const u32*>(p);
    e4m3x2_to_f32(w, x.x, x.y);
    e4m3x2_to_f32(w >> 16, x.z, x.w);
  }
  return x;
}

// A fragment as TF32 operands: rounded (hi), or split into hi + lo for three products
template <bool SPLIT>
__device__ __forceinline__ void pf_operand(const float (&x)[4], u32 (&hi)[4], u32 (&lo)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (SPLIT) {
      tf32_split(x[i], hi[i], lo[i]);
    } else {
      hi[i] = tf32_round(x[i]);
      lo[i] = 0u;
    }
  }
}

// d += a * b for b in float32: one TF32 product, or three (the lo*lo term is dropped)
template <bool SPLIT>
__device__ __forceinline__ void pf_product(float (&d)[4], const u32 (&ah)[4], const u32 (&al)[4],
                                           float b0, float b1) {
  if constexpr (SPLIT) {
    u32 bh0, bl0, bh1, bl1;
    tf32_split(b0, bh0, bl0);
    tf32_split(b1, bh1, bl1);
    mma_tf32(d, al, bh0, bh1);  // small terms first
    mma_tf32(d, ah, bl0, bl1);
    mma_tf32(d, ah, bh0, bh1);
  } else {
    mma_tf32(d, ah, tf32_round(b0), tf32_round(b1));
  }
}

// The rows a block's warp holds and the keys they see. Rows r = m0 + warp*16 + g (+ 8) of the
// T*G (token, head) rows of kv head h; padding rows past T*G act as the last token and are
// never written. key_end: one past the block's last key; lim: the last key of each of the
// thread's two rows; lo/hi: the last key of the warp's first and last row.
struct PfRows {
  int h, m0, wrow, g, tig, group, rows, key_end, warp_lo, warp_hi;
  int lim[2];

  __device__ PfRows(int T, int nq, int nkv, int start) {
    h = blockIdx.x;
    m0 = (gridDim.y - 1 - blockIdx.y) * PF_ROWS;  // the latest (longest) rows first
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    g = lane >> 2;  // mma fragment coordinates
    tig = lane & 3;
    group = nq / nkv;
    rows = T * group;
    key_end = start + min(T - 1, (m0 + PF_ROWS - 1) / group) + 1;
    wrow = m0 + warp * 16;
#pragma unroll
    for (int i = 0; i < 2; ++i) lim[i] = start + min(T - 1, (wrow + g + 8 * i) / group);
    warp_lo = start + min(T - 1, wrow / group);
    warp_hi = start + min(T - 1, (wrow + 15) / group);
  }
};

// cp.async of key tile `tile` (BN keys from tile * BN) of kv head h into ks / vs (rows KST and
// VST elements of KV apart), one commit group. Key n is row n % page of page pages[n / page];
// a thread's rows step by RSTEP, so its page and row in the page advance without a division
// per copy. Keys at or past key_end are zero-filled (zero bits decode to 0 in every storage).
template <int D, int BN, int KST, int VST, typename KV>
__device__ __forceinline__ void pf_load_tile(const KV* __restrict__ k, const KV* __restrict__ v,
                                             const int* __restrict__ pages, KV* ks, KV* vs,
                                             int tile, int page, int key_end, long long kv_stride,
                                             int h) {
  constexpr int CHUNK = 16 / (int)sizeof(KV);  // elements of one 16-byte copy
  constexpr int ROW_CHUNKS = D / CHUNK, RSTEP = PF_WARPS * 32 / ROW_CHUNKS;
  static_assert(PF_WARPS * 32 % ROW_CHUNKS == 0 && BN % RSTEP == 0, "tile copy layout");
  const int copy_row = threadIdx.x / ROW_CHUNKS, copy_col = CHUNK * (threadIdx.x % ROW_CHUNKS);
  int n = tile * BN + copy_row;
  int pi = n / page, pr = n - pi * page, loaded = -1;
  long long base = 0;
#pragma unroll 4
  for (int r = copy_row; r < BN; r += RSTEP, n += RSTEP, pr += RSTEP) {
    while (pr >= page) {
      pr -= page;
      ++pi;
    }
    const bool ok = n < key_end;
    if (ok && pi != loaded) {
      loaded = pi;
      base = (long long)__ldg(pages + pi) * page;
    }
    const long long off = ok ? (base + pr) * kv_stride + (long long)h * D + copy_col : 0;
    cp_async16(ks + r * KST + copy_col, k + off, ok);
    cp_async16(vs + r * VST + copy_col, v + off, ok);
  }
  cp_commit();
}

// Query row r of the block (its token's head) scaled into the log2 domain: four floats at
// column c, zero for padding rows.
__device__ __forceinline__ float4 pf_query4(const float* __restrict__ q, const PfRows& b, int r,
                                            int c, int nq, int D, float qscale) {
  float4 x = {0.f, 0.f, 0.f, 0.f};
  if (b.m0 + r < b.rows) {
    const int t = (b.m0 + r) / b.group, gq = (b.m0 + r) - t * b.group;
    x = __ldg(reinterpret_cast<const float4*>(
        q + ((long long)t * nq + (long long)b.h * b.group + gq) * D + c));
    x.x *= qscale;
    x.y *= qscale;
    x.z *= qscale;
    x.w *= qscale;
  }
  return x;
}

// The causal mask and one online-softmax step over a score tile: s[nt][e] is row g (e < 2) or
// g + 8, key n0 + 8*nt + 2*tig + (e & 1). s becomes p = exp2(s - m) with the rows' running
// maxima m advanced, l (per lane: its own columns) and the output accumulators rescaled.
template <int NT, int DT>
__device__ __forceinline__ void pf_softmax(float (&s)[NT][4], float (&o)[DT][4], float (&m)[2],
                                           float (&l)[2], const PfRows& b, int n0) {
  if (n0 + 8 * NT - 1 > b.warp_lo) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (n0 + 8 * nt + 2 * b.tig + (e & 1) > b.lim[e >> 1]) s[nt][e] = PF_NEG_INF;
    }
  }
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
  }
  float alpha[2], base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // a row's values sit in the 4 lanes of a quad
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
    base[i] = mx[i] == PF_NEG_INF ? 0.f : mx[i];  // no visible key yet: p = 0, not NaN
    alpha[i] = exp2f(m[i] - base[i]);
    m[i] = mx[i];
    l[i] *= alpha[i];
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2f(s[nt][e] - base[e >> 1]);
      l[e >> 1] += s[nt][e];
    }
  }
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    o[dt][0] *= alpha[0];
    o[dt][1] *= alpha[0];
    o[dt][2] *= alpha[1];
    o[dt][3] *= alpha[1];
  }
}

// Where the thread's row i (0: g, 1: g + 8) goes, or null for a padding row: its output row
// (to be scaled by inv = 1 / l) or, with splits, its unnormalised partial in ws_o (inv = 1),
// m and l written to ws_m. l arrives per lane and is summed over the quad here.
__device__ __forceinline__ float* pf_row_out(const PfRows& b, int i, float m, float (&l)[2],
                                             float* out, float* ws_o, float* ws_ml, int T,
                                             int nq, int D, float& inv) {
  const float li = l[i] + __shfl_xor_sync(0xFFFFFFFFu, l[i], 1);
  const float sum = li + __shfl_xor_sync(0xFFFFFFFFu, li, 2);
  const int r = b.wrow + b.g + 8 * i;
  if (r >= b.rows) return nullptr;
  const int t = r / b.group, gq = r - t * b.group;
  const long long orow = (long long)t * nq + (long long)b.h * b.group + gq;
  if (gridDim.z == 1) {
    inv = 1.f / sum;
    return out + orow * D;
  }
  const long long prow = (long long)blockIdx.z * T * nq + orow;
  inv = 1.f;
  if (b.tig == 0) {
    ws_ml[prow * 2] = m;
    ws_ml[prow * 2 + 1] = sum;
  }
  return ws_o + prow * D;
}

// ws_o [splits, T*Nq, D] and ws_ml [splits, T*Nq, 2] (m in log2 units, l) are only used
// when gridDim.z > 1; rows of a split with no visible key get m = -inf, l = 0, O = 0.
template <int D, int PREC, typename KV>
__global__ void __launch_bounds__(PF_WARPS * 32, 1)
    prefill_attention(const float* __restrict__ q, const KV* __restrict__ k,
                      const KV* __restrict__ v, const int* __restrict__ pages,
                      float* __restrict__ out, float* __restrict__ ws_o,
                      float* __restrict__ ws_ml, int T, int nq, int nkv, int page, int start,
                      int tiles_per_split, float qscale) {
  using Tile = PfTile<D, KV>;
  constexpr int BN = Tile::BN, QS = Tile::QS, KS = Tile::KS, VS = Tile::VS;
  constexpr int KSTAGE = Tile::KSTAGE, VSTAGE = Tile::VSTAGE;
  constexpr int NT = BN / 8;  // 8-key column tiles of the scores
  constexpr int DT = D / 8;   // 8-column tiles of the output
  constexpr bool SPLIT_PV = PREC == PF_SPLIT;
  static_assert(PREC == PF_SPLIT_QK || PREC == PF_SPLIT, "precision");
  extern __shared__ float4 pf_smem[];
  float* q_s = reinterpret_cast<float*>(pf_smem);    // [PF_ROWS][QS]
  float* k_s = q_s + PF_ROWS * QS;                   // [FLOAT_BUFS][BN][KS]
  float* v_s = k_s + Tile::FLOAT_BUFS * BN * KS;     // [FLOAT_BUFS][BN][VS]
  // the copies' destinations: [2][BN][KSTAGE] and [2][BN][VSTAGE] elements of KV
  KV* k_stage = Tile::NARROW ? reinterpret_cast<KV*>(v_s + BN * VS) : reinterpret_cast<KV*>(k_s);
  KV* v_stage = Tile::NARROW ? k_stage + 2 * BN * D : reinterpret_cast<KV*>(v_s);

  const PfRows b(T, nq, nkv, start);
  const int warp = threadIdx.x >> 5, g = b.g, tig = b.tig;
  const long long kv_stride = (long long)nkv * D;
  const int tile0 = blockIdx.z * tiles_per_split;
  const int tile1 = min((b.key_end + BN - 1) / BN, tile0 + tiles_per_split);

  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {PF_NEG_INF, PF_NEG_INF}, l[2] = {0.f, 0.f};

  auto load_tile = [&](int tile, int buf) {
    pf_load_tile<D, BN, KSTAGE, VSTAGE>(k, v, pages, k_stage + buf * BN * KSTAGE,
                                        v_stage + buf * BN * VSTAGE, tile, page, b.key_end,
                                        kv_stride, b.h);
  };

  // narrow storage: the staged raw rows of buffer buf -> the float tiles, four at a time
  auto decode_tile = [&](int buf) {
    if constexpr (Tile::NARROW) {
      const KV* ks = k_stage + buf * BN * D;
      const KV* vs = v_stage + buf * BN * D;
      for (int e = threadIdx.x; e < BN * D / 4; e += PF_WARPS * 32) {
        const int r = e / (D / 4), c = 4 * (e % (D / 4));
        *reinterpret_cast<float4*>(k_s + r * KS + c) = pf_decode4(ks + r * D + c);
        *reinterpret_cast<float4*>(v_s + r * VS + c) = pf_decode4(vs + r * D + c);
      }
    }
  };

  if (tile0 < tile1) {
    load_tile(tile0, 0);
    for (int e = threadIdx.x; e < PF_ROWS * D / 4; e += PF_WARPS * 32) {
      const int r = e / (D / 4), c = 4 * (e % (D / 4));
      *reinterpret_cast<float4*>(q_s + r * QS + c) = pf_query4(q, b, r, c, nq, D, qscale);
    }
  }

  for (int tile = tile0; tile < tile1; ++tile) {
    const int buf = (tile - tile0) & 1;
    if (tile + 1 < tile1) {
      load_tile(tile + 1, buf ^ 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();  // the tile (and, the first time, q) is visible to every warp
    if constexpr (Tile::NARROW) {
      decode_tile(buf);
      __syncthreads();
    }
    const int n0 = tile * BN;
    if (n0 <= b.warp_hi) {  // else every key of the tile is in the future of the warp's rows
      const float* qw = q_s + warp * 16 * QS;
      const int fbuf = Tile::NARROW ? 0 : buf;
      const float* ks = k_s + fbuf * BN * KS;
      const float* vs = v_s + fbuf * BN * VS;

      // S = Q K^T. The reduction over d may visit d in any order: mma k-step 2*jp + half
      // takes column tig <-> d = 16*jp + 4*tig + 2*half and column tig + 4 <-> that d + 1,
      // so each lane reads its Q and K values as whole float4s.
      // three accumulator sets (summed after the loop) so that more independent mma chains
      // are in flight: with one warp per SM sub-partition, mma latency would set the pace
      float s[NT][4], c0[NT][4], c1[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = c0[nt][e] = c1[nt][e] = 0.f;
      }
#pragma unroll
      for (int jp = 0; jp < D / 16; ++jp) {
        const float4 qa = *reinterpret_cast<const float4*>(qw + g * QS + 16 * jp + 4 * tig);
        const float4 qb =
            *reinterpret_cast<const float4*>(qw + (g + 8) * QS + 16 * jp + 4 * tig);
        const float f0[4] = {qa.x, qb.x, qa.y, qb.y}, f1[4] = {qa.z, qb.z, qa.w, qb.w};
        u32 h0[4], l0[4], h1[4], l1[4];
        pf_operand<true>(f0, h0, l0);
        pf_operand<true>(f1, h1, l1);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float4 kb =
              *reinterpret_cast<const float4*>(ks + (8 * nt + g) * KS + 16 * jp + 4 * tig);
          u32 bh[4], bl[4];
          tf32_split(kb.x, bh[0], bl[0]);
          tf32_split(kb.y, bh[1], bl[1]);
          tf32_split(kb.z, bh[2], bl[2]);
          tf32_split(kb.w, bh[3], bl[3]);
          mma_tf32(c0[nt], l0, bh[0], bh[1]);
          mma_tf32(c1[nt], l1, bh[2], bh[3]);
          mma_tf32(c0[nt], h0, bl[0], bl[1]);
          mma_tf32(c1[nt], h1, bl[2], bl[3]);
          mma_tf32(s[nt], h0, bh[0], bh[1]);
          mma_tf32(s[nt], h1, bh[2], bh[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] += c0[nt][e] + c1[nt][e];
      }
      pf_softmax(s, o, m, l, b, n0);

      // O += P V. The scores' accumulator layout becomes the A fragment directly: k-step nt
      // takes column tig <-> key 8*nt + 2*tig and column tig + 4 <-> key 8*nt + 2*tig + 1.
      // Output tile dt, column n <-> d = 32*(dt/4) + 4*n + dt%4, so a lane reads V as float4s
      // and finally holds 8 contiguous columns of each row per 32.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float f[4] = {s[nt][0], s[nt][2], s[nt][1], s[nt][3]};
        u32 ph[4], pl[4];
        pf_operand<SPLIT_PV>(f, ph, pl);
        const float* v0 = vs + (8 * nt + 2 * tig) * VS + 4 * g;
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
          const float4 x0 = *reinterpret_cast<const float4*>(v0 + 32 * c);
          const float4 x1 = *reinterpret_cast<const float4*>(v0 + VS + 32 * c);
          pf_product<SPLIT_PV>(o[4 * c], ph, pl, x0.x, x1.x);
          pf_product<SPLIT_PV>(o[4 * c + 1], ph, pl, x0.y, x1.y);
          pf_product<SPLIT_PV>(o[4 * c + 2], ph, pl, x0.z, x1.z);
          pf_product<SPLIT_PV>(o[4 * c + 3], ph, pl, x0.w, x1.w);
        }
      }
    }
    __syncthreads();  // the next iteration's prefetch (or decode) overwrites this buffer
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float inv;
    float* dst = pf_row_out(b, i, m[i], l, out, ws_o, ws_ml, T, nq, D, inv);
    if (dst == nullptr) continue;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      const float4 lo = {o[4 * c][2 * i] * inv, o[4 * c + 1][2 * i] * inv,
                         o[4 * c + 2][2 * i] * inv, o[4 * c + 3][2 * i] * inv};
      const float4 hi = {o[4 * c][2 * i + 1] * inv, o[4 * c + 1][2 * i + 1] * inv,
                         o[4 * c + 2][2 * i + 1] * inv, o[4 * c + 3][2 * i + 1] * inv};
      *reinterpret_cast<float4*>(dst + 32 * c + 8 * tig) = lo;
      *reinterpret_cast<float4*>(dst + 32 * c + 8 * tig + 4) = hi;
    }
  }
}

// Shared memory of prefill_attention_bf16, mirrored by prefill_attention.py (smem_bytes), in
// 32-bit words: Q pairs hi, lo [PF_ROWS][PS] (pair j of a row: columns 2j, 2j + 1, low half
// first), K pairs hi, lo [BN][PS], V key pairs [D][VP] (word j of column c: keys 2j, 2j + 1),
// then the raw staging rows of K and V, [BN][D] elements of KV each. PS = 4 mod 32 and VP = 4
// mod 32 (20 for BN = 32, whose g * 20 mod 32 are distinct multiples of 4) let the 8 x 4
// lanes' (row g, word tig) fragment loads hit 32 different banks.
template <int D, typename KV>
struct PfBf16Tile {
  static constexpr int BN = D <= 64 ? 64 : 32;
  static constexpr int PS = D / 2 + 4;
  static constexpr int VP = BN / 2 + 4;
  static constexpr int WORDS = 2 * PF_ROWS * PS + 2 * BN * PS + D * VP;
  // storage narrower than float32 (bf16 words, E4M3 bytes) is exact in bf16: K has no lo
  // pairs (kl is left unwritten and unread) and Q.K^T is 2xBF16
  static constexpr bool NARROW = sizeof(KV) < 4;
};

template <int D, typename KV>
__global__ void __launch_bounds__(PF_WARPS * 32, 1)
    prefill_attention_bf16(const float* __restrict__ q, const KV* __restrict__ k,
                           const KV* __restrict__ v, const int* __restrict__ pages,
                           float* __restrict__ out, float* __restrict__ ws_o,
                           float* __restrict__ ws_ml, int T, int nq, int nkv, int page, int start,
                           int tiles_per_split, float qscale) {
  using Tile = PfBf16Tile<D, KV>;
  constexpr int BN = Tile::BN, PS = Tile::PS, VP = Tile::VP;
  constexpr int NT = BN / 8, DT = D / 8, THREADS = PF_WARPS * 32;
  extern __shared__ float4 pf_smem[];
  u32* qh = reinterpret_cast<u32*>(pf_smem);
  u32* ql = qh + PF_ROWS * PS;
  u32* kh = ql + PF_ROWS * PS;
  u32* kl = kh + BN * PS;
  u32* vp = kl + BN * PS;
  KV* k_raw = reinterpret_cast<KV*>(vp + D * VP);
  KV* v_raw = k_raw + BN * D;

  const PfRows b(T, nq, nkv, start);
  const int warp = threadIdx.x >> 5, g = b.g, tig = b.tig;
  const long long kv_stride = (long long)nkv * D;
  const int tile0 = blockIdx.z * tiles_per_split;
  const int tile1 = min((b.key_end + BN - 1) / BN, tile0 + tiles_per_split);

  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {PF_NEG_INF, PF_NEG_INF}, l[2] = {0.f, 0.f};

  if (tile0 < tile1) {
    pf_load_tile<D, BN, D, D>(k, v, pages, k_raw, v_raw, tile0, page, b.key_end, kv_stride,
                              b.h);
    for (int e = threadIdx.x; e < PF_ROWS * D / 4; e += THREADS) {
      const int r = e / (D / 4), c = 4 * (e % (D / 4));
      const float4 x = pf_query4(q, b, r, c, nq, D, qscale);
      u32 h0, l0, h1, l1;
      split_pair(x.x, x.y, h0, l0);
      split_pair(x.z, x.w, h1, l1);
      *reinterpret_cast<uint2*>(qh + r * PS + c / 2) = make_uint2(h0, h1);
      *reinterpret_cast<uint2*>(ql + r * PS + c / 2) = make_uint2(l0, l1);
    }
    cp_wait<0>();
    __syncthreads();
  }

  for (int tile = tile0; tile < tile1; ++tile) {
    // the raw tile (arrived, visible to all) -> the operands: K pairs four columns a thread,
    // V key pairs four columns of one key pair a thread (consecutive lanes: consecutive pairs)
    for (int e = threadIdx.x; e < BN * D / 4; e += THREADS) {
      const int r = e / (D / 4), c = 4 * (e % (D / 4));
      if constexpr (Tile::NARROW) {
        const float4 x = pf_decode4(k_raw + r * D + c);
        *reinterpret_cast<uint2*>(kh + r * PS + c / 2) =
            make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w));
      } else {
        const float4 x = *reinterpret_cast<const float4*>(k_raw + r * D + c);
        u32 h0, l0, h1, l1;
        split_pair(x.x, x.y, h0, l0);
        split_pair(x.z, x.w, h1, l1);
        *reinterpret_cast<uint2*>(kh + r * PS + c / 2) = make_uint2(h0, h1);
        *reinterpret_cast<uint2*>(kl + r * PS + c / 2) = make_uint2(l0, l1);
      }
    }
    for (int e = threadIdx.x; e < BN * D / 8; e += THREADS) {
      const int j = e % (BN / 2), c = 4 * (e / (BN / 2));
      float4 a, z;
      if constexpr (Tile::NARROW) {
        a = pf_decode4(v_raw + 2 * j * D + c);
        z = pf_decode4(v_raw + (2 * j + 1) * D + c);
      } else {
        a = *reinterpret_cast<const float4*>(v_raw + 2 * j * D + c);
        z = *reinterpret_cast<const float4*>(v_raw + (2 * j + 1) * D + c);
      }
      vp[c * VP + j] = pack_bf16(a.x, z.x);
      vp[(c + 1) * VP + j] = pack_bf16(a.y, z.y);
      vp[(c + 2) * VP + j] = pack_bf16(a.z, z.z);
      vp[(c + 3) * VP + j] = pack_bf16(a.w, z.w);
    }
    __syncthreads();  // operands ready, raw buffer free
    if (tile + 1 < tile1)
      pf_load_tile<D, BN, D, D>(k, v, pages, k_raw, v_raw, tile + 1, page, b.key_end,
                                kv_stride, b.h);

    const int n0 = tile * BN;
    if (n0 <= b.warp_hi) {  // else every key of the tile is in the future of the warp's rows
      const u32* qhw = qh + (warp * 16 + g) * PS + tig;
      const u32* qlw = ql + (warp * 16 + g) * PS + tig;
      // S = Q K^T, one m16n8k16 per 16 columns: A word (row g | g + 8, pair 8jp + tig | + 4),
      // B word (key 8nt + g, the same pairs); three accumulator sets, summed after the loop,
      // keep independent mma chains in flight
      float s[NT][4], c0[NT][4], c1[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = c0[nt][e] = c1[nt][e] = 0.f;
      }
#pragma unroll
      for (int jp = 0; jp < D / 16; ++jp) {
        const int w = 8 * jp;
        const u32 ah[4] = {qhw[w], qhw[8 * PS + w], qhw[w + 4], qhw[8 * PS + w + 4]};
        const u32 al[4] = {qlw[w], qlw[8 * PS + w], qlw[w + 4], qlw[8 * PS + w + 4]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const u32* kr = kh + (8 * nt + g) * PS + tig + w;
          mma_bf16(c0[nt], al, kr[0], kr[4]);  // small terms first
          if constexpr (!Tile::NARROW) {
            const u32* kq = kl + (8 * nt + g) * PS + tig + w;
            mma_bf16(c1[nt], ah, kq[0], kq[4]);
          }
          mma_bf16(s[nt], ah, kr[0], kr[4]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] += c0[nt][e] + c1[nt][e];
      }
      pf_softmax(s, o, m, l, b, n0);

      // O += P V, one m16n8k16 per 16 keys and 8 columns: A = P from score tiles 2p, 2p + 1
      // (their accumulator layout is the A fragment's), B word (column 8dt + g, key pair
      // 8p + tig | + 4); output tile dt holds columns 8dt + 2tig (+1)
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        const u32 pa[4] = {pack_bf16(s[2 * p][0], s[2 * p][1]),
                           pack_bf16(s[2 * p][2], s[2 * p][3]),
                           pack_bf16(s[2 * p + 1][0], s[2 * p + 1][1]),
                           pack_bf16(s[2 * p + 1][2], s[2 * p + 1][3])};
        const u32* vr = vp + g * VP + 8 * p + tig;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) mma_bf16(o[dt], pa, vr[8 * dt * VP], vr[8 * dt * VP + 4]);
      }
    }
    if (tile + 1 < tile1) cp_wait<0>();
    __syncthreads();  // the next tile arrived; this tile's operands are free to overwrite
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float inv;
    float* dst = pf_row_out(b, i, m[i], l, out, ws_o, ws_ml, T, nq, D, inv);
    if (dst == nullptr) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(dst + 8 * dt + 2 * tig) =
          make_float2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
  }
}

// out [rows, D] from the splits' partials: block = one row, thread = 4 columns.
template <int D>
__global__ void __launch_bounds__(D / 4)
    prefill_combine(const float* __restrict__ ws_o, const float* __restrict__ ws_ml,
                    float* __restrict__ out, int rows, int splits) {
  const long long row = blockIdx.x;
  const int c = 4 * threadIdx.x;
  float mx = PF_NEG_INF;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ws_ml[((long long)s * rows + row) * 2]);
  float4 acc = {0.f, 0.f, 0.f, 0.f};
  float sum = 0.f;
  for (int s = 0; s < splits; ++s) {
    const long long prow = (long long)s * rows + row;
    const float ms = ws_ml[prow * 2];
    if (ms == PF_NEG_INF) continue;  // a split with no visible key for this row
    const float w = exp2f(ms - mx);
    sum = fmaf(ws_ml[prow * 2 + 1], w, sum);
    const float4 x = *reinterpret_cast<const float4*>(ws_o + prow * D + c);
    acc.x = fmaf(x.x, w, acc.x);
    acc.y = fmaf(x.y, w, acc.y);
    acc.z = fmaf(x.z, w, acc.z);
    acc.w = fmaf(x.w, w, acc.w);
  }
  const float inv = 1.f / sum;
  acc.x *= inv;
  acc.y *= inv;
  acc.z *= inv;
  acc.w *= inv;
  *reinterpret_cast<float4*>(out + row * D + c) = acc;
}
