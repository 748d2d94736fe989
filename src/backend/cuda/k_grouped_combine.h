/* The invariant mode's MoE combine inside its expert down projection (k_grouped_gemm.cu; session 16).
 * Kept out of cuda_kernels.h so that adding it rebuilt two kernel files, not every one (fold it in there
 * when that header next changes). */
#ifndef DI_K_GROUPED_COMBINE_H
#define DI_K_GROUPED_COMBINE_H
#include "cuda_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif
/* The down projection (C f32, no glu, a_rows NULL, bm 16) of di_cuk_grouped_gemm with the MoE combine
 * in its last CTAs: y = the product (the same bits as di_cuk_grouped_gemm's), then
 * di_cuk_moe_combine(y, ldy, inv, w, T, k, n, h, norm_w, eps, xn, ldo)'s h and xn, bit for bit (norm_w
 * NULL: h only). cnt: N / 64 + 1 device int32 counters, zero before the call and left zero. Taken
 * only where di_cuk_grouped_gemm_combine_ok (the shapes di_cuk_grouped_gemm runs on its mma.sync kernel,
 * under the tensor-core core chosen now). */
#define DI_CUK_GG_COMBINE_MAX_N 8128 /* di_cuk_moe_combine's widest row */
int di_cuk_grouped_gemm_combine_ok(int N, int K, int lda, const void *A, int bm, int n, int k, int T);
di_status di_cuk_grouped_gemm_combine(const uint16_t *A, int lda, const uint16_t *W, int N, int K,
                                      const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                                      int max_tiles, int bm, float *y, int ldy, const int32_t *inv, const float *w,
                                      int T, int k, int n, float *h, const float *norm_w, float eps, uint16_t *xn,
                                      int ldo, int32_t *cnt, di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
