// On-device token selection for up to 64 decode lanes: only the chosen ids leave the GPU.
//
// One block of SAMPLE_THREADS threads per lane, lanes independent (a lane's token depends only
// on its logits row, its parameters and its (seed, counter)). The filters reproduce
// ninfer_runtime/frontend/sampling.py (Sampler.probabilities), in the same order:
//
//   greedy (temperature <= 0): argmax, ties to the lowest id
//   top_k:  keep logits >= the k-th largest logit (ties with it all stay)
//   top_p:  over the top_k set, p = softmax(logits / T); keep the prefix of the order
//           (p descending, id ascending) whose mass before each token is < top_p: every token
//           above the boundary logit v, and the first n tokens *by id* among those equal to v
//   min_p:  keep p >= min_p * max p, i.e. exp((logit - max) / T) >= min_p
//   draw:   Gumbel-max over the survivors: argmax of (logit - max) / T + G_i, with G_i a
//           Gumbel variate from a counter-based hash of (seed, counter, token id)
//
// Thresholds are found without sorting: an 8-way search over the order-preserving 32-bit key
// of the logit (each pass counts, or sums exp over, the row at 8 probe keys; at most 11 passes
// narrow the 32-bit key range to one key, each an L2-resident read of the row), all sums in a fixed order so
// the result is deterministic. PROBES = 8 keeps the pass spill-free at 1024 threads.
// Cost (H200, 8 lanes, V = 248,320, 2026-11-29): a pass over a row takes ~30 us on one SM, so
// greedy ~33 us, temperature only ~150 us, top_k ~430 us, top_p ~0.6-1 ms. Splitting a row over
// several blocks (or compacting the candidates above a safe bound first) is the next step.
// Non-finite logits are never candidates; a row with no finite logit yields -1.
// Probabilities are float32 exp summed in float64 (the reference is float64 throughout), so a
// top_p or min_p boundary within ~1e-6 relative of a token's mass may fall differently.

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define PROBES 8
#define FULL_MASK 0xFFFFFFFFu
#define ROW_UNROLL 2  // 16-byte loads in flight per thread on a pass over a row

// Calls f(value, id) for the tokens of the row this thread owns, always the same ones in the
// same order (so sums are deterministic). Aligned rows are read with ROW_UNROLL float4 loads in
// flight per thread: one block reads a whole row per pass, so a pass is latency-bound without.
template <class F>
__device__ __forceinline__ void for_row(const float* __restrict__ x, int V, F&& f) {
  int done = 0;
  if ((reinterpret_cast<u64>(x) & 15) == 0) {
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    const int n4 = V >> 2;
    for (int base = threadIdx.x; base < n4; base += SAMPLE_THREADS * ROW_UNROLL) {
      float4 v[ROW_UNROLL];
#pragma unroll
      for (int u = 0; u < ROW_UNROLL; ++u) {
        const int j = base + u * SAMPLE_THREADS;
        if (j < n4) v[u] = x4[j];
      }
#pragma unroll
      for (int u = 0; u < ROW_UNROLL; ++u) {
        const int j = base + u * SAMPLE_THREADS;
        if (j < n4) {
          f(v[u].x, 4 * j);
          f(v[u].y, 4 * j + 1);
          f(v[u].z, 4 * j + 2);
          f(v[u].w, 4 * j + 3);
        }
      }
    }
    done = n4 * 4;
  }
  for (int i = done + threadIdx.x; i < V; i += SAMPLE_THREADS) f(x[i], i);
}

struct SampleShared {
  u32 probe[PROBES];
  double sum[PROBES];
  double part[SAMPLE_WARPS][PROBES];
  u64 best[SAMPLE_WARPS];
  int count[SAMPLE_WARPS];
  int id;
};

// Order-preserving key of a finite float (+0 and -0 share one key); 0 for NaN and +-inf.
__device__ __forceinline__ u32 logit_key(float s) {
  u32 u = __float_as_uint(s);
  if ((u & 0x7F800000u) == 0x7F800000u) return 0u;
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u32 order_key(float f) {  // any float, including -inf
  const u32 u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(u32 k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// (key, id) packed so that the larger key wins and, among equal keys, the lower id.
__device__ __forceinline__ u64 pack_best(u32 key, int id) {
  return ((u64)key << 32) | (u64)(0xFFFFFFFFu - (u32)id);
}

__device__ __forceinline__ int best_id(u64 packed) {
  return (int)(0xFFFFFFFFu - (u32)(packed & 0xFFFFFFFFull));
}

// SplitMix64's output function: a bijective 64-bit mix.
__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

#define GOLDEN 0x9E3779B97F4A7C15ull

// Gumbel(0, 1) for token `id` of the stream `stream` (= f(seed, counter)).
__device__ __forceinline__ float gumbel(u64 stream, int id) {
  const u64 h = mix64(stream + (u64)(id + 1) * GOLDEN);
  const float u = ((float)(u32)(h >> 40) + 0.5f) * 5.9604644775390625e-8f;  // (0, 1)
  return -__logf(-logf(u));  // inner log exact near u = 1, where __logf's error is absolute
}

__device__ u64 block_max(u64 v, SampleShared& sh) {
  for (int o = 16; o > 0; o >>= 1) {
    const u64 w = __shfl_xor_sync(FULL_MASK, v, o);
    v = w > v ? w : v;
  }
  if ((threadIdx.x & 31) == 0) sh.best[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < SAMPLE_WARPS; ++w) v = sh.best[w] > v ? sh.best[w] : v;
  __syncthreads();
  return v;
}

// Block sums of N doubles into sh.sum[0..N), in a fixed order (deterministic).
template <int N>
__device__ void block_sum(double (&v)[N], SampleShared& sh) {
#pragma unroll
  for (int j = 0; j < N; ++j)
    for (int o = 16; o > 0; o >>= 1) v[j] += __shfl_xor_sync(FULL_MASK, v[j], o);
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) sh.part[threadIdx.x >> 5][j] = v[j];
  }
  __syncthreads();
  if (threadIdx.x < N) {
    double t = 0.0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) t += sh.part[w][threadIdx.x];
    sh.sum[threadIdx.x] = t;
  }
  __syncthreads();
}

// sh.sum[j] = W(sh.probe[j]): the count (mass = false) or the sum of exp((s - top) / temp)
// (mass = true) of the tokens whose key is >= the probe. Probes lie in [lo, hi], probe[0] = lo.
__device__ void measure(const float* __restrict__ x, int V, float top, float temp, bool mass,
                        u32 lo, u32 hi, SampleShared& sh) {
  double acc[PROBES], above = 0.0;
#pragma unroll
  for (int j = 0; j < PROBES; ++j) acc[j] = 0.0;
  for_row(x, V, [&](float s, int) {
    const u32 k = logit_key(s);
    if (k < lo) return;
    const double w = mass ? (double)expf((s - top) / temp) : 1.0;
    if (k > hi) {
      above += w;
      return;
    }
#pragma unroll
    for (int j = 0; j < PROBES; ++j) acc[j] += k >= sh.probe[j] ? w : 0.0;
  });
#pragma unroll
  for (int j = 0; j < PROBES; ++j) acc[j] += above;
  block_sum(acc, sh);
}

// The largest key t in [lo, hi] with W(t) >= target, where target = goal (mass = false) or
// goal * W(lo) (mass = true); lo when W(lo) itself falls short. W is non-increasing in t and
// only steps at token keys, so the answer is the key of a token.
__device__ u32 search(const float* __restrict__ x, int V, float top, float temp, bool mass,
                      u32 lo, u32 hi, double goal, SampleShared& sh) {
  double target = goal;
  bool first = true;
  while (lo < hi) {
    if (threadIdx.x < PROBES)
      sh.probe[threadIdx.x] =
          lo + (u32)(((u64)(hi - lo) * threadIdx.x + PROBES - 1) / PROBES);  // probe[0] = lo
    __syncthreads();
    measure(x, V, top, temp, mass, lo, hi, sh);
    if (first && mass) target = goal * sh.sum[0];
    first = false;
    if (sh.sum[0] < target) return lo;
    int a = 0;
    while (a + 1 < PROBES && sh.sum[a + 1] >= target) ++a;
    const u32 new_lo = sh.probe[a], new_hi = a + 1 < PROBES ? sh.probe[a + 1] - 1 : hi;
    __syncthreads();  // everyone has read the probes before they are rewritten
    lo = new_lo;
    hi = new_hi;
  }
  return lo;
}

// How many tokens with key == v the nucleus keeps (the first ones by id): v is the boundary
// key, kfloor the top_k key. Tied token j (0-based) stays while (mass(> v) + j p_v) / mass <
// top_p, evaluated as written (an exact boundary, e.g. 10 equal tokens and top_p = 0.3, keeps
// 3; the reference's running float64 cumsum can round such a case either way).
__device__ int nucleus_ties(const float* __restrict__ x, int V, float top, float temp, u32 kfloor,
                            u32 v, double top_p, int* ties, SampleShared& sh) {
  double acc[3] = {0.0, 0.0, 0.0};  // mass >= kfloor, mass > v, count == v
  for_row(x, V, [&](float s, int) {
    const u32 k = logit_key(s);
    if (k < kfloor) return;
    const double e = (double)expf((s - top) / temp);
    acc[0] += e;
    if (k > v) acc[1] += e;
    if (k == v) acc[2] += 1.0;
  });
  block_sum(acc, sh);
  const double total = sh.sum[0], above = sh.sum[1];
  const int count = (int)sh.sum[2];
  __syncthreads();
  *ties = count;
  const double e_v = (double)expf((key_value(v) - top) / temp);
  if (!(e_v > 0.0)) return count;
  double guess = ceil((top_p * total - above) / e_v);
  int keep = guess < 1.0 ? 1 : (guess > count ? count : (int)guess);
  while (keep > 1 && !((above + (keep - 1) * e_v) / total < top_p)) --keep;
  while (keep < count && (above + keep * e_v) / total < top_p) ++keep;
  return keep;
}

// The id of the n-th (0-based) token with key == v, in id order; n < the number of them.
// Each thread scans a contiguous chunk so that the id order is a block prefix sum.
__device__ int nth_tie(const float* __restrict__ x, int V, u32 v, int n, SampleShared& sh) {
  const int chunk = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
  const int begin = min(V, (int)threadIdx.x * chunk), end = min(V, begin + chunk);
  int mine = 0;
  for (int i = begin; i < end; ++i) mine += logit_key(x[i]) == v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(FULL_MASK, incl, o);
    if (lane >= o) incl += t;
  }
  if (lane == 31) sh.count[warp] = incl;
  __syncthreads();
  int base = incl - mine;
  for (int w = 0; w < warp; ++w) base += sh.count[w];
  if (base <= n && n < base + mine) {
    int r = n - base;
    for (int i = begin; i < end; ++i) {
      if (logit_key(x[i]) == v && r-- == 0) {
        sh.id = i;
        break;
      }
    }
  }
  __syncthreads();
  return sh.id;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_tokens(const float* __restrict__ logits, long long ld, int V,
                  const float* __restrict__ temperature, const int* __restrict__ top_k,
                  const double* __restrict__ top_p, const double* __restrict__ min_p,
                  const u64* __restrict__ seeds, const u64* __restrict__ counters,
                  int* __restrict__ out) {
  __shared__ SampleShared sh;
  const int lane = blockIdx.x;
  const float* __restrict__ x = logits + (long long)lane * ld;

  // the maximum (and greedy's answer): largest key, lowest id
  u64 best = 0;
  for_row(x, V, [&](float s, int i) {
    const u64 b = pack_best(logit_key(s), i);
    best = b > best ? b : best;
  });
  best = block_max(best, sh);
  const float temp = temperature[lane];
  if ((best >> 32) == 0 || !(temp > 0.0f)) {  // no finite logit, or greedy
    if (threadIdx.x == 0) out[lane] = (best >> 32) == 0 ? -1 : best_id(best);
    return;
  }
  const u32 top_key = (u32)(best >> 32);
  const float top = key_value(top_key);

  u32 kfloor = 1u;  // every finite logit
  const int k = top_k[lane];
  if (k > 0 && k < V) kfloor = search(x, V, top, temp, false, 1u, top_key, (double)k, sh);

  u32 cut = kfloor;  // keys > cut survive top_p; key == cut only below id cut_id
  int cut_id = V;
  const double p = top_p[lane];
  if (p < 1.0) {
    cut = search(x, V, top, temp, true, kfloor, top_key, p, sh);
    int ties;
    const int keep = nucleus_ties(x, V, top, temp, kfloor, cut, p, &ties, sh);
    if (keep < ties) cut_id = nth_tie(x, V, cut, keep, sh);
  }

  const double mp = min_p[lane];
  const u64 stream = mix64(mix64(seeds[lane]) + counters[lane] * GOLDEN);
  best = 0;
  for_row(x, V, [&](float s, int i) {
    const u32 key = logit_key(s);
    if (key < cut || (key == cut && i >= cut_id)) return;
    const float z = (s - top) / temp;
    // G lies in [-2.9, 17.4] (u is 24-bit, in (0, 1)) and the top token scores G >= -2.9, so
    // z < -21 can never win: skipping it saves the hash for most of a peaked vocabulary
    if (z < -21.0f || (mp > 0.0 && !((double)expf(z) >= mp))) return;
    const u64 b = pack_best(order_key(z + gumbel(stream, i)), i);
    best = b > best ? b : best;
  });
  best = block_max(best, sh);
  if (threadIdx.x == 0) out[lane] = best_id(best);
}

// Log-probabilities for the rows that ask for them, one block a row: out row i (1 + 2k
// doubles) = [log p(chosen[i]), log p of the row's k most likely tokens (largest first, ties
// lowest id first), their ids]. log p(t) = (s_t - max) - log(sum of exp(s - max)), the sum in
// double. One pass finds the maximum and keeps each thread's own k best (a sorted list of at
// most SCORE_MAX_TOP packed keys, mostly left alone: a logit below the list's last is one
// compare); a second sums the exponentials; k block-wide maxima then merge the lists, the
// winning thread offering its next. NaN logits are never listed.
#define SCORE_MAX_TOP 20

__global__ void __launch_bounds__(SAMPLE_THREADS)
    score_tokens(const float* __restrict__ logits, long long ld, int V,
                 const int* __restrict__ chosen, int k, double* __restrict__ out) {
  __shared__ SampleShared sh;
  const int row = blockIdx.x;
  const float* __restrict__ x = logits + (long long)row * ld;
  u64 mine[SCORE_MAX_TOP];
#pragma unroll
  for (int j = 0; j < SCORE_MAX_TOP; ++j) mine[j] = 0;
  u64 best = 0;
  for_row(x, V, [&](float s, int i) {
    if (s != s) return;
    const u64 b = pack_best(order_key(s), i);
    best = b > best ? b : best;
    if (k == 0 || b <= mine[k - 1]) return;
    int j = k - 1;
    for (; j > 0 && mine[j - 1] < b; --j) mine[j] = mine[j - 1];
    mine[j] = b;
  });
  best = block_max(best, sh);
  const float top = key_value((u32)(best >> 32));
  double total[1] = {0.0};
  for_row(x, V, [&](float s, int) {
    if (s == s) total[0] += (double)expf(s - top);
  });
  block_sum(total, sh);
  const double log_total = log(sh.sum[0]);
  double* __restrict__ o = out + (long long)row * (1 + 2 * k);
  if (threadIdx.x == 0) {
    const int c = chosen[row];  // the sampler's -1 (no finite logit) scores NaN
    o[0] = c >= 0 && c < V ? (double)(x[c] - top) - log_total
                           : __longlong_as_double(0x7FF8000000000000ull);
  }
  int head = 0;
  for (int j = 0; j < k; ++j) {
    const u64 offer = head < k ? mine[head] : 0;
    const u64 win = block_max(offer, sh);
    if (win != 0 && offer == win) ++head;
    if (threadIdx.x == 0) {
      o[1 + j] = win ? (double)(key_value((u32)(win >> 32)) - top) - log_total
                     : __longlong_as_double(0xFFF0000000000000ull);
      o[1 + k + j] = win ? (double)best_id(win) : -1.0;
    }
  }
}
