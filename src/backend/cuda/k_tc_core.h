/* The TMA wgmma core's entry points that only the CUDA kernels use (k_tc_gemm.cu, k_tc_grouped.cu,
 * k_grouped_gemm.cu): which core the process runs, and the grouped expert GEMM on the TMA core. */
#ifndef DI_K_TC_CORE_H
#define DI_K_TC_CORE_H
#include "cuda_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif
/* di_cuk_tc_gemm_set_core's value: 0 mma.sync, 1 wgmma (cp.async), 2 wgmma (TMA), 3 hybrid (mma.sync tiles
 * at <= 8 rows, TMA above), 4 gemv (k_tc_gemv.cuh at <= 8 rows, TMA above): 3 and 4 are invariant only
 * because the kernels they mix are bit-equal, which test_cuda_tc_gemm checks */
int di_cuk_tc_gemm_core(void);
/* The same grouped product on the TMA wgmma core (k_tc_grouped.cu): what di_cuk_grouped_gemm runs for every
 * bm when di_cuk_tc_gemm_core() == 2 (3: bm > 16) and di_cuk_tc_grouped_ok (N % 256, K % 64); its own invariant arithmetic. */
int di_cuk_tc_grouped_ok(int N, int K, int lda, const void *A);
di_status di_cuk_tc_grouped_gemm(const uint16_t *A, int lda, const int32_t *a_rows, const uint16_t *W, int N, int K,
                                 const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
                                 int bm, void *C, int ldc, int c_f32, int glu, di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
