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
    for (int e = threadIdx.x; e < E; e += MOE_ROUTER_THREADS) {
      // a NaN ranks after every probability, as numpy's argsort places it: the choice is
      // always an expert (NaN shares follow), never an index past the experts
      const float pe = p[e] == p[e] ? p[e] : -0.5f;
      if (moe_better(pe, e, v, i)) {
        v = pe;
        i = e;
      }
    }
    block_argmax(v, i);
    if (threadIdx.x == 0) {
      ids[row * k + t] = i;
      picked[t] = p[i];
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
// takes row (start[e] + rank / size) * size + rank % size = start[e] * size + rank.
// Two launches over chunks of MOE_CHUNK_PAIRS consecutive pairs, no atomics: ranks within
// each chunk, then every block adds up the chunks' counts itself and places its chunk's pairs.

#define MOE_GROUP_THREADS 1024
#define MOE_CHUNK_PAIRS 512
#define MOE_CHUNK_WARPS (MOE_CHUNK_PAIRS / 32)
// most threads that add up one expert's chunk counts in moe_pair_rows
#define MOE_CHUNK_SPLIT 32

// Block c: chunk_rank[p] for the chunk's pairs (earlier pairs of its expert in the chunk)
// and chunk_counts[c, e] (the chunk's pairs of expert e); also every source row set to -1
// (rows no pair takes), before moe_pair_rows writes the taken ones.
extern "C" __global__ void __launch_bounds__(MOE_CHUNK_PAIRS)
    moe_pair_ranks(const int* __restrict__ ids, int P, int E, int* __restrict__ chunk_rank,
                   int* __restrict__ chunk_counts, int rows, int* __restrict__ source) {
  __shared__ unsigned short warp_counts[MOE_CHUNK_WARPS * MOE_MAX_EXPERTS];  // [warp, expert]
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int p = blockIdx.x * MOE_CHUNK_PAIRS + t;
  const int e = p < P ? __ldg(ids + p) : -1;
  for (int i = t; i < MOE_CHUNK_WARPS * E; i += MOE_CHUNK_PAIRS) warp_counts[i] = 0;
  for (int r = blockIdx.x * MOE_CHUNK_PAIRS + t; r < rows; r += gridDim.x * MOE_CHUNK_PAIRS)
    source[r] = -1;
  __syncthreads();
  const unsigned same = __match_any_sync(0xFFFFFFFFu, e);
  const int below = __popc(same & ((1u << lane) - 1u));  // earlier lanes of the same expert
  if (e >= 0 && below == 0) warp_counts[warp * E + e] = __popc(same);
  __syncthreads();
  for (int x = t; x < E; x += MOE_CHUNK_PAIRS) {  // each expert's counts -> exclusive prefix
    int n[MOE_CHUNK_WARPS];
#pragma unroll
    for (int w = 0; w < MOE_CHUNK_WARPS; ++w) n[w] = warp_counts[w * E + x];
    int before = 0;
#pragma unroll
    for (int w = 0; w < MOE_CHUNK_WARPS; ++w) {
      warp_counts[w * E + x] = before;
      before += n[w];
    }
    chunk_counts[blockIdx.x * E + x] = before;
  }
  __syncthreads();
  if (e >= 0) chunk_rank[p] = warp_counts[warp * E + e] + below;
}

// Block c (chunks blocks in all): each expert's pairs in all chunks and in those before c,
// each expert's first group (an exclusive scan of its group counts), then the rows of
// chunk c's pairs and their source token, and (over the grid) each group's expert (-1 past
// the real ones) and pairs (live: 0 past the real ones). G groups of `size` rows; pairs are
// token-major, top_k a token.
extern "C" __global__ void __launch_bounds__(MOE_GROUP_THREADS)
    moe_pair_rows(const int* __restrict__ ids, int P, int E, int size, int top_k,
                  const int* __restrict__ chunk_rank, const int* __restrict__ chunk_counts,
                  int chunks, int G, long long* __restrict__ row, int* __restrict__ group_expert,
                  int* __restrict__ live, int* __restrict__ source) {
  __shared__ int start[MOE_MAX_EXPERTS + 1];
  __shared__ int count[MOE_MAX_EXPERTS];
  __shared__ int earlier[MOE_MAX_EXPERTS];  // the expert's pairs in chunks before this one
  __shared__ int part_count[MOE_GROUP_THREADS], part_earlier[MOE_GROUP_THREADS];
  __shared__ int warp_sum[MOE_GROUP_THREADS / 32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, chunk = blockIdx.x;
  const int p = chunk * MOE_CHUNK_PAIRS + t;  // the thread's pair, read first: the loads
  const bool pair = t < MOE_CHUNK_PAIRS && p < P;  // overlap the sums below
  const int pair_expert = pair ? __ldg(ids + p) : 0;
  const int pair_rank = pair ? __ldg(chunk_rank + p) : 0;
  const int split = max(1, min(MOE_CHUNK_SPLIT, MOE_GROUP_THREADS / E));
  const int part = t / E, x = t - part * E;  // adds up chunks part, part + split, ... of x
  if (part < split) {
    int n = 0, b = 0;
#pragma unroll 4
    for (int c = part; c < chunks; c += split) {
      const int v = __ldg(chunk_counts + c * E + x);
      n += v;
      b += c < chunk ? v : 0;
    }
    part_count[t] = n;
    part_earlier[t] = b;
  }
  __syncthreads();
  int mine = 0;
  if (t < E) {
    int n = 0, b = 0;
    for (int j = 0; j < split; ++j) {
      n += part_count[j * E + t];
      b += part_earlier[j * E + t];
    }
    count[t] = n;
    earlier[t] = b;
    mine = (n + size - 1) / size;
  }
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
  __syncthreads();
  const int total = start[E];
  for (int g = chunk * MOE_GROUP_THREADS + t; g < G; g += gridDim.x * MOE_GROUP_THREADS) {
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
    live[g] = e < 0 ? 0 : min(size, count[e] - (g - start[e]) * size);
  }
  if (pair) {
    const long long r =
        (long long)start[pair_expert] * size + earlier[pair_expert] + pair_rank;
    row[p] = r;
    source[r] = p / top_k;
  }
}
