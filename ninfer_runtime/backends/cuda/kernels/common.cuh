// Scalar decoders shared by every kernel family.
//
// No CUDA headers are included: NVRTC then needs no include path, and every conversion is
// written on bit patterns so the GPU produces exactly the values of the numpy decoders in
// ninfer_format/codecs (the CPU reference). Format codes match ninfer_runtime/backends/cuda/
// formats.py.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FMT_Q4 0
#define FMT_Q5 1
#define FMT_Q6 2
#define FMT_Q8 3
#define FMT_NF4 4
#define FMT_NVFP4 5
#define FMT_FP8 6
#define FMT_BF16 7

// 2^23 as a float: a small integer u in its mantissa is exactly 2^23 + u, so u -> float costs
// one permute and one add instead of a (slower) integer conversion.
#define MAGIC_BITS 0x4B000000u
#define MAGIC_F 8388608.0f

// Byte i of x as 2^23 + byte (one PRMT): [x.byte_i, 0, 0, 0x4B] read as a float.
__device__ __forceinline__ float magic_byte(u32 x, int i) {
  return __uint_as_float(__byte_perm(x, MAGIC_BITS, 0x7540u | (u32)i));
}

// float32 -> bfloat16 bits, round to nearest even, as ninfer_format.numeric.f32_to_bf16: a NaN
// keeps its high payload (gaining the quiet bit if that half alone would read as Inf).
__device__ __forceinline__ u16 f32_to_bf16_rn(float f) {
  const u32 bits = __float_as_uint(f), high = bits >> 16;
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((high & 0x7Fu) == 0 ? high | 0x40u : high);
  return (u16)((bits + 0x7FFFu + (high & 1u)) >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ float bf16_to_f32(u32 h) { return __uint_as_float(h << 16); }

// Two bf16 words packed little-endian in w (element 0 in the low half) -> two floats.
__device__ __forceinline__ void bf16x2(u32 w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xFFFF0000u);
}

// E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; 0x7F/0xFF are NaN.
__device__ __forceinline__ float e4m3_to_f32(u32 b) {
  const u32 e = (b >> 3) & 0xFu, m = b & 7u;
  float v;
  if ((b & 0x7Fu) == 0x7Fu) {
    v = __uint_as_float(0x7FC00000u);
  } else if (e == 0) {
    v = (float)m * 0.001953125f;  // subnormal: m * 2^-9
  } else {
    v = __uint_as_float(((e + 120u) << 23) | (m << 20));
  }
  return __uint_as_float(__float_as_uint(v) | ((b & 0x80u) << 24));
}

// E2M1 nibble: bit 3 sign, then magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
__device__ __forceinline__ float e2m1_to_f32(u32 c) {
  const u32 i = c & 7u, e = i >> 1, m = i & 1u;
  const u32 bits = (i >= 2u) ? (((126u + e) << 23) | (m << 22)) : (i ? (126u << 23) : 0u);
  return __uint_as_float(bits | ((c & 8u) << 28));
}

// Two E4M3FN bytes (low byte first) -> two floats. Hopper and Ada convert in hardware; the
// bit-pattern decoder is the portable path (both are exact: every E4M3FN value is a binary16).
__device__ __forceinline__ void e4m3x2_to_f32(u32 two, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  u32 h2;
  const u16 in = (u16)two;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  lo = f16_to_f32((u16)(h2 & 0xFFFFu));
  hi = f16_to_f32((u16)(h2 >> 16));
#else
  lo = e4m3_to_f32(two & 0xFFu);
  hi = e4m3_to_f32((two >> 8) & 0xFFu);
#endif
}

// The QLoRA NF4 levels (ninfer_format.numeric.NF4_CODEBOOK), bit-exact float32.
__device__ __constant__ float NF4_LEVELS[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// Byte offset of the E4M3FN scale of block (n, g) in the 128x4 swizzled plane of an NVFP4
// object with K columns (ninfer_format.codecs.nvfp4.swizzle_offsets).
__device__ __forceinline__ long long nvfp4_scale_offset(long long n, long long g, long long k) {
  const long long tile = (n >> 7) * (k >> 6) + (g >> 2);
  const long long ri = n & 127;
  return tile * 512 + (ri & 31) * 16 + (ri >> 5) * 4 + (g & 3);
}

// ------------------------------------------------------------ tensor-core helpers (bf16)
// d += a * b, a 16x16 (row-major fragment: rows g, g + 8; columns 2 tig (+1), 2 tig + 8 (+1)),
// b 16x8 (column-major fragment: rows 2 tig (+1), 2 tig + 8 (+1) of column g), bf16 operands
__device__ __forceinline__ void mma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (lo, hi) -> bf16x2, round to nearest even; lo in the low half
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// x0, x1 -> (hi, lo) bf16x2 words with x = hi + lo to ~16 bits
__device__ __forceinline__ void split_pair(float x0, float x1, u32& hi, u32& lo) {
  hi = pack_bf16(x0, x1);
  lo = pack_bf16(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xFFFF0000u));
}

// ------------------------------------------------------------ tensor-core helpers (TF32)
__device__ __forceinline__ u32 tf32_round(float x) {
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x = hi + lo with both TF32: hi keeps the top 10 mantissa bits (x - hi is then exact)
__device__ __forceinline__ void tf32_split(float x, u32& hi, u32& lo) {
  hi = __float_as_uint(x) & 0xFFFFE000u;
  lo = tf32_round(x - __uint_as_float(hi));
}

// d += a * b, a 16x8 (row-major fragment: rows g, g + 8; columns tig, tig + 4), b 8x8
// (column-major fragment: rows tig, tig + 4 of column g), TF32 operands, float32 d (rows g,
// g + 8; columns 2 tig, 2 tig + 1)
__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ------------------------------------------------------------------- cp.async helpers
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// 16 bytes global -> shared, bypassing L1; zero-filled when !ok (nothing is read then)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)),
               "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
