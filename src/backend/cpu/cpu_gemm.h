/* CPU matrix products against checkpoint weights: y[m][n - n0] = sum_k x[m][k] * W[n][k] for
 * n in [n0, n1), W stored as BF16 / F16 / F32 / FP8-E4M3 (block-scaled, F32 or E8M0 scales) / MXFP4
 * (E2M1 with E8M0 scales per 32) and dequantized in registers (AVX2 + FMA), accumulated in float32.
 *
 * Batch invariance: every output element is reduced in the same fixed order (8-lane partial sums
 * over k, then a fixed horizontal sum, then the scalar tail), whatever M, the tile it falls in, or
 * the thread that computes it. So a row's result never depends on what else is in the batch. */
#ifndef DI_CPU_GEMM_H
#define DI_CPU_GEMM_H
#include <stdint.h>
#include "model/weights.h"
#include "util/threadpool.h"

void di_cpu_gemm(di_threadpool *tp, const float *x, int64_t M, int64_t ldx, const di_weight *w, int64_t n0,
                 int64_t n1, float *y, int64_t ldy);
/* The whole product inside one task of a parallel loop over something else (rows of a batch): no
 * parallel loop of its own; `thread` is the task's thread index (its scratch holds the weight panel).
 * The same values as di_cpu_gemm. */
void di_cpu_gemm_in_task(di_threadpool *tp, int thread, const float *x, int64_t M, int64_t ldx, const di_weight *w,
                         int64_t n0, int64_t n1, float *y, int64_t ldy);
/* y[i] = x[i] . W^T over columns [0, N) for the rows i < M with want[i] != 0 (every row when want is
 * NULL); the other rows of y are left alone. x is scratch: the wanted rows are moved to its front.
 * The same values as di_cpu_gemm (the product of a row does not depend on the other rows). */
void di_cpu_gemm_selected(di_threadpool *tp, float *x, int64_t M, int64_t ldx, const uint8_t *want, const di_weight *w,
                          int64_t N, float *y, int64_t ldy);
/* Several independent products in one parallel loop (one synchronization instead of one per
 * product): job j computes y_j[m][n - n0_j] for n in [n0_j, n1_j). Same arithmetic as di_cpu_gemm. */
typedef struct di_gemm_job {
  const float *x;
  int64_t M, ldx;
  const di_weight *w;
  int64_t n0, n1;
  float *y;
  int64_t ldy;
} di_gemm_job;
void di_cpu_gemm_multi(di_threadpool *tp, const di_gemm_job *jobs, int n_jobs);
/* Plain float32 matrix: y[m][n] = sum_k x[m][k] * W[n][k], W row-major [N][K] (same reduction order). */
void di_cpu_gemm_f32(di_threadpool *tp, const float *x, int64_t M, int64_t ldx, const float *W, int64_t N,
                     int64_t K, float *y, int64_t ldy);
/* Dot product in the same fixed order as the GEMM (8-lane partials, fixed horizontal sum, tail). */
float di_cpu_dot(const float *a, const float *b, int64_t n);
/* out[i] = di_cpu_dot(a, b[i], n) for four vectors at once (a read once; bit-equal to four calls). */
void di_cpu_dot4(const float *a, const float *const b[4], int64_t n, float out[4]);
#endif
