/* The split merge of the fixed-split MLA attention (issue 19), one piece of code for the kernels that
 * run it: mla_fixed_kernel and the combine kernel (k_mla_fixed.cu, CUDA cores) and the tensor-core form
 * (k_mla_fixed_tc.cu). A row's partials are merged in split order; written with __fmul_rn / __fadd_rn
 * so that no kernel's compilation can contract them into FMAs differently. */
#ifndef DI_K_MLA_FIXED_CUH
#define DI_K_MLA_FIXED_CUH
#include "cuda_common.cuh"

/* One split's partial (o normalized by its own sum, lse in log2 units) into the running state (M, W)
 * of a row: the factors a (old state) and c (the partial); the caller then does A = A * a + c * o per
 * column with fixed_acc. Only called for lse > -inf. */
static __device__ __forceinline__ void fixed_merge(float &M, float &W, float lse, float &a, float &c) {
  const float Mn = fmaxf(M, lse);
  a = exp2f(M - Mn); /* M = -inf (nothing merged yet) -> 0 */
  c = exp2f(lse - Mn);
  W = __fadd_rn(__fmul_rn(W, a), c);
  M = Mn;
}
static __device__ __forceinline__ float fixed_acc(float A, float a, float c, float o) {
  return __fadd_rn(__fmul_rn(A, a), __fmul_rn(c, o));
}
static __device__ __forceinline__ float fixed_inv(float x) { return x > 0.f ? __fdiv_rn(1.f, x) : 0.f; }
static __device__ __forceinline__ float fixed_lse(float m, float l) {
  return l > 0.f ? __fadd_rn(m, log2f(l)) : -INFINITY;
}
#endif
