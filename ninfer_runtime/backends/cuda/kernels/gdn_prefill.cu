// Gated DeltaNet prefill of one or more lanes' rows (ops/delta_rule/reference.py), each lane a
// segment of consecutive rows with its own states (a slot of the state arrays): the convolution
// and the split into heads (gdn_prefill_conv, a block per 8 tokens and slice of channels),
// then the delta rule in the chunked form (reference.py chunk), chunks of GC = 64 tokens, in three launches:
//
//   gdn_chunk_prepare  (chunk, value head): everything that does not depend on the carried
//       state. γ = cumsum(g) inside the chunk, D_ij = exp(γ_i - γ_j); A = β (k kᵀ) ⊙ D strictly
//       below the diagonal and QK = (q kᵀ) ⊙ D on and below it (both products on tensor
//       cores in 3xTF32); then [u | w] from the unit lower-triangular system
//       (I + A) [u | w] = [β v | β e^γ k], by forward substitution (each thread owns whole
//       columns in registers, so the substitution needs no barrier).
//   gdn_chunk_states   (32 state columns, value head, segment): the segment's chunks in order,
//       from its slot's state, the state S in registers. Writes the state each chunk starts from, v_new = u - w S, and then
//       S <- e^{γ_last} S + kᵀ (e^{γ_last - γ} ⊙ v_new), both products on tensor cores in
//       3xTF32 (about float32), the next chunk's inputs copied in by cp.async meanwhile.
//   gdn_chunk_output   (chunk, value head, 64 columns): out = e^γ ⊙ (q S) + QK v_new, on
//       tensor cores in 3xTF32.
//
// Layouts: q, k [T, Hk, DK] (value head h reads key head h / (Hv / Hk)), v [T, Hv, dv],
// g, beta [T, Hv]; workspaces u [n, Hv, GC, dv], w [n, Hv, GC, DK], qk [n, Hv, GC, GC],
// gam [n, Hv, GC], starts [n, Hv, DK, dv], vnew [n, Hv, GC, dv]; states [slots, Hv, DK, dv].
// Chunks never straddle two segments: `chunks` [n] holds each one's first row and row count,
// `segments` each segment's chunks (first, end) and slot, so one launch serves every lane
// of a packed prefill. A chunk's rows past its count read as zero tokens (g = β = 0, k = 0:
// they neither decay nor write). Every product (the preparation's k kᵀ and q kᵀ, the other two
// kernels' all) runs 3xTF32 on the tensor cores (about float32); the forward substitution
// float32 on the CUDA cores; dv is a multiple of 4 and every array 16-byte aligned.
// Built after gdn.cu (silu_f, warp_sum).

// A gdn_prefill_conv block's tokens and threads (CONV_TOKENS and CONV_THREADS in
// cuda/gdn_prefill.py)
#define GDN_CONV_TOKENS 8
#define GDN_CONV_THREADS 256

template <int VEC>
__device__ __forceinline__ void conv_load(const float* p, float (&x)[VEC]) {
  if constexpr (VEC == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    x[0] = a.x;
    x[1] = a.y;
    x[2] = a.z;
    x[3] = a.w;
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) x[e] = p[e];
  }
}

template <int VEC>
__device__ __forceinline__ void conv_store(float* p, const float (&x)[VEC]) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) p[e] = x[e];
  }
}

// The tile of rows tiles[blockIdx.x] = (first row t0, rows n <= GDN_CONV_TOKENS, its segment's
// first row, its slot) and the channels [c0, c0 + slice) of [q | k | v], c0 = slice blockIdx.y
// (slice a multiple of key_dim, so no key head straddles two blocks): the depthwise
// convolution of each token over the window of K inputs ending at it (inputs before the
// segment's first row come from its slot of conv_states [slots, C, K-1], read only), SiLU, then q and k l2-normalised per key head (q also scaled by key_dim^-1/2)
// and everything written out by head. A thread takes VEC adjacent channels (VEC = 4: float4
// loads and stores, every row and pointer 16-byte aligned) and loads their K taps and the
// tile's GDN_CONV_TOKENS + K - 1 inputs once. mixed rows are row_stride floats apart (the
// channels first); kernel [K, C]. Dynamic shared memory: GDN_CONV_TOKENS * slice floats (the
// q and k channels, until their norms are known).
template <int K, int VEC>
__global__ void __launch_bounds__(GDN_CONV_THREADS, 3)  // three blocks an SM: 85 registers
    gdn_prefill_conv(const float* __restrict__ mixed, long long row_stride,
                     const float* __restrict__ kernel, const float* __restrict__ conv_states,
                     const int4* __restrict__ tiles, int key_heads, int key_dim,
                     int value_width, int slice, float* __restrict__ q, float* __restrict__ k,
                     float* __restrict__ v) {
  constexpr int TT = GDN_CONV_TOKENS, W = TT + K - 1;
  extern __shared__ float4 smem4[];
  float* rows = reinterpret_cast<float*>(smem4);  // [TT][slice]
  const int4 tile = tiles[blockIdx.x];
  const int t0 = tile.x, n = tile.y, first = tile.z;
  const int key_width = key_heads * key_dim, qk_width = 2 * key_width;
  const int channels = qk_width + value_width;
  const float* conv_state = conv_states + (long long)tile.w * channels * (K - 1);
  const int c0 = blockIdx.y * slice, c1 = min(c0 + slice, channels);
  for (int c = c0 + VEC * threadIdx.x; c < c1; c += VEC * blockDim.x) {
    float taps[K][VEC], x[W][VEC];
#pragma unroll
    for (int j = 0; j < K; ++j) conv_load<VEC>(kernel + j * channels + c, taps[j]);
#pragma unroll
    for (int i = 0; i < W; ++i) {  // x[i]: input t0 - (K - 1) + i
      const int s = t0 - (K - 1) + i;
      if (s < first) {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          x[i][e] = conv_state[(c + e) * (K - 1) + (K - 1) + (s - first)];
      } else if (s < t0 + n) {
        conv_load<VEC>(mixed + s * row_stride + c, x[i]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) x[i][e] = 0.0f;
      }
    }
#pragma unroll
    for (int tt = 0; tt < TT; ++tt) {
      if (tt >= n) break;
      float y[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < K; ++j) acc += taps[j][e] * x[tt + j][e];  // input t - (K - 1) + j
        y[e] = silu_f(acc);
      }
      if (c < qk_width)
        conv_store<VEC>(rows + tt * slice + (c - c0), y);
      else
        conv_store<VEC>(v + (long long)(t0 + tt) * value_width + (c - qk_width), y);
    }
  }
  __syncthreads();
  // a warp per (token, key head) of the slice
  const int heads = qk_width > c0 ? (min(c1, qk_width) - c0) / key_dim : 0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int p = warp; p < n * heads; p += warps) {
    const int tt = p / heads, head = c0 / key_dim + p % heads;
    const float* src = rows + tt * slice + (head * key_dim - c0);
    float sq = 0.0f;
    for (int d = lane; d < key_dim; d += 32) sq += src[d] * src[d];
    sq = warp_sum(sq);
    const bool is_q = head < key_heads;
    const float scale = is_q ? 1.0f / sqrtf((float)key_dim) : 1.0f;
    const long long t = t0 + tt;
    float* dst = (is_q ? q + t * key_width + head * key_dim
                       : k + t * key_width + (head - key_heads) * key_dim);
    const float inv = 1.0f / sqrtf(sq + 1e-6f);
    for (int d = VEC * lane; d < key_dim; d += 32 * VEC) {
      float y[VEC];
      conv_load<VEC>(src + d, y);
#pragma unroll
      for (int e = 0; e < VEC; ++e) y[e] = y[e] * inv * scale;
      conv_store<VEC>(dst + d, y);
    }
  }
}

#define GC 64
#define GDN_CHUNK_THREADS 256

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void fma4(float4& acc, float a, float4 b) {
  acc.x = fmaf(a, b.x, acc.x);
  acc.y = fmaf(a, b.y, acc.y);
  acc.z = fmaf(a, b.z, acc.z);
  acc.w = fmaf(a, b.w, acc.w);
}

// d += a b to about float32 on TF32 tensor cores: a = ah + al, b = bh + bl, the al bl term
// dropped, small terms first (fragments as mma_tf32 takes them)
__device__ __forceinline__ void mma_tf32x3(float (&d)[4], const float (&a)[4], float b0,
                                           float b1) {
  u32 ah[4], al[4], bh0, bl0, bh1, bl1;
#pragma unroll
  for (int i = 0; i < 4; ++i) tf32_split(a[i], ah[i], al[i]);
  tf32_split(b0, bh0, bl0);
  tf32_split(b1, bh1, bl1);
  mma_tf32(d, al, bh0, bh1);
  mma_tf32(d, ah, bl0, bl1);
  mma_tf32(d, ah, bh0, bh1);
}

template <int DK>
struct GdnChunk {
  static constexpr int KP = DK + 4;  // row stride (floats) of [GC][DK] tiles
  static constexpr int CP = GC + 4;  // row stride of [.][GC] tiles
  static constexpr int TP = GC + 8;  // of the prepare's kT, qT: read by column in fragments
  static constexpr int SC = 32;      // state columns of a gdn_chunk_states block
  // its row strides: the mma fragments read rows tig (k) or g (w) apart, so 8 mod 32 words
  // for the tiles read by column (k, state, values) and 4 for w, read by row
  static constexpr int SP = SC + 8;
  static constexpr int SKP = DK + 8;
  static constexpr int OC = 64;      // output columns of a gdn_chunk_output block
  static constexpr int OP = OC + 8;  // read by column in the mma fragments, as SP
};

template <int DK>
__global__ void __launch_bounds__(GDN_CHUNK_THREADS, 2)  // two blocks an SM: 128 registers
    gdn_chunk_prepare(const float* __restrict__ q, const float* __restrict__ k,
                      const float* __restrict__ v, const float* __restrict__ g,
                      const float* __restrict__ beta, const int2* __restrict__ chunks,
                      int key_heads, int value_heads, int dv, float* __restrict__ u,
                      float* __restrict__ w,
                      float* __restrict__ qk, float* __restrict__ gam) {
  using G = GdnChunk<DK>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* gs = smem;                 // [GC] γ
  float* bs = gs + GC;              // [GC] β
  float* as = bs + GC;              // [GC][GC + 4] A
  float* big = as + GC * G::CP;     // kT, qT [DK][TP]; later X [GC][width + 1]
  float* kT = big;
  float* qT = big + DK * G::TP;
  const int chunk = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int hk = h / (value_heads / key_heads);
  const int t0 = chunks[chunk].x, rows = chunks[chunk].y;
  const long long head = (long long)chunk * value_heads + h;

  if (tid < GC) {
    const bool in = tid < rows;
    gs[tid] = in ? g[(long long)(t0 + tid) * value_heads + h] : 0.0f;
    bs[tid] = in ? beta[(long long)(t0 + tid) * value_heads + h] : 0.0f;
  }
#pragma unroll 8
  for (int e = tid; e < GC * DK; e += GDN_CHUNK_THREADS) {
    const int i = e / DK, d = e % DK;
    const bool in = i < rows;
    const long long src = ((long long)(t0 + i) * key_heads + hk) * DK + d;
    kT[d * G::TP + i] = in ? k[src] : 0.0f;
    qT[d * G::TP + i] = in ? q[src] : 0.0f;
  }
  __syncthreads();
  if (tid < 32) {  // inclusive prefix sum: lane l holds tokens 2l, 2l + 1 (GC = 64)
    const float a = gs[2 * tid], pair = a + gs[2 * tid + 1];
    float run = pair;
#pragma unroll
    for (int step = 1; step < 32; step *= 2) {
      const float before = __shfl_up_sync(0xFFFFFFFFu, run, step);
      if (tid >= step) run += before;
    }
    const float before = __shfl_up_sync(0xFFFFFFFFu, run, 1);  // the pairs before this one
    gs[2 * tid] = (tid ? before : 0.0f) + a;
    gs[2 * tid + 1] = run;
  }
  __syncthreads();

  {  // k kᵀ and q kᵀ on tensor cores (3xTF32): warp w takes rows 16 (w / 2) .. and the
     // column tiles 4 (w % 2) .. + 3 of both; then A and QK from each lane's own entries
    const int warp = tid >> 5, g = (tid & 31) >> 2, tig = tid & 3;
    const int mt = warp >> 1, nb = 4 * (warp & 1);
    float kk[4][4] = {}, qq[4][4] = {};
#pragma unroll 4
    for (int c = 0; c < DK / 8; ++c) {
      const float* k0 = kT + (8 * c + tig) * G::TP + 16 * mt + g;
      const float* q0 = qT + (8 * c + tig) * G::TP + 16 * mt + g;
      const float ak[4] = {k0[0], k0[8], k0[4 * G::TP], k0[4 * G::TP + 8]};
      const float aq[4] = {q0[0], q0[8], q0[4 * G::TP], q0[4 * G::TP + 8]};
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float* b = kT + (8 * c + tig) * G::TP + 8 * (nb + n) + g;
        mma_tf32x3(kk[n], ak, b[0], b[4 * G::TP]);
        mma_tf32x3(qq[n], aq, b[0], b[4 * G::TP]);
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows g and g + 8 of the tile: two adjacent columns each
        const int i = 16 * mt + g + 8 * h, j = 8 * (nb + n) + 2 * tig;
        float out[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = j + e;
          const float decay = col <= i ? expf(gs[i] - gs[col]) : 0.0f;
          as[i * G::CP + col] = col < i ? bs[i] * kk[n][2 * h + e] * decay : 0.0f;
          out[e] = col <= i ? qq[n][2 * h + e] * decay : 0.0f;
        }
        *reinterpret_cast<float2*>(qk + (head * GC + i) * GC + j) = make_float2(out[0], out[1]);
      }
  }
  __syncthreads();  // kT and qT are no longer read: X takes their place

  const int width = dv + DK, xs = width + 1;
  float* X = big;
#pragma unroll 8
  for (int e = tid; e < GC * width; e += GDN_CHUNK_THREADS) {
    const int i = e / width, c = e % width;
    float x = 0.0f;
    if (i < rows) {
      const long long t = t0 + i;
      x = c < dv ? bs[i] * v[(t * value_heads + h) * dv + c]
                 : bs[i] * expf(gs[i]) * k[(t * key_heads + hk) * DK + (c - dv)];
    }
    X[i * xs + c] = x;
  }
  __syncthreads();
  // forward substitution down a column held in registers, row j folded into every later row
  // once it is final: each row gets its terms in the order j = 0, 1, ... (as a row-by-row
  // solve would), but the rows' updates are independent, so the FMAs do not wait on one
  // another (padding rows are zeros and stay so)
  for (int c = tid; c < width; c += GDN_CHUNK_THREADS) {
    float x[GC];
#pragma unroll
    for (int i = 0; i < GC; ++i) x[i] = X[i * xs + c];
#pragma unroll
    for (int j = 0; j < GC - 1; ++j)
#pragma unroll
      for (int i = j + 1; i < GC; ++i) x[i] = fmaf(-as[i * G::CP + j], x[j], x[i]);
#pragma unroll
    for (int i = 0; i < GC; ++i) X[i * xs + c] = x[i];
  }
  __syncthreads();
#pragma unroll 8
  for (int e = tid; e < GC * width; e += GDN_CHUNK_THREADS) {
    const int i = e / width, c = e % width;
    const float x = X[i * xs + c];
    if (c < dv) {
      u[(head * GC + i) * dv + c] = x;
    } else {
      w[(head * GC + i) * DK + (c - dv)] = x;
    }
  }
  if (tid < GC) gam[head * GC + tid] = gs[tid];
}

// Both products of a chunk on tensor cores (3xTF32): v_new [GC x 32] = u - w S as 16 tiles
// of 16 x 8, two per warp; S [DK x 32] += kᵀ (...) as DK / 4 tiles, each warp keeping its
// tiles of S in registers across the chunks (DK = 16: warps 4-7 hold none).
// The next chunk's inputs are copied by cp.async while this one's products run, each into
// the tile its last reader has finished with: w, u (and γ, double-buffered: the state update
// still reads this chunk's) once v_new is made, k once the state is updated. Two commit
// groups a chunk, in the order they are waited on: [w, u, γ], then [k].
template <int DK>
__global__ void __launch_bounds__(GDN_CHUNK_THREADS)
    gdn_chunk_states(const float* __restrict__ k, const float* __restrict__ u,
                     const float* __restrict__ w, const float* __restrict__ gam,
                     const int2* __restrict__ chunks, const int4* __restrict__ segments,
                     int key_heads, int value_heads, int dv, float* __restrict__ states,
                     float* __restrict__ starts, float* __restrict__ vnew) {
  using G = GdnChunk<DK>;
  constexpr int GROUPS = G::SC / 4;  // float4 columns
  constexpr int TILES = DK / 16 * (G::SC / 8), PER_WARP = TILES >= 8 ? TILES / 8 : 1;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* ws = smem;                // [GC][KP] w
  float* ks = ws + GC * G::KP;     // [GC][SKP] k
  float* ss = ks + GC * G::SKP;    // [DK][SP] the chunk's starting state, columns c0 ..
  float* us = ss + DK * G::SP;     // [GC][SP] u
  float* vs = us + GC * G::SP;     // [GC][SP] e^{γ_last - γ} ⊙ v_new
  float* gs = vs + GC * G::SP;     // [2][GC] γ, by chunk parity
  const int h = blockIdx.y, c0 = blockIdx.x * G::SC, tid = threadIdx.x;
  const int warp = tid >> 5, g = (tid & 31) >> 2, tig = tid & 3;
  const int hk = h / (value_heads / key_heads);
  const int4 segment = segments[blockIdx.z];  // its chunks [x, y), its slot z
  float* st = states + ((long long)segment.z * value_heads + h) * DK * dv;
  const bool holds = warp * PER_WARP < TILES;

  const auto copy_wu = [&](int chunk) {  // w, u and γ of a chunk
    const long long head = (long long)chunk * value_heads + h;
#pragma unroll
    for (int e = tid; e < GC * (DK / 4); e += GDN_CHUNK_THREADS) {
      const int i = e / (DK / 4), d = 4 * (e % (DK / 4));
      cp_async16(ws + i * G::KP + d, w + (head * GC + i) * DK + d, true);
    }
#pragma unroll
    for (int e = tid; e < GC * GROUPS; e += GDN_CHUNK_THREADS) {
      const int i = e / GROUPS, col = c0 + 4 * (e % GROUPS);
      cp_async16(us + i * G::SP + 4 * (e % GROUPS), u + (head * GC + i) * dv + min(col, dv - 4),
                 col < dv);
    }
    if (tid < GC / 4) cp_async16(gs + (chunk & 1) * GC + 4 * tid, gam + head * GC + 4 * tid, true);
    cp_commit();
  };
  const auto copy_k = [&](int chunk) {  // k of a chunk (zeros past the last token)
    const int t0 = chunks[chunk].x, rows = chunks[chunk].y;
#pragma unroll
    for (int e = tid; e < GC * (DK / 4); e += GDN_CHUNK_THREADS) {
      const int i = e / (DK / 4), d = 4 * (e % (DK / 4));
      const int t = t0 + min(i, rows - 1);
      cp_async16(ks + i * G::SKP + d, k + ((long long)t * key_heads + hk) * DK + d, i < rows);
    }
    cp_commit();
  };

  // element e of the warp's state tile j: row 16 (t / 4) + g + 8 (e / 2), column
  // 8 (t % 4) + 2 tig + e % 2 of the block's columns, t = warp * PER_WARP + j
  auto s_row = [&](int j, int e) { return 16 * ((warp * PER_WARP + j) / 4) + g + 8 * (e >> 1); };
  auto s_col = [&](int j, int e) { return 8 * ((warp * PER_WARP + j) % 4) + 2 * tig + (e & 1); };
  float s[PER_WARP][4];
#pragma unroll
  for (int j = 0; j < PER_WARP; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = c0 + s_col(j, e);
      s[j][e] = holds && col < dv ? st[(long long)s_row(j, e) * dv + col] : 0.0f;
    }
  copy_wu(segment.x);
  copy_k(segment.x);
  for (int chunk = segment.x; chunk < segment.y; ++chunk) {
    const long long head = (long long)chunk * value_heads + h;
    const float* gc = gs + (chunk & 1) * GC;
    if (holds) {
#pragma unroll
      for (int j = 0; j < PER_WARP; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = s_row(j, e), col = s_col(j, e);
          ss[row * G::SP + col] = s[j][e];
          if (c0 + col < dv) starts[(head * DK + row) * dv + c0 + col] = s[j][e];
        }
    }
    cp_wait<1>();  // this chunk's w, u, γ (its k may still be in flight)
    __syncthreads();

    {  // v_new = u - w S: warp's rows 16 mt .., column tiles nb and nb + 1
      const int mt = warp >> 1, nb = 2 * (warp & 1);
      float acc[2][4] = {};
#pragma unroll 4
      for (int kk = 0; kk < DK / 8; ++kk) {
        const float* w0 = ws + (16 * mt + g) * G::KP + 8 * kk + tig;
        const float a[4] = {w0[0], w0[8 * G::KP], w0[4], w0[8 * G::KP + 4]};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float* b = ss + (8 * kk + tig) * G::SP + 8 * (nb + n) + g;
          mma_tf32x3(acc[n], a, b[0], b[4 * G::SP]);
        }
      }
      const float last = gc[GC - 1];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = 16 * mt + g + 8 * (e >> 1), col = 8 * (nb + n) + 2 * tig + (e & 1);
          const float x = us[row * G::SP + col] - acc[n][e];
          if (c0 + col < dv) vnew[(head * GC + row) * dv + c0 + col] = x;
          vs[row * G::SP + col] = x * expf(last - gc[row]);
        }
    }
    __syncthreads();  // w, u and the other γ buffer are free: the next chunk's come in
    if (chunk + 1 < segment.y) {
      copy_wu(chunk + 1);
      cp_wait<1>();  // this chunk's k
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (holds) {  // S <- e^{γ_last} S + kᵀ vs
      const float decay = expf(gc[GC - 1]);
#pragma unroll
      for (int j = 0; j < PER_WARP; ++j) {
        const int t = warp * PER_WARP + j, mt = t / 4, nt = t % 4;
        float acc[4] = {};
#pragma unroll 4
        for (int kk = 0; kk < GC / 8; ++kk) {
          const float* k0 = ks + (8 * kk + tig) * G::SKP + 16 * mt + g;
          const float a[4] = {k0[0], k0[8], k0[4 * G::SKP], k0[4 * G::SKP + 8]};
          const float* b = vs + (8 * kk + tig) * G::SP + 8 * nt + g;
          mma_tf32x3(acc, a, b[0], b[4 * G::SP]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = fmaf(s[j][e], decay, acc[e]);
      }
    }
    __syncthreads();  // k and vs are free
    if (chunk + 1 < segment.y) copy_k(chunk + 1);
  }
  if (holds) {
#pragma unroll
    for (int j = 0; j < PER_WARP; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = c0 + s_col(j, e);
        if (col < dv) st[(long long)s_row(j, e) * dv + col] = s[j][e];
      }
  }
}

template <int DK>
__global__ void __launch_bounds__(GDN_CHUNK_THREADS)
    gdn_chunk_output(const float* __restrict__ q, const float* __restrict__ qk,
                     const float* __restrict__ gam, const float* __restrict__ starts,
                     const float* __restrict__ vnew, const int2* __restrict__ chunks,
                     int key_heads, int value_heads, int dv, float* __restrict__ out) {
  using G = GdnChunk<DK>;
  constexpr int GROUPS = G::OC / 4;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* qs = smem;               // [GC][KP] e^γ ⊙ q
  float* ss = qs + GC * G::KP;    // [DK][OP] the chunk's starting state, columns c0 ..
  float* ds = ss + DK * G::OP;    // [GC][CP] QK
  float* vs = ds + GC * G::CP;    // [GC][OP] v_new
  const int chunk = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * G::OC, tid = threadIdx.x;
  const int hk = h / (value_heads / key_heads);
  const int t0 = chunks[chunk].x, rows = chunks[chunk].y;
  const long long head = (long long)chunk * value_heads + h;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

#pragma unroll
  for (int e = tid; e < GC * (DK / 4); e += GDN_CHUNK_THREADS) {
    const int i = e / (DK / 4), d = 4 * (e % (DK / 4));
    float4 x = zero;
    if (i < rows) {
      const float f = expf(gam[head * GC + i]);
      x = load4(q + ((long long)(t0 + i) * key_heads + hk) * DK + d);
      x = make_float4(x.x * f, x.y * f, x.z * f, x.w * f);
    }
    store4(qs + i * G::KP + d, x);
  }
#pragma unroll
  for (int e = tid; e < DK * GROUPS; e += GDN_CHUNK_THREADS) {
    const int d = e / GROUPS, col = c0 + 4 * (e % GROUPS);
    store4(ss + d * G::OP + 4 * (e % GROUPS),
           col < dv ? load4(starts + (head * DK + d) * dv + col) : zero);
  }
#pragma unroll
  for (int e = tid; e < GC * (GC / 4); e += GDN_CHUNK_THREADS) {
    const int i = e / (GC / 4), j = 4 * (e % (GC / 4));
    store4(ds + i * G::CP + j, load4(qk + (head * GC + i) * GC + j));
  }
#pragma unroll
  for (int e = tid; e < GC * GROUPS; e += GDN_CHUNK_THREADS) {
    const int i = e / GROUPS, col = c0 + 4 * (e % GROUPS);
    store4(vs + i * G::OP + 4 * (e % GROUPS),
           col < dv ? load4(vnew + (head * GC + i) * dv + col) : zero);
  }
  __syncthreads();

  // on tensor cores (3xTF32): 4 x 8 tiles of 16 x 8; warp w takes rows 16 mt .. (mt = w / 2)
  // and column tiles nb .. nb + 3 (nb = 4 (w % 2))
  const int warp = tid >> 5, g = (tid & 31) >> 2, tig = tid & 3;
  const int mt = warp >> 1, nb = 4 * (warp & 1);
  float acc[4][4] = {};
#pragma unroll 4
  for (int kk = 0; kk < DK / 8; ++kk) {  // e^γ q S
    const float* q0 = qs + (16 * mt + g) * G::KP + 8 * kk + tig;
    const float a[4] = {q0[0], q0[8 * G::KP], q0[4], q0[8 * G::KP + 4]};
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float* b = ss + (8 * kk + tig) * G::OP + 8 * (nb + n) + g;
      mma_tf32x3(acc[n], a, b[0], b[4 * G::OP]);
    }
  }
  for (int kk = 0; kk < 2 * mt + 2; ++kk) {  // QK v_new (QK is zero above the diagonal)
    const float* d0 = ds + (16 * mt + g) * G::CP + 8 * kk + tig;
    const float a[4] = {d0[0], d0[8 * G::CP], d0[4], d0[8 * G::CP + 4]};
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float* b = vs + (8 * kk + tig) * G::OP + 8 * (nb + n) + g;
      mma_tf32x3(acc[n], a, b[0], b[4 * G::OP]);
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const int col = c0 + 8 * (nb + n) + 2 * tig;  // and col + 1 (dv is even)
    if (col >= dv) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * mt + g + 8 * half;
      if (i < rows)
        *reinterpret_cast<float2*>(out + ((long long)(t0 + i) * value_heads + h) * dv + col) =
            make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
    }
  }
}
