// GEMV over contiguous_le_v1 bf16 matrices, read in place (K % 8 == 0 for 16-byte rows).

struct Bf16Row {
  static constexpr int KU = 8;
  static constexpr int SCALE_RUN = 1;
  static constexpr float CODE_SCALE = 1.f, CODE_BIAS = 0.f;
  struct Unit {
    uint4 q;
  };
  static __device__ __forceinline__ void setup() {}
  static __device__ __forceinline__ void load(Unit& w, const GemvArgs& a, long long n, int u) {
    w.q = __ldg(reinterpret_cast<const uint4*>(a.obj + n * a.stride * 2) + u);
  }
  static __device__ __forceinline__ void decode(const Unit& w, int, float v[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const u32 word = unit_word(w.q, i);
      v[2 * i] = __uint_as_float(word << 16);
      v[2 * i + 1] = __uint_as_float(word & 0xFFFF0000u);
    }
  }
  static __device__ __forceinline__ float scale(const Unit&, int) { return 1.f; }
  static __device__ __forceinline__ float finish(float acc, const GemvArgs&, long long) {
    return acc;
  }
};

DEFINE_GEMV(gemv_bf16, Bf16Row)
