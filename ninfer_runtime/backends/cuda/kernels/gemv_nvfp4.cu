// GEMV over block_scale_k16_m128x4_v1 (NVFP4) objects, read in place.
//
// Layout (ninfer_format/codecs/nvfp4.py): E2M1 codes row-major, two per byte (low nibble
// first), K/2 bytes per row; E4M3FN block scales (one per 16 weights) in the 128x4 swizzled
// plane at off1; float32 weight divisors at off2 (row n uses divisor n / rpd). A 16-byte unit
// is 32 weights = blocks 2u and 2u+1, whose scale bytes are adjacent in the swizzled plane.
// w = e2m1(c) * e4m3(s) / d: the divisor is applied once per row at the end.

struct Nvfp4 {
  static constexpr int KU = 32;
  static constexpr int SCALE_RUN = 2;  // one E4M3 scale per 16 weights
  static constexpr float CODE_SCALE = 1.f, CODE_BIAS = 0.f;
  struct Unit {
    uint4 q;
    float s0, s1;
  };
  static __device__ __forceinline__ void setup() {}
  static __device__ __forceinline__ void load(Unit& w, const GemvArgs& a, long long n, int u) {
    const long long k = a.stride;
    w.q = __ldg(reinterpret_cast<const uint4*>(a.obj + n * (k >> 1)) + u);
    const long long at = a.off1 + nvfp4_scale_offset(n, 2LL * u, k);  // even: (2u) & 3 is 0 or 2
    const u32 pair = __ldg(reinterpret_cast<const u16*>(a.obj + at));
    w.s0 = e4m3_to_f32(pair & 0xFFu);
    w.s1 = e4m3_to_f32(pair >> 8);
  }
  static __device__ __forceinline__ void decode(const Unit& w, int s, float v[8]) {
    const u32 word = unit_word(w.q, s);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = e2m1_to_f32(word >> (4 * j));
  }
  static __device__ __forceinline__ float scale(const Unit& w, int s) { return s < 2 ? w.s0 : w.s1; }
  static __device__ __forceinline__ float finish(float acc, const GemvArgs& a, long long n) {
    const float d = __ldg(reinterpret_cast<const float*>(a.obj + a.off2) + n / a.rpd);
    return acc / d;
  }
};

DEFINE_GEMV(gemv_nvfp4, Nvfp4)
