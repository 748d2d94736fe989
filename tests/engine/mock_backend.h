/* A mock backend for engine tests: its "KV cache" stores the token id and position written into each
 * slot, and the logits of an output row are a hash of the tokens it reads back through the block
 * table for positions [0, pos]. So any block-table, prefix-cache, chunking or preemption mistake
 * changes the logits, and the expected output of a request can be computed alone, without the engine,
 * by mock_logits_of() over its plain token list. It can also sleep per step (a device that computes
 * while the host schedules) and fail on a chosen step. It also checks the sequence-key contract a
 * backend with per-sequence state relies on (DeepSeek-V4): a live key's tokens continue exactly where
 * its last step ended, a key is released when its KV is freed, and with no_sharing set (the model
 * then reports a no_sharing cache group) a new key starts at position 0. Header-only: each test
 * includes it. */
#ifndef DI_TEST_MOCK_BACKEND_H
#define DI_TEST_MOCK_BACKEND_H
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "engine/engine_internal.h"

/* The mock is the harness, not what the engine fuzz target fuzzes: under clang its functions are left
 * out of the coverage instrumentation (the comparison tracing of its KV-slot checks was ~8% of the
 * target's time, and its branches added features that reward inputs for nothing in the engine). */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((no_sanitize("coverage"))), apply_to = function)
#endif

typedef struct mock_backend {
  di_backend base;
  int vocab;
  int64_t n_blocks;
  int32_t *kv_tok, *kv_pos;     /* [n_blocks * 64] */
  float *out;                   /* logits of the submitted step */
  int n_out, max_out;
  int fail_at_step, steps;      /* fail_at_step > 0: submit of that step fails */
  double sleep_s, t_submit;
  int errors;                   /* reads of slots not written for that position */
  int64_t max_tokens_per_step;
  int64_t device_samples;       /* rows sampled by mock_sample */
  const di_batch *pending;      /* submitted, run at wait() */
  /* sequence keys: live ones and the position each must continue at */
  int no_sharing;
  uint64_t *keys;
  int32_t *key_next;
  int n_keys, cap_keys;
  int key_errors;               /* a key that did not continue, or a new one not at 0 under no_sharing */
  int64_t releases;
  /* device token feedback (MOCK_OPS_FB): the tokens of the last sample_async, and the submitted batch
   * with its placeholders (ids < 0) resolved from them */
  int32_t *fb_tokens;
  int fb_n, fb_fetched;
  int64_t fb_resolved;          /* placeholder tokens resolved */
  int32_t *fb_batch_tokens;
  int fb_cap;
  di_batch fb_batch;
  /* di_batch.sample_rows of the submitted step, held against the rows its sample call passes: the
   * engine plans them at submit (a token may still be in flight then, with feedback) */
  di_sample_row *sub_rows;
  int n_sub, cap_sub;
  int64_t rows_planned, rows_mismatched;
} mock_backend;

static uint64_t mock_mix(uint64_t x) {
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27; x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The logits of a row are a function of a rolling hash of its context: MOCK_HASH0, then one
 * mock_hash_next per token (so a run over consecutive positions costs one step per position). */
#define MOCK_HASH0 0x1234u
static uint64_t mock_hash_next(uint64_t h, int32_t tok, int i) { return mock_mix(h ^ (uint64_t)(uint32_t)tok) + (uint64_t)i; }

static void mock_logits_of_hash(uint64_t h, int vocab, float *lg) {
  for (int v = 0; v < vocab; v++) {
    uint64_t x = mock_mix(h ^ ((uint64_t)v * 0x9e3779b97f4a7c15ULL));
    lg[v] = (float)((double)(x >> 40) / (double)(1 << 24) * 6.0); /* [0, 6): a spread of probabilities */
  }
}

/* logits of the row whose context is toks[0..n) */
static inline void mock_logits_of(const int32_t *toks, int n, int vocab, float *lg) { /* (inline: some tests never call it) */
  uint64_t h = MOCK_HASH0;
  for (int i = 0; i < n; i++) h = mock_hash_next(h, toks[i], i);
  mock_logits_of_hash(h, vocab, lg);
}

static int mock_kv_groups(di_backend *b, di_kv_group_info *g, int cap) {
  if (cap < 1) return 0;
  g[0] = (di_kv_group_info){.n_layers = 1, .bytes_per_token = 1024, .tokens_per_entry = 1, .window = 0,
                            .no_sharing = ((mock_backend *)b)->no_sharing};
  return 1;
}

static int mock_key_index(mock_backend *m, uint64_t key) {
  for (int i = 0; i < m->n_keys; i++)
    if (m->keys[i] == key) return i;
  return -1;
}

/* the key contract over one batch (its tokens in order) */
static void mock_check_keys(mock_backend *m, const di_batch *bt) {
  int *slot = malloc((size_t)(bt->n_seqs > 0 ? bt->n_seqs : 1) * sizeof *slot);
  for (int q = 0; q < bt->n_seqs; q++) slot[q] = -2; /* not seen in this batch yet */
  for (int i = 0; i < bt->n_tokens; i++) {
    int q = bt->seq_of[i], pos = bt->positions[i];
    if (slot[q] == -2) {
      uint64_t key = bt->seqs[q].key;
      int k = mock_key_index(m, key);
      if (k < 0) {
        if (m->no_sharing && pos != 0) m->key_errors++;
        if (m->n_keys == m->cap_keys) {
          m->cap_keys = m->cap_keys ? 2 * m->cap_keys : 16;
          m->keys = realloc(m->keys, (size_t)m->cap_keys * sizeof *m->keys);
          m->key_next = realloc(m->key_next, (size_t)m->cap_keys * sizeof *m->key_next);
        }
        k = m->n_keys++;
        m->keys[k] = key;
      } else if (pos != m->key_next[k]) {
        m->key_errors++;
      }
      slot[q] = k;
    } else if (pos != m->key_next[slot[q]]) {
      m->key_errors++;
    }
    m->key_next[slot[q]] = pos + 1;
  }
  free(slot);
}

static void mock_release(di_backend *b, uint64_t key) {
  mock_backend *m = (mock_backend *)b;
  int k = mock_key_index(m, key);
  m->releases++;
  if (k < 0) return;
  m->keys[k] = m->keys[m->n_keys - 1];
  m->key_next[k] = m->key_next[m->n_keys - 1];
  m->n_keys--;
}

static di_status mock_kv_alloc(di_backend *b, int64_t n) {
  mock_backend *m = (mock_backend *)b;
  free(m->kv_tok); free(m->kv_pos);
  m->n_blocks = n;
  m->kv_tok = malloc((size_t)n * DI_KV_BLOCK_SIZE * sizeof *m->kv_tok);
  m->kv_pos = malloc((size_t)n * DI_KV_BLOCK_SIZE * sizeof *m->kv_pos);
  for (int64_t i = 0; i < n * DI_KV_BLOCK_SIZE; i++) m->kv_pos[i] = -1;
  return m->kv_tok && m->kv_pos ? DI_OK : di_error_set(DI_ERR_OOM, "mock kv");
}

static double mock_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static di_status mock_submit(di_backend *b, const di_batch *bt) {
  mock_backend *m = (mock_backend *)b;
  m->steps++;
  if (m->fail_at_step > 0 && m->steps == m->fail_at_step) return di_error_set(DI_ERR_BACKEND, "mock device fault at step %d", m->steps);
  m->pending = bt; /* the work happens in wait(): the batch's arrays must stay valid until then */
  m->n_sub = 0;
  if (bt->sample_rows) {
    if (bt->n_outputs > m->cap_sub) {
      m->cap_sub = bt->n_outputs;
      m->sub_rows = realloc(m->sub_rows, (size_t)m->cap_sub * sizeof *m->sub_rows);
    }
    memcpy(m->sub_rows, bt->sample_rows, (size_t)bt->n_outputs * sizeof *m->sub_rows);
    m->n_sub = bt->n_outputs;
  }
  m->t_submit = mock_now();
  return DI_OK;
}

static void mock_run(mock_backend *m, const di_batch *bt) {
  if (bt->n_tokens > m->max_tokens_per_step) m->max_tokens_per_step = bt->n_tokens;
  mock_check_keys(m, bt);
  for (int i = 0; i < bt->n_tokens; i++) {
    const di_batch_seq *s = &bt->seqs[bt->seq_of[i]];
    int pos = bt->positions[i];
    if (pos / DI_KV_BLOCK_SIZE >= s->n_blocks || bt->tokens[i] < 0) { m->errors++; continue; }
    int64_t slot = (int64_t)s->block_table[pos / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + pos % DI_KV_BLOCK_SIZE;
    m->kv_tok[slot] = bt->tokens[i];
    m->kv_pos[slot] = pos;
  }
  if (bt->n_outputs > m->max_out) {
    m->max_out = bt->n_outputs;
    m->out = realloc(m->out, (size_t)m->max_out * (size_t)m->vocab * sizeof *m->out);
  }
  /* Each output row reads its whole context from the KV slots. Outputs of one sequence at rising
   * positions (prompt logprobs: every prompt row) continue one walk over the slots with the rolling
   * hash, so a step costs one read per position instead of one per position and output row (a slot
   * is checked once per walk: nothing writes the slots while a step runs). */
  const di_batch_seq *walk_seq = NULL;
  int walk_pos = 0; /* positions [0, walk_pos) of walk_seq are hashed into walk_h */
  uint64_t walk_h = MOCK_HASH0;
  for (int o = 0; o < bt->n_outputs; o++) {
    int row = bt->output_rows[o];
    const di_batch_seq *s = &bt->seqs[bt->seq_of[row]];
    int pos = bt->positions[row];
    if (s != walk_seq || pos + 1 < walk_pos) { walk_seq = s; walk_pos = 0; walk_h = MOCK_HASH0; }
    for (int p = walk_pos; p <= pos; p++) {
      int64_t slot = (int64_t)s->block_table[p / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE;
      if (m->kv_pos[slot] != p) m->errors++;
      walk_h = mock_hash_next(walk_h, m->kv_tok[slot], p);
    }
    walk_pos = pos + 1;
    mock_logits_of_hash(walk_h, m->vocab, m->out + (size_t)o * (size_t)m->vocab);
  }
  m->n_out = bt->n_outputs;
}

static di_status mock_wait(di_backend *b, float *logits, float *hidden) {
  mock_backend *m = (mock_backend *)b;
  (void)hidden;
  if (m->pending) mock_run(m, m->pending);
  m->pending = NULL;
  if (m->sleep_s > 0) {
    double until = m->t_submit + m->sleep_s;
    for (double t = mock_now(); t < until; t = mock_now()) {
      struct timespec ts = {0, (long)((until - t) * 1e9)};
      nanosleep(&ts, NULL);
    }
  }
  if (logits && m->n_out) memcpy(logits, m->out, (size_t)m->n_out * (size_t)m->vocab * sizeof *logits);
  return DI_OK;
}

static void mock_destroy(di_backend *b) {
  mock_backend *m = (mock_backend *)b;
  free(m->fb_tokens); free(m->fb_batch_tokens); free(m->sub_rows);
  free(m->kv_tok); free(m->kv_pos); free(m->out);
  free(m->keys); free(m->key_next);
  free(m);
}

static const di_backend_ops MOCK_OPS = {.name = "mock", .kv_groups = mock_kv_groups, .kv_alloc = mock_kv_alloc,
                                        .submit = mock_submit, .wait = mock_wait, .release = mock_release,
                                        .destroy = mock_destroy};

/* "device" sampling: the host sampler run on the mock's own logits, as a backend would on its device */
static di_status mock_sample(di_backend *b, const di_sample_row *rows, int n, int32_t *tokens) {
  mock_backend *m = (mock_backend *)b;
  if (n != m->n_out) return di_error_set(DI_ERR_INVALID_ARG, "mock sample: %d rows, step had %d", n, m->n_out);
  if (m->n_sub) {
    m->rows_planned += n;
    for (int i = 0; i < n && i < m->n_sub; i++) {
      const di_sample_row *a = &rows[i], *c = &m->sub_rows[i];
      m->rows_mismatched += a->temperature != c->temperature || a->top_p != c->top_p || a->top_k != c->top_k ||
                            a->min_p != c->min_p || a->seed != c->seed || a->counter != c->counter ||
                            a->vocab_limit != c->vocab_limit;
    }
    if (m->n_sub != n) m->rows_mismatched += n;
    m->n_sub = 0;
  }
  di_sampler *s;
  DI_TRY(di_sampler_create(m->vocab, &s));
  for (int i = 0; i < n; i++) {
    di_sampling sp = {.temperature = rows[i].temperature, .top_p = rows[i].top_p, .top_k = rows[i].top_k,
                      .min_p = rows[i].min_p, .repetition_penalty = 1, .logprobs = -1, .seed = rows[i].seed};
    di_sample_result res;
    di_status st = di_sampler_sample(s, m->out + (size_t)i * (size_t)m->vocab, rows[i].vocab_limit, &sp, NULL, 0, 0,
                                     NULL, rows[i].counter, &res);
    if (st != DI_OK) { di_sampler_free(s); return st; }
    tokens[i] = res.token;
  }
  di_sampler_free(s);
  m->device_samples += n;
  return DI_OK;
}
static const di_backend_ops MOCK_OPS_DEV = {.name = "mock-dev", .kv_groups = mock_kv_groups, .kv_alloc = mock_kv_alloc,
                                            .submit = mock_submit, .wait = mock_wait, .sample = mock_sample,
                                            .release = mock_release, .destroy = mock_destroy};

/* device token feedback: sample_async runs the submitted step and samples it (the "device" keeps the
 * tokens); a later submit may use -1 - j for row j's token, resolved here; sample_fetch hands them out.
 * Misuse (a placeholder without a sample to take it from, a row out of range, a fetch twice) counts as
 * an error, which the tests check is zero. */
static di_status mock_sample_async(di_backend *b, const di_sample_row *rows, int n) {
  mock_backend *m = (mock_backend *)b;
  if (m->pending) mock_run(m, m->pending);
  m->pending = NULL;
  m->fb_tokens = realloc(m->fb_tokens, (size_t)(n > 0 ? n : 1) * sizeof *m->fb_tokens);
  DI_TRY(mock_sample(b, rows, n, m->fb_tokens));
  m->fb_n = n;
  m->fb_fetched = 0;
  return DI_OK;
}
static di_status mock_sample_fetch(di_backend *b, int32_t *tokens) {
  mock_backend *m = (mock_backend *)b;
  if (m->fb_fetched) m->errors++;
  m->fb_fetched = 1;
  memcpy(tokens, m->fb_tokens, (size_t)m->fb_n * sizeof *tokens);
  return DI_OK;
}
static di_status mock_submit_fb(di_backend *b, const di_batch *bt) {
  mock_backend *m = (mock_backend *)b;
  if (m->pending) m->errors++; /* the previous step was neither waited for nor sampled */
  DI_TRY(mock_submit(b, bt));
  if (bt->n_tokens > m->fb_cap) {
    m->fb_cap = bt->n_tokens;
    m->fb_batch_tokens = realloc(m->fb_batch_tokens, (size_t)m->fb_cap * sizeof *m->fb_batch_tokens);
  }
  for (int i = 0; i < bt->n_tokens; i++) {
    int32_t t = bt->tokens[i];
    if (t < 0) {
      const int j = -1 - t;
      if (j >= m->fb_n) { m->errors++; t = 0; }
      else { t = m->fb_tokens[j]; m->fb_resolved++; }
    }
    m->fb_batch_tokens[i] = t;
  }
  m->fb_batch = *bt;
  m->fb_batch.tokens = m->fb_batch_tokens;
  m->pending = &m->fb_batch;
  return DI_OK;
}
static const di_backend_ops MOCK_OPS_FB = {.name = "mock-fb", .kv_groups = mock_kv_groups, .kv_alloc = mock_kv_alloc,
                                           .submit = mock_submit_fb, .wait = mock_wait, .sample = mock_sample,
                                           .release = mock_release, .sample_async = mock_sample_async,
                                           .sample_fetch = mock_sample_fetch, .destroy = mock_destroy};

static mock_backend *mock_backend_new(int vocab) {
  mock_backend *m = calloc(1, sizeof *m);
  m->base.ops = &MOCK_OPS;
  m->base.vocab_size = vocab;
  m->vocab = vocab;
  return m;
}

/* ---- mock text: token t is the letter 'a' + (t % 26); ids 0 and 1 (EOS) decode to nothing ---- */
typedef struct mock_stream { char buf[4]; } mock_stream;
static di_status mock_stream_create(void *ctx, int skip, void **s) {
  (void)ctx; (void)skip;
  *s = calloc(1, sizeof(mock_stream));
  return DI_OK;
}
static di_status mock_stream_push(void *s, int32_t id, const char **text, size_t *len) {
  mock_stream *ms = s;
  if (id < 2) { *text = ""; *len = 0; return DI_OK; }
  ms->buf[0] = (char)('a' + id % 26);
  ms->buf[1] = 0;
  *text = ms->buf;
  *len = 1;
  return DI_OK;
}
static di_status mock_stream_flush(void *s, const char **text, size_t *len) { (void)s; *text = ""; *len = 0; return DI_OK; }
static void mock_stream_free(void *s) { free(s); }
static di_status mock_encode(void *ctx, const char *text, int raw, int32_t **ids, size_t *n) {
  (void)ctx;
  (void)raw;
  size_t L = strlen(text);
  *ids = malloc((L + 1) * sizeof **ids);
  for (size_t i = 0; i < L; i++) (*ids)[i] = 2 + (int32_t)((unsigned char)text[i] % 26);
  *n = L;
  return DI_OK;
}
static const di_text_ops MOCK_TEXT = {NULL, mock_encode, mock_stream_create, mock_stream_push, mock_stream_flush, mock_stream_free};

static const int32_t MOCK_EOS[1] = {1};

static di_status mock_engine(mock_backend *m, const di_engine_options *opt, int with_text, int max_context, di_engine **out) {
  di_engine_core_config cfg = {0};
  cfg.backend = &m->base;
  cfg.vocab_size = m->vocab;
  cfg.vocab_limit = m->vocab;
  cfg.max_context = max_context;
  cfg.eos_ids = MOCK_EOS;
  cfg.n_eos = 1;
  cfg.text = with_text ? &MOCK_TEXT : NULL;
  return di_engine_core_create(&cfg, opt, out);
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
