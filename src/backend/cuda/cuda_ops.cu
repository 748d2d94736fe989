/* The CUDA backend's runner of the op test table (backend/op_table.h): each case computed with the
 * kernels the forward pass launches, its weights brought to the device by the backend's own upload
 * (cuda_upload.cu: every format dequantized to bf16 rows at load, for now), activations rounded to bf16
 * where the forward rounds them. Synchronous; device memory per call (a test path, not the decode one). */
#include "cuda_backend_impl.cuh"
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "backend/op_table.h"
}

namespace {
struct dev_bufs { /* freed together */
  void *p[6] = {};
  int n = 0;
  void *get(size_t bytes) {
    void *q = NULL;
    if (n < 6 && cudaMalloc(&q, bytes ? bytes : 16) == cudaSuccess) p[n++] = q;
    return q;
  }
  ~dev_bufs() {
    for (int i = 0; i < n; i++) cudaFree(p[i]);
  }
};
}

static di_status to_bf16_dev(const float *x, size_t n, void *dst) {
  uint16_t *h = (uint16_t *)malloc(n * 2);
  if (!h) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
  for (size_t i = 0; i < n; i++) h[i] = di_f32_to_bf16(x[i]);
  cudaError_t e = cudaMemcpy(dst, h, n * 2, cudaMemcpyHostToDevice);
  free(h);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda ops: copy: %s", cudaGetErrorString(e));
  return DI_OK;
}

static di_status bf16_dev_to_f32(const void *src, size_t n, float *out) {
  uint16_t *h = (uint16_t *)malloc(n * 2);
  if (!h) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
  cudaError_t e = cudaMemcpy(h, src, n * 2, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n && e == cudaSuccess; i++) out[i] = di_bf16_to_f32(h[i]);
  free(h);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda ops: copy: %s", cudaGetErrorString(e));
  return DI_OK;
}

extern "C" di_status di_cuda_op_run(void *ctx, const di_op_data *d, float *out) {
  di_cu_blas *blas = (di_cu_blas *)ctx;
  const di_op_case *c = d->c;
  dev_bufs m;
  const size_t M = (size_t)c->m, N = (size_t)c->n, K = (size_t)c->k;
  switch (c->op) {
  case DI_OP_GEMM: {
    /* K padded with zero columns to a multiple of 8 (the 16-byte rows the GEMMs want; every checkpoint's
     * K is one already): exact zeros added to each dot product */
    const size_t K8 = (K + 7) / 8 * 8;
    void *dx = m.get(M * K8 * 2), *dw = m.get(N * K8 * 2), *dy = m.get(M * N * 4);
    if (!dx || !dw || !dy) return di_error_set(DI_ERR_OOM, "cuda ops: out of device memory");
    float *xp = (float *)calloc(M * K8, sizeof(float));
    if (!xp) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
    for (size_t i = 0; i < M; i++) memcpy(xp + i * K8, d->x + i * K, K * sizeof(float));
    di_status st = to_bf16_dev(xp, M * K8, dx);
    free(xp);
    DI_TRY(st);
    DI_CU(cudaMemset(dw, 0, N * K8 * 2));
    DI_TRY(up_rows(&d->w, 0, c->n, (bf16 *)dw, (int64_t)K8));
    DI_TRY(di_cu_gemm(blas, c->m, c->n, (int)K8, (const uint16_t *)dx, (int)K8, (const uint16_t *)dw, (int)K8, dy, c->n,
                      1, 0.f, NULL));
    DI_CU(cudaDeviceSynchronize());
    DI_CU(cudaMemcpy(out, dy, M * N * 4, cudaMemcpyDeviceToHost));
    return DI_OK;
  }
  case DI_OP_RMSNORM: {
    void *dx = m.get(M * N * 4), *dw = m.get(N * 4), *db = m.get(M * N * 2), *df = m.get(M * N * 4);
    if (!dx || !dw || !db || !df) return di_error_set(DI_ERR_OOM, "cuda ops: out of device memory");
    DI_CU(cudaMemcpy(dx, d->x, M * N * 4, cudaMemcpyHostToDevice));
    DI_CU(cudaMemcpy(dw, d->nw, N * 4, cudaMemcpyHostToDevice));
    DI_TRY(di_cuk_rmsnorm((const float *)dx, c->n, (const float *)dw, c->m, c->n, d->eps, (uint16_t *)db, c->n,
                          (float *)df, NULL));
    DI_CU(cudaDeviceSynchronize());
    DI_CU(cudaMemcpy(out, df, M * N * 4, cudaMemcpyDeviceToHost));
    return DI_OK;
  }
  case DI_OP_SILU_MUL: {
    void *dx = m.get(M * 2 * N * 2), *dy = m.get(M * N * 2);
    if (!dx || !dy) return di_error_set(DI_ERR_OOM, "cuda ops: out of device memory");
    DI_TRY(to_bf16_dev(d->x, M * 2 * N, dx));
    DI_TRY(di_cuk_silu_mul((const uint16_t *)dx, c->m, c->n, (uint16_t *)dy, NULL));
    DI_CU(cudaDeviceSynchronize());
    return bf16_dev_to_f32(dy, M * N, out);
  }
  default: return di_error_set(DI_ERR_UNSUPPORTED, "cuda ops: op %d", (int)c->op);
  }
}
