// What a layout policy of the small-M tensor-core product (gemm_small.cu) is given, and what
// it provides. Written to compile for the host too (with the few CUDA names it uses declared
// first), so that the CPU tests can check a policy's fragments against the numpy decoder.
//
// A policy F has:
//   GW               weights per row per group (one scale each), a multiple of 16
//   Raw              what a thread loads for one (row, group): its chunk of GW / 4 weights
//   SCALED           whether groups carry a scale
//   MINS             whether groups carry a min as well (w = scale * code - min)
//   load(raw, a, n, q, c)           chunk c of group q of absolute row n
//   frag(raw, j, lo, hi)            the two bf16x2 words of mma j: slots (2c, 2c+1), (2c+8, 2c+9)
//   scale(raw), minimum(raw)        the group scale and min
//   perm(j, i)                      chunk weight of slot i (0..3) of mma j
//   finish(acc, a, n)               row n's result from its sum

struct SmallArgs {
  const u8* obj;
  long long off1;  // row_split: high-bit plane; nvfp4: block scales
  long long off2;  // row_split: group scales; nvfp4: divisors
  int stride;      // row_split: groups per row; nvfp4, bf16: K; gguf: blocks per row
  int rpd;         // nvfp4: rows per divisor
};

// The result of a row as accumulated (every layout but NVFP4, whose rows end with a divisor),
// and groups without a min (MINS layouts take the min times the group's sum of x apart).
struct PlainRows {
  static constexpr bool MINS = false;
  static __device__ __forceinline__ float finish(float acc, const SmallArgs&, long long) {
    return acc;
  }
  template <class Raw>
  static __device__ __forceinline__ float minimum(const Raw&) {
    return 0.f;
  }
};

// a - b on both bf16 halves, rounded to nearest (exact for the small integers it is given)
__device__ __forceinline__ u32 sub_bf16x2(u32 a, u32 b) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  u32 r;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  u32 r = 0;
  for (int half = 0; half < 2; ++half) {
    const u32 x = ((a >> (16 * half)) & 0xFFFFu) << 16, y = ((b >> (16 * half)) & 0xFFFFu) << 16;
    float fx, fy;
    __builtin_memcpy(&fx, &x, 4);
    __builtin_memcpy(&fy, &y, 4);
    const float d = fx - fy;
    u32 bits;
    __builtin_memcpy(&bits, &d, 4);
    r |= ((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) << (16 * half);
  }
  return r;
#endif
}

// The offset-binary magic of the bf16 fragments: 0x4300 | u is the bf16 128 + u (u < 128).
#define BF16_MAGIC2 0x43004300u
