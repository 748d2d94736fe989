/* C entry points of the CUDA backend's MXFP4 kernels (k_mxfp4_gemv.cu): E2M1 values two per byte
 * (column 2i in the low nibble), an E8M0 scale byte per 32 values of a row (DeepSeek-V4's routed
 * experts); W4A16 on the CUDA cores (Hopper has no FP4 tensor cores). Device pointers, no sync. */
#ifndef DI_CUDA_MXFP4_H
#define DI_CUDA_MXFP4_H
#include <stdint.h>
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif
typedef struct CUstream_st *di_cu_stream;
typedef struct di_cuk_mxfp4w {
  const uint8_t *q;     /* [N][K/2] (or [E][N][K/2]), rows ldq bytes apart (a multiple of 16) */
  const uint8_t *scale; /* E8M0 [N][lds] (per expert, back to back), lds >= K / 32 */
  int ldq, lds;
} di_cuk_mxfp4w;
/* Y[M][N] = X . dequant(W)^T (bf16 X; Y bf16 or f32), in passes of 8 rows; K % 32 == 0. */
di_status di_cuk_mxfp4_gemv(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_mxfp4w w, void *Y, int ldy,
                            int y_f32, di_cu_stream s);
/* The grouped form (tile lists as di_cuk_fp8_grouped_gemv; max_rows 1..8 sets the rows per pass). */
di_status di_cuk_mxfp4_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_mxfp4w w, int N, int K,
                                    const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                                    int max_tiles, int bm, int max_rows, void *C, int ldc, int c_f32, di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
