/* The batch-invariant tensor-core GEMMs (k_tc_gemm.cu, and the grouped expert GEMM of
 * k_grouped_gemm.cu) on the device:
 * - accuracy against a float64 reference from the same bf16 inputs at V2-Lite's shapes (q/kv 3648 x
 *   2048, o_proj 2048 x 2048 + residual, dense MLP 21888 x 2048 and 2048 x 10944, lm_head 102400 x 2048,
 *   the absorption / W_UV products batched over 16 heads) and the shipped model's odd ones (224, 576,
 *   64). Tolerance of each element: f32 output (K/16 + 16) * 2^-22 * sum_k |x_k w_k| (a serial f32 sum
 *   of K/16 mma slices, twice over), bf16 output that plus 2^-8 |ref| (its rounding).
 * - invariance, bit for bit: every row of an M-row product (M = 1 .. 4096, the rows starting at
 *   varying offsets so that they sit at every position of a tile) equals the row computed alone
 *   (M = 1, whose splits run in CTAs of their own, where big M adds them inside one CTA; every other M
 *   with the split partials added in the GEMM's last CTA, di_cuk_tc_gemm_set_fused_reduce); the grouped
 *   expert GEMM: every row of a skewed distribution (experts with 0, 1, 3, 17, 64, 65, 700 rows), in
 *   16- and 64-row tiles, equals the row as its expert's only row.
 * Every core (mma.sync, wgmma with cp.async, wgmma with TMA: di_cuk_tc_gemm_set_core) is held to the
 * same rules, and so are the mixed ones, hybrid (mma.sync at <= 8 rows, TMA above) and gemv
 * (k_tc_gemv.cuh at <= 8 rows, TMA above), invariant only if the kernels they mix agree bit for bit;
 * `--core mma|wgmma|tma|hybrid|gemv` runs one.
 * `--bench`: TFLOP/s of this kernel and of the default path (cuBLASLt, skinny at M <= 8) at the main
 * shapes instead; `--bench-mla`: the per-head MLA products (the query absorption, W [K][N], and W_UV)
 * through di_cu_gemm_batched as the backend calls them, invariant (this kernel) against default.
 * - the invariant mode's down + combine (di_cuk_grouped_gemm_combine, session 16): y, h and the next
 *   layer's normed rows bit for bit equal to di_cuk_grouped_gemm + di_cuk_moe_combine at V2-Lite's expert
 *   shapes (N 2048, K 1408, 8 slots with the two shared experts) for T = 1 .. 16 and 33 tokens, with and
 *   without the norm, grids with idle tile slots, the counters back at zero, every launch twice; and on
 *   the host, the order of its sum of squares against di_block_sum's at 256 threads;
 * - the invariant prep + absorption (di_cuk_tc_gemm_prep): Qa and the cache bit for bit equal to
 *   di_cuk_mla_prep + di_cuk_tc_gemm at V2-Lite's MLA shapes, T = 1 .. 16, W_UK [N][K] and [K][N], bf16 and
 *   FP8 caches. `--fusions-only`: only these. Built only with nvcc; run on the device by scripts/device_tests.sh. */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/k_inv_fusions.h"
#include "util/numeric.h"
#include "test_util.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CUT_RNG_SEED 0x9e3779b97f4a7c15ull
#include "cuda_test_rand.h" /* urand, nrand, rand_bf16, dup_dev */
static void *dev_copy(const void *h, size_t bytes) {
  void *d = di_cut_malloc(bytes);
  if (d && h) di_cut_h2d(d, h, bytes);
  return d;
}
#define WS_BYTES ((size_t)16 << 20)
static float *g_ws;

typedef struct shape {
  const char *name;
  int batch, N, K, w_kn, y_f32;
  float beta;
  int64_t sw; /* head stride of W (0: batch 1) */
  int ldw;
} shape;

/* element (m, n) of head z of the reference */
static void ref_row(const shape *s, const uint16_t *X, int ldx, int64_t sx, const uint16_t *W, int z, int m,
                    const float *y0, int ldy, int64_t sy, double *out, double *l1) {
  for (int n = 0; n < s->N; n++) {
    double acc = 0, a = 0;
    for (int k = 0; k < s->K; k++) {
      double x = di_bf16_to_f32(X[sx * z + (int64_t)m * ldx + k]);
      double w = di_bf16_to_f32(s->w_kn ? W[s->sw * z + (int64_t)k * s->ldw + n] : W[s->sw * z + (int64_t)n * s->ldw + k]);
      acc += x * w;
      a += fabs(x * w);
    }
    if (s->y_f32 && s->beta != 0.f) acc += s->beta * y0[sy * z + (int64_t)m * ldy + n];
    out[n] = acc;
    l1[n] = a;
  }
}

static size_t w_elems(const shape *s) {
  return s->batch > 1 ? (size_t)s->sw * s->batch : (size_t)(s->w_kn ? s->K : s->N) * s->ldw;
}

/* The product of rows [m0, m0 + M) of X into the same rows of Y (batch heads: X, Y strided by rows*ld) */
static di_status run_tc(const shape *s, int M, const void *dX, int ldx, int64_t sx, const void *dW, void *dY, int ldy,
                        int64_t sy, int m0) {
  const size_t es = s->y_f32 ? 4 : 2;
  return di_cuk_tc_gemm(s->batch, M, s->N, s->K, (const uint16_t *)dX + (int64_t)m0 * ldx, ldx, sx,
                        (const uint16_t *)dW, s->ldw, s->sw, s->w_kn, (char *)dY + (size_t)m0 * ldy * es, ldy, sy,
                        s->y_f32, s->beta, g_ws, WS_BYTES, NULL);
}

/* Accuracy at M rows (a sample of rows checked against float64) and invariance of rows 0..Mmax-1. */
static void test_shape(const shape *s, int Mmax, const int *Ms, int nM, int check_rows) {
  const int ldx = s->batch > 1 ? s->K * s->batch : s->K, ldy = s->batch > 1 ? s->N * s->batch : s->N;
  const int64_t sx = s->batch > 1 ? s->K : 0, sy = s->batch > 1 ? s->N : 0;
  const size_t nx = (size_t)Mmax * ldx, ny = (size_t)Mmax * ldy, es = s->y_f32 ? 4 : 2;
  uint16_t *X = rand_bf16(nx, 1.f), *W = rand_bf16(w_elems(s), 1.f / sqrtf((float)s->K));
  float *y0 = malloc(ny * 4);
  for (size_t i = 0; i < ny; i++) y0[i] = nrand();
  void *dX = dev_copy(X, nx * 2), *dW = dev_copy(W, w_elems(s) * 2);
  void *dAlone = dev_copy(NULL, ny * es), *dY = dev_copy(NULL, ny * es);
  CHECK(dX && dW && dAlone && dY);
  const int S = di_cuk_tc_gemm_splits(s->N, s->K);
  /* every row alone */
  if (s->y_f32) di_cut_h2d(dAlone, y0, ny * 4);
  di_status st = DI_OK;
  for (int r = 0; r < Mmax && st == DI_OK; r++) st = run_tc(s, 1, dX, ldx, sx, dW, dAlone, ldy, sy, r);
  CHECKF(st == DI_OK && di_cut_sync() == 0, "%s: alone rows: %s", s->name, di_last_error());
  void *alone = malloc(ny * es), *got = malloc(ny * es);
  di_cut_d2h(alone, dAlone, ny * es);
  /* accuracy of the rows alone (a sample) */
  double *ref = malloc(s->N * sizeof(double)), *l1 = malloc(s->N * sizeof(double)), worst = 0;
  int bad = 0;
  for (int c = 0; c < check_rows; c++) {
    const int m = c == 0 ? 0 : c == 1 ? Mmax - 1 : (int)(urand() * Mmax);
    for (int z = 0; z < s->batch; z++) {
      ref_row(s, X, ldx, sx, W, z, m, y0, ldy, sy, ref, l1);
      for (int n = 0; n < s->N; n++) {
        const size_t i = (size_t)m * ldy + sy * z + n;
        const double g = s->y_f32 ? ((float *)alone)[i] : di_bf16_to_f32(((uint16_t *)alone)[i]);
        double tol = (s->K / 16 + 16) * ldexp(1.0, -22) * l1[n] + 1e-30;
        if (!s->y_f32) tol += ldexp(fabs(ref[n]), -8);
        const double e = fabs(g - ref[n]) / tol;
        if (!(e <= 1.0)) bad++;
        if (e > worst || e != e) worst = e;
      }
    }
  }
  CHECKF(bad == 0, "%s: %d elements past tolerance (worst %.3g x tol)", s->name, bad, worst);
  printf("  %-28s batch %3d N %6d K %5d splits %d: accuracy worst %.3f of tolerance", s->name, s->batch, s->N, s->K,
         S, worst);
  /* invariance */
  int mism = 0, first_M = 0;
  for (int i = 0; i < nM; i++) {
    const int M = Ms[i];
    if (M > Mmax) continue;
    const int m0 = (int)(((int64_t)M * 7919) % (Mmax - M + 1));
    if (s->y_f32) di_cut_h2d(dY, y0, ny * 4);
    di_cuk_tc_gemm_set_fused_reduce(i & 1); /* every other M with the reduce fused: the same bits */
    st = run_tc(s, M, dX, ldx, sx, dW, dY, ldy, sy, m0);
    di_cuk_tc_gemm_set_fused_reduce(0);
    CHECKF(st == DI_OK && di_cut_sync() == 0, "%s M %d: %s", s->name, M, di_last_error());
    const size_t off = (size_t)m0 * ldy * es, len = (size_t)M * ldy * es;
    di_cut_d2h((char *)got + off, (char *)dY + off, len);
    if (memcmp((char *)got + off, (char *)alone + off, len) != 0) {
      if (!mism) first_M = M;
      mism++;
    }
  }
  CHECKF(mism == 0, "%s: %d of the M values give rows unequal to the rows alone (first M = %d)", s->name, mism,
         first_M);
  printf(", rows of M = 1..%d equal alone: %s\n", Mmax, mism ? "NO" : "yes");
  free(X); free(W); free(y0); free(alone); free(got); free(ref); free(l1);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(dAlone); di_cut_free(dY);
}

/* Informational: whether two cores give the same bits for the same rows (they are not required to:
 * a process uses one core; equal bits would let a small-M kernel of one core serve the other's
 * large-M products). Prints the share of equal elements; fails only on errors. */
static void cross_core(const shape *s, int M, int core_a, int core_b) {
  const int ldx = s->K, ldy = s->N, es = s->y_f32 ? 4 : 2;
  const size_t ny = (size_t)M * ldy;
  uint16_t *X = rand_bf16((size_t)M * ldx, 1.f), *W = rand_bf16(w_elems(s), 1.f / sqrtf((float)s->K));
  void *dX = dev_copy(X, (size_t)M * ldx * 2), *dW = dev_copy(W, w_elems(s) * 2), *dY = dev_copy(NULL, ny * es);
  char *ya = calloc(ny, es), *yb = calloc(ny, es);
  CHECK(dX && dW && dY && ya && yb);
  const int cores[2] = {core_a, core_b};
  char *out[2] = {ya, yb};
  for (int c = 0; c < 2; c++) {
    di_cuk_tc_gemm_set_core(cores[c]);
    di_cut_h2d(dY, out[c], ny * es); /* zeros: beta * 0 */
    di_status st = run_tc(s, M, dX, ldx, 0, dW, dY, ldy, 0, 0);
    CHECKF(st == DI_OK && di_cut_sync() == 0, "cross-core %s: %s", s->name, di_last_error());
    di_cut_d2h(out[c], dY, ny * es);
  }
  size_t eq = 0;
  for (size_t i = 0; i < ny; i++) eq += memcmp(ya + i * es, yb + i * es, es) == 0;
  printf("  cores %d vs %d, %s, M %d: %.2f%% of elements bit-equal\n", core_a, core_b, s->name, M, 100.0 * eq / ny);
  free(X); free(W); free(ya); free(yb);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(dY);
}

/* ---- grouped expert GEMM: rows independent of how many rows an expert has ----------------------- */
static void grouped_tiles(const int *cnt, int E, int bm, int32_t *off, int32_t *tiles, int *nt) {
  off[0] = 0;
  *nt = 0;
  for (int e = 0; e < E; e++) {
    off[e + 1] = off[e] + cnt[e];
    for (int t = 0; t * bm < cnt[e]; t++) tiles[(*nt)++] = e << 16 | t;
  }
}

static void test_grouped(int N, int K, int glu, int c_f32) {
  enum { E = 8 };
  const int cnt[E] = {1, 0, 3, 700, 17, 64, 65, 150};
  int A = 0;
  for (int e = 0; e < E; e++) A += cnt[e];
  const int T = A + 5, ldc = glu ? N / 2 : N, es = c_f32 ? 4 : 2;
  uint16_t *X = rand_bf16((size_t)T * K, 1.f), *W = rand_bf16((size_t)E * N * K, 1.f / sqrtf((float)K));
  int32_t *rows = malloc(A * 4), off[E + 1], *tiles = malloc((A + E) * 4);
  for (int i = 0; i < A; i++) rows[i] = (int32_t)(urand() * T);
  void *dX = dev_copy(X, (size_t)T * K * 2), *dW = dev_copy(W, (size_t)E * N * K * 2), *drows = dev_copy(rows, A * 4);
  void *doff = dev_copy(NULL, (E + 1) * 4), *dtiles = dev_copy(NULL, (A + E) * 4), *dnt = dev_copy(NULL, 4);
  void *dC = dev_copy(NULL, (size_t)A * ldc * es), *dC1 = dev_copy(NULL, (size_t)A * ldc * es);
  void *full[2] = {malloc((size_t)A * ldc * es), malloc((size_t)A * ldc * es)}, *one = malloc((size_t)A * ldc * es);
  const int bms[2] = {16, 64};
  for (int b = 0; b < 2; b++) {
    int nt;
    grouped_tiles(cnt, E, bms[b], off, tiles, &nt);
    di_cut_h2d(doff, off, sizeof off);
    di_cut_h2d(dtiles, tiles, nt * 4);
    di_cut_h2d(dnt, &nt, 4);
    di_status st = di_cuk_grouped_gemm(dX, K, drows, dW, N, K, doff, dtiles, dnt, nt, bms[b], dC, ldc, c_f32, glu, NULL);
    CHECKF(st == DI_OK && di_cut_sync() == 0, "grouped bm %d: %s", bms[b], di_last_error());
    di_cut_d2h(full[b], dC, (size_t)A * ldc * es);
  }
  /* each row as the only row of its expert (bm 16, one tile) */
  di_status st = DI_OK;
  for (int e = 0, i = 0; e < E; e++)
    for (int j = 0; j < cnt[e] && st == DI_OK; j++, i++) {
      int32_t o[E + 1], t = e << 16, n1 = 1;
      for (int q = 0; q <= E; q++) o[q] = q <= e ? 0 : 1;
      di_cut_h2d(doff, o, sizeof o);
      di_cut_h2d(dtiles, &t, 4);
      di_cut_h2d(dnt, &n1, 4);
      st = di_cuk_grouped_gemm(dX, K, (const int32_t *)drows + i, dW, N, K, doff, dtiles, dnt, 1, 16,
                               (char *)dC1 + (size_t)i * ldc * es, ldc, c_f32, glu, NULL);
      if (st == DI_OK && di_cut_sync() != 0) st = DI_ERR_BACKEND;
    }
  CHECKF(st == DI_OK, "grouped rows alone: %s", di_last_error());
  di_cut_d2h(one, dC1, (size_t)A * ldc * es);
  int bad16 = 0, bad64 = 0;
  for (int i = 0; i < A; i++) {
    bad16 += memcmp((char *)full[0] + (size_t)i * ldc * es, (char *)one + (size_t)i * ldc * es, (size_t)ldc * es) != 0;
    bad64 += memcmp((char *)full[1] + (size_t)i * ldc * es, (char *)one + (size_t)i * ldc * es, (size_t)ldc * es) != 0;
  }
  CHECKF(bad16 == 0 && bad64 == 0, "grouped N %d K %d glu %d: rows unequal to alone: %d (bm 16), %d (bm 64) of %d",
         N, K, glu, bad16, bad64, A);
  /* accuracy of a few rows of expert 3 (the 700-row one) */
  double worst = 0;
  for (int c = 0; c < 3; c++) {
    const int i = off[3] + (int)(urand() * cnt[3]), e = 3;
    for (int n = 0; n < ldc; n++) {
      double g = c_f32 ? ((float *)one)[(size_t)i * ldc + n] : di_bf16_to_f32(((uint16_t *)one)[(size_t)i * ldc + n]);
      double r, l1 = 0;
      const int rg = glu ? (n / 8) * 16 + n % 8 : n;
      double acc[2] = {0, 0};
      for (int h = 0; h < (glu ? 2 : 1); h++)
        for (int k = 0; k < K; k++) {
          double x = di_bf16_to_f32(X[(size_t)rows[i] * K + k]), w = di_bf16_to_f32(W[((size_t)e * N + rg + 8 * h) * K + k]);
          acc[h] += x * w;
          l1 += fabs(x * w);
        }
      r = glu ? acc[0] / (1 + exp(-acc[0])) * acc[1] : acc[0];
      double tol = glu ? 1e-2 * (fabs(r) + 1e-2) : (K / 16 + 16) * ldexp(1.0, -22) * l1 + (c_f32 ? 0 : ldexp(fabs(r), -8));
      double e_ = fabs(g - r) / tol;
      if (e_ > worst || e_ != e_) worst = e_;
    }
  }
  CHECKF(worst <= 1.0, "grouped N %d K %d glu %d: accuracy %.3g of tolerance", N, K, glu, worst);
  printf("  grouped N %5d K %5d glu %d: rows of 0..700-row experts equal alone (bm 16 and 64): %s, accuracy %.3f\n", N,
         K, glu, bad16 + bad64 ? "NO" : "yes", worst);
  free(X); free(W); free(rows); free(tiles); free(full[0]); free(full[1]); free(one);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(drows); di_cut_free(doff); di_cut_free(dtiles); di_cut_free(dnt);
  di_cut_free(dC); di_cut_free(dC1);
}

/* ---- the invariant down + combine: the unfused kernels' bits ------------------------------------- */
/* host simulation: di_block_sum over 256 threads (a warp's xor butterfly, the 8 warp sums read by lanes 0..7
 * of a 32-lane butterfly) and gg_combine_tail's form of it on 128 threads (each warp forms some of the
 * virtual warps' sums, in another order of warps; then the 8-lane butterfly) run the same float
 * additions: checked on random squares of 2,048-column rows */
static float host_xor_sum(float *v /* [32] */) {
  for (int o = 16; o > 0; o >>= 1) {
    float nv[32];
    for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
    memcpy(v, nv, sizeof nv);
  }
  for (int l = 1; l < 32; l++)
    if (memcmp(&v[l], &v[0], 4)) return NAN; /* every lane ends with lane 0's bits */
  return v[0];
}
static float host_block_sum256(const float *ss) {
  float red[32];
  for (int w = 0; w < 8; w++) {
    float v[32];
    memcpy(v, ss + 32 * w, sizeof v);
    red[w] = host_xor_sum(v);
  }
  float v[32];
  for (int l = 0; l < 32; l++) v[l] = l < 8 ? red[l] : 0.f;
  return host_xor_sum(v);
}
static float host_tail_sum128(const float *ss) {
  float red[8];
  for (int w = 0; w < 4; w++)
    for (int vw = w; vw < 8; vw += 4) { /* warp w forms virtual warps w and w + 4 */
      float v[32];
      for (int l = 0; l < 32; l++) v[l] = ss[32 * vw + l];
      red[vw] = host_xor_sum(v);
    }
  float v[32];
  for (int l = 0; l < 32; l++) v[l] = l < 8 ? red[l] : 0.f;
  return host_xor_sum(v);
}
static void check_tail_order_host(void) {
  int bad = 0;
  for (int r = 0; r < 2000; r++) {
    float ss[256];
    for (int i = 0; i < 256; i++) {
      const float v = nrand() * (float)(1 + r % 7);
      ss[i] = v * v;
    }
    const float a = host_block_sum256(ss), b = host_tail_sum128(ss);
    bad += a != a || memcmp(&a, &b, 4) != 0;
  }
  CHECKF(bad == 0, "host: the 128-thread sum of squares differs from di_block_sum's in %d of 2000 rows", bad);
  printf("  host: 128-thread sum-of-squares order == di_block_sum at 256 threads (2000 random rows): %s\n",
         bad ? "NO" : "yes");
}

/* the experts' weights of one shape, drawn once (138 MB at V2-Lite's with 24 experts) */
static void *g_dc_w;
static int64_t g_dc_w_elems;
static void *dc_weights(int E, int N, int K) {
  const int64_t elems = (int64_t)E * N * K;
  if (g_dc_w && g_dc_w_elems == elems) return g_dc_w;
  di_cut_free(g_dc_w);
  uint16_t *W = rand_bf16((size_t)elems, 1.f / sqrtf((float)K));
  g_dc_w = dev_copy(W, (size_t)elems * 2);
  g_dc_w_elems = elems;
  free(W);
  return g_dc_w;
}

static void test_down_combine(int E, int N, int K, int n, int k, int T, int norm, int idle) {
  const int A = T * k, bm = 16;
  int32_t *ids = malloc((size_t)A * 4), *cnt = calloc(E, 4), off[1025], *tiles = malloc((size_t)(A + E) * 4);
  int32_t *inv = malloc((size_t)A * 4), *fill = calloc(E, 4);
  float *w = malloc((size_t)A * 4), *h0 = malloc((size_t)T * n * 4), *nw = malloc((size_t)n * 4);
  for (int t = 0; t < T; t++) { /* k - 2 distinct routed experts, then the two shared ones (E - 2, E - 1) */
    for (int j = 0; j < k - 2; j++) {
      int e, dup;
      do {
        e = (int)(urand() * (E - 2));
        dup = 0;
        for (int q = 0; q < j; q++) dup |= ids[t * k + q] == e;
      } while (dup);
      ids[t * k + j] = e;
    }
    ids[t * k + k - 2] = E - 2;
    ids[t * k + k - 1] = E - 1;
    for (int j = 0; j < k; j++) w[t * k + j] = j < k - 2 ? (float)urand() : 1.f;
  }
  for (int a = 0; a < A; a++) cnt[ids[a]]++;
  int nt;
  grouped_tiles(cnt, E, bm, off, tiles, &nt);
  for (int a = 0; a < A; a++) inv[a] = off[ids[a]] + fill[ids[a]]++;
  for (int i = 0; i < T * n; i++) h0[i] = nrand();
  for (int c = 0; c < n; c++) nw[c] = 0.5f + (float)urand();
  uint16_t *act = rand_bf16((size_t)A * K, 1.f);
  const int max_tiles = nt + idle, ncnt = N / 64 + 1;
  void *dact = dev_copy(act, (size_t)A * K * 2), *dW = dc_weights(E, N, K);
  void *doff = dev_copy(off, (E + 1) * 4), *dtiles = dev_copy(tiles, (size_t)(nt > 0 ? nt : 1) * 4);
  void *dnt = dev_copy(&nt, 4);
  void *dinv = dev_copy(inv, (size_t)A * 4), *dw = dev_copy(w, (size_t)A * 4), *dnw = dev_copy(nw, (size_t)n * 4);
  int32_t *zc = calloc(ncnt, 4), *gc = malloc((size_t)ncnt * 4);
  void *dcnt = dev_copy(zc, (size_t)ncnt * 4);
  float *y[2], *hh[2];
  uint16_t *xn[2];
  void *dy[2], *dh[2], *dxn[2];
  for (int v = 0; v < 2; v++) {
    y[v] = malloc((size_t)A * N * 4);
    hh[v] = malloc((size_t)T * n * 4);
    xn[v] = calloc((size_t)T * N, 2);
    dy[v] = dev_copy(NULL, (size_t)A * N * 4);
    dh[v] = dev_copy(h0, (size_t)T * n * 4);
    dxn[v] = dev_copy(xn[v], (size_t)T * N * 2);
  }
  di_status st = di_cuk_grouped_gemm(dact, K, NULL, dW, N, K, doff, dtiles, dnt, max_tiles, bm, dy[0], N, 1, 0, NULL);
  if (st == DI_OK)
    st = di_cuk_moe_combine(dy[0], N, dinv, dw, T, k, n, dh[0], norm ? dnw : NULL, 1e-6f, dxn[0], N, NULL);
  CHECKF(st == DI_OK && di_cut_sync() == 0, "down + combine (unfused) T %d: %s", T, di_last_error());
  di_cut_d2h(y[0], dy[0], (size_t)A * N * 4);
  di_cut_d2h(hh[0], dh[0], (size_t)T * n * 4);
  di_cut_d2h(xn[0], dxn[0], (size_t)T * N * 2);
  int bad_y = 0, bad_h = 0, bad_x = 0, bad_c = 0;
  for (int rep = 0; rep < 2; rep++) { /* twice: the counters left at zero serve the next launch */
    di_cut_h2d(dh[1], h0, (size_t)T * n * 4);
    st = di_cuk_grouped_gemm_combine(dact, K, dW, N, K, doff, dtiles, dnt, max_tiles, bm, dy[1], N, dinv, dw, T, k, n,
                                     dh[1], norm ? dnw : NULL, 1e-6f, dxn[1], N, dcnt, NULL);
    CHECKF(st == DI_OK && di_cut_sync() == 0, "down + combine (fused) T %d: %s", T, di_last_error());
    di_cut_d2h(y[1], dy[1], (size_t)A * N * 4);
    di_cut_d2h(hh[1], dh[1], (size_t)T * n * 4);
    di_cut_d2h(xn[1], dxn[1], (size_t)T * N * 2);
    di_cut_d2h(gc, dcnt, (size_t)ncnt * 4);
    for (int a = 0; a < A; a++) bad_y += memcmp(y[0] + (size_t)a * N, y[1] + (size_t)a * N, (size_t)N * 4) != 0;
    for (int t = 0; t < T; t++) {
      bad_h += memcmp(hh[0] + (size_t)t * n, hh[1] + (size_t)t * n, (size_t)n * 4) != 0;
      bad_x += norm && memcmp(xn[0] + (size_t)t * N, xn[1] + (size_t)t * N, (size_t)n * 2) != 0;
    }
    for (int i = 0; i < ncnt; i++) bad_c += gc[i] != 0;
  }
  /* the combine did add: h moved from h0 */
  int moved = 0;
  for (int i = 0; i < T * n; i++) moved += hh[1][i] != h0[i];
  CHECKF(bad_y == 0 && bad_h == 0 && bad_x == 0 && bad_c == 0 && moved > T * n / 2,
         "down + combine N %d K %d n %d k %d T %d norm %d idle %d: unequal y rows %d, h rows %d, xn rows %d, counters "
         "left %d, h moved %d of %d",
         N, K, n, k, T, norm, idle, bad_y, bad_h, bad_x, bad_c, moved, T * n);
  printf("  down + combine N %d K %d n %d k %d T %2d norm %d idle tiles %d (%2d tiles): y, h%s == unfused bit for bit: "
         "%s\n", N, K, n, k, T, norm, idle, nt, norm ? ", xn" : "", bad_y + bad_h + bad_x + bad_c ? "NO" : "yes");
  for (int v = 0; v < 2; v++) {
    free(y[v]); free(hh[v]); free(xn[v]);
    di_cut_free(dy[v]); di_cut_free(dh[v]); di_cut_free(dxn[v]);
  }
  free(ids); free(cnt); free(tiles); free(inv); free(fill); free(w); free(h0); free(nw); free(act); free(zc);
  free(gc);
  di_cut_free(dact); di_cut_free(doff); di_cut_free(dtiles); di_cut_free(dnt); di_cut_free(dinv);
  di_cut_free(dw); di_cut_free(dnw); di_cut_free(dcnt);
}

static void test_down_combine_all(void) {
  printf("invariant down + combine (di_cuk_grouped_gemm_combine) against grouped GEMM + moe_combine:\n");
  check_tail_order_host();
  const int Ts[] = {1, 2, 3, 4, 5, 8, 16, 33};
  for (int core = 0; core <= 3; core += 3) { /* mma.sync, hybrid: bm 16 on the mma.sync kernel in both */
    di_cuk_tc_gemm_set_core(core);
    printf(" %s core:\n", core ? "hybrid" : "mma.sync");
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
      test_down_combine(24, 2048, 1408, 2048, 8, Ts[i], 1, Ts[i] % 3); /* V2-Lite: 22 routed + 2 shared */
      if (Ts[i] <= 4) test_down_combine(24, 2048, 1408, 2048, 8, Ts[i], 0, 2);
    }
  }
  for (int core = 0; core <= 3; core += 3) {
    di_cuk_tc_gemm_set_core(core);
    test_down_combine(10, 256, 128, 200, 3, 1, 1, 0); /* h narrower than N (padding columns), 3 slots */
    test_down_combine(10, 256, 128, 200, 3, 7, 1, 1);
    test_down_combine(10, 256, 128, 200, 3, 7, 0, 0);
  }
  di_cuk_tc_gemm_set_core(2); /* the TMA core takes bm 16 too: not this form */
  CHECK(!di_cuk_grouped_gemm_combine_ok(2048, 1408, 1408, g_ws, 16, 2048, 8, 1));
  di_cuk_tc_gemm_set_core(3);
  CHECK(di_cuk_grouped_gemm_combine_ok(2048, 1408, 1408, g_ws, 16, 2048, 8, 1));
  CHECK(!di_cuk_grouped_gemm_combine_ok(2048, 1408, 1408, g_ws, 64, 2048, 8, 1)); /* 64-row tiles: TMA */
  di_cuk_tc_gemm_set_core(0);
  di_cut_free(g_dc_w);
  g_dc_w = NULL;
  g_dc_w_elems = 0;
}

/* ---- the invariant prep + absorption: the unfused kernels' bits ---------------------------------- */
/* V2-Lite's MLA shapes (16 heads, nope 128, rope 64, latent 512, v 128): Qa (every column: the absorption's
 * latent ones, the prep's roped and zero ones) and the cache entries of di_cuk_tc_gemm_prep equal
 * di_cuk_mla_prep + di_cuk_tc_gemm (as di_cu_gemm_batched runs it) bit for bit; nk: W_UK as the [N][K]
 * copies (ABSORB_NK), else kv_b's [K][N] rows. */
static void test_prep_absorb(int T, int nk, int kv8, int interleave) {
  enum { H = 16, N = 128, P = 64, R = 512, DV = 128, NSLOT = 64 };
  const int dqk = N + P, ldq = H * dqk, ldk = R + P + 64, D = DI_CUK_MLA_D;
  const size_t row = kv8 ? DI_CUK_KV8_ROW : (size_t)D * 2, wn = nk ? (size_t)H * R * N : (size_t)H * (N + DV) * R;
  uint16_t *kva = rand_bf16((size_t)T * ldk, 1.f), *q = rand_bf16((size_t)T * ldq, 1.f);
  uint16_t *W = rand_bf16(wn, 1.f / sqrtf((float)N));
  int32_t pos[16], slot[16];
  for (int t = 0; t < T; t++) {
    pos[t] = (int)(urand() * 6000);
    int ok;
    do { /* distinct slots */
      slot[t] = (int)(urand() * NSLOT);
      ok = 1;
      for (int u = 0; u < t; u++) ok &= slot[u] != slot[t];
    } while (!ok);
  }
  float kvn[R], invf[P / 2];
  for (int i = 0; i < R; i++) kvn[i] = 0.5f + (float)urand();
  for (int i = 0; i < P / 2; i++) invf[i] = powf(10000.f, -2.f * i / P);
  const size_t qa_bytes = (size_t)T * H * D * 2, c_bytes = NSLOT * row;
  unsigned char *fill = malloc(qa_bytes > c_bytes ? qa_bytes : c_bytes);
  memset(fill, 0xa5, qa_bytes > c_bytes ? qa_bytes : c_bytes); /* what neither writes stays equal too */
  void *dkva = dev_copy(kva, (size_t)T * ldk * 2), *dq = dev_copy(q, (size_t)T * ldq * 2), *dW = dev_copy(W, wn * 2);
  void *dpos = dev_copy(pos, 64), *dslot = dev_copy(slot, 64), *dkvn = dev_copy(kvn, sizeof kvn);
  void *dinv = dev_copy(invf, sizeof invf);
  void *dQa[2] = {dev_copy(fill, qa_bytes), dev_copy(fill, qa_bytes)};
  void *dc[2] = {dev_copy(fill, c_bytes), dev_copy(fill, c_bytes)};
  const di_cuk_rope rope = {dinv, 1.1f, interleave};
  const int ldw = nk ? N : R;
  const int64_t sw = nk ? (int64_t)R * N : (int64_t)(N + DV) * R;
  di_status st = di_cuk_mla_prep(dkva, ldk, dq, ldq, dpos, dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa[0], dc[0], kv8,
                                 NULL);
  if (st == DI_OK)
    st = di_cuk_tc_gemm(H, T, R, N, dq, ldq, dqk, dW, ldw, sw, !nk, dQa[0], H * D, D, 0, 0.f, g_ws, WS_BYTES, NULL);
  CHECKF(st == DI_OK && di_cut_sync() == 0, "prep + absorb (unfused) T %d: %s", T, di_last_error());
  const int ok = di_cuk_tc_gemm_prep_ok(T, R, N, ldq, ldw, !nk, dq, dW, H);
  CHECKF(ok, "prep + absorb: not taken at T %d nk %d", T, nk);
  int bad_q = 0, bad_c = 0;
  unsigned char *a = malloc(qa_bytes), *b = malloc(qa_bytes), *ca = malloc(c_bytes), *cb = malloc(c_bytes);
  for (int rep = 0; rep < 2 && ok; rep++) {
    st = di_cuk_tc_gemm_prep(H, T, R, N, dq, ldq, dqk, dW, ldw, sw, !nk, dQa[1], H * D, D, dkva, ldk, dq, ldq, dpos,
                             dslot, T, H, N, P, R, dkvn, 1e-6f, rope, dQa[1], dc[1], kv8, NULL);
    CHECKF(st == DI_OK && di_cut_sync() == 0, "prep + absorb (fused) T %d: %s", T, di_last_error());
    di_cut_d2h(a, dQa[0], qa_bytes);
    di_cut_d2h(b, dQa[1], qa_bytes);
    di_cut_d2h(ca, dc[0], c_bytes);
    di_cut_d2h(cb, dc[1], c_bytes);
    for (int r = 0; r < T * H; r++) bad_q += memcmp(a + (size_t)r * D * 2, b + (size_t)r * D * 2, (size_t)D * 2) != 0;
    for (int r = 0; r < NSLOT; r++) bad_c += memcmp(ca + r * row, cb + r * row, row) != 0;
  }
  int written = 0; /* the product and the prep did write */
  for (int t = 0; t < T; t++) written += memcmp(a + (size_t)t * H * D * 2, fill, 16) != 0 &&
                                         memcmp(ca + slot[t] * row, fill, 16) != 0;
  CHECKF(bad_q == 0 && bad_c == 0 && written == T, "prep + absorb T %d nk %d kv8 %d: unequal Qa rows %d of %d, cache "
         "rows %d, rows written %d of %d", T, nk, kv8, bad_q, T * H, bad_c, written, T);
  printf("  prep + absorb T %2d %s %s cache, rope %s: Qa and cache == unfused bit for bit: %s\n", T,
         nk ? "W [N][K]" : "W [K][N]", kv8 ? "fp8 " : "bf16", interleave ? "interleaved" : "halves",
         bad_q + bad_c ? "NO" : "yes");
  free(kva); free(q); free(W); free(fill); free(a); free(b); free(ca); free(cb);
  di_cut_free(dkva); di_cut_free(dq); di_cut_free(dW); di_cut_free(dpos); di_cut_free(dslot); di_cut_free(dkvn);
  di_cut_free(dinv);
  for (int v = 0; v < 2; v++) {
    di_cut_free(dQa[v]);
    di_cut_free(dc[v]);
  }
}

static void test_prep_absorb_all(void) {
  printf("invariant prep + absorption (di_cuk_tc_gemm_prep) against mla_prep + the tensor-core GEMM:\n");
  for (int core = 0; core <= 3; core += 3) {
    di_cuk_tc_gemm_set_core(core);
    printf(" %s core:\n", core ? "hybrid" : "mma.sync");
    const int Tn[] = {1, 2, 3, 5, 8}, Tk[] = {1, 4, 9, 16};
    for (int i = 0; i < 5; i++) test_prep_absorb(Tn[i], 1, 0, i & 1);
    for (int i = 0; i < 4; i++) test_prep_absorb(Tk[i], 0, 0, i & 1);
    test_prep_absorb(1, 1, 1, 1);
    test_prep_absorb(4, 0, 1, 0);
  }
  /* not taken where di_cuk_tc_gemm would run another core: the TMA / wgmma cores for [N][K], the hybrid's
   * TMA side above 8 rows, 17 rows (two tiles) */
  di_cuk_tc_gemm_set_core(3);
  CHECK(!di_cuk_tc_gemm_prep_ok(9, 512, 128, 3072, 128, 0, g_ws, g_ws, 16));
  CHECK(di_cuk_tc_gemm_prep_ok(9, 512, 128, 3072, 512, 1, g_ws, g_ws, 16));
  CHECK(!di_cuk_tc_gemm_prep_ok(17, 512, 128, 3072, 512, 1, g_ws, g_ws, 16));
  di_cuk_tc_gemm_set_core(2);
  CHECK(!di_cuk_tc_gemm_prep_ok(1, 512, 128, 3072, 128, 0, g_ws, g_ws, 16));
  di_cuk_tc_gemm_set_core(0);
}

/* ---- --bench: TFLOP/s at the main shapes -------------------------------------------------------- */
static double time_us(di_cu_blas *blas, int tc, int M, int N, int K, int y_f32, const void *dX, const void *dW,
                      void *dY) {
  const int reps = M * (double)N * K > 1e10 ? 20 : 100;
  for (int w = 0; w < 2; w++) {
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
      di_cut_sync();
      double t0 = di_cut_time_ms();
      for (int i = 0; i < reps; i++) {
        if (tc)
          di_cuk_tc_gemm(1, M, N, K, dX, K, 0, dW, K, 0, 0, dY, N, 0, y_f32, y_f32 ? 1.f : 0.f, g_ws, WS_BYTES, NULL);
        else
          di_cu_gemm(blas, M, N, K, dX, K, dW, K, dY, N, y_f32, y_f32 ? 1.f : 0.f, NULL);
      }
      di_cut_sync();
      double t = (di_cut_time_ms() - t0) * 1e3 / reps;
      if (t < best) best = t;
    }
    if (w == 1) return best;
  }
  return 0;
}

static void bench(di_cu_blas *blas) {
  static const struct { const char *name; int N, K, y_f32; } sh[] = {
      {"q/kv (3648x2048)", 3648, 2048, 0},   {"o_proj (2048x2048)", 2048, 2048, 1},
      {"mlp gate/up (21888x2048)", 21888, 2048, 0}, {"mlp down (2048x10944)", 2048, 10944, 1},
      {"lm_head (102400x2048)", 102400, 2048, 1}};
  const int Ms[] = {1, 2, 4, 8, 16, 64, 256, 512, 4096};
  printf("%-26s %6s %12s %12s %9s %9s %6s\n", "shape", "M", "tc us", "default us", "tc TF/s", "dflt TF/s", "tc/dflt");
  for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
    const int N = sh[i].N, K = sh[i].K;
    uint16_t *X = rand_bf16((size_t)4096 * K, 1.f), *W = rand_bf16((size_t)N * K, 0.02f);
    void *dX = dev_copy(X, (size_t)4096 * K * 2), *dW = dev_copy(W, (size_t)N * K * 2);
    void *dY = dev_copy(NULL, (size_t)4096 * N * 4);
    for (size_t j = 0; j < sizeof Ms / sizeof Ms[0]; j++) {
      const int M = Ms[j];
      double a = time_us(blas, 1, M, N, K, sh[i].y_f32, dX, dW, dY), b = time_us(blas, 0, M, N, K, sh[i].y_f32, dX, dW, dY);
      const double fl = 2.0 * M * N * K;
      printf("%-26s %6d %12.1f %12.1f %9.1f %9.1f %6.2f\n", sh[i].name, M, a, b, fl / a * 1e-6, fl / b * 1e-6, b / a);
    }
    free(X); free(W);
    di_cut_free(dX); di_cut_free(dW); di_cut_free(dY);
  }
}

/* --bench, experts: 16 experts of `rows` rows each (a 4,096-token prefill with top-6 gives ~384), the
 * grouped GEMM on the mma.sync kernel and on the TMA core, best of 3 x 10 calls */
static void bench_grouped(int N, int K, int glu, int rows) {
  enum { E = 16 };
  const int A = E * rows, ldc = glu ? N / 2 : N;
  uint16_t *X = rand_bf16((size_t)A * K, 1.f), *W = rand_bf16((size_t)E * N * K, 0.02f);
  int32_t off[E + 1], *tiles = malloc((A / 64 + E) * 4);
  int cnt[E], nt;
  for (int e = 0; e < E; e++) cnt[e] = rows;
  grouped_tiles(cnt, E, 64, off, tiles, &nt);
  void *dX = dev_copy(X, (size_t)A * K * 2), *dW = dev_copy(W, (size_t)E * N * K * 2), *doff = dev_copy(off, sizeof off);
  void *dtiles = dev_copy(tiles, nt * 4), *dnt = dev_copy(&nt, 4), *dC = dev_copy(NULL, (size_t)A * ldc * 4);
  CHECK(dX && dW && doff && dtiles && dnt && dC);
  const int cores[2] = {0, 2};
  double us[2];
  for (int c = 0; c < 2; c++) {
    di_cuk_tc_gemm_set_core(cores[c]);
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
      di_cut_sync();
      const double t0 = di_cut_time_ms();
      for (int i = 0; i < 10; i++)
        di_cuk_grouped_gemm(dX, K, NULL, dW, N, K, doff, dtiles, dnt, nt, 64, dC, ldc, !glu, glu, NULL);
      CHECK(di_cut_sync() == 0);
      const double t = (di_cut_time_ms() - t0) * 100.0;
      if (rep && t < best) best = t;
    }
    us[c] = best;
  }
  const double fl = 2.0 * A * N * K;
  printf("grouped %s N %d K %d, 16 experts x %d rows: mma.sync %.1f us (%.0f TF/s), tma %.1f us (%.0f TF/s)\n",
         glu ? "gate/up" : "down", N, K, rows, us[0], fl / us[0] * 1e-6, us[1], fl / us[1] * 1e-6);
  free(X); free(W); free(tiles);
  di_cut_free(dX); di_cut_free(dW); di_cut_free(doff); di_cut_free(dtiles); di_cut_free(dnt); di_cut_free(dC);
}

/* The absorption in its two forms (DEEPINFER_CUDA_ABSORB_NK): W_UK [K][N] (w_kn, the mma.sync kernel) and
 * its per-head transpose [N][K] (whichever core is set) must give the same bits at every M: the same
 * chains of k16 steps on the same values. */
static void check_absorb_forms(void) {
  enum { NH = 16, DN = 128, DV = 128, DQK = 192, R = 512, MMAX = 1024 };
  uint16_t *q = rand_bf16((size_t)MMAX * NH * DQK, 1.f), *kvb = rand_bf16((size_t)NH * (DN + DV) * R, 0.05f);
  uint16_t *wt = malloc((size_t)NH * R * DN * 2);
  for (int h = 0; h < NH; h++)
    for (int k = 0; k < DN; k++)
      for (int r = 0; r < R; r++) wt[((size_t)h * R + r) * DN + k] = kvb[((size_t)h * (DN + DV) + k) * R + r];
  void *dq = dev_copy(q, (size_t)MMAX * NH * DQK * 2), *dkvb = dev_copy(kvb, (size_t)NH * (DN + DV) * R * 2);
  void *dwt = dev_copy(NULL, (size_t)NH * R * DN * 2), *dY0 = dev_copy(NULL, (size_t)MMAX * NH * 576 * 2),
       *dY1 = dev_copy(NULL, (size_t)MMAX * NH * 576 * 2);
  CHECK(dq && dkvb && dwt && dY0 && dY1);
  /* the backend's transpose kernel against the host's */
  CHECK(di_cuk_mla_wuk_transpose(dkvb, NH, DN, DV, R, dwt, NULL) == DI_OK && di_cut_sync() == 0);
  uint16_t *wt_dev = malloc((size_t)NH * R * DN * 2);
  di_cut_d2h(wt_dev, dwt, (size_t)NH * R * DN * 2);
  CHECKF(memcmp(wt, wt_dev, (size_t)NH * R * DN * 2) == 0, "di_cuk_mla_wuk_transpose differs from the transpose");
  const int Ms[] = {1, 5, 8, 9, 16, 64, 300, 1024};
  uint16_t *y0 = malloc((size_t)MMAX * NH * 576 * 2), *y1 = malloc((size_t)MMAX * NH * 576 * 2);
  for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
    const int M = Ms[i];
    const size_t ny = (size_t)M * NH * 576 * 2;
    di_status st = di_cuk_tc_gemm(NH, M, R, DN, dq, NH * DQK, DQK, dkvb, R, (int64_t)(DN + DV) * R, 1, dY0, NH * 576,
                                  576, 0, 0.f, g_ws, WS_BYTES, NULL);
    if (st == DI_OK)
      st = di_cuk_tc_gemm(NH, M, R, DN, dq, NH * DQK, DQK, dwt, DN, (int64_t)R * DN, 0, dY1, NH * 576, 576, 0, 0.f,
                          g_ws, WS_BYTES, NULL);
    CHECKF(st == DI_OK && di_cut_sync() == 0, "absorb forms M %d: %s", M, di_last_error());
    di_cut_d2h(y0, dY0, ny);
    di_cut_d2h(y1, dY1, ny);
    size_t diff = 0;
    for (int m = 0; m < M; m++)
      for (int h = 0; h < NH; h++)
        for (int n = 0; n < R; n++) {
          const size_t e = ((size_t)m * NH + h) * 576 + n;
          diff += y0[e] != y1[e];
        }
    CHECKF(diff == 0, "absorb M %d: %zu of %d values of the [N][K] form differ from the [K][N] form", M, diff, M * NH * R);
    printf("  absorb [K][N] vs [N][K] form, M %4d: %s\n", M, diff ? "DIFFERENT" : "bit-identical");
  }
  free(q); free(kvb); free(wt); free(wt_dev); free(y0); free(y1);
  di_cut_free(dq); di_cut_free(dkvb); di_cut_free(dwt); di_cut_free(dY0); di_cut_free(dY1);
}

/* --bench-mla: V2-Lite's per-head products at T tokens as cuda_deepseek2.cu calls di_cu_gemm_batched
 * (16 heads; q rows of 16 x 192 with the 128 nope columns first, kv_b [16][256][512]; the absorption
 * writes Qa's 512 latent columns of 576, W_UV reads o_lat [T][16][512]), best of 3 x 10 calls */
static void bench_mla(di_cu_blas *blas) {
  enum { NH = 16, DN = 128, DV = 128, DQK = 192, R = 512 };
  const int Ts[] = {1, 16, 64, 128, 256, 512, 4096};
  uint16_t *q = rand_bf16((size_t)4096 * NH * DQK, 1.f), *kvb = rand_bf16((size_t)NH * (DN + DV) * R, 0.02f);
  uint16_t *ol = rand_bf16((size_t)4096 * NH * R, 1.f);
  void *dq = dev_copy(q, (size_t)4096 * NH * DQK * 2), *dkvb = dev_copy(kvb, (size_t)NH * (DN + DV) * R * 2);
  void *dol = dev_copy(ol, (size_t)4096 * NH * R * 2), *dY = dev_copy(NULL, (size_t)4096 * NH * 576 * 2);
  CHECK(dq && dkvb && dol && dY);
  uint16_t *dwt = dev_copy(NULL, (size_t)NH * R * DN * 2);
  CHECK(dwt && di_cuk_mla_wuk_transpose(dkvb, NH, DN, DV, R, dwt, NULL) == DI_OK);
  for (int prod = 0; prod < 3; prod++)
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
      const int T = Ts[ti];
      double us[3]; /* default, invariant on the hybrid core (the backend's), invariant on mma.sync */
      for (int v = 0; v < 3; v++) {
        const int inv = v > 0;
        di_cu_blas_set_invariant(blas, inv);
        di_cu_blas_set_tc(blas, inv);
        di_cuk_tc_gemm_set_core(v == 2 ? 0 : 3);
        double best = 1e30;
        for (int rep = 0; rep < 4; rep++) {
          di_cut_sync();
          const double t0 = di_cut_time_ms();
          for (int i = 0; i < 10; i++) {
            const di_status st =
                prod == 0   ? di_cu_gemm_batched(blas, NH, T, R, DN, dq, NH * DQK, DQK, dkvb, R, (int64_t)(DN + DV) * R,
                                                 1, dY, NH * 576, 576, NULL)
                : prod == 2 ? di_cu_gemm_batched(blas, NH, T, R, DN, dq, NH * DQK, DQK, dwt, DN, (int64_t)R * DN, 0, dY,
                                                 NH * 576, 576, NULL)
                          : di_cu_gemm_batched(blas, NH, T, DV, R, dol, NH * R, R, (const uint16_t *)dkvb + DN * R, R,
                                               (int64_t)(DN + DV) * R, 0, dY, NH * DV, DV, NULL);
            CHECK(st == DI_OK);
          }
          CHECK(di_cut_sync() == 0);
          const double t = (di_cut_time_ms() - t0) * 100.0;
          if (rep && t < best) best = t;
        }
        us[v] = best;
      }
      const double fl = 2.0 * NH * T * (prod == 0 ? (double)R * DN : (double)DV * R);
      printf("mla %s T %5d: invariant %.1f us (%.1f TF/s; mma.sync core %.1f us), default %.1f us (%.1f TF/s)\n",
             prod == 0 ? "absorb [K][N]" : prod == 2 ? "absorb [N][K]" : "W_UV         ", T, us[1], fl / us[1] * 1e-6, us[2], us[0], fl / us[0] * 1e-6);
    }
  di_cu_blas_set_invariant(blas, 0);
  di_cuk_tc_gemm_set_core(0);
  free(q); free(kvb); free(ol);
  di_cut_free(dq); di_cut_free(dkvb); di_cut_free(dol); di_cut_free(dY); di_cut_free(dwt);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  g_ws = di_cut_malloc(WS_BYTES);
  CHECK(g_ws != NULL);
  { /* the tile counters at its start begin at zero */
    void *zero = calloc(1, 16384);
    di_cut_h2d(g_ws, zero, 16384);
    free(zero);
  }
  /* [--bench] [--core mma|wgmma|tma|hybrid|gemv | --cores FIRST LAST] (default all) */
  static const char *const core_names[] = {"mma.sync", "wgmma", "tma", "hybrid", "gemv"};
  int core0 = 0, core1 = 4, bench_mode = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bench")) bench_mode = 1;
    else if (!strcmp(argv[i], "--bench-mla")) bench_mode = 2;
    else if (!strcmp(argv[i], "--core") && i + 1 < argc) {
      i++;
      core0 = core1 = !strcmp(argv[i], "gemv") ? 4 : !strcmp(argv[i], "hybrid") ? 3 : !strcmp(argv[i], "tma") ? 2 : !strcmp(argv[i], "wgmma") ? 1 : 0;
    } else if (!strcmp(argv[i], "--fusions-only")) {
      bench_mode = 3;
    } else if (!strcmp(argv[i], "--cores") && i + 2 < argc) { /* --cores FIRST LAST (0 mma .. 3 hybrid) */
      core0 = atoi(argv[i + 1]);
      core1 = atoi(argv[i + 2]);
      i += 2;
    }
  }
  if (bench_mode == 3) {
    test_down_combine_all();
    test_prep_absorb_all();
    di_cut_free(g_ws);
    return test_finish("test_cuda_tc_gemm --fusions-only");
  }
  if (bench_mode == 2) {
    di_cu_blas *blas = NULL;
    CHECK(di_cu_blas_create(&blas) == DI_OK);
    bench_mla(blas);
    di_cu_blas_destroy(blas);
    di_cut_free(g_ws);
    return test_finish("bench_tc_gemm --bench-mla");
  }
  if (bench_mode) {
    di_cu_blas *blas = NULL;
    CHECK(di_cu_blas_create(&blas) == DI_OK);
    for (int core = core0; core <= core1; core++) {
      di_cuk_tc_gemm_set_core(core);
      printf("core %s:\n", core_names[core]);
      bench(blas);
    }
    bench_grouped(2 * 1408, 2048, 1, 384);
    bench_grouped(2048, 1408, 0, 384);
    bench_grouped(2 * 1408, 2048, 1, 48);
    di_cuk_tc_gemm_set_core(0);
    di_cu_blas_destroy(blas);
    di_cut_free(g_ws);
    return test_finish("bench_tc_gemm");
  }
  const int Ms[] = {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 1000, 4096};
  const int nM = (int)(sizeof Ms / sizeof Ms[0]);
  const shape shapes[] = {
      {"o_proj + residual", 1, 2048, 2048, 0, 1, 1.f, 0, 2048},
      {"q/kv (V2-Lite)", 1, 3648, 2048, 0, 0, 0.f, 0, 2048},
      {"dense down + residual", 1, 2048, 10944, 0, 1, 1.f, 0, 10944},
      {"odd 576 x 224", 1, 576, 224, 0, 0, 0.f, 0, 224},
      {"odd 64 x 224 (f32)", 1, 64, 224, 0, 1, 0.f, 0, 224},
      {"odd 224 x 576", 1, 224, 576, 0, 0, 0.f, 0, 576},
      {"odd 224 x 64 (+res)", 1, 224, 64, 0, 1, 1.f, 0, 64},
      {"absorb q.W_UK [K][N] x16", 16, 512, 128, 1, 0, 0.f, (int64_t)256 * 512, 512},
      {"W_UV x16", 16, 128, 512, 0, 0, 0.f, (int64_t)256 * 512, 512},
      {"absorb q.W_UK^T [N][K] x16", 16, 512, 128, 0, 0, 0.f, (int64_t)512 * 128, 128},
  };
  const shape gu = {"dense gate/up", 1, 21888, 2048, 0, 0, 0.f, 0, 2048};
  const shape lm = {"lm_head", 1, 102400, 2048, 0, 1, 0.f, 0, 2048};
  for (int core = core0; core <= core1; core++) { /* mma.sync, then the wgmma cores (W [N][K] shapes; W [K][N] stays mma.sync) */
    di_cuk_tc_gemm_set_core(core);
    printf("tensor-core GEMM (k_tc_gemm.cu), %s core:\n", core_names[core]);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      if (!core || !shapes[i].w_kn)
        test_shape(&shapes[i], shapes[i].batch > 1 ? 1024 : 4096, Ms, nM, shapes[i].K > 4096 ? 3 : 6);
    { /* every M of 1..4096 (odd ones included) at a cheap shape */
      static int all_M[4096];
      for (int m = 0; m < 4096; m++) all_M[m] = m + 1;
      test_shape(&shapes[3], 4096, all_M, 4096, 2);
    }
    test_shape(&gu, 1000, Ms, nM, 2);
    test_shape(&lm, 300, Ms, nM, 2);
    check_absorb_forms();
  }
  if (core0 != core1 || core1 >= 2) {
    printf("cores against each other (informational):\n");
    cross_core(&shapes[1], 64, 0, 2);
    cross_core(&shapes[0], 300, 0, 2);
    cross_core(&shapes[1], 64, 1, 2);
  }
  for (int core = core0; core <= core1; core++) { /* the wgmma cp.async core has no grouped form of its own */
    if (core == 1) continue;
    di_cuk_tc_gemm_set_core(core);
    printf("grouped expert GEMM (%s), %s core:\n", core == 2 ? "k_tc_grouped.cu" : core >= 3 ? "bm 16 k_grouped_gemm.cu, bm 64 k_tc_grouped.cu" : "k_grouped_gemm.cu", core_names[core]);
    test_grouped(2 * 1408, 2048, 1, 0); /* V2-Lite experts' gate/up (glu) */
    test_grouped(2048, 1408, 0, 1);     /* ... and down, f32 out */
  }
  di_cuk_tc_gemm_set_core(0);
  test_down_combine_all();
  test_prep_absorb_all();
  di_cut_free(g_ws);
  return test_finish("test_cuda_tc_gemm");
}
