// Mixture-of-experts decode helpers (N <= 8 token rows), all on the device so the whole block
// can be captured in a CUDA graph: the router's top-k choice, silu(gate) * up over the chosen
// (row, slot) pairs, and the share-weighted combine with the shared expert.

#define MOE_ROUTER_THREADS 256
#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_TOP_K 64

__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xFF800000u); }

// (v, i) beats (w, j): larger value, ties to the lower index (numpy's stable argsort of -p).
__device__ __forceinline__ bool moe_better(float v, int i, float w, int j) {
  return v > w || (v == w && i < j);
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float w = __shfl_xor_sync(0xFFFFFFFFu, v, off);
    const int j = __shfl_xor_sync(0xFFFFFFFFu, i, off);
    if (moe_better(w, j, v, i)) {
      v = w;
      i = j;
    }
  }
}

// Block-wide argmax (every thread gets the result); all threads must call it.
__device__ void block_argmax(float& v, int& i) {
  __shared__ float sv[MOE_ROUTER_THREADS / 32];
  __shared__ int si[MOE_ROUTER_THREADS / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_argmax(v, i);
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  v = lane < MOE_ROUTER_THREADS / 32 ? sv[lane] : neg_inf();
  i = lane < MOE_ROUTER_THREADS / 32 ? si[lane] : 0x7FFFFFFF;
  warp_argmax(v, i);  // every warp reduces the same partials: no broadcast needed
  __syncthreads();    // partials may be overwritten by the next call only after all read them
}

__device__ float block_sum(float v) {
  __shared__ float part[MOE_ROUTER_THREADS / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < MOE_ROUTER_THREADS / 32 ? part[lane] : 0.f;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  __syncthreads();
  return v;
}

// One block of MOE_ROUTER_THREADS per token row. logits [N, E] (row stride ld); out ids [N, k]
// int32 and shares [N, k]: softmax over all E experts, the k largest probabilities (ties to
// the lower expert index), each divided by their sum. E <= MOE_MAX_EXPERTS, k <= MOE_MAX_TOP_K.
extern "C" __global__ void __launch_bounds__(MOE_ROUTER_THREADS)
    moe_router(const float* __restrict__ logits, int ld, int E, int k, int* __restrict__ ids,
               float* __restrict__ shares) {
  __shared__ float p[MOE_MAX_EXPERTS];
  __shared__ float picked[MOE_MAX_TOP_K];
  const int row = blockIdx.x;
  const float* l = logits + (long long)row * ld;

  float m = neg_inf();
  int unused = 0;
  for (int e = threadIdx.x; e < E; e += MOE_ROUTER_THREADS) m = fmaxf(m, l[e]);
  block_argmax(m, unused);  // the maximum (the index is irrelevant)
  float s = 0.f;
  for (int e = threadIdx.x; e < E; e += MOE_ROUTER_THREADS) {
    p[e] = expf(l[e] - m);
    s += p[e];
  }
  s = block_sum(s);  // also orders the p[] writes before the reads below
  for (int e = threadIdx.x; e < E; e += MOE_ROUTER_THREADS) p[e] = p[e] / s;
  __syncthreads();

  for (int t = 0; t < k; ++t) {
    float v = -1.f;  // probabilities are >= 0; taken experts are marked -1
    int i = 0x7FFFFFFF;
    for (int e = threadIdx.x; e < E; e += MOE_ROUTER_THREADS)
      if (moe_better(p[e], e, v, i)) {
        v = p[e];
        i = e;
      }
    block_argmax(v, i);
    if (threadIdx.x == 0) {
      ids[row * k + t] = i;
      picked[t] = v;
      p[i] = -1.f;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int t = 0; t < k; ++t) total += picked[t];
    for (int t = 0; t < k; ++t) shares[row * k + t] = picked[t] / total;
  }
}

__device__ __forceinline__ float moe_sigmoid(float x) { return 0.5f * (1.f + tanhf(0.5f * x)); }

// h[p, i] = silu(gu[p, i]) * gu[p, up + i] for i < I, and 0 for I <= i < ldh (the zero padding
// the down projection's GEMV reads). gu rows are ldgu apart; P = N * k pairs.
extern "C" __global__ void moe_silu_mul(const float* __restrict__ gu, int ldgu, int up, int I,
                                        float* __restrict__ h, int ldh, int P) {
  const long long total = (long long)P * ldh;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
       t += (long long)gridDim.x * blockDim.x) {
    const long long p = t / ldh;
    const int i = (int)(t - p * ldh);
    float v = 0.f;
    if (i < I) {
      const float g = gu[p * ldgu + i];
      v = g * moe_sigmoid(g) * gu[p * ldgu + up + i];
    }
    h[t] = v;
  }
}

// out[n, c] = sum_j share[n, j] * y[p, c] + sigmoid(score[n * lds]) * shared[n, c] with
// p = y_rows[n * k + j] (y_rows null: p = n * k + j) for the N x H outputs (y rows ldy apart;
// shared and out C-contiguous [N, H]; score: one value per row, lds apart, e.g. the column
// after the router logits).
extern "C" __global__ void moe_combine(const float* __restrict__ y, int ldy,
                                       const long long* __restrict__ y_rows,
                                       const float* __restrict__ shares, int k,
                                       const float* __restrict__ shared,
                                       const float* __restrict__ score, int lds, int H, int N,
                                       float* __restrict__ out) {
  const long long total = (long long)N * H;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
       t += (long long)gridDim.x * blockDim.x) {
    const int n = (int)(t / H), c = (int)(t - (long long)n * H);
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const long long p = y_rows ? __ldg(y_rows + n * k + j) : (long long)(n * k + j);
      acc = fmaf(shares[n * k + j], y[p * ldy + c], acc);
    }
    out[t] = acc + moe_sigmoid(score[(long long)n * lds]) * shared[t];
  }
}
