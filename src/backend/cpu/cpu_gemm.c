/* See cpu_gemm.h. Every di_weight format is read in place (FP8 with F32 or E8M0 block scales, MXFP4). Tiles of 4 weight rows x 2 activation rows keep 8 accumulators, 4 converted
 * weight vectors and 2 activation vectors in the 16 YMM registers; the weight row is converted to
 * float32 once per tile and reused for both activation rows. */
#include "backend/cpu/cpu_gemm.h"
#include "util/numeric.h"
#include <immintrin.h>
#include <string.h>

#define NR 4
#define MR 2

static inline float hsum8(__m256 v) {
  /* fixed order: (v0+v4, v1+v5, v2+v6, v3+v7) then pairwise */
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehl_ps(s, s);
  s = _mm_add_ps(s, sh);
  sh = _mm_shuffle_ps(s, s, 1);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

typedef struct {
  const float *x;
  int64_t M, ldx;
  const di_weight *w;
  int64_t n0;
  float *y;
  int64_t ldy;
  di_threadpool *tp; /* its per-thread scratch holds the weight panel */
} gemm_ctx;

/* ---- the prefill form: weight panels converted once, 4 x 3 register tiles ----------------------
 * With many activation rows (M >= PANEL_MIN_M: prefill, experts with several tokens) the per-tile
 * conversion of the weights (bf16 / fp8 -> f32: 2-3 instructions per 8 weights, reused for only 2
 * activation rows) and the activations streamed from L3 once per 4 weight rows made the loop
 * conversion- and cache-bound. Here a panel of up to 48 weight rows is converted into a 256 KB buffer
 * (the thread pool's per-thread scratch; it stays in L2; 128 KB measured 266 vs 273 tok/s), and 4 activation rows x 3 weight rows are multiplied from it with 12
 * accumulators (16 YMM registers with the 3 weight and 1 activation vectors). Each output is still
 * fma(x[k..k+8], w[k..k+8], acc) over k in order, hsum8, then the scalar tail: bit-equal to the
 * one-row path, so batch invariance holds. */
#define PANEL_MIN_M 8
#define PANEL_FLOATS 65536
#define PANEL_MAX_ROWS 48

static inline void panel_store(const gemm_ctx *c, int64_t m, int64_t col, int64_t n, __m256 acc, int64_t K8) {
  const di_weight *w = c->w;
  float s = hsum8(acc);
  const float *xr = c->x + m * c->ldx;
  for (int64_t k = K8; k < w->cols; k++)
    s += xr[k] * di_weight_get(w, n, k);
  c->y[m * c->ldy + col] = s;
}

/* One MI x NJ tile (MI <= 4 activation rows from m, NJ <= 3 converted weight rows from j): MI x NJ
 * accumulators. Always inlined with constant MI, NJ, so the loops unroll and the accumulators stay in
 * registers (4 x 3: 12 + 3 weight + 1 activation vectors = the 16 YMM registers). */
static inline __attribute__((always_inline)) void panel_tile(const gemm_ctx *c, const float *wp, int64_t n,
                                                             int64_t nb, int64_t K8, int64_t m, int j, int MI,
                                                             int NJ) {
  const float *xr[4], *wr[3];
  for (int i = 0; i < MI; i++) xr[i] = c->x + (m + i) * c->ldx;
  for (int jj = 0; jj < NJ; jj++) wr[jj] = wp + (j + jj) * K8;
  __m256 acc[4][3];
  for (int i = 0; i < MI; i++)
    for (int jj = 0; jj < NJ; jj++) acc[i][jj] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 v[3];
    for (int jj = 0; jj < NJ; jj++) v[jj] = _mm256_load_ps(wr[jj] + k);
    for (int i = 0; i < MI; i++) {
      const __m256 xv = _mm256_loadu_ps(xr[i] + k);
      for (int jj = 0; jj < NJ; jj++) acc[i][jj] = _mm256_fmadd_ps(xv, v[jj], acc[i][jj]);
    }
  }
  for (int i = 0; i < MI; i++)
    for (int jj = 0; jj < NJ; jj++) panel_store(c, m + i, nb + j + jj, n + j + jj, acc[i][jj], K8);
}

/* y rows [0, M) x columns nb .. nb + np of weight rows n .. n + np, converted in wp [np][K8]:
 * 4 x 3 tiles, then the panel's last rows 4 x 1, then the last activation rows 1 x 1 */
static void panel_rows(const gemm_ctx *c, const float *wp, int np, int64_t n, int64_t nb, int64_t K8) {
  int64_t m = 0;
  for (; m + 4 <= c->M; m += 4) {
    int j = 0;
    for (; j + 3 <= np; j += 3) panel_tile(c, wp, n, nb, K8, m, j, 4, 3);
    for (; j < np; j++) panel_tile(c, wp, n, nb, K8, m, j, 4, 1);
  }
  for (; m < c->M; m++)
    for (int j = 0; j < np; j++) panel_tile(c, wp, n, nb, K8, m, j, 1, 1);
}

/* FP8 blocks narrower than 8 columns or not 8-aligned would put two scales in one vector; such
 * weights take the scalar path for every column (the per-element order is still fixed). MXFP4's
 * blocks are 32 wide. */
static int vector_ok(const di_weight *w) {
  return w->dtype != DI_DT_F8E4M3 || (w->block_cols % 8) == 0;
}

/* 8 MXFP4 values (4 bytes, low nibble first) times their block's scale: exact (an E2M1 value times a
 * power of two) */
static inline __m256 load_mxfp4(const uint8_t *p, float scale) {
  uint32_t v;
  memcpy(&v, p, 4);
  const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)v), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(15));
  return _mm256_mul_ps(_mm256_i32gather_ps(di_e2m1_table, idx, 4), _mm256_set1_ps(scale));
}

/* One kernel per storage type, so the inner loop has no type dispatch. LOADW(r, k) yields 8
 * float32 weights of row r from column k. */
#define GEMM_KERNEL(NAME, LOADW)                                                                \
  static void NAME(const gemm_ctx *c, int64_t b, int64_t e, float *wp) {                       \
    const di_weight *w = c->w;                                                                  \
    const int64_t K = w->cols, K8 = vector_ok(w) ? K & ~(int64_t)7 : 0;                         \
    if (wp && K8 > 0 && 3 * K8 <= PANEL_FLOATS) {                                               \
      int64_t np_max = PANEL_FLOATS / K8;                                                       \
      np_max = np_max > PANEL_MAX_ROWS ? PANEL_MAX_ROWS : np_max - np_max % 3;                  \
      for (int64_t nb = b; nb < e; nb += np_max) {                                              \
        const int np = (int)(e - nb < np_max ? e - nb : np_max);                                \
        const int64_t n = c->n0 + nb;                                                           \
        for (int j = 0; j < np; j++)                                                            \
          for (int64_t k = 0; k < K8; k += 8)                                                   \
            _mm256_store_ps(wp + j * K8 + k, LOADW(n + j, k));                                  \
        panel_rows(c, wp, np, n, nb, K8);                                                       \
      }                                                                                         \
      return;                                                                                   \
    }                                                                                           \
    for (int64_t nb = b; nb < e; nb += NR) {                                                    \
      const int nr = (int)(e - nb < NR ? e - nb : NR);                                          \
      const int64_t n = c->n0 + nb;                                                             \
      for (int64_t m = 0; m < c->M; m += MR) {                                                  \
        const int mr = (int)(c->M - m < MR ? c->M - m : MR);                                    \
        __m256 acc[MR][NR];                                                                     \
        for (int i = 0; i < MR; i++)                                                            \
          for (int j = 0; j < NR; j++)                                                          \
            acc[i][j] = _mm256_setzero_ps();                                                    \
        if (nr == NR && mr == MR) {                                                             \
          const float *x0 = c->x + m * c->ldx, *x1 = x0 + c->ldx;                               \
          for (int64_t k = 0; k < K8; k += 8) {                                                 \
            const __m256 w0 = LOADW(n, k), w1 = LOADW(n + 1, k), w2 = LOADW(n + 2, k),          \
                         w3 = LOADW(n + 3, k);                                                  \
            const __m256 xa = _mm256_loadu_ps(x0 + k), xb = _mm256_loadu_ps(x1 + k);            \
            acc[0][0] = _mm256_fmadd_ps(xa, w0, acc[0][0]);                                     \
            acc[0][1] = _mm256_fmadd_ps(xa, w1, acc[0][1]);                                     \
            acc[0][2] = _mm256_fmadd_ps(xa, w2, acc[0][2]);                                     \
            acc[0][3] = _mm256_fmadd_ps(xa, w3, acc[0][3]);                                     \
            acc[1][0] = _mm256_fmadd_ps(xb, w0, acc[1][0]);                                     \
            acc[1][1] = _mm256_fmadd_ps(xb, w1, acc[1][1]);                                     \
            acc[1][2] = _mm256_fmadd_ps(xb, w2, acc[1][2]);                                     \
            acc[1][3] = _mm256_fmadd_ps(xb, w3, acc[1][3]);                                     \
          }                                                                                     \
        } else if (nr == NR && mr == 1) {                                                       \
          const float *x0 = c->x + m * c->ldx;                                                  \
          const char *pf = (const char *)w->data + (n + NR) * K * (int64_t)di_dtype_size(w->dtype); \
          const int64_t pf_end = (int64_t)(e - nb > NR ? NR : 0) * K * (int64_t)di_dtype_size(w->dtype); \
          const int64_t pf_step = pf_end / (K8 / 8 > 0 ? K8 / 8 : 1) + 1;                       \
          int64_t pf_off = 0;                                                                   \
          for (int64_t k = 0; k < K8; k += 8) {                                                 \
            /* prefetch the next row group while this one streams (decode is bandwidth-bound) */ \
            if (pf_off < pf_end) {                                                              \
              _mm_prefetch(pf + pf_off, _MM_HINT_T0);                                           \
              pf_off += pf_step > 64 ? 64 : pf_step;                                            \
            }                                                                                   \
            const __m256 xa = _mm256_loadu_ps(x0 + k);                                          \
            acc[0][0] = _mm256_fmadd_ps(xa, LOADW(n, k), acc[0][0]);                            \
            acc[0][1] = _mm256_fmadd_ps(xa, LOADW(n + 1, k), acc[0][1]);                        \
            acc[0][2] = _mm256_fmadd_ps(xa, LOADW(n + 2, k), acc[0][2]);                        \
            acc[0][3] = _mm256_fmadd_ps(xa, LOADW(n + 3, k), acc[0][3]);                        \
          }                                                                                     \
        } else {                                                                                \
          for (int64_t k = 0; k < K8; k += 8)                                                   \
            for (int j = 0; j < nr; j++) {                                                      \
              const __m256 wv = LOADW(n + j, k);                                                \
              for (int i = 0; i < mr; i++)                                                      \
                acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(c->x + (m + i) * c->ldx + k), wv,   \
                                            acc[i][j]);                                         \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < mr; i++)                                                            \
          for (int j = 0; j < nr; j++) {                                                        \
            float s = hsum8(acc[i][j]);                                                         \
            const float *xr = c->x + (m + i) * c->ldx;                                          \
            for (int64_t k = K8; k < K; k++)                                                    \
              s += xr[k] * di_weight_get(w, n + j, k);                                          \
            c->y[(m + i) * c->ldy + (nb + j)] = s;                                              \
          }                                                                                     \
      }                                                                                         \
    }                                                                                           \
  }

#define LOAD_BF16(r, k)                                                                         \
  _mm256_castsi256_ps(_mm256_slli_epi32(                                                        \
      _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wd16 + (r) * K + (k)))), 16))
#define LOAD_F16(r, k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd16 + (r) * K + (k))))
#define LOAD_F32(r, k) _mm256_loadu_ps(wd32 + (r) * K + (k))
#define LOAD_FP8(r, k)                                                                          \
  _mm256_mul_ps(_mm256_i32gather_ps(di_fp8e4m3_table,                                           \
                                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(                       \
                                        (const __m128i *)(wd8 + (r) * K + (k)))),               \
                                    4),                                                         \
                _mm256_set1_ps(w->scale_inv[((r) / w->block_rows) * w->scale_cols + (k) / w->block_cols]))

#define FP8_SCALE_IDX(r, k) (((r) / w->block_rows) * w->scale_cols + (k) / w->block_cols)
#define LOAD_FP8_E8M0(r, k)                                                                     \
  _mm256_mul_ps(_mm256_i32gather_ps(di_fp8e4m3_table,                                           \
                                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(                       \
                                        (const __m128i *)(wd8 + (r) * K + (k)))),               \
                                    4),                                                         \
                _mm256_set1_ps(di_e8m0_to_f32(w->scale_e8m0[FP8_SCALE_IDX(r, k)])))
#define LOAD_MXFP4(r, k) load_mxfp4(wd8 + (r) * (K / 2) + (k) / 2, di_e8m0_to_f32(w->scale_e8m0[FP8_SCALE_IDX(r, k)]))

#define wd16 ((const uint16_t *)w->data)
#define wd32 ((const float *)w->data)
#define wd8 ((const uint8_t *)w->data)
GEMM_KERNEL(gemm_bf16, LOAD_BF16)
GEMM_KERNEL(gemm_f16, LOAD_F16)
GEMM_KERNEL(gemm_f32, LOAD_F32)
GEMM_KERNEL(gemm_fp8, LOAD_FP8)
GEMM_KERNEL(gemm_fp8_e8m0, LOAD_FP8_E8M0)
GEMM_KERNEL(gemm_mxfp4, LOAD_MXFP4)
#undef wd16
#undef wd32
#undef wd8

static void gemm_rows(void *p, int64_t b, int64_t e, int thread) {
  const gemm_ctx *c = p;
  /* the panel form when there are rows enough and a buffer (none without a pool: the tile form) */
  float *wp = c->M >= PANEL_MIN_M ? di_threadpool_scratch(c->tp, thread, sizeof(float) * PANEL_FLOATS) : NULL;
  switch (c->w->dtype) {
  case DI_DT_BF16: gemm_bf16(c, b, e, wp); break;
  case DI_DT_F16: gemm_f16(c, b, e, wp); break;
  case DI_DT_F8E4M3:
    if (c->w->scale_e8m0) gemm_fp8_e8m0(c, b, e, wp);
    else gemm_fp8(c, b, e, wp);
    break;
  case DI_DT_F4E2M1: gemm_mxfp4(c, b, e, wp); break;
  default: gemm_f32(c, b, e, wp); break;
  }
}

void di_cpu_gemm(di_threadpool *tp, const float *x, int64_t M, int64_t ldx, const di_weight *w, int64_t n0,
                 int64_t n1, float *y, int64_t ldy) {
  gemm_ctx c = {x, M, ldx, w, n0, y, ldy, tp};
  int64_t N = n1 - n0;
  /* tasks are whole NR-row groups so tiles never straddle threads */
  int64_t groups = (N + NR - 1) / NR;
  (void)groups;
  int64_t grain = 64 * 1024 / (w->cols > 0 ? w->cols : 1);
  if (grain < NR)
    grain = NR;
  if (M >= PANEL_MIN_M && grain < PANEL_MAX_ROWS) /* whole weight panels per task */
    grain = PANEL_MAX_ROWS;
  grain = (grain + NR - 1) / NR * NR;
  di_parallel_for(tp, N, grain, gemm_rows, &c);
}

void di_cpu_gemm_in_task(di_threadpool *tp, int thread, const float *x, int64_t M, int64_t ldx, const di_weight *w,
                         int64_t n0, int64_t n1, float *y, int64_t ldy) {
  gemm_ctx c = {x, M, ldx, w, n0, y, ldy, tp};
  if (n1 > n0) gemm_rows(&c, 0, n1 - n0, thread);
}

/* The multi-job loop runs over units of NR output rows of all jobs laid end to end. */
typedef struct {
  di_threadpool *tp;
  const di_gemm_job *jobs;
  int n_jobs;
  const int64_t *unit_start; /* [n_jobs + 1] first unit of each job */
} multi_ctx;

static void multi_rows(void *p, int64_t b, int64_t e, int thread) {
  const multi_ctx *mc = p;
  int j = 0;
  while (j + 1 < mc->n_jobs && mc->unit_start[j + 1] <= b)
    j++;
  for (int64_t u = b; u < e;) {
    while (mc->unit_start[j + 1] <= u)
      j++;
    const di_gemm_job *jb = &mc->jobs[j];
    int64_t ue = e < mc->unit_start[j + 1] ? e : mc->unit_start[j + 1];
    int64_t r0 = (u - mc->unit_start[j]) * NR, r1 = (ue - mc->unit_start[j]) * NR;
    if (r1 > jb->n1 - jb->n0)
      r1 = jb->n1 - jb->n0;
    gemm_ctx c = {jb->x, jb->M, jb->ldx, jb->w, jb->n0, jb->y, jb->ldy, mc->tp};
    gemm_rows(&c, r0, r1, thread);
    u = ue;
  }
}

void di_cpu_gemm_multi(di_threadpool *tp, const di_gemm_job *jobs, int n_jobs) {
  if (n_jobs <= 0)
    return;
  int64_t starts[257], *st = n_jobs < 256 ? starts : malloc(sizeof(int64_t) * (size_t)(n_jobs + 1));
  if (!st) { /* fall back to one loop per job */
    for (int j = 0; j < n_jobs; j++)
      di_cpu_gemm(tp, jobs[j].x, jobs[j].M, jobs[j].ldx, jobs[j].w, jobs[j].n0, jobs[j].n1, jobs[j].y, jobs[j].ldy);
    return;
  }
  st[0] = 0;
  int64_t work = 0, max_m = 0;
  for (int j = 0; j < n_jobs; j++) {
    st[j + 1] = st[j] + (jobs[j].n1 - jobs[j].n0 + NR - 1) / NR;
    work += (jobs[j].n1 - jobs[j].n0) * jobs[j].w->cols * (jobs[j].M > 0 ? jobs[j].M : 1);
    if (jobs[j].M > max_m)
      max_m = jobs[j].M;
  }
  multi_ctx mc = {tp, jobs, n_jobs, st};
  /* about 64K multiply-adds per task at least; whole weight panels when the panel form runs */
  int64_t units = st[n_jobs], grain = units > 0 ? (64 * 1024) / (work / units + 1) : 1;
  if (max_m >= PANEL_MIN_M && grain < PANEL_MAX_ROWS / NR)
    grain = PANEL_MAX_ROWS / NR;
  di_parallel_for(tp, units, grain < 1 ? 1 : grain, multi_rows, &mc);
  if (st != starts)
    free(st);
}

void di_cpu_gemm_f32(di_threadpool *tp, const float *x, int64_t M, int64_t ldx, const float *W, int64_t N,
                     int64_t K, float *y, int64_t ldy) {
  di_weight w = {.name = "f32", .dtype = DI_DT_F32, .rows = N, .cols = K, .data = W};
  di_cpu_gemm(tp, x, M, ldx, &w, 0, N, y, ldy);
}

float di_cpu_dot(const float *a, const float *b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t n8 = n & ~(int64_t)7, k = 0;
  for (; k < n8; k += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  float s = hsum8(acc);
  for (; k < n; k++)
    s += a[k] * b[k];
  return s;
}

void di_cpu_dot4(const float *a, const float *const b[4], int64_t n, float out[4]) {
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  const int64_t n8 = n & ~(int64_t)7;
  for (int64_t k = 0; k < n8; k += 8) {
    const __m256 av = _mm256_loadu_ps(a + k);
    c0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b[0] + k), c0);
    c1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b[1] + k), c1);
    c2 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b[2] + k), c2);
    c3 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b[3] + k), c3);
  }
  const __m256 acc[4] = {c0, c1, c2, c3};
  for (int i = 0; i < 4; i++) {
    float s = hsum8(acc[i]);
    for (int64_t k = n8; k < n; k++)
      s += a[k] * b[i][k];
    out[i] = s;
  }
}

void di_cpu_gemm_selected(di_threadpool *tp, float *x, int64_t M, int64_t ldx, const uint8_t *want, const di_weight *w,
                          int64_t N, float *y, int64_t ldy) {
  if (!want) {
    di_cpu_gemm(tp, x, M, ldx, w, 0, N, y, ldy);
    return;
  }
  int64_t m = 0;
  for (int64_t i = 0; i < M; i++)
    if (want[i]) {
      if (m != i) memcpy(x + m * ldx, x + i * ldx, sizeof(float) * (size_t)ldx);
      m++;
    }
  if (m == 0) return;
  di_cpu_gemm(tp, x, m, ldx, w, 0, N, y, ldy);
  /* back to the rows' places, from the last (a row's place is never before its compact index) */
  for (int64_t i = M - 1; i >= 0 && m > 0; i--)
    if (want[i] && --m != i) memcpy(y + i * ldy, y + m * ldy, sizeof(float) * (size_t)N);
}
