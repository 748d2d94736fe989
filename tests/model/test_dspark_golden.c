/* The C DSpark drafter (arch/dspark + backend/cpu/cpu_dspark) against the training code's float32
 * forward of the shipped drafter (tests/data/default-model/dspark_golden.safetensors, written by
 * training/dspark_train.py from the bf16 weights, no TF32): for held-out sequences and anchors, the
 * target's features come from the C forward (wait() with the drafter's layers captured), the context
 * rows go through the drafter's cache, one block is proposed, then the Markov head and confidence
 * head run left to right on the greedy drafts. Bounds: block hidden states rel L2 <= 1e-4, the top-8
 * logits of each draft rel L2 <= 1e-4, draft tokens equal (where the golden top-2 margin > 1e-3),
 * confidence probabilities within 1e-4. Also: loader errors name the file and the field; the context
 * feed's row-parallel form (many rows a call) writes the same cache bits as rows fed one at a time. */
#include "api/model_internal.h"
#include "arch/dspark.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dspark.h"
#include "model/safetensors.h"
#include "test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const di_st_tensor *need(const di_st_file *f, const char *name) {
  const di_st_tensor *t = di_st_file_find(f, name);
  CHECKF(t != NULL, "fixture lacks %s", name);
  return t;
}

static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

static void one(di_model *m, di_dspark *d, di_cpu_dspark *cd, const di_st_file *g, const char *key) {
  char nm[64];
  snprintf(nm, sizeof nm, "%s.ids", key);
  const di_st_tensor *tids = need(g, nm);
  snprintf(nm, sizeof nm, "%s.hidden", key);
  const di_st_tensor *thid = need(g, nm);
  snprintf(nm, sizeof nm, "%s.draft", key);
  const di_st_tensor *tdraft = need(g, nm);
  snprintf(nm, sizeof nm, "%s.conf_logit", key);
  const di_st_tensor *tconf = need(g, nm);
  snprintf(nm, sizeof nm, "%s.top8", key);
  const di_st_tensor *ttop = need(g, nm);
  if (!tids || !thid || !tdraft || !tconf || !ttop) return;
  const int n = (int)tids->shape[0], a = n - 1, B = d->block_size, H = d->hidden, V = d->vocab;
  const int32_t *ids = tids->data;
  const int F = d->n_feats * d->target_hidden;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)a), *seq_of = calloc((size_t)a, sizeof(int32_t)), *rows = malloc(sizeof(int32_t) * (size_t)a);
  float *feats = malloc(sizeof(float) * (size_t)a * F), *hid = malloc(sizeof(float) * (size_t)B * H);
  float *lg = malloc(sizeof(float) * (size_t)B * V), *top = malloc(sizeof(float) * 8), *row = malloc(sizeof(float) * (size_t)V);
  int32_t table[64];
  const int nblk = (n + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
  for (int b = 0; b < nblk; b++) table[b] = b;
  for (int t = 0; t < a; t++) { pos[t] = t; rows[t] = t; }
  di_batch_seq seq = {table, nblk, 1};
  /* the drafter's own table (its KV group: blocks of DI_DRAFTER_BLOCK_TOKENS), ids in reverse order */
  int32_t dtable[32];
  const int ndblk = (n + DI_DRAFTER_BLOCK_TOKENS - 1) / DI_DRAFTER_BLOCK_TOKENS;
  CHECKF(ndblk <= 32, "fixture case %s: %d positions", key, n);
  for (int b = 0; b < ndblk && b < 32; b++) dtable[b] = 31 - b;
  di_batch_seq dseq = {dtable, ndblk < 32 ? ndblk : 32, 1};
  di_batch batch = {.n_tokens = a, .tokens = ids, .positions = pos, .seq_of = seq_of, .n_seqs = 1, .seqs = &seq,
                    .n_outputs = a, .output_rows = rows};
  CHECK(m->backend->ops->submit(m->backend, &batch) == DI_OK);
  CHECKF(m->backend->ops->wait(m->backend, NULL, feats) == DI_OK, "%s", di_last_error());
  CHECKF(di_cpu_dspark_context(cd, a, feats, pos, seq_of, &dseq) == DI_OK, "%s", di_last_error());
  int32_t anchor = ids[a], apos = a;
  CHECKF(di_cpu_dspark_propose(cd, 1, &anchor, &apos, &dseq, hid, lg) == DI_OK, "%s", di_last_error());
  double e = test_rel_l2(hid, thid->data, (size_t)B * H);
  CHECKF(e <= 1e-4, "%s: block hidden rel L2 %.3g", key, e);
  int32_t prev = anchor;
  const int32_t *gd = tdraft->data;
  const float *gc = tconf->data, *gt = ttop->data;
  for (int j = 0; j < B; j++) {
    memcpy(row, lg + (size_t)j * V, sizeof(float) * (size_t)V);
    di_cpu_dspark_markov(cd, prev, row);
    float p = di_cpu_dspark_confidence(cd, hid + (size_t)j * H, prev);
    float gp = 1.0f / (1.0f + expf(-gc[j]));
    CHECKF(fabsf(p - gp) <= 1e-4f, "%s draft %d: confidence %.6f vs %.6f", key, j, p, gp);
    int best = test_argmax(row, V);
    float *sorted = malloc(sizeof(float) * (size_t)V);
    memcpy(sorted, row, sizeof(float) * (size_t)V);
    qsort(sorted, (size_t)V, sizeof(float), cmp_desc);
    memcpy(top, sorted, sizeof(float) * 8); /* the 8 largest logits, as torch's topk(8).values */
    free(sorted);
    double et = test_rel_l2(top, gt + (size_t)j * 8, 8);
    CHECKF(et <= 1e-4, "%s draft %d: top-8 logits rel L2 %.3g", key, j, et);
    if (gt[(size_t)j * 8] - gt[(size_t)j * 8 + 1] > 1e-3f) CHECKF(best == gd[j], "%s draft %d: token %d vs %d", key, j, best, gd[j]);
    prev = gd[j]; /* follow the golden drafts */
  }
  free(pos); free(seq_of); free(rows); free(feats); free(hid); free(lg); free(top); free(row);
}

/* The context feed of n rows in one call (the row-parallel form: each task its rows' products, norms,
 * RoPE and cache writes) against the same rows fed one per call (the column-parallel products): a
 * proposal from each cache must give the same bits (random features, two sequences interleaved). */
static void context_split(const di_dspark *d, di_threadpool *tp) {
  enum { N = 75 };
  const int F = d->n_feats * d->target_hidden, B = d->block_size, H = d->hidden, V = d->vocab;
  di_cpu_dspark *c1 = NULL, *c2 = NULL;
  CHECK(di_cpu_dspark_create(d, tp, &c1) == DI_OK && di_cpu_dspark_create(d, tp, &c2) == DI_OK);
  if (!c1 || !c2) return;
  CHECK(di_cpu_dspark_kv_alloc(c1, 16) == DI_OK && di_cpu_dspark_kv_alloc(c2, 16) == DI_OK);
  float *feats = malloc(sizeof(float) * (size_t)N * F), *h1 = malloc(sizeof(float) * 2 * (size_t)B * H);
  float *h2 = malloc(sizeof(float) * 2 * (size_t)B * H), *l1 = malloc(sizeof(float) * 2 * (size_t)B * V);
  float *l2 = malloc(sizeof(float) * 2 * (size_t)B * V);
  int32_t pos[N], seq_of[N], t0[8] = {0, 1, 2, 3, 4, 5, 6, 7}, t1[8] = {15, 14, 13, 12, 11, 10, 9, 8};
  di_batch_seq seqs[2] = {{t0, 8, 1}, {t1, 8, 2}};
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < (size_t)N * F; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    feats[i] = (float)((double)(rng >> 11) / 9007199254740992.0 * 4.0 - 2.0);
  }
  int np[2] = {0, 0};
  for (int t = 0; t < N; t++) { /* rows of sequence 0 and 1 interleaved, 2 : 1 */
    seq_of[t] = t % 3 == 2;
    pos[t] = np[seq_of[t]]++;
  }
  CHECKF(di_cpu_dspark_context(c1, N, feats, pos, seq_of, seqs) == DI_OK, "%s", di_last_error());
  for (int t = 0; t < N; t++) {
    const int32_t zero = 0;
    CHECK(di_cpu_dspark_context(c2, 1, feats + (size_t)t * F, pos + t, &zero, seqs + seq_of[t]) == DI_OK);
  }
  const int32_t tok[2] = {5, 77}, apos[2] = {np[0], np[1]};
  CHECK(di_cpu_dspark_propose(c1, 2, tok, apos, seqs, h1, l1) == DI_OK);
  CHECK(di_cpu_dspark_propose(c2, 2, tok, apos, seqs, h2, l2) == DI_OK);
  CHECK(memcmp(h1, h2, sizeof(float) * 2 * (size_t)B * H) == 0);
  CHECK(memcmp(l1, l2, sizeof(float) * 2 * (size_t)B * V) == 0);
  free(feats); free(h1); free(h2); free(l1); free(l2);
  di_cpu_dspark_free(c1);
  di_cpu_dspark_free(c2);
}

static void loader_errors(di_model *m) {
  di_dspark *d = NULL;
  CHECK_ERR(di_dspark_load("/nonexistent-drafter", &m->cfg, &m->weights.embed, &m->weights.lm_head, &d), "/nonexistent-drafter");
  CHECK_ERR(di_dspark_load(test_path("models/default"), &m->cfg, &m->weights.embed, &m->weights.lm_head, &d), "block_size");
}

int main(void) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.threads = 2;
  mo.quiet = 1;
  di_model *m = NULL;
  if (di_model_load(test_path("models/default"), &mo, &m) != DI_OK) {
    CHECKF(0, "%s", di_last_error());
    return test_finish("test_dspark_golden");
  }
  di_dspark *d = NULL;
  di_cpu_dspark *cd = NULL;
  di_st_file g;
  memset(&g, 0, sizeof g);
  CHECKF(di_dspark_load(test_path("models/default/dspark"), &m->cfg, &m->weights.embed, &m->weights.lm_head, &d) == DI_OK,
         "%s", di_last_error());
  CHECKF(di_st_open(test_path("tests/data/default-model/dspark_golden.safetensors"), &g) == DI_OK, "%s", di_last_error());
  if (d && g.n_tensors > 0) {
    CHECK(di_cpu_dspark_create(d, ((di_cpu_backend *)m->backend)->tp, &cd) == DI_OK);
    CHECK(m->backend->ops->kv_alloc(m->backend, 8) == DI_OK);
    CHECK(di_cpu_dspark_kv_alloc(cd, 32) == DI_OK); /* 512 positions, as the target's 8 blocks */
    CHECK(di_cpu_backend_set_capture(m->backend, d->feat_layers, d->n_feats) == DI_OK);
    int cases = 0;
    for (int t = 0; t < g.n_tensors; t++) {
      const char *name = g.tensors[t].name, *dot = strstr(name, ".ids");
      if (!dot || dot[4]) continue;
      char key[32];
      snprintf(key, sizeof key, "%.*s", (int)(dot - name), name);
      one(m, d, cd, &g, key);
      cases++;
    }
    CHECKF(cases >= 4, "only %d fixture cases", cases);
    context_split(d, ((di_cpu_backend *)m->backend)->tp);
    di_cpu_backend_set_capture(m->backend, NULL, 0);
  }
  loader_errors(m);
  di_cpu_dspark_free(cd);
  di_dspark_free(d);
  di_st_file_close(&g);
  di_model_free(m);
  return test_finish("test_dspark_golden");
}
