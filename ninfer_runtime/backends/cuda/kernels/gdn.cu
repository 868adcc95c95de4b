// Gated DeltaNet decode step (one token per lane; states in pools addressed by slot index).
//
// conv_step: the depthwise causal convolution of the q|k|v channels, optionally followed by
// SiLU. gdn_step: l2-normalise q and k, then the gated delta rule on a [dk, dv] state per
// value head. Both match ninfer_runtime/backends/array_ops.py (conv_step, gdn_step_slots).

// One thread per (lane n, channel c). conv_states[slot, c, :] holds the last K-1 inputs,
// oldest first; tap K-1 of the kernel multiplies the current input.
template <int K>
__global__ void conv_step(const float* __restrict__ x, const float* __restrict__ kernel,
                          float* __restrict__ conv_states, const int* __restrict__ slots,
                          int channels, int silu, float* __restrict__ y) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = blockIdx.y;
  if (c >= channels) return;
  float* st = conv_states + ((long long)slots[n] * channels + c) * (K - 1);
  float w[K];
#pragma unroll
  for (int t = 0; t < K - 1; ++t) w[t] = st[t];
  w[K - 1] = x[(long long)n * channels + c];
  float acc = 0.0f;
#pragma unroll
  for (int t = 0; t < K; ++t) acc += w[t] * kernel[t * channels + c];
#pragma unroll
  for (int t = 0; t < K - 1; ++t) st[t] = w[t + 1];
  y[(long long)n * channels + c] = silu ? acc / (1.0f + expf(-acc)) : acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Columns of the state per block (one per thread of a warp).
#define GDN_COLS 32

// One block per (column tile of 32, value head h, lane n); its WARPS = max(DK / 32, 1)
// warps split the DK rows. Thread (w, j) keeps rows [w * ROWS, (w + 1) * ROWS) of state
// column j in registers, so each state element is read and written exactly once (the step
// is bound by state bandwidth); loads are coalesced since j is the contiguous axis. The two
// column sums (k.S and q.S) are reduced over the warps through shared memory.
//
// qkv [N, 2*Hk*DK + Hv*dv] = [q | k | v]; g, beta [N, Hv]; states [S, Hv, DK, dv];
// o [N, Hv, dv].
template <int DK>
__global__ void __launch_bounds__(DK < 32 ? 32 : DK)
    gdn_step(const float* __restrict__ qkv, const float* __restrict__ g,
             const float* __restrict__ beta, float* __restrict__ states,
             const int* __restrict__ slots, int key_heads, int value_heads, int dv,
             float* __restrict__ o) {
  constexpr int WARPS = DK < 32 ? 1 : DK / 32;
  constexpr int ROWS = DK / WARPS;
  __shared__ float qs[DK], ks[DK], part[WARPS][GDN_COLS], sums[2][WARPS];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int j = blockIdx.x * GDN_COLS + lane;
  const int h = blockIdx.y, n = blockIdx.z;
  const int hk = h / (value_heads / key_heads);
  const float* row = qkv + (long long)n * (2 * key_heads * DK + value_heads * dv);

  // issue the state loads first: they do not depend on the normalisation below
  const bool active = j < dv;  // inactive threads still take part in the barriers
  const int nh = n * value_heads + h;
  float* S = states + (((long long)slots[n] * value_heads + h) * DK + w * ROWS) * dv + j;
  float s[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) s[i] = active ? S[(long long)i * dv] : 0.0f;

  // l2-normalise q and k of the key head into shared memory (thread t holds element t)
  const int t = threadIdx.x;
  const float qt = t < DK ? row[hk * DK + t] : 0.0f;
  const float kt = t < DK ? row[(key_heads + hk) * DK + t] : 0.0f;
  const float qq = warp_sum(qt * qt), kk = warp_sum(kt * kt);
  if (lane == 0) {
    sums[0][w] = qq;
    sums[1][w] = kk;
  }
  __syncthreads();
  float q_sq = 0.0f, k_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) {
    q_sq += sums[0][i];
    k_sq += sums[1][i];
  }
  if (t < DK) {
    qs[t] = qt / sqrtf(q_sq + 1e-6f) * (1.0f / sqrtf((float)DK));
    ks[t] = kt / sqrtf(k_sq + 1e-6f);
  }
  __syncthreads();

  const float decay = expf(g[nh]);
  const float* kw = ks + w * ROWS;
  const float* qw = qs + w * ROWS;
  float recalled = 0.0f;
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    s[i] *= decay;
    recalled += s[i] * kw[i];
  }
  if (WARPS > 1) {
    part[w][lane] = recalled;
    __syncthreads();
    recalled = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) recalled += part[i][lane];
    __syncthreads();  // part is reused below
  }
  const float delta = active ? beta[nh] * (row[2 * key_heads * DK + h * dv + j] - recalled) : 0.0f;
  float out = 0.0f;
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    s[i] += kw[i] * delta;
    if (active) S[(long long)i * dv] = s[i];
    out += s[i] * qw[i];
  }
  if (WARPS > 1) {
    part[w][lane] = out;
    __syncthreads();
    out = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) out += part[i][lane];
  }
  if (active && w == 0) o[(long long)nh * dv + j] = out;
}
