// Dequantize selected rows of a packed object: out[i, k] = W[rows[i], k], as float32
// (dequant_rows) or as bfloat16 bit patterns (dequant_rows_bf16).
//
// Used where a GEMV does not apply: prefill (M > 8: dequantize a slab of rows into a reusable
// scratch buffer, then cuBLAS), embedding lookups, and small parameters the model reads as
// arrays. Each thread computes one element exactly as the numpy decoder does (same float32
// operations in the same order), so the float32 result is bit-identical to ninfer_format's
// decode; the bf16 variant rounds that value to nearest even (exact for bf16 weights, a bf16
// rounding of code x scale products otherwise). Arguments follow the GEMV kernels: off1/off2
// are the layout's plane offsets, stride is gpr (row_split) or K.

__device__ __forceinline__ void store_element(float* out, long long e, float v) { out[e] = v; }
__device__ __forceinline__ void store_element(u16* out, long long e, float v) {
  out[e] = f32_to_bf16_rn(v);
}

// A row_split element's value from its code (low bits | high bits << 4, q8: the byte) and its
// group's scale.
template <int FMT>
__device__ __forceinline__ float row_split_value(u32 code, float s) {
  if (FMT == FMT_Q8) return (float)(signed char)code * s;
  if (FMT == FMT_NF4) return NF4_LEVELS[code] * s;
  constexpr int half = FMT == FMT_Q4 ? 8 : FMT == FMT_Q5 ? 16 : 32;
  return (float)((int)(code ^ (u32)half) - half) * s;
}

template <int FMT>
__device__ __forceinline__ float element(const u8* __restrict__ obj, long long off1, long long off2,
                                         long long stride, int rpd, long long n, long long k) {
  if (FMT == FMT_Q4 || FMT == FMT_Q5 || FMT == FMT_Q6 || FMT == FMT_Q8 || FMT == FMT_NF4) {
    const int g_size = FMT == FMT_Q8 ? 32 : 64;
    const long long g = k / g_size, i = k % g_size, group = n * stride + g;
    const u8* base = obj + group * 32;
    const float s = f16_to_f32(reinterpret_cast<const u16*>(obj + off2)[group]);
    if (FMT == FMT_Q8) return row_split_value<FMT>(base[i], s);
    u32 c = (base[i >> 1] >> (4 * (i & 1))) & 0xFu;
    if (FMT == FMT_Q5) c |= ((obj[off1 + group * 8 + (i >> 3)] >> (i & 7)) & 1u) << 4;
    if (FMT == FMT_Q6) c |= ((obj[off1 + group * 16 + (i >> 2)] >> (2 * (i & 3))) & 3u) << 4;
    return row_split_value<FMT>(c, s);
  } else if (FMT == FMT_NVFP4) {
    const u32 byte = obj[n * (stride >> 1) + (k >> 1)];
    const float scale = e4m3_to_f32(obj[off1 + nvfp4_scale_offset(n, k >> 4, stride)]);
    const float d = reinterpret_cast<const float*>(obj + off2)[n / rpd];
    return (e2m1_to_f32(byte >> (4 * (k & 1))) * scale) / d;
  } else if (FMT == FMT_FP8) {
    const float s = bf16_to_f32(reinterpret_cast<const u16*>(obj + off1)[n]);
    return e4m3_to_f32(obj[n * stride + k]) * s;
  } else {  // FMT_BF16
    return bf16_to_f32(reinterpret_cast<const u16*>(obj)[n * stride + k]);
  }
}

// Elements c .. c + 7 of row n of a row_split object (c a multiple of 8, so one group holds
// them): element<FMT>'s values, with the group's scale, code bytes and high bits loaded once
// instead of once an element.
template <int FMT>
__device__ __forceinline__ void row_split_eight(const u8* __restrict__ obj, long long off1,
                                                long long off2, long long stride, long long n,
                                                unsigned c, float (&v)[8]) {
  constexpr int G = FMT == FMT_Q8 ? 32 : 64;
  const long long group = n * stride + c / G;
  const unsigned i0 = c % G;
  const float s = f16_to_f32(reinterpret_cast<const u16*>(obj + off2)[group]);
  const u8* base = obj + group * 32;
  if (FMT == FMT_Q8) {
    const uint2 b = *reinterpret_cast<const uint2*>(base + i0);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      v[j] = row_split_value<FMT>(((j < 4 ? b.x : b.y) >> (8 * (j & 3))) & 0xFFu, s);
    return;
  }
  const u32 q = *reinterpret_cast<const u32*>(base + i0 / 2);  // element i0 + j: nibble j
  u32 high = 0;  // element i0 + j's high bits at bit j (q5) or 2j (q6)
  if (FMT == FMT_Q5) high = obj[off1 + group * 8 + i0 / 8];
  if (FMT == FMT_Q6) {
    const u8* h = obj + off1 + group * 16 + i0 / 4;
    high = (u32)h[0] | ((u32)h[1] << 8);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    u32 code = (q >> (4 * j)) & 0xFu;
    if (FMT == FMT_Q5) code |= ((high >> j) & 1u) << 4;
    if (FMT == FMT_Q6) code |= ((high >> (2 * j)) & 3u) << 4;
    v[j] = row_split_value<FMT>(code, s);
  }
}

template <int FMT, typename T>
__device__ __forceinline__ void dequant_rows_body(const u8* __restrict__ obj, long long off1,
                                                  long long off2, int stride, int rpd,
                                                  const int* __restrict__ rows, int nrows, int k,
                                                  T* __restrict__ out) {
  const long long total = (long long)nrows * k;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long i = e / k, col = e % k;
    store_element(out, e, element<FMT>(obj, off1, off2, stride, rpd, rows[i], col));
  }
}

template <int FMT>
__global__ void dequant_rows(const u8* __restrict__ obj, long long off1, long long off2,
                             int stride, int rpd, const int* __restrict__ rows, int nrows, int k,
                             float* __restrict__ out) {
  dequant_rows_body<FMT>(obj, off1, off2, stride, rpd, rows, nrows, k, out);
}

// The same rows as bfloat16 bits (the prefill GEMM's weight operand, C-contiguous [nrows, k]).
template <int FMT>
__global__ void dequant_rows_bf16(const u8* __restrict__ obj, long long off1, long long off2,
                                  int stride, int rpd, const int* __restrict__ rows, int nrows,
                                  int k, u16* __restrict__ out) {
  dequant_rows_body<FMT>(obj, off1, off2, stride, rpd, rows, nrows, k, out);
}

// dequant_rows_bf16 eight elements a thread, for k a multiple of 8 and nrows * k / 8 < 2^32:
// the same values, with one division per eight elements and one 16-byte store (row_split:
// one group's scale and code words loaded once for the eight).
template <int FMT>
__global__ void dequant_rows_bf16x8(const u8* __restrict__ obj, long long off1, long long off2,
                                    int stride, int rpd, const int* __restrict__ rows, int nrows,
                                    int k, u16* __restrict__ out) {
  const unsigned k8 = (unsigned)k >> 3, total = (unsigned)nrows * k8;
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
    const unsigned i = e / k8, c = (e - i * k8) << 3;
    const long long n = rows[i];
    u32 w[4];
    if constexpr (FMT == FMT_Q4 || FMT == FMT_Q5 || FMT == FMT_Q6 || FMT == FMT_Q8 ||
                  FMT == FMT_NF4) {
      float v[8];
      row_split_eight<FMT>(obj, off1, off2, stride, n, c, v);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        w[j] = (u32)f32_to_bf16_rn(v[2 * j]) | ((u32)f32_to_bf16_rn(v[2 * j + 1]) << 16);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const u32 lo = f32_to_bf16_rn(element<FMT>(obj, off1, off2, stride, rpd, n, c + 2 * j));
        const u32 hi =
            f32_to_bf16_rn(element<FMT>(obj, off1, off2, stride, rpd, n, c + 2 * j + 1));
        w[j] = lo | (hi << 16);
      }
    }
    *reinterpret_cast<uint4*>(out + (long long)i * k + c) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// x (float32) -> bfloat16 bits, element for element (the prefill GEMM's activation operand).
__global__ void f32_to_bf16(const float* __restrict__ x, long long n, u16* __restrict__ out) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
    out[e] = f32_to_bf16_rn(x[e]);
  }
}

// x [rows, k] -> out [rows, 3k], a 3xTF32 product's operand as one matrix: x = hi + lo with hi
// rounded to TF32 (cvt.rna: nearest, ties away from zero) and lo = x - hi (exact: hi shares x's
// exponent or the next one up); each row's three k-wide slots hold hi, except slot lo_slot,
// which holds lo. [wl | wh | wh] against [xh | xl | xh] sums wl·xh + wh·xl + wh·xh over 3k.
__global__ void f32_split_tf32(const float* __restrict__ x, long long rows, int k, int lo_slot,
                               float* __restrict__ out) {
  const long long n = rows * k;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
    const long long r = e / k;
    const float v = x[e];
    u32 h;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(v));
    const float hi = __uint_as_float(h), lo = v - hi;
    float* o = out + e + 2 * r * k;  // row r, column e - r k of slot 0
#pragma unroll
    for (int slot = 0; slot < 3; ++slot) o[slot * k] = slot == lo_slot ? lo : hi;
  }
}

// The same, four elements a thread (x and out 16- and 8-byte aligned, n4 = n / 4 groups).
__global__ void f32_to_bf16x4(const float4* __restrict__ x, long long n4, uint2* __restrict__ out) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n4;
       e += (long long)gridDim.x * blockDim.x) {
    const float4 v = x[e];
    out[e] = make_uint2(f32_to_bf16_rn(v.x) | ((u32)f32_to_bf16_rn(v.y) << 16),
                        f32_to_bf16_rn(v.z) | ((u32)f32_to_bf16_rn(v.w) << 16));
  }
}
