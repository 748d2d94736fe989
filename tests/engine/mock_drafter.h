/* A mock of the CUDA DSpark drafter over the mock backend (mock_backend.h), for engine tests without a GPU
 * (test_dspark_graph, test_dspark_profile): the drafter's context fed "on the device" and proposals inside
 * the step (engine/drafter.h's context_on_device, graph_on, graph_drafts). After a step that carries
 * proposals it finds each block's anchor from the step's own samples by the device's rule (the verified
 * drafts accepted while each equals the sample of the row before it; the anchor is the sample after the
 * last accepted one) and drafts greedily from the mock model's logits over the sequence's context read
 * back from the mock KV (so a wrong table or a wrong anchor changes the drafts), every fourth draft made
 * wrong on purpose (confidence conf_wrong, the others conf_right). Optionally (per_token_s > 0) each step
 * takes step_s + per_token_s x its padded token count (+ proposal_s when it proposes): the mock then reports graph
 * buckets (powers of two up to MOCK_DRAFTER_BUCKET_MAX, the counts a step is padded up to) as the CUDA
 * backend does. Header-only; one mock drafter per test binary (g_md). */
#ifndef DI_TEST_MOCK_DRAFTER_H
#define DI_TEST_MOCK_DRAFTER_H
#include "mock_backend.h"
#include "test_util.h"
#include "engine/drafter.h"
#include <stdlib.h>
#include <string.h>

#define MOCK_DRAFTER_MAX_BLOCK 8
#define MOCK_DRAFTER_BUCKET_MAX 16

/* the mock "device" drafter: the last submitted batch and its samples */
typedef struct mock_drafter {
  mock_backend *m;
  int block, limit, on;
  float conf_right, conf_wrong;
  double step_s, per_token_s, proposal_s; /* the step-time model (per_token_s 0: the mock's own sleep_s) */
  di_batch last;      /* the last submitted batch (its arrays stay valid until the engine reads the drafts) */
  int32_t *sampled;   /* its samples, by row */
  int n_sampled, cap_sampled;
  int64_t emulated, proposing_submits;
  int64_t context_rows; /* rows fed through context() (the host path) */
} mock_drafter;

static mock_drafter g_md;

/* a fresh mock drafter for mock m (the backend's ops become MOCK_DRAFTER_OPS) */
static void mock_drafter_reset(mock_backend *m, int block) {
  free(g_md.sampled);
  memset(&g_md, 0, sizeof g_md);
  g_md.m = m;
  g_md.block = block;
  g_md.conf_right = 0.9f;
  g_md.conf_wrong = 0.4f;
}

/* the token count a step of n tokens is padded to (a graph bucket), n beyond the largest */
static int mock_drafter_padded(int n) {
  int b = 1;
  while (b < n && b < MOCK_DRAFTER_BUCKET_MAX) b *= 2;
  return n <= MOCK_DRAFTER_BUCKET_MAX ? b : n;
}
/* the mock's step time for a batch of n tokens under the step-time model */
static double mock_drafter_step_s(int n, int proposes) {
  return g_md.step_s + g_md.per_token_s * mock_drafter_padded(n) + (proposes ? g_md.proposal_s : 0);
}

static void md_keep_samples(const int32_t *tok, int n) {
  if (n > g_md.cap_sampled) {
    g_md.cap_sampled = n;
    g_md.sampled = realloc(g_md.sampled, sizeof *g_md.sampled * (size_t)n);
  }
  memcpy(g_md.sampled, tok, sizeof *tok * (size_t)n);
  g_md.n_sampled = n;
}
static di_status md_submit(di_backend *b, const di_batch *bt) {
  g_md.last = *bt;
  g_md.n_sampled = 0;
  g_md.proposing_submits += bt->propose_row != NULL;
  if (g_md.per_token_s > 0) ((mock_backend *)b)->sleep_s = mock_drafter_step_s(bt->n_tokens, bt->propose_row != NULL);
  return mock_submit_fb(b, bt);
}
static di_status md_sample(di_backend *b, const di_sample_row *rows, int n, int32_t *tokens) {
  DI_TRY(mock_sample(b, rows, n, tokens));
  md_keep_samples(tokens, n);
  return DI_OK;
}
static di_status md_sample_async(di_backend *b, const di_sample_row *rows, int n) {
  DI_TRY(mock_sample_async(b, rows, n));
  md_keep_samples(((mock_backend *)b)->fb_tokens, n);
  return DI_OK;
}
static int md_graph_buckets(di_backend *b, int *tokens, int cap) {
  (void)b;
  int n = 0;
  for (int t = 1; g_md.per_token_s > 0 && t <= MOCK_DRAFTER_BUCKET_MAX && n < cap; t *= 2) tokens[n++] = t;
  return n;
}
static const di_backend_ops MOCK_DRAFTER_OPS = {.name = "mock-graph", .kv_groups = mock_kv_groups,
                                                .kv_alloc = mock_kv_alloc, .submit = md_submit, .wait = mock_wait,
                                                .sample = md_sample, .release = mock_release,
                                                .sample_async = md_sample_async, .sample_fetch = mock_sample_fetch,
                                                .destroy = mock_destroy, .graph_buckets = md_graph_buckets};

static di_status md_kv_alloc(void *c, int64_t n) { (void)c; (void)n; return DI_OK; }
static di_status md_context(void *c, int n, const float *f, const int32_t *p, const int32_t *q, const di_batch_seq *s) {
  (void)c; (void)f; (void)p; (void)q; (void)s;
  g_md.context_rows += n;
  return DI_OK;
}
/* the proposals after the step (the engine's fallback): no drafts */
static di_status md_propose(void *c, int n, const int32_t *t, const int32_t *p, const di_batch_seq *s, const uint8_t *w,
                            float *h, float *lg) {
  (void)c; (void)n; (void)t; (void)p; (void)s; (void)w; (void)h; (void)lg;
  return DI_OK;
}
static di_status md_draft_greedy(void *c, int n, const int32_t *a, const int32_t *cap, int limit, int32_t *tok, float *conf) {
  (void)c; (void)a; (void)cap; (void)limit;
  for (int i = 0; i < n * g_md.block; i++) tok[i] = -1, conf[i] = 0;
  return DI_OK;
}
static di_status md_context_on_device(void *c, int rows) { (void)c; (void)rows; return DI_OK; }
static di_status md_graph_on(void *c, int limit) {
  (void)c;
  g_md.limit = limit;
  g_md.on = 1;
  return DI_OK;
}

/* what the CUDA drafter computes inside the step, from the step's batch, its samples and the KV */
static di_status md_graph_drafts(void *c, int n, int *made, int32_t *anchor, int32_t *tok, float *conf) {
  (void)c;
  const di_batch *bt = &g_md.last;
  mock_backend *m = g_md.m;
  const int B = g_md.block;
  *made = 0;
  if (!bt->propose_row) return DI_OK;
  CHECKF(n == bt->n_seqs && g_md.n_sampled == bt->n_tokens, "graph drafts of %d sequences after a step of %d (%d samples, "
         "%d rows)", n, bt->n_seqs, g_md.n_sampled, bt->n_tokens);
  if (n != bt->n_seqs || g_md.n_sampled != bt->n_tokens) return di_error_set(DI_ERR_INVALID_ARG, "mock graph drafts");
  int32_t ctx[4096];
  for (int q = 0; q < n; q++) {
    anchor[2 * q] = anchor[2 * q + 1] = -1;
    for (int j = 0; j < B; j++) tok[q * B + j] = -1, conf[q * B + j] = 0;
    const int f = bt->propose_row[q];
    if (f < 0) continue;
    int last = f;
    while (last + 1 < bt->n_tokens && bt->seq_of[last + 1] == q) last++;
    int a = 0;
    while (f + a < last && g_md.sampled[f + a] == bt->tokens[f + a + 1]) a++;
    const int32_t at = g_md.sampled[f + a];
    const int ap = bt->positions[f + a] + 1;
    anchor[2 * q] = at;
    anchor[2 * q + 1] = ap;
    if (ap + B >= (int)(sizeof ctx / sizeof *ctx)) continue;
    const di_batch_seq *s = &bt->seqs[q];
    for (int p = 0; p < ap; p++) { /* the context as the step left the cache */
      const int64_t slot = (int64_t)s->block_table[p / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE;
      if (m->kv_pos[slot] != p) m->errors++;
      ctx[p] = m->kv_tok[slot];
    }
    ctx[ap] = at;
    float *lg = malloc(sizeof *lg * (size_t)m->vocab);
    if (!lg) return di_error_set(DI_ERR_OOM, "mock graph drafts");
    for (int j = 0; j < bt->propose_cap[q] && j < B; j++) {
      mock_logits_of(ctx, ap + 1 + j, m->vocab, lg);
      int best = 0;
      for (int v = 1; v < g_md.limit; v++)
        if (lg[v] > lg[best]) best = v;
      const int wrong = mock_mix((uint64_t)(ap + j) * 31 + (uint64_t)best) % 4 == 0;
      tok[q * B + j] = wrong ? (best + 1) % m->vocab : best;
      conf[q * B + j] = wrong ? g_md.conf_wrong : g_md.conf_right;
      ctx[ap + 1 + j] = tok[q * B + j];
    }
    free(lg);
  }
  g_md.emulated++;
  *made = 1;
  return DI_OK;
}
static void md_markov(void *c, int32_t prev, float *lg) { (void)c; (void)prev; (void)lg; }
static float md_conf(void *c, const float *h, int32_t prev) { (void)c; (void)h; (void)prev; return 0; }
static void md_destroy(void *c) { (void)c; }

/* the drafter's ops (block g_md.block) for di_engine_set_dspark */
static di_drafter_ops mock_drafter_ops(void) {
  return (di_drafter_ops){.ctx = &g_md, .block_size = g_md.block, .hidden = 8, .feat_dim = 8, .cache_bytes_per_token = 64,
                          .kv_alloc = md_kv_alloc, .context = md_context, .propose = md_propose,
                          .draft_greedy = md_draft_greedy, .context_on_device = md_context_on_device,
                          .graph_on = md_graph_on, .graph_drafts = md_graph_drafts, .markov = md_markov,
                          .confidence = md_conf, .destroy = md_destroy};
}
#endif
