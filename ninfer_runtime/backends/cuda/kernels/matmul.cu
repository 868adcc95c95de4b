// Batched float32 products of two arrays, C[b] = A[b] B[b]: the products between activations
// (and small weight arrays) that a captured decode step needs, where a library's product
// cannot be recorded into a CUDA graph.
//
// A [outer, inner, M, K] and B [outer, inner, K, N] are read through element strides, so a
// transposed view is a swap of strides and a batch stride of 0 broadcasts one matrix over that
// batch axis; C is written contiguous [outer, inner, M, N] (grid z runs over outer x inner). A block computes a (16 TM) x 64 tile of C, stepping K by
// 16 with both operands' tiles staged in shared memory; each of its 256 threads keeps TM x 4
// float32 accumulators (rows ty*TM .., columns tx + 16 j: a warp's reads of B's tile are
// conflict-free and its writes of C coalesced). Each tile is loaded along whichever of its
// operand's axes is contiguous, so both orientations read whole sectors. TM = 1 serves the
// few-row products of a step (a lane's rows, a head's queries), TM = 4 the rest.

#define MATMUL_THREADS 256
#define MATMUL_BN 64
#define MATMUL_BK 16

template <int TM>
__global__ void __launch_bounds__(MATMUL_THREADS)
    matmul_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
               int M, int N, int K, long long a_outer, long long a_inner, long long a_row,
               long long a_col, long long b_outer, long long b_inner, long long b_row,
               long long b_col, int inner, int batch0) {
  constexpr int BM = 16 * TM;
  // +1: a column of either tile stored by consecutive threads lands in distinct banks
  __shared__ float as[MATMUL_BK][BM + 1];
  __shared__ float bs[MATMUL_BK][MATMUL_BN + 1];
  const long long batch = batch0 + (long long)blockIdx.z;
  const long long outer = batch / inner, in = batch % inner;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * MATMUL_BN;
  a += outer * a_outer + in * a_inner;
  b += outer * b_outer + in * b_inner;
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  float acc[TM][4];
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[r][j] = 0.f;

  for (int k0 = 0; k0 < K; k0 += MATMUL_BK) {
    for (int i = t; i < BM * MATMUL_BK; i += MATMUL_THREADS) {
      const int k = a_col == 1 ? i % MATMUL_BK : i / BM;
      const int m = a_col == 1 ? i / MATMUL_BK : i % BM;
      const int gm = m0 + m, gk = k0 + k;
      as[k][m] = gm < M && gk < K ? a[gm * a_row + gk * a_col] : 0.f;
    }
    for (int i = t; i < MATMUL_BK * MATMUL_BN; i += MATMUL_THREADS) {
      const int n = b_col == 1 ? i % MATMUL_BN : i / MATMUL_BK;
      const int k = b_col == 1 ? i / MATMUL_BN : i % MATMUL_BK;
      const int gk = k0 + k, gn = n0 + n;
      bs[k][n] = gk < K && gn < N ? b[gk * b_row + gn * b_col] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < MATMUL_BK; ++k) {
      float bv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[k][tx + 16 * j];
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        const float av = as[k][ty * TM + r];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[r][j] = fmaf(av, bv[j], acc[r][j]);
      }
    }
    __syncthreads();
  }
  float* out = c + batch * (long long)M * N;
#pragma unroll
  for (int r = 0; r < TM; ++r) {
    const int gm = m0 + ty * TM + r;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int gn = n0 + tx + 16 * j;
      if (gm < M && gn < N) out[(long long)gm * N + gn] = acc[r][j];
    }
  }
}
