/* The block-FP8 kernels (src/backend/cuda/k_fp8_gemv.cu, k_fp8_gemm.cu) against float64 references on
 * fresh random inputs at real shapes: V3 (7168 x 18432 dense, 2048-wide experts), V2-Lite (2048 x
 * 10944 dense with its partial K block, 1408-wide experts), V4-Flash (4096 x 2048 experts), the
 * shipped model's 224 / 576 / 64 edges, and other block shapes (64 x 64, 32 x 16, 128 x 7 and odd K
 * through the any-shape kernel; 1 x 128, the per-row scales the CUDA backend keeps on the device, for
 * every kernel, the grouped ones only so). Random E4M3 bytes (every finite value of moderate exponent) with
 * random f32 block scales; the reference is computed on a sample of output columns (all rows up to 64).
 * Tolerances (relative L2 error against float64):
 *   GEMV (bf16 activations x dequantized weights): 1e-2 with bf16 output, 1e-4 with f32 output;
 *   GEMM (activations quantized per 128): against the float64 product of the same quantized
 *     activations (host quantizer, bit-equal to the device's) 1e-2 bf16 / 1e-3 f32 (the FP8 tensor
 *     cores accumulate a K block with fewer bits than fp32: the reason for the per-block promotion),
 *     grouped 1e-3 (f32 out); grouped GEMV 1e-4 (f32 out); and against the
 *     unquantized activations < 0.08 (E4M3's 3 mantissa bits: ~0.03 expected, printed);
 *   quantizer: scales bit-equal, bytes equal;
 *   batch invariance (GEMV at M = 1 vs inside M = 16 / 24): bit-equal.
 *   MXFP4 GEMV (E2M1 x E8M0, bf16 activations): 1e-5 with f32 output (fp32 sums of exact products);
 *     a row alone bit-equal to the same row in a batch.
 *   grouped W8A8 GEMMs of steps of > 16 tokens (k_fp8_grouped_mma.cu, k_fp8_tc_grouped.cu; --gmma-only,
 *     --tcg-only, --no-tcg): against the float64 product of the same quantized activations, f32 out 1e-3,
 *     gate/up + SiLU (bf16 out) 1e-2, and within 1e-3 of k_fp8_gemm.cu's grouped GEMM on the same inputs.
 * Timings at the end (GB/s of weights read for the GEMV, TFLOP/s for the GEMM, bf16 cuBLASLt beside).
 * Built only with nvcc; run on the device by scripts/device_tests.sh. */
#include "backend/cuda/cuda_fp8.h"
#include "backend/cuda/cuda_mxfp4.h"
#include "backend/cuda/cuda_kernels.h"
#include "util/numeric.h"
#include "test_util.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CUT_RNG_SEED 0x9e3779b97f4a7c15ull
#include "cuda_test_rand.h" /* urand, nrand, rand_bf16, dup_dev */

/* E4M3 bytes of exponent field 4..10 (|v| in [2^-3, 2^4)), random sign and mantissa */
static uint8_t *rand_fp8(size_t n) {
  uint8_t *q = malloc(n);
  for (size_t i = 0; i < n; i += 4) {
    uint64_t bits = (uint64_t)(urand() * 9007199254740992.0);
    for (size_t j = i; j < n && j < i + 4; j++, bits >>= 13) {
      unsigned e = 4 + (unsigned)((bits & 0xff) % 7), m = (unsigned)(bits >> 8) & 7, s = (unsigned)(bits >> 11) & 1;
      q[j] = (uint8_t)(s << 7 | e << 3 | m);
    }
  }
  return q;
}

typedef struct host_w {
  int N, K, br, bc, sc, E;
  uint8_t *q;
  float *s;
} host_w;
static host_w make_w(int E, int N, int K, int br, int bc) {
  host_w w = {N, K, br, bc, (K + bc - 1) / bc, E, NULL, NULL};
  w.q = rand_fp8((size_t)E * N * K);
  size_t ns = (size_t)E * ((N + br - 1) / br) * w.sc;
  w.s = malloc(ns * 4);
  for (size_t i = 0; i < ns; i++) w.s[i] = (float)ldexp(1.0 + urand(), -10 + (int)(urand() * 4));
  return w;
}
static double w_at(const host_w *w, int e, int n, int k) {
  size_t sb = (size_t)((w->N + w->br - 1) / w->br) * w->sc;
  return (double)di_fp8e4m3_to_f32(w->q[((size_t)e * w->N + n) * w->K + k]) *
         w->s[e * sb + (size_t)(n / w->br) * w->sc + k / w->bc];
}

/* float64 reference of one output column n of the down projection + weighted combine: sum over the
 * token's kt experts j of wts[j] * (expert ids[j]'s row n . the activation row inv[j]) */
static double ref_down_combine(const host_w *w, const uint16_t *act, int K, const int *ids, const float *wts,
                               const int *inv, int kt, int n) {
  double a = 0;
  for (int j = 0; j < kt; j++) {
    double d = 0;
    for (int k = 0; k < K; k++) d += (double)di_bf16_to_f32(act[(size_t)inv[j] * K + k]) * w_at(w, ids[j], n, k);
    a += wts[j] * d;
  }
  return a;
}
static di_cuk_fp8w dev_w(const host_w *w, void **dq, void **ds) {
  size_t sb = (size_t)w->E * ((w->N + w->br - 1) / w->br) * w->sc;
  *dq = dup_dev(w->q, (size_t)w->E * w->N * w->K);
  *ds = dup_dev(w->s, sb * 4);
  di_cuk_fp8w d = {(const uint8_t *)*dq, (const float *)*ds, w->K, w->br, w->bc, w->sc};
  return d;
}
static void free_w(host_w *w) { free(w->q); free(w->s); }

/* sampled output columns: the first, the last, and random ones */
static int pick_cols(int N, int *cols, int cap) {
  if (N <= cap) { for (int i = 0; i < N; i++) cols[i] = i; return N; }
  cols[0] = 0; cols[1] = N - 1;
  for (int i = 2; i < cap; i++) cols[i] = (int)(urand() * N);
  return cap;
}
/* DI_TEST_HASH_FILE=path: one line per fetched output (call number, bytes, FNV-1a of them), so two builds of the
 * kernels can be compared bit for bit on the same inputs (a refactor's before / after) */
static void hash_out(const void *p, size_t bytes) {
  static FILE *f;
  static int opened, calls;
  if (!opened) {
    const char *path = getenv("DI_TEST_HASH_FILE");
    f = path && *path ? fopen(path, "w") : NULL;
    opened = 1;
  }
  calls++;
  if (!f) return;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
  fprintf(f, "%d %zu %016llx\n", calls, bytes, (unsigned long long)h);
  fflush(f);
}
static float *fetch_y(const void *dY, size_t n, int y_f32) {
  float *f = malloc(n * 4);
  if (y_f32) { di_cut_d2h(f, dY, n * 4); hash_out(f, n * 4); return f; }
  uint16_t *t = malloc(n * 2);
  di_cut_d2h(t, dY, n * 2);
  hash_out(t, n * 2);
  for (size_t i = 0; i < n; i++) f[i] = di_bf16_to_f32(t[i]);
  free(t);
  return f;
}
typedef struct errsum { double num, den; } errsum;
static void acc_err(errsum *e, double ref, double got) {
  if (got != got) { e->num = INFINITY; return; }
  e->num += (ref - got) * (ref - got);
  e->den += ref * ref;
}
static double rel(const errsum *e) { return sqrt(e->num / (e->den > 0 ? e->den : 1)); }

/* ---- GEMV (W8A16) -------------------------------------------------------------------------------- */
/* 1: test_gemv / test_grouped / time_gemv call the tensor-core forms (k_fp8_tc_gemv.cu) directly */
static int g_tc = 0;
static di_status gemv(int M, int N, int K, const void *X, int ldx, di_cuk_fp8w w, void *Y, int ldy, int y_f32,
                      float beta) {
  return g_tc ? di_cuk_fp8_tc_gemv(M, N, K, X, ldx, w, Y, ldy, y_f32, beta, NULL)
              : di_cuk_fp8_gemv(M, N, K, X, ldx, w, Y, ldy, y_f32, beta, NULL);
}
static void test_gemv(int M, int N, int K, int br, int bc, int y_f32, const char *what) {
  host_w w = make_w(1, N, K, br, bc);
  uint16_t *X = rand_bf16((size_t)M * K, 1.f);
  float *Y0 = malloc((size_t)M * N * 4);
  for (size_t i = 0; i < (size_t)M * N; i++) Y0[i] = nrand();
  void *dq, *ds, *dX = dup_dev(X, (size_t)M * K * 2), *dY = dup_dev(y_f32 ? Y0 : NULL, (size_t)M * N * 4);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  di_status st = gemv(M, N, K, dX, K, dw, dY, N, y_f32, y_f32 ? 1.f : 0.f);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dY, (size_t)M * N, y_f32);
  int cols[512], nc = pick_cols(N, cols, 512);
  errsum e = {0, 0};
  for (int m = 0; m < M; m++)
    for (int i = 0; i < nc; i++) {
      int n = cols[i];
      double a = y_f32 ? Y0[(size_t)m * N + n] : 0;
      for (int k = 0; k < K; k++) a += (double)di_bf16_to_f32(X[(size_t)m * K + k]) * w_at(&w, 0, n, k);
      acc_err(&e, a, got[(size_t)m * N + n]);
    }
  double tol = y_f32 ? 1e-4 : 1e-2;
  CHECKF(rel(&e) < tol, "fp8 gemv %s M %d N %d K %d block %dx%d f32 %d: rel err %.3e", what, M, N, K, br, bc, y_f32, rel(&e));
  printf("fp8 %s %-22s M %2d N %5d K %5d block %3dx%-3d f32 %d: rel err %.2e\n", g_tc ? "tc-gemv" : "gemv", what, M, N, K, br, bc, y_f32,
         rel(&e));
  /* batch invariance: each row alone gives the same bits */
  if (!y_f32) {
    int bad = 0;
    void *d1 = di_cut_malloc((size_t)N * 2);
    float *one = NULL;
    for (int m = 0; m < M && (m < 24 || g_tc); m += (M > 4 ? 3 : 1)) {
      CHECK(gemv(1, N, K, (const uint16_t *)dX + (size_t)m * K, K, dw, d1, N, 0, 0.f) == DI_OK);
      CHECK(di_cut_sync() == 0);
      free(one);
      one = fetch_y(d1, (size_t)N, 0);
      for (int n = 0; n < N; n++) bad += memcmp(&one[n], &got[(size_t)m * N + n], 4) != 0;
    }
    CHECKF(bad == 0, "fp8 gemv %s M %d: %d values differ from the row alone", what, M, bad);
    free(one);
    di_cut_free(d1);
  }
  free(got); free(X); free(Y0); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dX); di_cut_free(dY);
}

/* ---- activation quantization (host mirror) ----------------------------------------------------------- */
static void host_quant(const uint16_t *X, int M, int K, uint8_t *q, float *s, int lds) {
  for (int m = 0; m < M; m++)
    for (int g = 0; g * 128 < K; g++) {
      float amax = 0.f;
      for (int k = g * 128; k < K && k < g * 128 + 128; k++) amax = fmaxf(amax, fabsf(di_bf16_to_f32(X[(size_t)m * K + k])));
      float sc = amax > 0.f ? amax / 448.f : 1.f;
      s[(size_t)m * lds + g] = sc;
      for (int k = g * 128; k < K && k < g * 128 + 128; k++) q[(size_t)m * K + k] = di_f32_to_fp8e4m3(di_bf16_to_f32(X[(size_t)m * K + k]) / sc);
    }
}

static void test_quant(int M, int K) {
  uint16_t *X = rand_bf16((size_t)M * K, 3.f);
  for (int k = 0; k < 128 && k < K; k++) X[k] = 0; /* an all-zero group */
  int lds = (K + 127) / 128;
  uint8_t *q = malloc((size_t)M * K), *gq = malloc((size_t)M * K);
  float *s = malloc((size_t)M * lds * 4), *gs = malloc((size_t)M * lds * 4);
  host_quant(X, M, K, q, s, lds);
  void *dX = dup_dev(X, (size_t)M * K * 2), *dq = di_cut_malloc((size_t)M * K), *dsx = di_cut_malloc((size_t)M * lds * 4);
  CHECK(di_cuk_fp8_quant_act(dX, K, M, K, dq, K, dsx, lds, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  di_cut_d2h(gq, dq, (size_t)M * K);
  di_cut_d2h(gs, dsx, (size_t)M * lds * 4);
  size_t bq = 0, bs = 0;
  for (size_t i = 0; i < (size_t)M * K; i++) bq += q[i] != gq[i];
  for (size_t i = 0; i < (size_t)M * lds; i++) bs += memcmp(&s[i], &gs[i], 4) != 0;
  CHECKF(bq == 0 && bs == 0, "fp8 quant M %d K %d: %zu bytes, %zu scales differ from the host", M, K, bq, bs);
  printf("fp8 quant M %d K %d: %zu bytes, %zu scales differ\n", M, K, bq, bs);
  free(X); free(q); free(gq); free(s); free(gs);
  di_cut_free(dX); di_cut_free(dq); di_cut_free(dsx);
}

/* ---- GEMM (W8A8, per-128 promotion), dense through di_cuk_fp8_matmul -------------------------------- */
/* non-NULL: test_gemm / time_gemm run cuBLASLt's block-scaled FP8 matmul (gemm_fp8_lt.cu) */
static di_cu_fp8lt *g_lt = NULL, *g_lt_keep = NULL; /* keep: the handle, for the timings */
static di_status lt_or_mma(int M, int N, int K, const void *X, di_cuk_fp8w w, void *Y, int y_f32, float beta, void *ws,
                           size_t wsb) {
  return g_lt ? di_cu_fp8lt_matmul(g_lt, M, N, K, X, K, w, Y, N, y_f32, beta, ws, wsb, NULL)
              : di_cuk_fp8_matmul(M, N, K, X, K, w, Y, N, y_f32, beta, 0, ws, wsb, NULL);
}
static size_t gemm_ws(int M, int N, int K) { return g_lt ? di_cu_fp8lt_ws_bytes(M, N, K) : di_cuk_fp8_ws_bytes(M, K); }

static void test_gemm(int M, int N, int K, int br, int y_f32, const char *what) {
  host_w w = make_w(1, N, K, br, 128);
  uint16_t *X = rand_bf16((size_t)M * K, 1.f);
  int lds = (K + 127) / 128;
  uint8_t *q = malloc((size_t)M * K);
  float *s = malloc((size_t)M * lds * 4);
  host_quant(X, M, K, q, s, lds);
  float *Y0 = malloc((size_t)M * N * 4);
  for (size_t i = 0; i < (size_t)M * N; i++) Y0[i] = nrand();
  size_t wsb = gemm_ws(M, N, K);
  void *dq, *ds, *dX = dup_dev(X, (size_t)M * K * 2), *dY = dup_dev(y_f32 ? Y0 : NULL, (size_t)M * N * 4);
  void *dws = di_cut_malloc(wsb);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  di_status st = lt_or_mma(M, N, K, dX, dw, dY, y_f32, y_f32 ? 1.f : 0.f, dws, wsb);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dY, (size_t)M * N, y_f32);
  int cols[256], nc = pick_cols(N, cols, 256);
  errsum e = {0, 0}, eu = {0, 0};
  for (int mi = 0; mi < (M < 64 ? M : 64); mi++) {
    int m = M < 64 ? mi : (mi == 63 ? M - 1 : (int)(urand() * M));
    for (int i = 0; i < nc; i++) {
      int n = cols[i];
      double a = y_f32 ? Y0[(size_t)m * N + n] : 0, u = a;
      for (int k = 0; k < K; k++) {
        double wv = w_at(&w, 0, n, k);
        a += (double)di_fp8e4m3_to_f32(q[(size_t)m * K + k]) * s[(size_t)m * lds + k / 128] * wv;
        u += (double)di_bf16_to_f32(X[(size_t)m * K + k]) * wv;
      }
      if (!(g_lt && m >= M / 4 * 4)) acc_err(&e, a, got[(size_t)m * N + n]); /* cuBLASLt's tail rows: W8A16 */
      acc_err(&eu, u, got[(size_t)m * N + n]);
    }
  }
  double tol = y_f32 ? 1e-3 : 1e-2;
  CHECKF(rel(&e) < tol, "fp8 gemm %s M %d N %d K %d: rel err %.3e vs the quantized product", what, M, N, K, rel(&e));
  CHECKF(rel(&eu) < 0.08, "fp8 gemm %s M %d N %d K %d: rel err %.3e vs unquantized activations", what, M, N, K, rel(&eu));
  printf("fp8 %s %-22s M %4d N %5d K %5d f32 %d: rel err %.2e (quantized ref), %.2e (unquantized)\n",
         g_lt ? "lt-gemm" : "gemm", what, M, N, K, y_f32, rel(&e), rel(&eu));
  free(got); free(X); free(q); free(s); free(Y0); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dX); di_cut_free(dY); di_cut_free(dws);
}

/* ---- grouped (experts): tile lists as k_moe.cu builds them ------------------------------------------- */
static void test_grouped(int E, int N, int K, int max_rows_per_expert, int use_mma, const char *what) {
  host_w w = make_w(E, N, K, 1, 128); /* per-row scales: the CUDA backend's device form */
  int *cnt = malloc(E * 4), *off = malloc((E + 1) * 4);
  off[0] = 0;
  for (int e = 0; e < E; e++) {
    cnt[e] = (int)(urand() * (max_rows_per_expert + 1));
    off[e + 1] = off[e] + cnt[e];
  }
  const int R = off[E], T = R > 0 ? R : 1, bm = use_mma || g_tc ? 64 : 16;
  int ntile = 0, *tiles = malloc(sizeof(int) * (size_t)(R / bm + E + 1));
  for (int e = 0; e < E; e++)
    for (int i = 0; i * bm < cnt[e]; i++) tiles[ntile++] = e << 16 | i;
  int *arows = malloc((size_t)T * 4);
  for (int r = 0; r < R; r++) arows[r] = (int)(urand() * T);
  uint16_t *A = rand_bf16((size_t)T * K, 1.f);
  int lds = (K + 127) / 128;
  uint8_t *q = malloc((size_t)T * K);
  float *s = malloc((size_t)T * lds * 4);
  host_quant(A, T, K, q, s, lds);
  void *dq, *ds;
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  void *dA = dup_dev(A, (size_t)T * K * 2), *dAq = dup_dev(q, (size_t)T * K), *dsa = dup_dev(s, (size_t)T * lds * 4);
  void *doff = dup_dev(off, (E + 1) * 4), *dt = dup_dev(tiles, (size_t)(ntile + 1) * 4), *dnt = dup_dev(&ntile, 4);
  void *dar = dup_dev(arows, (size_t)T * 4), *dC = di_cut_malloc((size_t)T * N * 4);
  int max_tiles = ntile + 3; /* launched at an upper bound, as the backend does */
  di_status st = use_mma ? di_cuk_fp8_grouped_gemm(dAq, K, dsa, lds, dar, dw, N, K, doff, dt, dnt, max_tiles, bm, dC, N, 1, NULL)
         : g_tc ? di_cuk_fp8_tc_grouped_gemv(dA, K, dar, dw, N, K, doff, dt, dnt, max_tiles, bm,
                                             max_rows_per_expert < 64 ? max_rows_per_expert : 64, dC, N, 1, 0, NULL)
                : di_cuk_fp8_grouped_gemv(dA, K, dar, dw, N, K, doff, dt, dnt, max_tiles, bm,
                                          max_rows_per_expert < 16 ? max_rows_per_expert : 16, dC, N, 1, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dC, (size_t)T * N, 1);
  int cols[128], nc = pick_cols(N, cols, 128);
  errsum err = {0, 0};
  for (int e = 0; e < E; e++)
    for (int m = off[e]; m < off[e + 1]; m += (cnt[e] > 8 ? 7 : 1)) {
      int ar = arows[m];
      for (int i = 0; i < nc; i++) {
        double a = 0;
        for (int k = 0; k < K; k++) {
          double x = use_mma ? (double)di_fp8e4m3_to_f32(q[(size_t)ar * K + k]) * s[(size_t)ar * lds + k / 128]
                             : (double)di_bf16_to_f32(A[(size_t)ar * K + k]);
          a += x * w_at(&w, e, cols[i], k);
        }
        acc_err(&err, a, got[(size_t)m * N + cols[i]]);
      }
    }
  CHECKF(rel(&err) < (use_mma ? 1e-3 : 1e-4), "fp8 grouped %s E %d N %d K %d rows %d: rel err %.3e", what, E, N, K, R, rel(&err));
  printf("fp8 grouped %-7s %-14s E %3d N %5d K %5d rows %4d: rel err %.2e\n", use_mma ? "gemm" : g_tc ? "tc-gemv" : "gemv", what, E, N, K,
         R, rel(&err));
  if (g_tc && !use_mma && R > 0) { /* the last row alone (as a one-row expert 0 tile) gives the same bits */
    int tile1 = 0, one_t = 1, e_last = 0;
    for (int e = 0; e < E; e++)
      if (off[e] < R && R - 1 < off[e + 1]) e_last = e;
    tile1 = e_last << 16; /* expert e_last holds the one row */
    int *offE = calloc((size_t)E + 1, 4);
    for (int e = 0; e <= E; e++) offE[e] = e <= e_last ? 0 : 1;
    void *do1 = dup_dev(offE, (size_t)(E + 1) * 4), *dt1 = dup_dev(&tile1, 4), *dn1 = dup_dev(&one_t, 4);
    void *dr1 = dup_dev(&arows[R - 1], 4), *dC1 = di_cut_malloc((size_t)N * 4);
    CHECK(di_cuk_fp8_tc_grouped_gemv(dA, K, dr1, dw, N, K, do1, dt1, dn1, 1, bm, 1, dC1, N, 1, 0, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    float *one = fetch_y(dC1, (size_t)N, 1);
    CHECKF(memcmp(one, got + (size_t)(R - 1) * N, (size_t)N * 4) == 0, "fp8 tc grouped %s: the last row alone differs", what);
    free(one); free(offE);
    di_cut_free(do1); di_cut_free(dt1); di_cut_free(dn1); di_cut_free(dr1); di_cut_free(dC1);
  }
  free(got); free(cnt); free(off); free(tiles); free(arows); free(A); free(q); free(s); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dA); di_cut_free(dAq); di_cut_free(dsa); di_cut_free(doff);
  di_cut_free(dt); di_cut_free(dnt); di_cut_free(dar); di_cut_free(dC);
}

/* ---- MXFP4 (W4A16): random codes, E8M0 scales 2^-6 .. 2^3; dense or grouped (tile lists of 16) ---- */
static void test_mxfp4(int E, int N, int K, int max_rows_per_expert, const char *what) {
  const int ldq = K / 2, lds = K / 32;
  uint8_t *q = malloc((size_t)E * N * ldq), *sc = malloc((size_t)E * N * lds);
  for (size_t i = 0; i < (size_t)E * N * ldq; i++) q[i] = (uint8_t)(urand() * 256);
  for (size_t i = 0; i < (size_t)E * N * lds; i++) sc[i] = (uint8_t)(121 + (int)(urand() * 10));
  int *off = malloc((E + 1) * 4), ntile = 0;
  off[0] = 0;
  for (int e = 0; e < E; e++) off[e + 1] = off[e] + (E == 1 ? max_rows_per_expert : (int)(urand() * (max_rows_per_expert + 1)));
  const int R = off[E], T = R > 0 ? R : 1, bm = 16;
  int *tiles = malloc(sizeof(int) * (size_t)(R / bm + E + 1)), *arows = malloc((size_t)T * 4);
  for (int e = 0; e < E; e++)
    for (int i = 0; i * bm < off[e + 1] - off[e]; i++) tiles[ntile++] = e << 16 | i;
  for (int r = 0; r < R; r++) arows[r] = E == 1 ? r : (int)(urand() * T);
  uint16_t *A = rand_bf16((size_t)T * K, 1.f);
  void *dq = dup_dev(q, (size_t)E * N * ldq), *ds = dup_dev(sc, (size_t)E * N * lds), *dA = dup_dev(A, (size_t)T * K * 2);
  void *doff = dup_dev(off, (E + 1) * 4), *dt = dup_dev(tiles, (size_t)(ntile + 1) * 4), *dnt = dup_dev(&ntile, 4);
  void *dar = dup_dev(arows, (size_t)T * 4), *dC = di_cut_malloc((size_t)T * N * 4);
  di_cuk_mxfp4w w = {(const uint8_t *)dq, (const uint8_t *)ds, ldq, lds};
  di_status st = E == 1 ? di_cuk_mxfp4_gemv(R, N, K, dA, K, w, dC, N, 1, NULL)
                        : di_cuk_mxfp4_grouped_gemv(dA, K, dar, w, N, K, doff, dt, dnt, ntile + 2, bm,
                                                    max_rows_per_expert < 8 ? max_rows_per_expert : 8, dC, N, 1, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dC, (size_t)T * N, 1);
  int cols[128], nc = pick_cols(N, cols, 128);
  errsum err = {0, 0};
  for (int e = 0; e < E; e++)
    for (int m = off[e]; m < off[e + 1]; m++) {
      const int ar = arows[m];
      for (int i = 0; i < nc; i++) {
        const size_t row = (size_t)e * N + cols[i];
        double a = 0;
        for (int k = 0; k < K; k++) {
          const uint8_t byte = q[row * ldq + k / 2];
          a += (double)di_bf16_to_f32(A[(size_t)ar * K + k]) * di_e2m1_table[k % 2 ? byte >> 4 : byte & 15] *
               di_e8m0_to_f32(sc[row * lds + k / 32]);
        }
        acc_err(&err, a, got[(size_t)m * N + cols[i]]);
      }
    }
  CHECKF(rel(&err) < 1e-5, "mxfp4 %s E %d N %d K %d rows %d: rel err %.3e", what, E, N, K, R, rel(&err));
  printf("mxfp4 gemv %-16s E %3d N %5d K %5d rows %3d: rel err %.2e\n", what, E, N, K, R, rel(&err));
  if (E == 1 && R > 1) { /* a row alone gives the same bits */
    void *d1 = di_cut_malloc((size_t)N * 4);
    CHECK(di_cuk_mxfp4_gemv(1, N, K, (const uint16_t *)dA + (size_t)(R - 1) * K, K, w, d1, N, 1, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    float *one = fetch_y(d1, (size_t)N, 1);
    CHECKF(memcmp(one, got + (size_t)(R - 1) * N, (size_t)N * 4) == 0, "mxfp4 %s: the last row alone differs", what);
    free(one);
    di_cut_free(d1);
  }
  free(got); free(q); free(sc); free(off); free(tiles); free(arows); free(A);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dA); di_cut_free(doff); di_cut_free(dt); di_cut_free(dnt);
  di_cut_free(dar); di_cut_free(dC);
}

/* ---- argument checks ---------------------------------------------------------------------------------- */
static void test_errors(void) {
  di_cuk_fp8w w = {NULL, NULL, 64, 64, 64, 1};
  CHECK_ERR(di_cuk_fp8_gemm(64, 128, 64, NULL, 64, NULL, 1, w, NULL, 128, 0, 0.f, NULL), "128-wide blocks");
  CHECK_ERR(di_cuk_fp8_quant_act(NULL, 72, 4, 72, NULL, 72, NULL, 1, NULL), "K % 16");
  di_cuk_fp8w w2 = {NULL, NULL, 256, 128, 128, 1};
  CHECK_ERR(di_cuk_fp8_gemv(1, 128, 256, NULL, 256, w2, NULL, 128, 0, 0.f, NULL), "scale columns");
}

/* ---- timings ------------------------------------------------------------------------------------------- */
/* the timings reuse one random weight per shape (making a V3-sized one takes a second on the host) */
static host_w g_tw;
static const host_w *timing_w(int N, int K) {
  if (g_tw.q && g_tw.N == N && g_tw.K == K) return &g_tw;
  free_w(&g_tw);
  g_tw = make_w(1, N, K, 128, 128);
  return &g_tw;
}

/* The timings' bf16 column: ms per call of the same product with bf16 weights (cuBLASLt / the skinny
 * kernel; the weights' values do not matter), after `warm` calls; -1 when the weights do not fit. */
static double time_bf16(di_cu_blas *blas, int M, int N, int K, const void *dX, void *dY, int warm, int iters) {
  void *wb = di_cut_malloc((size_t)N * K * 2);
  if (!wb) return -1;
  for (int i = 0; i < warm; i++) di_cu_gemm(blas, M, N, K, dX, K, wb, K, dY, N, 0, 0.f, NULL);
  di_cut_sync();
  const double t0 = di_cut_time_ms();
  for (int i = 0; i < iters; i++) di_cu_gemm(blas, M, N, K, dX, K, wb, K, dY, N, 0, 0.f, NULL);
  di_cut_sync();
  const double ms = (di_cut_time_ms() - t0) / iters;
  di_cut_free(wb);
  return ms;
}

static void time_gemv(di_cu_blas *blas, int M, int N, int K) {
  const host_w w = *timing_w(N, K);
  uint16_t *X = rand_bf16((size_t)M * K, 1.f);
  void *dq, *ds, *dX = dup_dev(X, (size_t)M * K * 2), *dY = di_cut_malloc((size_t)M * N * 4);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  /* several weight copies rotated so that L2 (50 MB) holds none of them between calls */
  const int copies = (int)(200e6 / ((double)N * K)) + 1 > 8 ? 8 : (int)(200e6 / ((double)N * K)) + 1;
  void *cq[8];
  cq[0] = dq;
  for (int c = 1; c < copies; c++) cq[c] = dup_dev(w.q, (size_t)N * K);
  const int iters = 50;
  double mst[3];
  for (int v = 0; v < 3; v++) { /* the CUDA-core GEMV, the tensor-core one with 3 and with 2 pieces in flight */
    const int tc = v > 0;
    g_tc = tc;
    setenv("DEEPINFER_CUDA_FP8_TC_RING", v == 2 ? "2" : "3", 1);
    dw.q = (const uint8_t *)cq[0];
    for (int i = 0; i < 5; i++) gemv(M, N, K, dX, K, dw, dY, N, 0, 0.f);
    CHECK(di_cut_sync() == 0);
    double t0 = di_cut_time_ms();
    for (int i = 0; i < iters; i++) {
      dw.q = (const uint8_t *)cq[i % copies];
      gemv(M, N, K, dX, K, dw, dY, N, 0, 0.f);
    }
    CHECK(di_cut_sync() == 0);
    mst[v] = (di_cut_time_ms() - t0) / iters;
  }
  unsetenv("DEEPINFER_CUDA_FP8_TC_RING");
  g_tc = 0;
  const double ms = mst[0], msb = time_bf16(blas, M, N, K, dX, dY, 5, iters);
  printf("time fp8 gemv M %2d N %5d K %5d: cuda-core %7.1f us %5.0f GB/s | tc ring 3 %7.1f us %5.0f GB/s | tc ring 2 "
         "%7.1f us %5.0f GB/s (fp8 bytes) | bf16 %7.1f us %5.0f GB/s\n", M, N, K, ms * 1e3, (double)N * K / (ms * 1e6),
         mst[1] * 1e3, (double)N * K / (mst[1] * 1e6), mst[2] * 1e3, (double)N * K / (mst[2] * 1e6), msb * 1e3,
         2.0 * N * K / (msb * 1e6));
  for (int c = 1; c < copies; c++) di_cut_free(cq[c]);
  free(X);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dX); di_cut_free(dY);
}

static void time_gemm(di_cu_blas *blas, int M, int N, int K) {
  const host_w w = *timing_w(N, K);
  uint16_t *X = rand_bf16((size_t)M * K, 1.f);
  size_t wsb = di_cu_fp8lt_ws_bytes(M, N, K) > di_cuk_fp8_ws_bytes(M, K) ? di_cu_fp8lt_ws_bytes(M, N, K)
                                                                        : di_cuk_fp8_ws_bytes(M, K);
  void *dq, *ds, *dX = dup_dev(X, (size_t)M * K * 2), *dY = di_cut_malloc((size_t)M * N * 4), *dws = di_cut_malloc(wsb);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  const int iters = 20;
  double mst[2] = {-1, -1};
  di_cu_fp8lt *keep = g_lt_keep;
  for (int v = 0; v < 2; v++) {
    g_lt = v ? keep : NULL;
    if (v && !keep) break;
    for (int i = 0; i < 3; i++) lt_or_mma(M, N, K, dX, dw, dY, 0, 0.f, dws, wsb);
    CHECK(di_cut_sync() == 0);
    double t0 = di_cut_time_ms();
    for (int i = 0; i < iters; i++) lt_or_mma(M, N, K, dX, dw, dY, 0, 0.f, dws, wsb);
    CHECK(di_cut_sync() == 0);
    mst[v] = (di_cut_time_ms() - t0) / iters;
  }
  g_lt = NULL;
  const double ms = mst[0], msb = time_bf16(blas, M, N, K, dX, dY, 3, iters);
  printf("time fp8 gemm M %4d N %5d K %5d: mma.sync %8.1f us, %6.1f TFLOP/s | cuBLASLt fp8 %8.1f us, %6.1f TFLOP/s "
         "(quantize + scales + matmul) | bf16 cuBLASLt %8.1f us, %6.1f TFLOP/s\n", M, N, K, ms * 1e3,
         2.0 * M * N * K / (ms * 1e9), mst[1] * 1e3, 2.0 * M * N * K / (mst[1] * 1e9), msb * 1e3,
         2.0 * M * N * K / (msb * 1e9));
  free(X);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dX); di_cut_free(dY); di_cut_free(dws);
}

static void time_mxfp4(int M, int N, int K) {
  const size_t nq = (size_t)N * K / 2, ns = (size_t)N * K / 32;
  uint8_t *q = malloc(nq), *sc = malloc(ns);
  for (size_t i = 0; i < nq; i++) q[i] = (uint8_t)(urand() * 256);
  memset(sc, 127, ns);
  uint16_t *X = rand_bf16((size_t)M * K, 1.f);
  void *ds = dup_dev(sc, ns), *dX = dup_dev(X, (size_t)M * K * 2), *dY = di_cut_malloc((size_t)M * N * 4), *cq[8];
  const int copies = (int)(200e6 / nq) + 1 > 8 ? 8 : (int)(200e6 / nq) + 1;
  for (int c = 0; c < copies; c++) cq[c] = dup_dev(q, nq);
  di_cuk_mxfp4w w = {(const uint8_t *)cq[0], (const uint8_t *)ds, K / 2, K / 32};
  for (int i = 0; i < 5; i++) di_cuk_mxfp4_gemv(M, N, K, dX, K, w, dY, N, 0, NULL);
  di_cut_sync();
  const int iters = 50;
  double t0 = di_cut_time_ms();
  for (int i = 0; i < iters; i++) {
    w.q = (const uint8_t *)cq[i % copies];
    di_cuk_mxfp4_gemv(M, N, K, dX, K, w, dY, N, 0, NULL);
  }
  CHECK(di_cut_sync() == 0);
  const double ms = (di_cut_time_ms() - t0) / iters;
  printf("time mxfp4 gemv M %2d N %5d K %5d: %8.1f us, %6.0f GB/s of packed weights + scales\n", M, N, K, ms * 1e3,
         (double)(nq + ns) / (ms * 1e6));
  for (int c = 0; c < copies; c++) di_cut_free(cq[c]);
  free(q); free(sc); free(X);
  di_cut_free(ds); di_cut_free(dX); di_cut_free(dY);
}

/* The fused gate/up + SiLU form (glu): W = [gate; up] of E experts (E = 0: dense, no tile list), act[m][j] =
 * silu(x . gate_j) * (x . up_j) in bf16, against float64 (1e-2, bf16 output); rows of up to max_rows per
 * expert, a_rows gathered. */
static void test_glu(int E, int I, int K, int max_rows, const char *what) {
  const int En = E > 0 ? E : 1, N = 2 * I;
  host_w w = make_w(En, N, K, 1, 128);
  int *off = malloc((En + 1) * 4), *tiles = malloc(sizeof(int) * (size_t)(En * (max_rows / 64 + 2)));
  off[0] = 0;
  int ntile = 0;
  for (int e = 0; e < En; e++) {
    const int c = E > 0 ? (int)(urand() * (max_rows + 1)) : max_rows;
    off[e + 1] = off[e] + c;
    for (int i = 0; i * 64 < c; i++) tiles[ntile++] = e << 16 | i;
  }
  const int R = off[En], T = R > 0 ? R : 1;
  int *arows = malloc((size_t)T * 4);
  for (int r = 0; r < T; r++) arows[r] = E > 0 ? (int)(urand() * T) : r;
  uint16_t *A = rand_bf16((size_t)T * K, 1.f);
  void *dq, *ds;
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  void *dA = dup_dev(A, (size_t)T * K * 2), *doff = dup_dev(off, (En + 1) * 4);
  void *dt = dup_dev(tiles, (size_t)(ntile + 1) * 4), *dnt = dup_dev(&ntile, 4), *dar = dup_dev(arows, (size_t)T * 4);
  void *dC = di_cut_malloc((size_t)T * I * 2);
  const int mr = max_rows < 64 ? max_rows : 64;
  di_status st = E > 0 ? (g_tc ? di_cuk_fp8_tc_grouped_gemv(dA, K, dar, dw, N, K, doff, dt, dnt, ntile + 2, 64, mr, dC,
                                                            I, 0, 1, NULL)
                               : di_cuk_fp8_grouped_gemv_form(dA, K, dar, dw, N, K, doff, dt, dnt, ntile + 2, 64, mr,
                                                              dC, I, 0, 1, NULL))
                       : (g_tc ? di_cuk_fp8_tc_gemv_glu(R, N, K, dA, K, dw, dC, I, NULL)
                               : di_cuk_fp8_gemv_glu(R, N, K, dA, K, dw, dC, I, NULL));
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dC, (size_t)T * I, 0);
  int cols[128], nc = pick_cols(I, cols, 128);
  errsum err = {0, 0};
  for (int e = 0; e < En; e++)
    for (int m = off[e]; m < off[e + 1]; m += (off[e + 1] - off[e] > 8 ? 5 : 1))
      for (int i = 0; i < nc; i++) {
        double ga = 0, up = 0;
        for (int k = 0; k < K; k++) {
          const double x = di_bf16_to_f32(A[(size_t)arows[m] * K + k]);
          ga += x * w_at(&w, e, cols[i], k);
          up += x * w_at(&w, e, I + cols[i], k);
        }
        acc_err(&err, ga / (1 + exp(-ga)) * up, got[(size_t)m * I + cols[i]]);
      }
  const char *form = g_tc ? "tc glu" : "glu";
  CHECKF(rel(&err) < 1e-2, "fp8 %s %s E %d I %d K %d rows %d: rel err %.3e", form, what, E, I, K, R, rel(&err));
  printf("fp8 %-6s %-22s E %3d I %5d K %5d rows %4d: rel err %.2e\n", form, what, E, I, K, R, rel(&err));
  free(got); free(off); free(tiles); free(arows); free(A); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dA); di_cut_free(doff); di_cut_free(dt); di_cut_free(dnt);
  di_cut_free(dar); di_cut_free(dC);
}

/* The normed CUDA-core GEMV (the attention norm inside the q/kv product): Y = bf16(rmsnorm(H) w) .
 * dequant(W)^T against float64 on the same bf16-rounded normed rows (1e-2, bf16 output); the device's
 * rounding of x may differ from the reference's by one bf16 ulp where the 1 / rms differs in its last
 * bits (different summation order), which the tolerance covers. Each row alone bit-equal. */
static void test_normed(int M, int N, int K, const char *what) {
  host_w w = make_w(1, N, K, 1, 128);
  float *H = malloc((size_t)M * K * 4), *nw = malloc((size_t)K * 4);
  for (size_t i = 0; i < (size_t)M * K; i++) H[i] = nrand() * 3.f;
  for (int k = 0; k < K; k++) nw[k] = 0.5f + (float)urand();
  void *dq, *ds, *dH = dup_dev(H, (size_t)M * K * 4), *dnw = dup_dev(nw, (size_t)K * 4);
  void *dY = di_cut_malloc((size_t)M * N * 2), *d1 = di_cut_malloc((size_t)N * 2);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  const float eps = 1e-6f;
  di_status st = di_cuk_fp8_gemv_normed(M, N, K, dH, K, dnw, eps, dw, dY, N, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dY, (size_t)M * N, 0);
  int cols[256], nc = pick_cols(N, cols, 256);
  errsum e = {0, 0};
  double *x = malloc((size_t)K * 8);
  for (int m = 0; m < M; m++) {
    double ss = 0;
    for (int k = 0; k < K; k++) ss += (double)H[(size_t)m * K + k] * H[(size_t)m * K + k];
    const float inv = (float)(1.0 / sqrt(ss / K + eps));
    for (int k = 0; k < K; k++) x[k] = di_bf16_to_f32(di_f32_to_bf16(H[(size_t)m * K + k] * inv * nw[k]));
    for (int i = 0; i < nc; i++) {
      double a = 0;
      for (int k = 0; k < K; k++) a += x[k] * w_at(&w, 0, cols[i], k);
      acc_err(&e, a, got[(size_t)m * N + cols[i]]);
    }
  }
  CHECKF(rel(&e) < 1e-2, "fp8 normed gemv %s M %d N %d K %d: rel err %.3e", what, M, N, K, rel(&e));
  printf("fp8 normed gemv %-22s M %2d N %5d K %5d: rel err %.2e\n", what, M, N, K, rel(&e));
  int bad = 0;
  for (int m = 0; m < M; m++) {
    CHECK(di_cuk_fp8_gemv_normed(1, N, K, (const float *)dH + (size_t)m * K, K, dnw, eps, dw, d1, N, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    float *one = fetch_y(d1, (size_t)N, 0);
    for (int n = 0; n < N; n++) bad += memcmp(&one[n], &got[(size_t)m * N + n], 4) != 0;
    free(one);
  }
  CHECKF(bad == 0, "fp8 normed gemv %s M %d: %d values differ from the row alone", what, M, bad);
  free(x); free(got); free(H); free(nw); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dH); di_cut_free(dnw); di_cut_free(dY); di_cut_free(d1);
}

/* One token's FP8 MoE down projection + weighted combine: h[n] += sum_j wts[j] act[inv[j]] .
 * dequant(W_ids[j])[n] against float64 (f32 h, 1e-4 relative to the added part). */
static void test_down_combine(int E, int N, int K, int kt, const char *what) {
  host_w w = make_w(E, N, K, 1, 128);
  int ids[16], inv[16];
  float wts[16];
  for (int j = 0; j < kt; j++) {
    ids[j] = (j * 7 + (int)(urand() * E)) % E;
    wts[j] = 0.1f + (float)urand();
    inv[j] = kt - 1 - j;
  }
  uint16_t *act = rand_bf16((size_t)kt * K, 1.f);
  float *h = malloc((size_t)N * 4);
  for (int n = 0; n < N; n++) h[n] = nrand();
  void *dq, *ds, *dact = dup_dev(act, (size_t)kt * K * 2), *dh = dup_dev(h, (size_t)N * 4);
  void *dids = dup_dev(ids, (size_t)kt * 4), *dwts = dup_dev(wts, (size_t)kt * 4), *dinv = dup_dev(inv, (size_t)kt * 4);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  di_status st = di_cuk_fp8_down_combine(dact, K, dw, N, K, dids, dwts, dinv, kt, dh, N, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dh, (size_t)N, 1);
  errsum e = {0, 0};
  for (int n = 0; n < N; n++) {
    acc_err(&e, ref_down_combine(&w, act, K, ids, wts, inv, kt, n), (double)got[n] - h[n]);
  }
  CHECKF(rel(&e) < 1e-4, "fp8 down+combine %s E %d N %d K %d k %d: rel err %.3e", what, E, N, K, kt, rel(&e));
  printf("fp8 down+combine %-22s E %3d N %5d K %5d k %d: rel err %.2e\n", what, E, N, K, kt, rel(&e));
  free(got); free(act); free(h); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dact); di_cut_free(dh); di_cut_free(dids); di_cut_free(dwts);
  di_cut_free(dinv);
}

/* W_UV + FP8 o_proj of one token (k_mla_vo.cu's FP8 form): h[n] += sum_h W_o[n][h] . bf16(W_UV[h] . olat[h])
 * against float64 on the same bf16-rounded v (1e-4 relative to the added part; v's rounding may differ by
 * one bf16 ulp where the fp32 sum lands near a rounding boundary, covered). */
static void test_vo(int NH, int H, int R, int dv, const char *what) {
  if (!di_cuk_mla_vo_ok(1, NH, H, R, dv)) { printf("fp8 vo %s: shape not supported here, skipped\n", what); return; }
  host_w w = make_w(1, H, NH * dv, 1, 128);
  uint16_t *wuv = rand_bf16((size_t)NH * dv * R, 0.05f), *olat = rand_bf16((size_t)NH * R, 1.f);
  float *h = malloc((size_t)H * 4);
  for (int n = 0; n < H; n++) h[n] = nrand();
  void *dq, *ds, *dwuv = dup_dev(wuv, (size_t)NH * dv * R * 2), *dol = dup_dev(olat, (size_t)NH * R * 2);
  void *dh = dup_dev(h, (size_t)H * 4);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  CHECKF(di_cuk_mla_vo_fp8_ok(1, NH, H, R, dv, &dw), "fp8 vo %s: not taken", what);
  di_status st = di_cuk_mla_vo_fp8(dol, R, dwuv, (int64_t)dv * R, R, dv, &dw, NH, H, dh, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dh, (size_t)H, 1);
  double *v = malloc((size_t)NH * dv * 8);
  for (int hh = 0; hh < NH; hh++)
    for (int i = 0; i < dv; i++) {
      double a = 0;
      for (int k = 0; k < R; k++)
        a += (double)di_bf16_to_f32(wuv[((size_t)hh * dv + i) * R + k]) * di_bf16_to_f32(olat[(size_t)hh * R + k]);
      v[hh * dv + i] = di_bf16_to_f32(di_f32_to_bf16((float)a));
    }
  errsum e = {0, 0};
  for (int n = 0; n < H; n++) {
    double a = 0;
    for (int k = 0; k < NH * dv; k++) a += w_at(&w, 0, n, k) * v[k];
    acc_err(&e, a, (double)got[n] - h[n]);
  }
  CHECKF(rel(&e) < 1e-4, "fp8 vo %s NH %d H %d R %d dv %d: rel err %.3e", what, NH, H, R, dv, rel(&e));
  printf("fp8 vo %-22s NH %2d H %5d R %3d dv %3d: rel err %.2e\n", what, NH, H, R, dv, rel(&e));
  free(v); free(got); free(wuv); free(olat); free(h); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dwuv); di_cut_free(dol); di_cut_free(dh);
}

/* ---- the 16-rows-a-warp expert GEMVs (k_fp8_grouped_gemv.cu, DEEPINFER_CUDA_FP8_GV16) ------------------
 * The grouped form (glu: gate/up + SiLU in bf16, 1e-2; plain: f32 out, 1e-4) and one token's down + combine
 * (1e-4 relative to the added part) against float64 on fresh random inputs, and bit-equal to the 2-row
 * CUDA-core kernels they replace (di_cuk_fp8_grouped_gemv_form, di_cuk_fp8_down_combine: the same
 * arithmetic in the same order), plain and pipelined, at 16-row tiles of 1..max_rows rows per expert. */
static void test_gv16(int E, int N, int K, int br, int bc, int max_rows, int glu, const char *what) {
  host_w w = make_w(E, N, K, br, bc);
  const int bm = 16, Nout = glu ? N / 2 : N;
  int *off = malloc((E + 1) * 4), *tiles = malloc(sizeof(int) * (size_t)(E * (max_rows / bm + 2)));
  off[0] = 0;
  int ntile = 0;
  for (int e = 0; e < E; e++) {
    const int c = (int)(urand() * (max_rows + 1));
    off[e + 1] = off[e] + c;
    for (int i = 0; i * bm < c; i++) tiles[ntile++] = e << 16 | i;
  }
  const int R = off[E], T = R > 0 ? R : 1;
  int *arows = malloc((size_t)T * 4);
  for (int r = 0; r < T; r++) arows[r] = (int)(urand() * T);
  uint16_t *A = rand_bf16((size_t)T * K, 1.f);
  void *dq, *ds;
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  void *dA = dup_dev(A, (size_t)T * K * 2), *doff = dup_dev(off, (E + 1) * 4);
  void *dt = dup_dev(tiles, (size_t)(ntile + 1) * 4), *dnt = dup_dev(&ntile, 4), *dar = dup_dev(arows, (size_t)T * 4);
  const size_t ob = (size_t)T * Nout * (glu ? 2 : 4);
  void *dC[3] = {di_cut_malloc(ob), di_cut_malloc(ob), di_cut_malloc(ob)};
  const int mr = max_rows < bm ? max_rows : bm;
  CHECKF(di_cuk_fp8_gv16_ok(K, dA, K, dw), "fp8 gv16 %s: not taken", what);
  CHECK(di_cuk_fp8_grouped_gemv_form(dA, K, dar, dw, N, K, doff, dt, dnt, ntile + 2, bm, mr, dC[0], Nout, !glu, glu,
                                     NULL) == DI_OK);
  for (int pipe = 0; pipe < 2; pipe++) {
    di_status st = di_cuk_fp8_gv16_grouped(dA, K, dar, dw, N, K, doff, dt, dnt, ntile + 2, bm, mr, dC[1 + pipe], Nout,
                                           !glu, glu, pipe, -1, 0, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
  }
  CHECK(di_cut_sync() == 0);
  float *ref2 = fetch_y(dC[0], (size_t)T * Nout, !glu), *got = fetch_y(dC[1], (size_t)T * Nout, !glu);
  float *gotp = fetch_y(dC[2], (size_t)T * Nout, !glu);
  int cols[128], nc = pick_cols(Nout, cols, 128);
  errsum err = {0, 0};
  for (int e = 0; e < E; e++)
    for (int m = off[e]; m < off[e + 1]; m++)
      for (int i = 0; i < nc; i++) {
        double ga = 0, up = 0;
        for (int k = 0; k < K; k++) {
          const double x = di_bf16_to_f32(A[(size_t)arows[m] * K + k]);
          ga += x * w_at(&w, e, cols[i], k);
          if (glu) up += x * w_at(&w, e, Nout + cols[i], k);
        }
        acc_err(&err, glu ? ga / (1 + exp(-ga)) * up : ga, got[(size_t)m * Nout + cols[i]]);
      }
  size_t bad = 0, badp = 0;
  for (int m = 0; m < R; m++)
    for (int n = 0; n < Nout; n++) {
      bad += memcmp(&got[(size_t)m * Nout + n], &ref2[(size_t)m * Nout + n], 4) != 0;
      badp += memcmp(&gotp[(size_t)m * Nout + n], &ref2[(size_t)m * Nout + n], 4) != 0;
    }
  const double tol = glu ? 1e-2 : 1e-4;
  CHECKF(rel(&err) < tol, "fp8 gv16 %s E %d N %d K %d rows %d: rel err %.3e", what, E, N, K, R, rel(&err));
  CHECKF(bad == 0 && badp == 0, "fp8 gv16 %s: %zu (plain) / %zu (pipelined) of %zu values differ from the 2-row GEMV",
         what, bad, badp, (size_t)R * Nout);
  printf("fp8 gv16 %-4s %-24s E %3d N %5d K %5d block %3dx%-3d rows %4d: rel err %.2e, %zu / %zu differ from the 2-row GEMV\n",
         glu ? "glu" : "f32", what, E, N, K, br, bc, R, rel(&err), bad, badp);
  free(ref2); free(got); free(gotp); free(off); free(tiles); free(arows); free(A); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dA); di_cut_free(doff); di_cut_free(dt); di_cut_free(dnt);
  di_cut_free(dar); for (int i = 0; i < 3; i++) di_cut_free(dC[i]);
}

static void test_gv16_down_combine(int E, int N, int K, int kt, const char *what) {
  host_w w = make_w(E, N, K, 1, 128);
  int ids[16], inv[16];
  float wts[16];
  for (int j = 0; j < kt; j++) {
    ids[j] = (j * 5 + (int)(urand() * E)) % E;
    wts[j] = 0.1f + (float)urand();
    inv[j] = (j * 3 + 1) % kt;
  }
  uint16_t *act = rand_bf16((size_t)kt * K, 1.f);
  float *h = malloc((size_t)N * 4);
  for (int n = 0; n < N; n++) h[n] = nrand();
  void *dq, *ds, *dact = dup_dev(act, (size_t)kt * K * 2);
  void *dh[3] = {dup_dev(h, (size_t)N * 4), dup_dev(h, (size_t)N * 4), dup_dev(h, (size_t)N * 4)};
  void *dids = dup_dev(ids, (size_t)kt * 4), *dwts = dup_dev(wts, (size_t)kt * 4), *dinv = dup_dev(inv, (size_t)kt * 4);
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  CHECK(di_cuk_fp8_down_combine(dact, K, dw, N, K, dids, dwts, dinv, kt, dh[0], N, NULL) == DI_OK);
  for (int pipe = 0; pipe < 2; pipe++) { /* the last two experts prefetched, as the shared ones are */
    di_status st = di_cuk_fp8_gv16_down_combine(dact, K, dw, N, K, dids, dwts, dinv, kt, dh[1 + pipe], N, pipe,
                                                E - 2, 2, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
  }
  CHECK(di_cut_sync() == 0);
  float *ref2 = fetch_y(dh[0], (size_t)N, 1), *got = fetch_y(dh[1], (size_t)N, 1), *gotp = fetch_y(dh[2], (size_t)N, 1);
  errsum e = {0, 0};
  for (int n = 0; n < N; n++) {
    acc_err(&e, ref_down_combine(&w, act, K, ids, wts, inv, kt, n), (double)got[n] - h[n]);
  }
  int bad = 0, badp = 0;
  for (int n = 0; n < N; n++) {
    bad += memcmp(&got[n], &ref2[n], 4) != 0;
    badp += memcmp(&gotp[n], &ref2[n], 4) != 0;
  }
  CHECKF(rel(&e) < 1e-4, "fp8 gv16 down+combine %s E %d N %d K %d k %d: rel err %.3e", what, E, N, K, kt, rel(&e));
  CHECKF(bad == 0 && badp == 0, "fp8 gv16 down+combine %s: %d / %d of %d differ from the 2-row kernel", what, bad, badp, N);
  printf("fp8 gv16 down+combine %-22s E %3d N %5d K %5d k %d: rel err %.2e, %d / %d differ from the 2-row kernel\n", what,
         E, N, K, kt, rel(&e), bad, badp);
  free(ref2); free(got); free(gotp); free(act); free(h); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dact); for (int i = 0; i < 3; i++) di_cut_free(dh[i]);
  di_cut_free(dids); di_cut_free(dwts); di_cut_free(dinv);
}

static void test_gv16_all(void) {
  test_gv16(10, 2816, 2048, 1, 128, 1, 1, "V2-Lite gate/up, 1 row");
  test_gv16(10, 2816, 2048, 1, 128, 2, 1, "V2-Lite gate/up, 2 rows");
  test_gv16(10, 2816, 2048, 1, 128, 4, 1, "V2-Lite gate/up, 4 rows");
  test_gv16(10, 2816, 2048, 1, 128, 16, 1, "V2-Lite gate/up, 16 rows");
  test_gv16(10, 2048, 1408, 1, 128, 1, 0, "V2-Lite down, 1 row");
  test_gv16(10, 2048, 1408, 1, 128, 3, 0, "V2-Lite down, 3 rows");
  test_gv16(6, 4096, 7168, 1, 128, 2, 1, "V3 gate/up");
  test_gv16(6, 7168, 2048, 1, 128, 4, 0, "V3 down");
  test_gv16(5, 200, 1392, 1, 128, 3, 1, "part I 100, part K");
  test_gv16(5, 228, 224, 128, 128, 2, 0, "part N 228, K 224, 128x128");
  test_gv16(4, 333, 512, 32, 16, 5, 0, "block 32x16, N 333");
  test_gv16_down_combine(10, 2048, 1408, 8, "V2-Lite");
  test_gv16_down_combine(12, 7168, 2048, 9, "V3");
  test_gv16_down_combine(4, 228, 1392, 3, "part N, part K");
  di_cuk_fp8w w = {NULL, NULL, 224, 1, 8, 28};
  CHECK_ERR(di_cuk_fp8_gv16_grouped(NULL, 224, NULL, w, 64, 224, NULL, NULL, NULL, 1, 16, 1, NULL, 32, 0, 1, 0, -1, 0,
                                    NULL), "block_cols % 16");
  di_cuk_fp8w w2 = {NULL, NULL, 224, 1, 128, 2};
  CHECK_ERR(di_cuk_fp8_gv16_grouped(NULL, 224, NULL, w2, 63, 224, NULL, NULL, NULL, 1, 16, 1, NULL, 32, 0, 1, 0, -1, 0,
                                    NULL), "N even");
  CHECK_ERR(di_cuk_fp8_gv16_down_combine(NULL, 216, w2, 64, 216, NULL, NULL, NULL, 1, NULL, 64, 0, -1, 0, NULL),
            "K % 16");
}

/* V2-Lite's experts at T tokens (64 routed + 2 shared, 8 slots a token, 16-row tiles), 16 routings that
 * rotate so that each call reads its experts from HBM: the 2-row CUDA-core GEMV, the 16-row one plain and
 * pipelined, the tensor-core GEMV; at one token also down + combine. GB/s of the experts' weights touched. */
static void time_gv16(int T) {
  enum { NE = 66, I = 1408, H = 2048, SETS = 16, ITERS = 64 };
  const size_t gub = (size_t)2 * I * H, dnb = (size_t)H * I;
  uint8_t *pat = rand_fp8(gub);
  uint8_t *big = malloc(gub * NE);
  for (int e = 0; e < NE; e++) memcpy(big + gub * e, pat, gub);
  void *dgu = dup_dev(big, gub * NE), *ddn = dup_dev(big, dnb * NE);
  free(big); free(pat);
  float *sc = malloc((size_t)NE * 2 * I * (H / 128) * 4);
  for (size_t i = 0; i < (size_t)NE * 2 * I * (H / 128); i++) sc[i] = (float)ldexp(1.0 + urand(), -8);
  void *dsgu = dup_dev(sc, (size_t)NE * 2 * I * (H / 128) * 4), *dsdn = dup_dev(sc, (size_t)NE * H * (I / 128) * 4);
  free(sc);
  const di_cuk_fp8w wgu = {(const uint8_t *)dgu, (const float *)dsgu, H, 1, 128, H / 128};
  const di_cuk_fp8w wdn = {(const uint8_t *)ddn, (const float *)dsdn, I, 1, 128, I / 128};
  const int A = T * 8, bm = 16;
  void *doff[SETS], *dtl[SETS], *dnt[SETS], *dperm[SETS], *dids[SETS], *dinv[SETS];
  int ntiles[SETS], distinct = 0;
  for (int s = 0; s < SETS; s++) {
    int cnt[NE] = {0}, off[NE + 1], perm[8 * 16], tiles[8 * 16 + NE], ids[8], inv[8], ntile = 0;
    int assign[16][8];
    for (int t = 0; t < T; t++)
      for (int j = 0; j < 8; j++) {
        int e, dup;
        do {
          e = (int)(urand() * NE);
          dup = 0;
          for (int q = 0; q < j; q++) dup |= assign[t][q] == e;
        } while (dup);
        assign[t][j] = e;
        cnt[e]++;
      }
    off[0] = 0;
    for (int e = 0; e < NE; e++) off[e + 1] = off[e] + cnt[e];
    int fill[NE];
    memcpy(fill, off, sizeof(fill));
    for (int t = 0; t < T; t++)
      for (int j = 0; j < 8; j++) {
        const int e = assign[t][j], row = fill[e]++;
        perm[row] = t;
        if (t == 0) { ids[j] = e; inv[j] = row; }
      }
    for (int e = 0; e < NE; e++) {
      distinct += cnt[e] > 0;
      for (int i = 0; i * bm < cnt[e]; i++) tiles[ntile++] = e << 16 | i;
    }
    ntiles[s] = ntile;
    doff[s] = dup_dev(off, sizeof(off)); dtl[s] = dup_dev(tiles, (size_t)ntile * 4); dnt[s] = dup_dev(&ntile, 4);
    dperm[s] = dup_dev(perm, (size_t)A * 4); dids[s] = dup_dev(ids, sizeof(ids)); dinv[s] = dup_dev(inv, sizeof(inv));
  }
  int maxt = 0;
  for (int s = 0; s < SETS; s++) maxt = ntiles[s] > maxt ? ntiles[s] : maxt;
  const double touched = (double)distinct / SETS; /* experts read per call */
  uint16_t *X = rand_bf16((size_t)T * H, 1.f);
  float wts[8] = {0.3f, 0.2f, 0.1f, 0.1f, 0.1f, 0.1f, 0.05f, 0.05f};
  void *dX = dup_dev(X, (size_t)T * H * 2), *dact = di_cut_malloc((size_t)A * I * 2), *dy = di_cut_malloc((size_t)A * H * 4);
  void *dw = dup_dev(wts, sizeof(wts)), *dh = di_cut_malloc((size_t)H * 4);
  free(X);
  const int rows = T < bm ? T : bm;
  double us[4][3]; /* [kernel][gate/up, down, down + combine] */
  for (int kind = 0; kind < 4; kind++)
    for (int part = 0; part < 3; part++) {
      us[kind][part] = -1;
      if (part == 2 && (T != 1 || kind == 3)) continue;
      for (int it = -4; it < ITERS; it++) {
        if (it == 0) { CHECK(di_cut_sync() == 0); us[kind][part] = di_cut_time_ms(); }
        const int s = (it + 4) % SETS;
        di_status st = DI_OK;
        if (part == 0) {
          if (kind == 0) st = di_cuk_fp8_grouped_gemv_form(dX, H, dperm[s], wgu, 2 * I, H, doff[s], dtl[s], dnt[s], maxt, bm, rows, dact, I, 0, 1, NULL);
          else if (kind < 3) st = di_cuk_fp8_gv16_grouped(dX, H, dperm[s], wgu, 2 * I, H, doff[s], dtl[s], dnt[s], maxt, bm, rows, dact, I, 0, 1, kind == 2, -1, 0, NULL);
          else st = di_cuk_fp8_tc_grouped_gemv(dX, H, dperm[s], wgu, 2 * I, H, doff[s], dtl[s], dnt[s], maxt, bm, bm, dact, I, 0, 1, NULL);
        } else if (part == 1) {
          if (kind == 0) st = di_cuk_fp8_grouped_gemv(dact, I, NULL, wdn, H, I, doff[s], dtl[s], dnt[s], maxt, bm, rows, dy, H, 1, NULL);
          else if (kind < 3) st = di_cuk_fp8_gv16_grouped(dact, I, NULL, wdn, H, I, doff[s], dtl[s], dnt[s], maxt, bm, rows, dy, H, 1, 0, kind == 2, -1, 0, NULL);
          else st = di_cuk_fp8_tc_grouped_gemv(dact, I, NULL, wdn, H, I, doff[s], dtl[s], dnt[s], maxt, bm, bm, dy, H, 1, 0, NULL);
        } else {
          if (kind == 0) st = di_cuk_fp8_down_combine(dact, I, wdn, H, I, dids[s], dw, dinv[s], 8, dh, H, NULL);
          else st = di_cuk_fp8_gv16_down_combine(dact, I, wdn, H, I, dids[s], dw, dinv[s], 8, dh, H, kind == 2, -1, 0, NULL);
        }
        if (st != DI_OK) { CHECKF(0, "time gv16: %s", di_last_error()); break; }
      }
      CHECK(di_cut_sync() == 0);
      if (us[kind][part] >= 0) us[kind][part] = (di_cut_time_ms() - us[kind][part]) * 1e3 / ITERS;
    }
  const char *names[4] = {"2-row", "16-row", "16-row pipelined", "tensor-core"};
  const double bytes[3] = {touched * (gub + (double)2 * I * (H / 128) * 4), touched * (dnb + (double)H * (I / 128) * 4),
                           8 * (dnb + (double)H * (I / 128) * 4)};
  const char *parts[3] = {"gate/up + SiLU", "down (f32)", "down + combine"};
  for (int part = 0; part < 3; part++)
    for (int kind = 0; kind < 4; kind++)
      if (us[kind][part] > 0)
        printf("time fp8 experts V2-Lite T %2d (%.1f experts): %-14s %-16s %8.1f us %6.0f GB/s\n", T, touched, parts[part],
               names[kind], us[kind][part], bytes[part] / (us[kind][part] * 1e3));
  for (int s = 0; s < SETS; s++) {
    di_cut_free(doff[s]); di_cut_free(dtl[s]); di_cut_free(dnt[s]); di_cut_free(dperm[s]); di_cut_free(dids[s]);
    di_cut_free(dinv[s]);
  }
  di_cut_free(dgu); di_cut_free(ddn); di_cut_free(dsgu); di_cut_free(dsdn); di_cut_free(dX); di_cut_free(dact);
  di_cut_free(dy); di_cut_free(dw); di_cut_free(dh);
}

/* ---- k_fp8_grouped_mma.cu (DEEPINFER_CUDA_FP8_GMMA): the grouped W8A8 GEMM of steps of > 16 tokens ----
 * Tile lists of bm (16 or 64) rows as k_moe.cu builds them, the activation rows gathered through a_rows,
 * per-row weight scales (the device form) or 128 x 128 blocks; against the float64 product of the same
 * quantized activations (host_quant: bit-equal to the device's): f32 out < 1e-3 (the FP8 tensor cores'
 * short accumulation inside a K block, as for the mma.sync GEMM); glu (silu(gate) * up, bf16 out) < 1e-2;
 * and the f32 form against k_fp8_gemm.cu's grouped GEMM on the same inputs (64-row tiles) < 1e-3 (the same products
 * in another order inside each mma: the tensor cores round differently). */
static int g_tcg = 0; /* 1: test_gmma checks k_fp8_tc_grouped.cu's wgmma kernel instead (same contract) */
static int g_tcg_sel = 0; /* --no-tcg: -1 (its checks and timings skipped), --tcg-only: 1 (only those) */
static void test_gmma(int E, int N, int K, int max_rows_per_expert, int bm, int br, int glu, const char *what) {
  host_w w = make_w(E, N, K, br, 128);
  int *cnt = malloc(E * 4), *off = malloc((E + 1) * 4);
  off[0] = 0;
  for (int e = 0; e < E; e++) {
    cnt[e] = e == 1 ? 0 : e == 0 ? max_rows_per_expert : (int)(urand() * (max_rows_per_expert + 1));
    off[e + 1] = off[e] + cnt[e];
  }
  const int R = off[E], T = R > 0 ? R : 1, I = N / 2, Nout = glu ? I : N;
  int ntile = 0, *tiles = malloc(sizeof(int) * (size_t)(R / bm + E + 1));
  for (int e = 0; e < E; e++)
    for (int i = 0; i * bm < cnt[e]; i++) tiles[ntile++] = e << 16 | i;
  int *arows = malloc((size_t)T * 4);
  for (int r = 0; r < R; r++) arows[r] = (int)(urand() * T);
  uint16_t *A = rand_bf16((size_t)T * K, 1.f);
  const int lds = (K + 127) / 128;
  uint8_t *q = malloc((size_t)T * K);
  float *sq = malloc((size_t)T * lds * 4);
  host_quant(A, T, K, q, sq, lds);
  void *dq, *ds;
  di_cuk_fp8w dw = dev_w(&w, &dq, &ds);
  void *dAq = dup_dev(q, (size_t)T * K), *dsa = dup_dev(sq, (size_t)T * lds * 4);
  void *doff = dup_dev(off, (E + 1) * 4), *dt = dup_dev(tiles, (size_t)(ntile + 1) * 4), *dnt = dup_dev(&ntile, 4);
  void *dar = dup_dev(arows, (size_t)T * 4), *dC = di_cut_malloc((size_t)T * Nout * 4);
  CHECKF(g_tcg ? di_cuk_fp8_tcg_ok(N, K, glu, dw) : di_cuk_fp8_gmma_ok(K, dw), "fp8 gmma %s: not taken", what);
  di_status st = (g_tcg ? di_cuk_fp8_tcg_grouped : di_cuk_fp8_gmma_grouped)(dAq, K, dsa, lds, dar, dw, N, K, doff, dt, dnt,
                                                                            ntile + 3, bm, dC, Nout, !glu, glu, NULL);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(di_cut_sync() == 0);
  float *got = fetch_y(dC, (size_t)T * Nout, !glu);
  int cols[128], nc = pick_cols(Nout, cols, 128);
  errsum err = {0, 0};
  for (int e = 0; e < E; e++)
    for (int m = off[e]; m < off[e + 1]; m += (cnt[e] > 8 ? 5 : 1)) {
      const int ar = arows[m];
      for (int i = 0; i < nc; i++) {
        double a = 0, u = 0;
        for (int k = 0; k < K; k++) {
          const double x = (double)di_fp8e4m3_to_f32(q[(size_t)ar * K + k]) * sq[(size_t)ar * lds + k / 128];
          a += x * w_at(&w, e, cols[i], k);
          if (glu) u += x * w_at(&w, e, I + cols[i], k);
        }
        acc_err(&err, glu ? a / (1 + exp(-a)) * u : a, got[(size_t)m * Nout + cols[i]]);
      }
    }
  const double tol = glu ? 1e-2 : 1e-3;
  CHECKF(rel(&err) < tol, "fp8 gmma %s E %d N %d K %d bm %d rows %d: rel err %.3e", what, E, N, K, bm, R, rel(&err));
  double dmma = -1;
  if (!glu && bm == 64 && R > 0) { /* the same product on k_fp8_gemm.cu's grouped kernel */
    void *dC2 = di_cut_malloc((size_t)T * N * 4);
    CHECK(di_cuk_fp8_grouped_gemm(dAq, K, dsa, lds, dar, dw, N, K, doff, dt, dnt, ntile + 3, bm, dC2, N, 1, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    float *old = fetch_y(dC2, (size_t)T * N, 1);
    errsum d = {0, 0};
    for (size_t i = 0; i < (size_t)R * N; i++) acc_err(&d, old[i], got[i]);
    dmma = rel(&d);
    CHECKF(dmma < 1e-3, "fp8 gmma %s: rel diff %.3e from the mma.sync grouped GEMM", what, dmma);
    free(old);
    di_cut_free(dC2);
  }
  printf("fp8 %s %-24s E %3d N %5d K %5d bm %2d block %3dx128 glu %d rows %5d: rel err %.2e (vs k_fp8_gemm.cu %.1e)\n",
         g_tcg ? "tcg " : "gmma", what, E, N, K, bm, br, glu, R, rel(&err), dmma);
  free(got); free(cnt); free(off); free(tiles); free(arows); free(A); free(q); free(sq); free_w(&w);
  di_cut_free(dq); di_cut_free(ds); di_cut_free(dAq); di_cut_free(dsa); di_cut_free(doff); di_cut_free(dt);
  di_cut_free(dnt); di_cut_free(dar); di_cut_free(dC);
}

static void test_gmma_all(void) {
  if (g_tcg_sel == 1) goto tcg;
  test_gmma(10, 2816, 2048, 40, 16, 1, 1, "V2-Lite gate/up + SiLU");
  test_gmma(10, 2048, 1408, 40, 16, 1, 0, "V2-Lite down");
  test_gmma(12, 2816, 2048, 150, 64, 1, 1, "V2-Lite gate/up + SiLU");
  test_gmma(12, 2048, 1408, 150, 64, 1, 0, "V2-Lite down");
  test_gmma(6, 4096, 7168, 40, 16, 1, 1, "V3 gate/up + SiLU");
  test_gmma(6, 7168, 2048, 70, 64, 1, 0, "V3 down");
  test_gmma(6, 7168, 2048, 70, 64, 128, 0, "V3 down, 128x128 blocks");
  test_gmma(5, 200, 1392, 20, 16, 1, 1, "part I 100, part K");
  test_gmma(5, 228, 224, 90, 64, 128, 0, "part N 228, K 224");
  test_gmma(4, 4096, 2048, 33, 16, 1, 1, "V4-Flash w13");
  {
  di_cuk_fp8w w = {NULL, NULL, 224, 1, 64, 4};
  CHECK_ERR(di_cuk_fp8_gmma_grouped(NULL, 224, NULL, 2, NULL, w, 64, 224, NULL, NULL, NULL, 1, 16, NULL, 64, 0, 0, NULL),
            "block 1 x 64");
  }
  if (g_tcg_sel == -1) return;
tcg: /* the wgmma form: the same contract where N % 256 (glu: I % 128), any tile rows up to 64 */
  g_tcg = 1;
  test_gmma(10, 2816, 2048, 40, 16, 1, 1, "V2-Lite gate/up + SiLU");
  test_gmma(12, 2816, 2048, 150, 64, 1, 1, "V2-Lite gate/up + SiLU");
  test_gmma(12, 2048, 1408, 150, 64, 1, 0, "V2-Lite down");
  test_gmma(6, 4096, 7168, 70, 64, 1, 1, "V3 gate/up + SiLU");
  test_gmma(6, 7168, 2048, 70, 64, 1, 0, "V3 down");
  test_gmma(6, 7168, 2048, 70, 64, 128, 0, "V3 down, 128x128 blocks");
  test_gmma(5, 512, 1392, 90, 64, 1, 0, "N 512, part K 1392");
  test_gmma(4, 4096, 2048, 33, 16, 1, 1, "V4-Flash w13");
  g_tcg = 0;
  di_cuk_fp8w w = {NULL, NULL, 224, 1, 128, 2};
  CHECK_ERR(di_cuk_fp8_tcg_grouped(NULL, 224, NULL, 2, NULL, w, 200, 224, NULL, NULL, NULL, 1, 64, NULL, 200, 0, 0, NULL),
            "N % 256");
}

/* The experts of a step of T tokens on the paths the backend has for them: 2 shared + 6 of 64 routed
 * (V2-Lite, 1408 wide over 2048) or 1 shared + 8 of 256 (V3, 2048 wide over 7168), uniform routing; the
 * tile rows the backend picks (64 from 32 x experts assignments, else 16). us per call of gate/up + SiLU +
 * down (the activation quantizations included), and GB/s of the touched experts' FP8 weights. Paths:
 * the new grouped W8A8 GEMM (gmma), the one it replaces (the tensor-core GEMV at 16-row tiles,
 * k_fp8_gemm.cu's GEMM + silu_mul at 64), and bf16 experts on k_grouped_gemm.cu (weights twice the bytes). */
static void time_gmma(int v3, int T) {
  const int NR = v3 ? 256 : 64, NS = v3 ? 1 : 2, KR = v3 ? 8 : 6, NE = NR + NS, KT = KR + NS;
  const int I = v3 ? 2048 : 1408, H = v3 ? 7168 : 2048, A = T * KT, bm = A >= 32 * NE ? 64 : 16;
  const size_t gub = (size_t)2 * I * H, dnb = (size_t)H * I;
  /* the shape's weights, kept from the previous call of the same shape (V3's are 34 GB to upload) */
  static int have = -1;
  static uint8_t *dgu, *ddn;
  static uint16_t *dgu16, *ddn16;
  static void *dsgu, *dsdn;
  if (have != v3) {
    if (have >= 0) { di_cut_free(dgu); di_cut_free(ddn); di_cut_free(dgu16); di_cut_free(ddn16); di_cut_free(dsgu); di_cut_free(dsdn); }
    have = v3;
    uint8_t *pat = rand_fp8(gub);
    uint16_t *pat16 = rand_bf16(gub, 0.03f);
    dgu = di_cut_malloc(gub * NE); ddn = di_cut_malloc(dnb * NE);
    dgu16 = di_cut_malloc(gub * NE * 2); ddn16 = di_cut_malloc(dnb * NE * 2);
    for (int e = 0; e < NE; e++) {
      di_cut_h2d(dgu + gub * e, pat, gub); di_cut_h2d(ddn + dnb * e, pat, dnb);
      di_cut_h2d(dgu16 + gub * e, pat16, gub * 2); di_cut_h2d(ddn16 + dnb * e, pat16, dnb * 2);
    }
    free(pat); free(pat16);
    float *sc = malloc((size_t)NE * 2 * I * (H / 128) * 4);
    for (size_t i = 0; i < (size_t)NE * 2 * I * (H / 128); i++) sc[i] = (float)ldexp(1.0 + urand(), -8);
    dsgu = dup_dev(sc, (size_t)NE * 2 * I * (H / 128) * 4); dsdn = dup_dev(sc, (size_t)NE * H * (I / 128) * 4);
    free(sc);
  }
  const di_cuk_fp8w wgu = {dgu, (const float *)dsgu, H, 1, 128, H / 128};
  const di_cuk_fp8w wdn = {ddn, (const float *)dsdn, I, 1, 128, I / 128};
  enum { SETS = 4, ITERS = 12 };
  void *doff[SETS], *dtl[SETS], *dnt[SETS], *dperm[SETS];
  int maxt = 0;
  double touched = 0;
  int *cnt = malloc(NE * 4), *offh = malloc((NE + 1) * 4), *fill = malloc(NE * 4), *asg = malloc((size_t)A * 4);
  int *perm = malloc((size_t)A * 4), *tiles = malloc(sizeof(int) * (size_t)(A / 16 + NE + 1));
  for (int st = 0; st < SETS; st++) {
    memset(cnt, 0, NE * 4);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < KT; j++) {
        int e, dup;
        if (j >= KR) e = NR + j - KR; /* the shared experts: every token */
        else do {
          e = (int)(urand() * NR);
          dup = 0;
          for (int q2 = 0; q2 < j; q2++) dup |= asg[t * KT + q2] == e;
        } while (dup);
        asg[t * KT + j] = e;
        cnt[e]++;
      }
    offh[0] = 0;
    for (int e = 0; e < NE; e++) offh[e + 1] = offh[e] + cnt[e];
    memcpy(fill, offh, NE * 4);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < KT; j++) perm[fill[asg[t * KT + j]]++] = t;
    int nt = 0;
    for (int e = 0; e < NE; e++) {
      touched += cnt[e] > 0;
      for (int i = 0; i * bm < cnt[e]; i++) tiles[nt++] = e << 16 | i;
    }
    maxt = nt > maxt ? nt : maxt;
    doff[st] = dup_dev(offh, (NE + 1) * 4); dtl[st] = dup_dev(tiles, (size_t)nt * 4); dnt[st] = dup_dev(&nt, 4);
    dperm[st] = dup_dev(perm, (size_t)A * 4);
  }
  touched /= SETS;
  free(cnt); free(offh); free(fill); free(asg); free(perm); free(tiles);
  uint16_t *X = rand_bf16((size_t)T * H, 1.f);
  void *dX = dup_dev(X, (size_t)T * H * 2), *dact = di_cut_malloc((size_t)A * I * 2), *degu = di_cut_malloc((size_t)A * 2 * I * 2);
  void *dy = di_cut_malloc((size_t)A * H * 4);
  free(X);
  size_t wsb = di_cuk_fp8_ws_bytes(A > T ? A : T, H > I ? H : I);
  void *dws = di_cut_malloc(wsb);
  double us[5] = {-1, -1, -1, -1, -1};
  const char *names[5] = {"gmma (new)", bm == 16 ? "tc GEMV (was)" : "mma.sync GEMM (was)", "bf16 grouped GEMM",
                          "16-row GEMV (gv16)", "wgmma tcg (new)"};
  for (int kind = 0; kind < 5; kind++) {
    if (kind == 3 && T > 16) continue;
    if ((g_tcg_sel == -1 && kind == 4) || (g_tcg_sel == 1 && kind != 4 && kind != 2)) continue;
    for (int it = -2; it < ITERS; it++) {
      if (it == 0) { CHECK(di_cut_sync() == 0); us[kind] = di_cut_time_ms(); }
      const int st = (it + 2) % SETS;
      uint8_t *xq;
      float *sx;
      int ldq, lds;
      di_status r = DI_OK;
      if (kind == 0 || kind == 4 || (kind == 1 && bm == 64)) {
        r = di_cuk_fp8_quant_ws(dX, H, T, H, dws, wsb, &xq, &ldq, &sx, &lds, NULL);
        if (r == DI_OK && kind == 0)
          r = di_cuk_fp8_gmma_grouped(xq, ldq, sx, lds, dperm[st], wgu, 2 * I, H, doff[st], dtl[st], dnt[st], maxt, bm, dact, I, 0, 1, NULL);
        else if (r == DI_OK && kind == 4)
          r = di_cuk_fp8_tcg_grouped(xq, ldq, sx, lds, dperm[st], wgu, 2 * I, H, doff[st], dtl[st], dnt[st], maxt, bm, dact, I, 0, 1, NULL);
        else if (r == DI_OK) {
          r = di_cuk_fp8_grouped_gemm(xq, ldq, sx, lds, dperm[st], wgu, 2 * I, H, doff[st], dtl[st], dnt[st], maxt, bm, degu, 2 * I, 0, NULL);
          if (r == DI_OK) r = di_cuk_silu_mul(degu, A, I, dact, NULL);
        }
        if (r == DI_OK) r = di_cuk_fp8_quant_ws(dact, I, A, I, dws, wsb, &xq, &ldq, &sx, &lds, NULL);
        if (r == DI_OK && kind == 0)
          r = di_cuk_fp8_gmma_grouped(xq, ldq, sx, lds, NULL, wdn, H, I, doff[st], dtl[st], dnt[st], maxt, bm, dy, H, 1, 0, NULL);
        else if (r == DI_OK && kind == 4)
          r = di_cuk_fp8_tcg_grouped(xq, ldq, sx, lds, NULL, wdn, H, I, doff[st], dtl[st], dnt[st], maxt, bm, dy, H, 1, 0, NULL);
        else if (r == DI_OK)
          r = di_cuk_fp8_grouped_gemm(xq, ldq, sx, lds, NULL, wdn, H, I, doff[st], dtl[st], dnt[st], maxt, bm, dy, H, 1, NULL);
      } else if (kind == 1) {
        r = di_cuk_fp8_tc_grouped_gemv(dX, H, dperm[st], wgu, 2 * I, H, doff[st], dtl[st], dnt[st], maxt, bm, bm, dact, I, 0, 1, NULL);
        if (r == DI_OK) r = di_cuk_fp8_tc_grouped_gemv(dact, I, NULL, wdn, H, I, doff[st], dtl[st], dnt[st], maxt, bm, bm, dy, H, 1, 0, NULL);
      } else if (kind == 3) { /* the 16-rows-a-warp GEMVs the backend takes up to 16 tokens */
        const int rows = T < bm ? T : bm;
        r = di_cuk_fp8_gv16_grouped(dX, H, dperm[st], wgu, 2 * I, H, doff[st], dtl[st], dnt[st], maxt, bm, rows, dact, I, 0, 1, 0, -1, 0, NULL);
        if (r == DI_OK) r = di_cuk_fp8_gv16_grouped(dact, I, NULL, wdn, H, I, doff[st], dtl[st], dnt[st], maxt, bm, rows, dy, H, 1, 0, 0, -1, 0, NULL);
      } else {
        r = di_cuk_grouped_gemm(dX, H, dperm[st], dgu16, 2 * I, H, doff[st], dtl[st], dnt[st], maxt, bm, dact, I, 0, 1, NULL);
        if (r == DI_OK) r = di_cuk_grouped_gemm(dact, I, NULL, ddn16, H, I, doff[st], dtl[st], dnt[st], maxt, bm, dy, H, 1, 0, NULL);
      }
      if (r != DI_OK) { CHECKF(0, "time gmma %s: %s", names[kind], di_last_error()); us[kind] = -1; break; }
    }
    CHECK(di_cut_sync() == 0);
    if (us[kind] >= 0) us[kind] = (di_cut_time_ms() - us[kind]) * 1e3 / ITERS;
  }
  const double bytes = touched * ((double)(gub + dnb) + 3.0 * I * (H / 128) * 4);
  const double flops = 2.0 * A * 3.0 * I * H;
  for (int kind = 0; kind < 5; kind++)
    if (us[kind] > 0)
      printf("time fp8 experts %s T %5d (bm %d, %.1f experts): %-20s %9.1f us %6.0f GB/s (FP8 bytes) %6.0f TFLOP/s\n",
             v3 ? "V3     " : "V2-Lite", T, bm, touched, names[kind], us[kind], bytes / (us[kind] * 1e3),
             flops / (us[kind] * 1e6));
  for (int st = 0; st < SETS; st++) { di_cut_free(doff[st]); di_cut_free(dtl[st]); di_cut_free(dnt[st]); di_cut_free(dperm[st]); }
  di_cut_free(dX); di_cut_free(dact); di_cut_free(degu); di_cut_free(dy); di_cut_free(dws);
}

/* The CUDA-core GEMV's one-token fusions at V2-Lite's and V3's shapes and the shipped model's edges. */
static void test_fusions(void) {
  test_normed(1, 3648, 2048, "V2-Lite q + kv_a");
  test_normed(2, 3648, 2048, "V2-Lite q + kv_a");
  test_normed(3, 2112, 7168, "V3 q_a + kv_a");
  test_normed(1, 800, 224, "shipped-like");
  test_glu(0, 10944, 2048, 1, "V2-Lite dense M 1");
  test_glu(0, 10944, 2048, 2, "V2-Lite dense M 2");
  test_glu(0, 100, 224, 5, "shipped-like, part I");
  test_glu(10, 1408, 2048, 1, "V2-Lite experts");
  test_glu(10, 1408, 2048, 2, "V2-Lite experts");
  test_glu(9, 2048, 7168, 2, "V3 experts");
  test_down_combine(10, 2048, 1408, 8, "V2-Lite");
  test_down_combine(12, 7168, 2048, 9, "V3");
  test_down_combine(4, 224, 64, 3, "shipped-like");
  test_vo(16, 2048, 512, 128, "V2-Lite");
  test_vo(16, 7168, 512, 128, "H 7168 (14 tiles)");
}

/* The tensor-core GEMV forms (k_fp8_tc_gemv.cu): the same references and tolerances as the GEMV, the
 * rows up to 64 a pass and beyond, and the batch invariance at every M (each row alone bit-equal). */
static void test_tc(void) {
  g_tc = 1;
  test_gemv(1, 18432, 7168, 128, 128, 0, "V3 gate/up");
  test_gemv(64, 18432, 7168, 128, 128, 0, "V3 gate/up");
  test_gemv(4, 7168, 18432, 128, 128, 1, "V3 down (+residual)");
  test_gemv(37, 2048, 10944, 128, 128, 0, "V2-Lite down (part K)");
  test_gemv(64, 21888, 2048, 128, 128, 0, "V2-Lite gate/up");
  test_gemv(5, 576, 2048, 128, 128, 1, "kv_a (part N)");
  test_gemv(2, 224, 576, 128, 128, 0, "shipped 224 x 576");
  test_gemv(7, 576, 224, 128, 128, 0, "shipped 576 x 224");
  test_gemv(1, 64, 224, 128, 128, 0, "shipped 64 x 224");
  test_gemv(100, 1000, 2048, 128, 128, 0, "M 100 (two passes)");
  test_gemv(33, 3648, 2048, 1, 128, 1, "per-row scales");
  test_gemv(16, 700, 1024, 128, 256, 0, "block 128x256");
  test_grouped(8, 4096, 7168, 3, 0, "V3 gate/up");
  test_grouped(64, 2816, 2048, 4, 0, "V2-Lite gate/up");
  test_grouped(64, 2048, 1408, 40, 0, "V2-Lite down");
  test_grouped(16, 4096, 2048, 20, 0, "V4-Flash w13");
  test_grouped(8, 2048, 4096, 100, 0, "V4-Flash w2");
  test_glu(0, 10944, 2048, 1, "V2-Lite dense M 1");
  test_glu(0, 10944, 2048, 37, "V2-Lite dense M 37");
  test_glu(0, 100, 224, 5, "shipped-like, part I");
  test_glu(64, 1408, 2048, 6, "V2-Lite experts");
  test_glu(16, 2048, 7168, 70, "V3 experts (2 tiles)");
  g_tc = 0;
}

/* cuBLASLt's block-scaled FP8 matmul: the GEMM cases of test_gemm through it (the tolerances of the
 * mma.sync GEMM: the same quantized activations; rows past the last multiple of 4 take the W8A16
 * tensor-core GEMV and are checked against the unquantized product only). */
static void test_lt(void) {
  CHECK(di_cu_fp8lt_create(&g_lt) == DI_OK);
  test_gemm(256, 512, 1024, 128, 1, "256 x 512 x 1024");
  test_gemm(4096, 2048, 10944, 1, 0, "V2-Lite down (part K)");
  test_gemm(512, 21888, 2048, 1, 0, "V2-Lite gate/up");
  test_gemm(64, 576, 2048, 128, 1, "kv_a (part N)");
  test_gemm(200, 2048, 10944, 128, 1, "V2-Lite down f32+res");
  test_gemm(1000, 7168, 18432, 128, 0, "V3 down");
  test_gemm(300, 224, 576, 128, 0, "shipped 224 x 576");
  test_gemm(33, 64, 224, 128, 1, "shipped 64 x 224 (tail)");
  test_gemm(102, 3072, 2048, 1, 1, "per-row scales (tail)");
  g_lt_keep = g_lt;
  g_lt = NULL;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  int timings = 1, tc_only = 0, fusions_only = 0, gv16_only = 0, gmma_only = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--gv16-only") == 0) gv16_only = 1;
    if (strcmp(argv[i], "--gmma-only") == 0) gmma_only = 1;
    if (strcmp(argv[i], "--no-tcg") == 0) g_tcg_sel = -1;
    if (strcmp(argv[i], "--tcg-only") == 0) g_tcg_sel = 1, gmma_only = 1;
    if (strcmp(argv[i], "--no-timings") == 0) timings = 0;
    if (strcmp(argv[i], "--tc-only") == 0) tc_only = 1;
    if (strcmp(argv[i], "--fusions-only") == 0) fusions_only = 1;
  }
  if (gmma_only) { /* k_fp8_grouped_mma.cu: checks, then the expert paths timed at decode batches and prefill */
    test_gmma_all();
    if (timings) {
      const int ts[] = {4, 8, 16, 32, 64, 256, 512, 4096};
      for (int v3 = 0; v3 < 2; v3++)
        for (int i = 0; i < 8; i++) time_gmma(v3, ts[i]);
    }
    printf("%d passed, %d failed\n", di_test_passed, di_test_failed);
    return di_test_failed ? 1 : 0;
  }
  test_gv16_all();
  test_gmma_all();
  if (gv16_only) {
    if (timings) {
      const int ts[] = {1, 2, 4, 16};
      for (int i = 0; i < 4; i++) time_gv16(ts[i]);
    }
    printf("%d passed, %d failed\n", di_test_passed, di_test_failed);
    return di_test_failed ? 1 : 0;
  }
  test_fusions();
  if (fusions_only) {
    printf("%d passed, %d failed\n", di_test_passed, di_test_failed);
    return di_test_failed ? 1 : 0;
  }
  test_tc();
  test_lt();
  if (tc_only) {
    if (timings) {
      di_cu_blas *blas = NULL;
      CHECK(di_cu_blas_create(&blas) == DI_OK);
      const int ms[] = {1, 2, 4, 8, 16};
      for (int i = 0; i < 5; i++) time_gemv(blas, ms[i], 18432, 7168);
      for (int i = 0; i < 5; i++) time_gemv(blas, ms[i], 2048, 10944);
      for (int i = 0; i < 5; i++) time_gemv(blas, ms[i], 21888, 2048);
      const int mg[] = {16, 32, 64, 256, 4096};
      for (int i = 0; i < 5; i++) time_gemm(blas, mg[i], 18432, 7168);
      for (int i = 0; i < 5; i++) time_gemm(blas, mg[i], 21888, 2048);
      time_gemm(blas, 4096, 2048, 10944);
      di_cu_blas_destroy(blas);
      free_w(&g_tw);
    }
    di_cu_fp8lt_destroy(g_lt_keep);
    printf("%d passed, %d failed\n", di_test_passed, di_test_failed);
    return di_test_failed ? 1 : 0;
  }
  test_errors();
  /* GEMV: V3 dense (7168 x 18432 both ways), V2-Lite, the shipped model's edges, other block shapes */
  test_gemv(1, 18432, 7168, 128, 128, 0, "V3 gate/up");
  test_gemv(4, 7168, 18432, 128, 128, 1, "V3 down (+residual)");
  test_gemv(16, 18432, 7168, 128, 128, 0, "V3 gate/up");
  test_gemv(3, 2048, 10944, 128, 128, 0, "V2-Lite down (part K)");
  test_gemv(8, 21888, 2048, 128, 128, 0, "V2-Lite gate/up");
  test_gemv(5, 576, 2048, 128, 128, 1, "kv_a (part N)");
  test_gemv(2, 224, 576, 128, 128, 0, "shipped 224 x 576");
  test_gemv(7, 576, 224, 128, 128, 0, "shipped 576 x 224");
  test_gemv(1, 64, 224, 128, 128, 0, "shipped 64 x 224");
  test_gemv(24, 1000, 2048, 128, 128, 0, "M 24 (two passes)");
  test_gemv(5, 700, 1024, 64, 64, 0, "block 64x64");
  test_gemv(3, 333, 512, 32, 16, 1, "block 32x16");
  test_gemv(4, 300, 896, 128, 7, 0, "block 128x7 (any)");
  test_gemv(2, 100, 200, 128, 128, 1, "K 200 (any)");
  test_gemv(4, 3648, 2048, 1, 128, 1, "per-row scales");
  /* activation quantization */
  test_quant(37, 2048);
  test_quant(5, 10944);
  test_quant(3, 224);
  /* GEMM (above the GEMV bound of 16 rows) */
  test_gemm(17, 3072, 2048, 128, 0, "V2-Lite q");
  test_gemm(64, 576, 2048, 128, 1, "kv_a (part N)");
  test_gemm(200, 2048, 10944, 128, 1, "V2-Lite down (part K)");
  test_gemm(128, 18432, 7168, 128, 0, "V3 gate/up");
  test_gemm(1000, 7168, 18432, 128, 0, "V3 down");
  test_gemm(300, 224, 576, 128, 0, "shipped 224 x 576");
  test_gemm(33, 64, 224, 128, 1, "shipped 64 x 224");
  test_gemm(100, 3072, 2048, 1, 1, "per-row scales");
  test_gemm(70, 1000, 1024, 64, 0, "block 64 x 128");
  /* grouped experts: V3 (2048 wide: gate/up 4096 x 7168, down 7168 x 2048), V2-Lite (1408), V4-Flash */
  test_grouped(8, 4096, 7168, 3, 0, "V3 gate/up");
  test_grouped(8, 7168, 2048, 2, 0, "V3 down");
  test_grouped(64, 2816, 2048, 4, 0, "V2-Lite gate/up");
  test_grouped(16, 4096, 2048, 20, 0, "V4-Flash w13");
  test_grouped(16, 4096, 7168, 150, 1, "V3 gate/up");
  test_grouped(64, 2048, 1408, 40, 1, "V2-Lite down");
  test_grouped(16, 4096, 2048, 200, 1, "V4-Flash w13");
  test_grouped(8, 2048, 4096, 100, 1, "V4-Flash w2");
  /* MXFP4: V4-Flash experts (hidden 4096, 2048 wide: w13 4096 x 4096, w2 4096 x 2048), dense rows */
  test_mxfp4(1, 4096, 4096, 1, "dense M 1");
  test_mxfp4(1, 1000, 2048, 7, "dense M 7");
  test_mxfp4(16, 4096, 4096, 4, "V4-Flash w13");
  test_mxfp4(16, 4096, 2048, 12, "V4-Flash w2");
  if (timings) {
    di_cu_blas *blas = NULL;
    CHECK(di_cu_blas_create(&blas) == DI_OK);
    const int ms[] = {1, 2, 4, 8, 16};
    for (int i = 0; i < 5; i++) time_gemv(blas, ms[i], 18432, 7168);
    for (int i = 0; i < 5; i++) time_gemv(blas, ms[i], 2048, 10944);
    time_gemv(blas, 1, 21888, 2048);
    const int mg[] = {32, 64, 256, 1024, 4096};
    for (int i = 0; i < 5; i++) time_gemm(blas, mg[i], 18432, 7168);
    for (int i = 0; i < 5; i++) time_gemm(blas, mg[i], 21888, 2048);
    time_gemm(blas, 4096, 2048, 10944);
    time_mxfp4(1, 4096, 4096);
    time_mxfp4(4, 4096, 4096);
    time_mxfp4(1, 8192, 7168);
    di_cu_blas_destroy(blas);
    free_w(&g_tw);
  }
  di_cu_fp8lt_destroy(g_lt_keep);
  printf("%d passed, %d failed\n", di_test_passed, di_test_failed);
  return di_test_failed ? 1 : 0;
}
