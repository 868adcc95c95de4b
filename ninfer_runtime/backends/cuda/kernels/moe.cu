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

// ------------------------------------------------------------------ prefill pair groups
// A prefill pass's P (token, slot) pairs laid out by expert in groups of `size` rows, as
// moe.PairGroups defines it: pair p's rank among its expert's pairs is the number of earlier
// pairs of that expert, expert e's groups follow those of the experts below it, and pair p
// takes row (start[e] + rank / size) * size + rank % size.

#define MOE_GROUP_THREADS 1024

// Warp w of block b counts the pairs of expert 32 b + w in pair order: rank[p] for its
// pairs, counts[e] their number (one ballot per 32 pairs; no atomics, so no reordering).
extern "C" __global__ void __launch_bounds__(MOE_GROUP_THREADS)
    moe_pair_ranks(const int* __restrict__ ids, int P, int E, int* __restrict__ rank,
                   int* __restrict__ counts) {
  const int lane = threadIdx.x & 31;
  const int e = blockIdx.x * (MOE_GROUP_THREADS / 32) + (threadIdx.x >> 5);
  if (e >= E) return;
  int seen = 0;
  for (int p0 = 0; p0 < P; p0 += 32) {
    const int p = p0 + lane;
    const bool mine = p < P && __ldg(ids + p) == e;
    const unsigned hits = __ballot_sync(0xFFFFFFFFu, mine);
    if (mine) rank[p] = seen + __popc(hits & ((1u << lane) - 1u));
    seen += __popc(hits);
  }
  if (lane == 0) counts[e] = seen;
}

// One block: each expert's first group (an exclusive scan of its group counts), then every
// pair's row, each group's expert (-1 past the real ones) and pairs (live: 0 past the real
// ones) and each row's token (-1 for rows no pair takes). G groups of `size` rows; pairs are
// token-major, top_k a token.
extern "C" __global__ void __launch_bounds__(MOE_GROUP_THREADS)
    moe_pair_rows(const int* __restrict__ ids, int P, int E, int size, int top_k,
                  const int* __restrict__ rank, const int* __restrict__ counts, int G,
                  long long* __restrict__ row, int* __restrict__ group_expert,
                  int* __restrict__ live, int* __restrict__ source) {
  __shared__ int start[MOE_MAX_EXPERTS + 1];
  __shared__ int warp_sum[MOE_GROUP_THREADS / 32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int mine = t < E ? (counts[t] + size - 1) / size : 0;
  int v = mine;  // inclusive scan: in the warp, then over the warps' sums
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int u = __shfl_up_sync(0xFFFFFFFFu, v, off);
    if (lane >= off) v += u;
  }
  if (lane == 31) warp_sum[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int s = warp_sum[lane];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int u = __shfl_up_sync(0xFFFFFFFFu, s, off);
      if (lane >= off) s += u;
    }
    warp_sum[lane] = s;  // inclusive over the warps
  }
  __syncthreads();
  const int inclusive = v + (warp > 0 ? warp_sum[warp - 1] : 0);
  if (t < E) start[t] = inclusive - mine;
  if (t == 0) start[E] = warp_sum[MOE_GROUP_THREADS / 32 - 1];  // the real groups
  for (int r = t; r < G * size; r += MOE_GROUP_THREADS) source[r] = -1;
  __syncthreads();
  const int total = start[E];
  for (int g = t; g < G; g += MOE_GROUP_THREADS) {
    int e = -1;
    if (g < total) {  // the last expert whose first group is at or below g
      int lo = 0, hi = E - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (start[mid] <= g) lo = mid; else hi = mid - 1;
      }
      e = lo;
    }
    group_expert[g] = e;
    live[g] = e < 0 ? 0 : min(size, counts[e] - (g - start[e]) * size);
  }
  for (int p = t; p < P; p += MOE_GROUP_THREADS) {
    const int e = __ldg(ids + p), k = __ldg(rank + p);
    const long long r = (long long)(start[e] + k / size) * size + k % size;
    row[p] = r;
    source[r] = p / top_k;
  }
}
