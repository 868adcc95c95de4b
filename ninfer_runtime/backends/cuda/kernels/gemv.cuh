// The decode-path GEMV driver shared by every weight layout: y[m, r] = sum_k x[m, k] W[r, k]
// for M <= 8 activation rows, reading the packed object directly.
//
// Work split: one warp owns R consecutive output rows (a template parameter); its lanes stride over 16-byte "units"
// of each row (a unit is KU consecutive weights). A lane loads the unit of all R rows first
// (R independent 16-byte loads in flight), then walks it 8 weights at a time: the 8 x values
// of every activation row are loaded once and reused for the R weight rows, which divides the
// activation traffic through L1 by R. Accumulation is float32; the warp reduces at the end.
//
// A layout is a policy struct F with:
//   KU                     weights per 16-byte unit (multiple of 8)
//   SCALE_RUN              sub-chunks of 8 weights that share one scale (divides KU / 8)
//   CODE_SCALE, CODE_BIAS  decode's values v stand for weights CODE_SCALE * v + CODE_BIAS
//                          (before the scale): 1 and 0 for exact values; 4- to 6-bit codes
//                          come as 2 + c / 2^(b-1) (one byte permute each, see RowSplitInt),
//                          and the bias is applied once per run through the sum of x (M <= R)
//   Unit                   what a lane holds for one (row, unit)
//   load(w, args, n, u)    fetch unit u of absolute row n
//   decode(w, s, v)        the 8 values of sub-chunk s (no scale applied)
//   scale(w, s)            the scale of sub-chunk s
//   finish(acc, args, n)   the row's final value (row scale, divisor)
//   setup()                block-wide preparation before any warp may return (tables)

struct GemvArgs {
  const u8* obj;
  long long off1;  // layout-specific plane offsets (see each family)
  long long off2;
  int stride;      // groups per row (row_split) or K (the other layouts)
  int rpd;         // rows per divisor (nvfp4)
};

#define GEMV_WARPS 4

// KS > 1 splits K: the KS warps of a group share the same R rows and take every KS-th unit,
// then add their sums through shared memory. For few, long rows (N = 5120, K = 17408) this
// gives KS times more warps to keep loads in flight.
template <class F, int M, int R, int KS>
__device__ __forceinline__ void gemv_driver(const GemvArgs& a, int row0, int rows, int units,
                                            const float* __restrict__ x, int ldx,
                                            float* __restrict__ y, int ldy) {
  static_assert(KS == 1 || KS == GEMV_WARPS, "a block is one K-split group or KS = 1");
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int first = (blockIdx.x * (GEMV_WARPS / KS) + warp / KS) * R;
  const int slice = warp % KS;
  if (first >= rows) return;  // uniform over each group of KS warps
  long long n[R];
#pragma unroll
  for (int r = 0; r < R; ++r) n[r] = (long long)row0 + min(first + r, rows - 1);

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

  // Codes with a bias: the x sums cost 8 adds per activation row and sub-chunk, shared by the
  // R rows; turning each code into its value costs 8 per weight row. Sum x when M <= R.
  constexpr bool CODES = F::CODE_BIAS != 0.f, BIASED = CODES && M <= R;
  static_assert(CODES || F::CODE_SCALE == 1.f, "exact values need no scale");
  static_assert((F::KU / 8) % F::SCALE_RUN == 0, "a unit holds whole scale runs");
  for (int u = lane + 32 * slice; u < units; u += 32 * KS) {
    typename F::Unit w[R];
#pragma unroll
    for (int r = 0; r < R; ++r) F::load(w[r], a, n[r], u);
    const float* xu = x + (long long)u * F::KU;
    float t[R][M], xsum[M];
#pragma unroll
    for (int s = 0; s < F::KU / 8; ++s) {
      const bool run_start = s % F::SCALE_RUN == 0;
      float xs[M][8];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float4 lo = __ldg(reinterpret_cast<const float4*>(xu + (long long)m * ldx + 8 * s));
        const float4 hi =
            __ldg(reinterpret_cast<const float4*>(xu + (long long)m * ldx + 8 * s + 4));
        xs[m][0] = lo.x; xs[m][1] = lo.y; xs[m][2] = lo.z; xs[m][3] = lo.w;
        xs[m][4] = hi.x; xs[m][5] = hi.y; xs[m][6] = hi.z; xs[m][7] = hi.w;
        if (BIASED) {
          float sum = run_start ? 0.f : xsum[m];
#pragma unroll
          for (int j = 0; j < 8; ++j) sum += xs[m][j];
          xsum[m] = sum;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float v[8];
        F::decode(w[r], s, v);
        if (CODES && !BIASED) {
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = fmaf(F::CODE_SCALE, v[j], F::CODE_BIAS);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float dot = run_start ? 0.f : t[r][m];
#pragma unroll
          for (int j = 0; j < 8; ++j) dot = fmaf(v[j], xs[m][j], dot);
          t[r][m] = dot;
        }
      }
      if ((s + 1) % F::SCALE_RUN == 0) {  // the run's sums to weights, times its scale
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float sc = F::scale(w[r], s);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const float run =
                BIASED ? fmaf(F::CODE_SCALE, t[r][m], F::CODE_BIAS * xsum[m]) : t[r][m];
            acc[r][m] = fmaf(sc, run, acc[r][m]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        acc[r][m] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], off);

  if (KS > 1) {
    __shared__ float partial[GEMV_WARPS][R][M];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) partial[warp][r][m] = acc[r][m];
    }
    __syncthreads();  // every warp of the block reached here: groups return together
    if (slice != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < KS; ++k) t += partial[warp + k][r][m];
        acc[r][m] = t;
      }
  }

  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (first + r < rows) {
#pragma unroll
        for (int m = 0; m < M; ++m)
          y[(long long)m * ldy + first + r] = F::finish(acc[r][m], a, n[r]);
      }
    }
  }
}

// Word s (0..3) of a 16-byte unit; s is a compile-time constant after unrolling.
__device__ __forceinline__ u32 unit_word(const uint4& q, int s) {
  return s == 0 ? q.x : s == 1 ? q.y : s == 2 ? q.z : q.w;
}

// One template kernel per layout: M activation rows, R output rows per warp, K split KS
// ways; launched with GEMV_WARPS * 32 threads, so a block covers GEMV_WARPS / KS * R rows.
#define DEFINE_GEMV(NAME, POLICY)                                                           \
  template <int M, int R, int KS>                                                           \
  __global__ void __launch_bounds__(GEMV_WARPS * 32)                                        \
      NAME(const u8* __restrict__ obj, long long off1, long long off2, int stride, int rpd, \
           int row0, int rows, int units, const float* __restrict__ x, int ldx,             \
           float* __restrict__ y, int ldy) {                                                \
    POLICY::setup();                                                                        \
    GemvArgs a{obj, off1, off2, stride, rpd};                                               \
    gemv_driver<POLICY, M, R, KS>(a, row0, rows, units, x, ldx, y, ldy);                    \
  }
