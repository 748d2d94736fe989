/* Model-level agreement of the CUDA backend on every fixture checkpoint (tests/data/models/).
 * Tolerances held (bf16 GEMM operands, bf16 KV cache and absorbed query; fp32 residual, norms,
 * router and softmax), per model over the positions of its three golden prompts: the relative L2
 * error of each position's logits against the golden logits (HF, float32) and against the CPU
 * backend has median < 1.5e-2 and is < 5e-2 at >= 85% of the positions; top-1 agrees with the
 * golden top-1 at >= 90% of the positions whose golden top1-top2 margin exceeds 0.1. The rest are
 * router near-ties: tiny random models have many, and a flipped expert moves a position's logits by
 * 5-20%. (Checked on the CPU backend itself: perturbing dsv3-odd's embedding by +-1% random noise
 * moves its 1-token prompt's logits by 17% in one of six trials, exactly what CUDA shows there.)
 * Within the CUDA backend: token-by-token decode through the paged cache (CUDA graphs on; the decode
 * kernels, not the prompt pass's) is held to the same per-position bounds against the whole-prompt
 * pass and against the golden logits, and top-1 equal to the prompt pass at >= 95% of margin > 0.1
 * positions (an aggregate L2 over a sequence is dominated by the router near-ties above: dsv3-odd's
 * 150-token prompt moved from 2.6e-2 to 7.2e-2 when the decode attention's key tiles went from 32 to
 * 64, while its per-position median is 7.5e-3 with 96% of positions within 5e-2); the
 * three prompts decoded together vs alone, rel L2 < 1e-2; GPU greedy sampling = argmax of the logits.
 * Built only with nvcc; run on the device by scripts/device_tests.sh. */
#include "api/model_internal.h"
#include "model/safetensors.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "test_util.h"
#include "test_models.h"
#include <math.h>
#include <stdlib.h>

static int argmax(const float *v, int n, float *margin) {
  int b = 0;
  for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
  float s = -INFINITY;
  for (int i = 0; i < n; i++) if (i != b && v[i] > s) s = v[i];
  if (margin) *margin = v[b] - s;
  return b;
}
static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
/* per-position relative errors, pooled over a model's prompts: median and the fraction under 5e-2 */
typedef struct pool {
  double e[1024];
  int n;
} pool;
static void pool_add(pool *p, const float *got, const float *ref, int T, int V) {
  for (int t = 0; t < T && p->n < 1024; t++) p->e[p->n++] = test_rel_l2(got + (size_t)t * V, ref + (size_t)t * V, (size_t)V);
}
static void pool_stats(pool *p, double *median, double *frac_ok) {
  int ok = 0;
  for (int i = 0; i < p->n; i++) ok += p->e[i] < 5e-2;
  qsort(p->e, (size_t)p->n, sizeof(double), cmp_d);
  *median = p->n ? p->e[p->n / 2] : 0;
  *frac_ok = p->n ? (double)ok / p->n : 1;
}
/* top-1 disagreements among rows whose reference margin > 0.1 */
static int top1_bad(const float *got, const float *ref, int T, int V, int *checked) {
  int bad = 0;
  *checked = 0;
  for (int t = 0; t < T; t++) {
    float m;
    int r = argmax(ref + (size_t)t * V, V, &m);
    if (m <= 0.1f) continue;
    (*checked)++;
    if (argmax(got + (size_t)t * V, V, NULL) != r) bad++;
  }
  return bad;
}

typedef struct seqst {
  const int32_t *ids;
  int n;
  int32_t table[16];
  int nb;
} seqst;

/* Decodes the given sequences together (batch) one token per step; logits of each step per seq. */
static di_status decode_batch(di_backend *be, seqst *s, int ns, float **out, int V, int use_sample) {
  int maxn = 0;
  for (int i = 0; i < ns; i++) if (s[i].n > maxn) maxn = s[i].n;
  di_batch_seq bs[8];
  for (int i = 0; i < ns; i++) { bs[i].block_table = s[i].table; bs[i].n_blocks = s[i].nb; }
  float *lg = malloc(sizeof(float) * (size_t)ns * V);
  for (int p = 0; p < maxn; p++) {
    int32_t tok[8], pos[8], seq[8], rows[8];
    int T = 0;
    for (int i = 0; i < ns; i++)
      if (p < s[i].n) { tok[T] = s[i].ids[p]; pos[T] = p; seq[T] = i; rows[T] = T; T++; }
    di_batch b = {.n_tokens = T, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = ns, .seqs = bs,
                  .n_outputs = T, .output_rows = rows};
    DI_TRY(be->ops->submit(be, &b));
    DI_TRY(be->ops->wait(be, lg, NULL));
    if (use_sample) {
      di_sample_row sr[8];
      int32_t st[8];
      for (int j = 0; j < T; j++) { memset(&sr[j], 0, sizeof sr[j]); sr[j].temperature = 0; sr[j].top_p = 1; }
      DI_TRY(be->ops->sample(be, sr, T, st));
      for (int j = 0; j < T; j++) CHECKF(st[j] == argmax(lg + (size_t)j * V, V, NULL), "gpu greedy sample %d vs argmax", st[j]);
    }
    for (int j = 0; j < T; j++) memcpy(out[seq[j]] + (size_t)p * V, lg + (size_t)j * V, sizeof(float) * V);
  }
  free(lg);
  return DI_OK;
}

static void check_case(const char *name) {
  char dir[512], gpath[600];
  snprintf(dir, sizeof dir, "%s", test_path(name));
  snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
  di_model_options opt;
  di_model_options_default(&opt);
  opt.quiet = 1;
  opt.threads = 4;
  di_model *mc = NULL, *mg = NULL;
  di_status st = di_model_load(dir, &opt, &mc);
  CHECKF(st == DI_OK, "%s (cpu): %s", name, di_last_error());
  opt.accelerator = "cuda";
  st = di_model_load(dir, &opt, &mg);
  CHECKF(st == DI_OK, "%s (cuda): %s", name, di_last_error());
  di_st_file g;
  int gok = di_st_open(gpath, &g) == DI_OK;
  CHECK(gok);
  if (!mc || !mg || !gok) { di_model_free(mc); di_model_free(mg); if (gok) di_st_file_close(&g); return; }
  const int V = mg->cfg.vocab_size;
  float *step_logits[3] = {0}, *alone[3] = {0};
  const float *gold[3] = {0};
  seqst ss[3];
  int nseq = 0, top_chk = 0, top_bad = 0;
  static pool pg, pc;
  pg.n = pc.n = 0;
  for (int p = 0; p < 3; p++) {
    const di_st_tensor *tid = test_st_findf(&g, "p%d.ids", p), *tlog = test_st_findf(&g, "p%d.logits", p);
    if (!tid || !tlog) continue;
    const int T = (int)tid->shape[0];
    const int32_t *ids = tid->data;
    float *lg = malloc(sizeof(float) * (size_t)T * V), *lc = malloc(sizeof(float) * (size_t)T * V);
    st = di_model_score(mg, ids, T, lg);
    CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
    st = di_model_score(mc, ids, T, lc);
    CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
    double eg = test_rel_l2(lg, tlog->data, (size_t)T * V), ec = test_rel_l2(lg, lc, (size_t)T * V);
    pool_add(&pg, lg, tlog->data, T, V);
    pool_add(&pc, lg, lc, T, V);
    int chk, bad = top1_bad(lg, tlog->data, T, V, &chk);
    top_chk += chk;
    top_bad += bad;
    printf("%-32s p%d T=%3d  vs golden %.2e  vs cpu %.2e  top1 %d/%d\n", name, p, T, eg, ec, chk - bad, chk);
    /* stepwise decode, alone, through a scrambled block table */
    ss[nseq].ids = ids;
    ss[nseq].n = T;
    ss[nseq].nb = (T + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    for (int j = 0; j < ss[nseq].nb; j++) ss[nseq].table[j] = 5 * nseq + (ss[nseq].nb - 1 - j) + 1;
    step_logits[nseq] = malloc(sizeof(float) * (size_t)T * V);
    alone[nseq] = lg;
    gold[nseq] = tlog->data;
    free(lc);
    nseq++;
  }
  {
    double medg, fg, medc, fc;
    pool_stats(&pg, &medg, &fg);
    pool_stats(&pc, &medc, &fc);
    CHECKF(medg < 1.5e-2 && fg >= 0.85, "%s: cuda vs golden per-position error median %.3e, %.0f%% < 5e-2", name, medg, 100 * fg);
    CHECKF(medc < 1.5e-2 && fc >= 0.85, "%s: cuda vs cpu per-position error median %.3e, %.0f%% < 5e-2", name, medc, 100 * fc);
    CHECKF(top_bad * 10 <= top_chk, "%s: top-1 differs at %d of %d positions", name, top_bad, top_chk);
    printf("%-32s all prompts: vs golden median %.2e, %.0f%% of %d positions < 5e-2; vs cpu median %.2e, %.0f%%; top1 %d/%d\n",
           name, medg, 100 * fg, pg.n, medc, 100 * fc, top_chk - top_bad, top_chk);
  }
  di_backend *be = mg->backend;
  st = be->ops->kv_alloc(be, 32);
  CHECKF(st == DI_OK, "%s", di_last_error());
  static pool pd;
  pd.n = 0;
  for (int i = 0; i < nseq && st == DI_OK; i++) {
    float *o[1] = {step_logits[i]};
    st = decode_batch(be, &ss[i], 1, o, V, i == 0);
    CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
    double e = test_rel_l2(step_logits[i], alone[i], (size_t)ss[i].n * V), med, fok;
    int chk, bad = top1_bad(step_logits[i], alone[i], ss[i].n, V, &chk);
    static pool pa;
    pa.n = 0;
    pool_add(&pa, step_logits[i], alone[i], ss[i].n, V);
    pool_add(&pd, step_logits[i], gold[i], ss[i].n, V);
    pool_stats(&pa, &med, &fok);
    CHECKF(med < 1.5e-2 && fok >= 0.85 && bad * 20 <= chk,
           "%s seq %d: stepwise decode vs prompt pass per-position median %.3e, %.0f%% < 5e-2, top-1 bad %d of %d", name, i,
           med, 100 * fok, bad, chk);
    printf("%-32s seq %d stepwise decode vs prompt pass: rel L2 %.2e, per position median %.2e (%.0f%% < 5e-2)\n", name, i,
           e, med, 100 * fok);
  }
  if (pd.n > 0) { /* the decode path against the golden logits: the prompt pass's bounds, over all prompts */
    double medg, fokg;
    pool_stats(&pd, &medg, &fokg);
    CHECKF(medg < 1.5e-2 && fokg >= 0.85, "%s: stepwise decode vs golden per-position median %.3e, %.0f%% < 5e-2", name,
           medg, 100 * fokg);
    printf("%-32s stepwise decode vs golden: median %.2e, %.0f%% of %d positions < 5e-2\n", name, medg, 100 * fokg, pd.n);
  }
  if (nseq == 3 && st == DI_OK) {
    float *bo[3];
    for (int i = 0; i < 3; i++) bo[i] = malloc(sizeof(float) * (size_t)ss[i].n * V);
    st = decode_batch(be, ss, 3, bo, V, 1);
    CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
    for (int i = 0; i < 3; i++) {
      double e = test_rel_l2(bo[i], step_logits[i], (size_t)ss[i].n * V);
      CHECKF(e < 1e-2, "%s seq %d: batched vs alone rel err %.3e", name, i, e);
      printf("%-32s seq %d batched vs alone %.2e\n", name, i, e);
      free(bo[i]);
    }
  }
  di_cuda_stats cs;
  di_backend_cuda_stats(be, &cs);
  printf("%-32s steps %lld, graphs captured %lld, replays %lld\n", name, (long long)cs.steps,
         (long long)cs.graph_captures, (long long)cs.graph_replays);
  CHECK(cs.graph_replays > 0);
  for (int i = 0; i < nseq; i++) { free(step_logits[i]); free(alone[i]); }
  di_st_file_close(&g);
  di_model_free(mc);
  di_model_free(mg);
}

/* The MTP layer (ops->mtp; uploaded when the checkpoint has one) against the CPU backend's on fresh random inputs: a
 * 40-token sequence in two calls (the second reads the first's MTP KV entries through a scrambled block
 * table), random previous hidden states; logits and the pre-head hidden states of the output rows,
 * rel L2 < 3e-2 each call, top-1 equal where the CPU margin > 0.1. */
static void check_mtp(const char *name) {
  di_model_options opt;
  di_model_options_default(&opt);
  opt.quiet = 1;
  opt.threads = 4;
  di_model *mc = NULL, *mg = NULL;
  di_status st = di_model_load(test_path(name), &opt, &mc);
  CHECKF(st == DI_OK, "%s (cpu): %s", name, di_last_error());
  opt.accelerator = "cuda";
  st = di_model_load(test_path(name), &opt, &mg);
  CHECKF(st == DI_OK, "%s (cuda): %s", name, di_last_error());
  if (!mc || !mg) { di_model_free(mc); di_model_free(mg); return; }
  di_backend *bc = mc->backend, *bg = mg->backend;
  CHECKF(bg->n_mtp_layers == 1 && bg->ops->mtp, "%s: the CUDA backend has no MTP layer", name);
  if (bg->n_mtp_layers != 1 || !bg->ops->mtp) { di_model_free(mc); di_model_free(mg); return; }
  CHECK(bc->ops->kv_alloc(bc, 16) == DI_OK);
  CHECK(bg->ops->kv_alloc(bg, 16) == DI_OK);
  const int V = mc->cfg.vocab_size, H = mc->cfg.hidden_size, N = 40;
  int32_t toks[40], pos[40], seq[40], table[1] = {5};
  float *prev = malloc(sizeof(float) * N * H);
  uint64_t r = 99;
  for (int t = 0; t < N; t++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    toks[t] = (int32_t)((r >> 33) % (uint64_t)V);
    pos[t] = t;
    seq[t] = 0;
  }
  for (int i = 0; i < N * H; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    prev[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
  }
  di_batch_seq bs = {table, 1, 1};
  const int cuts[3] = {0, 33, N};
  for (int c = 0; c < 2; c++) {
    const int t0 = cuts[c], T = cuts[c + 1] - t0;
    int32_t rows[3] = {0, T / 2, T - 1};
    di_batch b = {.n_tokens = T, .tokens = toks + t0, .positions = pos + t0, .seq_of = seq, .n_seqs = 1, .seqs = &bs,
                  .n_outputs = 3, .output_rows = rows};
    float *lc = malloc(sizeof(float) * 3 * V), *lg = malloc(sizeof(float) * 3 * V);
    float *hc = malloc(sizeof(float) * 3 * H), *hg = malloc(sizeof(float) * 3 * H);
    st = bc->ops->mtp(bc, &b, prev + (size_t)t0 * H, lc, hc);
    CHECKF(st == DI_OK, "%s cpu mtp: %s", name, di_last_error());
    st = bg->ops->mtp(bg, &b, prev + (size_t)t0 * H, lg, hg);
    CHECKF(st == DI_OK, "%s cuda mtp: %s", name, di_last_error());
    const double el = test_rel_l2(lg, lc, (size_t)3 * V), eh = test_rel_l2(hg, hc, (size_t)3 * H);
    int chk, bad = top1_bad(lg, lc, 3, V, &chk);
    CHECKF(el < 3e-2 && eh < 3e-2 && bad == 0, "%s mtp call %d: logits rel %.3e, hidden rel %.3e, top-1 bad %d of %d",
           name, c, el, eh, bad, chk);
    printf("%-32s mtp call %d (%d tokens): logits rel %.2e, hidden rel %.2e, top-1 %d/%d\n", name, c, T, el, eh,
           chk - bad, chk);
    free(lc); free(lg); free(hc); free(hg);
  }
  free(prev);
  di_model_free(mc);
  di_model_free(mg);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  const char *cases[] = {"tests/data/models/dsv3-tiny",     "tests/data/models/dsv3-tiny-fp8",
                         "tests/data/models/dsv2-lite-tiny", "tests/data/models/dsv2-tiny",
                         "tests/data/models/dsv3-odd",       "tests/data/models/dsv2-yarn-tied",
                         "tests/data/models/dsv3-halfsplit", "tests/data/models/dsv3-fp8-16x12"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i]);
  check_mtp("models/default"); /* has a trained MTP layer */
  return test_finish("test_cuda_model");
}
