/* The DSpark drafter on CUDA against the CPU's (the reference: float32 throughout, float64-checked GQA
 * in tests/unit/test_gqa.c), then its cost at a DeepSeek-V2-Lite-sized shape.
 *  1. the target's feature capture (layers -1, 1 and the last, after the final norm) of a CUDA step:
 *     the last layer's against the step's own final normed rows (what wait() returns without a
 *     capture, in bf16): rel L2 < 8e-3 (bf16 rounding); every layer against the CPU backend's on the
 *     same 40-token batch: rel L2 < 5e-2 (the drift of bf16 GEMM operands over the layers: 0.4% after
 *     layer 1, 2.8% after the last, measured on the H200);
 *  2. the shipped drafter (models/default/dspark): context rows of two sequences (100 and 70 positions,
 *     block tables out of order), then one block each: hidden rows and base logits against the CPU
 *     forward, rel L2 < 3e-2; a proposal with half its rows' logits unwanted writes none of those rows
 *     and the wanted ones bit-identical to the full proposal; greedy drafts made on the device
 *     (di_cuda_dspark_draft_greedy: Markov term, argmax, confidence head, caps 5 and 3) equal the CPU
 *     heads applied on the host to the same base logits (tokens equal unless the top two are within
 *     1e-3, confidences within 1e-4);
 *  3. timing (printed, not held): context of 512 positions and proposals of 1 / 8 / 64 blocks for a
 *     random drafter of V2-Lite's width (hidden 2048, 5 layers, 16 heads over 4 KV heads of 128, MLP
 *     6144, block 7, vocab 102400, 3 target layers), with and without the logits copied to the host,
 *     and its parts at 64 blocks (448 rows): the attention kernel over 512 cached positions, the output
 *     head's GEMM and one layer's GEMMs, each alone on the default stream. 
 * Built only with nvcc; run on the device (tests/cuda: not in CI). */
#include "deepinfer.h"
#include "api/model_internal.h"
#include "arch/dspark.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dspark.h"
#include "backend/cuda/cuda_dspark.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/k_dspark.h"
#include "util/numeric.h"
#include "test_util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rs = 2207;
static float frand(void) { /* uniform in [-1, 1) */
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static di_model *load(const char *acc) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.accelerator = acc;
  di_model *m = NULL;
  di_status s = di_model_load(test_path("models/default"), &mo, &m);
  CHECKF(s == DI_OK, "models/default on %s: %s", acc, di_last_error());
  return s == DI_OK ? m : NULL;
}

static void capture(di_model *cpu, di_model *cu) {
  enum { T = 40 };
  const int L = cpu->cfg.num_hidden_layers, H = cpu->cfg.hidden_size;
  const int ids[3] = {-1, 1, L - 1};
  CHECK(di_cpu_backend_set_capture(cpu->backend, ids, 3) == DI_OK);
  CHECKF(di_backend_cuda_set_capture(cu->backend, ids, 3) == DI_OK, "%s", di_last_error());
  int32_t tok[T], pos[T], seq_of[T], rows[T], table[1] = {3};
  for (int t = 0; t < T; t++) {
    tok[t] = 3 + (int32_t)((frand() + 1) * 3000);
    pos[t] = t;
    seq_of[t] = 0;
    rows[t] = t;
  }
  di_batch_seq sq = {table, 1, 1};
  di_batch b = {.n_tokens = T, .tokens = tok, .positions = pos, .seq_of = seq_of, .n_seqs = 1, .seqs = &sq,
                .n_outputs = T, .output_rows = rows};
  static float ha[T * 3 * 1024], hb[T * 3 * 1024], hn[T * 1024];
  di_model *ms[2] = {cpu, cu};
  float *out[2] = {ha, hb};
  for (int k = 0; k < 2; k++) {
    di_backend *be = ms[k]->backend;
    CHECKF(be->ops->kv_alloc(be, 8) == DI_OK, "%s", di_last_error());
    CHECKF(be->ops->submit(be, &b) == DI_OK, "%s", di_last_error());
    CHECKF(be->ops->wait(be, NULL, out[k]) == DI_OK, "%s", di_last_error());
  }
  /* the same step on CUDA without the capture: its final normed rows */
  di_backend_cuda_set_capture(cu->backend, NULL, 0);
  CHECKF(cu->backend->ops->submit(cu->backend, &b) == DI_OK, "%s", di_last_error());
  CHECKF(cu->backend->ops->wait(cu->backend, NULL, hn) == DI_OK, "%s", di_last_error());
  {
    static float last[T * 1024];
    for (int t = 0; t < T; t++) memcpy(last + (size_t)t * H, hb + ((size_t)t * 3 + 2) * H, sizeof(float) * (size_t)H);
    double e = test_rel_l2(last, hn, (size_t)T * H);
    CHECKF(e < 8e-3, "capture of the last layer vs the step's own final normed rows: rel L2 %.3g", e);
    printf("capture of the last layer vs the CUDA step's final normed rows (bf16): rel L2 %.2e\n", e);
  }
  for (int c = 0; c < 3; c++) { /* per captured layer */
    static float a[T * 1024], g[T * 1024];
    for (int t = 0; t < T; t++) {
      memcpy(a + (size_t)t * H, ha + ((size_t)t * 3 + c) * H, sizeof(float) * (size_t)H);
      memcpy(g + (size_t)t * H, hb + ((size_t)t * 3 + c) * H, sizeof(float) * (size_t)H);
    }
    double e = test_rel_l2(g, a, (size_t)T * H);
    CHECKF(e < 5e-2, "capture of layer %d vs the CPU backend: rel L2 %.3g", ids[c], e);
    printf("capture of layer %2d vs the CPU backend: rel L2 %.2e\n", ids[c], e);
  }
  di_cpu_backend_set_capture(cpu->backend, NULL, 0);
  di_backend_cuda_set_capture(cu->backend, NULL, 0);
}

static void shipped_drafter(di_model *cu) {
  di_dspark *w = NULL;
  di_status s = di_dspark_load(test_path("models/default/dspark"), &cu->cfg, &cu->weights.embed, &cu->weights.lm_head, &w);
  CHECKF(s == DI_OK, "%s", di_last_error());
  if (s != DI_OK) return;
  di_cpu_dspark *cpu = NULL;
  di_cuda_dspark *gpu = NULL;
  CHECK(di_cpu_dspark_create(w, NULL, &cpu) == DI_OK);
  CHECKF(di_cuda_dspark_create(cu->backend, w, &gpu) == DI_OK, "%s", di_last_error());
  if (!cpu || !gpu) return;
  CHECK(di_cpu_dspark_kv_alloc(cpu, 16) == DI_OK);
  CHECK(di_cuda_dspark_kv_alloc(gpu, 16) == DI_OK);
  const int F = w->n_feats * w->target_hidden, B = w->block_size, H = w->hidden, V = w->vocab;
  /* drafter-group tables (blocks of DI_DRAFTER_BLOCK_TOKENS = 16 positions), ids scattered over the
   * 16-block cache: positions 0..99 and 0..69 */
  int32_t t0[7] = {13, 2, 9, 0, 15, 4, 11}, t1[5] = {7, 1, 12, 3, 8};
  di_batch_seq seqs[2] = {{t0, 7, 1}, {t1, 5, 2}};
  const int len[2] = {100, 70}, n = len[0] + len[1];
  float *feats = malloc(sizeof(float) * (size_t)n * F);
  int32_t pos[170], seq_of[170];
  for (int i = 0, r = 0; i < 2; i++)
    for (int p = 0; p < len[i]; p++, r++) {
      pos[r] = p;
      seq_of[r] = i;
    }
  for (size_t i = 0; i < (size_t)n * F; i++) feats[i] = 2 * frand();
  CHECK(di_cpu_dspark_context(cpu, n, feats, pos, seq_of, seqs) == DI_OK);
  CHECKF(di_cuda_dspark_context(gpu, n, feats, pos, seq_of, seqs) == DI_OK, "%s", di_last_error());
  int32_t tok[2] = {812, 4051}, apos[2] = {len[0], len[1]};
  const size_t R = 2 * (size_t)B;
  float *hc = malloc(sizeof(float) * R * H), *hg = malloc(sizeof(float) * R * H);
  float *lc = malloc(sizeof(float) * R * V), *lg = malloc(sizeof(float) * R * V), *lw = malloc(sizeof(float) * R * V);
  CHECK(di_cpu_dspark_propose(cpu, 2, tok, apos, seqs, hc, lc) == DI_OK);
  CHECKF(di_cuda_dspark_propose(gpu, 2, tok, apos, seqs, NULL, hg, lg) == DI_OK, "%s", di_last_error());
  double eh = test_rel_l2(hg, hc, R * H), el = test_rel_l2(lg, lc, R * V);
  CHECKF(eh < 3e-2 && el < 3e-2, "shipped drafter on CUDA vs CPU: hidden rel L2 %.3g, logits %.3g", eh, el);
  int agree = 0;
  for (size_t r = 0; r < R; r++) agree += test_argmax(lg + r * V, V) == test_argmax(lc + r * V, V);
  printf("shipped drafter, CUDA vs CPU: hidden rel L2 %.2e, logits %.2e, argmax equal on %d of %d rows\n", eh, el, agree,
         (int)R);
  { /* greedy drafts on the device vs the CPU heads on the host, from the same base logits (lg) */
    int32_t cap[2] = {B, 3}, dt[64];
    float dc[64];
    CHECKF(di_cuda_dspark_draft_greedy(gpu, 2, tok, cap, V, dt, dc) == DI_OK, "%s", di_last_error());
    float *row = malloc(sizeof(float) * (size_t)V);
    int compared = 0;
    for (int i = 0; i < 2; i++) {
      int32_t prev = tok[i];
      for (int j = 0; j < B; j++) {
        if (j >= cap[i]) {
          CHECKF(dt[i * B + j] == -1, "greedy drafts: block %d round %d past its cap: %d", i, j, dt[i * B + j]);
          continue;
        }
        memcpy(row, lg + ((size_t)i * B + j) * V, sizeof(float) * (size_t)V);
        di_cpu_dspark_markov(cpu, prev, row);
        float c = di_cpu_dspark_confidence(cpu, hg + ((size_t)i * B + j) * H, prev);
        int t = test_argmax(row, V);
        float second = -INFINITY;
        for (int v = 0; v < V; v++) if (v != t && row[v] > second) second = row[v];
        CHECKF(fabsf(c - dc[i * B + j]) < 1e-4f, "greedy drafts: block %d round %d confidence %g vs %g on the host", i, j,
               dc[i * B + j], c);
        if (dt[i * B + j] != t) {
          CHECKF(row[t] - second < 1e-3f, "greedy drafts: block %d round %d token %d vs %d on the host (margin %g)", i, j,
                 dt[i * B + j], t, row[t] - second);
          break; /* a near-tie: the rounds after it follow another token */
        }
        compared++;
        prev = t;
      }
    }
    printf("greedy drafts on the device: %d of %d drafts compared equal to the host's\n", compared, B + 3);
    free(row);
  }
  uint8_t want[64];
  for (size_t r = 0; r < R; r++) want[r] = (uint8_t)(r % 2);
  for (size_t i = 0; i < R * V; i++) lw[i] = 12345.f;
  CHECKF(di_cuda_dspark_propose(gpu, 2, tok, apos, seqs, want, hg, lw) == DI_OK, "%s", di_last_error());
  int bad = 0;
  for (size_t r = 0; r < R; r++)
    for (int v = 0; v < V; v++) bad += want[r] ? lw[r * V + v] != lg[r * V + v] : lw[r * V + v] != 12345.f;
  CHECKF(bad == 0, "proposal with unwanted rows: %d logits differ from the full proposal or were written", bad);
  free(feats); free(hc); free(hg); free(lc); free(lg); free(lw);
  di_cuda_dspark_free(gpu);
  di_cpu_dspark_free(cpu);
  di_dspark_free(w);
}

/* a random drafter of V2-Lite's width, every matrix a view of one random bf16 buffer */
static void v2lite_cost(di_model *cu) {
  const int H = 2048, NL = 5, NH = 16, NKV = 4, HD = 128, I = 6144, B = 7, V = 102400, NF = 3;
  const size_t big = (size_t)V * H;
  uint16_t *buf = malloc(2 * big);
  float *ones = malloc(sizeof(float) * 8192), *conf = calloc((size_t)H + 64, sizeof(float));
  if (!buf || !ones || !conf) { CHECK(0); return; }
  for (size_t i = 0; i < big; i++) buf[i] = di_f32_to_bf16(0.02f * frand());
  for (int i = 0; i < 8192; i++) ones[i] = 1.f;
  di_dspark d;
  memset(&d, 0, sizeof d);
  d.hidden = H; d.inter = I; d.n_layers = NL; d.n_heads = NH; d.n_kv_heads = NKV; d.head_dim = HD; d.vocab = V;
  d.block_size = B; d.mask_token = 2; d.n_feats = NF; d.target_hidden = H; d.eps = 1e-6f; d.rope_theta = 10000.f;
  for (int i = 0; i < NF; i++) d.feat_layers[i] = i;
#define W(rows_, cols_) ((di_weight){"w", DI_DT_BF16, (rows_), (cols_), buf, NULL, NULL, 0, 0, 0})
  d.fc = W(H, NF * H);
  d.embed = W(V, H);
  d.lm_head = W(V, H);
  d.hidden_norm = d.norm = ones;
  di_dspark_layer layers[5];
  for (int l = 0; l < NL; l++)
    layers[l] = (di_dspark_layer){ones, ones, ones, ones, W(NH * HD, H), W(NKV * HD, H), W(NKV * HD, H), W(H, NH * HD),
                                  W(I, H), W(I, H), W(H, I)};
#undef W
  d.layers = layers;
  di_cuda_dspark *g = NULL;
  di_status s = di_cuda_dspark_create(cu->backend, &d, &g);
  CHECKF(s == DI_OK, "V2-Lite-width drafter: %s", di_last_error());
  if (s != DI_OK) return;
  enum { MAXN = 64, CTX = 512 };
  const int blocks_per = (CTX + B + DI_DRAFTER_BLOCK_TOKENS - 1) / DI_DRAFTER_BLOCK_TOKENS;
  CHECK(di_cuda_dspark_kv_alloc(g, (int64_t)MAXN * blocks_per) == DI_OK);
  int32_t *tables = malloc(sizeof(int32_t) * MAXN * (size_t)blocks_per);
  di_batch_seq seqs[MAXN];
  for (int i = 0; i < MAXN; i++) {
    for (int k = 0; k < blocks_per; k++) tables[i * blocks_per + k] = i * blocks_per + k;
    seqs[i] = (di_batch_seq){tables + (size_t)i * blocks_per, blocks_per, (uint64_t)i};
  }
  float *feats = malloc(sizeof(float) * CTX * NF * (size_t)H);
  for (size_t i = 0; i < (size_t)CTX * NF * H; i++) feats[i] = frand();
  int32_t pos[CTX], seq_of[CTX];
  double t_ctx = 0;
  for (int i = 0; i < MAXN; i++) { /* every sequence's context, one sequence (512 rows) a call */
    for (int p = 0; p < CTX; p++) {
      pos[p] = p;
      seq_of[p] = 0;
    }
    double t = now_s();
    CHECK(di_cuda_dspark_context(g, CTX, feats, pos, seq_of, &seqs[i]) == DI_OK);
    di_cut_sync();
    t_ctx += now_s() - t;
  }
  printf("V2-Lite-width drafter: context rows %.1f us a row (512-row calls, features uploaded from the host)\n",
         t_ctx / (MAXN * CTX) * 1e6);
  float *hid = malloc(sizeof(float) * MAXN * B * (size_t)H), *lg = malloc(sizeof(float) * MAXN * B * (size_t)V);
  int32_t tok[MAXN], ap[MAXN];
  for (int i = 0; i < MAXN; i++) { tok[i] = 100 + i; ap[i] = CTX; }
  const int ns[3] = {1, 8, 64};
  for (int k = 0; k < 3; k++)
    for (int with_logits = 0; with_logits < 2; with_logits++) {
      double best = 1e9;
      for (int rep = 0; rep < 5; rep++) {
        double t = now_s();
        CHECK(di_cuda_dspark_propose(g, ns[k], tok, ap, seqs, NULL, hid, with_logits ? lg : NULL) == DI_OK);
        t = now_s() - t;
        if (t < best) best = t;
      }
      printf("V2-Lite-width drafter: proposal of %2d block(s) of %d at context %d: %.3f ms (%s)\n", ns[k], B, CTX, best * 1e3,
             with_logits ? "hidden + logits to the host" : "hidden to the host only");
    }
  /* what a proposal inside the step's graph does: nothing to the host but the greedy drafts (B rounds
   * of the Markov head, argmax and confidence on the device); here launched eagerly, one upload + sync
   * before and one copy after, so an upper bound of its graph time */
  for (int k = 0; k < 3; k++) {
    int32_t cap[64], dt[64 * 16];
    float dc[64 * 16];
    for (int i = 0; i < ns[k]; i++) cap[i] = B;
    double best = 1e9;
    for (int rep = 0; rep < 5 && B <= 16; rep++) {
      double t = now_s();
      CHECK(di_cuda_dspark_propose(g, ns[k], tok, ap, seqs, NULL, NULL, NULL) == DI_OK);
      CHECK(di_cuda_dspark_draft_greedy(g, ns[k], tok, cap, V, dt, dc) == DI_OK);
      t = now_s() - t;
      if (t < best) best = t;
    }
    printf("V2-Lite-width drafter: proposal of %2d block(s) of %d at context %d with greedy drafts made on the device: %.3f ms "
           "(tokens and confidences to the host only)\n", ns[k], B, CTX, best * 1e3);
  }
  { /* the parts of a 64-block proposal, each alone (zero inputs: only the time is of interest) */
    const int R = MAXN * B, QD = NH * HD, KV = NKV * HD;
    const int64_t nb = (int64_t)MAXN * blocks_per;
    const size_t cache_bytes = sizeof(float) * (size_t)nb * 64 * 2 * KV;
    float *q = di_cut_malloc(sizeof(float) * (size_t)R * QD), *kb = di_cut_malloc(sizeof(float) * (size_t)R * KV);
    float *vb = di_cut_malloc(sizeof(float) * (size_t)R * KV), *cache = di_cut_malloc(cache_bytes);
    int32_t *dbt = di_cut_malloc(sizeof(int32_t) * (size_t)MAXN * blocks_per), *danc = di_cut_malloc(sizeof(int32_t) * MAXN);
    uint16_t *att = di_cut_malloc(2 * (size_t)R * QD), *xw = di_cut_malloc(2 * (size_t)R * I);
    uint16_t *head = di_cut_malloc(2 * (size_t)V * H), *wgu = di_cut_malloc(2 * (size_t)2 * I * H);
    float *y = di_cut_malloc(sizeof(float) * (size_t)R * V);
    di_cu_blas *blas = NULL;
    if (q && kb && vb && cache && dbt && danc && att && xw && head && wgu && y && di_cu_blas_create(&blas) == DI_OK) {
      void *zero = calloc(1, cache_bytes);
      di_cut_h2d(cache, zero, cache_bytes);
      di_cut_h2d(q, zero, sizeof(float) * (size_t)R * QD);
      di_cut_h2d(kb, zero, sizeof(float) * (size_t)R * KV);
      di_cut_h2d(vb, zero, sizeof(float) * (size_t)R * KV);
      di_cut_h2d(xw, zero, 2 * (size_t)R * I);
      di_cut_h2d(head, buf, 2 * (size_t)V * H);
      di_cut_h2d(wgu, buf, 2 * (size_t)2 * I * H);
      di_cut_h2d(dbt, tables, sizeof(int32_t) * (size_t)MAXN * blocks_per);
      di_cut_h2d(danc, ap, sizeof(int32_t) * MAXN);
      free(zero);
      double ta = 1e9, th = 1e9, tl = 1e9;
      for (int rep = 0; rep < 5; rep++) {
        di_cut_sync();
        double t = now_s();
        CHECK(di_cuk_dspark_attend(q, kb, vb, cache, dbt, blocks_per, danc, MAXN, B, NH, NKV, HD, 0.088f, CTX + B, att, NULL) == DI_OK);
        di_cut_sync();
        t = now_s() - t;
        ta = t < ta ? t : ta;
        t = now_s();
        CHECK(di_cu_gemm(blas, R, V, H, xw, H, head, H, y, V, 1, 0.f, NULL) == DI_OK);
        di_cut_sync();
        t = now_s() - t;
        th = t < th ? t : th;
        t = now_s();
        CHECK(di_cu_gemm(blas, R, 2 * I, H, xw, H, wgu, H, y, 2 * I, 0, 0.f, NULL) == DI_OK); /* gate|up, bf16 out */
        CHECK(di_cu_gemm(blas, R, H, I, xw, I, wgu, I, y, H, 1, 1.f, NULL) == DI_OK);         /* down, residual */
        CHECK(di_cu_gemm(blas, R, QD, H, xw, H, wgu, H, y, QD, 1, 0.f, NULL) == DI_OK);       /* q */
        CHECK(di_cu_gemm(blas, R, H, QD, xw, QD, wgu, QD, y, H, 1, 1.f, NULL) == DI_OK);      /* o */
        di_cut_sync();
        t = now_s() - t;
        tl = t < tl ? t : tl;
      }
      printf("V2-Lite-width drafter, 64 blocks (%d rows) alone: attention over %d positions %.3f ms, output head GEMM "
             "%.3f ms, one layer's GEMMs (gate|up, down, q, o) %.3f ms\n", R, CTX, ta * 1e3, th * 1e3, tl * 1e3);
      di_cu_blas_destroy(blas);
    }
    void *ptrs[] = {q, kb, vb, cache, dbt, danc, att, xw, head, wgu, y};
    for (size_t k = 0; k < sizeof ptrs / sizeof *ptrs; k++) di_cut_free(ptrs[k]);
  }
  free(tables); free(feats); free(hid); free(lg);
  di_cuda_dspark_free(g);
  free(buf); free(ones); free(conf);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  di_model *cpu = load("cpu"), *cu = load("cuda");
  if (cpu && cu) {
    capture(cpu, cu);
    shipped_drafter(cu);
    v2lite_cost(cu);
  }
  di_model_free(cu);
  di_model_free(cpu);
  return test_finish("test_cuda_dspark");
}
