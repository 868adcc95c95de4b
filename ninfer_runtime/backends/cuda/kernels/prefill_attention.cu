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
// prefill_attention: grid (Nkv, ceil(T*G / PF_ROWS), splits), PF_ROW_WARPS warps of 16 rows,
// each with a partner warp (PF_HALVES = 2): the two take the two halves of every key tile,
// with their own online softmax, and merge their (O, m, l) at the end. Two warps per SM
// sub-partition hide the products' and loads' latency that one alone waited on (the shared
// memory of a block, its Q rows and K/V tiles, leaves room for one block an SM at D = 256). K/V
// tiles of BN keys are double-buffered by cp.async, each row fetched from its page: float32
// rows straight into the float tiles the products read; narrower rows into a raw staging
// buffer, decoded to float32 into the (single) float tiles once the tile has arrived. Both
// products run on tensor cores with float32 accumulation; scores are in the log2 domain (q is
// pre-scaled by scale * log2(e) as it is staged). PREC picks operand precision:
//   PF_BF16      Q.K^T in 3xBF16 (mma.sync m16n8k16: x = hi + lo, both bf16, hi*hi + hi*lo +
//                lo*hi: about 16 mantissa bits), P.V on bf16 P and V: half the mmas of
//                PF_SPLIT_QK, at the bf16 rounding the prefill products have anyway;
//   PF_SPLIT_QK  Q.K^T in 3xTF32 (m16n8k8, x = hi + lo: about float32), P.V in TF32. Score
//                errors are what grows with the scores' magnitude (peaked attention): split
//                scores keep the error near the P.V rounding where plain TF32 or bf16 scores
//                reach 1e-2;
//   PF_SPLIT     both products in 3xTF32 (the backend with TF32 off: float32 comparisons).
// With splits > 1 each block takes only a range of its key tiles and writes unnormalised
// partials (O, m, l); prefill_combine merges them (short chunks over long contexts would
// otherwise leave most of the GPU idle).

#define PF_ROW_WARPS 4
#define PF_HALVES 2
#define PF_WARPS (PF_ROW_WARPS * PF_HALVES)
#define PF_ROWS (PF_ROW_WARPS * 16)
#define PF_NEG_INF __int_as_float(0xff800000)

#define PF_SPLIT_QK 1
#define PF_SPLIT 2
#define PF_BF16 3

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
  constexpr int CHUNK = Tile::CHUNK, KSTAGE = Tile::KSTAGE, VSTAGE = Tile::VSTAGE;
  constexpr int HN = BN / PF_HALVES;  // keys of a tile each warp of a pair takes
  constexpr int NT = HN / 8;         // its 8-key column tiles of the scores
  constexpr int DT = D / 8;   // 8-column tiles of the output
  constexpr bool BF16 = PREC == PF_BF16, SPLIT_PV = PREC == PF_SPLIT;
  static_assert(PREC == PF_BF16 || PREC == PF_SPLIT_QK || PREC == PF_SPLIT, "precision");
  // a tile's 16-byte copies: each thread takes the same column in rows RSTEP apart
  constexpr int ROW_CHUNKS = D / CHUNK, RSTEP = PF_WARPS * 32 / ROW_CHUNKS;
  static_assert(PF_WARPS * 32 % ROW_CHUNKS == 0 && BN % RSTEP == 0, "tile copy layout");
  extern __shared__ float4 pf_smem[];
  float* q_s = reinterpret_cast<float*>(pf_smem);    // [PF_ROWS][QS]
  float* k_s = q_s + PF_ROWS * QS;                   // [FLOAT_BUFS][BN][KS]
  float* v_s = k_s + Tile::FLOAT_BUFS * BN * KS;     // [FLOAT_BUFS][BN][VS]
  // the copies' destinations: [2][BN][KSTAGE] and [2][BN][VSTAGE] elements of KV
  KV* k_stage = Tile::NARROW ? reinterpret_cast<KV*>(v_s + BN * VS) : reinterpret_cast<KV*>(k_s);
  KV* v_stage = Tile::NARROW ? k_stage + 2 * BN * D : reinterpret_cast<KV*>(v_s);

  const int h = blockIdx.x;
  const int m0 = (gridDim.y - 1 - blockIdx.y) * PF_ROWS;  // the latest (longest) rows first
  const int split = blockIdx.z;
  const int warp = (threadIdx.x >> 5) % PF_ROW_WARPS, half = (threadIdx.x >> 5) / PF_ROW_WARPS;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;  // mma fragment coordinates
  const int group = nq / nkv, rows = T * group;
  const long long kv_stride = (long long)nkv * D;

  const int key_end = start + min(T - 1, (m0 + PF_ROWS - 1) / group) + 1;  // exclusive
  const int tile0 = split * tiles_per_split;
  const int tile1 = min((key_end + BN - 1) / BN, tile0 + tiles_per_split);

  // the last key each of the thread's rows (warp*16 + g, + 8) sees; padding rows past T*G
  // act as the last token and are never written
  const int wrow = m0 + warp * 16;
  int lim[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) lim[i] = start + min(T - 1, (wrow + g + 8 * i) / group);
  const int warp_lo = start + min(T - 1, wrow / group);
  const int warp_hi = start + min(T - 1, (wrow + 15) / group);

  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {PF_NEG_INF, PF_NEG_INF}, l[2] = {0.f, 0.f};

  // Key n of the tile is row n % page of page pages[n / page]; a thread's rows step by RSTEP,
  // so its page and row in the page advance without a division per copy. Keys past the
  // block's last are zero-filled (all zero bits decode to 0 in every storage type).
  const int copy_row = threadIdx.x / ROW_CHUNKS, copy_col = CHUNK * (threadIdx.x % ROW_CHUNKS);
  auto load_tile = [&](int tile, int buf) {
    KV* ks = k_stage + buf * BN * KSTAGE;
    KV* vs = v_stage + buf * BN * VSTAGE;
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
      cp_async16(ks + r * KSTAGE + copy_col, k + off, ok);
      cp_async16(vs + r * VSTAGE + copy_col, v + off, ok);
    }
    cp_commit();
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
      float4 x = {0.f, 0.f, 0.f, 0.f};
      if (m0 + r < rows) {
        const int t = (m0 + r) / group, gq = (m0 + r) - t * group;
        x = __ldg(reinterpret_cast<const float4*>(
            q + ((long long)t * nq + (long long)h * group + gq) * D + c));
        x.x *= qscale;
        x.y *= qscale;
        x.z *= qscale;
        x.w *= qscale;
      }
      *reinterpret_cast<float4*>(q_s + r * QS + c) = x;
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
    const int n0 = tile * BN + half * HN;  // the warp's first key of the tile
    if (n0 <= warp_hi) {  // else every key of its half is in the future of the warp's rows
      const float* qw = q_s + warp * 16 * QS;
      const int fbuf = Tile::NARROW ? 0 : buf;
      const float* ks = k_s + (fbuf * BN + half * HN) * KS;
      const float* vs = v_s + (fbuf * BN + half * HN) * VS;

      // S = Q K^T. The reduction over d may visit d in any order: mma k-step 2*jp + half
      // takes column tig <-> d = 16*jp + 4*tig + 2*half and column tig + 4 <-> that d + 1,
      // so each lane reads its Q and K values as whole float4s.
      // three accumulator sets (summed after the loop) so that more independent mma chains
      // are in flight: with two warps per SM sub-partition, mma latency still sets the pace
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
        if constexpr (BF16) {
          // one m16n8k16 per 16 d: k slots (2tig, 2tig+1) <-> d = 16jp + 4tig + (0, 1) and
          // (2tig+8, 2tig+9) <-> d + (2, 3), in A (rows g, g+8) and B (key 8nt + g) alike
          u32 qh[4], ql[4];
          split_pair(qa.x, qa.y, qh[0], ql[0]);
          split_pair(qb.x, qb.y, qh[1], ql[1]);
          split_pair(qa.z, qa.w, qh[2], ql[2]);
          split_pair(qb.z, qb.w, qh[3], ql[3]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const float4 kb =
                *reinterpret_cast<const float4*>(ks + (8 * nt + g) * KS + 16 * jp + 4 * tig);
            u32 kh0, kl0, kh1, kl1;
            split_pair(kb.x, kb.y, kh0, kl0);
            split_pair(kb.z, kb.w, kh1, kl1);
            mma_bf16(c0[nt], ql, kh0, kh1);  // small terms first
            mma_bf16(c1[nt], qh, kl0, kl1);
            mma_bf16(s[nt], qh, kh0, kh1);
          }
          continue;
        }
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

      // s[nt][e]: row g (e < 2) or g + 8, key n0 + 8*nt + 2*tig + (e & 1)
      if (n0 + HN - 1 > warp_lo) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (n0 + 8 * nt + 2 * tig + (e & 1) > lim[e >> 1]) s[nt][e] = PF_NEG_INF;
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
        l[i] *= alpha[i];  // l is per lane (its own columns) until the end
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

      // O += P V. The scores' accumulator layout becomes the A fragment directly: k-step nt
      // takes column tig <-> key 8*nt + 2*tig and column tig + 4 <-> key 8*nt + 2*tig + 1.
      // Output tile dt, column n <-> d = 32*(dt/4) + 4*n + dt%4, so a lane reads V as float4s
      // and finally holds 8 contiguous columns of each row per 32.
      if constexpr (BF16) {
        // m16n8k16 per 16 keys: A = P from two score tiles (keys 16p + 2tig (+1) and
        // 16p + 8 + 2tig (+1), rows g and g + 8), B = V at those keys; output tile dt,
        // column n <-> d = 32*(dt/4) + 4*n + dt%4 as below
#pragma unroll
        for (int p = 0; p < NT / 2; ++p) {
          const u32 pa[4] = {pack_bf16(s[2 * p][0], s[2 * p][1]),
                             pack_bf16(s[2 * p][2], s[2 * p][3]),
                             pack_bf16(s[2 * p + 1][0], s[2 * p + 1][1]),
                             pack_bf16(s[2 * p + 1][2], s[2 * p + 1][3])};
          const float* v0 = vs + (16 * p + 2 * tig) * VS + 4 * g;
#pragma unroll
          for (int c = 0; c < D / 32; ++c) {
            const float4 r0 = *reinterpret_cast<const float4*>(v0 + 32 * c);
            const float4 r1 = *reinterpret_cast<const float4*>(v0 + VS + 32 * c);
            const float4 r8 = *reinterpret_cast<const float4*>(v0 + 8 * VS + 32 * c);
            const float4 r9 = *reinterpret_cast<const float4*>(v0 + 9 * VS + 32 * c);
            mma_bf16(o[4 * c], pa, pack_bf16(r0.x, r1.x), pack_bf16(r8.x, r9.x));
            mma_bf16(o[4 * c + 1], pa, pack_bf16(r0.y, r1.y), pack_bf16(r8.y, r9.y));
            mma_bf16(o[4 * c + 2], pa, pack_bf16(r0.z, r1.z), pack_bf16(r8.z, r9.z));
            mma_bf16(o[4 * c + 3], pa, pack_bf16(r0.w, r1.w), pack_bf16(r8.w, r9.w));
          }
        }
      } else {
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
    }
    __syncthreads();  // the next iteration's prefetch (or decode) overwrites this buffer
  }

  // the second warp of each pair hands its (O, m, l) to the first through the K/V tiles'
  // space (free after the loop's last barrier), lane-minor so that the lanes' words differ
  // in bank; the first merges them as the online softmax would, and writes the rows
  constexpr int HAND = (4 * DT + 4) * 32;  // floats a warp hands over
  static_assert(PF_ROW_WARPS * HAND <= Tile::FLOAT_BUFS * BN * (KS + VS) +
                                           (Tile::NARROW ? BN * D * (int)sizeof(KV) : 0),
                "the hand-over fits in the K/V tiles");
  float* hand = k_s + warp * HAND + lane;
  if (half == 1) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) hand[(4 * dt + e) * 32] = o[dt][e];
    }
    hand[(4 * DT) * 32] = m[0];
    hand[(4 * DT + 1) * 32] = m[1];
    hand[(4 * DT + 2) * 32] = l[0];
    hand[(4 * DT + 3) * 32] = l[1];
  }
  __syncthreads();
  if (half == 1) return;
  float a0[2], a1[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m1 = hand[(4 * DT + i) * 32], l1 = hand[(4 * DT + 2 + i) * 32];
    const float mx = fmaxf(m[i], m1);
    const float base = mx == PF_NEG_INF ? 0.f : mx;  // neither half saw a key: all zero
    a0[i] = exp2f(m[i] - base);
    a1[i] = exp2f(m1 - base);
    m[i] = mx;
    l[i] = l[i] * a0[i] + l1 * a1[i];
  }
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      o[dt][e] = o[dt][e] * a0[e >> 1] + hand[(4 * dt + e) * 32] * a1[e >> 1];
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 1);
    l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 2);
  }
  const bool partial = gridDim.z > 1;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = wrow + g + 8 * i;
    if (r >= rows) continue;
    const int t = r / group, gq = r - t * group;
    const long long orow = (long long)t * nq + (long long)h * group + gq;
    float* dst;
    float inv;
    if (partial) {
      const long long prow = (long long)split * T * nq + orow;
      dst = ws_o + prow * D;
      inv = 1.f;
      if (tig == 0) {
        ws_ml[prow * 2] = m[i];
        ws_ml[prow * 2 + 1] = l[i];
      }
    } else {
      dst = out + orow * D;
      inv = 1.f / l[i];
    }
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
