/* The op test table (see op_table.h): its rows, their random inputs, and the float64 references. */
#include "backend/op_table.h"
#include "util/numeric.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* op, label, m, n, k, weight type, block rows / cols, e8m0, tol f32, tol bf16 */
const di_op_case di_op_cases[] = {
    {DI_OP_GEMM, "gemm bf16 decode row", 1, 200, 96, DI_DT_BF16, 0, 0, 0, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm bf16 odd", 5, 77, 131, DI_DT_BF16, 0, 0, 0, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm bf16 panel rows", 33, 64, 256, DI_DT_BF16, 0, 0, 0, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm f32", 3, 50, 72, DI_DT_F32, 0, 0, 0, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm fp8 128x128 f32 scales, partial blocks", 4, 300, 260, DI_DT_F8E4M3, 128, 128, 0, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm fp8 128x128 ue8m0 scales", 9, 160, 384, DI_DT_F8E4M3, 128, 128, 1, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm fp8 3x5 blocks (scalar path)", 2, 17, 23, DI_DT_F8E4M3, 3, 5, 1, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm mxfp4", 3, 64, 512, DI_DT_F4E2M1, 1, 32, 1, 1e-5, 1e-2},
    {DI_OP_GEMM, "gemm mxfp4 partial block", 1, 37, 72, DI_DT_F4E2M1, 1, 32, 1, 1e-5, 1e-2},
    {DI_OP_RMSNORM, "rmsnorm hidden 2048", 3, 2048, 0, DI_DT_F32, 0, 0, 0, 1e-6, 1e-5},
    {DI_OP_RMSNORM, "rmsnorm odd width", 5, 72, 0, DI_DT_F32, 0, 0, 0, 1e-6, 1e-5},
    {DI_OP_SILU_MUL, "silu_mul 1408", 2, 1408, 0, DI_DT_F32, 0, 0, 0, 1e-6, 1e-2},
    {DI_OP_SILU_MUL, "silu_mul odd", 3, 37, 0, DI_DT_F32, 0, 0, 0, 1e-6, 1e-2},
};
const int di_n_op_cases = (int)(sizeof di_op_cases / sizeof di_op_cases[0]);

static uint64_t next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static float uni(uint64_t *s) { return (float)((next(s) >> 40) * (1.0 / 8388608.0)) - 1.0f; } /* [-1, 1) */

static di_status make_weight(const di_op_case *c, uint64_t *s, di_op_data *d) {
  di_weight *w = &d->w;
  const int64_t R = c->n, C = c->k;
  w->name = c->label;
  w->dtype = c->wtype;
  w->rows = R;
  w->cols = C;
  if (c->wtype == DI_DT_BF16 || c->wtype == DI_DT_F32) {
    const size_t esz = c->wtype == DI_DT_BF16 ? 2 : 4;
    d->wdata = malloc((size_t)(R * C) * esz);
    if (!d->wdata) return di_error_set(DI_ERR_OOM, "op table: out of memory");
    for (int64_t i = 0; i < R * C; i++) {
      const float v = uni(s) * 0.1f;
      if (esz == 2) ((uint16_t *)d->wdata)[i] = di_f32_to_bf16(v);
      else ((float *)d->wdata)[i] = v;
    }
    w->data = d->wdata;
    return DI_OK;
  }
  if (c->wtype != DI_DT_F8E4M3 && c->wtype != DI_DT_F4E2M1)
    return di_error_set(DI_ERR_INVALID_ARG, "op table: %s: weight type %s", c->label, di_dtype_name(c->wtype));
  w->block_rows = c->block_rows;
  w->block_cols = c->block_cols;
  w->scale_cols = (C + c->block_cols - 1) / c->block_cols;
  const int64_t ns = (R + c->block_rows - 1) / c->block_rows * w->scale_cols;
  const size_t bytes = c->wtype == DI_DT_F4E2M1 ? (size_t)(R * (C / 2)) : (size_t)(R * C);
  d->wdata = malloc(bytes);
  d->wscales = malloc((size_t)ns * (c->e8m0 ? 1 : 4));
  if (!d->wdata || !d->wscales) return di_error_set(DI_ERR_OOM, "op table: out of memory");
  for (size_t i = 0; i < bytes; i++) {
    uint8_t v = (uint8_t)(next(s) >> 32);
    if (c->wtype == DI_DT_F8E4M3 && (v & 0x7f) == 0x7f) v = 0x3f; /* no NaN codes */
    ((uint8_t *)d->wdata)[i] = v;
  }
  for (int64_t i = 0; i < ns; i++) {
    if (c->e8m0) ((uint8_t *)d->wscales)[i] = (uint8_t)(127 - 10 + (next(s) >> 32) % 6); /* 2^-10 .. 2^-5 */
    else ((float *)d->wscales)[i] = (float)(((next(s) >> 32) % 1000 + 1) * 2e-6);
  }
  w->data = d->wdata;
  if (c->e8m0) w->scale_e8m0 = d->wscales;
  else w->scale_inv = d->wscales;
  const char *why = NULL;
  if (di_weight_check_format(w, &why))
    return di_error_set(DI_ERR_INVALID_ARG, "op table: %s: %s", c->label, why);
  return DI_OK;
}

di_status di_op_data_make(const di_op_case *c, uint64_t seed, di_op_data *d) {
  memset(d, 0, sizeof *d);
  d->c = c;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)(c - di_op_cases) + 1;
  const int64_t xn = c->op == DI_OP_GEMM ? (int64_t)c->m * c->k : c->op == DI_OP_SILU_MUL ? 2 * (int64_t)c->m * c->n
                                                                                       : (int64_t)c->m * c->n;
  d->n_out = (int64_t)c->m * c->n;
  d->x = malloc(sizeof(float) * (size_t)xn);
  d->ref = malloc(sizeof(double) * (size_t)d->n_out);
  if (!d->x || !d->ref) return di_error_set(DI_ERR_OOM, "op table: out of memory");
  for (int64_t i = 0; i < xn; i++) d->x[i] = uni(&s) * (c->op == DI_OP_SILU_MUL ? 4.f : 1.f);
  d->eps = 1e-6f;
  switch (c->op) {
  case DI_OP_GEMM:
    DI_TRY(make_weight(c, &s, d));
    di_op_ref_gemm(d->x, c->m, c->k, &d->w, d->ref);
    break;
  case DI_OP_RMSNORM:
    d->nw = malloc(sizeof(float) * (size_t)c->n);
    if (!d->nw) return di_error_set(DI_ERR_OOM, "op table: out of memory");
    for (int i = 0; i < c->n; i++) d->nw[i] = 1.0f + 0.5f * uni(&s);
    di_op_ref_rmsnorm(d->x, c->m, c->n, d->nw, d->eps, d->ref);
    break;
  case DI_OP_SILU_MUL: di_op_ref_silu_mul(d->x, c->m, c->n, d->ref); break;
  default: return di_error_set(DI_ERR_INVALID_ARG, "op table: unknown op %d", (int)c->op);
  }
  return DI_OK;
}

void di_op_data_free(di_op_data *d) {
  free(d->x);
  free(d->nw);
  free(d->wdata);
  free(d->wscales);
  free(d->ref);
  memset(d, 0, sizeof *d);
}

/* ---- float64 references ---------------------------------------------------------------------- */

/* element (r, c): the stored code's value times its block scale, in float64 (no rounding) */
static double weight_f64(const di_weight *w, int64_t r, int64_t c) {
  if (w->dtype == DI_DT_F8E4M3)
    return (double)di_fp8e4m3_to_f32(((const uint8_t *)w->data)[r * w->cols + c]) * di_weight_scale(w, r, c);
  if (w->dtype == DI_DT_F4E2M1) {
    const uint8_t b = ((const uint8_t *)w->data)[r * (w->cols / 2) + c / 2];
    return (double)di_e2m1_table[(c & 1) ? b >> 4 : b & 15] * di_weight_scale(w, r, c);
  }
  return di_weight_get(w, r, c);
}

void di_op_ref_gemm(const float *x, int m, int k, const di_weight *w, double *y) {
  double *row = malloc(sizeof(double) * (size_t)k);
  for (int64_t n = 0; n < w->rows; n++) {
    /* one weight row dequantized in float64 (the value times its block scale, both exact) */
    for (int kk = 0; kk < k; kk++) row[kk] = weight_f64(w, n, kk);
    for (int i = 0; i < m; i++) {
      double a = 0;
      for (int kk = 0; kk < k; kk++) a += (double)x[(int64_t)i * k + kk] * row[kk];
      y[(int64_t)i * w->rows + n] = a;
    }
  }
  free(row);
}

void di_op_ref_rmsnorm(const float *x, int m, int n, const float *w, double eps, double *y) {
  for (int i = 0; i < m; i++) {
    const float *xr = x + (int64_t)i * n;
    double ss = 0;
    for (int j = 0; j < n; j++) ss += (double)xr[j] * xr[j];
    const double r = 1.0 / sqrt(ss / n + eps);
    for (int j = 0; j < n; j++) y[(int64_t)i * n + j] = (double)xr[j] * r * w[j];
  }
}

void di_op_ref_silu_mul(const float *x, int m, int n, double *y) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      const double g = x[(int64_t)i * 2 * n + j], u = x[(int64_t)i * 2 * n + n + j];
      y[(int64_t)i * n + j] = g / (1.0 + exp(-g)) * u;
    }
}

/* ---- the check --------------------------------------------------------------------------------- */

static double rel_l2(const double *ref, const float *got, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (got[i] != got[i]) return INFINITY;
    num += (ref[i] - got[i]) * (ref[i] - got[i]);
    den += ref[i] * ref[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

di_op_report di_op_check(const char *backend, di_op_runner run, void *ctx, int bf16_operands, uint64_t seed,
                         FILE *log) {
  di_op_report r = {0, 0, 0, 0};
  for (int i = 0; i < di_n_op_cases; i++) {
    const di_op_case *c = &di_op_cases[i];
    di_op_data d;
    float *out = NULL;
    di_status st = di_op_data_make(c, seed, &d);
    if (st == DI_OK) {
      out = malloc(sizeof(float) * (size_t)d.n_out);
      st = out ? run(ctx, &d, out) : di_error_set(DI_ERR_OOM, "op table: out of memory");
    }
    r.run++;
    const double tol = bf16_operands ? c->tol_bf16 : c->tol_f32;
    if (st == DI_ERR_UNSUPPORTED) {
      r.unsupported++;
      if (log) fprintf(log, "%-6s %-46s unsupported: %s\n", backend, c->label, di_last_error());
    } else if (st != DI_OK) {
      r.failed++;
      if (log) fprintf(log, "%-6s %-46s FAILED: %s\n", backend, c->label, di_last_error());
    } else {
      const double err = rel_l2(d.ref, out, d.n_out);
      const int ok = err <= tol;
      if (ok) r.passed++;
      else r.failed++;
      if (log) fprintf(log, "%-6s %-46s rel err %.2e (bound %.0e) %s\n", backend, c->label, err, tol, ok ? "ok" : "FAILED");
    }
    free(out);
    di_op_data_free(&d);
  }
  return r;
}
