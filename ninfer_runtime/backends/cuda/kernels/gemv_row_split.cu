// GEMV over row_split_k128_v1 objects (q4 / q5 / q6 / q8 / nf4), read in place.
//
// Layout (ninfer_format/codecs/row_split.py): row n's base plane is gpr groups of 32 bytes
// (4-bit formats: 64 lanes, byte i holds lanes 2i low / 2i+1 high; q8: 32 int8 lanes), then
// the high-bit plane at off1 (q5: 8 bytes per group, bit i = lane i's bit 4; q6: 16 bytes,
// bits 2i..2i+1 = lane i's bits 4-5), then binary16 group scales at off2. A 16-byte unit is
// half a group, so one scale covers a whole unit. Rows are padded to a multiple of 128
// columns with zero-valued codes; the launcher pads x with zeros to match (ldx = K_pad).

// 4- to 6-bit codes c (offset binary: c = q + 2^(b-1)) become floats by one byte permute. With
// c at the top of a byte's low 7 bits and 0x40 as the exponent byte, the float is
// v = 2 + c / 2^(b-1), exact, so q = 2^(b-1) (v - 3) and the driver applies the bias once per
// group through the sum of x (or to each value when x has more rows than the warp has weight
// rows, see gemv.cuh). Keeping c at the top of the mantissa keeps each product's
// rounding error within 2^-(20-b) of the weight's own. The loop of gemv_q4<1, 8, 1> runs 2.98
// SASS instructions a weight this way, against 3.91 converting each code to its value
// (permute, subtract); q5 3.83 against 7.9 and q6 5.08 against 7.7 (bit by bit). q8 bytes
// decode to values (a byte has no room for the exponent's bit).
__device__ __forceinline__ float code_byte(u32 bytes, int i) {
  return __uint_as_float(__byte_perm(bytes, 0x40000000u, 0x7054u | ((u32)i << 8)));
}

// The 2-bit fields at bits 4i, 4i + 1 of h (i = 0..3) moved to bits 8i + 5, 8i + 6
__device__ __forceinline__ u32 spread_pairs(u32 h) {
  h &= 0x3333u;
  h = (h | (h << 8)) & 0x00330033u;        // fields at 0, 4, 16, 20
  return ((h << 5) | (h << 9)) & 0x60606060u;  // 0 -> 5, 4 -> 13, 16 -> 21, 20 -> 29
}

// (a & mask) ^ flip as one LOP3 (the compiler splits it when both are immediates)
__device__ __forceinline__ u32 and_xor(u32 a, u32 mask, u32 flip) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "r"(mask), "r"(flip));
  return d;
}

template <int BITS>
struct RowSplitInt {
  static constexpr int KU = BITS == 8 ? 16 : 32;
  static constexpr int SCALE_RUN = KU / 8;  // a unit is half a group: one scale
  static constexpr bool CODES = BITS < 8;
  static constexpr float CODE_SCALE = CODES ? 1 << (BITS - 1) : 1.f;
  static constexpr float CODE_BIAS = CODES ? -3.f * (1 << (BITS - 1)) : 0.f;
  struct Unit {
    uint4 q;
    u32 h0, h1;  // high bits, their sign bits flipped (q5: h0; q6: h0 | h1 << 32)
    float s;
  };
  static __device__ __forceinline__ void setup() {}
  static __device__ __forceinline__ void load(Unit& w, const GemvArgs& a, long long n, int u) {
    const long long group = n * a.stride + (u >> 1);
    w.q = __ldg(reinterpret_cast<const uint4*>(a.obj + n * a.stride * 32) + u);
    w.s = f16_to_f32(__ldg(reinterpret_cast<const u16*>(a.obj + a.off2) + group));
    if (BITS == 5) {
      w.h0 = ~__ldg(reinterpret_cast<const u32*>(a.obj + a.off1 + group * 8) + (u & 1));
    } else if (BITS == 6) {
      const uint2 h = __ldg(reinterpret_cast<const uint2*>(a.obj + a.off1 + group * 16) + (u & 1));
      w.h0 = h.x ^ 0xAAAAAAAAu;  // bit 5 of each weight: the sign bit
      w.h1 = h.y ^ 0xAAAAAAAAu;
    }
  }
  static __device__ __forceinline__ void decode(const Unit& w, int s, float v[8]) {
    if (BITS == 8) {  // offset-binary bytes straight into the magic float: 2 ops a weight
      const u32 lo = unit_word(w.q, 2 * s) ^ 0x80808080u;
      const u32 hi = unit_word(w.q, 2 * s + 1) ^ 0x80808080u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = magic_byte(lo, j) - (MAGIC_F + 128.f);
        v[4 + j] = magic_byte(hi, j) - (MAGIC_F + 128.f);
      }
      return;
    }
    // byte i of even / odd: the code of weight 8s + 2i / 8s + 2i + 1, at bits 7-b..6
    u32 even, odd;
    const u32 word = unit_word(w.q, s);
    if (BITS == 4) {  // nibbles to bits 3-6, their sign bit flipped: to offset binary
      even = and_xor(word << 3, 0x78787878u, 0x40404040u);
      odd = and_xor(word >> 1, 0x78787878u, 0x40404040u);
    } else if (BITS == 5) {  // byte s of h0: bit 4 of weights 8s..8s+7, to bit 6 of each byte
      const u32 h = w.h0 >> (8 * s);
      even = ((word << 2) & 0x3C3C3C3Cu) | (((h & 0x55u) * 0x01041040u) & 0x40404040u);
      odd = ((word >> 2) & 0x3C3C3C3Cu) | (((h & 0xAAu) * 0x00820820u) & 0x40404040u);
    } else {  // q6: 16 bits of h0 / h1, two per weight (bits 4, 5), to bits 5-6 of each byte
      const u32 h = (s < 2 ? w.h0 : w.h1) >> (16 * (s & 1));
      even = ((word << 1) & 0x1E1E1E1Eu) | spread_pairs(h);  // pairs at 4i -> 8i + 5
      odd = ((word >> 3) & 0x1E1E1E1Eu) | spread_pairs(h >> 2);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = code_byte(even, i);
      v[2 * i + 1] = code_byte(odd, i);
    }
  }
  static __device__ __forceinline__ float scale(const Unit& w, int) { return w.s; }
  static __device__ __forceinline__ float finish(float acc, const GemvArgs&, long long) {
    return acc;
  }
};

// NF4 levels live in shared memory for the GEMV: lanes index them with different nibbles,
// which the constant cache would serialize; 16 words sit in 16 distinct banks.
__shared__ float NF4_SHARED[16];

struct RowSplitNf4 {
  static constexpr int KU = 32;
  static constexpr int SCALE_RUN = 4;
  static constexpr float CODE_SCALE = 1.f, CODE_BIAS = 0.f;
  struct Unit {
    uint4 q;
    float s;
  };
  static __device__ __forceinline__ void setup() {
    if (threadIdx.x < 16) NF4_SHARED[threadIdx.x] = NF4_LEVELS[threadIdx.x];
    __syncthreads();
  }
  static __device__ __forceinline__ void load(Unit& w, const GemvArgs& a, long long n, int u) {
    const long long group = n * a.stride + (u >> 1);
    w.q = __ldg(reinterpret_cast<const uint4*>(a.obj + n * a.stride * 32) + u);
    w.s = f16_to_f32(__ldg(reinterpret_cast<const u16*>(a.obj + a.off2) + group));
  }
  static __device__ __forceinline__ void decode(const Unit& w, int s, float v[8]) {
    const u32 word = unit_word(w.q, s);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = NF4_SHARED[(word >> (4 * j)) & 0xFu];
  }
  static __device__ __forceinline__ float scale(const Unit& w, int) { return w.s; }
  static __device__ __forceinline__ float finish(float acc, const GemvArgs&, long long) {
    return acc;
  }
};

DEFINE_GEMV(gemv_q4, RowSplitInt<4>)
DEFINE_GEMV(gemv_q5, RowSplitInt<5>)
DEFINE_GEMV(gemv_q6, RowSplitInt<6>)
DEFINE_GEMV(gemv_q8, RowSplitInt<8>)
DEFINE_GEMV(gemv_nf4, RowSplitNf4)
