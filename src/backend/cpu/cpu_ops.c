/* See cpu_ops.h. */
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_gemm.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void di_cpu_rmsnorm_row(float *out, const float *x, const float *w, int n, float eps) {
  /* HF: x * rsqrt(mean(x^2) + eps) * w, in float32 */
  float ss = di_cpu_dot(x, x, n) / (float)n;
  float r = 1.0f / sqrtf(ss + eps);
  for (int i = 0; i < n; i++)
    out[i] = w[i] * (x[i] * r);
}

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

void di_cpu_silu_mul(float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    g[i] = silu(g[i]) * u[i];
}

di_status di_cpu_op_run(void *ctx, const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  switch (c->op) {
  case DI_OP_GEMM:
    di_cpu_gemm((di_threadpool *)ctx, d->x, c->m, c->k, &d->w, 0, c->n, out, c->n);
    return DI_OK;
  case DI_OP_RMSNORM:
    for (int i = 0; i < c->m; i++)
      di_cpu_rmsnorm_row(out + (int64_t)i * c->n, d->x + (int64_t)i * c->n, d->nw, c->n, d->eps);
    return DI_OK;
  case DI_OP_SILU_MUL: {
    float *u = malloc(sizeof(float) * (size_t)c->n);
    if (!u) return di_error_set(DI_ERR_OOM, "cpu ops: out of memory");
    for (int i = 0; i < c->m; i++) {
      memcpy(out + (int64_t)i * c->n, d->x + (int64_t)i * 2 * c->n, sizeof(float) * (size_t)c->n);
      memcpy(u, d->x + (int64_t)i * 2 * c->n + c->n, sizeof(float) * (size_t)c->n);
      di_cpu_silu_mul(out + (int64_t)i * c->n, u, c->n);
    }
    free(u);
    return DI_OK;
  }
  default: return di_error_set(DI_ERR_UNSUPPORTED, "cpu ops: op %d", (int)c->op);
  }
}
