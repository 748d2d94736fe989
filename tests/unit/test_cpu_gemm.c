/* The CPU matrix products (backend/cpu/cpu_gemm.c) against a float64 reference on fresh random
 * inputs, for every storage type (bf16, f16, f32, block-scaled FP8 with 8- and 128-wide blocks and an
 * odd block that takes the scalar path), shapes with and without a column tail, 1 to 40 activation
 * rows (the one-row path, the 2 x 4 tiles and the >= 8-row weight panels) and 1 to 3 threads; and the
 * batch-invariance contract: every row of a many-row product is bit-equal to that row alone. Also the
 * thread pool's per-thread scratch buffers the panel form lives in, and di_cpu_dot4 == di_cpu_dot. */
#include "backend/cpu/cpu_gemm.h"
#include "util/numeric.h"
#include "util/threadpool.h"
#include "test_util.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_state = 0x2545f4914f6cdd1dull;
static float urand(void) { /* [-1, 1) */
  g_state ^= g_state << 13; g_state ^= g_state >> 7; g_state ^= g_state << 17;
  return (float)((g_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

typedef struct {
  di_weight w;
  void *data;
  float *scales;
} test_weight;

/* N x K random weights of the given type (FP8: block_cols wide blocks of 3 rows) */
static test_weight make_weight(di_dtype dt, int64_t N, int64_t K, int block_cols) {
  test_weight t;
  memset(&t, 0, sizeof t);
  t.w.name = "test";
  t.w.dtype = dt;
  t.w.rows = N;
  t.w.cols = K;
  const size_t n = (size_t)(N * K);
  if (dt == DI_DT_F32) {
    float *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = urand();
    t.data = d;
  } else if (dt == DI_DT_BF16 || dt == DI_DT_F16) {
    uint16_t *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = dt == DI_DT_BF16 ? di_f32_to_bf16(urand()) : di_f32_to_f16(urand());
    t.data = d;
  } else {
    uint8_t *d = malloc(n);
    for (size_t i = 0; i < n; i++) {
      uint8_t v = (uint8_t)(g_state >> 24);
      urand();
      if ((v & 0x7f) == 0x7f) v &= 0xfe; /* no NaN codes */
      d[i] = v;
    }
    t.data = d;
    t.w.block_rows = 3;
    t.w.block_cols = block_cols;
    t.w.scale_cols = (K + block_cols - 1) / block_cols;
    const int64_t sr = (N + 2) / 3;
    t.scales = malloc(sizeof(float) * (size_t)(sr * t.w.scale_cols));
    for (int64_t i = 0; i < sr * t.w.scale_cols; i++) t.scales[i] = 0.01f + 0.02f * (urand() + 1.0f);
    t.w.scale_inv = t.scales;
  }
  t.w.data = t.data;
  return t;
}

static void check_case(di_threadpool *tp, di_dtype dt, int64_t M, int64_t N, int64_t K, int block_cols) {
  test_weight tw = make_weight(dt, N, K, block_cols);
  float *x = malloc(sizeof(float) * (size_t)(M * K)), *y = malloc(sizeof(float) * (size_t)(M * N));
  float *y1 = malloc(sizeof(float) * (size_t)N);
  for (int64_t i = 0; i < M * K; i++) x[i] = urand();
  di_cpu_gemm(tp, x, M, K, &tw.w, 0, N, y, N);
  double worst = 0;
  int same = 1;
  for (int64_t m = 0; m < M; m++) {
    for (int64_t n = 0; n < N; n++) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) {
        const double p = (double)x[m * K + k] * (double)di_weight_get(&tw.w, n, k);
        ref += p;
        mag += fabs(p);
      }
      const double err = fabs((double)y[m * N + n] - ref) / (mag > 1e-30 ? mag : 1.0);
      if (err > worst) worst = err;
    }
    /* the row alone: the same bits */
    di_cpu_gemm(tp, x + m * K, 1, K, &tw.w, 0, N, y1, N);
    same &= memcmp(y1, y + m * N, sizeof(float) * (size_t)N) == 0;
  }
  /* float32 accumulation over K terms: |error| <= ~K * 2^-24 * sum |products| */
  CHECKF(worst < 1e-6 * (double)K + 1e-6, "gemm dtype %d M=%lld N=%lld K=%lld: error %.3g of the magnitude", (int)dt,
         (long long)M, (long long)N, (long long)K, worst);
  CHECKF(same, "gemm dtype %d M=%lld N=%lld K=%lld: a row differs from the same row alone", (int)dt, (long long)M,
         (long long)N, (long long)K);
  /* a sub-range of output rows (n0 > 0) gives the same columns */
  if (N > 5) {
    float *ys = malloc(sizeof(float) * (size_t)(M * (N - 5)));
    di_cpu_gemm(tp, x, M, K, &tw.w, 5, N, ys, N - 5);
    int sub = 1;
    for (int64_t m = 0; m < M; m++) sub &= memcmp(ys + m * (N - 5), y + m * N + 5, sizeof(float) * (size_t)(N - 5)) == 0;
    CHECKF(sub, "gemm dtype %d M=%lld: the rows [5, N) differ from the full product's", (int)dt, (long long)M);
    free(ys);
  }
  free(x); free(y); free(y1); free(tw.data); free(tw.scales);
}

static void check_multi(di_threadpool *tp) {
  /* two jobs in one loop == each alone */
  test_weight a = make_weight(DI_DT_BF16, 67, 96, 0), b = make_weight(DI_DT_F32, 30, 40, 0);
  const int64_t M = 11;
  float *xa = malloc(sizeof(float) * (size_t)(M * 96)), *xb = malloc(sizeof(float) * (size_t)(M * 40));
  for (int64_t i = 0; i < M * 96; i++) xa[i] = urand();
  for (int64_t i = 0; i < M * 40; i++) xb[i] = urand();
  float *ya = malloc(sizeof(float) * (size_t)(M * 67)), *yb = malloc(sizeof(float) * (size_t)(M * 30));
  float *ra = malloc(sizeof(float) * (size_t)(M * 67)), *rb = malloc(sizeof(float) * (size_t)(M * 30));
  const di_gemm_job jobs[2] = {{xa, M, 96, &a.w, 0, 67, ya, 67}, {xb, M, 40, &b.w, 0, 30, yb, 30}};
  di_cpu_gemm_multi(tp, jobs, 2);
  di_cpu_gemm(tp, xa, M, 96, &a.w, 0, 67, ra, 67);
  di_cpu_gemm(tp, xb, M, 40, &b.w, 0, 30, rb, 30);
  CHECK(memcmp(ya, ra, sizeof(float) * (size_t)(M * 67)) == 0);
  CHECK(memcmp(yb, rb, sizeof(float) * (size_t)(M * 30)) == 0);
  free(xa); free(xb); free(ya); free(yb); free(ra); free(rb); free(a.data); free(b.data);
}

static void check_dot4(void) {
  for (int n = 1; n < 300; n += 37) {
    float *a = malloc(sizeof(float) * (size_t)n), *v[4];
    for (int i = 0; i < n; i++) a[i] = urand();
    for (int j = 0; j < 4; j++) {
      v[j] = malloc(sizeof(float) * (size_t)n);
      for (int i = 0; i < n; i++) v[j][i] = urand();
    }
    float out[4];
    di_cpu_dot4(a, (const float *const *)v, n, out);
    for (int j = 0; j < 4; j++) {
      const float one = di_cpu_dot(v[j], a, n); /* either argument order: the same products */
      CHECKF(memcmp(&one, &out[j], sizeof one) == 0, "dot4 n=%d vector %d: %.9g vs %.9g", n, j, out[j], one);
      free(v[j]);
    }
    free(a);
  }
}

static void check_scratch(void) {
  di_threadpool *tp;
  CHECK(di_threadpool_create(3, &tp) == DI_OK);
  CHECK(di_threadpool_scratch(NULL, 0, 64) == NULL);
  CHECK(di_threadpool_scratch(tp, 3, 64) == NULL); /* no such thread index */
  void *a = di_threadpool_scratch(tp, 1, 1000), *b = di_threadpool_scratch(tp, 2, 1000);
  CHECK(a && b && a != b && ((uintptr_t)a & 63) == 0);
  CHECK(di_threadpool_scratch(tp, 1, 500) == a); /* kept while large enough */
  void *c = di_threadpool_scratch(tp, 1, 1 << 20);
  CHECK(c && ((uintptr_t)c & 63) == 0);
  memset(c, 1, 1 << 20);
  di_threadpool_free(tp);
}

int main(void) {
  di_threadpool *tp1, *tp3;
  CHECK(di_threadpool_create(1, &tp1) == DI_OK);
  CHECK(di_threadpool_create(3, &tp3) == DI_OK);
  const int64_t Ms[] = {1, 2, 3, 8, 13, 40};
  const struct { int64_t N, K; } shapes[] = {{1, 16}, {7, 64}, {50, 100}, {97, 256}, {130, 1536}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
      di_threadpool *tp = (i + s) % 2 ? tp3 : tp1;
      check_case(tp, DI_DT_BF16, Ms[i], shapes[s].N, shapes[s].K, 0);
      check_case(tp, DI_DT_F32, Ms[i], shapes[s].N, shapes[s].K, 0);
      if (shapes[s].K <= 256) {
        check_case(tp, DI_DT_F16, Ms[i], shapes[s].N, shapes[s].K, 0);
        check_case(tp, DI_DT_F8E4M3, Ms[i], shapes[s].N, shapes[s].K, 8);
        check_case(tp, DI_DT_F8E4M3, Ms[i], shapes[s].N, shapes[s].K, 128);
        check_case(tp, DI_DT_F8E4M3, Ms[i], shapes[s].N, shapes[s].K, 12); /* blocks off the 8-grid: scalar */
      }
    }
  check_case(NULL, DI_DT_BF16, 20, 33, 64, 0); /* no pool: the tile form for many rows too */
  check_multi(tp3);
  check_dot4();
  check_scratch();
  di_threadpool_free(tp1);
  di_threadpool_free(tp3);
  return test_finish("test_cpu_gemm");
}
