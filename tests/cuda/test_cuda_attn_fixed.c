/* The fixed-split MLA attention (k_mla_fixed.cu, issue 19) at V2-Lite (16 heads) and V3 (128 heads)
 * shapes: against a float64 reference (relative L2 error of the bf16 output < 1e-2, the bound
 * test_cuda_kernels holds the other attention kernels to), and bit-identical rows however the work is
 * cut: the chunk's rows in items of 32 rows with every split in one CTA (prefill), in items of 16 rows
 * with one CTA per split and the combine kernel (decode / verify), and each token alone as its own
 * item reaching only its own position (a decode row) in both forms. Positions cross several splits of
 * DI_CUK_ATTN_FIXED_SPLIT keys (and of 64, another split size); the block table is scrambled. The
 * tensor-core form (k_mla_fixed_tc.cu, 64-row items) must give the CUDA-core kernel's bits for every row
 * in every cut too (64-row items at different offsets, a CTA per split, each token alone, a chunk's
 * rows alone == the same rows of the whole pass) and be accurate against float64 by itself; so must the decode
 * form (di_cuk_mla_attn_fixed_dec, 16-row items, two warp roles a CTA) in every cut of 16-row items. `--bench` times the fixed-split kernel
 * against today's prefill attention (di_cuk_mla_attn, 64-row items, no splits) and the batch-invariant
 * cluster form on whole prompts of 512 / 4,096 / 16,384 tokens, after one decode token at 600 / 2,000 / 8,000 keys
 * on the CUDA-core kernel and its decode form (`--bench --decode`: those rows only). Built only with nvcc. */
#include "backend/cuda/cuda_kernels.h"
#include "test_util.h"
#include "util/numeric.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define D DI_CUK_MLA_D
#define DR DI_CUK_MLA_R

#define CUT_RNG_SEED 88172645463325252ull
#include "cuda_test_rand.h" /* urand, nrand, rand_bf16, dup_dev */

typedef struct problem {
  int H, ctx, T, nblk; /* one sequence of ctx keys; its last T tokens are the chunk */
  int32_t *bt, *pos;
  uint16_t *Q, *cache;
  void *dQ, *dc, *dbt, *dpos;
} problem;

/* items for the chunk's rows from token t0 on: rows of `bm` (the first of each group `first` rows, when
 * > 0, so that rows are grouped differently) over every split in one CTA, or (separate) one CTA per
 * split + combine items; alone: each token its own item(s), keys up to its own position */
static int g_split = DI_CUK_ATTN_FIXED_SPLIT;
static int make_items(const problem *p, int bm, int first, int separate, int alone, int t0, di_cuk_attn_item *items,
                      di_cuk_combine_item *citems, int *nci, int *parts) {
  int ni = 0, part = 0;
  *nci = 0;
  const int step = alone ? p->H : (p->T - t0) * p->H;
  for (int g0 = t0 * p->H; g0 < p->T * p->H; g0 += step)
    for (int r0 = g0; r0 < g0 + step;) {
      const int len = r0 == g0 && first > 0 ? first : bm;
      int r1 = r0 + len < g0 + step ? r0 + len : g0 + step;
      int maxpos = p->pos[(r1 - 1) / p->H];
      ni += di_cuk_attn_fixed_items(r0, r1, 0, maxpos, p->pos[r0 / p->H], g_split, separate, &part, items + ni, citems,
                                    nci);
      r0 = r1;
    }
  *parts = part;
  return ni;
}

/* the form of one run: item rows bm (64 on the tensor-core kernel), the first item's rows of each group
 * (0: bm), separate splits, each token alone, the first token, the kernel (0 mla_fixed_kernel, 1 the
 * tensor-core form, 2 / 3 the decode form of 16-row items, 2 / 1 key tiles ahead, 4 the decode form merging
 * its own partials: no combine launch, its counters checked back at zero) */
typedef struct cut {
  int bm, first, sep, alone, t0, tc;
  const char *name;
} cut;

/* runs one item form; returns the bf16 output [T*H][DR] (host; rows before t0 zero) or NULL */
static uint16_t *run_form(const problem *p, cut f, double *ms) {
  /* (a first item of `first` rows adds a row group; session 15's 5000-key cut overran T * H / 16 groups) */
  const int cap = ((p->T * p->H + 15) / 16 + 2) * (p->ctx / g_split + 2) + 16;
  di_cuk_attn_item *items = malloc(sizeof *items * (size_t)cap);
  di_cuk_combine_item *citems = malloc(sizeof *citems * (size_t)cap);
  int nci, parts;
  int ni = make_items(p, f.bm, f.first, f.sep, f.alone, f.t0, items, citems, &nci, &parts);
  int32_t counts[2] = {ni, nci};
  void *dit = dup_dev(items, sizeof *items * (size_t)ni), *dcit = dup_dev(citems, sizeof *citems * (size_t)(nci ? nci : 1));
  void *dn = dup_dev(counts, 8);
  const size_t nout = (size_t)p->T * p->H * DR;
  void *dout = di_cut_malloc(nout * 2);
  void *dpo = di_cut_malloc((size_t)(parts ? parts : 1) * 64 * DR * 4), *dpl = di_cut_malloc((size_t)(parts ? parts : 1) * 64 * 4);
  void *dslots = f.tc == 1 ? di_cut_malloc(di_cuk_mla_fixed_tc_slot_bytes()) : NULL;
  int32_t *zcnt = calloc((size_t)(parts ? parts : 1), 4);
  void *dcnt = f.tc == 4 ? dup_dev(zcnt, 4 * (size_t)(parts ? parts : 1)) : NULL;
  uint16_t *zero = calloc(nout, 2);
  di_cut_h2d(dout, zero, nout * 2);
  free(zero);
  const float scale = 0.0721f;
  di_cut_sync();
  double t0 = di_cut_time_ms();
  di_status st = f.tc == 1 ? di_cuk_mla_attn_fixed_tc(p->dQ, p->dc, p->dbt, p->nblk, p->dpos, p->H, scale, g_split,
                                                      dit, dn, ni, dout, dpo, dpl, dslots, NULL)
                 : f.tc >= 2 ? di_cuk_mla_attn_fixed_dec(p->dQ, p->dc, p->dbt, p->nblk, p->dpos, p->H, scale, g_split,
                                                       dit, dn, ni, f.tc == 3 ? 1 : 2, dout, dpo, dpl, dcnt, NULL)
                      : di_cuk_mla_attn_fixed(p->dQ, p->dc, 0, p->dbt, p->nblk, p->dpos, p->H, scale, g_split, dit, dn,
                                              ni, f.bm, dout, dpo, dpl, NULL);
  if (st == DI_OK && nci && !dcnt) st = di_cuk_mla_combine_fixed(dcit, (int32_t *)dn + 1, nci, dpo, dpl, dout, NULL);
  CHECKF(st == DI_OK && di_cut_sync() == 0, "%s: %s", f.name, di_last_error());
  if (ms) *ms = di_cut_time_ms() - t0;
  if (dcnt) { /* the merge leaves every counter at zero for the next launch */
    di_cut_d2h(zcnt, dcnt, 4 * (size_t)(parts ? parts : 1));
    int nz = 0;
    for (int i = 0; i < (parts ? parts : 1); i++) nz += zcnt[i] != 0;
    CHECKF(nz == 0, "%s: %d merge counters not back at zero", f.name, nz);
    di_cut_free(dcnt);
  }
  free(zcnt);
  uint16_t *out = malloc(nout * 2);
  di_cut_d2h(out, dout, nout * 2);
  void *ptrs[] = {dit, dcit, dn, dout, dpo, dpl, dslots};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
    if (ptrs[i]) di_cut_free(ptrs[i]);
  free(items); free(citems);
  return out;
}

static void problem_init(problem *p, int H, int ctx, int T) {
  p->H = H; p->ctx = ctx; p->T = T;
  p->nblk = (ctx + 63) / 64;
  p->bt = malloc(4 * (size_t)p->nblk);
  for (int i = 0; i < p->nblk; i++) p->bt[i] = i;
  for (int i = p->nblk - 1; i > 0; i--) { int j = (int)(urand() * (i + 1)); int32_t t = p->bt[i]; p->bt[i] = p->bt[j]; p->bt[j] = t; }
  p->pos = malloc(4 * (size_t)T);
  for (int i = 0; i < T; i++) p->pos[i] = ctx - T + i;
  p->cache = rand_bf16((size_t)p->nblk * 64 * D, 1.f);
  p->Q = rand_bf16((size_t)T * H * D, 0.25f);
  p->dQ = dup_dev(p->Q, (size_t)T * H * D * 2);
  p->dc = dup_dev(p->cache, (size_t)p->nblk * 64 * D * 2);
  p->dbt = dup_dev(p->bt, 4 * (size_t)p->nblk);
  p->dpos = dup_dev(p->pos, 4 * (size_t)T);
}
static void problem_free(problem *p) {
  di_cut_free(p->dQ); di_cut_free(p->dc); di_cut_free(p->dbt); di_cut_free(p->dpos);
  free(p->bt); free(p->pos); free(p->cache); free(p->Q);
}

/* relative L2 error of the output against float64 over every row (scores in double, softmax in double) */
static double ref_err(const problem *p, const uint16_t *out) {
  double num = 0, den = 0;
  double *sc = malloc(sizeof(double) * (size_t)p->ctx), *acc = malloc(sizeof(double) * DR);
  for (int t = 0; t < p->T; t++)
    for (int h = 0; h < p->H; h++) {
      const uint16_t *q = p->Q + ((size_t)t * p->H + h) * D;
      const int nk = p->pos[t] + 1;
      double mx = -INFINITY;
      for (int k = 0; k < nk; k++) {
        const uint16_t *kr = p->cache + ((size_t)p->bt[k / 64] * 64 + k % 64) * D;
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)di_bf16_to_f32(q[d]) * di_bf16_to_f32(kr[d]);
        sc[k] = s * 0.0721f;
        if (sc[k] > mx) mx = sc[k];
      }
      double l = 0;
      memset(acc, 0, sizeof(double) * DR);
      for (int k = 0; k < nk; k++) {
        double w = exp(sc[k] - mx);
        l += w;
        const uint16_t *kr = p->cache + ((size_t)p->bt[k / 64] * 64 + k % 64) * D;
        for (int d = 0; d < DR; d++) acc[d] += w * di_bf16_to_f32(kr[d]);
      }
      const uint16_t *o = out + ((size_t)t * p->H + h) * DR;
      for (int d = 0; d < DR; d++) {
        double r = acc[d] / l, g = di_bf16_to_f32(o[d]);
        num += (r - g) * (r - g);
        den += r * r;
      }
    }
  free(sc); free(acc);
  return sqrt(num / (den > 0 ? den : 1));
}

static size_t count_diff(const uint16_t *a, const uint16_t *b, size_t from, size_t to) {
  size_t d = 0;
  for (size_t i = from; i < to; i++) d += a[i] != b[i];
  return d;
}

/* The CUDA-core kernel's output in 32-row items with every split in one CTA is the reference of the bits;
 * every other cut of the work, on either kernel, must give the same bits for every row. */
static void check_shape(int H, int ctx, int T, const char *label) {
  problem p;
  problem_init(&p, H, ctx, T);
  const size_t n = (size_t)T * H * DR;
  uint16_t *base = run_form(&p, (cut){32, 0, 0, 0, 0, 0, "32-row items, splits in one CTA"}, NULL);
  const int tc1 = T > 4 ? T / 3 : 1; /* the tensor-core kernel on a later part of the rows (a chunk) */
  const cut forms[] = {
      {16, 0, 0, 0, 0, 0, "16-row items, splits in one CTA"},
      {16, 0, 1, 0, 0, 0, "16-row items, a CTA per split + combine"},
      {32, 0, 1, 0, 0, 0, "32-row items, a CTA per split + combine"},
      {16, 0, 1, 1, 0, 0, "each token alone, a CTA per split"},
      {16, 0, 0, 1, 0, 0, "each token alone, splits in one CTA"},
      {64, 0, 0, 0, 0, 1, "tc: 64-row items, splits in one CTA"},
      {64, 16, 0, 0, 0, 1, "tc: 64-row items from row 16"},
      {64, 40, 0, 0, 0, 1, "tc: 64-row items from row 40"},
      {64, 0, 1, 0, 0, 1, "tc: 64-row items, a CTA per split + combine"},
      {64, 0, 0, 1, 0, 1, "tc: each token alone, splits in one CTA"},
      {64, 0, 1, 1, 0, 1, "tc: each token alone, a CTA per split"},
      {64, 0, 0, 0, tc1, 1, "tc: the rows of a chunk (a later part)"},
      {16, 0, 1, 0, 0, 2, "dec: 16-row items, a CTA per split + combine"},
      {16, 0, 0, 0, 0, 2, "dec: 16-row items, splits in one CTA"},
      {16, 8, 1, 0, 0, 2, "dec: 16-row items from row 8, a CTA per split"},
      {16, 0, 1, 1, 0, 2, "dec: each token alone, a CTA per split"},
      {16, 0, 0, 1, 0, 2, "dec: each token alone, splits in one CTA"},
      {16, 0, 1, 0, 0, 3, "dec (1 ahead): 16-row items, a CTA per split"},
      {16, 0, 1, 1, 0, 3, "dec (1 ahead): each token alone, a CTA per split"},
      {16, 0, 1, 0, 0, 4, "dec + merge: 16-row items, a CTA per split"},
      {16, 8, 1, 0, 0, 4, "dec + merge: 16-row items from row 8"},
      {16, 0, 1, 1, 0, 4, "dec + merge: each token alone, a CTA per split"},
  };
  for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
    uint16_t *o = run_form(&p, forms[f], NULL);
    const size_t from = (size_t)forms[f].t0 * H * DR, diff = count_diff(o, base, from, n);
    CHECKF(diff == 0, "%s: %s: %zu of %zu values differ from the CUDA-core kernel's 32-row items", label, forms[f].name,
           diff, n - from);
    printf("attn_fixed %-26s %-46s %s\n", label, forms[f].name, diff ? "DIFFERENT" : "bit-identical");
    if (forms[f].tc == 1 && !forms[f].t0 && !forms[f].first) { /* its own accuracy, whatever the bits (the decode
                                                                * form: bit-equal to the checked base) */
      const double e = ref_err(&p, o);
      CHECKF(e < 1e-2, "%s: %s: rel err vs float64 %.3e", label, forms[f].name, e);
    }
    free(o);
  }
  double err = ref_err(&p, base);
  CHECKF(err < 1e-2, "%s: rel err vs float64 %.3e", label, err);
  printf("attn_fixed %-26s H=%3d ctx=%5d T=%3d split %d: rel err vs float64 %.2e\n", label, H, ctx, T, g_split, err);
  free(base);
  problem_free(&p);
}

/* whole prompts: the fixed form (32-row items), its tensor-core kernel (64-row items), di_cuk_mla_attn
 * with 64-row items (the default mode's absorbed prefill form) and the strided cluster form; ms per
 * call, median of 5 */
static int cmp_dbl(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static void bench_prompt(int H, int T) {
  problem p;
  problem_init(&p, H, T, T);
  const size_t nrows = (size_t)T * H;
  const int cap = (int)(nrows / 16) * 16 + 64;
  di_cuk_attn_item *items = malloc(sizeof *items * (size_t)cap);
  di_cuk_combine_item *citems = malloc(sizeof *citems * 4);
  void *dout = di_cut_malloc(nrows * DR * 2), *dpo = di_cut_malloc(64 * DR * 4 * 16), *dpl = di_cut_malloc(64 * 4 * 16);
  double med[4];
  void *dslots = di_cut_malloc(di_cuk_mla_fixed_tc_slot_bytes());
  const int cl = di_cuk_attn_cluster_ok(16) ? 16 : 8;
  for (int form = 0; form < 4; form++) {
    const int bm = form == 0 ? 32 : form == 1 || form == 3 ? 64 : 16;
    int ni = 0, part = 0, nci = 0;
    for (size_t r0 = 0; r0 < nrows; r0 += bm) {
      int r1 = (int)(r0 + bm < nrows ? r0 + bm : nrows), maxpos = p.pos[(r1 - 1) / H];
      if (form == 0 || form == 3) ni += di_cuk_attn_fixed_items((int)r0, r1, 0, maxpos, 0, g_split, 0, &part, items + ni, citems, &nci);
      else if (form == 1) items[ni++] = (di_cuk_attn_item){(int)r0, r1, 0, 0, maxpos + 1, -1, 0};
      else ni += di_cuk_attn_cluster_items((int)r0, r1, 0, maxpos + 1, 0, cl, 1, 1, &part, items + ni, citems, &nci);
    }
    int32_t counts[2] = {ni, 0};
    void *dit = dup_dev(items, sizeof *items * (size_t)ni), *dn = dup_dev(counts, 8);
    double t[5];
    for (int rep = 0; rep < 6; rep++) {
      di_cut_sync();
      double t0 = di_cut_time_ms();
      di_status st = form == 3 ? di_cuk_mla_attn_fixed_tc(p.dQ, p.dc, p.dbt, p.nblk, p.dpos, H, 0.07f, g_split, dit, dn, ni, dout, dpo, dpl, dslots, NULL)
                   : form == 0 ? di_cuk_mla_attn_fixed(p.dQ, p.dc, 0, p.dbt, p.nblk, p.dpos, H, 0.07f, g_split, dit, dn, ni, bm, dout, dpo, dpl, NULL)
                   : form == 1 ? di_cuk_mla_attn(p.dQ, p.dc, 0, p.dbt, p.nblk, p.dpos, H, 0.07f, dit, dn, ni, bm, dout, dpo, dpl, NULL)
                               : di_cuk_mla_attn_cluster(p.dQ, p.dc, 0, p.dbt, p.nblk, p.dpos, H, 0.07f, dit, dn, ni, cl, 1,
                                                         dout, dpo, dpl, NULL, NULL);
      CHECKF(st == DI_OK && di_cut_sync() == 0, "bench form %d: %s", form, di_last_error());
      if (rep) t[rep - 1] = di_cut_time_ms() - t0;
    }
    qsort(t, 5, sizeof t[0], cmp_dbl);
    med[form] = t[2];
    di_cut_free(dit); di_cut_free(dn);
  }
  /* causal attention FLOPs: 2 * rows * (keys/2) * (576 + 512) */
  const double flop = 2.0 * (double)nrows * (T / 2.0) * (D + DR);
  printf("bench attention H=%d prompt %5d: fixed-split %.3f ms (%.0f TFLOP/s), fixed-split tc %.3f ms (%.0f), "
         "mla_attn 64-row %.3f ms (%.0f), invariant cluster %.3f ms (%.0f)\n", H, T, med[0], flop / med[0] / 1e9,
         med[3], flop / med[3] / 1e9, med[1], flop / med[1] / 1e9, med[2], flop / med[2] / 1e9);
  di_cut_free(dslots);
  di_cut_free(dout); di_cut_free(dpo); di_cut_free(dpl);
  free(items); free(citems);
  problem_free(&p);
}

/* one decode token (16-row item of H = 16 heads, a CTA per split + the combine kernel) at ctx keys: the
 * CUDA-core kernel against its decode form, us per call (attention + combine), mean of 200 calls */
static void bench_decode(int ctx) {
  problem p;
  problem_init(&p, 16, ctx, 1);
  const int cap = ctx / g_split + 4;
  di_cuk_attn_item *items = malloc(sizeof *items * (size_t)cap);
  di_cuk_combine_item *citems = malloc(sizeof *citems * 4);
  int nci, parts;
  const int ni = make_items(&p, 16, 0, 1, 0, 0, items, citems, &nci, &parts);
  int32_t counts[2] = {ni, nci};
  void *dit = dup_dev(items, sizeof *items * (size_t)ni), *dcit = dup_dev(citems, sizeof *citems * (size_t)(nci ? nci : 1));
  void *dn = dup_dev(counts, 8);
  void *dout = di_cut_malloc(16 * DR * 2), *dpo = di_cut_malloc((size_t)(parts ? parts : 1) * 64 * DR * 4);
  void *dpl = di_cut_malloc((size_t)(parts ? parts : 1) * 64 * 4);
  int32_t *zcnt = calloc((size_t)(parts ? parts : 1), 4);
  void *dcnt = dup_dev(zcnt, 4 * (size_t)(parts ? parts : 1)); /* the merge's counters, zero */
  free(zcnt);
  double us[4];
  for (int form = 0; form < 4; form++) {
    double t0 = 0;
    for (int rep = 0; rep < 220; rep++) {
      if (rep == 20) { di_cut_sync(); t0 = di_cut_time_ms(); }
      di_status st = form ? di_cuk_mla_attn_fixed_dec(p.dQ, p.dc, p.dbt, p.nblk, p.dpos, 16, 0.07f, g_split, dit, dn, ni,
                                                     form == 1 ? 1 : 2, dout, dpo, dpl, form == 3 ? dcnt : NULL, NULL)
                          : di_cuk_mla_attn_fixed(p.dQ, p.dc, 0, p.dbt, p.nblk, p.dpos, 16, 0.07f, g_split, dit, dn, ni,
                                                  16, dout, dpo, dpl, NULL);
      if (st == DI_OK && nci && form != 3) st = di_cuk_mla_combine_fixed(dcit, (int32_t *)dn + 1, nci, dpo, dpl, dout, NULL);
      CHECKF(st == DI_OK, "bench decode form %d: %s", form, di_last_error());
    }
    CHECKF(di_cut_sync() == 0, "bench decode form %d: %s", form, di_last_error());
    us[form] = (di_cut_time_ms() - t0) * 1e3 / 200;
  }
  di_cut_free(dcnt);
  printf("bench decode one token H=16 ctx %5d (%d splits): fixed-split %.1f us, decode form %.1f us (1 tile ahead), "
         "%.1f us (2 ahead), %.1f us (2 ahead, its own merge)\n", ctx, ni, us[0], us[1], us[2], us[3]);
  void *ptrs[] = {dit, dcit, dn, dout, dpo, dpl};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) di_cut_free(ptrs[i]);
  free(items); free(citems);
  problem_free(&p);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
    const int T[] = {512, 4096, 16384};
    const int ctx[] = {600, 2000, 8000};
    for (int i = 0; i < 3; i++) bench_decode(ctx[i]);
    if (argc > 2 && !strcmp(argv[2], "--decode")) return test_finish("test_cuda_attn_fixed --bench --decode");
    for (int i = 0; i < 3; i++) bench_prompt(16, T[i]);
    bench_prompt(128, 4096);
    g_split = 64;
    printf("split 64:\n");
    bench_prompt(16, 4096);
    return test_finish("test_cuda_attn_fixed --bench");
  }
  check_shape(16, 1000, 40, "V2-Lite, chunk of 40");
  check_shape(16, 300, 300, "V2-Lite, whole prompt 300");
  check_shape(128, 2100, 6, "V3, chunk of 6");
  check_shape(16, 5000, 3, "V2-Lite, 5000 keys");
  g_split = 64; /* another split size (DEEPINFER_CUDA_ATTN_FIXED=64) */
  check_shape(16, 1000, 40, "V2-Lite, chunk of 40");
  check_shape(128, 700, 5, "V3, chunk of 5");
  return test_finish("test_cuda_attn_fixed");
}
