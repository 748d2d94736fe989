/* FP8 block-scaled host weights to the device as FP8 (DEEPINFER_CUDA_FP8=1): the E4M3 bytes copied as
 * stored, rows padded to a multiple of 16 bytes, and the block scales widened to one F32 scale row per
 * weight row (block_rows 1; UE8M0 scales become their exact F32 values). Per-row scales are what let
 * the backend lay FP8 rows out as it lays bf16 ones out (q/kv_a and gate/up concatenated, experts padded
 * to Ip / Hp rows and columns, the shared experts' slices folded in as experts) whatever the checkpoint's
 * block height; they cost 4 bytes per weight row per 128 columns (3% more bytes read than 128 x 128
 * blocks). Padding rows and columns are zero with zero scales. */
#include "cuda_backend_impl.cuh"
#include <stdlib.h>

di_status fp8_alloc(cu_backend *b, int64_t rows, int K, int block_cols, di_cuk_fp8w *d) {
  const int ldq = (K + 15) / 16 * 16, sc = (K + block_cols - 1) / block_cols;
  uint8_t *q = NULL;
  float *s = NULL;
  DI_TRY(dev_alloc(b, (void **)&q, (size_t)(rows * ldq)));
  DI_TRY(dev_alloc(b, (void **)&s, sizeof(float) * (size_t)(rows * sc)));
  DI_CU(cudaMemset(q, 0, (size_t)(rows * ldq)));
  DI_CU(cudaMemset(s, 0, sizeof(float) * (size_t)(rows * sc)));
  d->q = q;
  d->scale = s;
  d->ldq = ldq;
  d->block_rows = 1;
  d->block_cols = block_cols;
  d->scale_cols = sc;
  return DI_OK;
}

int fp8_uploadable(int bc, const di_weight *const *ws) {
  for (; *ws; ws++)
    if ((*ws)->dtype != DI_DT_F8E4M3 || (*ws)->block_cols != bc || !(*ws)->data) return 0;
  return 1;
}

di_status fp8_up_rows(const di_weight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const di_cuk_fp8w *d,
                      int64_t dst_row) {
  const int64_t n = r1 - r0, wd = c1 - c0, C = w->cols;
  if (n <= 0 || wd <= 0) return DI_OK;
  if (w->dtype != DI_DT_F8E4M3 || c0 % w->block_cols || w->block_cols != d->block_cols || wd > d->ldq)
    return di_error_set(DI_ERR_INTERNAL, "cuda backend: %s is not uploadable as FP8 here", w->name ? w->name : "?");
  const int sc = d->scale_cols, kb0 = (int)(c0 / w->block_cols), nkb = (int)((wd + w->block_cols - 1) / w->block_cols);
  float *hs = (float *)calloc((size_t)(n * sc), sizeof(float));
  if (!hs) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory uploading %s", w->name ? w->name : "?");
  for (int64_t r = 0; r < n; r++)
    for (int kb = 0; kb < nkb && kb < sc; kb++) hs[r * sc + kb] = di_weight_scale(w, r0 + r, (int64_t)(kb0 + kb) * w->block_cols);
  cudaError_t e = cudaMemcpy2D((uint8_t *)d->q + dst_row * d->ldq, (size_t)d->ldq, (const uint8_t *)w->data + r0 * C + c0,
                               (size_t)C, (size_t)wd, (size_t)n, cudaMemcpyHostToDevice);
  if (e == cudaSuccess)
    e = cudaMemcpy((float *)d->scale + dst_row * sc, hs, sizeof(float) * (size_t)(n * sc), cudaMemcpyHostToDevice);
  free(hs);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda: uploading %s: %s", w->name ? w->name : "?", cudaGetErrorString(e));
  return DI_OK;
}
