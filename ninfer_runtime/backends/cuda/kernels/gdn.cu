// Gated DeltaNet decode step (one token per lane; states in pools addressed by slot index)
// and speculative verification (T tokens per lane).
//
// conv_step: the depthwise causal convolution of the q|k|v channels, optionally followed by
// SiLU. gdn_step: l2-normalise q and k, then the gated delta rule on a [dk, dv] state per
// value head; kda_step the same with one decay a key channel (Kimi Delta Attention). All match
// ninfer_runtime/ops/delta_rule/ (conv.conv_step, reference.step_slots).
//
// Verification (the reference's verify / commit): conv_verify and gdn_verify run T
// consecutive tokens per lane from the lanes' states without writing them, and record each
// row's inputs; conv_commit and gdn_commit fold the first counts[lane] recorded tokens into
// the states. Every token goes through the same device functions (conv_window, silu_f,
// gdn_token) as a decode step, so a verified token gets the float operations, in the same
// order, that decoding it would: the outputs and states are bit-identical.

// sum_t w[t] kernel[t, c]: the window's K inputs, oldest first (tap K-1 hits the newest).
template <int K>
__device__ __forceinline__ float conv_window(const float (&w)[K], const float* __restrict__ kernel,
                                             int channels, int c) {
  float acc = 0.0f;
#pragma unroll
  for (int t = 0; t < K; ++t) acc += w[t] * kernel[t * channels + c];
  return acc;
}

__device__ __forceinline__ float silu_f(float a) { return a / (1.0f + expf(-a)); }

// Drop the window's oldest input (w[K-1] is free for the next one).
template <int K>
__device__ __forceinline__ void conv_shift(float (&w)[K]) {
#pragma unroll
  for (int t = 0; t < K - 1; ++t) w[t] = w[t + 1];
}

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
  const float acc = conv_window<K>(w, kernel, channels, c);
  conv_shift<K>(w);
#pragma unroll
  for (int t = 0; t < K - 1; ++t) st[t] = w[t];
  y[(long long)n * channels + c] = silu ? silu_f(acc) : acc;
}

// The conv step (with SiLU) of T tokens per lane, the conv states only read: lane n's rows
// x[n*T .. n*T+T-1] continue its slot's last K-1 inputs. Each row is also recorded,
// record[slot, i, c] (record [S, record_rows, channels], GdnDrafts.mixed).
template <int K>
__global__ void conv_verify(const float* __restrict__ x, const float* __restrict__ kernel,
                            const float* __restrict__ conv_states, const int* __restrict__ slots,
                            int channels, int tokens, float* __restrict__ y,
                            float* __restrict__ record, int record_rows) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = blockIdx.y;
  if (c >= channels) return;
  const int slot = slots[n];
  const float* st = conv_states + ((long long)slot * channels + c) * (K - 1);
  float w[K];
#pragma unroll
  for (int t = 0; t < K - 1; ++t) w[t] = st[t];
  for (int i = 0; i < tokens; ++i) {
    const long long r = (long long)n * tokens + i;
    w[K - 1] = x[r * channels + c];
    record[((long long)slot * record_rows + i) * channels + c] = w[K - 1];
    y[r * channels + c] = silu_f(conv_window<K>(w, kernel, channels, c));
    conv_shift<K>(w);
  }
}

// The first counts[n] recorded rows of lane n (record[slot, i, c], as conv_verify wrote them)
// through the conv step with SiLU: y[n * record_rows + i, c] for i < counts[n] (later rows
// are not written), and conv_states[slot] left holding the last K-1 inputs.
template <int K>
__global__ void conv_commit(const float* __restrict__ record, int record_rows,
                            const float* __restrict__ kernel, float* __restrict__ conv_states,
                            const int* __restrict__ slots, const int* __restrict__ counts,
                            int channels, float* __restrict__ y) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = blockIdx.y;
  if (c >= channels) return;
  const int slot = slots[n];
  const int count = min(max(counts[n], 0), record_rows);
  float* st = conv_states + ((long long)slot * channels + c) * (K - 1);
  float w[K];
#pragma unroll
  for (int t = 0; t < K - 1; ++t) w[t] = st[t];
  for (int i = 0; i < count; ++i) {
    w[K - 1] = record[((long long)slot * record_rows + i) * channels + c];
    y[((long long)n * record_rows + i) * channels + c] =
        silu_f(conv_window<K>(w, kernel, channels, c));
    conv_shift<K>(w);
  }
#pragma unroll
  for (int t = 0; t < K - 1; ++t) st[t] = w[t];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Columns of the state per block (one per thread of a warp).
#define GDN_COLS 32

// The block shape of the delta-rule kernels for key head size DK, and their shared memory.
template <int DK>
struct GdnTile {
  static constexpr int WARPS = DK < 32 ? 1 : DK / 32;
  static constexpr int ROWS = DK / WARPS;
  static constexpr int THREADS = DK < 32 ? 32 : DK;
  float qs[DK], ks[DK], part[WARPS][GDN_COLS], sums[2][WARPS];
};

// One block per (column tile of 32, value head h, lane n); its WARPS = max(DK / 32, 1)
// warps split the DK rows. Thread (w, j) keeps rows [w * ROWS, (w + 1) * ROWS) of state
// column j in registers, so each state element is read and written exactly once (the step
// is bound by state bandwidth); loads are coalesced since j is the contiguous axis. The two
// column sums (k.S and q.S) are reduced over the warps through shared memory.
//
// gdn_token is one token on those registers: row is the token's [q | k | v] conv output
// (q and k of key head hk are l2-normalised here, q also scaled by DK^-1/2), g its log-decay
// and beta its write strength for value head h. s is decayed and updated; the return value
// is column j of the output (in every thread); STORE also writes s back to S as it goes
// (gdn_step: the rows' stores overlap the output sum). CHANNEL: one log-decay a key channel
// (Kimi Delta Attention), the DK values at gc, instead of g. Every thread of the block must
// call it (it holds barriers); threads with j >= dv (inactive) take part with zeros.
template <int DK, bool STORE = false, bool CHANNEL = false>
__device__ __forceinline__ float gdn_token(GdnTile<DK>& sh, float (&s)[GdnTile<DK>::ROWS],
                                           const float* __restrict__ row, float g, float beta,
                                           int key_heads, int hk, int h, int dv, int j,
                                           bool active, float* __restrict__ S = nullptr,
                                           const float* __restrict__ gc = nullptr) {
  constexpr int WARPS = GdnTile<DK>::WARPS;
  constexpr int ROWS = GdnTile<DK>::ROWS;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;

  // l2-normalise q and k of the key head into shared memory (thread t holds element t)
  const int t = threadIdx.x;
  const float qt = t < DK ? row[hk * DK + t] : 0.0f;
  const float kt = t < DK ? row[(key_heads + hk) * DK + t] : 0.0f;
  const float qq = warp_sum(qt * qt), kk = warp_sum(kt * kt);
  if (lane == 0) {
    sh.sums[0][w] = qq;
    sh.sums[1][w] = kk;
  }
  __syncthreads();
  float q_sq = 0.0f, k_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) {
    q_sq += sh.sums[0][i];
    k_sq += sh.sums[1][i];
  }
  if (t < DK) {
    sh.qs[t] = qt / sqrtf(q_sq + 1e-6f) * (1.0f / sqrtf((float)DK));
    sh.ks[t] = kt / sqrtf(k_sq + 1e-6f);
  }
  __syncthreads();

  const float decay = CHANNEL ? 0.0f : expf(g);
  const float* kw = sh.ks + w * ROWS;
  const float* qw = sh.qs + w * ROWS;
  float recalled = 0.0f;
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    s[i] *= CHANNEL ? expf(gc[w * ROWS + i]) : decay;
    recalled += s[i] * kw[i];
  }
  if (WARPS > 1) {
    sh.part[w][lane] = recalled;
    __syncthreads();
    recalled = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) recalled += sh.part[i][lane];
    __syncthreads();  // part is reused below
  }
  const float delta = active ? beta * (row[2 * key_heads * DK + h * dv + j] - recalled) : 0.0f;
  float out = 0.0f;
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    s[i] += kw[i] * delta;
    if (STORE && active) S[(long long)i * dv] = s[i];
    out += s[i] * qw[i];
  }
  if (WARPS > 1) {
    sh.part[w][lane] = out;
    __syncthreads();
    out = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) out += sh.part[i][lane];
  }
  // the next token's first writes to shared memory (sums, qs/ks, part) come after barriers
  // that every thread reaches only once it has read this token's values
  return out;
}

// Where this thread's rows of state column j of (slot, value head h) start in states
// [S, Hv, DK, dv] (rows dv apart); load and store move them (zeros where inactive).
template <int DK>
__device__ __forceinline__ long long gdn_tile_offset(int slot, int value_heads, int h, int dv,
                                                     int j) {
  const int w = threadIdx.x / 32;
  return (((long long)slot * value_heads + h) * DK + w * GdnTile<DK>::ROWS) * dv + j;
}

template <int DK>
__device__ __forceinline__ void gdn_tile_load(float (&s)[GdnTile<DK>::ROWS],
                                              const float* __restrict__ S, int dv, bool active) {
#pragma unroll
  for (int i = 0; i < GdnTile<DK>::ROWS; ++i) s[i] = active ? S[(long long)i * dv] : 0.0f;
}

template <int DK>
__device__ __forceinline__ void gdn_tile_store(const float (&s)[GdnTile<DK>::ROWS],
                                               float* __restrict__ S, int dv, bool active) {
  if (!active) return;
#pragma unroll
  for (int i = 0; i < GdnTile<DK>::ROWS; ++i) S[(long long)i * dv] = s[i];
}

// One token a lane on its state tile (gdn_step, kda_step): qkv [N, 2*Hk*DK + Hv*dv] =
// [q | k | v]; beta [N, Hv]; g [N, Hv], or with CHANNEL [N, Hv, DK] (a decay a key channel);
// states [S, Hv, DK, dv]; o [N, Hv, dv].
template <int DK, bool CHANNEL>
__device__ __forceinline__ void step_lanes(const float* __restrict__ qkv,
                                           const float* __restrict__ g,
                                           const float* __restrict__ beta,
                                           float* __restrict__ states,
                                           const int* __restrict__ slots, int key_heads,
                                           int value_heads, int dv, float* __restrict__ o) {
  __shared__ GdnTile<DK> sh;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int j = blockIdx.x * GDN_COLS + lane;
  const int h = blockIdx.y, n = blockIdx.z;
  const int hk = h / (value_heads / key_heads);
  const bool active = j < dv;  // inactive threads still take part in the barriers
  const int nh = n * value_heads + h;
  float* S = states + gdn_tile_offset<DK>(slots[n], value_heads, h, dv, j);

  // the state loads go first: they do not depend on the normalisation in gdn_token
  float s[GdnTile<DK>::ROWS];
  gdn_tile_load<DK>(s, S, dv, active);
  const float* row = qkv + (long long)n * (2 * key_heads * DK + value_heads * dv);
  const float out = gdn_token<DK, true, CHANNEL>(
      sh, s, row, CHANNEL ? 0.0f : g[nh], beta[nh], key_heads, hk, h, dv, j, active, S,
      CHANNEL ? g + (long long)nh * DK : nullptr);
  if (active && w == 0) o[(long long)nh * dv + j] = out;
}

template <int DK>
__global__ void __launch_bounds__(GdnTile<DK>::THREADS)
    gdn_step(const float* __restrict__ qkv, const float* __restrict__ g,
             const float* __restrict__ beta, float* __restrict__ states,
             const int* __restrict__ slots, int key_heads, int value_heads, int dv,
             float* __restrict__ o) {
  step_lanes<DK, false>(qkv, g, beta, states, slots, key_heads, value_heads, dv, o);
}

// gdn_step with one log-decay a key channel (Kimi Delta Attention): g [N, Hv, DK] (query,
// key and value heads alike in KDA; the kernel takes any grouping as gdn_step does).
template <int DK>
__global__ void __launch_bounds__(GdnTile<DK>::THREADS)
    kda_step(const float* __restrict__ qkv, const float* __restrict__ g,
             const float* __restrict__ beta, float* __restrict__ states,
             const int* __restrict__ slots, int key_heads, int value_heads, int dv,
             float* __restrict__ o) {
  step_lanes<DK, true>(qkv, g, beta, states, slots, key_heads, value_heads, dv, o);
}

// gdn_step for T tokens per lane (rows n*T .. n*T+T-1 of qkv, g, beta and o are lane n's),
// the state tile loaded once and never stored. Each row's g and beta are recorded,
// record_g/record_beta[slot, i, h] ([S, record_rows, Hv], GdnDrafts.g / .beta).
template <int DK>
__global__ void __launch_bounds__(GdnTile<DK>::THREADS)
    gdn_verify(const float* __restrict__ qkv, const float* __restrict__ g,
               const float* __restrict__ beta, const float* __restrict__ states,
               const int* __restrict__ slots, int key_heads, int value_heads, int dv, int tokens,
               float* __restrict__ o, float* __restrict__ record_g,
               float* __restrict__ record_beta, int record_rows) {
  __shared__ GdnTile<DK> sh;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int j = blockIdx.x * GDN_COLS + lane;
  const int h = blockIdx.y, n = blockIdx.z;
  const int hk = h / (value_heads / key_heads);
  const bool active = j < dv;
  const int slot = slots[n];
  const int width = 2 * key_heads * DK + value_heads * dv;

  float s[GdnTile<DK>::ROWS];
  gdn_tile_load<DK>(s, states + gdn_tile_offset<DK>(slot, value_heads, h, dv, j), dv, active);
  for (int i = 0; i < tokens; ++i) {
    const long long r = (long long)n * tokens + i;
    const long long rh = r * value_heads + h;
    const float out =
        gdn_token<DK>(sh, s, qkv + r * width, g[rh], beta[rh], key_heads, hk, h, dv, j, active);
    if (active && w == 0) o[rh * dv + j] = out;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      const long long kept = ((long long)slot * record_rows + i) * value_heads + h;
      record_g[kept] = g[rh];
      record_beta[kept] = beta[rh];
    }
  }
}

// The first counts[n] recorded tokens of lane n folded into its state: qkv holds their conv
// outputs (rows n*record_rows + i, as conv_commit wrote them), g and beta come from the
// records [S, record_rows, Hv] gdn_verify wrote.
template <int DK>
__global__ void __launch_bounds__(GdnTile<DK>::THREADS)
    gdn_commit(const float* __restrict__ qkv, const float* __restrict__ record_g,
               const float* __restrict__ record_beta, int record_rows,
               float* __restrict__ states, const int* __restrict__ slots,
               const int* __restrict__ counts, int key_heads, int value_heads, int dv) {
  __shared__ GdnTile<DK> sh;
  const int lane = threadIdx.x % 32;
  const int j = blockIdx.x * GDN_COLS + lane;
  const int h = blockIdx.y, n = blockIdx.z;
  const int hk = h / (value_heads / key_heads);
  const bool active = j < dv;
  const int slot = slots[n];
  const int count = min(max(counts[n], 0), record_rows);  // the same for the whole block
  const int width = 2 * key_heads * DK + value_heads * dv;
  float* S = states + gdn_tile_offset<DK>(slot, value_heads, h, dv, j);

  float s[GdnTile<DK>::ROWS];
  gdn_tile_load<DK>(s, S, dv, active);
  for (int i = 0; i < count; ++i) {
    const long long r = (long long)n * record_rows + i;
    const long long kept = ((long long)slot * record_rows + i) * value_heads + h;
    gdn_token<DK>(sh, s, qkv + r * width, record_g[kept], record_beta[kept], key_heads, hk, h,
                  dv, j, active);
  }
  gdn_tile_store<DK>(s, S, dv, active);
}
