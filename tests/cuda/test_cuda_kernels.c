/* Every CUDA kernel against a plain-C reference on fresh random inputs at real shapes (V2-Lite:
 * 16 heads, kv_lora 512, rope 64, 64 experts top-6, hidden 2048; V3: 128 heads, 256 experts top-8;
 * contexts up to 32k). Tolerances (relative L2 error against a double-precision reference computed
 * from the same bf16 inputs): GEMMs 1e-2 with bf16 output / 1e-3 with f32 output; attention 1e-2
 * (P is rounded to bf16 for the PV product); MoE chain 1e-2; norms / rope 1e-2 (bf16 outputs);
 * router ids exact and weights 1e-5; sampling: the same token as the CPU sampler. Built only with
 * nvcc; run on the device by scripts/device_tests.sh. */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/k_mha_prefill.h"
#include "sampler/sampler.h"
#include "sampler/rng.h"
#include "util/numeric.h"
#include "test_util.h"
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#define CUT_RNG_SEED 0x1234567
#include "cuda_test_rand.h" /* urand, nrand, rand_bf16, dup_dev */
static float *rand_f32(size_t n, float scale) {
  float *v = malloc(n * 4);
  for (size_t i = 0; i < n; i++) v[i] = nrand() * scale;
  return v;
}
static float bf(uint16_t x) { return di_bf16_to_f32(x); }
static double rel_err_d(const double *ref, const float *got, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = ref[i] - got[i];
    if (got[i] != got[i]) return INFINITY;
    num += d * d;
    den += ref[i] * ref[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}
static float *bf16_dev_to_f32(const void *d, size_t n) {
  uint16_t *t = malloc(n * 2);
  float *f = malloc(n * 4);
  di_cut_d2h(t, d, n * 2);
  for (size_t i = 0; i < n; i++) f[i] = bf(t[i]);
  free(t);
  return f;
}

/* ---- GEMM --------------------------------------------------------------------------------------- */
static void test_gemm(di_cu_blas *blas, int M, int N, int K, int y_f32, float beta) {
  uint16_t *X = rand_bf16((size_t)M * K, 1.f), *W = rand_bf16((size_t)N * K, 0.05f);
  float *Y0 = rand_f32((size_t)M * N, 1.f);
  void *dX = dup_dev(X, (size_t)M * K * 2), *dW = dup_dev(W, (size_t)N * K * 2);
  void *dY = di_cut_malloc((size_t)M * N * 4);
  if (y_f32) di_cut_h2d(dY, Y0, (size_t)M * N * 4);
  di_status st = di_cu_gemm(blas, M, N, K, X ? dX : NULL, K, dW, K, dY, N, y_f32, beta, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  double *ref = malloc(sizeof(double) * (size_t)M * N);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double a = 0;
      for (int k = 0; k < K; k++) a += (double)bf(X[(size_t)m * K + k]) * bf(W[(size_t)n * K + k]);
      ref[(size_t)m * N + n] = a + (y_f32 ? beta * Y0[(size_t)m * N + n] : 0);
    }
  float *got;
  if (y_f32) { got = malloc((size_t)M * N * 4); di_cut_d2h(got, dY, (size_t)M * N * 4); }
  else got = bf16_dev_to_f32(dY, (size_t)M * N);
  double err = rel_err_d(ref, got, (size_t)M * N), tol = y_f32 ? 1e-3 : 1e-2;
  CHECKF(err < tol, "gemm %dx%dx%d f32=%d beta=%g: rel err %.3e", M, N, K, y_f32, beta, err);
  printf("gemm %dx%dx%d f32=%d beta=%g: rel err %.2e\n", M, N, K, y_f32, beta, err);
  free(X); free(W); free(Y0); free(ref); free(got);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(dY);
}

/* DEEPINFER_CUDA_SKINNY_ROWS (di_cu_blas_set_skinny_rows): the persistent skinny kernel (warps walking row pairs)
 * against the skinny kernel bit for bit, and against float64 (f32 out < 1e-3, bf16 < 1e-2, as test_gemm), on fresh
 * random inputs: the lm_head shapes, a residual add (beta 1), fewer rows than its grid, odd N and K. */
static void test_skinny_rows(di_cu_blas *blas, int M, int N, int K, int y_f32, float beta) {
  uint16_t *X = rand_bf16((size_t)M * K, 1.f), *W = rand_bf16((size_t)N * K, 0.05f);
  float *Y0 = rand_f32((size_t)M * N, 1.f);
  const size_t yb = (size_t)M * N * (y_f32 ? 4 : 2);
  void *dX = dup_dev(X, (size_t)M * K * 2), *dW = dup_dev(W, (size_t)N * K * 2);
  void *dY[2] = {di_cut_malloc((size_t)M * N * 4), di_cut_malloc((size_t)M * N * 4)};
  for (int v = 0; v < 2; v++) {
    if (y_f32) di_cut_h2d(dY[v], Y0, (size_t)M * N * 4);
    di_cu_blas_set_skinny_rows(blas, v ? 1 : 0);
    di_status st = di_cu_gemm(blas, M, N, K, dX, K, dW, K, dY[v], N, y_f32, beta, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
  }
  di_cu_blas_set_skinny_rows(blas, 0);
  CHECK(di_cut_sync() == 0);
  uint8_t *h0 = malloc(yb), *h1 = malloc(yb);
  di_cut_d2h(h0, dY[0], yb);
  di_cut_d2h(h1, dY[1], yb);
  size_t bad = 0;
  for (size_t i = 0; i < (size_t)M * N; i++) bad += memcmp(h0 + i * (y_f32 ? 4 : 2), h1 + i * (y_f32 ? 4 : 2), y_f32 ? 4 : 2) != 0;
  double *ref = malloc(sizeof(double) * (size_t)M * N);
  float *got = malloc((size_t)M * N * 4);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double a = 0;
      for (int k = 0; k < K; k++) a += (double)bf(X[(size_t)m * K + k]) * bf(W[(size_t)n * K + k]);
      ref[(size_t)m * N + n] = a + (y_f32 ? beta * Y0[(size_t)m * N + n] : 0);
      const size_t i = (size_t)m * N + n;
      got[i] = y_f32 ? ((float *)h1)[i] : bf(((uint16_t *)h1)[i]);
    }
  const double err = rel_err_d(ref, got, (size_t)M * N), tol = y_f32 ? 1e-3 : 1e-2;
  CHECKF(err < tol, "skinny rows %dx%dx%d f32=%d beta=%g: rel err %.3e", M, N, K, y_f32, beta, err);
  CHECKF(bad == 0, "skinny rows %dx%dx%d: %zu of %d outputs differ from the skinny kernel", M, N, K, bad, M * N);
  printf("skinny rows %dx%dx%d f32=%d beta=%g: rel err %.2e, %zu differ from the skinny kernel\n", M, N, K, y_f32, beta,
         err, bad);
  free(X); free(W); free(Y0); free(h0); free(h1); free(ref); free(got);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(dY[0]); di_cut_free(dY[1]);
}
/* its time against the skinny kernel's at one shape (weights > L2: each call streams them), alternating, 5 rounds */
static void time_skinny_rows(di_cu_blas *blas, int M, int N, int K) {
  uint16_t *X = rand_bf16((size_t)M * K, 1.f), *W = rand_bf16((size_t)N * K, 0.05f);
  void *dX = dup_dev(X, (size_t)M * K * 2), *dW = dup_dev(W, (size_t)N * K * 2), *dY = di_cut_malloc((size_t)M * N * 4);
  double us[5][2];
  for (int r = 0; r < 5; r++)
    for (int v = 0; v < 2; v++) {
      di_cu_blas_set_skinny_rows(blas, v ? 1 : 0);
      for (int it = -2; it < 20; it++) {
        if (it == 0) { CHECK(di_cut_sync() == 0); us[r][v] = di_cut_time_ms(); }
        CHECK(di_cu_gemm(blas, M, N, K, dX, K, dW, K, dY, N, 1, 0.f, NULL) == DI_OK);
      }
      CHECK(di_cut_sync() == 0);
      us[r][v] = (di_cut_time_ms() - us[r][v]) * 1e3 / 20;
    }
  di_cu_blas_set_skinny_rows(blas, 0);
  for (int v = 0; v < 2; v++) {
    double best = 1e30;
    printf("time gemm %dx%dx%d %-14s", M, N, K, v ? "skinny rows" : "skinny");
    for (int r = 0; r < 5; r++) { printf(" %7.1f", us[r][v]); best = us[r][v] < best ? us[r][v] : best; }
    printf(" us (best %.1f us, %.0f GB/s)\n", best, (double)N * K * 2 / (best * 1e3));
  }
  free(X); free(W);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(dY);
}
static void test_skinny_rows_all(di_cu_blas *blas) {
  test_skinny_rows(blas, 1, 102400, 2048, 1, 0.f); /* V2-Lite's lm_head at one token */
  test_skinny_rows(blas, 1, 129280, 2048, 1, 0.f); /* V3's vocabulary */
  test_skinny_rows(blas, 3, 20011, 2048, 1, 1.f);  /* a residual add, odd N */
  test_skinny_rows(blas, 8, 50001, 136, 0, 0.f);   /* bf16 out, K not a multiple of a chunk */
  test_skinny_rows(blas, 1, 200, 96, 0, 0.f);      /* fewer rows than the grid */
  test_skinny_rows(blas, 2, 777, 72, 1, 0.f);
}

/* Y = RMSNorm(H) . W^T with the norm inside the skinny kernel (the decode layer's q/kv projection) */
static void test_gemm_normed(di_cu_blas *blas, int M, int N, int K) {
  float *h = rand_f32((size_t)M * K, 3.f), *nw = rand_f32(K, 1.f);
  uint16_t *W = rand_bf16((size_t)N * K, 0.05f);
  void *dh = dup_dev(h, (size_t)M * K * 4), *dnw = dup_dev(nw, (size_t)K * 4), *dW = dup_dev(W, (size_t)N * K * 2);
  void *dY = di_cut_malloc((size_t)M * N * 4);
  CHECK(di_cu_gemm_normed_ok(blas, M, K, K));
  di_status st = di_cu_gemm_normed(blas, M, N, K, dh, K, dnw, 1e-6f, dW, K, dY, N, 1, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  double *ref = malloc(sizeof(double) * (size_t)M * N);
  float *x = malloc(sizeof(float) * (size_t)K);
  for (int m = 0; m < M; m++) {
    double ss = 0;
    for (int k = 0; k < K; k++) ss += (double)h[(size_t)m * K + k] * h[(size_t)m * K + k];
    const double inv = 1.0 / sqrt(ss / K + 1e-6);
    for (int k = 0; k < K; k++) x[k] = bf(di_f32_to_bf16((float)(h[(size_t)m * K + k] * inv * nw[k])));
    for (int n = 0; n < N; n++) {
      double a = 0;
      for (int k = 0; k < K; k++) a += (double)x[k] * bf(W[(size_t)n * K + k]);
      ref[(size_t)m * N + n] = a;
    }
  }
  float *got = malloc((size_t)M * N * 4);
  di_cut_d2h(got, dY, (size_t)M * N * 4);
  double err = rel_err_d(ref, got, (size_t)M * N);
  CHECKF(err < 2e-3, "normed gemm %dx%dx%d: rel err %.3e", M, N, K, err);
  printf("normed gemm %dx%dx%d: rel err %.2e\n", M, N, K, err);
  free(h); free(nw); free(W); free(ref); free(x); free(got);
  di_cut_free(dh); di_cut_free(dnw); di_cut_free(dW); di_cut_free(dY);
}

/* Y_h = X_h . W_h (w_kn) per head, the absorption shape */
static void test_gemm_batched(di_cu_blas *blas, int NH, int T, int N, int K, int w_kn) {
  int ldx = NH * K + 8, ldy = NH * N + 16; /* strided like the real buffers */
  uint16_t *X = rand_bf16((size_t)T * ldx, 1.f), *W = rand_bf16((size_t)NH * N * K, 0.1f);
  void *dX = dup_dev(X, (size_t)T * ldx * 2), *dW = dup_dev(W, (size_t)NH * N * K * 2);
  void *dY = di_cut_malloc((size_t)T * ldy * 2);
  di_status st = di_cu_gemm_batched(blas, NH, T, N, K, dX, ldx, K, dW, w_kn ? N : K, (int64_t)N * K, w_kn,
                                    dY, ldy, N, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *g = bf16_dev_to_f32(dY, (size_t)T * ldy);
  double *ref = malloc(sizeof(double) * (size_t)T * NH * N);
  float *got = malloc(sizeof(float) * (size_t)T * NH * N);
  for (int h = 0; h < NH; h++)
    for (int t = 0; t < T; t++)
      for (int n = 0; n < N; n++) {
        double a = 0;
        for (int k = 0; k < K; k++) {
          float w = w_kn ? bf(W[(size_t)h * N * K + (size_t)k * N + n]) : bf(W[(size_t)h * N * K + (size_t)n * K + k]);
          a += (double)bf(X[(size_t)t * ldx + h * K + k]) * w;
        }
        ref[((size_t)t * NH + h) * N + n] = a;
        got[((size_t)t * NH + h) * N + n] = g[(size_t)t * ldy + h * N + n];
      }
  double err = rel_err_d(ref, got, (size_t)T * NH * N);
  CHECKF(err < 1e-2, "batched gemm NH=%d T=%d N=%d K=%d kn=%d: rel err %.3e", NH, T, N, K, w_kn, err);
  printf("batched gemm NH=%d T=%d N=%d K=%d kn=%d: rel err %.2e\n", NH, T, N, K, w_kn, err);
  free(X); free(W); free(g); free(ref); free(got);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(dY);
}

/* Batch-invariant mode (di_cu_blas_set_invariant): every row of an M-row product bit-equal to the same
 * row computed alone (M = 1, its own buffers), for plain (bf16 and f32 + residual), normed and batched
 * products, on shapes the skinny kernels take and on an odd one they do not (the rowdot fallback);
 * and against float64 (rel err < 1e-2: bf16 inputs, f32 sums). */
static void test_invariant_gemm(di_cu_blas *blas, int M, int N, int K, int kind, const char *label) {
  /* kind 0: bf16 out; 1: f32 out with beta = 1 (the residual add); 2: normed (f32 residual rows in);
   * 3 / 4: batched over 4 heads, W [N][K] / [K][N] */
  const int NB = kind >= 3 ? 4 : 1, ldx = NB * K + (K % 8 ? 0 : 8), ldy = NB * N + (N % 8 ? 0 : 8);
  const int y_f32 = kind == 1 || kind == 2, esz = y_f32 ? 4 : 2;
  uint16_t *X = rand_bf16((size_t)M * ldx, 1.f), *W = rand_bf16((size_t)NB * N * K, 0.1f);
  float *Xf = rand_f32((size_t)M * ldx, 1.f), *nw = rand_f32(K, 1.f), *Y0 = rand_f32((size_t)M * ldy, 1.f);
  void *dX = kind == 2 ? dup_dev(Xf, (size_t)M * ldx * 4) : dup_dev(X, (size_t)M * ldx * 2);
  void *dW = dup_dev(W, (size_t)NB * N * K * 2), *dnw = dup_dev(nw, (size_t)K * 4);
  void *dY = di_cut_malloc((size_t)M * ldy * esz), *dY1 = di_cut_malloc((size_t)ldy * esz);
  di_cu_blas_set_invariant(blas, 1);
  int bad_rows = 0;
  unsigned char *all = malloc((size_t)M * ldy * esz), *one = malloc((size_t)ldy * esz);
  for (int pass = 0; pass <= M; pass++) { /* pass 0: all rows; pass 1 + m: row m alone */
    const int m0 = pass ? pass - 1 : 0, mc = pass ? 1 : M;
    void *y = pass ? dY1 : dY;
    const size_t off = (size_t)m0 * ldx;
    if (y_f32) di_cut_h2d(y, Y0 + (size_t)m0 * ldy, (size_t)mc * ldy * 4);
    di_status st;
    if (kind <= 1)
      st = di_cu_gemm(blas, mc, N, K, (const uint16_t *)dX + off, ldx, dW, K, y, ldy, y_f32, y_f32 ? 1.f : 0.f, NULL);
    else if (kind == 2)
      st = di_cu_gemm_normed(blas, mc, N, K, (const float *)dX + off, ldx, dnw, 1e-6f, dW, K, y, ldy, 1, NULL);
    else
      st = di_cu_gemm_batched(blas, NB, mc, N, K, (const uint16_t *)dX + off, ldx, K, dW, kind == 4 ? N : K,
                              (int64_t)N * K, kind == 4, y, ldy, N, NULL);
    CHECKF(st == DI_OK, "%s: %s", label, di_last_error());
    CHECK(di_cut_sync() == 0);
    if (!pass) { di_cut_d2h(all, dY, (size_t)M * ldy * esz); continue; }
    di_cut_d2h(one, dY1, (size_t)ldy * esz);
    bad_rows += memcmp(one, all + (size_t)m0 * ldy * esz, (size_t)NB * N * esz) != 0;
  }
  di_cu_blas_set_invariant(blas, 0);
  /* float64 reference of the batched result */
  double *ref = malloc(sizeof(double) * (size_t)M * NB * N);
  float *got = malloc(sizeof(float) * (size_t)M * NB * N);
  for (int m = 0; m < M; m++) {
    double inv = 1.0;
    if (kind == 2) {
      double ss = 0;
      for (int k = 0; k < K; k++) ss += (double)Xf[(size_t)m * ldx + k] * Xf[(size_t)m * ldx + k];
      inv = 1.0 / sqrt(ss / K + 1e-6);
    }
    for (int h = 0; h < NB; h++)
      for (int n = 0; n < N; n++) {
        double a = 0;
        for (int k = 0; k < K; k++) {
          const double x = kind == 2 ? bf(di_f32_to_bf16((float)(Xf[(size_t)m * ldx + k] * inv * nw[k])))
                                     : bf(X[(size_t)m * ldx + h * K + k]);
          a += x * (kind == 4 ? bf(W[(size_t)h * N * K + (size_t)k * N + n]) : bf(W[(size_t)h * N * K + (size_t)n * K + k]));
        }
        const size_t i = ((size_t)m * NB + h) * N + n, yi = (size_t)m * ldy + h * N + n;
        ref[i] = a + (kind == 1 ? Y0[yi] : 0.0);
        got[i] = y_f32 ? ((float *)all)[yi] : bf(((uint16_t *)all)[yi]);
      }
  }
  const double err = rel_err_d(ref, got, (size_t)M * NB * N);
  CHECKF(bad_rows == 0 && err < 1e-2, "invariant gemm %s: %d of %d rows differ from the row alone, rel err %.3e", label,
         bad_rows, M, err);
  printf("invariant gemm %-34s M=%2d N=%4d K=%4d: every row == alone, rel err %.2e\n", label, M, N, K, err);
  free(X); free(W); free(Xf); free(nw); free(Y0); free(all); free(one); free(ref); free(got);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(dnw); di_cut_free(dY); di_cut_free(dY1);
}

/* ---- RMSNorm, SiLU-mul ---------------------------------------------------------------------------- */
static void test_norms(int T, int n) {
  float *x = rand_f32((size_t)T * n, 3.f), *w = rand_f32(n, 1.f);
  void *dx = dup_dev(x, (size_t)T * n * 4), *dw = dup_dev(w, (size_t)n * 4), *dout = di_cut_malloc((size_t)T * n * 2);
  void *dof = di_cut_malloc((size_t)T * n * 4);
  CHECK(di_cuk_rmsnorm(dx, n, dw, T, n, 1e-6f, dout, n, dof, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *got = bf16_dev_to_f32(dout, (size_t)T * n);
  double *ref = malloc(sizeof(double) * (size_t)T * n);
  for (int t = 0; t < T; t++) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[t * n + i] * x[t * n + i];
    double r = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++) ref[t * n + i] = x[t * n + i] * r * w[i];
  }
  double err = rel_err_d(ref, got, (size_t)T * n);
  CHECKF(err < 1e-2, "rmsnorm rel err %.3e", err);
  float *gotf = malloc((size_t)T * n * 4);
  di_cut_d2h(gotf, dof, (size_t)T * n * 4);
  double errf = rel_err_d(ref, gotf, (size_t)T * n);
  CHECKF(errf < 1e-5, "rmsnorm f32 output rel err %.3e", errf);
  /* the gathered form: output row i from input row rows[i] (reversed, every other row), bit-equal to
   * the plain kernel on the same row */
  {
    const int nr = (T + 1) / 2;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)nr);
    for (int i = 0; i < nr; i++) rows[i] = T - 1 - 2 * i;
    void *drows = dup_dev(rows, sizeof(int32_t) * (size_t)nr), *dout2 = di_cut_malloc((size_t)nr * n * 2);
    CHECK(di_cuk_rmsnorm_rows(dx, n, drows, dw, nr, n, 1e-6f, dout2, n, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    uint16_t *a = malloc((size_t)T * n * 2), *b2 = malloc((size_t)nr * n * 2);
    di_cut_d2h(a, dout, (size_t)T * n * 2);
    di_cut_d2h(b2, dout2, (size_t)nr * n * 2);
    int same = 1;
    for (int i = 0; i < nr; i++) same &= !memcmp(b2 + (size_t)i * n, a + (size_t)rows[i] * n, (size_t)n * 2);
    CHECKF(same, "rmsnorm_rows differs from rmsnorm on the same rows (T=%d n=%d)", T, n);
    free(rows); free(a); free(b2);
    di_cut_free(drows); di_cut_free(dout2);
  }
  free(gotf);
  di_cut_free(dof);
  printf("rmsnorm T=%d n=%d: rel err %.2e\n", T, n, err);
  free(got); free(ref);
  /* silu-mul */
  int I = n / 2;
  uint16_t *gu = rand_bf16((size_t)T * 2 * I, 2.f);
  void *dgu = dup_dev(gu, (size_t)T * 2 * I * 2), *da = di_cut_malloc((size_t)T * I * 2);
  CHECK(di_cuk_silu_mul(dgu, T, I, da, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  got = bf16_dev_to_f32(da, (size_t)T * I);
  ref = malloc(sizeof(double) * (size_t)T * I);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < I; i++) {
      double g = bf(gu[(size_t)t * 2 * I + i]), u = bf(gu[(size_t)t * 2 * I + I + i]);
      ref[(size_t)t * I + i] = g / (1 + exp(-g)) * u;
    }
  err = rel_err_d(ref, got, (size_t)T * I);
  CHECKF(err < 1e-2, "silu_mul rel err %.3e", err);
  free(got); free(ref); free(gu); free(x); free(w);
  di_cut_free(dx); di_cut_free(dw); di_cut_free(dout); di_cut_free(dgu); di_cut_free(da);
}

/* ---- MLA: prep (norm + rope into the padded cache / query) and attention --------------------------- */
enum { D = DI_CUK_MLA_D, DR = DI_CUK_MLA_R };

static void test_mla_prep(int T, int H, int N, int P, int R, int interleave) {
  uint16_t *kvb = rand_bf16((size_t)T * (R + P), 1.f);
  float *kva = malloc(sizeof(float) * (size_t)T * (R + P)), *kvn = rand_f32(R, 1.f);
  for (size_t i = 0; i < (size_t)T * (R + P); i++) kva[i] = bf(kvb[i]);
  uint16_t *q = rand_bf16((size_t)T * H * (N + P), 1.f);
  int32_t *pos = malloc(4 * (size_t)T), *slots = malloc(4 * (size_t)T);
  float invf[32];
  for (int i = 0; i < P / 2; i++) invf[i] = (float)pow(10000.0, -2.0 * i / P);
  for (int t = 0; t < T; t++) { pos[t] = (int)(urand() * 100000); slots[t] = 3 * t + 1; }
  void *dkva = dup_dev(kvb, (size_t)T * (R + P) * 2), *dkvn = dup_dev(kvn, (size_t)R * 4);
  void *dq = dup_dev(q, (size_t)T * H * (N + P) * 2), *dpos = dup_dev(pos, 4 * (size_t)T),
       *dslot = dup_dev(slots, 4 * (size_t)T), *dinv = dup_dev(invf, sizeof invf);
  void *dQa = di_cut_malloc((size_t)T * H * D * 2), *dcache = di_cut_malloc((size_t)(3 * T + 2) * D * 2);
  di_cuk_rope rope = {dinv, 1.3f, interleave};
  di_status st = di_cuk_mla_prep(dkva, R + P, dq, H * (N + P), dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa,
                                 dcache, 0, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *cache = bf16_dev_to_f32(dcache, (size_t)(3 * T + 2) * D), *Qa = bf16_dev_to_f32(dQa, (size_t)T * H * D);
  size_t nref = (size_t)T * (D + H * (D - DR));
  double *ref = malloc(sizeof(double) * nref);
  float *got = malloc(sizeof(float) * nref);
  size_t k = 0;
  for (int t = 0; t < T; t++) {
    const float *x = kva + (size_t)t * (R + P);
    double ss = 0;
    for (int i = 0; i < R; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / R + 1e-6);
    double e[D] = {0};
    for (int i = 0; i < R; i++) e[i] = x[i] * r * kvn[i];
    double (*qe)[64] = calloc((size_t)H, sizeof *qe);
    for (int i = 0; i < P / 2; i++) {
      double ang = (double)pos[t] * invf[i], c = cos(ang) * 1.3, s = sin(ang) * 1.3;
      int a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + P / 2;
      e[DR + a] = x[R + a] * c - x[R + b] * s;
      e[DR + b] = x[R + b] * c + x[R + a] * s;
      for (int h = 0; h < H; h++) {
        const uint16_t *qp = q + (size_t)t * H * (N + P) + (size_t)h * (N + P) + N;
        qe[h][a] = bf(qp[a]) * c - bf(qp[b]) * s;
        qe[h][b] = bf(qp[b]) * c + bf(qp[a]) * s;
      }
    }
    for (int i = 0; i < D; i++) { ref[k] = e[i]; got[k++] = cache[(size_t)slots[t] * D + i]; }
    for (int h = 0; h < H; h++)
      for (int i = DR; i < D; i++) { ref[k] = qe[h][i - DR]; got[k++] = Qa[((size_t)t * H + h) * D + i]; }
    free(qe);
    for (int h = 0; h < H; h++) /* latent padding of Qa must be zero */
      for (int i = R; i < DR; i++) if (Qa[((size_t)t * H + h) * D + i] != 0.f) { CHECKF(0, "Qa padding not zero"); break; }
  }
  double err = rel_err_d(ref, got, k);
  CHECKF(err < 1e-2, "mla_prep R=%d P=%d: rel err %.3e", R, P, err);
  printf("mla_prep T=%d H=%d R=%d P=%d interleave=%d: rel err %.2e\n", T, H, R, P, interleave, err);
  free(kva); free(kvb); free(kvn); free(q); free(pos); free(slots); free(cache); free(Qa); free(ref); free(got);
  di_cut_free(dkva); di_cut_free(dkvn); di_cut_free(dq); di_cut_free(dpos); di_cut_free(dslot); di_cut_free(dinv);
  di_cut_free(dQa); di_cut_free(dcache);
}

/* Attention: n_seq sequences; sequence s has n_tok[s] new tokens ending at position ctx[s]-1.
 * Items: rows of each sequence's tokens cut into bm, each split into `split` key ranges. */
static int test_kv8 = 0; /* --kv-cache-dtype fp8: the prep kernels write, the attention kernels read FP8 entries */

/* The FP8 entry's write rule on the device (di_cuk_kv8_quantize, the rule the prep kernels apply)
 * against the CPU's di_kv_fp8_quantize: bit for bit, scales and codes, on rows of varied magnitude
 * (one with an all-zero group, one past E4M3's range, rank R < 512: zero-padded groups, scale 1). */
static void test_kv8_quant(int n, int R) {
  float *x = malloc(sizeof(float) * (size_t)n * R);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < R; c++) {
      const float mag = r == 1 ? 0.f : r == 2 ? 3e4f : powf(10.f, (float)(r % 7) - 4.f);
      x[(size_t)r * R + c] = (float)nrand() * mag * (c % 128 == 5 ? 8.f : 1.f);
    }
  for (int c = 0; c < R && c < 128; c++) x[(size_t)3 * R + c] = 0.f; /* row 3: first group all zero */
  void *dx = dup_dev(x, sizeof(float) * (size_t)n * R), *de = di_cut_malloc((size_t)n * DI_CUK_KV8_ROW);
  unsigned char *e = calloc((size_t)n, DI_CUK_KV8_ROW);
  di_cut_h2d(de, e, (size_t)n * DI_CUK_KV8_ROW);
  CHECK(di_cuk_kv8_quantize(dx, R, n, de, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  di_cut_d2h(e, de, (size_t)n * DI_CUK_KV8_ROW);
  int bad = 0;
  for (int r = 0; r < n; r++) {
    float sc[4] = {1.f, 1.f, 1.f, 1.f};
    uint8_t code[DR];
    memset(code, 0, sizeof code);
    di_kv_fp8_quantize(x + (size_t)r * R, R, sc, code);
    const unsigned char *er = e + (size_t)r * DI_CUK_KV8_ROW;
    bad += memcmp(er + DI_CUK_KV8_SCALES, sc, sizeof sc) != 0;
    bad += memcmp(er + DI_CUK_KV8_LAT, code, DR) != 0;
  }
  CHECKF(bad == 0, "kv8 quantize rank %d: %d of %d rows differ from di_kv_fp8_quantize", R, bad, n);
  printf("kv8 quantize %d rows rank %d: scales and codes bit-equal to the CPU's rule\n", n, R);
  free(x); free(e);
  di_cut_free(dx); di_cut_free(de);
}

/* The prep kernel's FP8 entries (kv_fp8 = 1) against its bf16 ones from the same inputs: the rope part
 * bit-equal, the latent equal to the CPU's rule applied to the float64 reference of the normed latent
 * within the last rounding step (scales to 1e-5 relative; a code may differ by one E4M3 step where the
 * device's f32 norm and the reference straddle a rounding boundary, at most 1% of them), padded groups
 * (R < 512) scale 1 and code 0; and the fused decode launch (prep + absorption) writes the same bytes. */
static void test_kv8_prep(di_cu_blas *blas, int T, int H, int N, int P, int R) {
  (void)blas;
  uint16_t *kvb = rand_bf16((size_t)T * (R + P), 1.f);
  float *kvn = rand_f32(R, 1.f);
  const int ldq = H * (N + P);
  uint16_t *q = rand_bf16((size_t)T * ldq, 1.f);
  int32_t pos[16], slots[16]; /* T <= 16 */
  float invf[32];
  for (int i = 0; i < P / 2; i++) invf[i] = (float)pow(10000.0, -2.0 * i / P);
  for (int t = 0; t < T; t++) { pos[t] = (int)(urand() * 5000); slots[t] = 2 * t + 1; }
  void *dkva = dup_dev(kvb, (size_t)T * (R + P) * 2), *dkvn = dup_dev(kvn, (size_t)R * 4),
       *dq = dup_dev(q, (size_t)T * ldq * 2), *dpos = dup_dev(pos, 4 * (size_t)T), *dslot = dup_dev(slots, 4 * (size_t)T),
       *dinv = dup_dev(invf, sizeof invf);
  const size_t nslot = (size_t)2 * T + 2;
  void *dQa = di_cut_malloc((size_t)T * H * D * 2), *dcb = di_cut_malloc(nslot * D * 2),
       *dc8 = di_cut_malloc(nslot * DI_CUK_KV8_ROW);
  di_cuk_rope rope = {dinv, 1.1f, 0};
  CHECK(di_cuk_mla_prep(dkva, R + P, dq, ldq, dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa, dcb, 0, NULL) == DI_OK);
  CHECK(di_cuk_mla_prep(dkva, R + P, dq, ldq, dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa, dc8, 1, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  uint16_t *cb = malloc(nslot * D * 2);
  unsigned char *c8 = malloc(nslot * DI_CUK_KV8_ROW);
  di_cut_d2h(cb, dcb, nslot * D * 2);
  di_cut_d2h(c8, dc8, nslot * DI_CUK_KV8_ROW);
  int rope_bad = 0, pad_bad = 0, code_off = 0, code_far = 0;
  double sc_err = 0;
  for (int t = 0; t < T; t++) {
    const unsigned char *e = c8 + (size_t)slots[t] * DI_CUK_KV8_ROW;
    rope_bad += memcmp(e + DI_CUK_KV8_PE, cb + (size_t)slots[t] * D + DR, 2 * DI_CUK_MLA_P) != 0;
    float x[DR];
    double ss = 0;
    for (int i = 0; i < R; i++) ss += (double)bf(kvb[(size_t)t * (R + P) + i]) * bf(kvb[(size_t)t * (R + P) + i]);
    const double r = 1.0 / sqrt(ss / R + 1e-6);
    for (int i = 0; i < DR; i++) x[i] = i < R ? (float)(bf(kvb[(size_t)t * (R + P) + i]) * r * kvn[i]) : 0.f;
    float sc[4];
    uint8_t code[DR];
    di_kv_fp8_quantize(x, DR, sc, code);
    const float *gs = (const float *)(e + DI_CUK_KV8_SCALES);
    for (int g = 0; g < 4; g++) {
      if (g * 128 >= R) pad_bad += gs[g] != 1.f;
      const double d = fabs((double)gs[g] - sc[g]) / sc[g];
      if (d > sc_err) sc_err = d;
    }
    for (int i = 0; i < DR; i++) {
      const uint8_t a = e[DI_CUK_KV8_LAT + i], b = code[i];
      if (i >= R) pad_bad += a != 0;
      if (a == b) continue;
      code_off++;
      if ((a ^ b) & 0x80 || abs((int)(a & 0x7f) - (int)(b & 0x7f)) > 1) code_far++;
    }
  }
  CHECKF(rope_bad == 0, "kv8 prep R=%d: %d rope parts differ from the bf16 entry", R, rope_bad);
  CHECKF(pad_bad == 0, "kv8 prep R=%d: %d padding scales / codes not 1 / 0", R, pad_bad);
  CHECKF(sc_err < 1e-5, "kv8 prep R=%d: scale rel err %.3e", R, sc_err);
  CHECKF(code_far == 0 && code_off <= T * DR / 100, "kv8 prep R=%d: %d codes off by one step, %d further", R, code_off,
         code_far);
  /* the decode launch (prep fused with the absorption) writes the same entries */
  if (T <= 8) {
    const int Dv = 128;
    uint16_t *kvb_w = rand_bf16((size_t)H * (N + Dv) * R, 0.1f);
    void *dw = dup_dev(kvb_w, (size_t)H * (N + Dv) * R * 2), *dc8b = di_cut_malloc(nslot * DI_CUK_KV8_ROW);
    unsigned char *c8b = calloc(nslot, DI_CUK_KV8_ROW);
    memset(c8, 0, nslot * DI_CUK_KV8_ROW); /* both from zero: the unwritten slots compare too */
    di_cut_h2d(dc8, c8, nslot * DI_CUK_KV8_ROW);
    di_cut_h2d(dc8b, c8b, nslot * DI_CUK_KV8_ROW);
    const int64_t sw = (int64_t)(N + Dv) * R;
    CHECK(di_cuk_mla_prep(dkva, R + P, dq, ldq, dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa, dc8, 1, NULL) == DI_OK);
    CHECK(di_cuk_mla_prep_absorb_ok(T, H, R, dw, R, sw));
    CHECK(di_cuk_mla_prep_absorb(dkva, R + P, dq, ldq, dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa, dc8b, 1, dw, R,
                                 sw, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    di_cut_d2h(c8, dc8, nslot * DI_CUK_KV8_ROW);
    di_cut_d2h(c8b, dc8b, nslot * DI_CUK_KV8_ROW);
    CHECKF(memcmp(c8, c8b, nslot * DI_CUK_KV8_ROW) == 0, "kv8 prep+absorb T=%d R=%d: entries differ from the prep's", T, R);
    free(kvb_w); free(c8b);
    di_cut_free(dw); di_cut_free(dc8b);
  }
  printf("kv8 prep T=%d H=%d R=%d P=%d: rope bit-equal, scales rel err %.1e, %d of %d codes one step off; "
         "fused decode launch bit-equal\n", T, H, R, P, sc_err, code_off, T * DR);
  free(kvb); free(kvn); free(q); free(cb); free(c8);
  void *ptrs[] = {dkva, dkvn, dq, dpos, dslot, dinv, dQa, dcb, dc8};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) di_cut_free(ptrs[i]);
}

/* The MHA prefill's gather from the FP8 pool: every gathered row bit-equal to bf16(code x scale) of its
 * entry's latent (f32 product, then nearest-even bf16: the staging rule of every attention kernel) and
 * to its bf16 rope part, through scrambled slots. */
static void test_kv8_gather(int n_entries, int n) {
  const size_t eb = DI_CUK_KV8_ROW;
  unsigned char *e = malloc(eb * (size_t)n_entries);
  float x[DR];
  for (int r = 0; r < n_entries; r++) {
    unsigned char *o = e + eb * r;
    for (int i = 0; i < DR; i++) x[i] = (float)nrand() * (float)(1 + i / 128) * 0.3f;
    di_kv_fp8_quantize(x, DR, (float *)(o + DI_CUK_KV8_SCALES), o + DI_CUK_KV8_LAT);
    uint16_t *pe = (uint16_t *)(o + DI_CUK_KV8_PE);
    for (int i = 0; i < D - DR; i++) pe[i] = di_f32_to_bf16((float)nrand());
  }
  int32_t *slots = malloc(4 * (size_t)n);
  for (int i = 0; i < n; i++) slots[i] = (int32_t)(urand() * n_entries) % n_entries;
  void *de = dup_dev(e, eb * (size_t)n_entries), *ds = dup_dev(slots, 4 * (size_t)n), *dg = di_cut_malloc((size_t)n * D * 2);
  CHECK(di_cuk_mha_gather(de, 1, ds, n, dg, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  uint16_t *g = malloc((size_t)n * D * 2);
  di_cut_d2h(g, dg, (size_t)n * D * 2);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const unsigned char *o = e + eb * slots[i];
    const float *sc = (const float *)(o + DI_CUK_KV8_SCALES);
    const uint16_t *pe = (const uint16_t *)(o + DI_CUK_KV8_PE);
    for (int c = 0; c < D; c++) {
      const uint16_t want = c < DR ? di_f32_to_bf16(di_fp8e4m3_to_f32(o[DI_CUK_KV8_LAT + c]) * sc[c / 128]) : pe[c - DR];
      bad += g[(size_t)i * D + c] != want;
    }
  }
  CHECKF(bad == 0, "kv8 mha gather: %d of %d values differ from bf16(code x scale)", bad, n * D);
  printf("kv8 mha gather %d rows of %d entries: bit-equal to bf16(code x scale) and the rope part\n", n, n_entries);
  free(e); free(slots); free(g);
  di_cut_free(de); di_cut_free(ds); di_cut_free(dg);
}

/* The fused decode launch (prep + absorption) against the two kernels it replaces: bitwise equal
 * Qa (rope and latent columns) and cache entries. */
static void test_mla_prep_absorb(di_cu_blas *blas, int T, int H, int N, int P, int R) {
  const int Dv = 128, ldq = H * (N + P);
  uint16_t *kvb = rand_bf16((size_t)T * (R + P), 1.f), *q = rand_bf16((size_t)T * ldq, 1.f);
  uint16_t *kvb_w = rand_bf16((size_t)H * (N + Dv) * R, 0.1f); /* kv_b: per head N rows of W_UK, Dv of W_UV */
  float *kvn = rand_f32(R, 1.f), invf[32];
  for (int i = 0; i < P / 2; i++) invf[i] = (float)pow(10000.0, -2.0 * i / P);
  int32_t pos[8], slots[8];
  for (int t = 0; t < T; t++) { pos[t] = (int)(urand() * 5000); slots[t] = 2 * t + 1; }
  void *dkva = dup_dev(kvb, (size_t)T * (R + P) * 2), *dkvn = dup_dev(kvn, (size_t)R * 4),
       *dq = dup_dev(q, (size_t)T * ldq * 2), *dw = dup_dev(kvb_w, (size_t)H * (N + Dv) * R * 2),
       *dpos = dup_dev(pos, 4 * (size_t)T), *dslot = dup_dev(slots, 4 * (size_t)T), *dinv = dup_dev(invf, sizeof invf);
  const size_t nqa = (size_t)T * H * D, nc = (size_t)(2 * T + 2) * D;
  void *dQa1 = di_cut_malloc(nqa * 2), *dQa2 = di_cut_malloc(nqa * 2), *dc1 = di_cut_malloc(nc * 2),
       *dc2 = di_cut_malloc(nc * 2);
  uint16_t *zero = calloc(nqa > nc ? nqa : nc, 2);
  di_cut_h2d(dQa1, zero, nqa * 2); di_cut_h2d(dQa2, zero, nqa * 2); di_cut_h2d(dc1, zero, nc * 2); di_cut_h2d(dc2, zero, nc * 2);
  di_cuk_rope rope = {dinv, 1.1f, 1};
  const int64_t sw = (int64_t)(N + Dv) * R;
  CHECK(di_cuk_mla_prep_absorb_ok(T, H, R, dw, R, sw));
  di_status st = di_cuk_mla_prep_absorb(dkva, R + P, dq, ldq, dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa1, dc1,
                                        0, dw, R, sw, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cuk_mla_prep(dkva, R + P, dq, ldq, dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa2, dc2, 0, NULL) == DI_OK);
  CHECK(di_cu_gemm_batched(blas, H, T, R, N, dq, ldq, N + P, dw, R, sw, 1, dQa2, H * D, D, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  uint16_t *a = malloc(nqa * 2), *b2 = malloc(nqa * 2), *c1 = malloc(nc * 2), *c2 = malloc(nc * 2);
  di_cut_d2h(a, dQa1, nqa * 2); di_cut_d2h(b2, dQa2, nqa * 2); di_cut_d2h(c1, dc1, nc * 2); di_cut_d2h(c2, dc2, nc * 2);
  int dq_ = 0, dc_ = 0;
  for (size_t i = 0; i < nqa; i++) dq_ += a[i] != b2[i];
  for (size_t i = 0; i < nc; i++) dc_ += c1[i] != c2[i];
  CHECKF(dq_ == 0 && dc_ == 0, "mla prep+absorb T=%d H=%d R=%d: %d Qa and %d cache values differ", T, H, R, dq_, dc_);
  printf("mla prep+absorb fused T=%d H=%d N=%d P=%d R=%d: Qa and cache equal to the two kernels\n", T, H, N, P, R);
  free(kvb); free(q); free(kvb_w); free(kvn); free(zero); free(a); free(b2); free(c1); free(c2);
  void *ptrs[] = {dkva, dkvn, dq, dw, dpos, dslot, dinv, dQa1, dQa2, dc1, dc2};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) di_cut_free(ptrs[i]);
}

/* split > 0: items of bm rows over `split` key ranges (mla_attn + mla_combine); split < 0: the decode
 * cluster form, -split clusters of `cl` CTAs per 16-row group (mla_attn_cluster, + mla_combine when
 * more than one) */
static int test_cl = 8, test_fold_dv = 0, test_fold_ld = 0; /* fold: W_UV (dv x ld per head) in the epilogue */
static int test_strided = 0; /* the cluster form with key tiles dealt round-robin (batch-invariant mode) */
static void test_mla_attn(int H, int n_seq, const int *ctx, const int *n_tok, int bm, int split, const char *label) {
  const int cl = test_cl, fdv = split == -1 ? test_fold_dv : 0, fld = test_fold_ld;
  int T = 0, max_blocks = 0, total_blocks = 0;
  for (int s = 0; s < n_seq; s++) {
    T += n_tok[s];
    int nb = (ctx[s] + 63) / 64;
    total_blocks += nb;
    if (nb > max_blocks) max_blocks = nb;
  }
  /* scrambled block tables */
  int32_t *perm = malloc(4 * (size_t)total_blocks);
  for (int i = 0; i < total_blocks; i++) perm[i] = i;
  for (int i = total_blocks - 1; i > 0; i--) { int j = (int)(urand() * (i + 1)); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
  int32_t *bt = calloc((size_t)n_seq * max_blocks, 4);
  int32_t *pos = malloc(4 * (size_t)T), *seq_of = malloc(4 * (size_t)T);
  for (int s = 0, used = 0, t = 0; s < n_seq; s++) {
    int nb = (ctx[s] + 63) / 64;
    for (int j = 0; j < nb; j++) bt[s * max_blocks + j] = perm[used++];
    for (int i = 0; i < n_tok[s]; i++, t++) { pos[t] = ctx[s] - n_tok[s] + i; seq_of[t] = s; }
  }
  size_t cache_n = (size_t)total_blocks * 64 * D;
  uint16_t *cache = rand_bf16(cache_n, 1.f);
  /* test_kv8: the pool holds FP8 entries of these rows (the CPU's rule, di_kv_fp8_quantize; rope bf16), and
   * the reference attends to their dequantized values code * scale (deq) */
  unsigned char *c8 = NULL;
  float *deq = NULL;
  if (test_kv8) {
    const size_t nrow = cache_n / D;
    c8 = calloc(nrow, DI_CUK_KV8_ROW);
    deq = malloc(sizeof(float) * cache_n);
    float x[DR];
    for (size_t r = 0; r < nrow; r++) {
      const uint16_t *e = cache + r * D;
      unsigned char *o = c8 + r * DI_CUK_KV8_ROW;
      for (int i = 0; i < DR; i++) x[i] = bf(e[i]) * (float)(1 + (i / 128)); /* groups of differing scale */
      di_kv_fp8_quantize(x, DR, (float *)(o + DI_CUK_KV8_SCALES), o + DI_CUK_KV8_LAT);
      memcpy(o + DI_CUK_KV8_PE, e + DR, 2 * (D - DR));
      const float *sc = (const float *)(o + DI_CUK_KV8_SCALES);
      for (int i = 0; i < DR; i++) deq[r * D + i] = di_fp8e4m3_to_f32(o[DI_CUK_KV8_LAT + i]) * sc[i / 128];
      for (int i = DR; i < D; i++) deq[r * D + i] = bf(e[i]);
    }
  }
  uint16_t *Q = rand_bf16((size_t)T * H * D, 0.25f);
  /* items */
  const int n_cl = split < 0 ? -split : 0;
  if (n_cl) split = n_cl * cl;
  int cap = T * H / 16 * split + n_seq * split + 16;
  di_cuk_attn_item *items = malloc(sizeof *items * (size_t)cap);
  di_cuk_combine_item *citems = malloc(sizeof *citems * (size_t)cap);
  int ni = 0, nci = 0, part = 0;
  for (int s = 0, t0 = 0; s < n_seq; t0 += n_tok[s], s++) {
    for (int r0 = t0 * H; r0 < (t0 + n_tok[s]) * H; r0 += bm) {
      int r1 = r0 + bm < (t0 + n_tok[s]) * H ? r0 + bm : (t0 + n_tok[s]) * H;
      int maxpos = pos[(r1 - 1) / H];
      if (n_cl) {
        ni += di_cuk_attn_cluster_items(r0, r1, s, maxpos + 1, pos[t0], cl, n_cl, test_strided, &part, items + ni, citems,
                                        &nci);
        continue;
      }
      int nkt = (maxpos + 64) / 64, S = split < nkt ? split : nkt, per = (nkt + S - 1) / S;
      S = (nkt + per - 1) / per;
      if (S == 1) { items[ni++] = (di_cuk_attn_item){r0, r1, s, 0, maxpos + 1, -1, pos[t0]}; continue; }
      citems[nci++] = (di_cuk_combine_item){r0, r1, part, S};
      for (int sp = 0; sp < S; sp++) {
        int k0 = sp * per * 64, k1 = (sp + 1) * per * 64;
        if (k1 > maxpos + 1) k1 = maxpos + 1;
        items[ni++] = (di_cuk_attn_item){r0, r1, s, k0, k1, part++, pos[t0]};
      }
    }
  }
  int32_t counts[2] = {ni, nci};
  void *dQ = dup_dev(Q, (size_t)T * H * D * 2),
       *dc = test_kv8 ? dup_dev(c8, cache_n / D * DI_CUK_KV8_ROW) : dup_dev(cache, cache_n * 2);
  void *dbt = dup_dev(bt, 4 * (size_t)n_seq * max_blocks), *dpos = dup_dev(pos, 4 * (size_t)T);
  void *dit = dup_dev(items, sizeof *items * (size_t)(ni ? ni : 1)), *dcit = dup_dev(citems, sizeof *citems * (size_t)(nci ? nci : 1));
  void *dn = dup_dev(counts, 8);
  void *dout = di_cut_malloc((size_t)T * H * DR * 2);
  void *dpo = di_cut_malloc((size_t)(part ? part : 1) * 64 * DR * 4), *dpl = di_cut_malloc((size_t)(part ? part : 1) * 64 * 4);
  const float scale = 0.0721f;
  double t0 = di_cut_time_ms();
  uint16_t *wuv = fdv ? rand_bf16((size_t)H * fdv * fld, 0.05f) : NULL;
  void *dwuv = fdv ? dup_dev(wuv, (size_t)H * fdv * fld * 2) : NULL, *dv_out = fdv ? di_cut_malloc((size_t)T * H * fdv * 2) : NULL;
  const di_cuk_uv_fold fold = {dwuv, (int64_t)fdv * fld, fld, fdv, H * fdv, dv_out};
  di_status st = n_cl ? di_cuk_mla_attn_cluster(dQ, dc, test_kv8, dbt, max_blocks, dpos, H, scale, dit, dn, ni, cl, test_strided,
                                                dout, dpo, dpl, fdv ? &fold : NULL, NULL)
                      : di_cuk_mla_attn(dQ, dc, test_kv8, dbt, max_blocks, dpos, H, scale, dit, dn, ni, bm, dout, dpo, dpl, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (nci) CHECK(di_cuk_mla_combine(dcit, (int32_t *)dn + 1, nci, dpo, dpl, dout, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  double ms = di_cut_time_ms() - t0;
  float *got = bf16_dev_to_f32(dout, (size_t)T * H * DR);
  if (n_cl && !nci) { /* the first KV tile copied after the wait instead of partly before: bit-equal */
    di_cuk_attn_set_preload(0);
    st = di_cuk_mla_attn_cluster(dQ, dc, test_kv8, dbt, max_blocks, dpos, H, scale, dit, dn, ni, cl, test_strided, dout, dpo,
                                 dpl, fdv ? &fold : NULL, NULL);
    di_cuk_attn_set_preload(1);
    CHECKF(st == DI_OK, "%s", di_last_error());
    CHECK(di_cut_sync() == 0);
    float *got2 = bf16_dev_to_f32(dout, (size_t)T * H * DR);
    CHECKF(memcmp(got, got2, sizeof(float) * (size_t)T * H * DR) == 0, "%s: preloaded and plain KV tiles differ", label);
    free(got2);
  }
  /* reference, double */
  double *ref = malloc(sizeof(double) * (size_t)T * H * DR);
  int maxctx = 0;
  for (int s = 0; s < n_seq; s++) if (ctx[s] > maxctx) maxctx = ctx[s];
  double *sc = malloc(sizeof(double) * (size_t)maxctx);
  float *qf = malloc(sizeof(float) * D), *kf = malloc(sizeof(float) * (size_t)maxctx * D);
  for (int t = 0; t < T; t++) {
    int s = seq_of[t];
    for (int j = 0; j <= pos[t]; j++) {
      const size_t row = (size_t)bt[s * max_blocks + j / 64] * 64 + j % 64;
      const uint16_t *e = cache + row * D;
      for (int i = 0; i < D; i++) kf[(size_t)j * D + i] = test_kv8 ? deq[row * D + i] : bf(e[i]);
    }
    for (int h = 0; h < H; h++) {
      for (int i = 0; i < D; i++) qf[i] = bf(Q[((size_t)t * H + h) * D + i]);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= pos[t]; j++) {
        double a = 0;
        const float *e = kf + (size_t)j * D;
        for (int i = 0; i < D; i++) a += (double)qf[i] * e[i];
        sc[j] = a * scale;
        if (sc[j] > mx) mx = sc[j];
      }
      for (int j = 0; j <= pos[t]; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
      double *o = ref + ((size_t)t * H + h) * DR;
      for (int i = 0; i < DR; i++) o[i] = 0;
      for (int j = 0; j <= pos[t]; j++) {
        const float *e = kf + (size_t)j * D;
        double p = sc[j] / sum;
        for (int i = 0; i < DR; i++) o[i] += p * e[i];
      }
    }
  }
  double err;
  if (fdv) { /* the epilogue's v = W_UV[h] . o_lat[:ld] in place of o_lat */
    double *vref = malloc(sizeof(double) * (size_t)T * H * fdv);
    for (int r = 0; r < T * H; r++)
      for (int d = 0; d < fdv; d++) {
        double a = 0;
        for (int c = 0; c < fld; c++) a += ref[(size_t)r * DR + c] * bf(wuv[((size_t)(r % H) * fdv + d) * fld + c]);
        vref[(size_t)r * fdv + d] = a;
      }
    float *gv = bf16_dev_to_f32(dv_out, (size_t)T * H * fdv);
    err = rel_err_d(vref, gv, (size_t)T * H * fdv);
    CHECKF(err < 1e-2, "mla_attn %s with W_UV folded (dv %d, rank %d): rel err %.3e", label, fdv, fld, err);
    printf("mla_attn %-34s + W_UV fold dv=%d rank=%d: rel err %.2e\n", label, fdv, fld, err);
    free(vref); free(gv); free(wuv);
    di_cut_free(dwuv); di_cut_free(dv_out);
  }
  err = rel_err_d(ref, got, (size_t)T * H * DR);
  if (!fdv) CHECKF(err < 1e-2, "mla_attn %s: rel err %.3e", label, err);
  if (!fdv)
    printf("mla_attn %-34s H=%3d T=%4d items=%4d parts=%4d%s%s: rel err %.2e (%.2f ms incl. launch)\n", label, H, T,
           ni, part, n_cl ? (cl == 16 ? " cl16" : " cl8") : "", test_kv8 ? " fp8 KV" : "", err, ms);
  free(perm); free(bt); free(pos); free(seq_of); free(cache); free(Q); free(items); free(citems); free(got); free(ref);
  free(sc); free(qf); free(kf); free(c8); free(deq);
  di_cut_free(dQ); di_cut_free(dc); di_cut_free(dbt); di_cut_free(dpos); di_cut_free(dit); di_cut_free(dcit);
  di_cut_free(dn); di_cut_free(dout); di_cut_free(dpo); di_cut_free(dpl);
}

/* ---- MoE: routing variants; then route -> permute -> grouped GEMMs -> combine --------------------- */
static void ref_route(const float *lg, const float *bias, di_cuk_router r, int32_t *ids, float *w) {
  int E = r.E;
  double sc[1024], ch[1024];
  if (r.sigmoid) for (int e = 0; e < E; e++) sc[e] = 1 / (1 + exp(-(double)lg[e]));
  else {
    double mx = -1e300, s = 0;
    for (int e = 0; e < E; e++) if (lg[e] > mx) mx = lg[e];
    for (int e = 0; e < E; e++) s += (sc[e] = exp(lg[e] - mx));
    for (int e = 0; e < E; e++) sc[e] /= s;
  }
  for (int e = 0; e < E; e++) ch[e] = sc[e] + (r.method == 2 && bias ? bias[e] : 0);
  if (r.method != 0 && r.n_group > 1) {
    int G = r.n_group, per = E / G, keep[64] = {0};
    double gs[64];
    for (int g = 0; g < G; g++) {
      double a = -1e300, b = -1e300;
      for (int i = 0; i < per; i++) { double v = ch[g * per + i]; if (v > a) { b = a; a = v; } else if (v > b) b = v; }
      gs[g] = r.method == 2 ? a + b : a;
    }
    for (int k = 0; k < r.topk_group; k++) {
      int best = -1;
      for (int g = 0; g < G; g++) if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
      keep[best] = 1;
    }
    for (int g = 0; g < G; g++) if (!keep[g]) for (int i = 0; i < per; i++) ch[g * per + i] = -1e300;
  }
  unsigned char taken[1024] = {0};
  double sum = 0;
  for (int k = 0; k < r.k; k++) {
    int best = -1;
    for (int e = 0; e < E; e++) if (!taken[e] && (best < 0 || ch[e] > ch[best])) best = e;
    taken[best] = 1;
    ids[k] = best;
    w[k] = (float)sc[best];
    sum += sc[best];
  }
  int normd = r.norm_topk && r.k > 1;
  for (int k = 0; k < r.k; k++) {
    if (normd) w[k] = (float)(w[k] / (sum + 1e-20));
    if (!normd || r.scale_after_norm) w[k] *= r.routed_scale;
  }
}

static void test_route(int T, di_cuk_router r, const char *label) {
  float *lg = rand_f32((size_t)T * r.E, 2.f), *bias = rand_f32(r.E, 0.1f);
  void *dl = dup_dev(lg, (size_t)T * r.E * 4), *db = dup_dev(bias, (size_t)r.E * 4);
  void *dids = di_cut_malloc((size_t)T * r.k * 4), *dw = di_cut_malloc((size_t)T * r.k * 4);
  di_status st = di_cuk_moe_route(dl, r.method == 2 ? db : NULL, T, r, dids, dw, NULL, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  int32_t *ids = malloc((size_t)T * r.k * 4), rid[8];
  float *w = malloc((size_t)T * r.k * 4), rw[8];
  di_cut_d2h(ids, dids, (size_t)T * r.k * 4);
  di_cut_d2h(w, dw, (size_t)T * r.k * 4);
  int bad = 0;
  double werr = 0;
  for (int t = 0; t < T; t++) {
    ref_route(lg + (size_t)t * r.E, bias, r, rid, rw);
    for (int k = 0; k < r.k; k++) {
      if (ids[t * r.k + k] != rid[k]) bad++;
      double d = fabs(w[t * r.k + k] - rw[k]) / (fabs(rw[k]) + 1e-6);
      if (d > werr) werr = d;
    }
  }
  CHECKF(bad == 0 && werr < 1e-5, "route %s: %d id mismatches, weight err %.3e", label, bad, werr);
  printf("route %-28s E=%3d k=%d T=%d: id mismatches %d, max weight rel err %.2e\n", label, r.E, r.k, T, bad, werr);
  free(lg); free(bias); free(ids); free(w);
  di_cut_free(dl); di_cut_free(db); di_cut_free(dids); di_cut_free(dw);
}

/* The fused gate (norm + router logits + routing; a cluster per token, its CTA 0 routing) against
 * the three kernels it replaces (bitwise: the same arithmetic) and a double-precision reference of
 * the logits; at T == 1 the permutation outputs too. */
static void test_moe_gate(int T, int H, di_cuk_router r, const char *label) {
  const int E = r.E, kt = r.k + r.n_shared, ldxn = H + 64, Et = E + r.n_shared;
  float *h = rand_f32((size_t)T * H, 1.f), *nw = rand_f32(H, 1.f), *bias = rand_f32(E, 0.05f);
  uint16_t *W = rand_bf16((size_t)E * H, 1.f / sqrtf((float)H));
  void *dh = dup_dev(h, (size_t)T * H * 4), *dnw = dup_dev(nw, (size_t)H * 4), *db = dup_dev(bias, (size_t)E * 4),
       *dW = dup_dev(W, (size_t)E * H * 2);
  const float *bptr = r.method == 2 ? (const float *)db : NULL;
  void *dxn = di_cut_malloc((size_t)T * ldxn * 2), *dxn2 = di_cut_malloc((size_t)T * ldxn * 2),
       *dxf = di_cut_malloc((size_t)T * H * 4), *dlg = di_cut_malloc((size_t)T * E * 4),
       *dlg2 = di_cut_malloc((size_t)T * E * 4),
       *dids = di_cut_malloc((size_t)T * kt * 4), *dw = di_cut_malloc((size_t)T * kt * 4),
       *dids2 = di_cut_malloc((size_t)T * kt * 4), *dw2 = di_cut_malloc((size_t)T * kt * 4);
  void *pv[2][5];
  for (int i = 0; i < 2; i++) {
    pv[i][0] = di_cut_malloc(64 * 4); pv[i][1] = di_cut_malloc(64 * 4); pv[i][2] = di_cut_malloc((size_t)(Et + 1) * 4);
    pv[i][3] = di_cut_malloc(64 * 4); pv[i][4] = di_cut_malloc(16);
  }
  di_cuk_perm pm = {16, pv[0][0], pv[0][1], pv[0][2], pv[0][3], pv[0][4]};
  di_cuk_perm pm2 = {16, pv[1][0], pv[1][1], pv[1][2], pv[1][3], pv[1][4]};
  for (int rep = 0; rep < 2; rep++) {
    di_status st = di_cuk_moe_gate(dh, dnw, 1e-6f, T, H, dW, bptr, r, dxn, ldxn, dlg, dids, dw, T == 1 ? &pm : NULL,
                                   NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
  }
  CHECK(di_cuk_rmsnorm(dh, H, dnw, T, H, 1e-6f, dxn2, ldxn, dxf, NULL) == DI_OK);
  CHECK(di_cuk_router_logits(dxf, dW, T, E, H, dlg2, NULL) == DI_OK);
  CHECK(di_cuk_moe_route(dlg2, bptr, T, r, dids2, dw2, T == 1 ? &pm2 : NULL, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  const size_t nxn = (size_t)T * ldxn, nlg = (size_t)T * E, nid = (size_t)T * kt;
  uint16_t *xn = malloc(nxn * 2), *xn2 = malloc(nxn * 2);
  float *lg = malloc(nlg * 4), *lg2 = malloc(nlg * 4), *w = malloc(nid * 4), *w2 = malloc(nid * 4);
  int32_t *ids = malloc(nid * 4), *ids2 = malloc(nid * 4);
  di_cut_d2h(xn, dxn, nxn * 2); di_cut_d2h(xn2, dxn2, nxn * 2);
  di_cut_d2h(lg, dlg, nlg * 4); di_cut_d2h(lg2, dlg2, nlg * 4);
  di_cut_d2h(ids, dids, nid * 4); di_cut_d2h(ids2, dids2, nid * 4);
  di_cut_d2h(w, dw, nid * 4); di_cut_d2h(w2, dw2, nid * 4);
  int diff_xn = 0, diff_lg = 0, diff_route = 0;
  for (int t = 0; t < T; t++)
    for (int c = 0; c < H; c++) diff_xn += xn[(size_t)t * ldxn + c] != xn2[(size_t)t * ldxn + c];
  for (size_t i = 0; i < nlg; i++) diff_lg += lg[i] != lg2[i];
  for (size_t i = 0; i < nid; i++) diff_route += ids[i] != ids2[i] || w[i] != w2[i];
  /* logits against double precision */
  double *ref = malloc(sizeof(double) * nlg);
  for (int t = 0; t < T; t++) {
    double ss = 0;
    for (int c = 0; c < H; c++) ss += (double)h[(size_t)t * H + c] * h[(size_t)t * H + c];
    double inv = 1 / sqrt(ss / H + 1e-6);
    for (int e = 0; e < E; e++) {
      double a = 0;
      for (int c = 0; c < H; c++) a += h[(size_t)t * H + c] * inv * nw[c] * (double)bf(W[(size_t)e * H + c]);
      ref[(size_t)t * E + e] = a;
    }
  }
  double err = rel_err_d(ref, lg, nlg);
  int perm_diff = 0;
  if (T == 1) {
    for (int i = 0; i < 5; i++) {
      size_t n = i == 2 ? (size_t)(Et + 1) * 4 : i == 4 ? 4 : (size_t)kt * 4;
      unsigned char *a = malloc(n), *b = malloc(n);
      di_cut_d2h(a, pv[0][i], n);
      di_cut_d2h(b, pv[1][i], n);
      perm_diff += memcmp(a, b, n) != 0;
      free(a); free(b);
    }
  }
  CHECKF(diff_xn == 0 && diff_lg == 0 && diff_route == 0 && perm_diff == 0 && err < 1e-5,
         "moe gate %s T=%d: xn diffs %d, logit diffs %d, route diffs %d, perm diffs %d, err %.3e", label, T, diff_xn,
         diff_lg, diff_route, perm_diff, err);
  printf("moe gate %-22s T=%3d E=%3d H=%d: == unfused (xn, logits, ids, weights%s), logits rel err %.2e\n", label, T, E,
         H, T == 1 ? ", permutation" : "", err);
  free(h); free(nw); free(bias); free(W); free(xn); free(xn2); free(lg); free(lg2); free(w); free(w2);
  free(ids); free(ids2); free(ref);
  void *ptrs[] = {dh, dnw, db, dW, dxn, dxn2, dxf, dlg, dlg2, dids, dw, dids2, dw2};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) di_cut_free(ptrs[i]);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 5; j++) di_cut_free(pv[i][j]);
}

/* W_UV + o_proj of one token in one kernel (di_cuk_mla_vo) against double precision: v_h rounded to
 * bf16 as the kernel (and the two-GEMM path) does, then the output projection added onto h. The W_UV
 * blocks sit in a kv_b-shaped matrix (W_UK rows between them) as in the backend. */
static void test_mla_vo(int NH, int H, int R, int dv, const char *label) {
  if (!di_cuk_mla_vo_ok(1, NH, H, R, dv)) {
    printf("mla vo %-28s: shape or cluster not supported on this GPU (skipped)\n", label);
    CHECK(!(NH == 16 && H == 2048)); /* the V2-Lite shape must run on the H200 */
    return;
  }
  const int dn = 2 * dv, ldo = NH * dv;
  const int64_t stride = (int64_t)(dn + dv) * R;
  uint16_t *olat = calloc((size_t)NH * DI_CUK_MLA_R, 2), *kvb = rand_bf16((size_t)NH * stride, 1.f / sqrtf((float)R));
  uint16_t *wo = rand_bf16((size_t)H * ldo, 1.f / sqrtf((float)ldo));
  for (int h = 0; h < NH; h++)
    for (int j = 0; j < R; j++) olat[(size_t)h * DI_CUK_MLA_R + j] = di_f32_to_bf16(nrand());
  float *h0 = rand_f32(H, 1.f);
  void *dol = dup_dev(olat, (size_t)NH * DI_CUK_MLA_R * 2), *dkv = dup_dev(kvb, (size_t)NH * stride * 2),
       *dwo = dup_dev(wo, (size_t)H * ldo * 2), *dh = dup_dev(h0, (size_t)H * 4);
  di_status st = di_cuk_mla_vo(dol, DI_CUK_MLA_R, (const uint16_t *)dkv + (size_t)dn * R, stride, R, dv, dwo, ldo, NH,
                               H, dh, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = malloc((size_t)H * 4);
  di_cut_d2h(got, dh, (size_t)H * 4);
  double *v = malloc(sizeof(double) * (size_t)NH * dv), *ref = malloc(sizeof(double) * H);
  for (int h = 0; h < NH; h++)
    for (int i = 0; i < dv; i++) {
      double a = 0;
      const uint16_t *w = kvb + (size_t)h * stride + (size_t)(dn + i) * R;
      for (int j = 0; j < R; j++) a += (double)bf(w[j]) * bf(olat[(size_t)h * DI_CUK_MLA_R + j]);
      v[(size_t)h * dv + i] = bf(di_f32_to_bf16((float)a));
    }
  float *gd = malloc((size_t)H * 4);
  for (int n = 0; n < H; n++) {
    double a = 0;
    for (int k = 0; k < ldo; k++) a += (double)bf(wo[(size_t)n * ldo + k]) * v[k];
    ref[n] = a;
    gd[n] = got[n] - h0[n];
  }
  const double err = rel_err_d(ref, gd, (size_t)H);
  CHECKF(err < 1e-3, "mla vo %s: rel err %.3e", label, err);
  /* a second run adds the same again: deterministic (the cluster sums in head order) */
  float *got2 = malloc((size_t)H * 4);
  di_cut_h2d(dh, h0, (size_t)H * 4);
  CHECK(di_cuk_mla_vo(dol, DI_CUK_MLA_R, (const uint16_t *)dkv + (size_t)dn * R, stride, R, dv, dwo, ldo, NH, H, dh,
                      NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  di_cut_d2h(got2, dh, (size_t)H * 4);
  CHECKF(memcmp(got, got2, (size_t)H * 4) == 0, "mla vo %s: two runs differ", label);
  printf("mla vo %-28s heads %2d hidden %4d rank %3d dv %3d: rel err %.2e, deterministic\n", label, NH, H, R, dv, err);
  free(olat); free(kvb); free(wo); free(h0); free(got); free(got2); free(gd); free(v); free(ref);
  di_cut_free(dol); di_cut_free(dkv); di_cut_free(dwo); di_cut_free(dh);
}

/* route (with n_sh shared experts folded in as experts E.., weight 1) -> permute -> glu grouped GEMM
 * -> down grouped GEMM -> combine (+ the fused RMSNorm of the result), as the backend runs it */
/* gemv_rows: 0 the mma grouped GEMM, 1..4 the GEMV form, -1 (T == 1) the GEMV gate/up and the down
 * projection fused with the combine (di_cuk_moe_down_combine; no fused norm then) */
static void test_moe_chain(int T, int E, int K, int n_sh, int Hd, int I, int gemv_rows) {
  const int fused_down = gemv_rows < 0;
  if (fused_down) gemv_rows = 1;
  const int Ip = (I + 63) / 64 * 64, Et = E + n_sh, Kt = K + n_sh, A = T * Kt, bm = A >= 32 * Et ? 64 : 16;
  int max_tiles = (A + bm - 1) / bm + Et;
  if (max_tiles > A) max_tiles = A;
  uint16_t *x = rand_bf16((size_t)T * Hd, 1.f);
  uint16_t *wgu = calloc((size_t)Et * 2 * Ip * Hd, 2), *wd = calloc((size_t)Et * Hd * Ip, 2);
  for (int e = 0; e < Et; e++)
    for (int r = 0; r < 2 * Ip; r++)
      if (r % Ip < I)
        for (int c = 0; c < Hd; c++) wgu[((size_t)e * 2 * Ip + r) * Hd + c] = di_f32_to_bf16(nrand() / sqrtf((float)Hd));
  for (int e = 0; e < Et; e++)
    for (int r = 0; r < Hd; r++)
      for (int c = 0; c < I; c++) wd[((size_t)e * Hd + r) * Ip + c] = di_f32_to_bf16(nrand() / sqrtf((float)I));
  float *lg = rand_f32((size_t)T * E, 2.f), *h0 = rand_f32((size_t)T * Hd, 1.f), *nw = rand_f32(Hd, 1.f);
  di_cuk_router r = {E, K, 1, 1, 0, 0, 1, 0, 1.f, n_sh, 0};
  void *dx = dup_dev(x, (size_t)T * Hd * 2), *dstage = dup_dev(wgu, (size_t)Et * 2 * Ip * Hd * 2),
       *dgu_w = di_cut_malloc((size_t)Et * 2 * Ip * Hd * 2), *dd_w = dup_dev(wd, (size_t)Et * Hd * Ip * 2),
       *dlg = dup_dev(lg, (size_t)T * E * 4), *dh = dup_dev(h0, (size_t)T * Hd * 4), *dnw = dup_dev(nw, (size_t)Hd * 4);
  void *dids = di_cut_malloc((size_t)A * 4), *dw = di_cut_malloc((size_t)A * 4), *dperm = di_cut_malloc((size_t)A * 4),
       *dinv = di_cut_malloc((size_t)A * 4), *doff = di_cut_malloc((size_t)(Et + 1) * 4),
       *dtiles = di_cut_malloc((size_t)((A + 15) / 16 + Et + 1) * 4), *dnt = di_cut_malloc(16),
       *dact = di_cut_malloc((size_t)A * Ip * 2), *dy = di_cut_malloc((size_t)A * Hd * 4),
       *dxn = di_cut_malloc((size_t)T * Hd * 2);
  CHECK(di_cuk_glu_interleave(dstage, dgu_w, Et, Ip, Hd, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  double t0 = di_cut_time_ms();
  /* one token: the router kernel permutes too (the backend's decode path); else the permute kernel */
  di_cuk_perm pm = {bm, dperm, dinv, doff, dtiles, dnt};
  CHECK(di_cuk_moe_route(dlg, NULL, T, r, dids, dw, &pm, NULL) == DI_OK);
  if (T > 1) CHECK(di_cuk_moe_permute(dids, A, Kt, Et, bm, dperm, dinv, doff, dtiles, dnt, NULL) == DI_OK);
  di_status st;
  if (gemv_rows) { /* at T == 1 the shared experts' tiles are prefetched as the backend does */
    const int pf0 = T == 1 && n_sh ? Kt - n_sh : -1;
    st = di_cuk_grouped_gemv(dx, Hd, dperm, dgu_w, 2 * Ip, Hd, doff, dtiles, dnt, max_tiles, bm, gemv_rows, dact, Ip, 0,
                             1, pf0, E, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
    if (fused_down)
      st = di_cuk_moe_down_combine(dact, Ip, dd_w, Hd, Ip, dids, dw, dinv, Kt, dh, Hd, E, n_sh, NULL);
    else
      st = di_cuk_grouped_gemv(dact, Ip, NULL, dd_w, Hd, Ip, doff, dtiles, dnt, max_tiles, bm, gemv_rows, dy, Hd, 1, 0,
                               pf0, E, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
  } else {
    st = di_cuk_grouped_gemm(dx, Hd, dperm, dgu_w, 2 * Ip, Hd, doff, dtiles, dnt, max_tiles, bm, dact, Ip, 0, 1, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
    st = di_cuk_grouped_gemm(dact, Ip, NULL, dd_w, Hd, Ip, doff, dtiles, dnt, max_tiles, bm, dy, Hd, 1, 0, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
  }
  if (!fused_down) CHECK(di_cuk_moe_combine(dy, Hd, dinv, dw, T, Kt, Hd, dh, dnw, 1e-6f, dxn, Hd, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  double ms = di_cut_time_ms() - t0;
  float *got = malloc((size_t)T * Hd * 4);
  di_cut_d2h(got, dh, (size_t)T * Hd * 4);
  float *gxn = bf16_dev_to_f32(dxn, (size_t)T * Hd);
  if (fused_down) {
    /* the gate/up GEMV in 4-warp CTAs (the measurement switch; one-warp CTAs are the default): each
     * warp's arithmetic is the same, so the result is bit-equal */
    uint16_t *a1 = malloc((size_t)A * Ip * 2), *a4 = malloc((size_t)A * Ip * 2);
    di_cut_d2h(a1, dact, (size_t)A * Ip * 2);
    di_cuk_grouped_gemv_set_one_warp(0);
    st = di_cuk_grouped_gemv(dx, Hd, dperm, dgu_w, 2 * Ip, Hd, doff, dtiles, dnt, max_tiles, bm, 1, dact, Ip, 0, 1,
                             n_sh ? Kt - n_sh : -1, E, NULL);
    di_cuk_grouped_gemv_set_one_warp(1);
    CHECKF(st == DI_OK, "%s", di_last_error());
    CHECK(di_cut_sync() == 0);
    di_cut_d2h(a4, dact, (size_t)A * Ip * 2);
    CHECKF(memcmp(a1, a4, (size_t)A * Ip * 2) == 0, "moe chain E=%d k=%d: gate/up GEMV in 4-warp CTAs differs", E, K);
    free(a1);
    free(a4);
  }
  double *ref = malloc(sizeof(double) * (size_t)T * Hd), *g = malloc(sizeof(double) * Ip);
  double *rxn = malloc(sizeof(double) * (size_t)T * Hd);
  int32_t rid[16];
  float rw[16];
  for (int t = 0; t < T; t++) {
    double *o = ref + (size_t)t * Hd;
    for (int c = 0; c < Hd; c++) o[c] = 0;
    ref_route(lg + (size_t)t * E, NULL, r, rid, rw);
    for (int j = 0; j < n_sh; j++) { rid[K + j] = E + j; rw[K + j] = 1.f; }
    for (int k = 0; k < Kt; k++) {
      int e = rid[k];
      for (int i = 0; i < I; i++) {
        double a = 0, b = 0;
        const uint16_t *wg = wgu + ((size_t)e * 2 * Ip + i) * Hd, *wu = wgu + ((size_t)e * 2 * Ip + Ip + i) * Hd;
        for (int c = 0; c < Hd; c++) { double xv = bf(x[(size_t)t * Hd + c]); a += xv * bf(wg[c]); b += xv * bf(wu[c]); }
        g[i] = a / (1 + exp(-a)) * b;
      }
      for (int c = 0; c < Hd; c++) {
        double a = 0;
        for (int i = 0; i < I; i++) a += g[i] * bf(wd[((size_t)e * Hd + c) * Ip + i]);
        o[c] += rw[k] * a;
      }
    }
    double ss = 0;
    for (int c = 0; c < Hd; c++) { double v = o[c] + h0[(size_t)t * Hd + c]; ss += v * v; }
    for (int c = 0; c < Hd; c++) rxn[(size_t)t * Hd + c] = (o[c] + h0[(size_t)t * Hd + c]) / sqrt(ss / Hd + 1e-6) * nw[c];
  }
  /* compare the MoE contribution (h - h0), and the fused norm of the new h */
  float *gd = malloc((size_t)T * Hd * 4);
  for (size_t i = 0; i < (size_t)T * Hd; i++) gd[i] = got[i] - h0[i];
  double err = rel_err_d(ref, gd, (size_t)T * Hd), errn = fused_down ? 0 : rel_err_d(rxn, gxn, (size_t)T * Hd);
  CHECKF(err < 1e-2, "moe chain T=%d E=%d k=%d: rel err %.3e", T, E, K, err);
  CHECKF(errn < 1e-2, "moe chain T=%d fused norm: rel err %.3e", T, errn);
  printf("moe chain T=%4d E=%3d+%d k=%d hidden=%d inter=%d bm=%d %s: rel err %.2e, fused norm %.2e (%.2f ms incl. launch)\n",
         T, E, n_sh, K, Hd, I, bm, fused_down ? "gemv + fused down/combine" : gemv_rows ? "gemv" : "mma ", err, errn, ms);
  free(x); free(wgu); free(wd); free(lg); free(h0); free(nw); free(got); free(gxn); free(ref); free(g); free(gd); free(rxn);
  void *ptrs[] = {dx, dstage, dgu_w, dd_w, dlg, dh, dnw, dids, dw, dperm, dinv, doff, dtiles, dnt, dact, dy, dxn};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) di_cut_free(ptrs[i]);
}

/* ---- sampling vs the CPU sampler ----------------------------------------------------------------- */
static void test_sample(int V) {
  const int n = 10;
  di_cuk_sample_row rows[10] = {
      {0.f, 1.f, 0.f, 0, 0, 1, 0},      /* greedy */
      {0.8f, 1.f, 0.f, 1, 0, 2, 5},     /* top_k 1 == greedy */
      {1.0f, 1.f, 0.f, 0, 0, 3, 7},     /* plain temperature, id-order draw */
      {0.7f, 1.f, 0.f, 50, 0, 4, 9},    /* top-k */
      {1.0f, 0.9f, 0.f, 0, 0, 5, 11},   /* top-p */
      {1.0f, 0.95f, 0.f, 40, 0, 6, 13}, /* top-k + top-p */
      {1.2f, 1.f, 0.05f, 0, 0, 7, 15},  /* min-p */
      {0.9f, 0.8f, 0.02f, 100, 0, 8, 17},
      {1.0f, 1.f, 0.f, 0, V / 2, 9, 19}, /* vocab limit */
      {0.5f, 1.f, 0.f, 0, 0, 10, 21},
  };
  float *lg = malloc(sizeof(float) * (size_t)n * V);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < V; i++) lg[(size_t)r * V + i] = nrand() * 3.f + (i % 97 == 0 ? 6.f : 0.f);
  void *dl = dup_dev(lg, sizeof(float) * (size_t)n * V), *dr = dup_dev(rows, sizeof rows), *dout = di_cut_malloc(4 * n);
  double t0 = di_cut_time_ms();
  di_status st = di_cuk_sample(dl, n, V, dr, dout, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  double ms = di_cut_time_ms() - t0;
  int32_t out[10];
  di_cut_d2h(out, dout, sizeof out);
  di_sampler *smp = NULL;
  CHECK(di_sampler_create(V, &smp) == DI_OK);
  int same = 0;
  for (int r = 0; r < n; r++) {
    di_sampling sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = rows[r].temperature; sp.top_p = rows[r].top_p; sp.min_p = rows[r].min_p; sp.top_k = rows[r].top_k;
    sp.repetition_penalty = 1.f; sp.logprobs = -1; sp.seed = rows[r].seed; sp.stream = 0;
    di_sample_result res;
    st = di_sampler_sample(smp, lg + (size_t)r * V, rows[r].vocab_limit, &sp, NULL, 0, 0, NULL, rows[r].counter, &res);
    CHECKF(st == DI_OK, "%s", di_last_error());
    CHECKF(out[r] == res.token, "sample row %d: gpu %d, cpu %d", r, out[r], res.token);
    same += out[r] == res.token;
  }
  printf("sample V=%d: %d/%d rows equal to the CPU sampler (%.2f ms incl. launch)\n", V, same, n, ms);
  CHECK(fabs(di_cuk_uniform(42, 7) - di_rng_uniform(42, 0, 7)) < 1e-15);
  di_sampler_free(smp);
  free(lg);
  di_cut_free(dl); di_cut_free(dr); di_cut_free(dout);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  /* --attn-only: the MLA attention cases alone; --moe-only: the router, MoE gate and W_UV + o_proj cases alone (the
   * whole test takes ~4 minutes on an H200) */
  const int attn_only = argc > 1 && !strcmp(argv[1], "--attn-only"), moe_only = argc > 1 && !strcmp(argv[1], "--moe-only");
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  di_cu_blas *blas = NULL;
  CHECK(di_cu_blas_create(&blas) == DI_OK);
  if (argc > 1 && !strcmp(argv[1], "--rows-only")) { /* DEEPINFER_CUDA_SKINNY_ROWS's kernel alone */
    test_skinny_rows_all(blas);
    time_skinny_rows(blas, 1, 102400, 2048);
    di_cu_blas_destroy(blas);
    return test_finish("test_cuda_kernels");
  }
  if (argc > 1 && !strcmp(argv[1], "--kv8-only")) { /* --kv-cache-dtype fp8: the write rule, prep, every attention form */
    test_kv8_quant(40, 512);
    test_kv8_quant(9, 32);
    test_kv8_quant(5, 200);
    test_kv8_prep(blas, 5, 16, 128, 64, 512);
    test_kv8_prep(blas, 1, 16, 128, 64, 512); /* V2-Lite decode */
    test_kv8_prep(blas, 8, 4, 32, 16, 32);    /* the tiny fixtures' ranks */
    test_kv8_prep(blas, 12, 128, 128, 64, 512);
    test_kv8_gather(300, 1000);
    test_kv8 = 1;
    int ctx[] = {1, 100, 4097, 32768}, nt[] = {1, 1, 1, 1};
    test_mla_attn(16, 4, ctx, nt, 16, 1, "V2-Lite decode, no split");
    test_mla_attn(16, 4, ctx, nt, 16, 16, "V2-Lite decode, 16-way split");
    test_mla_attn(16, 4, ctx, nt, 16, -1, "V2-Lite decode, one cluster");
    test_mla_attn(16, 4, ctx, nt, 16, -5, "V2-Lite decode, 5 clusters");
    int ctx3[] = {600, 40}, nt3[] = {3, 2};
    test_mla_attn(16, 2, ctx3, nt3, 16, -2, "decode 3+2 tokens, 2 clusters");
    test_fold_dv = 128, test_fold_ld = 512;
    test_mla_attn(16, 2, ctx3, nt3, 16, -1, "decode 3+2 tokens, W_UV fold");
    test_fold_dv = 0;
    test_strided = 1;
    test_mla_attn(16, 4, ctx, nt, 16, -1, "V2-Lite decode, strided (invariant)");
    test_strided = 0;
    if (di_cuk_attn_cluster_ok(16)) {
      test_cl = 16;
      test_mla_attn(16, 4, ctx, nt, 16, -3, "V2-Lite decode, 3 clusters");
      test_strided = 1;
      test_mla_attn(16, 2, ctx3, nt3, 16, -1, "decode 3+2 tokens, strided");
      test_strided = 0;
      test_cl = 8;
    }
    int ctxv[] = {777, 5000}, ntv[] = {1, 1};
    test_mla_attn(128, 2, ctxv, ntv, 64, 4, "V3 decode (128 heads), split 4");
    int ctxp[] = {100, 37}, ntp[] = {70, 37};
    test_mla_attn(16, 2, ctxp, ntp, 64, 1, "prefill chunks (70 after 30; 37)");
    test_mla_attn(16, 2, ctxp, ntp, 64, 2, "prefill chunks, split 2");
    test_mla_attn(4, 2, ctxp, ntp, 16, 1, "tiny heads (4), bm 16");
    test_kv8 = 0;
    di_cu_blas_destroy(blas);
    return test_finish("test_cuda_kernels --kv8-only");
  }
  if (!attn_only && !moe_only) {
    test_gemm(blas, 5, 2048, 2048, 1, 1.f);       /* M <= 8: the skinny kernel */
    test_gemm(blas, 8, 3648, 2048, 0, 0.f);
    test_gemm(blas, 1, 129280, 2048, 1, 0.f);     /* lm_head shape */
    test_gemm(blas, 1, 2048, 2048, 1, 1.f);       /* o_proj at decode */
    test_gemm(blas, 1, 200, 96, 0, 0.f);          /* a partial last CTA */
    test_skinny_rows_all(blas);
    test_gemm_normed(blas, 1, 3648, 2048);         /* the q/kv projection with the attention norm inside */
    test_gemm_normed(blas, 4, 2112, 7168);
    test_gemm_normed(blas, 8, 100, 72);
    test_gemm_normed(blas, 1, 2112, 7168);          /* V3's q_a + kv_a rows at decode */
    test_gemm_normed(blas, 1, 100, 224);            /* the default model's width, a partial last CTA */
    di_cu_blas_set_skinny(blas, 0);
    test_gemm(blas, 5, 2048, 2048, 1, 1.f);       /* the same through cuBLASLt */
    test_gemm_batched(blas, 16, 3, 128, 512, 0);
    di_cu_blas_set_skinny(blas, 1);
    test_gemm_batched(blas, 16, 3, 128, 512, 0);  /* batched skinny (v = o_lat . W_UV^T) */
    test_gemm(blas, 64, 3072, 2048, 0, 0.f);
    test_gemm(blas, 3, 777, 72, 1, 0.f);
    test_gemm_batched(blas, 16, 9, 512, 128, 1);  /* q_lat = q_nope . W_UK (cuBLAS) */
    test_gemm_batched(blas, 16, 1, 512, 128, 1);  /* ... decode-sized: our skinny [K][N] kernel */
    test_gemm_batched(blas, 128, 8, 512, 128, 1); /* V3's 128 heads */
    test_gemm_batched(blas, 4, 3, 40, 32, 1);     /* odd fixture ranks */
    test_gemm_batched(blas, 16, 9, 128, 512, 0);  /* v = o_lat . W_UV^T */
    test_invariant_gemm(blas, 21, 300, 2048, 0, "bf16 out, 3 chunks");
    test_invariant_gemm(blas, 9, 2048, 1024, 1, "f32 out + residual");
    test_invariant_gemm(blas, 13, 576, 2048, 2, "normed (q/kv)");
    test_invariant_gemm(blas, 10, 128, 512, 3, "batched over heads (W_UV)");
    test_invariant_gemm(blas, 10, 512, 128, 4, "batched, W [K][N] (absorb)");
    test_invariant_gemm(blas, 7, 36, 60, 1, "odd K = 60 (rowdot)");
    test_invariant_gemm(blas, 5, 40, 20, 4, "odd batched (rowdot)");
    test_gemm_batched(blas, 16, 1, 128, 512, 0);  /* ... at decode */
    test_norms(7, 2048);
    test_norms(3, 72);
    test_mla_prep(5, 16, 128, 64, 512, 1);
    test_mla_prep(4, 4, 32, 16, 32, 0);
    test_mla_prep(3, 128, 128, 64, 512, 1);
    test_mla_prep_absorb(blas, 1, 16, 128, 64, 512); /* V2-Lite decode */
    test_mla_prep_absorb(blas, 5, 16, 128, 64, 512);
    test_mla_prep_absorb(blas, 8, 4, 32, 16, 32);    /* more tokens than heads (tiny fixtures) */
    test_mla_prep_absorb(blas, 2, 128, 128, 64, 512); /* V3's 128 heads */
  }
  if (!moe_only) {
    int ctx[] = {1, 100, 4097, 32768}, nt[] = {1, 1, 1, 1};
    test_mla_attn(16, 4, ctx, nt, 16, 1, "V2-Lite decode, no split");
    test_mla_attn(16, 4, ctx, nt, 16, 16, "V2-Lite decode, 16-way split");
    test_mla_attn(16, 4, ctx, nt, 16, -1, "V2-Lite decode, one cluster");
    test_mla_attn(16, 4, ctx, nt, 16, -5, "V2-Lite decode, 5 clusters");
    int ctx2[] = {600, 33, 1024}, nt2[] = {1, 1, 1};
    test_mla_attn(16, 3, ctx2, nt2, 16, -1, "decode 600/33/1024, one cluster");
    int ctx3[] = {600, 40}, nt3[] = {3, 2}; /* several tokens of a sequence: rows of 16 span 1 head group each */
    test_mla_attn(16, 2, ctx3, nt3, 16, -2, "decode 3+2 tokens, 2 clusters");
    test_mla_attn(8, 2, ctx3, nt3, 16, -1, "8 heads: 2 tokens per 16 rows");
    test_fold_dv = 128, test_fold_ld = 512; /* V2-Lite's W_UV */
    test_mla_attn(16, 3, ctx2, nt2, 16, -1, "decode 600/33/1024, W_UV fold");
    test_fold_dv = 32, test_fold_ld = 32;   /* the tiny fixtures' */
    test_mla_attn(4, 2, ctx3, nt3, 16, -1, "4 heads: 4 tokens per 16 rows, fold");
    test_fold_dv = 0;
    test_strided = 1;
    test_mla_attn(16, 4, ctx, nt, 16, -1, "V2-Lite decode, strided (invariant)");
    test_mla_attn(4, 2, ctx3, nt3, 16, -1, "4 heads: 4 tokens per 16 rows, strided");
    {
      int ctxp[] = {100, 37}, ntp[] = {70, 37}; /* prefill-sized items in the strided form */
      test_mla_attn(16, 2, ctxp, ntp, 16, -1, "prefill chunks, strided");
    }
    test_strided = 0;
    if (di_cuk_attn_cluster_ok(16)) { /* non-portable clusters of 16, where the GPU places them */
      test_cl = 16;
      test_mla_attn(16, 4, ctx, nt, 16, -1, "V2-Lite decode, one cluster");
      test_mla_attn(16, 4, ctx, nt, 16, -3, "V2-Lite decode, 3 clusters");
      test_mla_attn(16, 2, ctx3, nt3, 16, -1, "decode 3+2 tokens, one cluster");
      test_fold_dv = 128, test_fold_ld = 512;
      test_mla_attn(16, 3, ctx2, nt2, 16, -1, "decode 600/33/1024, W_UV fold");
      test_fold_dv = 32, test_fold_ld = 32;
      test_mla_attn(4, 2, ctx3, nt3, 16, -1, "4 heads: 4 tokens per 16 rows, fold");
      test_fold_dv = 0;
      test_strided = 1; /* batch-invariant mode's form: up to 32k keys over 16 CTAs, several tokens */
      test_mla_attn(16, 4, ctx, nt, 16, -1, "V2-Lite decode, strided (invariant)");
      test_mla_attn(16, 2, ctx3, nt3, 16, -1, "decode 3+2 tokens, strided");
      test_strided = 0;
      test_cl = 8;
    } else {
      printf("mla_attn: clusters of 16 CTAs not available on this GPU\n");
    }
  }
  {
    int ctx[] = {777, 5000}, nt[] = {1, 1};
    test_mla_attn(128, 2, ctx, nt, 64, 4, "V3 decode (128 heads), split 4");
  }
  {
    int ctx[] = {100, 37}, nt[] = {70, 37};
    test_mla_attn(16, 2, ctx, nt, 64, 1, "prefill chunks (70 after 30; 37)");
    test_mla_attn(16, 2, ctx, nt, 64, 2, "prefill chunks, split 2");
    test_mla_attn(4, 2, ctx, nt, 16, 1, "tiny heads (4), bm 16");
  }
  if (!attn_only) {
    {
      di_cuk_router r1 = {64, 6, 1, 1, 0, 0, 0, 0, 1.f, 0, 0};      /* V2-Lite: softmax greedy */
      di_cuk_router r2 = {64, 6, 8, 3, 0, 1, 0, 0, 16.f, 0, 0};     /* V2: group-limited greedy */
      di_cuk_router r3 = {256, 8, 8, 4, 1, 2, 1, 1, 2.5f, 0, 0};    /* V3: sigmoid noaux_tc, renorm, scale */
      di_cuk_router r4 = {64, 6, 1, 1, 0, 0, 1, 0, 3.f, 0, 0};      /* V2 renormalized: no scaling */
      test_route(300, r1, "softmax greedy");
      test_route(300, r2, "group-limited greedy");
      test_route(300, r3, "sigmoid noaux_tc");
      test_route(300, r4, "softmax greedy norm (V2)");
      di_cuk_router r1b = r1, r4b = r4; /* the same routers through the block-wide path */
      r1b.block_route = r4b.block_route = 1;
      test_route(300, r1b, "softmax greedy, block");
      test_route(300, r4b, "softmax greedy norm, block");
      di_cuk_router r1s = r1, r3s = r3;
      r1s.n_shared = 2; /* V2-Lite with its shared experts folded in */
      r3s.n_shared = 1;
      test_moe_gate(1, 2048, r1s, "V2-Lite decode");
      test_moe_gate(5, 2048, r1, "V2-Lite, 5 tokens");
      test_moe_gate(1, 7168, r3s, "V3 decode");
      test_moe_gate(64, 7168, r3, "V3, 64 tokens");
      test_moe_gate(3, 72, r2, "group-limited, tiny");
      test_moe_gate(300, 2048, r1, "V2-Lite, 300 tokens");
    }
    test_mla_vo(16, 2048, 512, 128, "V2-Lite decode (4 row tiles)"); /* (also under --moe-only: the decode */
    test_mla_vo(8, 768, 64, 32, "8 heads, 3 row tiles of 256");       /* layer's one-token kernels) */
    test_mla_vo(4, 64, 32, 16, "tiny (one tile)");
    test_mla_vo(4, 224, 64, 32, "the default model's shape");
    if (!moe_only) {
    test_moe_chain(1, 64, 6, 2, 2048, 1408, 0);   /* V2-Lite decode, 2 shared experts folded in (64-wide tiles) */
    test_moe_chain(1, 64, 6, 2, 2048, 1408, 1);   /* ... as the GEMV the backend uses at T <= 4 */
    test_moe_chain(1, 64, 6, 2, 2048, 1408, -1);  /* ... and T == 1's down projection fused with the combine */
    test_moe_chain(1, 256, 8, 1, 512, 256, -1);   /* V3 routing width: 9 slots over 8 warps */
    test_moe_chain(1, 16, 3, 0, 64, 40, -1);      /* tiny, no shared expert */
    test_moe_chain(4, 64, 6, 2, 2048, 1408, 4);
    test_moe_chain(16, 64, 6, 2, 2048, 1408, 0);
    test_moe_chain(16, 64, 6, 2, 2048, 1408, 4);  /* more rows per expert than one GEMV pass */
    test_moe_chain(300, 256, 8, 1, 256, 200, 0);  /* V3 routing width, bm 64 */
    test_moe_chain(3, 12, 3, 0, 128, 40, 0);      /* odd sizes (padded intermediate) */
    test_moe_chain(3, 12, 3, 0, 128, 40, 3);
    test_moe_chain(2, 16, 4, 1, 7168, 256, 2);    /* V3 hidden (K 7168) */
    test_moe_chain(600, 64, 6, 2, 256, 256, 0);   /* A = 4800 >= 32 * 66: the bm = 64 tiles (prefill) */
    test_sample(129280);
    test_sample(1001); /* slices of the argmax cluster of unequal length */
    test_sample(37);   /* fewer logits than the cluster has CTAs x 8: empty slices */
    }
  }
  di_cu_blas_destroy(blas);
  return test_finish("test_cuda_kernels");
}
