/* The batch-invariant mode's decode fusions (session 16, issue 19), each giving the unfused invariant
 * kernels' bits: the MoE combine inside the expert down projection (k_grouped_gemm.cu) and the MLA
 * preparation beside the query absorption (k_tc_gemm.cu). Kept out of cuda_kernels.h so that adding them
 * rebuilt a few files, not every kernel (fold them in there when that header next changes). */
#ifndef DI_K_INV_FUSIONS_H
#define DI_K_INV_FUSIONS_H
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
/* di_cuk_tc_gemm's product (y bf16, beta 0) with di_cuk_mla_prep(kva, ldk, q, ldq, positions, slots, T, H, Nn,
 * P, R, kv_norm, eps, rope, Qa, cache, kv_fp8) in the same launch, each bit for bit as the two calls give it
 * (the query absorption: X = q_nope, Y = Qa's latent columns; the preparation writes the others and the
 * cache). Only where di_cuk_tc_gemm_prep_ok: one 16-row tile, unsplit, on the mma.sync core's tiles. */
int di_cuk_tc_gemm_prep_ok(int M, int N, int K, int ldx, int ldw, int w_kn, const void *X, const void *W, int batch);
di_status di_cuk_tc_gemm_prep(int batch, int M, int N, int K, const uint16_t *X, int ldx, int64_t sx,
                              const uint16_t *W, int ldw, int64_t sw, int w_kn, uint16_t *Y, int ldy, int64_t sy,
                              const uint16_t *kva, int ldk, const uint16_t *q, int ldq, const int32_t *positions,
                              const int32_t *slots, int T, int H, int Nn, int P, int R, const float *kv_norm, float eps,
                              di_cuk_rope rope, uint16_t *Qa, void *cache, int kv_fp8, di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
