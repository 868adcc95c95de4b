// The per-token glue of a decoder layer, one kernel each: RMSNorm over the last axis (alone,
// fused with the residual add before it, or gated by silu as Gated DeltaNet's output norm) and
// partial NeoX RoPE. CuPy would spend several launches on each (reduce, sqrt, divide,
// multiply ...), which inside a decode graph costs more than the work itself.
//
// Rows of up to GLUE_SHORT_ROW elements (the per-head norms: 128-256) take one warp each, eight
// a block: a block for a 128-element row idled half its threads and paid a block barrier. Longer
// rows (the hidden state) take a block of GLUE_LONG_THREADS each, reading four floats at a time
// where the row allows: at decode there are only a few rows, so a row's time is the number of
// dependent memory round trips its threads make, not bandwidth. The launcher picks the kernel
// by the row length alone, so rms_norm and add_rms_norm sum a row's squares in the same order
// whatever the number of rows.

#define GLUE_THREADS 256
#define GLUE_WARPS (GLUE_THREADS / 32)
#define GLUE_SHORT_ROW 1024
#define GLUE_LONG_THREADS 1024

// 1 / sqrt(mean(x^2) + eps) of a row from each thread's partial sum of squares.
__device__ __forceinline__ float block_inv_rms(float sum, int d, float eps) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
  __shared__ float warp_sums[GLUE_LONG_THREADS / 32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < GLUE_LONG_THREADS / 32; ++i) total += warp_sums[i];
  return 1.f / sqrtf(total / (float)d + eps);
}

// The same from each lane's partial sum, when one warp holds the row.
__device__ __forceinline__ float warp_inv_rms(float sum, int d, float eps) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
  return 1.f / sqrtf(sum / (float)d + eps);
}

// silu(a) in the tanh form of the reference (ninfer_runtime/functional.py), which never overflows.
__device__ __forceinline__ float glue_silu(float a) { return a * (0.5f * (1.f + tanhf(0.5f * a))); }

// Whether float4 accesses may start at p: every row is then aligned too when d % 4 == 0 (a
// weight may be a view into a larger allocation, so the bases are checked, not assumed).
__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// sum plus v's squares, added in the order x, y, z, w.
__device__ __forceinline__ float sum_squares4(float4 v, float sum) {
  return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, sum))));
}

__device__ __forceinline__ float4 norm4(float4 v, float4 w, float inv, float offset) {
  return make_float4((v.x * inv) * (w.x + offset), (v.y * inv) * (w.y + offset),
                     (v.z * inv) * (w.z + offset), (v.w * inv) * (w.w + offset));
}

// A row's y = v * inv * (w + offset), d4 float4s of it, v read from v4 (a block's threads).
__device__ __forceinline__ void normed_row4(const float4* v4, const float* w, float* y, int d4,
                                            float inv, float offset) {
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4* y4 = reinterpret_cast<float4*>(y);
  for (int i = threadIdx.x; i < d4; i += GLUE_LONG_THREADS)
    y4[i] = norm4(v4[i], w4[i], inv, offset);
}

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * (w + offset); one block per row, float4
// accesses where d is a multiple of 4 and the bases are aligned.
extern "C" __global__ void __launch_bounds__(GLUE_LONG_THREADS)
    rms_norm_rows(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                  int d, float eps, float offset) {
  const float* xr = x + (long long)blockIdx.x * d;
  float* yr = y + (long long)blockIdx.x * d;
  float sum = 0.f;
  if ((d & 3) == 0 && aligned16(x) && aligned16(w) && aligned16(y)) {
    const int d4 = d >> 2;
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int i = threadIdx.x; i < d4; i += GLUE_LONG_THREADS) sum = sum_squares4(x4[i], sum);
    normed_row4(x4, w, yr, d4, block_inv_rms(sum, d, eps), offset);
    return;
  }
  for (int i = threadIdx.x; i < d; i += GLUE_LONG_THREADS) sum = fmaf(xr[i], xr[i], sum);
  const float inv = block_inv_rms(sum, d, eps);
  for (int i = threadIdx.x; i < d; i += GLUE_LONG_THREADS) yr[i] = (xr[i] * inv) * (w[i] + offset);
}

// s[r, :] = h[r, :] + delta[r, :] and y[r, :] = rms_norm(s[r, :]); one block per row, vectors
// as rms_norm_rows. The second pass reads back the sums this same thread wrote, so h and delta
// are read once.
extern "C" __global__ void __launch_bounds__(GLUE_LONG_THREADS)
    add_rms_norm_rows(const float* __restrict__ h, const float* __restrict__ delta,
                      const float* __restrict__ w, float* __restrict__ s, float* __restrict__ y,
                      int d, float eps, float offset) {
  const long long row = (long long)blockIdx.x * d;
  float* sr = s + row;
  float* yr = y + row;
  float sum = 0.f;
  if ((d & 3) == 0 && aligned16(h) && aligned16(delta) && aligned16(w) && aligned16(s) &&
      aligned16(y)) {
    const int d4 = d >> 2;
    const float4* h4 = reinterpret_cast<const float4*>(h + row);
    const float4* delta4 = reinterpret_cast<const float4*>(delta + row);
    float4* s4 = reinterpret_cast<float4*>(sr);
    for (int i = threadIdx.x; i < d4; i += GLUE_LONG_THREADS) {
      const float4 v = add4(h4[i], delta4[i]);
      s4[i] = v;
      sum = sum_squares4(v, sum);
    }
    normed_row4(s4, w, yr, d4, block_inv_rms(sum, d, eps), offset);
    return;
  }
  for (int i = threadIdx.x; i < d; i += GLUE_LONG_THREADS) {
    const float v = h[row + i] + delta[row + i];
    sr[i] = v;
    sum = fmaf(v, v, sum);
  }
  const float inv = block_inv_rms(sum, d, eps);
  for (int i = threadIdx.x; i < d; i += GLUE_LONG_THREADS) yr[i] = (sr[i] * inv) * (w[i] + offset);
}

// rms_norm_rows for rows of d <= GLUE_SHORT_ROW: one warp a row, GLUE_WARPS rows a block.
extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
    rms_norm_short_rows(const float* __restrict__ x, const float* __restrict__ w,
                        float* __restrict__ y, int rows, int d, float eps, float offset) {
  const int r = blockIdx.x * GLUE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* xr = x + (long long)r * d;
  float* yr = y + (long long)r * d;
  float sum = 0.f;
  for (int i = lane; i < d; i += 32) sum = fmaf(xr[i], xr[i], sum);
  const float inv = warp_inv_rms(sum, d, eps);
  for (int i = lane; i < d; i += 32) yr[i] = (xr[i] * inv) * (w[i] + offset);
}

// add_rms_norm_rows for rows of d <= GLUE_SHORT_ROW, one warp a row (as rms_norm_short_rows).
extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
    add_rms_norm_short_rows(const float* __restrict__ h, const float* __restrict__ delta,
                            const float* __restrict__ w, float* __restrict__ s,
                            float* __restrict__ y, int rows, int d, float eps, float offset) {
  const int r = blockIdx.x * GLUE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= rows) return;
  const long long row = (long long)r * d;
  float* sr = s + row;
  float* yr = y + row;
  float sum = 0.f;
  for (int i = lane; i < d; i += 32) {
    const float v = h[row + i] + delta[row + i];
    sr[i] = v;
    sum = fmaf(v, v, sum);
  }
  const float inv = warp_inv_rms(sum, d, eps);
  for (int i = lane; i < d; i += 32) yr[i] = (sr[i] * inv) * (w[i] + offset);
}

// Gated DeltaNet's output norm: y[t, h, :] = silu(gate[t, h, :]) * rms_norm(x[t, h, :]) * w
// (plain weight), one warp a (token, head) row. x, y [T, heads, d] contiguous; gate's token
// rows are gate_stride floats apart (a column slice of the layer's projections), its heads d.
extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
    gated_rms_norm_rows(const float* __restrict__ x, const float* __restrict__ gate,
                        long long gate_stride, int heads, const float* __restrict__ w,
                        float* __restrict__ y, int rows, int d, float eps) {
  const int r = blockIdx.x * GLUE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* xr = x + (long long)r * d;
  const float* gr = gate + (long long)(r / heads) * gate_stride + (long long)(r % heads) * d;
  float* yr = y + (long long)r * d;
  float sum = 0.f;
  for (int i = lane; i < d; i += 32) sum = fmaf(xr[i], xr[i], sum);
  const float inv = warp_inv_rms(sum, d, eps);
  for (int i = lane; i < d; i += 32) yr[i] = glue_silu(gr[i]) * ((xr[i] * inv) * w[i]);
}

// x, y [rows, heads, d]; cos, sin [rows, rd]: the first rd dims of each head rotate in pairs
// (i, i + rd/2), the rest pass through.
extern "C" __global__ void rope_rows(const float* __restrict__ x, const float* __restrict__ cos_t,
                                     const float* __restrict__ sin_t, float* __restrict__ y,
                                     int heads, int d, int rd, long long total) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int j = (int)(i % d);
  const long long row = i / ((long long)heads * d);
  if (j >= rd) {
    y[i] = x[i];
    return;
  }
  const int half = rd / 2;
  const float partner = j < half ? -x[i + half] : x[i - half];
  y[i] = x[i] * cos_t[row * rd + j] + partner * sin_t[row * rd + j];
}

// h[r, i] = bf16(silu(gu[r, i]) * gu[r, inter + i]) for gu [rows, 2 inter] (gate | up): the gated
// MLP's product written straight as the bf16 operand of the down projection's prefill GEMM (the
// same values as silu_mul followed by f32_to_bf16). Four elements a thread where inter % 4 == 0.
extern "C" __global__ void silu_mul_bf16_rows(const float* __restrict__ gu, long long rows,
                                              int inter, u16* __restrict__ h) {
  const int quads = inter % 4 == 0 ? inter / 4 : 0;
  const long long n = quads ? rows * quads : rows * inter;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
    if (quads) {
      const long long r = e / quads;
      const float4 g = reinterpret_cast<const float4*>(gu + r * 2 * inter)[e - r * quads];
      const float4 u = reinterpret_cast<const float4*>(gu + r * 2 * inter + inter)[e - r * quads];
      reinterpret_cast<uint2*>(h)[e] =
          make_uint2(f32_to_bf16_rn(glue_silu(g.x) * u.x) |
                         ((u32)f32_to_bf16_rn(glue_silu(g.y) * u.y) << 16),
                     f32_to_bf16_rn(glue_silu(g.z) * u.z) |
                         ((u32)f32_to_bf16_rn(glue_silu(g.w) * u.w) << 16));
    } else {
      const long long r = e / inter;
      const float* row = gu + r * 2 * inter + (e - r * inter);
      h[e] = f32_to_bf16_rn(glue_silu(row[0]) * row[inter]);
    }
  }
}

// A hyper-connection's mixing matrices, one thread a matrix: softmax over each row of an n x n
// block of logits, eps added, then Sinkhorn's normalisation: the columns, then `iterations - 1`
// rounds of the rows and the columns, each sum offset by eps. CuPy spends three launches on
// each of those normalisations (39 for GLM5Next's 20 iterations), for 16 numbers a token.
#define GLUE_SINKHORN_MAX 8
__device__ __forceinline__ void sinkhorn_pass(float* c, int n, bool rows, float eps) {
  for (int a = 0; a < n; ++a) {
    float sum = 0.f;
    for (int b = 0; b < n; ++b) sum += rows ? c[a * n + b] : c[b * n + a];
    const float total = sum + eps;
    for (int b = 0; b < n; ++b) {
      float& v = rows ? c[a * n + b] : c[b * n + a];
      v = v / total;
    }
  }
}

extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
    sinkhorn_rows(const float* __restrict__ logits, float* __restrict__ comb, int count, int n,
                  int iterations, float eps) {
  const int m = blockIdx.x * GLUE_THREADS + threadIdx.x;
  if (m >= count) return;
  float c[GLUE_SINKHORN_MAX * GLUE_SINKHORN_MAX];
  const float* in = logits + (long long)m * n * n;
  for (int i = 0; i < n; ++i) {
    float top = in[i * n];
    for (int j = 1; j < n; ++j) top = fmaxf(top, in[i * n + j]);
    float sum = 0.f;
    for (int j = 0; j < n; ++j) {
      c[i * n + j] = expf(in[i * n + j] - top);
      sum += c[i * n + j];
    }
    for (int j = 0; j < n; ++j) c[i * n + j] = c[i * n + j] / sum + eps;
  }
  for (int round = 0; round < iterations; ++round) {
    if (round > 0) sinkhorn_pass(c, n, true, eps);
    sinkhorn_pass(c, n, false, eps);
  }
  float* out = comb + (long long)m * n * n;
  for (int i = 0; i < n * n; ++i) out[i] = c[i];
}

// Many small copies in one launch: dst[i][0 .. size[i]) = src[i][0 .. size[i]) for range i =
// blockIdx.y (addresses as 64-bit integers; ranges never overlap). A snapshot of a sequence's
// slot states is hundreds of page-sized runs, one cudaMemcpy launch each otherwise. `wide`:
// the host found every address and size a multiple of 16, so whole int4 words move.
extern "C" __global__ void __launch_bounds__(GLUE_THREADS)
    copy_ranges(const long long* __restrict__ dst, const long long* __restrict__ src,
                const long long* __restrict__ size, int wide) {
  const int i = blockIdx.y;
  const long long n = size[i];
  const long long first = (long long)blockIdx.x * GLUE_THREADS + threadIdx.x;
  const long long step = (long long)gridDim.x * GLUE_THREADS;
  if (wide) {
    int4* d = reinterpret_cast<int4*>(dst[i]);
    const int4* s = reinterpret_cast<const int4*>(src[i]);
    for (long long j = first; j < n / 16; j += step) d[j] = s[j];
  } else {
    char* d = reinterpret_cast<char*>(dst[i]);
    const char* s = reinterpret_cast<const char*>(src[i]);
    for (long long j = first; j < n; j += step) d[j] = s[j];
  }
}
