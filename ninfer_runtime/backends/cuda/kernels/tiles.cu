// Products of up to 8 activation rows over tile-packed row_split and GGUF q4_k/q5_k/q6_k/
// iq2_xxs weights (tiles.py: the layouts, and why), on the tensor cores: y[m, r] = sum_k x[m, k]
// W[r, k].
//
// A warp multiplies one 16-row tile at a time, a group per step of mma.m16n8k16: A is the
// tile's weights, decoded from the lane's 16-byte load straight into bf16 fragments (q4, the
// K-quants) or fp16 ones (q5, q8; every code is an integer, exact in either; the group or
// sub-block scale multiplies the fp32 result). B is x in one of two precisions (SPLIT):
// * split: x as hi + lo (both bf16, ~16 bits of x together; fp16: ~22 bits, each row scaled by
//   a power of two into range) in columns 2m and 2m + 1, so the lane holding column 2t of the
//   result holds both halves of row m = t (+ 4 for the second 8-column block);
// * production: x rounded once (bf16; fp16 after the same row scaling), row m in column m, so
//   eight rows take one 8-column block (half the mmas and half the staged x of split) and the
//   lane holding columns 2t, 2t + 1 holds rows 2t and 2t + 1.
// x is staged once per block in shared memory in fragment order (no separate pass, and no
// global load of x between the mmas).
//
// Work split: block (b, s) of a (BX, S) grid of W-warp blocks takes groups [s * per,
// (s + 1) * per) of K, and its warp w row tile W b + w: every warp the same work (one tile's
// slice), so no warp is left streaming alone at the end (tile_products.shape picks S). With
// S > 1 each block leaves partial sums and the last of the S blocks of index b adds them in
// slice order: deterministic.

// d += a * b with fp16 operands (the layout of mma_bf16)
__device__ __forceinline__ void mma_f16(float c[4], const u32 a[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 fma_f16x2(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ u32 sub_f16x2(u32 a, u32 b) {
  u32 d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Two fp16 values packed in w (element 0 in the low half) -> two floats
__device__ __forceinline__ void f16x2(u32 w, float& lo, float& hi) {
  lo = f16_to_f32((u16)(w & 0xFFFFu));
  hi = f16_to_f32((u16)(w >> 16));
}

// x0, x1 -> fp16x2 (round to nearest even), x0 in the low half
__device__ __forceinline__ u32 pack_f16(float x0, float x1) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0));
  return r;
}

// x = hi + lo with both fp16 (about 22 bits of x; x must lie inside fp16's range), lo in the
// low half of each word as for split_pair
__device__ __forceinline__ void split_pair_f16(float x0, float x1, u32& hi, u32& lo) {
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
  const float h0 = f16_to_f32((u16)(hi & 0xFFFFu)), h1 = f16_to_f32((u16)(hi >> 16));
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(x1 - h1), "f"(x0 - h0));
}

__device__ __forceinline__ u32 uint4_word(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

#define BF16_128_2 0x43004300u

// the nibbles at bits 0-3 and 16-19 of w as bf16 128 + nibble
__device__ __forceinline__ u32 magic_fields(u32 w) { return (w & 0x000F000Fu) | BF16_128_2; }

// What lane group g loads for one tile and four groups besides the codes: the scales (s[0]
// word u: the binary16 scales of rows g and g + 8 of group u) or a block's heads of rows g
// (s[0]) and g + 8 (s[1]), and q6_k's d of both rows (d).
struct TileScales {
  uint4 s[2];
  u32 d;
};

// What every tile policy shares for groups of G weights: an mma per 16, and lane t's weights
// of a group are k = (G / 4) t + 4 j + i for mma j, slot i. A policy adds frag (the four A
// registers of mma j from the lane's code words q, unless it has none (CODES), and its
// HIGH_WORDS more words h of the group) and says whether it takes fp16 operands (HALF) and
// what offset its fragments carry
// over the weights (OFFSET, taken off through staged sums of x). SUBS: the parts of a group
// with a scale of their own (mma j in part j * SUBS / MMAS; a lane's k of one part are
// consecutive); load_scales fetches them for four groups, scale gives part h's scale S and,
// with MINS, the min M that a weight has taken off (w = S c - M).
template <int G>
struct TileGroups {
  static constexpr int GW = G, MMAS = G / 16, SUBS = 1, HIGH_WORDS = 0;
  // warps a multiprocessor is to hold: the launch bounds cap a thread's registers to fit
  // RESIDENT_WARPS / W blocks of W warps (0: ptxas's own choice)
  static constexpr int RESIDENT_WARPS = 0;
  static constexpr bool CODES = true, HALF = false, MINS = false;
  static constexpr float OFFSET = 0.f;
  static __device__ __forceinline__ int k_of(int t, int j) { return G / 4 * t + 4 * j; }
  static __device__ __forceinline__ void prepare() {}
  static __device__ __forceinline__ void load_scales(TileScales& sc, const u8* __restrict__ plane,
                                                     long long quad, int g) {
    sc.s[0] = __ldg(reinterpret_cast<const uint4*>(plane) + quad * 8 + g);
  }
  static __device__ __forceinline__ void scale(const TileScales& s, int u, int, int rr, float& S,
                                               float& M) {
    const u32 w = uint4_word(s.s[0], u);
    S = f16_to_f32((u16)(rr ? w >> 16 : w & 0xFFFFu));
    M = 0.f;
  }
};

// A lane's HIGH_WORDS words of each of four groups, one or two 16-byte loads (streamed)
template <class F>
__device__ __forceinline__ void load_high(uint4 (&h)[2], const u8* __restrict__ plane,
                                          long long quad, int lane) {
  const uint4* at = reinterpret_cast<const uint4*>(plane) + (quad * 32 + lane) * F::HIGH_WORDS;
#pragma unroll
  for (int i = 0; i < F::HIGH_WORDS; ++i) h[i] = __ldcs(at + i);
}

// Group u's words of them (u known at compile time)
template <class F>
__device__ __forceinline__ uint2 high_words(const uint4 (&h)[2], int u) {
  const int n = F::HIGH_WORDS * u;
  if (F::HIGH_WORDS == 0) return make_uint2(0u, 0u);
  const u32 first = uint4_word(h[n >> 2], n & 3);
  return make_uint2(first, F::HIGH_WORDS > 1 ? uint4_word(h[(n + 1) >> 2], (n + 1) & 3) : 0u);
}

// The same words of one group u, loaded alone (the row decode's: u known at run time)
template <class F>
__device__ __forceinline__ uint2 load_group_high(const u8* __restrict__ plane, long long quad,
                                                 int lane, int u) {
  if (F::HIGH_WORDS == 0) return make_uint2(0u, 0u);
  const u32* at = reinterpret_cast<const u32*>(plane) + ((quad * 32 + lane) * 4 + u) * F::HIGH_WORDS;
  return make_uint2(__ldg(at), F::HIGH_WORDS > 1 ? __ldg(at + 1) : 0u);
}

// q4: a group is 64 weights
struct TileQ4 : TileGroups<64> {
  // the fragments hold 128 + c = q + 136: the product then takes 136 times the group's sum
  // of x off (staged with x), instead of a subtraction per pair
  static constexpr float OFFSET = 136.f;
  static __device__ __forceinline__ void frag(const uint4& q, uint2, int j, u32 (&a)[4]) {
    const u32 w = uint4_word(q, j);
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = magic_fields(w >> (4 * i));  // 128 + nibble
  }
};

// GGUF q4_k (ggml's blocks of 256: d, dmin, twelve bytes of 6-bit sub-block scales and
// mins, then the codes): a group is 64 weights, two 32-weight sub-blocks, so a step's four
// groups are one block. mma j takes sub-block j / 2 (k_of); fragments hold 128 + c (the
// unsigned code), and a weight is d sc c - dmin m: part h adds S (sum - 128 sum x) - M sum x
// with S = d sc and M = dmin m of its sub-block 2 u + h (ggml's get_scale_min_k4).
struct TileQ4K : TileQ4 {  // (q4's frag)
  // 7 blocks of 4 warps at 72 registers (measured on [17408, 5120], one row / eight: q4_k
  // 41.5 / 27.1% of the floor against 40.0 / 25.1 at 80; q5_k 40.6 / 29.3 against 39.8 /
  // 26.8 at 95; q6_k, capped likewise, lost 3 points at one row, so it is not)
  static constexpr int RESIDENT_WARPS = 28;
  static constexpr int SUBS = 2;
  static constexpr bool MINS = true;
  static constexpr float OFFSET = 128.f;
  static __device__ __forceinline__ int k_of(int t, int j) {
    return 32 * (j >> 1) + 8 * t + 4 * (j & 1);
  }
  static __device__ __forceinline__ void load_scales(TileScales& sc, const u8* __restrict__ plane,
                                                     long long quad, int g) {
    const uint4* at = reinterpret_cast<const uint4*>(plane) + (quad * 8 + g) * 2;
    sc.s[0] = __ldg(at);
    sc.s[1] = __ldg(at + 1);
  }
  static __device__ __forceinline__ u32 byte(const uint4& head, int b) {  // of the 12 scales
    return (uint4_word(head, 1 + (b >> 2)) >> (8 * (b & 3))) & 0xFFu;
  }
  static __device__ __forceinline__ void scale(const TileScales& s, int u, int h, int rr, float& S,
                                               float& M) {
    const uint4& head = s.s[rr];
    const int is = 2 * u + h;
    u32 sc, m;
    if (is < 4) {
      sc = byte(head, is) & 63u;
      m = byte(head, is + 4) & 63u;
    } else {
      sc = (byte(head, is + 4) & 15u) | ((byte(head, is - 4) >> 6) << 4);
      m = (byte(head, is + 4) >> 4) | ((byte(head, is) >> 6) << 4);
    }
    S = f16_to_f32((u16)(head.x & 0xFFFFu)) * (float)sc;
    M = f16_to_f32((u16)(head.x >> 16)) * (float)m;
  }
};

// GGUF q5_k: q4_k's blocks with a fifth bit a code, read as q4_k; the fifth bit of pair i of
// mma j is bit 4 j + i (first element) and 16 + 4 j + i (second) of the lane's fifth word of
// the group, moved to bits 4 and 20 (bf16 128 + c, c < 32)
struct TileQ5K : TileQ4K {
  static constexpr int HIGH_WORDS = 1;
  static __device__ __forceinline__ void frag(const uint4& q, uint2 h, int j, u32 (&a)[4]) {
    const u32 w = uint4_word(q, j);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int f = 4 * j + i;
      const u32 fifth = (f >= 4 ? h.x >> (f - 4) : h.x << (4 - f)) & 0x00100010u;
      a[i] = magic_fields(w >> (4 * i)) | fifth;
    }
  }
};

#define F16_MAGIC2 0x64006400u  // (bits | 0x6400) is the fp16 1024 + bits (bits < 1024)

// q5 on fp16 operands (the layout in tiles.py): pair P < 15 is field P % 3 of word P / 3, a
// 5-bit code c under the fp16 exponent of 1024 at bits 0-4 (1024 + c) or 5-9 (1024 + 32 c),
// one mask each, then one subtraction (or fma by 1/32) to c - 16 = q; pair 15 gathers bit 15
// and bit 31 of the five words. x enters as fp16 hi + lo, as for TileQ8.
struct TileQ5Half : TileGroups<64> {
  static constexpr int HIGH_WORDS = 1;
  static constexpr bool HALF = true;
  static __device__ __forceinline__ u32 word(const uint4& q, uint2 h, int w) {
    return w < 4 ? uint4_word(q, w) : h.x;
  }
  static __device__ __forceinline__ void frag(const uint4& q, uint2 h, int j, u32 (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int P = 4 * j + i;
      if (P < 15) {
        const u32 w = word(q, h, P / 3);
        if (P % 3 == 1) {  // (1024 + 32 c) / 32 - 48
          a[i] = fma_f16x2((w & 0x03E003E0u) | F16_MAGIC2, 0x28002800u, 0xD200D200u);
        } else {  // (1024 + c) - 1040
          a[i] = sub_f16x2(((P % 3 == 0 ? w : w >> 10) & 0x001F001Fu) | F16_MAGIC2, 0x64106410u);
        }
      } else {
        u32 c = 0;
#pragma unroll
        for (int b = 0; b < 5; ++b) c |= (word(q, h, b) >> (15 - b)) & (0x00010001u << b);
        a[i] = sub_f16x2(c | F16_MAGIC2, 0x64106410u);
      }
    }
  }
};

// q8 on fp16 operands: a byte u = q + 128 goes under the fp16 exponent byte 0x64 by one
// permute (1024 + u, exact), and one subtraction of 1152 leaves q: two instructions a pair
// against five on bf16. x then enters as fp16 hi + lo, scaled by a power of two per block
// and row into fp16's range (tiles_product undoes it).
struct TileQ8 : TileGroups<32> {
  static constexpr bool HALF = true;
  static __device__ __forceinline__ void frag(const uint4& q, uint2, int j, u32 (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // pair i: bytes (i % 2, i % 2 + 2) of word 2 j + i / 2
      const u32 w = uint4_word(q, 2 * j + i / 2);
      a[i] = sub_f16x2(prmt(w, 0x64646464u, i % 2 ? 0x4341u : 0x4240u), 0x64806480u);
    }
  }
};

// GGUF q6_k (ggml's blocks of 256: 4-bit low codes, 2-bit high codes, sixteen int8 scales of
// 16 weights, d): a group is 64 weights, each mma one 16-weight sub-block (k_of), its scale
// d sc. Fragments hold 128 + c on bf16 (c = q + 32, six bits: the low nibble as for q4, the
// two high bits from the lane's two high words, field 4 (j % 2) + i of word j / 2 at bits
// 2 f and 16 + 2 f), so the offset 160 comes off through the staged sums of x.
struct TileQ6K : TileGroups<64> {
  static constexpr int SUBS = 4, HIGH_WORDS = 2;
  static constexpr float OFFSET = 160.f;
  static __device__ __forceinline__ int k_of(int t, int j) { return 16 * j + 4 * t; }
  static __device__ __forceinline__ void frag(const uint4& q, uint2 h, int j, u32 (&a)[4]) {
    const u32 w = uint4_word(q, j), hw = j < 2 ? h.x : h.y;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int f = 4 * (j & 1) + i;  // the two high bits to bits 4-5 of each half
      const u32 high = (f >= 2 ? hw >> (2 * f - 4) : hw << (4 - 2 * f)) & 0x00300030u;
      a[i] = magic_fields(w >> (4 * i)) | high;
    }
  }
  // a block's record: [8 g][rows g, g + 8][16 int8 scales], then d of its 16 rows
  static __device__ __forceinline__ void load_scales(TileScales& sc, const u8* __restrict__ plane,
                                                     long long quad, int g) {
    const u8* block = plane + quad * 288;
    sc.s[0] = __ldg(reinterpret_cast<const uint4*>(block) + 2 * g);
    sc.s[1] = __ldg(reinterpret_cast<const uint4*>(block) + 2 * g + 1);
    const u16* d = reinterpret_cast<const u16*>(block + 256);
    sc.d = (u32)__ldg(d + g) | ((u32)__ldg(d + 8 + g) << 16);
  }
  static __device__ __forceinline__ void scale(const TileScales& s, int u, int h, int rr, float& S,
                                               float& M) {
    const int b = 4 * u + h;  // the sub-block of the block
    const int sc = (int)(signed char)((uint4_word(s.s[rr], b >> 2) >> (8 * (b & 3))) & 0xFFu);
    S = f16_to_f32((u16)(rr ? s.d >> 16 : s.d & 0xFFFFu)) * (float)sc;
    M = 0.f;
  }
};

// GGUF iq2_xxs: a lane's two words of a group hold the grid index (byte 2 h + rr) and sign
// index (bits 7 (2 h + rr)) of its grid row t of sub-block h for row g + 8 rr; mma j takes
// sub-block j / 2 (k_of as q4_k's), values 4 (j % 2) .. + 3 of the grid row. A grid row is
// the prmt selectors of its bf16 values out of the eight bytes TILE_IQ2XXS_BYTES_LO/HI, and a
// sign index the adds that move a negative value's high byte selector to its negated byte
// (gguf_tables.py). The scale of sub-block b of row g + 8 rr: d (0.5 + s) / 4, s its 4-bit
// scale (records as in tiles.py).
//
// Lanes look up different rows of both tables at once: the product keeps COPIES copies of
// them in shared memory, lane l reading copy l % COPIES (a lookup is one or two wavefronts a
// half warp; measured, 8 copies of both tables beat 16 of the selectors with the sign adds
// computed: more blocks fit); the row decode, one lookup a thread, reads them through L1.
struct IQ2TablesShared {
  static constexpr int COPIES = 8;
  static __device__ __forceinline__ uint2* selectors() {
    __shared__ uint2 table[256 * COPIES];  // entry e, copy c at e * COPIES + c
    return table;
  }
  static __device__ __forceinline__ uint2* sign_adds() {
    __shared__ uint2 table[128 * COPIES];
    return table;
  }
  static __device__ __forceinline__ void prepare() {  // (the caller synchronizes)
    const uint2* rows = reinterpret_cast<const uint2*>(TILE_IQ2XXS_SELECTORS);
    const uint2* adds = reinterpret_cast<const uint2*>(TILE_IQ2XXS_SIGN_ADDS);
    for (int i = threadIdx.x; i < 256 * COPIES; i += blockDim.x) selectors()[i] = __ldg(rows + i / COPIES);
    for (int i = threadIdx.x; i < 128 * COPIES; i += blockDim.x) sign_adds()[i] = __ldg(adds + i / COPIES);
  }
  static __device__ __forceinline__ uint2 row(u32 grid) {
    return selectors()[grid * COPIES + (threadIdx.x & (COPIES - 1))];
  }
  static __device__ __forceinline__ uint2 signs(u32 index) {
    return sign_adds()[index * COPIES + (threadIdx.x & (COPIES - 1))];
  }
};

struct IQ2TablesGlobal {
  static __device__ __forceinline__ void prepare() {}
  static __device__ __forceinline__ uint2 row(u32 grid) {
    return __ldg(reinterpret_cast<const uint2*>(TILE_IQ2XXS_SELECTORS) + grid);
  }
  static __device__ __forceinline__ uint2 signs(u32 index) {
    return __ldg(reinterpret_cast<const uint2*>(TILE_IQ2XXS_SIGN_ADDS) + index);
  }
};

template <class Tables>
struct TileIQ2XXSWith : TileGroups<64> {
  static constexpr int SUBS = 2, HIGH_WORDS = 2;
  static constexpr bool CODES = false;
  static __device__ __forceinline__ int k_of(int t, int j) { return TileQ4K::k_of(t, j); }
  static __device__ __forceinline__ void prepare() { Tables::prepare(); }
  static __device__ __forceinline__ void frag(const uint4&, uint2 h, int j, u32 (&a)[4]) {
    const int half = j & 1;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int f = 2 * (j >> 1) + rr;
      // (one lookup of each for j and j ^ 1)
      const uint2 row = Tables::row((h.x >> (8 * f)) & 0xFFu);
      const uint2 adds = Tables::signs((h.y >> (7 * f)) & 0x7Fu);
      const u32 sel = half ? row.y + adds.y : row.x + adds.x;
      a[rr] = prmt(TILE_IQ2XXS_BYTES_LO, TILE_IQ2XXS_BYTES_HI, sel);  // values 4 half, + 1
      a[rr + 2] = prmt(TILE_IQ2XXS_BYTES_LO, TILE_IQ2XXS_BYTES_HI, sel >> 16);  // + 2, + 3
    }
  }
  // a block's record: [8 g][rows g, g + 8][a word of eight 4-bit scales], then d of its rows
  static __device__ __forceinline__ void load_scales(TileScales& sc, const u8* __restrict__ plane,
                                                     long long quad, int g) {
    const u8* block = plane + quad * 96;
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(block) + g);
    sc.s[0] = make_uint4(w.x, w.y, 0u, 0u);
    const u16* d = reinterpret_cast<const u16*>(block + 64);
    sc.d = (u32)__ldg(d + g) | ((u32)__ldg(d + 8 + g) << 16);
  }
  static __device__ __forceinline__ void scale(const TileScales& s, int u, int h, int rr, float& S,
                                               float& M) {
    const u32 nibble = ((rr ? s.s[0].y : s.s[0].x) >> (4 * (2 * u + h))) & 15u;
    const float d = f16_to_f32((u16)(rr ? s.d >> 16 : s.d & 0xFFFFu));
    S = __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)nibble)), 0.25f);  // (as ggml)
    M = 0.f;
  }
};

using TileIQ2XXS = TileIQ2XXSWith<IQ2TablesShared>;
using TileIQ2XXSRows = TileIQ2XXSWith<IQ2TablesGlobal>;

// What a lane loads for one tile and four groups: codes, their high words, the scales.
struct TileStep {
  uint4 q[4];
  uint4 h[2];
  TileScales s;
};

template <class F>
__device__ __forceinline__ void load_step(TileStep& st, const u8* __restrict__ obj,
                                          long long high, long long scales, int groups,
                                          long long tile, int q, int lane) {
  const uint4* codes = reinterpret_cast<const uint4*>(obj) + (tile * groups + q) * 32 + lane;
#pragma unroll
  for (int u = 0; u < 4 && F::CODES; ++u) st.q[u] = __ldcs(codes + 32 * u);  // streamed
  const long long quad = tile * (groups / 4) + q / 4;
  load_high<F>(st.h, obj + high, quad, lane);
  F::load_scales(st.s, obj + scales, quad, lane >> 2);
}

// Block-wide: x[m, q0 * GW ...] for groups q0 .. q0 + L - 1 into xs in fragment order. For
// group ql, mma j, split: 8 * m_rows uint2, entry 8 m + 4 h + t the B fragment (k slots of
// lane t) of column 2 m + h (h = 0: hi, 1: lo); production: 4 * m_rows uint2, entry 4 m + t
// that of column m (x rounded once). With sums (F::OFFSET), also sums[(m * L + ql) * SUBS +
// h] = part h of the group's sum of x as staged (hi + lo, or the rounded x; exact pairs, added
// in a fixed order: deterministic); parts (16 floats a group and row) holds the four-element
// sums on the way.
// With F::HALF, row m is first scaled by 2^(14 - E), E the exponent of its largest |x| in the
// slice, into fp16's range (exactly), and unscale[m] gets the inverse; scales holds m_rows
// words on the way.
template <class F, bool SPLIT>
__device__ __forceinline__ void stage_x(uint2* xs, float* sums, float* parts, float* unscale,
                                        u32* scales, const float* __restrict__ x, int ldx,
                                        int m_rows, int q0, int L) {
  constexpr int BATCH = 8;  // loads in flight a thread before the first is used
  const int items = L * F::MMAS * m_rows * 4;
  const auto at = [&](int e) {
    const int t = e & 3, rest = e >> 2, m = rest % m_rows, jq = rest / m_rows;
    const int j = jq % F::MMAS, ql = jq / F::MMAS;
    return reinterpret_cast<const float4*>(x + (long long)m * ldx + (long long)(q0 + ql) * F::GW +
                                           F::k_of(t, j));
  };
  if (F::HALF) {
    if (threadIdx.x < m_rows) scales[threadIdx.x] = 0u;
    __syncthreads();
    for (int e = threadIdx.x; e < items; e += blockDim.x) {
      const float4 v = __ldg(at(e));
      const float big = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
      atomicMax(scales + (e >> 2) % m_rows, __float_as_uint(big));  // (order-free: exact)
    }
    __syncthreads();
    if (threadIdx.x < m_rows) {
      const int e = (int)(scales[threadIdx.x] >> 23) - 127;  // the largest |x|'s exponent
      const int up = scales[threadIdx.x] == 0u ? 0 : max(-100, min(100, 14 - e));
      scales[threadIdx.x] = (u32)(127 + up) << 23;
      unscale[threadIdx.x] = __uint_as_float((u32)(127 - up) << 23);
    }
    __syncthreads();
  }
  for (int base = threadIdx.x; base < items; base += BATCH * blockDim.x) {
    float4 v[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int e = base + b * blockDim.x;
      if (e >= items) break;
      v[b] = __ldg(at(e));
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int e = base + b * blockDim.x;
      if (e >= items) break;
      const int t = e & 3, rest = e >> 2, m = rest % m_rows, jq = rest / m_rows;
      uint2 hi, lo = make_uint2(0u, 0u);
      if (F::HALF) {
        const float up = __uint_as_float(scales[m]);
        if (SPLIT) {
          split_pair_f16(v[b].x * up, v[b].y * up, hi.x, lo.x);
          split_pair_f16(v[b].z * up, v[b].w * up, hi.y, lo.y);
        } else {
          hi = make_uint2(pack_f16(v[b].x * up, v[b].y * up), pack_f16(v[b].z * up, v[b].w * up));
        }
      } else if (SPLIT) {
        split_pair(v[b].x, v[b].y, hi.x, lo.x);
        split_pair(v[b].z, v[b].w, hi.y, lo.y);
      } else {
        hi = make_uint2(pack_bf16(v[b].x, v[b].y), pack_bf16(v[b].z, v[b].w));
      }
      if (SPLIT) {
        uint2* dst = xs + jq * 8 * m_rows + 8 * m + t;
        dst[0] = hi;
        dst[4] = lo;
      } else {
        xs[jq * 4 * m_rows + 4 * m + t] = hi;
      }
      if (F::OFFSET != 0.f) {  // (the offset formats take bf16 operands; lo is 0 unsplit)
        float a, b2, c, d;
        bf16x2(hi.x, a, b2);
        bf16x2(lo.x, c, d);
        float sum = (a + c) + (b2 + d);
        bf16x2(hi.y, a, b2);
        bf16x2(lo.y, c, d);
        sum += (a + c) + (b2 + d);
        const int j = jq % F::MMAS, ql = jq / F::MMAS;
        parts[(m * L + ql) * 16 + 4 * j + t] = sum;
      }
    }
  }
  if (F::OFFSET == 0.f) return;
  __syncthreads();
  constexpr int PER = 16 / F::SUBS;  // four-element sums a part
  for (int e = threadIdx.x; e < L * m_rows * F::SUBS; e += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) sum += parts[e * PER + i];
    sums[e] = sum;
  }
}

extern __shared__ uint2 tile_x[];

// NB 8-column blocks of B (split: 1 for M <= 4, 2 for M <= 8; production: 1), W warps a
// block (more warps share one staging of x). Object rows row0 .. row0 + rows - 1 are tiles
// tile0 .. tile0 + tiles - 1 (row0 need not start a tile: rows outside are not stored).
template <class F, int NB, int W, bool SPLIT>
__device__ __forceinline__ void tiles_product(const u8* __restrict__ obj, long long high,
                                              long long scales, int groups, int tile0,
                                              int tiles, int row0, int rows, int per,
                                              const float* __restrict__ x, int ldx, int m_rows,
                                              float* __restrict__ y, int ldy,
                                              float* __restrict__ partial,
                                              unsigned* __restrict__ counters) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int q0 = blockIdx.y * per, steps = min(groups - q0, per) / 4;  // four groups a step
  const int live = (SPLIT ? 8 : 4) * m_rows;  // staged B entries an mma
  // result columns a lane's accumulators hold an x row each: split, one (2t + its lo);
  // production, two (rows 2t and 2t + 1)
  constexpr int COLS = SPLIT ? 1 : 2;
  const int i = blockIdx.x * W + warp;  // this warp's tile
  const long long tile = tile0 + i;

  TileStep cur;  // the first loads in flight while x is staged
  if (i < tiles) load_step<F>(cur, obj, high, scales, groups, tile, q0, lane);
  const int L = 4 * steps;
  uint2* xs = tile_x;
  float* sums = reinterpret_cast<float*>(tile_x + L * F::MMAS * live);
  __shared__ float unscale[8];
  __shared__ u32 row_scales[8];
  F::prepare();  // (before the barrier after staging)
  stage_x<F, SPLIT>(xs, sums, sums + L * m_rows * F::SUBS, unscale, row_scales, x, ldx, m_rows,
                    q0, L);
  __syncthreads();
  // x row of column block nb, accumulator column cc
  const auto row_of = [&](int nb, int cc) { return SPLIT ? 4 * nb + t : 2 * t + cc; };

  float acc[NB][2][COLS];  // [column block][rows g, g + 8][column]
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int cc = 0; cc < COLS; ++cc) acc[nb][rr][cc] = 0.f;
  for (int s = 0; i < tiles && s < steps; ++s) {
    if (s > 0) load_step<F>(cur, obj, high, scales, groups, tile, q0 + 4 * s, lane);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint2* xq = xs + (4 * s + u) * F::MMAS * live;
      float part[NB][F::SUBS][4];
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int h = 0; h < F::SUBS; ++h)
#pragma unroll
          for (int c = 0; c < 4; ++c) part[nb][h][c] = 0.f;
#pragma unroll
      for (int j = 0; j < F::MMAS; ++j) {
        u32 a[4];
        F::frag(cur.q[u], high_words<F>(cur.h, u), j, a);
        const int h = j * F::SUBS / F::MMAS;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          const int e = 32 * nb + lane;
          const uint2 b = e < live ? xq[j * live + e] : make_uint2(0u, 0u);
          if (F::HALF) {
            mma_f16(part[nb][h], a, b.x, b.y);
          } else {
            mma_bf16(part[nb][h], a, b.x, b.y);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < F::SUBS; ++h) {
        float S[2], M[2];  // rows g and g + 8
        F::scale(cur.s, u, h, 0, S[0], M[0]);
        F::scale(cur.s, u, h, 1, S[1], M[1]);
#pragma unroll
        // columns 2t, 2t + 1: hi and lo of one x row (split), or two rows (production)
        for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
          for (int cc = 0; cc < COLS; ++cc) {
            const int m = row_of(nb, cc);
            const float sum =
                F::OFFSET != 0.f && m < m_rows ? sums[(m * L + 4 * s + u) * F::SUBS + h] : 0.f;
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const float p = SPLIT ? part[nb][h][2 * rr] + part[nb][h][2 * rr + 1]
                                    : part[nb][h][2 * rr + cc];
              acc[nb][rr][cc] = fmaf(S[rr], p - F::OFFSET * sum, acc[nb][rr][cc]);
              if (F::MINS) acc[nb][rr][cc] = fmaf(-M[rr], sum, acc[nb][rr][cc]);
            }
          }
        }
      }
    }
  }
  if (i < tiles) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int cc = 0; cc < COLS; ++cc) {
        const int m = row_of(nb, cc);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const long long row = tile * 16 + g + 8 * h - row0;
          if (m >= m_rows || row < 0 || row >= rows) continue;
          const float v = F::HALF ? acc[nb][h][cc] * unscale[m] : acc[nb][h][cc];  // (exact)
          if (gridDim.y == 1) {
            y[(long long)m * ldy + row] = v;
          } else {
            partial[((long long)blockIdx.y * m_rows + m) * rows + row] = v;
          }
        }
      }
  }
  if (gridDim.y == 1) return;

  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // the slices' partial sums of this block's rows, in slice order
  const long long slice = (long long)m_rows * rows;
  const long long first = ((long long)tile0 + blockIdx.x * W) * 16 - row0;
  for (int e = threadIdx.x; e < W * 16 * m_rows; e += blockDim.x) {
    const int m = e / (W * 16);
    const long long row = first + e % (W * 16);
    if (row < 0 || row >= rows) continue;
    float sum = 0.f;
    for (int sl = 0; sl < (int)gridDim.y; ++sl) sum += __ldcg(partial + sl * slice + m * rows + row);
    y[(long long)m * ldy + row] = sum;
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // ready for the next launch
}

#define DEFINE_TILES(NAME, POLICY)                                                          \
  template <int NB, int W, bool SPLIT>                                                      \
  __global__ void __launch_bounds__(W * 32, POLICY::RESIDENT_WARPS / W)                     \
      NAME(const u8* __restrict__ obj, long long high, long long scales, int groups,       \
           int tile0, int tiles, int row0, int rows, int per, const float* __restrict__ x,  \
           int ldx, int m_rows, float* __restrict__ y, int ldy, float* __restrict__ partial, \
           unsigned* __restrict__ counters) {                                               \
    tiles_product<POLICY, NB, W, SPLIT>(obj, high, scales, groups, tile0, tiles, row0, rows,   \
                                        per, x, ldx, m_rows, y, ldy, partial, counters);    \
  }

DEFINE_TILES(tiles_q4, TileQ4)
DEFINE_TILES(tiles_q5, TileQ5Half)
DEFINE_TILES(tiles_q8, TileQ8)
DEFINE_TILES(tiles_q4k, TileQ4K)
DEFINE_TILES(tiles_q5k, TileQ5K)
DEFINE_TILES(tiles_q6k, TileQ6K)
DEFINE_TILES(tiles_iq2xxs, TileIQ2XXS)

// ------------------------------------------------------------------ rows to float / bf16
// out[i, k] = W[rows[i], k] for k < columns, as float32 or as bf16 words (BF16). A thread
// takes what one lane holds of one group of a row (one 16-byte load): SUBS runs of RUN
// consecutive k.
template <class F, bool BF16>
__device__ __forceinline__ void tiles_rows(const u8* __restrict__ obj, long long high,
                                           long long scales, int groups,
                                           const int* __restrict__ rows, int n, int columns,
                                           void* __restrict__ out) {
  constexpr int LANE_K = F::GW / 4, RUN = LANE_K / F::SUBS;
  const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const int per_row = (columns + LANE_K - 1) / LANE_K;
  if (id >= (long long)n * per_row) return;
  const int i = (int)(id / per_row), unit = (int)(id % per_row);
  const int q = unit / 4, t = unit % 4;
  const long long r = __ldg(rows + i), tile = r >> 4;
  const int rr = (int)(r >> 3) & 1, g = (int)r & 7, lane = 4 * g + t;
  const uint4 code = F::CODES
      ? __ldg(reinterpret_cast<const uint4*>(obj) + (tile * groups + q) * 32 + lane)
      : make_uint4(0u, 0u, 0u, 0u);
  const long long quad = tile * (groups / 4) + q / 4;
  const uint2 h = load_group_high<F>(obj + high, quad, lane, q % 4);
  TileScales sc;
  F::load_scales(sc, obj + scales, quad, g);
  float v[LANE_K];
#pragma unroll
  for (int j = 0; j < F::MMAS; ++j) {
    u32 a[4];
    F::frag(code, h, j, a);
    // pair rr: slots 0-1 of this row, pair 2 + rr: slots 2-3 (k = k_of(t, j) + slot)
    float x[4];
    F::HALF ? f16x2(rr ? a[1] : a[0], x[0], x[1]) : bf16x2(rr ? a[1] : a[0], x[0], x[1]);
    F::HALF ? f16x2(rr ? a[3] : a[2], x[2], x[3]) : bf16x2(rr ? a[3] : a[2], x[2], x[3]);
    float S, M;  // (rr as a constant: the scales are registers, not an indexed array)
    if (rr) {
      F::scale(sc, q % 4, j * F::SUBS / F::MMAS, 1, S, M);
    } else {
      F::scale(sc, q % 4, j * F::SUBS / F::MMAS, 0, S, M);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      // (fragments hold the code plus OFFSET; no fma: the codec rounds the product first)
      v[4 * j + e] = __fmul_rn(x[e] - F::OFFSET, S);
      if (F::MINS) v[4 * j + e] -= M;
    }
  }
#pragma unroll
  for (int part = 0; part < F::SUBS; ++part) {
    const int k0 = q * F::GW + F::k_of(t, part * F::MMAS / F::SUBS);
    const float* vp = v + part * RUN;
    const long long at = (long long)i * columns + k0;
    if (columns % RUN == 0 && BF16) {  // RUN / 2 words: 8 or 16 bytes at a time
      u32 o[RUN / 2];
#pragma unroll
      for (int e = 0; e < RUN / 2; ++e)
        o[e] = (u32)f32_to_bf16_rn(vp[2 * e]) | ((u32)f32_to_bf16_rn(vp[2 * e + 1]) << 16);
      if (RUN == 4) {
        reinterpret_cast<uint2*>(out)[at / 4] = make_uint2(o[0], o[1]);
      } else {
#pragma unroll
        for (int c = 0; c < RUN / 8; ++c)
          reinterpret_cast<uint4*>(out)[at / 8 + c] =
              make_uint4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
      }
    } else if (columns % RUN == 0) {
      float4* o = reinterpret_cast<float4*>(out) + at / 4;
#pragma unroll
      for (int c = 0; c < RUN / 4; ++c) o[c] = make_float4(vp[4 * c], vp[4 * c + 1], vp[4 * c + 2], vp[4 * c + 3]);
    } else {  // rows not 16-byte aligned: one element at a time, the row's end cut off
#pragma unroll
      for (int e = 0; e < RUN; ++e) {
        if (k0 + e >= columns) break;
        if (BF16) reinterpret_cast<u16*>(out)[at + e] = f32_to_bf16_rn(vp[e]);
        else reinterpret_cast<float*>(out)[at + e] = vp[e];
      }
    }
  }
}

#define DEFINE_TILE_ROWS(NAME, POLICY)                                                          \
  template <bool BF16>                                                                          \
  __global__ void NAME##_rows(const u8* __restrict__ obj, long long high, long long scales,     \
                              int groups, const int* __restrict__ rows, int n, int columns,     \
                              void* __restrict__ out) {                                         \
    tiles_rows<POLICY, BF16>(obj, high, scales, groups, rows, n, columns, out);                 \
  }

DEFINE_TILE_ROWS(tiles_q4, TileQ4)
DEFINE_TILE_ROWS(tiles_q5, TileQ5Half)
DEFINE_TILE_ROWS(tiles_q8, TileQ8)
DEFINE_TILE_ROWS(tiles_q4k, TileQ4K)
DEFINE_TILE_ROWS(tiles_q5k, TileQ5K)
DEFINE_TILE_ROWS(tiles_q6k, TileQ6K)
DEFINE_TILE_ROWS(tiles_iq2xxs, TileIQ2XXSRows)
