/* Host weights to the device as bf16 rows: bf16 copied as stored, every other di_weight dtype (FP8
 * with block scales, MXFP4, F16, F32) dequantized on the host first, 256 rows at a time. (Native FP8 /
 * FP4 device formats replace this once their kernels exist.) */
#include "cuda_backend_impl.cuh"
#include <stdlib.h>

/* ---- weight upload ------------------------------------------------------------------------------- */

/* Rows [r0, r1) of w (all its columns) to dst, whose rows are dst_ld elements apart. */
di_status up_rows(const di_weight *w, int64_t r0, int64_t r1, bf16 *dst, int64_t dst_ld) {
  const int64_t C = w->cols, n = r1 - r0;
  if (n <= 0) return DI_OK;
  if (w->dtype == DI_DT_BF16) {
    const uint16_t *src = (const uint16_t *)w->data + r0 * C;
    if (dst_ld == C) DI_CU(cudaMemcpy(dst, src, (size_t)(n * C) * 2, cudaMemcpyHostToDevice));
    else DI_CU(cudaMemcpy2D(dst, (size_t)dst_ld * 2, src, (size_t)C * 2, (size_t)C * 2, (size_t)n, cudaMemcpyHostToDevice));
    return DI_OK;
  }
  /* other dtypes (FP8 with block scales, F16, F32): dequantize on the host, 256 rows at a time */
  const int64_t chunk = 256;
  float *f = (float *)malloc(sizeof(float) * (size_t)(chunk * C));
  uint16_t *hb = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(chunk * C));
  if (!f || !hb) { free(f); free(hb); return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory converting %s", w->name ? w->name : "?"); }
  di_status st = DI_OK;
  for (int64_t r = r0; r < r1 && st == DI_OK; r += chunk) {
    int64_t m = r1 - r < chunk ? r1 - r : chunk;
    di_weight_rows_f32(w, r, r + m, f);
    for (int64_t i = 0; i < m * C; i++) hb[i] = di_f32_to_bf16(f[i]);
    cudaError_t e = cudaMemcpy2D(dst + (r - r0) * dst_ld, (size_t)dst_ld * 2, hb, (size_t)C * 2, (size_t)C * 2,
                                 (size_t)m, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) st = di_error_set(DI_ERR_BACKEND, "cuda: uploading %s: %s", w->name ? w->name : "?", cudaGetErrorString(e));
  }
  free(f);
  free(hb);
  return st;
}

/* Columns [c0, c1) of rows [r0, r1) of w to dst (row stride dst_ld). */
di_status up_cols(const di_weight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, bf16 *dst, int64_t dst_ld) {
  const int64_t C = w->cols, n = r1 - r0, wd = c1 - c0;
  if (n <= 0 || wd <= 0) return DI_OK;
  if (w->dtype == DI_DT_BF16) {
    DI_CU(cudaMemcpy2D(dst, (size_t)dst_ld * 2, (const uint16_t *)w->data + r0 * C + c0, (size_t)C * 2, (size_t)wd * 2,
                       (size_t)n, cudaMemcpyHostToDevice));
    return DI_OK;
  }
  float *f = (float *)malloc(sizeof(float) * (size_t)C);
  uint16_t *hb = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(n * wd));
  if (!f || !hb) { free(f); free(hb); return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory"); }
  for (int64_t r = 0; r < n; r++) {
    di_weight_rows_f32(w, r0 + r, r0 + r + 1, f);
    for (int64_t c = 0; c < wd; c++) hb[r * wd + c] = di_f32_to_bf16(f[c0 + c]);
  }
  cudaError_t e = cudaMemcpy2D(dst, (size_t)dst_ld * 2, hb, (size_t)wd * 2, (size_t)wd * 2, (size_t)n, cudaMemcpyHostToDevice);
  free(f);
  free(hb);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda: upload: %s", cudaGetErrorString(e));
  return DI_OK;
}

di_status check_shape(const di_weight *w, int64_t rows, int64_t cols, const char *what) {
  if (!w->data || w->rows != rows || w->cols != cols)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: weight %s is [%lld x %lld], expected [%lld x %lld]",
                        w->name ? w->name : what, (long long)w->rows, (long long)w->cols, (long long)rows, (long long)cols);
  return DI_OK;
}

di_status up_mat(cu_backend *b, const di_weight *w, int64_t rows, int64_t cols, bf16 **out, const char *what) {
  DI_TRY(check_shape(w, rows, cols, what));
  DI_TRY(dev_alloc(b, (void **)out, (size_t)(rows * cols) * 2));
  return up_rows(w, 0, rows, *out, cols);
}

di_status up_vec(cu_backend *b, const float *v, int64_t n, float **out) {
  DI_TRY(dev_alloc(b, (void **)out, sizeof(float) * (size_t)n));
  if (v) DI_CU(cudaMemcpy(*out, v, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  else DI_CU(cudaMemset(*out, 0, sizeof(float) * (size_t)n));
  return DI_OK;
}

