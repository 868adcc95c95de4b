// Layout policies of the small-M tensor-core product (gemm_small.cu, gemm_small_policy.cuh)
// for ggml's K-quant blocks (gguf_blocks_v1), kept apart so that the CPU tests compile them
// with the host compiler and check their fragments against the numpy decoder.

// ggml q4_k / q5_k blocks (gguf_blocks_v1; ``stride``: blocks per row): 256 weights a block
// of 144 / 176 bytes, in 8 groups of 32 with a 6-bit scale and min each (w = d * sc * q -
// dmin * m). A chunk is 8 weights: bytes 8c .. 8c + 7 of the group's 32 code bytes (the low
// nibbles for even groups, the high for odd; q5_k's fifth bit is bit j of the same bytes of
// qh). Pairs of a word are bytes (0, 2) and (1, 3), which one shift and mask place in the two
// halves of a bf16x2 word.
template <int TYPE>
struct SmallGgufK : PlainRows {
  static constexpr int GW = 32, BYTES = TYPE == 12 ? 144 : 176, CODES = TYPE == 12 ? 16 : 48;
  static constexpr bool SCALED = true, MINS = true;
  struct Raw {
    uint2 q, h;  // the chunk's code bytes, q5_k's high-bit bytes
    float s, m;
    int j;       // the group within its block
  };
  static __device__ __forceinline__ void load(Raw& r, const SmallArgs& a, long long n, int q,
                                              int c) {
    const u8* block = a.obj + (n * a.stride + q / 8) * BYTES;
    const int j = q % 8;
    const uint4 head = __ldg(reinterpret_cast<const uint4*>(block));  // d, dmin, 12 scale bytes
    const u32 sw[3] = {head.y, head.z, head.w};
    const auto byte = [&](int i) { return (sw[i / 4] >> (8 * (i % 4))) & 0xFFu; };
    u32 sc, mn;
    if (j < 4) {
      sc = byte(j) & 63u;
      mn = byte(j + 4) & 63u;
    } else {
      sc = (byte(j + 4) & 0xFu) | ((byte(j - 4) >> 6) << 4);
      mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    }
    r.s = f16_to_f32((u16)(head.x & 0xFFFFu)) * (float)sc;
    r.m = f16_to_f32((u16)(head.x >> 16)) * (float)mn;
    r.j = j;
    r.q = __ldg(reinterpret_cast<const uint2*>(block + CODES + (j / 2) * 32) + c);
    if (TYPE == 13) r.h = __ldg(reinterpret_cast<const uint2*>(block + 16) + c);
  }
  // bytes (b, b + 2) of word w as bf16 values of their codes
  static __device__ __forceinline__ u32 pair(const Raw& r, int w, int b) {
    const u32 word = w == 0 ? r.q.x : r.q.y;
    u32 v = ((word >> (4 * (r.j % 2) + 8 * b)) & 0x000F000Fu) | BF16_MAGIC2;
    if (TYPE == 13) {
      const u32 high = w == 0 ? r.h.x : r.h.y;
      v |= ((high >> (r.j + 8 * b)) & 0x00010001u) << 4;
    }
    return sub_bf16x2(v, BF16_MAGIC2);  // (128 + code) - 128
  }
  static __device__ __forceinline__ void frag(const Raw& r, int j, u32& lo, u32& hi) {
    lo = pair(r, j, 0);
    hi = pair(r, j, 1);
  }
  static __device__ __forceinline__ float scale(const Raw& r) { return r.s; }
  static __device__ __forceinline__ float minimum(const Raw& r) { return r.m; }
  static __device__ __forceinline__ int perm(int j, int i) { return 4 * j + 2 * (i & 1) + (i >> 1); }
};

// ggml q6_k blocks (gguf_blocks_v1): 256 weights in 210 bytes (ql[128] low nibbles, qh[64]
// two high bits each, 16 int8 scales, d), one scale per 16 weights: a group is those 16
// (GW = 16, one mma), a chunk 4 of them, w = d * sc * (q - 32). Within a block, group h is half
// h % 2 of the 32 values of sub-block s = h / 2, whose bytes sit at ql[(s / 4) * 64 + (s % 2)
// * 32 ..] (nibble (s % 4) / 2) and qh[(s / 4) * 32 ..] (bits 2 (s % 4)). Blocks are only
// 2-byte aligned, so the chunk's 4 bytes of each plane are two 16-bit loads.
struct SmallGgufQ6K : PlainRows {
  static constexpr int GW = 16, BYTES = 210;
  static constexpr bool SCALED = true;
  struct Raw {
    u32 codes;  // the chunk's four 6-bit codes, one a byte
    float s;
  };
  static __device__ __forceinline__ u32 two_halves(const u8* p) {
    const u16* h = reinterpret_cast<const u16*>(p);
    return (u32)__ldg(h) | ((u32)__ldg(h + 1) << 16);
  }
  static __device__ __forceinline__ void load(Raw& r, const SmallArgs& a, long long n, int q,
                                              int c) {
    const u8* block = a.obj + (n * a.stride + q / 16) * BYTES;
    const int h = q % 16, sub = h / 2, at = 16 * (h % 2) + 4 * c;  // first value in sub
    const u32 low = two_halves(block + (sub / 4) * 64 + (sub % 2) * 32 + at);
    const u32 high = two_halves(block + 128 + (sub / 4) * 32 + at);
    r.codes = ((low >> (4 * ((sub % 4) / 2))) & 0x0F0F0F0Fu) |
              (((high >> (2 * (sub % 4))) & 0x03030303u) << 4);
    const float d = f16_to_f32(__ldg(reinterpret_cast<const u16*>(block + 208)));
    r.s = d * (float)(signed char)__ldg(block + 192 + h);
  }
  // chunk values (0, 1) and (2, 3) as bf16 pairs of q - 32: (128 + q) - 160, exact
  static __device__ __forceinline__ void frag(const Raw& r, int, u32& lo, u32& hi) {
    const u32 c = r.codes;
    lo = sub_bf16x2((c & 0x3Fu) | ((c & 0x3F00u) << 8) | BF16_MAGIC2, 0x43204320u);
    hi = sub_bf16x2(((c >> 16) & 0x3Fu) | ((c >> 8) & 0x3F0000u) | BF16_MAGIC2, 0x43204320u);
  }
  static __device__ __forceinline__ float scale(const Raw& r) { return r.s; }
  static __device__ __forceinline__ int perm(int, int i) { return i; }
};

