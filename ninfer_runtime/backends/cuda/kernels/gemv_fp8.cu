// GEMV over row_scale_v1 (FP8 E4M3FN, one BF16 multiplier per row) objects, read in place.
//
// Layout (ninfer_format/codecs/fp8_row.py): codes row-major, K bytes per row, then BF16 row
// scales at off1. The vector path needs K % 16 == 0 so every row starts on a 16-byte
// boundary; the launcher sends other shapes through dequantize + matmul.

struct Fp8Row {
  static constexpr int KU = 16;
  static constexpr int SCALE_RUN = 2;  // scale 1: the row scale comes in finish
  static constexpr float CODE_SCALE = 1.f, CODE_BIAS = 0.f;
  struct Unit {
    uint4 q;
  };
  static __device__ __forceinline__ void setup() {}
  static __device__ __forceinline__ void load(Unit& w, const GemvArgs& a, long long n, int u) {
    w.q = __ldg(reinterpret_cast<const uint4*>(a.obj + n * a.stride) + u);
  }
  static __device__ __forceinline__ void decode(const Unit& w, int s, float v[8]) {
    const u32 lo = unit_word(w.q, 2 * s), hi = unit_word(w.q, 2 * s + 1);
    e4m3x2_to_f32(lo & 0xFFFFu, v[0], v[1]);
    e4m3x2_to_f32(lo >> 16, v[2], v[3]);
    e4m3x2_to_f32(hi & 0xFFFFu, v[4], v[5]);
    e4m3x2_to_f32(hi >> 16, v[6], v[7]);
  }
  static __device__ __forceinline__ float scale(const Unit&, int) { return 1.f; }
  static __device__ __forceinline__ float finish(float acc, const GemvArgs& a, long long n) {
    return acc * bf16_to_f32(__ldg(reinterpret_cast<const u16*>(a.obj + a.off1) + n));
  }
};

DEFINE_GEMV(gemv_fp8, Fp8Row)
