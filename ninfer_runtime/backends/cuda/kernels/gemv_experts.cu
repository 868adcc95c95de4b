// Expert-indexed GEMV for mixture-of-experts decode, reusing gemv.cuh's driver and the layout
// policies. The policies live in gemv_row_split.cu, gemv_nvfp4.cu, gemv_fp8.cu and
// gemv_bf16.cu, so this family's translation unit is common.cuh + gemv.cuh + those four files
// + this one (moe.py extends compile.family_source for it); nothing is included here.
//
// Pair p = blockIdx.y of the N * k (token row, slot) pairs uses expert e = ids[p]:
//   y[p, r] = sum_k x[xrow(p), k] W_e[r, k]   for r < rows,
// where W_e is rows row0[e] .. row0[e] + rows - 1 of the resident object whose bytes start at
// device address base[e]. Every expert shares one geometry (off1, off2, stride, rpd, units),
// which holds for the experts of one layer whether stacked in one object or stored apart.
// xrow(p) = p / k for gate / up (x is [N, K]) and p for down (x is the per-pair [N * k, I]).
// blockIdx.x tiles the rows exactly as the plain GEMV does with M = 1.

#define DEFINE_GEMV_EXPERTS(NAME, POLICY)                                                   \
  template <int R, int KS>                                                                  \
  __global__ void __launch_bounds__(GEMV_WARPS * 32)                                        \
      NAME(const u64* __restrict__ base, const int* __restrict__ row0,                      \
           const int* __restrict__ ids, int k, int x_per_pair, long long off1,              \
           long long off2, int stride, int rpd, int rows, int units,                        \
           const float* __restrict__ x, int ldx, float* __restrict__ y, int ldy) {          \
    POLICY::setup();                                                                        \
    const int p = blockIdx.y;                                                               \
    const int e = __ldg(ids + p);                                                           \
    GemvArgs a{reinterpret_cast<const u8*>(__ldg(base + e)), off1, off2, stride, rpd};      \
    const float* xp = x + (long long)(x_per_pair ? p : p / k) * ldx;                       \
    gemv_driver<POLICY, 1, R, KS>(a, __ldg(row0 + e), rows, units, xp, ldx,                \
                                  y + (long long)p * ldy, ldy);                             \
  }

// Groups of M pairs of one expert (a prefill chunk's pairs sorted by expert, each expert's
// padded to a multiple of M with zero rows): group g = blockIdx.y uses expert
// group_expert[g] for the M consecutive rows g * M .. g * M + M - 1 of x and of y, so one
// weight load serves M pairs. rows of x are ldx apart, of y ldy apart. The grid covers the
// most groups a pass can have (its size known without reading the routing back): a group
// past the real ones has expert -1 and its blocks return at once.
#define DEFINE_GEMV_EXPERT_GROUPS(NAME, POLICY)                                             \
  template <int M, int R, int KS>                                                           \
  __global__ void __launch_bounds__(GEMV_WARPS * 32)                                        \
      NAME(const u64* __restrict__ base, const int* __restrict__ row0,                      \
           const int* __restrict__ group_expert, long long off1, long long off2, int stride, \
           int rpd, int rows, int units, const float* __restrict__ x, int ldx,              \
           float* __restrict__ y, int ldy) {                                                \
    POLICY::setup();                                                                        \
    const long long g = blockIdx.y;                                                         \
    const int e = __ldg(group_expert + g);                                                  \
    if (e < 0) return;                                                                      \
    GemvArgs a{reinterpret_cast<const u8*>(__ldg(base + e)), off1, off2, stride, rpd};      \
    gemv_driver<POLICY, M, R, KS>(a, __ldg(row0 + e), rows, units, x + g * M * ldx, ldx,    \
                                  y + g * M * ldy, ldy);                                    \
  }

DEFINE_GEMV_EXPERTS(gemv_experts_q4, RowSplitInt<4>)
DEFINE_GEMV_EXPERTS(gemv_experts_q5, RowSplitInt<5>)
DEFINE_GEMV_EXPERTS(gemv_experts_q6, RowSplitInt<6>)
DEFINE_GEMV_EXPERTS(gemv_experts_q8, RowSplitInt<8>)
DEFINE_GEMV_EXPERTS(gemv_experts_nf4, RowSplitNf4)
DEFINE_GEMV_EXPERTS(gemv_experts_nvfp4, Nvfp4)
DEFINE_GEMV_EXPERTS(gemv_experts_fp8, Fp8Row)
DEFINE_GEMV_EXPERTS(gemv_experts_bf16, Bf16Row)

DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_q4, RowSplitInt<4>)
DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_q5, RowSplitInt<5>)
DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_q6, RowSplitInt<6>)
DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_q8, RowSplitInt<8>)
DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_nf4, RowSplitNf4)
DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_nvfp4, Nvfp4)
DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_fp8, Fp8Row)
DEFINE_GEMV_EXPERT_GROUPS(gemv_expert_groups_bf16, Bf16Row)
