/* The DeepSeek-V4 CUDA kernels (backend/cuda/cuda_v4_kernels.h) one by one against the CPU ops
 * (backend/cpu/cpu_deepseek_v4_ops.c, double sums) or a double-precision reference, on fresh random
 * inputs at V4-Flash shapes: hidden 4096, 64 heads x 512 (rope 64), window 128, compress rates 4 and
 * 128, indexer 64 x 128 with top-512, hc 4, 256 experts top-6. Bounds (float sums of up to 4096 terms
 * against double): rel L2 1e-5 for linear / mHC / pooling / attention outputs; the indexer's scores
 * rel 1e-6 each and its picks exactly equal to the CPU's fixed tie rule applied to the same scores
 * (with 2000 tied entries straddling the top-512 boundary); the compressor's open windows and routing
 * ids exact; MXFP4 experts against the f32 kernels on the weights as the CPU dequantizes them (1e-6).
 * Built only with nvcc; run on the device. */
#include "arch/deepseek_v4_random.h"
#include "arch/deepseek_v4_shapes.h"
#include "backend/cuda/cuda_v4_backend.h"
#include "backend/cpu/cpu_deepseek_v4_ops.h"
#include "backend/cuda/cuda_fp8.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_v4_kernels.h"
#include "model/weights.h"
#include "util/numeric.h"
#include "test_util.h"
#include "v4_one_seq.h"
#include <math.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}
static float *rnd(size_t n, float scale) {
  float *p = malloc(sizeof(float) * n);
  for (size_t i = 0; i < n; i++) p[i] = urand() * scale;
  return p;
}
static void *dup_dev(const void *h, size_t bytes) {
  void *d = di_cut_malloc(bytes ? bytes : 16);
  if (h) di_cut_h2d(d, h, bytes);
  return d;
}
static void *zeros_dev(size_t bytes) {
  void *h = calloc(1, bytes ? bytes : 16);
  void *d = dup_dev(h, bytes);
  free(h);
  return d;
}
static float *from_dev(const void *d, size_t n) {
  float *h = malloc(sizeof(float) * n);
  di_cut_d2h(h, d, sizeof(float) * n);
  return h;
}

static di_v4_config cfg;
static di_v4_ctx cx;
static void setup(void) {
  di_v4_flash_shape(&cfg, 1, 256); /* the benchmark's shape (arch/deepseek_v4_shapes.h), one layer, a tiny vocabulary */
  cfg.vocab_size = 16;
  static const int32_t tok = 0;
  static di_v4_weights w;
  CHECK(di_v4_ctx_init(&cx, &cfg, &w, &tok, 1, "test") == DI_OK);
}

static void check_linear(int wf32, int T, int R, int C) {
  float *x = rnd((size_t)T * C, 1), *W = rnd((size_t)R * C, 0.05f);
  uint16_t *wb = malloc(2 * (size_t)R * C);
  for (size_t i = 0; i < (size_t)R * C; i++) {
    wb[i] = di_f32_to_bf16(W[i]);
    if (!wf32) W[i] = di_bf16_to_f32(wb[i]);
  }
  float *dx = dup_dev(x, 4 * (size_t)T * C), *dy = zeros_dev(4 * (size_t)T * R);
  void *dw = wf32 ? dup_dev(W, 4 * (size_t)R * C) : dup_dev(wb, 2 * (size_t)R * C);
  CHECK(di_v4k_linear(dx, C, dw, wf32, T, R, C, dy, R, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *y = from_dev(dy, (size_t)T * R), *ref = malloc(4 * (size_t)T * R);
  for (int t = 0; t < T; t++)
    for (int r = 0; r < R; r++) {
      double s = 0;
      for (int c = 0; c < C; c++) s += (double)W[(size_t)r * C + c] * x[(size_t)t * C + c];
      ref[(size_t)t * R + r] = (float)s;
    }
  double e = test_rel_l2(y, ref, (size_t)T * R);
  /* each token's row alone (T = 1) gives the same bits as in the step of T tokens, in both one-token forms
   * (di_v4k_lin_form 0: staged; 1, 2: the barrier-free GEMV) */
  int differ = 0;
  float *y1 = malloc(4 * (size_t)R);
  for (int form = 0; form < 3; form++)
    for (int t = 0; t < T; t += T > 2 ? T - 1 : 1) {
      di_v4k_lin_form(form);
      CHECK(di_v4k_linear(dx + (size_t)t * C, C, dw, wf32, 1, R, C, dy, R, NULL) == DI_OK);
      CHECK(di_cut_sync() == 0);
      di_cut_d2h(y1, dy, 4 * (size_t)R);
      differ += memcmp(y1, y + (size_t)t * R, 4 * (size_t)R) != 0;
    }
  di_v4k_lin_form(-1);
  printf("linear %s T=%d %dx%d: rel L2 %.2e, rows alone %s\n", wf32 ? "f32" : "bf16", T, R, C, e,
         differ ? "DIFFER" : "bit-identical");
  CHECKF(e < 1e-5, "linear %s T=%d %dx%d: rel L2 %.3e", wf32 ? "f32" : "bf16", T, R, C, e);
  CHECKF(!differ, "linear %s T=%d %dx%d: %d rows differ when alone", wf32 ? "f32" : "bf16", T, R, C, differ);
  free(x); free(W); free(wb); free(y); free(ref); free(y1);
  di_cut_free(dx); di_cut_free(dy); di_cut_free(dw);
}

/* the grouped output projection wo_a: G groups of R rows over slices of gin columns, one launch */
static void check_linear_groups(int T, int G, int R, int gin) {
  const int C = G * gin;
  float *x = rnd((size_t)T * C, 1), *W = rnd((size_t)G * R * gin, 0.05f);
  uint16_t *wb = malloc(2 * (size_t)G * R * gin);
  for (size_t i = 0; i < (size_t)G * R * gin; i++) W[i] = di_bf16_to_f32(wb[i] = di_f32_to_bf16(W[i]));
  float *dx = dup_dev(x, 4 * (size_t)T * C), *dy = zeros_dev(4 * (size_t)T * G * R);
  void *dw = dup_dev(wb, 2 * (size_t)G * R * gin);
  CHECK(di_v4k_linear_groups(dx, C, dw, 0, T, R, gin, dy, G * R, G, gin, (int64_t)R * gin, R, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *y = from_dev(dy, (size_t)T * G * R), *ref = malloc(4 * (size_t)T * G * R);
  for (int t = 0; t < T; t++)
    for (int g = 0; g < G; g++)
      for (int r = 0; r < R; r++) {
        double acc = 0;
        for (int k = 0; k < gin; k++) acc += (double)W[((size_t)g * R + r) * gin + k] * x[(size_t)t * C + (size_t)g * gin + k];
        ref[((size_t)t * G + g) * R + r] = (float)acc;
      }
  const double e = test_rel_l2(y, ref, (size_t)T * G * R);
  /* the last token alone, in both one-token forms, gives its row of the step bit for bit */
  float *y1 = malloc(4 * (size_t)G * R);
  int differ = 0;
  for (int form = 0; form < 2; form++) {
    di_v4k_lin_form(form);
    CHECK(di_v4k_linear_groups(dx + (size_t)(T - 1) * C, C, dw, 0, 1, R, gin, dy, G * R, G, gin, (int64_t)R * gin, R, NULL) ==
          DI_OK);
    CHECK(di_cut_sync() == 0);
    di_cut_d2h(y1, dy, 4 * (size_t)G * R);
    differ += memcmp(y1, y + (size_t)(T - 1) * G * R, 4 * (size_t)G * R) != 0;
  }
  di_v4k_lin_form(-1);
  printf("grouped linear (wo_a) T=%d, %d groups of %d x %d: rel L2 %.2e, the last token alone %s\n", T, G, R, gin, e,
         differ ? "DIFFERS" : "bit-identical");
  CHECKF(e < 1e-5, "grouped linear: %.3e", e);
  CHECKF(!differ, "grouped linear: the last token alone differs in %d forms", differ);
  free(x); free(W); free(wb); free(y); free(ref); free(y1);
  di_cut_free(dx); di_cut_free(dy); di_cut_free(dw);
}

/* mHC: GPU hc_pre + hc_post vs di_v4_hc_site with a sublayer that records its input and returns `out` */
static float *hc_in_seen, *hc_out_given;
static di_status hc_sub(di_v4_ctx *c, int l, const float *in, float *out) {
  (void)l;
  memcpy(hc_in_seen, in, sizeof(float) * (size_t)c->T * c->c->hidden_size);
  memcpy(out, hc_out_given, sizeof(float) * (size_t)c->T * c->c->hidden_size);
  return DI_OK;
}
static void check_hc(void) {
  const int T = 3, D = cfg.hidden_size, hc = cfg.hc_mult, mix = (2 + hc) * hc;
  float *X = rnd((size_t)T * hc * D, 1), *fn = rnd((size_t)mix * hc * D, 0.02f), *base = rnd(mix, 0.5f),
        *scale = rnd(3, 1), *norm = rnd(D, 1);
  hc_out_given = rnd((size_t)T * D, 1);
  hc_in_seen = malloc(sizeof(float) * (size_t)T * D);
  float *dX = dup_dev(X, 4 * (size_t)T * hc * D), *dfn = dup_dev(fn, 4 * (size_t)mix * hc * D), *db = dup_dev(base, 4 * mix),
        *ds = dup_dev(scale, 12), *dn = dup_dev(norm, 4 * (size_t)D), *din = zeros_dev(4 * (size_t)T * D),
        *dout = dup_dev(hc_out_given, 4 * (size_t)T * D);
  double *dpost = zeros_dev(8 * (size_t)T * hc), *dcomb = zeros_dev(8 * (size_t)T * hc * hc),
         *dpart = zeros_dev(8 * di_v4k_hc_scratch(T, D, hc));
  di_v4k_hc_form(0); /* the plain loops first */
  CHECK(di_v4k_hc_pre(dX, dfn, db, ds, dn, T, D, hc, cfg.hc_sinkhorn_iters, (float)cfg.rms_eps, (float)cfg.hc_eps, din, dpost,
                      dcomb, dpart, NULL) == DI_OK);
  /* the collapse with grouped loads (di_v4k_hc_form 1) gives the same bits, and the head's collapse likewise */
  float *din1 = zeros_dev(4 * (size_t)T * D), *dh0 = zeros_dev(4 * (size_t)T * D), *dh1 = zeros_dev(4 * (size_t)T * D);
  int32_t hrows[3] = {2, 0, 1};
  int32_t *dhrows = dup_dev(hrows, sizeof hrows);
  CHECK(di_v4k_head_pre(dX, dhrows, T, dfn, db, ds, dn, D, hc, (float)cfg.rms_eps, (float)cfg.hc_eps, dh0, dpart, NULL) == DI_OK);
  for (int form = 1; form <= 2; form++) { /* 1: the collapse's loads grouped; 2: the mixes' too */
    di_v4k_hc_form(form);
    CHECK(di_v4k_hc_pre(dX, dfn, db, ds, dn, T, D, hc, cfg.hc_sinkhorn_iters, (float)cfg.rms_eps, (float)cfg.hc_eps, din1, dpost,
                        dcomb, dpart, NULL) == DI_OK);
    CHECK(di_v4k_head_pre(dX, dhrows, T, dfn, db, ds, dn, D, hc, (float)cfg.rms_eps, (float)cfg.hc_eps, dh1, dpart, NULL) == DI_OK);
    di_v4k_hc_form(0);
    CHECK(di_cut_sync() == 0);
    float *a = from_dev(din, (size_t)T * D), *b = from_dev(din1, (size_t)T * D), *h0 = from_dev(dh0, (size_t)T * D),
          *h1 = from_dev(dh1, (size_t)T * D);
    const int same = memcmp(a, b, 4 * (size_t)T * D) == 0 && memcmp(h0, h1, 4 * (size_t)T * D) == 0;
    printf("mHC, grouped loads (form %d) vs plain (site and head): %s\n", form, same ? "bit-identical" : "DIFFER");
    CHECKF(same, "mHC: the grouped form %d's bits differ", form);
    free(a); free(b); free(h0); free(h1);
  }
  di_v4k_hc_form(-1);
  /* in parts (DEEPINFER_CUDA_V4_FORK bit 1: the mixes, then post + Sinkhorn and the collapse as two launches, here
   * in the order the backend queues them on two streams) at the default form, against one call: in, post, comb the same bits */
  {
    const float ep = (float)cfg.rms_eps, he = (float)cfg.hc_eps;
    const int it = cfg.hc_sinkhorn_iters;
    double *dpost2 = zeros_dev(8 * (size_t)T * hc), *dcomb2 = zeros_dev(8 * (size_t)T * hc * hc);
    CHECK(di_v4k_hc_pre(dX, dfn, db, ds, dn, T, D, hc, it, ep, he, din1, dpost, dcomb, dpart, NULL) == DI_OK);
    float *dinp = zeros_dev(4 * (size_t)T * D);
    CHECK(di_v4k_hc_pre_parts(dX, dfn, db, ds, dn, T, D, hc, it, ep, he, dinp, dpost2, dcomb2, dpart, 1, NULL) == DI_OK);
    CHECK(di_v4k_hc_pre_parts(dX, dfn, db, ds, dn, T, D, hc, it, ep, he, dinp, dpost2, dcomb2, dpart, 4, NULL) == DI_OK);
    CHECK(di_v4k_hc_pre_parts(dX, dfn, db, ds, dn, T, D, hc, it, ep, he, dinp, dpost2, dcomb2, dpart, 2, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    float *a = from_dev(din1, (size_t)T * D), *b = from_dev(dinp, (size_t)T * D);
    double *p1 = malloc(8 * (size_t)T * hc), *p2 = malloc(8 * (size_t)T * hc), *c1 = malloc(8 * (size_t)T * hc * hc),
           *c2 = malloc(8 * (size_t)T * hc * hc);
    CHECK(di_cut_d2h(p1, dpost, 8 * (size_t)T * hc) == 0 && di_cut_d2h(p2, dpost2, 8 * (size_t)T * hc) == 0 &&
          di_cut_d2h(c1, dcomb, 8 * (size_t)T * hc * hc) == 0 && di_cut_d2h(c2, dcomb2, 8 * (size_t)T * hc * hc) == 0);
    const int same = memcmp(a, b, 4 * (size_t)T * D) == 0 && memcmp(p1, p2, 8 * (size_t)T * hc) == 0 &&
                     memcmp(c1, c2, 8 * (size_t)T * hc * hc) == 0;
    printf("mHC pre-step in parts (mixes, post + Sinkhorn, collapse) vs one call: %s\n", same ? "bit-identical" : "DIFFER");
    CHECKF(same, "mHC: the pre-step in parts differs from one call");
    free(a); free(b); free(p1); free(p2); free(c1); free(c2);
    di_cut_free(dpost2); di_cut_free(dcomb2); di_cut_free(dinp);
  }
  di_cut_free(din1); di_cut_free(dh0); di_cut_free(dh1); di_cut_free(dhrows);
  CHECK(di_v4k_hc_post(dX, dout, dpost, dcomb, T, D, hc, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  di_weight fw = {"hc_fn", DI_DT_F32, mix, (int64_t)hc * D, fn, NULL, NULL, 0, 0, 0};
  cx.T = T;
  CHECK(di_v4_hc_site(&cx, 0, X, &fw, base, scale, norm, hc_sub) == DI_OK);
  cx.T = 1;
  float *gin = from_dev(din, (size_t)T * D), *gX = from_dev(dX, (size_t)T * hc * D);
  const double e1 = test_rel_l2(gin, hc_in_seen, (size_t)T * D), e2 = test_rel_l2(gX, X, (size_t)T * hc * D);
  printf("mHC (hidden %d, hc %d, Sinkhorn %d): collapsed input rel L2 %.2e, new streams %.2e\n", D, hc, cfg.hc_sinkhorn_iters,
         e1, e2);
  CHECKF(e1 < 1e-5 && e2 < 1e-5, "mHC: input %.3e, streams %.3e", e1, e2);
  free(X); free(fn); free(base); free(scale); free(norm); free(hc_out_given); free(hc_in_seen); free(gin); free(gX);
  di_cut_free(dX); di_cut_free(dfn); di_cut_free(db); di_cut_free(ds); di_cut_free(dn); di_cut_free(din); di_cut_free(dout);
  di_cut_free(dpost); di_cut_free(dcomb); di_cut_free(dpart);
}

/* identity block table of n blocks on the device */
static int32_t *ident_table(int n) {
  int32_t *h = malloc(4 * (size_t)n);
  for (int i = 0; i < n; i++) h[i] = i;
  int32_t *d = dup_dev(h, 4 * (size_t)n);
  free(h);
  return d;
}

/* compressor: pooling of windows that mix the state's rows and the step's, and the open windows after; the
 * lists read with a device count below the grid (a CUDA graph's bound): the entry and the state write past
 * the count (an entry of an untouched slot, a write to a buffer of its own) change nothing */
static void check_pool(int csa, int state_ctas) { /* state_ctas: CTAs per state write (di_v4k_state_ctas) */
  const int dim = 512, rate = csa ? 4 : 128, width = csa ? 2 * dim : dim, pos0 = csa ? 42 : 100, n = csa ? 7 : 40;
  const int slots = (64 + rate - 1) / rate, nblk = 4;
  const size_t rows = (size_t)rate * width, sfl = rows * (csa ? 4 : 2);
  float *state = rnd(sfl, 1), *kv = rnd((size_t)n * width, 1), *gate = rnd((size_t)n * width, 2), *norm = rnd(dim, 1);
  float *dstate = dup_dev(state, 4 * sfl), *dkv = dup_dev(kv, 4 * (size_t)n * width), *dg = dup_dev(gate, 4 * (size_t)n * width),
        *dnorm = dup_dev(norm, 4 * (size_t)dim), *dpool = zeros_dev(4 * (size_t)nblk * slots * dim), *dnew = zeros_dev(4 * sfl);
  int32_t *tab = ident_table(nblk);
  di_v4k_seq sq;
  memset(&sq, 0, sizeof sq);
  sq.t0 = 0;
  sq.n = n;
  sq.pos0 = pos0;
  sq.tab[csa ? 0 : 2] = tab;
  sq.state = dstate;
  di_v4k_seq *dsq = dup_dev(&sq, sizeof sq);
  di_v4k_comp c = {csa ? 0 : 2, rate, csa, dim, width, 0, 1, slots, 0, dpool, dkv, dg, dnorm};
  di_v4k_entry ents[3];
  int ne = 0;
  for (int e = pos0 / rate; e < (pos0 + n) / rate; e++) ents[ne++] = (di_v4k_entry){0, e};
  const int e_past = csa ? 0 : 1; /* not pooled by this step: its slot stays zero */
  ents[ne] = (di_v4k_entry){0, e_past};
  di_v4k_entry *dents = dup_dev(ents, sizeof ents);
  float *dpast = zeros_dev(4 * sfl);
  di_v4k_swrite sw[2] = {{0, pos0 + n, dnew}, {0, pos0 + n, dpast}};
  di_v4k_swrite *dsw = dup_dev(sw, sizeof sw);
  const int32_t counts[2] = {ne, 1};
  int32_t *dcounts = dup_dev(counts, sizeof counts);
  float *inv = dup_dev(cx.compress_rope.inv_freq, 4 * 32);
  CHECK(di_v4k_pool(&c, dsq, dents, ne + 1, dcounts, inv, 64, 1.0f, (float)cfg.rms_eps, NULL) == DI_OK);
  di_v4k_state_ctas(state_ctas);
  CHECK(di_v4k_state_write(&c, dsq, dsw, 2, dcounts + 1, NULL) == DI_OK);
  di_v4k_state_ctas(-1);
  CHECK(di_cut_sync() == 0);
  /* the reference's rows by position: state (open window at pos0 and, CSA, the one before) or step */
  float *row_kv = malloc(sizeof(float) * (size_t)(pos0 + n) * width), *row_g = malloc(sizeof(float) * (size_t)(pos0 + n) * width);
  const int wc = pos0 / rate;
  for (int p = (wc - (csa ? 1 : 0)) * rate; p < pos0 + n; p++) {
    const float *sk, *sg;
    if (p >= pos0) {
      sk = kv + (size_t)(p - pos0) * width;
      sg = gate + (size_t)(p - pos0) * width;
    } else {
      const float *base = csa ? (p / rate == wc ? state + 2 * rows : state) : state;
      sk = base + (size_t)(p % rate) * width;
      sg = base + rows + (size_t)(p % rate) * width;
    }
    memcpy(row_kv + (size_t)p * width, sk, 4 * (size_t)width);
    memcpy(row_g + (size_t)p * width, sg, 4 * (size_t)width);
  }
  float *pool = from_dev(dpool, (size_t)nblk * slots * dim), *past = from_dev(dpast, sfl);
  int touched = 0;
  {
    const int blk = ((e_past + 1) * rate - 1) / 64, slot = e_past - blk * 64 / rate;
    for (int i = 0; i < dim; i++) touched += pool[((size_t)blk * slots + slot) * dim + i] != 0;
    for (size_t i = 0; i < sfl; i++) touched += past[i] != 0;
  }
  CHECKF(touched == 0, "compressor %s: %d values written past the device counts", csa ? "CSA" : "HCA", touched);
  free(past);
  di_cut_free(dpast);
  di_cut_free(dcounts);
  di_v4_compressor cp = {dim, width, {0}, {0}, NULL, norm};
  double worst = 0;
  for (int i = 0; i < ne; i++) {
    const int e = ents[i].e;
    float ref[512];
    const int hp = csa && e > 0;
    di_v4_pool_window(&cx, &cp, rate, csa, hp ? row_kv + (size_t)(e - 1) * rate * width : NULL,
                      hp ? row_g + (size_t)(e - 1) * rate * width : NULL, row_kv + (size_t)e * rate * width,
                      row_g + (size_t)e * rate * width, e * rate, ref);
    const int blk = ((e + 1) * rate - 1) / 64, slot = e - blk * 64 / rate;
    const double err = test_rel_l2(pool + ((size_t)blk * slots + slot) * dim, ref, (size_t)dim);
    worst = err > worst ? err : worst;
  }
  /* the open windows at pos0 + n */
  float *ns = from_dev(dnew, sfl);
  const int P = pos0 + n, wp = P / rate;
  int bad = 0;
  float *pend = csa ? ns + 2 * rows : ns;
  for (int s = 0; s < rate; s++) {
    if (wp * rate + s < P)
      bad += memcmp(pend + (size_t)s * width, row_kv + (size_t)(wp * rate + s) * width, 4 * (size_t)width) != 0 ||
             memcmp(pend + rows + (size_t)s * width, row_g + (size_t)(wp * rate + s) * width, 4 * (size_t)width) != 0;
    if (csa)
      bad += memcmp(ns + (size_t)s * width, row_kv + (size_t)((wp - 1) * rate + s) * width, 4 * (size_t)width) != 0 ||
             memcmp(ns + rows + (size_t)s * width, row_g + (size_t)((wp - 1) * rate + s) * width, 4 * (size_t)width) != 0;
  }
  printf("compressor %s (rate %d, dim %d): %d entries pooled across state and step rows, worst rel L2 %.2e; open windows "
         "after the step %s\n", csa ? "CSA" : "HCA", rate, dim, ne, worst, bad ? "DIFFER" : "exact");
  CHECKF(ne > 0 && worst < 1e-5, "compressor %s: %d entries, worst %.3e", csa ? "CSA" : "HCA", ne, worst);
  CHECKF(bad == 0, "compressor %s: %d open-window rows differ", csa ? "CSA" : "HCA", bad);
  free(state); free(kv); free(gate); free(norm); free(row_kv); free(row_g); free(pool); free(ns);
  di_cut_free(dstate); di_cut_free(dkv); di_cut_free(dg); di_cut_free(dnorm); di_cut_free(dpool); di_cut_free(dnew);
  di_cut_free(tab); di_cut_free(dsq); di_cut_free(dents); di_cut_free(dsw); di_cut_free(inv);
}

/* indexer: 64 x 128 heads over 3000 entries, top-512, with a block of 2000 equal keys across the boundary */
static void check_indexer(void) {
  const int nh = 64, di = 128, N = 3000, rate = 4, T = 3, topk = 512;
  const int pos[3] = {4 * N - 1, 2200, 1500};
  const int nblk = (N * rate + 63) / 64 + 1, slots = 16;
  float *K = rnd((size_t)N * di, 1), *q = rnd((size_t)T * nh * di, 1), *hw = rnd((size_t)T * nh, 1);
  /* entries 800..2799 copy the key ranked 100th of the first 800 for query 0: a tie across its top-512 boundary */
  cfg.index_n_heads = nh;
  cfg.index_head_dim = di;
  {
    float *s0 = malloc(4 * 800);
    di_v4_index_scores(&cfg, q, hw, K, 800, s0);
    int pick = 0;
    for (int e = 0; e < 800; e++) {
      int above = 0;
      for (int j = 0; j < 800; j++) above += s0[j] > s0[e];
      if (above == 100) pick = e;
    }
    for (int e = 800; e < 2800; e++) memcpy(K + (size_t)e * di, K + (size_t)pick * di, 4 * (size_t)di);
    free(s0);
  }
  float *pool = calloc((size_t)nblk * slots * di, 4);
  for (int e = 0; e < N; e++) {
    const int blk = ((e + 1) * rate - 1) / 64, slot = e - blk * 64 / rate;
    memcpy(pool + ((size_t)blk * slots + slot) * di, K + (size_t)e * di, 4 * (size_t)di);
  }
  float *dpool = dup_dev(pool, 4 * (size_t)nblk * slots * di), *dq = dup_dev(q, 4 * (size_t)T * nh * di),
        *dhw = dup_dev(hw, 4 * (size_t)T * nh), *dscore = zeros_dev(4 * (size_t)T * N);
  unsigned char *dsel = zeros_dev((size_t)T * N);
  int32_t *tab = ident_table(nblk), *dpos = dup_dev(pos, sizeof pos), so[3] = {0, 0, 0}, *dso = dup_dev(so, sizeof so);
  di_v4k_seq sq;
  memset(&sq, 0, sizeof sq);
  sq.n = T;
  sq.pos0 = N * rate - T;
  sq.tab[1] = tab;
  di_v4k_seq *dsq = dup_dev(&sq, sizeof sq);
  di_v4k_comp ic = {1, rate, 1, di, 2 * di, 0, 1, slots, 0, dpool, NULL, NULL, NULL};
  di_v4k_index_form(1); /* the register-tiled score kernel first, vs the CPU; then the default one, bit for bit */
  CHECK(di_v4k_indexer(dq, dhw, dpos, dso, dsq, &ic, T, nh, di, topk, N, dscore, dsel, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *gs = from_dev(dscore, (size_t)T * N);
  unsigned char *gsel = malloc((size_t)T * N), *ref = malloc(N);
  di_cut_d2h(gsel, dsel, (size_t)T * N);
  /* the per-product score kernel (di_v4k_index_form 0; 2: 8 entries a CTA), the widen-once one (3: one entry a lane
   * at this N; with a score row of 9000 > 8192, two a lane; 4, the default: four) give the same bits and picks */
  const int forms[5][2] = {{0, N}, {2, N}, {3, N}, {3, 9000}, {4, 9000}};
  for (int f = 0; f < 5; f++) {
    const int form = forms[f][0], MN = forms[f][1];
    float *dscore0 = zeros_dev(4 * (size_t)T * MN);
    unsigned char *dsel0 = zeros_dev((size_t)T * MN), *gsel0 = malloc((size_t)T * MN);
    di_v4k_index_form(form);
    CHECK(di_v4k_indexer(dq, dhw, dpos, dso, dsq, &ic, T, nh, di, topk, MN, dscore0, dsel0, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    float *gs0 = from_dev(dscore0, (size_t)T * MN);
    di_cut_d2h(gsel0, dsel0, (size_t)T * MN);
    int same = 1;
    for (int t = 0; t < T; t++) {
      const int valid = (pos[t] + 1) / rate < N ? (pos[t] + 1) / rate : N;
      same &= memcmp(gs + (size_t)t * N, gs0 + (size_t)t * MN, 4 * (size_t)valid) == 0;
      same &= memcmp(gsel + (size_t)t * N, gsel0 + (size_t)t * MN, (size_t)N) == 0;
    }
    printf("indexer: the register-tiled score kernel vs form %d (score rows of %d): %s\n", form, MN, same ? "bit-identical" : "DIFFERS");
    CHECKF(same, "indexer: the score kernels differ (form %d, rows of %d)", form, MN);
    free(gs0); free(gsel0); di_cut_free(dscore0); di_cut_free(dsel0);
  }
  di_v4k_index_form(-1);
  di_v4_scored *work = malloc(sizeof(di_v4_scored) * N);
  float *cs = malloc(4 * (size_t)N);
  for (int t = 0; t < T; t++) {
    const int valid = (pos[t] + 1) / rate < N ? (pos[t] + 1) / rate : N, k = topk < valid ? topk : valid;
    di_v4_index_scores(&cfg, q + (size_t)t * nh * di, hw + (size_t)t * nh, K, valid, cs);
    double worst = 0;
    for (int s = 0; s < valid; s++) {
      const double e = fabs((double)gs[(size_t)t * N + s] - cs[s]) / (fabs(cs[s]) + 1e-3);
      worst = e > worst ? e : worst;
    }
    memset(ref, 0, N);
    const int tie = di_v4_topk_earlier_first(gs + (size_t)t * N, valid, k, work, ref);
    int diff = 0, picked = 0;
    for (int s = 0; s < N; s++) {
      diff += ref[s] != gsel[(size_t)t * N + s];
      picked += gsel[(size_t)t * N + s];
    }
    printf("indexer t=%d (position %d, %d complete entries): scores worst rel %.2e, %d picks, %d differ from the CPU's rule "
           "(boundary tie: %s)\n", t, pos[t], valid, worst, picked, diff, tie ? "yes" : "no");
    CHECKF(worst < 1e-6, "indexer scores t=%d: worst %.3e", t, worst);
    CHECKF(diff == 0 && picked == k, "indexer picks t=%d: %d differ, %d picked of %d", t, diff, picked, k);
  }
  free(K); free(q); free(hw); free(pool); free(gs); free(gsel); free(ref); free(work); free(cs);
  di_cut_free(dpool); di_cut_free(dq); di_cut_free(dhw); di_cut_free(dscore); di_cut_free(dsel); di_cut_free(tab);
  di_cut_free(dpos); di_cut_free(dso); di_cut_free(dsq);
}

/* attention: 64 heads x 512 over the window (128) and sliding / CSA (2050 entries, 512 picked) / HCA entries */
static void check_attend(int kind) {
  const int H = cfg.n_heads, hd = cfg.head_dim, W = cfg.sliding_window, T = 2, pos0 = 8198;
  const int rate = kind == DI_V4_ATTN_HCA ? 128 : 4, nc = kind == DI_V4_ATTN_SLIDING ? 0 : (pos0 + T) / rate;
  const int nblk = (pos0 + T + 63) / 64 + 1, slots = (64 + rate - 1) / rate;
  float *wpool = rnd((size_t)nblk * 64 * hd, 1), *epool = rnd((size_t)nblk * slots * hd, 1), *q = rnd((size_t)T * H * hd, 1),
        *sink = rnd(H, 1);
  unsigned char *sel = calloc((size_t)T * (nc + 1), 1);
  int pos[2];
  for (int t = 0; t < T; t++) {
    pos[t] = pos0 + t;
    const int valid = (pos[t] + 1) / rate;
    for (int picked = 0; kind == DI_V4_ATTN_CSA && picked < 512;) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      const int s = (int)((rng >> 33) % (uint64_t)valid);
      if (!sel[(size_t)t * nc + s]) sel[(size_t)t * nc + s] = 1, picked++;
    }
  }
  float *dw = dup_dev(wpool, 4 * (size_t)nblk * 64 * hd), *de = dup_dev(epool, 4 * (size_t)nblk * slots * hd),
        *dq = dup_dev(q, 4 * (size_t)T * H * hd), *dsink = dup_dev(sink, 4 * (size_t)H), *dout = zeros_dev(4 * (size_t)T * H * hd);
  unsigned char *dsel = dup_dev(sel, (size_t)T * (nc + 1));
  int32_t *tab = ident_table(nblk), *dpos = dup_dev(pos, sizeof pos), so[2] = {0, 0}, *dso = dup_dev(so, sizeof so);
  di_v4k_seq sq;
  memset(&sq, 0, sizeof sq);
  sq.n = T;
  sq.pos0 = pos0;
  sq.tab[0] = sq.tab[2] = sq.tab[3] = tab;
  di_v4k_seq *dsq = dup_dev(&sq, sizeof sq);
  di_v4k_comp c = {kind == DI_V4_ATTN_HCA ? 2 : 0, rate, kind == DI_V4_ATTN_CSA, hd, hd, 0, 1, slots, 0, de, NULL, NULL, NULL};
  const size_t keys = (size_t)W + (nc > 0 ? nc : 1);
  float *dp = zeros_dev(4 * (size_t)T * H * keys);
  double *dex = zeros_dev(8 * di_v4k_attend_ex(T, H, W, nc > 0 ? nc : 1));
  float *inv = dup_dev(cx.compress_rope.inv_freq, 4 * 32);
  di_v4k_attend_form(0); /* the one-key loops first */
  CHECK(di_v4k_attend(dq, dpos, dso, dsq, dw, 1, 0, W, kind == DI_V4_ATTN_SLIDING ? NULL : &c, kind == DI_V4_ATTN_HCA,
                      kind == DI_V4_ATTN_CSA ? dsel : NULL, nc > 0 ? nc : 1, dsink, T, H, hd, inv, 64, 1.0f, dp, dex, dout,
                      NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *o = from_dev(dout, (size_t)T * H * hd), *ref = malloc(4 * (size_t)H * hd);
  /* two keys a warp in flight (di_v4k_attend_form 2: at any T; form 1, the default, at one token): the same bits */
  di_v4k_attend_form(2);
  CHECK(di_v4k_attend(dq, dpos, dso, dsq, dw, 1, 0, W, kind == DI_V4_ATTN_SLIDING ? NULL : &c, kind == DI_V4_ATTN_HCA,
                      kind == DI_V4_ATTN_CSA ? dsel : NULL, nc > 0 ? nc : 1, dsink, T, H, hd, inv, 64, 1.0f, dp, dex, dout,
                      NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *o1 = from_dev(dout, (size_t)T * H * hd);
  const int form_same = memcmp(o, o1, 4 * (size_t)T * H * hd) == 0;
  free(o1);
  /* the split kernels (form 3: the key list once a token, scores 8 heads a CTA, values 4 heads x 128 channels), into a
   * fresh output: the same bits */
  float *dout3 = zeros_dev(4 * (size_t)T * H * hd);
  di_v4k_attend_form(3);
  CHECK(di_v4k_attend(dq, dpos, dso, dsq, dw, 1, 0, W, kind == DI_V4_ATTN_SLIDING ? NULL : &c, kind == DI_V4_ATTN_HCA,
                      kind == DI_V4_ATTN_CSA ? dsel : NULL, nc > 0 ? nc : 1, dsink, T, H, hd, inv, 64, 1.0f, dp, dex, dout3,
                      NULL) == DI_OK);
  di_v4k_attend_form(-1);
  CHECK(di_cut_sync() == 0);
  float *o3 = from_dev(dout3, (size_t)T * H * hd);
  int split_diff = 0;
  for (size_t i = 0; i < (size_t)T * H * hd; i++) split_diff += memcmp(o + i, o3 + i, 4) != 0;
  free(o3);
  di_cut_free(dout3);
  float *win = malloc(4 * (size_t)W * hd), *ent = malloc(4 * (size_t)(nc + 1) * hd), *p = malloc(4 * keys);
  double *ex = malloc(8 * keys);
  for (int e = 0; e < nc; e++) {
    const int blk = ((e + 1) * rate - 1) / 64, slot = e - blk * 64 / rate;
    memcpy(ent + (size_t)e * hd, epool + ((size_t)blk * slots + slot) * hd, 4 * (size_t)hd);
  }
  di_v4_layer L;
  memset(&L, 0, sizeof L);
  L.sink = sink;
  double worst = 0;
  for (int t = 0; t < T; t++) {
    const int j0 = pos[t] - W + 1;
    for (int j = j0; j <= pos[t]; j++) memcpy(win + (size_t)(j - j0) * hd, wpool + (size_t)j * hd, 4 * (size_t)hd);
    const int ncmp = kind == DI_V4_ATTN_HCA ? ((pos[t] + 1) / rate < nc ? (pos[t] + 1) / rate : nc) : nc;
    di_v4_attend(&cx, &L, &cx.compress_rope, q + (size_t)t * H * hd, pos[t], win, W, ent, ncmp,
                 kind == DI_V4_ATTN_CSA ? sel + (size_t)t * nc : NULL, p, ex, ref);
    const double e = test_rel_l2(o + (size_t)t * H * hd, ref, (size_t)H * hd);
    worst = e > worst ? e : worst;
  }
  static const char *const name[3] = {"sliding", "CSA", "HCA"};
  printf("attention %s (%d heads x %d, window %d, %d entries): worst rel L2 %.2e, two keys a warp %s, split kernels %d of %d "
         "outputs differ\n", name[kind], H, hd, W, nc, worst, form_same ? "bit-identical" : "DIFFERS", split_diff, T * H * hd);
  CHECKF(worst < 1e-5, "attention %s: %.3e", name[kind], worst);
  CHECKF(form_same, "attention %s: two keys a warp differ", name[kind]);
  CHECKF(split_diff == 0, "attention %s: the split kernels differ in %d outputs", name[kind], split_diff);
  free(wpool); free(epool); free(q); free(sink); free(sel); free(o); free(ref); free(win); free(ent); free(p); free(ex);
  di_cut_free(dw); di_cut_free(de); di_cut_free(dq); di_cut_free(dsink); di_cut_free(dout); di_cut_free(dsel);
  di_cut_free(tab); di_cut_free(dpos); di_cut_free(dso); di_cut_free(dsq); di_cut_free(dp); di_cut_free(dex); di_cut_free(inv);
}

/* routing: 256 experts top-6, sqrtsoftplus + bias, normalised x 2.5, against the CPU's di_v4_route (ids in
 * slots: shared, then ascending ids). ties: logits on a coarse grid and no bias, so many biased scores are
 * exactly equal across the top-6 boundary, where the picks must still be the CPU's (torch.topk's order). */
static void check_route(int ties) {
  const int T = 64, E = 256, K = 6, ns = K + 1;
  float *lg = rnd((size_t)T * E, 4), *bias = rnd(E, 0.1f);
  if (ties) {
    for (size_t i = 0; i < (size_t)T * E; i++) lg[i] = (float)((int)(lg[i] * 2) / 2);
    for (int e = 0; e < E; e++) bias[e] = 0;
  }
  float *dl = dup_dev(lg, 4 * (size_t)T * E), *db = dup_dev(bias, 4 * (size_t)E), *dw = zeros_dev(4 * (size_t)T * ns);
  int32_t *di = zeros_dev(4 * (size_t)T * ns);
  di_v4k_route_form(0); /* a thread a token first */
  CHECK(di_v4k_route(dl, db, NULL, NULL, T, E, K, 0, 2.5f, di, dw, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  int32_t *ids = malloc(4 * (size_t)T * ns), *ids1 = malloc(4 * (size_t)T * ns);
  di_cut_d2h(ids, di, 4 * (size_t)T * ns);
  float *w = from_dev(dw, (size_t)T * ns);
  /* the warp-per-token form (di_v4k_route_form 1): the same ids and weights, bit for bit */
  di_v4k_route_form(1);
  CHECK(di_v4k_route(dl, db, NULL, NULL, T, E, K, 0, 2.5f, di, dw, NULL) == DI_OK);
  di_v4k_route_form(-1);
  CHECK(di_cut_sync() == 0);
  di_cut_d2h(ids1, di, 4 * (size_t)T * ns);
  float *w1 = from_dev(dw, (size_t)T * ns);
  const int form_same = memcmp(ids, ids1, 4 * (size_t)T * ns) == 0 && memcmp(w, w1, 4 * (size_t)T * ns) == 0;
  printf("routing, a warp per token vs a thread: %s\n", form_same ? "bit-identical" : "DIFFER");
  CHECKF(form_same, "routing: the warp-per-token form differs");
  free(ids1); free(w1);
  di_v4_config rc = cfg;
  rc.n_routed_experts = E;
  rc.top_k = K;
  rc.scoring = DI_V4_SCORE_SQRTSOFTPLUS;
  rc.routed_scaling = 2.5;
  int bad = 0, tied_rows = 0;
  double worst = 0;
  for (int t = 0; t < T; t++) {
    float wt[256] = {0};
    di_v4_route(&rc, lg + (size_t)t * E, bias, NULL, wt);
    /* a row whose 6th and 7th best biased scores are equal: the tie rule decides */
    float b6[256];
    for (int e = 0; e < E; e++) b6[e] = (float)sqrt(lg[(size_t)t * E + e] > 20 ? lg[(size_t)t * E + e] : log1p(exp(lg[(size_t)t * E + e]))) + bias[e];
    di_v4_scored work[256];
    unsigned char ch[256];
    tied_rows += di_v4_topk_earlier_first(b6, E, K, work, ch);
    bad += ids[(size_t)t * ns] != E;
    for (int e = 0, k = 1; e < E; e++)
      if (wt[e] != 0) {
        bad += k >= ns || ids[(size_t)t * ns + k] != e;
        if (k < ns) {
          const double err = fabs(w[(size_t)t * ns + k] - wt[e]) / wt[e];
          worst = err > worst ? err : worst;
        }
        k++;
      }
  }
  printf("routing (%d experts, top-%d%s): %d rows with a tie at the boundary, %d id mismatches vs the CPU, weights worst rel "
         "%.2e\n", E, K, ties ? ", tie-heavy" : "", tied_rows, bad, worst);
  CHECKF(bad == 0 && worst < 1e-6, "routing: %d ids differ, weights %.3e", bad, worst);
  if (ties) CHECKF(tied_rows > T / 4, "routing ties: only %d rows tie at the boundary", tied_rows);
  free(lg); free(bias); free(ids); free(w);
  di_cut_free(dl); di_cut_free(db); di_cut_free(dw); di_cut_free(di);
}

/* experts: gate/up with the clamp, down, combine, at hidden 4096 x width 2048 (4 experts + shared) */
static void check_experts(int wf32) {
  const int T = 2, D = 4096, I = 2048, E = 4, ns = 3;
  const float lim = 10;
  float *x = rnd((size_t)T * D, 1), *w1 = rnd((size_t)(E + 1) * I * D, 0.05f), *w3 = rnd((size_t)(E + 1) * I * D, 0.05f),
        *w2 = rnd((size_t)(E + 1) * D * I, 0.05f);
  const size_t n13 = (size_t)(E + 1) * I * D;
  uint16_t *b1 = malloc(2 * n13), *b3 = malloc(2 * n13), *b2 = malloc(2 * n13);
  for (size_t i = 0; i < n13; i++) {
    b1[i] = di_f32_to_bf16(w1[i]);
    b3[i] = di_f32_to_bf16(w3[i]);
    b2[i] = di_f32_to_bf16(w2[i]);
    if (!wf32) {
      w1[i] = di_bf16_to_f32(b1[i]);
      w3[i] = di_bf16_to_f32(b3[i]);
      w2[i] = di_bf16_to_f32(b2[i]);
    }
  }
  const int32_t ids[6] = {E, 1, 3, E, 0, -1};
  const float wts[6] = {1, 0.7f, 0.4f, 1, 1.3f, 0};
  void *d1 = wf32 ? dup_dev(w1, 4 * n13) : dup_dev(b1, 2 * n13), *d3 = wf32 ? dup_dev(w3, 4 * n13) : dup_dev(b3, 2 * n13),
       *d2 = wf32 ? dup_dev(w2, 4 * n13) : dup_dev(b2, 2 * n13);
  float *dx = dup_dev(x, 4 * (size_t)T * D), *dact = zeros_dev(4 * (size_t)T * ns * I), *dy = zeros_dev(4 * (size_t)T * ns * D),
        *dout = zeros_dev(4 * (size_t)T * D), *dwt = dup_dev(wts, sizeof wts);
  int32_t *dids = dup_dev(ids, sizeof ids);
  CHECK(di_v4k_expert_up(dx, dids, NULL, E + 1, d1, d3, wf32, T, ns, D, I, lim, dact, NULL) == DI_OK);
  CHECK(di_v4k_expert_down(dact, dids, NULL, E + 1, d2, wf32, T, ns, D, I, dy, NULL) == DI_OK);
  CHECK(di_v4k_moe_combine(dy, dids, dwt, T, ns, D, dout, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *out = from_dev(dout, (size_t)T * D), *ref = calloc((size_t)T * D, 4), *a = malloc(4 * (size_t)I);
  /* the tiled form (slots grouped by expert: E shared by both tokens) must give the same bits */
  int32_t *work = zeros_dev(4 * (1 + 3 * (size_t)di_v4k_expert_max_tiles(T, ns, E + 1) + (size_t)T * ns));
  float *dout2 = zeros_dev(4 * (size_t)T * D);
  CHECK(di_v4k_expert_tiles(dids, T, ns, E + 1, work, NULL) == DI_OK);
  CHECK(di_v4k_expert_up(dx, dids, work, E + 1, d1, d3, wf32, T, ns, D, I, lim, dact, NULL) == DI_OK);
  CHECK(di_v4k_expert_down(dact, dids, work, E + 1, d2, wf32, T, ns, D, I, dy, NULL) == DI_OK);
  CHECK(di_v4k_moe_combine(dy, dids, dwt, T, ns, D, dout2, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *out2 = from_dev(dout2, (size_t)T * D);
  CHECKF(memcmp(out, out2, 4 * (size_t)T * D) == 0, "experts %s: tiled form differs (rel L2 %.3e)", wf32 ? "f32" : "bf16",
         test_rel_l2(out2, out, (size_t)T * D));
  free(out2);
  di_cut_free(work);
  di_cut_free(dout2);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < ns; k++) {
      const int e = ids[t * ns + k];
      if (e < 0) continue;
      for (int i = 0; i < I; i++) {
        double g = 0, u = 0;
        for (int c = 0; c < D; c++) {
          g += (double)w1[((size_t)e * I + i) * D + c] * x[(size_t)t * D + c];
          u += (double)w3[((size_t)e * I + i) * D + c] * x[(size_t)t * D + c];
        }
        const double gv = g > lim ? lim : g, uv = u > lim ? lim : u < -lim ? -lim : u;
        a[i] = (float)(gv / (1 + exp(-gv)) * uv);
      }
      for (int d = 0; d < D; d++) {
        double s = 0;
        for (int i = 0; i < I; i++) s += (double)w2[((size_t)e * D + d) * I + i] * a[i];
        ref[(size_t)t * D + d] += (float)(wts[t * ns + k] * s);
      }
    }
  const double e = test_rel_l2(out, ref, (size_t)T * D);
  printf("experts %s (hidden %d, width %d, shared + routed slots, one unused): rel L2 %.2e\n", wf32 ? "f32" : "bf16", D, I, e);
  CHECKF(e < 1e-5, "experts %s: %.3e", wf32 ? "f32" : "bf16", e);
  free(x); free(w1); free(w3); free(w2); free(b1); free(b2); free(b3); free(out); free(ref); free(a);
  di_cut_free(d1); di_cut_free(d2); di_cut_free(d3); di_cut_free(dx); di_cut_free(dact); di_cut_free(dy); di_cut_free(dout);
  di_cut_free(dwt); di_cut_free(dids);
}

/* MXFP4 routed experts (the native mode's di_v4k_expert_up_mx / _down_mx) at hidden 4096 x width 2048 (and
 * an odd 96 x 40 shape for the column-a-lane path): random E2M1 codes and E8M0 scales, against the f32
 * kernels on the same weights as the CPU reads them (di_weight_rows_f32): rel L2 < 1e-6 (the same
 * products, sums in another order); the shared expert's slots (id E) are left untouched; the tiled form
 * gives the same bits as one CTA row per slot, and the staged kernels (di_v4k_mx_form 1, and 2-7:
 * 4-7 decode the codes by byte permutes; 6, 7 give a warp 2 / 4 row groups at one token) the same bits as the lane ones (form 0, e2m1_f32 per value), per
 * slot and tiled (T tokens: up to 8 of an expert in a tile; random codes: every E2M1 value in every position). */
static void mx_random(int E, int R, int C, uint8_t **q, uint8_t **sc, float **deq) {
  const int cb = C / 2, ns = (C + 31) / 32;
  *q = malloc((size_t)E * R * cb);
  *sc = malloc((size_t)E * R * ns);
  *deq = calloc((size_t)(E + 1) * R * C, sizeof(float)); /* + the shared expert's rows, zero (skipped) */
  for (size_t i = 0; i < (size_t)E * R * cb; i++) (*q)[i] = (uint8_t)(rng = rng * 6364136223846793005ull + 1442695040888963407ull, rng >> 56);
  for (size_t i = 0; i < (size_t)E * R * ns; i++) (*sc)[i] = (uint8_t)(118 + (int)((urand() + 1) * 2.5f)); /* 2^-9 .. 2^-5 */
  for (int e = 0; e < E; e++) {
    di_weight w;
    memset(&w, 0, sizeof w);
    w.dtype = DI_DT_F4E2M1;
    w.rows = R;
    w.cols = C;
    w.data = *q + (size_t)e * R * cb;
    w.scale_e8m0 = *sc + (size_t)e * R * ns;
    w.block_rows = 1;
    w.block_cols = 32;
    w.scale_cols = ns;
    di_weight_rows_f32(&w, 0, R, *deq + (size_t)e * R * C);
  }
}
/* device MXFP4 stack as cuda_deepseek_v4.cu uploads it: code rows padded to 16 bytes */
static di_cuk_mxfp4w mx_dev(const uint8_t *q, const uint8_t *sc, int E, int R, int C) {
  const int cb = C / 2, ldq = (cb + 15) / 16 * 16, ns = (C + 31) / 32;
  uint8_t *h = calloc((size_t)E * R, ldq);
  for (size_t r = 0; r < (size_t)E * R; r++) memcpy(h + r * ldq, q + r * cb, cb);
  di_cuk_mxfp4w w = {dup_dev(h, (size_t)E * R * ldq), dup_dev(sc, (size_t)E * R * ns), ldq, ns};
  free(h);
  return w;
}
static void check_experts_mx(int D, int I, int T) {
  const int E = 3, ns = 3;
  const float lim = 10;
  float *x = rnd((size_t)T * D, 1), *w1, *w3, *w2;
  uint8_t *q1, *q3, *q2, *s1, *s3, *s2;
  mx_random(E, I, D, &q1, &s1, &w1);
  mx_random(E, I, D, &q3, &s3, &w3);
  mx_random(E, D, I, &q2, &s2, &w2);
  const di_cuk_mxfp4w m1 = mx_dev(q1, s1, E, I, D), m3 = mx_dev(q3, s3, E, I, D), m2 = mx_dev(q2, s2, E, D, I);
  const size_t n13 = (size_t)(E + 1) * I * D;
  void *d1 = dup_dev(w1, 4 * n13), *d3 = dup_dev(w3, 4 * n13), *d2 = dup_dev(w2, 4 * n13);
  int32_t ids[3 * 16];
  if (T > 16) T = 16;
  for (int t = 0; t < T; t++) { /* slot 0 the shared expert; the others random routed ones or none (-1) */
    ids[t * ns] = E;
    for (int k = 1; k < ns; k++) ids[t * ns + k] = t == 0 && k == 2 ? -1 : (int32_t)((urand() + 1) * 1.5f) % E;
  }
  int32_t *dids = dup_dev(ids, sizeof(int32_t) * (size_t)T * ns);
  float *dx = dup_dev(x, 4 * (size_t)T * D);
  float *act[17], *y[17];
  int32_t *work = zeros_dev(4 * (1 + 3 * (size_t)di_v4k_expert_max_tiles(T, ns, E + 1) + (size_t)T * ns));
  CHECK(di_v4k_expert_tiles(dids, T, ns, E + 1, work, NULL) == DI_OK);
  /* 0: f32 reference kernels, 1: mx per slot, 2: mx tiled (form 1, the default); 3, 4: the same in the lane
   * form 0; 5, 6: form 2; 7, 8: form 3; 9, 10: form 4; 11, 12: form 5; 13, 14: form 6; 15, 16: form 7 (per slot:
   * 2 / 4 row groups a warp; tiled: form 4's) */
  static const int form_of[17] = {1, 1, 1, 0, 0, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
  for (int v = 0; v < 17; v++) {
    di_v4k_mx_form(form_of[v]);
    float *da = zeros_dev(4 * (size_t)T * ns * I), *dy = zeros_dev(4 * (size_t)T * ns * D);
    if (v == 0) {
      CHECK(di_v4k_expert_up(dx, dids, NULL, E + 1, d1, d3, 1, T, ns, D, I, lim, da, NULL) == DI_OK);
      CHECK(di_v4k_expert_down(da, dids, NULL, E + 1, d2, 1, T, ns, D, I, dy, NULL) == DI_OK);
    } else {
      const int32_t *tl = v % 2 == 0 ? work : NULL;
      CHECK(di_v4k_expert_up_mx(dx, dids, tl, E + 1, m1, m3, T, ns, D, I, lim, da, NULL) == DI_OK);
      CHECK(di_v4k_expert_down_mx(da, dids, tl, E + 1, m2, T, ns, D, I, dy, NULL) == DI_OK);
    }
    CHECK(di_cut_sync() == 0);
    act[v] = from_dev(da, (size_t)T * ns * I);
    y[v] = from_dev(dy, (size_t)T * ns * D);
    di_cut_free(da);
    di_cut_free(dy);
  }
  double worst = 0;
  int shared_touched = 0;
  for (int ts = 0; ts < T * ns; ts++) {
    if (ids[ts] < 0) continue;
    if (ids[ts] == E) {
      for (int d = 0; d < D; d++) shared_touched += y[1][(size_t)ts * D + d] != 0 || y[2][(size_t)ts * D + d] != 0;
      continue;
    }
    const double ea = test_rel_l2(act[1] + (size_t)ts * I, act[0] + (size_t)ts * I, (size_t)I);
    const double ey = test_rel_l2(y[1] + (size_t)ts * D, y[0] + (size_t)ts * D, (size_t)D);
    worst = ea > worst ? ea : worst;
    worst = ey > worst ? ey : worst;
  }
  di_v4k_mx_form(-1);
  const size_t ny = 4 * (size_t)T * ns * D, na = 4 * (size_t)T * ns * I;
  const int same = memcmp(y[1], y[2], ny) == 0 && memcmp(act[1], act[2], na) == 0;
  int forms = 1;
  for (int v = 3; v < 17; v++) forms &= memcmp(y[2 - v % 2], y[v], ny) == 0 && memcmp(act[2 - v % 2], act[v], na) == 0;
  printf("experts MXFP4 (hidden %d, width %d, %d tokens): vs the f32 kernels on the dequantized weights worst rel L2 %.2e, shared "
         "slots untouched %s, tiled %s, forms 0, 2-7 vs 1 %s\n", D, I, T, worst, shared_touched ? "NO" : "yes",
         same ? "bit-identical" : "DIFFERS", forms ? "bit-identical" : "DIFFERS");
  CHECKF(worst < 1e-6, "experts MXFP4 %d x %d: rel L2 %.3e", D, I, worst);
  CHECKF(!shared_touched && same, "experts MXFP4: shared slots touched %d, tiled same %d", shared_touched, same);
  CHECKF(forms, "experts MXFP4 %d x %d x %d tokens: the staged kernels' bits differ from the lane form's", D, I, T);
  for (int v = 0; v < 17; v++) free(act[v]), free(y[v]);
  free(x); free(w1); free(w3); free(w2); free(q1); free(q3); free(q2); free(s1); free(s3); free(s2);
  di_cut_free((void *)m1.q); di_cut_free((void *)m1.scale); di_cut_free((void *)m3.q); di_cut_free((void *)m3.scale);
  di_cut_free((void *)m2.q); di_cut_free((void *)m2.scale);
  di_cut_free(d1); di_cut_free(d3); di_cut_free(d2); di_cut_free(dids); di_cut_free(dx); di_cut_free(work);
}

/* the shared expert's epilogue (di_v4k_swiglu) against expert_up's clamp and silu in double */
static void check_swiglu(void) {
  const int T = 3, I = 300;
  const float lim = 7;
  float *gu = rnd((size_t)T * 2 * I, 12), *out = malloc(4 * (size_t)T * I);
  float *dgu = dup_dev(gu, 4 * (size_t)T * 2 * I), *dact = zeros_dev(4 * (size_t)T * 5 * I);
  CHECK(di_v4k_swiglu(dgu, dgu + I, 2 * I, T, I, lim, dact, 5 * I, NULL) == DI_OK);
  CHECK(di_cut_sync() == 0);
  float *a = from_dev(dact, (size_t)T * 5 * I);
  double worst = 0;
  for (int t = 0; t < T; t++)
    for (int i = 0; i < I; i++) {
      const double g = gu[(size_t)t * 2 * I + i], u = gu[(size_t)t * 2 * I + I + i];
      const double gv = g > lim ? lim : g, uv = u > lim ? lim : u < -lim ? -lim : u, r = gv / (1 + exp(-gv)) * uv;
      const double e = fabs(a[(size_t)t * 5 * I + i] - r) / (fabs(r) + 1e-3);
      worst = e > worst ? e : worst;
    }
  printf("swiglu with clamp %g: worst rel %.2e\n", lim, worst);
  CHECKF(worst < 1e-6, "swiglu: %.3e", worst);
  free(gu); free(out); free(a);
  di_cut_free(dgu); di_cut_free(dact);
}

/* The whole backend at V4-Flash shapes (4 layers: sliding, sliding, CSA, HCA; 4 experts top-2; vocabulary 4096) on
 * the random model of arch/deepseek_v4_random.h in V4's native formats: uploaded as stored
 * (DEEPINFER_CUDA_V4_NATIVE=1) against the bf16 upload of the same values (exact in bf16), one prompt of 70
 * tokens in one step: logits within rel L2 2e-2 (the FP8 GEMVs round the activations to bf16), and the native
 * weights under 60% of the bf16 bytes. */
static int run_prompt(di_backend *be, int T, float *logits) {
  di_status st = v4_run_prompt(be, T, logits);
  CHECKF(st == DI_OK, "random V4-Flash model step: %s", di_last_error());
  return st == DI_OK;
}
static void check_native_model(void) {
  di_v4_config mc;
  di_v4_flash_shape(&mc, 4, 4);
  mc.vocab_size = 4096;
  mc.top_k = 2; /* (4 experts: a quick upload) */
  di_v4_random_model rm;
  CHECK(di_v4_random_model_init(&rm, &mc, 1, 7) == DI_OK);
  di_model_config cfg0;
  memset(&cfg0, 0, sizeof cfg0);
  const int T = 70, V = mc.vocab_size;
  float *lg[2];
  int64_t bytes[2] = {0, 0};
  int ok = 1;
  for (int native = 0; native < 2; native++) {
    setenv("DEEPINFER_CUDA_V4_NATIVE", native ? "1" : "0", 1);
    di_backend *be = NULL;
    lg[native] = calloc((size_t)T * V, sizeof(float));
    di_status st = di_backend_cuda_v4_create(&cfg0, &rm.c, &rm.w, &be);
    CHECKF(st == DI_OK, "random V4-Flash model (native %d): %s", native, di_last_error());
    ok = ok && st == DI_OK && run_prompt(be, T, lg[native]);
    if (be) {
      bytes[native] = di_backend_cuda_v4_weight_bytes(be);
      be->ops->destroy(be);
    }
  }
  unsetenv("DEEPINFER_CUDA_V4_NATIVE");
  if (ok) {
    const double e = test_rel_l2(lg[1], lg[0], (size_t)T * V);
    int finite = 1;
    for (size_t i = 0; i < (size_t)T * V; i++) finite &= isfinite(lg[1][i]) != 0;
    printf("V4-Flash shapes, 4 layers, native (FP8 + MXFP4) vs bf16 upload of the same weights, 70 tokens: rel L2 %.2e; device "
           "weights %.3f GB vs %.3f GB (%.1f%%)\n", e, bytes[1] / 1e9, bytes[0] / 1e9, 100.0 * bytes[1] / bytes[0]);
    CHECKF(finite && e < 2e-2, "native vs bf16 at V4-Flash shapes: rel L2 %.3e (finite %d)", e, finite);
    CHECKF(bytes[1] > 0 && bytes[1] < 0.6 * bytes[0], "native weights %lld bytes vs bf16 %lld", (long long)bytes[1], (long long)bytes[0]);
  }
  free(lg[0]);
  free(lg[1]);
  di_v4_random_model_free(&rm);
}

/* RMSNorm then RoPE (di_v4k_rmsnorm_rope) at the q heads' shape (3 tokens x 64 heads x 512, rope 64, no weight)
 * and the kv row's (weighted), positions up to 131,000: the one-launch form (di_v4k_fuse 1) bit for bit equal to
 * the two launches, both against di_v4_rmsnorm + di_v4_rope_apply on the CPU (rel L2 1e-6: the sum of squares
 * in another order). */
static void check_norm_rope(int heads, int weighted) {
  const int T = 3, n = cfg.head_dim, rows = T * heads, rd = cx.compress_rope.p->dim;
  const int32_t pos[3] = {5, 4097, 131000};
  float *x = rnd((size_t)rows * n, 3), *w = weighted ? rnd((size_t)n, 1) : NULL, *ref = malloc(sizeof(float) * (size_t)rows * n);
  memcpy(ref, x, sizeof(float) * (size_t)rows * n);
  for (int r = 0; r < rows; r++) {
    di_v4_rmsnorm(ref + (size_t)r * n, n, w, cfg.rms_eps);
    di_v4_rope_apply(&cx.compress_rope, ref + (size_t)r * n, n, pos[r / heads], 1);
  }
  float *inv = dup_dev(cx.compress_rope.inv_freq, 4 * (size_t)(rd / 2)), *dw = w ? dup_dev(w, 4 * (size_t)n) : NULL;
  int32_t *dpos = dup_dev(pos, sizeof pos);
  const float af = (float)cx.compress_rope.p->attention_factor;
  float *out[2];
  for (int f = 0; f < 2; f++) {
    di_v4k_fuse(f);
    float *dx = dup_dev(x, 4 * (size_t)rows * n);
    CHECK(di_v4k_rmsnorm_rope(dx, n, rows, n, dw, (float)cfg.rms_eps, heads, dpos, inv, rd, af, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    out[f] = from_dev(dx, (size_t)rows * n);
    di_cut_free(dx);
  }
  di_v4k_fuse(-1);
  const double e = test_rel_l2(out[1], ref, (size_t)rows * n);
  const int same = memcmp(out[0], out[1], sizeof(float) * (size_t)rows * n) == 0;
  printf("rmsnorm + rope (%d rows of %d, %s): vs the CPU rel L2 %.2e, one launch vs two %s\n", rows, n,
         weighted ? "weighted" : "unweighted", e, same ? "bit-identical" : "DIFFERS");
  CHECKF(e < 1e-6, "rmsnorm + rope: rel L2 %.3e", e);
  CHECKF(same, "rmsnorm + rope: the one-launch form's bits differ from the two launches'");
  free(x); free(w); free(ref); free(out[0]); free(out[1]);
  di_cut_free(inv); di_cut_free(dpos);
  if (dw) di_cut_free(dw);
}

/* One activation row's FP8 GEMV (di_cuk_fp8_gemv, W8A16: the native mode's attention and shared-expert products)
 * at V4-Flash's shapes (wq_b 32768 x 1024, wo_b 4096 x 8192, wq_a 1024 x 4096) and an odd one: the one-row forms
 * (di_cuk_fp8_gemv1_form 1, 2) and the f32-row entry (di_cuk_fp8_gemv1_f32x, rounding to bf16 inside) bit for bit
 * equal to form 0 over the bf16 copy, all against the double product of the dequantized weights and the bf16
 * activations (rel L2 1e-5). 128 x 128 scale blocks, as V4's checkpoints. */
static void check_fp8_gemv_forms(int N, int K) {
  const int sr = (N + 127) / 128, sc = (K + 127) / 128;
  uint8_t *q = malloc((size_t)N * K);
  float *scale = malloc(sizeof(float) * (size_t)sr * sc), *x = rnd((size_t)K, 1);
  uint16_t *xb = malloc(2 * (size_t)K);
  for (size_t i = 0; i < (size_t)N * K; i++) q[i] = di_f32_to_fp8e4m3(urand() * 400);
  for (int i = 0; i < sr * sc; i++) scale[i] = 1e-3f * (1.5f + urand());
  float *dxf = dup_dev(x, 4 * (size_t)K); /* the f32 row itself (di_cuk_fp8_gemv1_f32x rounds it) */
  for (int k = 0; k < K; k++) x[k] = di_bf16_to_f32(xb[k] = di_f32_to_bf16(x[k]));
  di_cuk_fp8w w = {dup_dev(q, (size_t)N * K), dup_dev(scale, sizeof(float) * (size_t)sr * sc), K, 128, 128, sc};
  void *dx = dup_dev(xb, 2 * (size_t)K);
  float *dy = zeros_dev(4 * (size_t)N), *y[6];
  /* y[f]: form f over the bf16 copy; y[3 + f]: form f from the f32 row */
  for (int f = 0; f < 6; f++) {
    di_cuk_fp8_gemv1_form(f % 3);
    if (f < 3) CHECK(di_cuk_fp8_gemv(1, N, K, dx, K, w, dy, N, 1, 0.0f, NULL) == DI_OK);
    else CHECK(di_cuk_fp8_gemv1_f32x(N, K, dxf, w, dy, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    y[f] = from_dev(dy, (size_t)N);
  }
  di_cuk_fp8_gemv1_form(-1);
  float *ref = malloc(4 * (size_t)N);
  for (int n = 0; n < N; n++) {
    double a = 0;
    for (int k = 0; k < K; k++) a += (double)di_fp8e4m3_to_f32(q[(size_t)n * K + k]) * scale[(n / 128) * sc + k / 128] * x[k];
    ref[n] = (float)a;
  }
  const double e = test_rel_l2(y[0], ref, (size_t)N);
  int same = 1;
  for (int f = 1; f < 6; f++) same &= memcmp(y[0], y[f], 4 * (size_t)N) == 0;
  printf("fp8 gemv one row %d x %d: rel L2 %.2e vs double, forms 1, 2 and from f32 vs form 0 %s\n", N, K, e,
         same ? "bit-identical" : "DIFFER");
  CHECKF(e < 1e-5, "fp8 gemv %d x %d: rel L2 %.3e", N, K, e);
  CHECKF(same, "fp8 gemv %d x %d: the one-row forms' bits differ", N, K);
  free(q); free(scale); free(x); free(xb); free(ref);
  for (int f = 0; f < 6; f++) free(y[f]);
  di_cut_free((void *)w.q); di_cut_free((void *)w.scale); di_cut_free(dx); di_cut_free(dy); di_cut_free(dxf);
}

/* The kv row's norm + rope + window write (di_v4k_rmsnorm_rope_window): one launch (di_v4k_fuse 2) against the three,
 * bit for bit in the rows and the window pool (3 tokens of one sequence at positions 5, 70, 130 of a 3-block table,
 * 2 layers, layer 1), with the graphs' device count below the rows: the third row is not written in either form. */
static void check_norm_rope_window(void) {
  const int T = 3, hd = cfg.head_dim, nl = 2, nblk = 3, rd = cx.compress_rope.p->dim;
  const int32_t pos[3] = {5, 70, 130}, seq_of[3] = {0, 0, 0}, n_tok = 2;
  float *x = rnd((size_t)T * hd, 2), *w = rnd((size_t)hd, 1);
  int32_t *tab = ident_table(nblk), *dpos = dup_dev(pos, sizeof pos), *dso = dup_dev(seq_of, sizeof seq_of),
          *dn = dup_dev(&n_tok, sizeof n_tok);
  di_v4k_seq sq;
  memset(&sq, 0, sizeof sq);
  sq.n = T;
  sq.pos0 = 5;
  sq.tab[3] = tab;
  di_v4k_seq *dsq = dup_dev(&sq, sizeof sq);
  float *inv = dup_dev(cx.compress_rope.inv_freq, 4 * (size_t)(rd / 2)), *dw = dup_dev(w, 4 * (size_t)hd);
  const size_t np = (size_t)nblk * nl * 64 * hd;
  float *rows[2], *pools[2];
  for (int f = 0; f < 2; f++) {
    float *dx = dup_dev(x, 4 * (size_t)T * hd), *dpool = zeros_dev(4 * np);
    di_v4k_fuse(2 * f);
    CHECK(di_v4k_rmsnorm_rope_window(dx, T, hd, dw, (float)cfg.rms_eps, dpos, inv, rd, (float)cx.compress_rope.p->attention_factor,
                                     dso, dsq, dpool, nl, 1, dn, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    rows[f] = from_dev(dx, (size_t)T * hd);
    pools[f] = from_dev(dpool, np);
    di_cut_free(dx);
    di_cut_free(dpool);
  }
  di_v4k_fuse(-1);
  int written = 0, third = 0;
  for (int t = 0; t < T; t++) {
    const float *slot = pools[1] + (((size_t)(pos[t] / 64) * nl + 1) * 64 + pos[t] % 64) * hd;
    const int eq = memcmp(slot, rows[1] + (size_t)t * hd, 4 * (size_t)hd) == 0;
    if (t < n_tok) written += eq;
    else for (int e = 0; e < hd; e++) third += slot[e] != 0;
  }
  const int same = memcmp(rows[0], rows[1], 4 * (size_t)T * hd) == 0 && memcmp(pools[0], pools[1], 4 * np) == 0;
  printf("kv norm + rope + window write: one launch vs three %s, rows in the window %d of %d, past the count untouched %s\n",
         same ? "bit-identical" : "DIFFER", written, n_tok, third ? "NO" : "yes");
  CHECKF(same && written == n_tok && !third, "kv norm + rope + window: same %d, written %d, past the count %d", same, written, third);
  free(x); free(w); free(rows[0]); free(rows[1]); free(pools[0]); free(pools[1]);
  di_cut_free(tab); di_cut_free(dpos); di_cut_free(dso); di_cut_free(dn); di_cut_free(dsq); di_cut_free(inv); di_cut_free(dw);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  setup();
  check_linear(0, 5, 1024, 4096);
  check_linear(1, 3, 512, 4096);
  check_linear(0, 9, 64, 1000);
  check_linear(0, 11, 37, 2056); /* rows past the end in a CTA, a partial staged chunk, two token tiles */
  check_linear(0, 4, 40, 999); /* the one-column path (rows not a multiple of 8) */
  check_linear(1, 2, 24, 1001);
  check_linear(0, 3, 8200, 1032); /* two rows a warp in the one-token form, a partial last CTA and chunk */
  check_linear_groups(3, 8, 1024, 4096);
  check_fp8_gemv_forms(32768, 1024);
  check_fp8_gemv_forms(4096, 8192);
  check_fp8_gemv_forms(1024, 4096);
  check_fp8_gemv_forms(1000, 1040); /* partial warps of rows, a partial scale block and chunk */
  check_fp8_gemv_forms(1000, 1008); /* four rows a warp, a partial chunk */
  check_norm_rope(64, 0);
  check_norm_rope(1, 1);
  check_norm_rope_window();
  check_hc();
  check_pool(1, 4);
  check_pool(0, 4);
  check_pool(1, 16);
  check_pool(0, 16);
  check_indexer();
  check_attend(DI_V4_ATTN_SLIDING);
  check_attend(DI_V4_ATTN_CSA);
  check_attend(DI_V4_ATTN_HCA);
  check_route(0);
  check_route(1);
  check_experts(0);
  check_experts(1);
  check_experts_mx(4096, 2048, 2);
  check_experts_mx(4096, 2048, 13); /* tiles of up to 8 tokens of an expert */
  check_experts_mx(96, 40, 5);
  check_experts_mx(160, 96, 9); /* both products staged, partial steps and partial warps of rows */
  check_experts_mx(4160, 4128, 2); /* rows past MXS_WHOLE columns: one token's staging per step, partial last step */
  check_swiglu();
  check_native_model();
  return test_finish("test_cuda_v4_kernels");
}
