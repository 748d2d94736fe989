/* The DeepSeek-V4 CPU backend (see cpu_v4_backend.h): a table from the engine's sequence keys to cached
 * forward states; submit() checks the whole batch (so a bad batch changes no state), wait() runs each
 * sequence's tokens as one step of its state and writes the logits of the rows the engine asked for.
 * The sequences of a step run in parallel, one thread per sequence at a time (the cached forward is
 * single-threaded), so every result is the same for any thread count.
 * Through the engine (batches with every cache group's tables, kv_alloc_groups) the window rows, CSA /
 * HCA entries, indexer keys and per-block snapshots of the compressors' open windows live in the
 * engine's blocks (cpu_deepseek_v4_pages.h); a state holds only the open windows. A sequence whose
 * tokens start at position 0 starts fresh; one the backend holds no state for that starts at P > 0
 * resumes from its blocks (a prefix-cache hit, a shared prompt, a recompute after preemption that hit
 * its own cached blocks; with SWA bounded replay it replays the window's positions before the hit
 * first); any other start must continue its state exactly. Batches without group
 * tables (di_model_score, log-likelihoods: kv_alloc) use self-contained states as before. */
#include "backend/cpu/cpu_v4_backend.h"
#include "backend/cpu/cpu_deepseek_v4_cache.h"
#include "backend/cpu/cpu_deepseek_v4_pages.h"
#include "util/grow.h"
#include "util/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHO "DeepSeek-V4 CPU backend"

typedef struct v4_seq {
  uint64_t key;
  di_v4_seq_state *st;
} v4_seq;

/* One sequence's share of a step (run_batch). */
typedef struct v4_job {
  uint64_t key;
  di_v4_seq_state *st;
  di_v4_pages pages;         /* paged states: the sequence's blocks */
  int t0, n;                 /* its tokens in the batch */
  int j0, n_rows;            /* its output rows: logits rows j0.., local rows in rows[j0..] */
  di_status status;
  char err[384];             /* the worker's message (error messages are per thread) */
} v4_job;

typedef struct v4_backend {
  di_backend base;
  const di_v4_config *c;
  const di_v4_weights *w;
  v4_seq *seqs;              /* live states, unordered */
  int n_seqs, cap_seqs;
  int64_t bytes_per_seq;     /* a fresh paged state's bytes (the compressors' open windows) */
  int64_t n_blocks;
  di_v4_layout lay;
  float *pool[DI_V4_N_KINDS];  /* the groups' pools (kv_alloc_groups), block_floats each */
  int64_t pool_blocks[DI_V4_N_KINDS];
  const di_batch *batch;     /* submitted, not yet waited for */
  int *rows;                 /* scratch: per output row, its row within its sequence's tokens */
  int rows_cap;
  v4_job *jobs;
  int jobs_cap;
  di_threadpool *tp;
  /* the step being run (read by the workers) */
  const di_batch *run;
  float *run_logits;
} v4_backend;

static v4_seq *find(v4_backend *b, uint64_t key) {
  for (int i = 0; i < b->n_seqs; i++)
    if (b->seqs[i].key == key)
      return &b->seqs[i];
  return NULL;
}

/* The cache groups of cpu_deepseek_v4_pages.h; the compressors' open windows are per sequence. */
static int v4_kv_groups(di_backend *base, di_kv_group_info *g, int cap) {
  v4_backend *b = (v4_backend *)base;
  const int n = di_v4_layout_groups(&b->lay, b->c, (int)sizeof(float), g, cap);
  if (n > 0 && cap > 0)
    g[0].bytes_per_seq = b->bytes_per_seq;
  return n;
}

/* Without groups (di_model_score, log-likelihoods): self-contained states, the count is bookkeeping. */
static di_status v4_kv_alloc(di_backend *base, int64_t n_blocks) {
  v4_backend *b = (v4_backend *)base;
  if (n_blocks < 1)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": %lld KV blocks", (long long)n_blocks);
  b->n_blocks = n_blocks;
  return DI_OK;
}

static void free_pools(v4_backend *b) {
  for (int k = 0; k < DI_V4_N_KINDS; k++) {
    free(b->pool[k]);
    b->pool[k] = NULL;
    b->pool_blocks[k] = 0;
  }
}

static di_status v4_kv_alloc_groups(di_backend *base, const int64_t *n_blocks, int n_groups) {
  v4_backend *b = (v4_backend *)base;
  if (b->batch)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": kv_alloc while a step is in flight");
  if (n_groups != b->lay.n_groups)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": %d cache groups allocated, the model has %d", n_groups, b->lay.n_groups);
  free_pools(b);
  for (int k = 0; k < DI_V4_N_KINDS; k++) {
    const int gi = b->lay.group_of[k];
    if (gi < 0)
      continue;
    if (n_blocks[gi] < 1 || (uint64_t)n_blocks[gi] > SIZE_MAX / sizeof(float) / b->lay.block_floats[k]) {
      free_pools(b);
      return di_error_set(DI_ERR_INVALID_ARG, WHO ": %lld blocks for cache group %d", (long long)n_blocks[gi], gi);
    }
    b->pool[k] = calloc((size_t)n_blocks[gi] * b->lay.block_floats[k], sizeof(float));
    if (!b->pool[k]) {
      free_pools(b);
      return di_error_set(DI_ERR_OOM, WHO ": out of memory for %lld blocks of cache group %d (%zu bytes each)",
                          (long long)n_blocks[gi], gi, b->lay.block_floats[k] * sizeof(float));
    }
    b->pool_blocks[k] = n_blocks[gi];
  }
  b->n_blocks = n_blocks[0];
  return DI_OK;
}

/* Sequence q's blocks in a batch with group tables. */
static void seq_pages(const v4_backend *b, const di_batch *bt, int q, di_v4_pages *pg) {
  di_v4_batch_pages(&b->lay, b->pool, b->pool_blocks, bt, q, pg);
}

static di_status v4_submit(di_backend *base, const di_batch *bt) {
  v4_backend *b = (v4_backend *)base;
  if (b->batch)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": submit while a step is in flight");
  DI_TRY(di_v4_batch_check(bt, b->c->vocab_size, b->lay.n_groups, WHO));
  if (bt->n_groups > 0 && !b->pool[b->lay.group_of[DI_V4_G_WINDOW] >= 0 ? DI_V4_G_WINDOW : 0])
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": the batch carries %d cache groups' tables, the model has %d (but "
                        "kv_alloc_groups was not called)", bt->n_groups, b->lay.n_groups);
  int from = 0;
  for (int q = 0; q < bt->n_seqs; q++) {
    int t0, n;
    DI_TRY(di_v4_batch_span(bt, q, from, &t0, &n, WHO));
    if (n == 0)
      continue;
    from = t0 + n;
    const v4_seq *s = find(b, bt->seqs[q].key);
    const int64_t have = s ? di_v4_seq_state_positions(s->st) : 0;
    if (bt->n_groups > 0) { /* paged: continue, start, or resume from the blocks; every block it needs there */
      if (s && !di_v4_seq_state_is_paged(s->st))
        return di_error_set(DI_ERR_INVALID_ARG, WHO ": sequence key %llu has a self-contained state, the batch gives it blocks",
                            (unsigned long long)bt->seqs[q].key);
      di_v4_pages pg;
      seq_pages(b, bt, q, &pg);
      const int64_t p0 = bt->positions[t0];
      const int replay = bt->seq_replay ? bt->seq_replay[q] : 0;
      const int resume = p0 > 0 && (!s || p0 != have);
      if ((resume || replay) && s)
        return di_error_set(DI_ERR_INVALID_ARG, WHO ": sequence key %llu continues at position %lld but its state holds %lld tokens",
                            (unsigned long long)bt->seqs[q].key, (long long)p0, (long long)have);
      int64_t ws = 0, ru = 0;
      if (s && p0 > 0)
        di_v4_seq_state_replay_bounds(s->st, &ws, &ru);
      if (replay > 0) {
        ws = p0;
        ru = p0 + replay;
        if (ru % DI_KV_BLOCK_SIZE != 0)
          return di_error_set(DI_ERR_INVALID_ARG, WHO ": sequence key %llu: a bounded replay of %d positions from %lld does not end "
                              "at a block start", (unsigned long long)bt->seqs[q].key, replay, (long long)p0);
      }
      di_status st = di_v4_pages_check(&pg, p0, n, ws, ru, resume && !replay);
      if (st != DI_OK)
        return di_error_wrap(st, "sequence key %llu: ", (unsigned long long)bt->seqs[q].key);
      continue;
    }
    if (bt->positions[t0] != 0 && bt->positions[t0] != have)
      return di_error_set(DI_ERR_INVALID_ARG,
                          WHO ": sequence key %llu continues at position %d but its state holds %lld tokens (V4's "
                          "per-sequence state can only be continued or restarted at position 0)",
                          (unsigned long long)bt->seqs[q].key, bt->positions[t0], (long long)have);
  }
  b->batch = bt;
  return DI_OK;
}

/* The state of the sequence starting at position pos: its own (reset at position 0), or a new one,
 * resumed from its blocks when pos > 0 (paged only; submit checked that): from the snapshot at pos,
 * or (replay > 0, SWA bounded replay) from the entries at pos + replay, replaying from pos. */
static di_status get_state(v4_backend *b, uint64_t key, int64_t pos, int replay, const di_v4_pages *pg, di_v4_seq_state **out) {
  v4_seq *s = find(b, key);
  if (s) {
    if (pos == 0)
      di_v4_seq_state_reset(s->st);
    *out = s->st;
    return DI_OK;
  }
  if (!di_grow((void **)&b->seqs, &b->cap_seqs, b->n_seqs + 1, sizeof *b->seqs, 16))
    return di_error_set(DI_ERR_OOM, WHO ": out of memory for the sequence table");
  di_v4_seq_state *st;
  DI_TRY(pg ? di_v4_seq_state_create_paged(b->c, &st) : di_v4_seq_state_create(b->c, &st));
  if (pg && (pos > 0 || replay > 0)) {
    di_status rs = replay > 0 ? di_v4_seq_state_restore_replay(st, b->c, pg, pos + replay, replay)
                              : di_v4_seq_state_restore(st, b->c, pg, pos);
    if (rs != DI_OK) {
      di_v4_seq_state_free(st);
      return rs;
    }
  }
  b->seqs[b->n_seqs++] = (v4_seq){key, st};
  *out = st;
  return DI_OK;
}

static void run_job(v4_backend *b, v4_job *jb) {
  static const int no_rows = 0;
  const size_t V = (size_t)b->c->vocab_size;
  const int *rows = jb->n_rows ? b->rows + jb->j0 : &no_rows;
  float *lg = jb->n_rows ? b->run_logits + (size_t)jb->j0 * V : NULL;
  if (jb->pages.lay)
    jb->status = di_cpu_v4_forward_step_paged(b->c, b->w, jb->st, &jb->pages, b->run->tokens + jb->t0, jb->n, rows, jb->n_rows, lg);
  else
    jb->status = di_cpu_v4_forward_step_rows(b->c, b->w, jb->st, b->run->tokens + jb->t0, jb->n, rows, jb->n_rows, lg);
  if (jb->status != DI_OK)
    snprintf(jb->err, sizeof jb->err, "%s", di_last_error());
}

static void run_jobs(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  v4_backend *b = ctx;
  for (int64_t i = begin; i < end; i++)
    run_job(b, &b->jobs[i]);
}

static di_status run_batch(v4_backend *b, const di_batch *bt, float *logits) {
  if (!di_grow((void **)&b->rows, &b->rows_cap, bt->n_outputs, sizeof *b->rows, 16) ||
      !di_grow((void **)&b->jobs, &b->jobs_cap, bt->n_seqs, sizeof *b->jobs, 16))
    return di_error_set(DI_ERR_OOM, WHO ": out of memory");
  /* the states are found or made here, on one thread; the workers only step them */
  int from = 0, j = 0, n_jobs = 0; /* j: the next output row */
  for (int q = 0; q < bt->n_seqs; q++) {
    int t0, n;
    DI_TRY(di_v4_batch_span(bt, q, from, &t0, &n, WHO));
    if (n == 0)
      continue;
    from = t0 + n;
    int j0 = j;
    while (j < bt->n_outputs && bt->output_rows[j] < t0 + n)
      j++;
    for (int k = j0; k < j; k++)
      b->rows[k] = bt->output_rows[k] - t0;
    v4_job *jb = &b->jobs[n_jobs++];
    *jb = (v4_job){.key = bt->seqs[q].key, .t0 = t0, .n = n, .j0 = j0, .n_rows = logits ? j - j0 : 0};
    if (bt->n_groups > 0)
      seq_pages(b, bt, q, &jb->pages);
    DI_TRY(get_state(b, jb->key, bt->positions[t0], bt->n_groups > 0 && bt->seq_replay ? bt->seq_replay[q] : 0,
                     bt->n_groups > 0 ? &jb->pages : NULL, &jb->st));
  }
  b->run = bt;
  b->run_logits = logits;
  if (n_jobs == 1 || !b->tp)
    run_jobs(b, 0, n_jobs, 0);
  else
    di_parallel_for(b->tp, n_jobs, 1, run_jobs, b);
  b->run = NULL;
  for (int i = 0; i < n_jobs; i++)
    if (b->jobs[i].status != DI_OK)
      return di_error_set(b->jobs[i].status, WHO ": sequence key %llu: %s", (unsigned long long)b->jobs[i].key,
                          b->jobs[i].err);
  return DI_OK;
}

static di_status v4_wait(di_backend *base, float *logits, float *hidden) {
  v4_backend *b = (v4_backend *)base;
  const di_batch *bt = b->batch;
  b->batch = NULL;
  if (!bt)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": wait without a submitted step");
  if (hidden)
    return di_error_set(DI_ERR_UNSUPPORTED, WHO ": final hidden states (MTP drafting) are not available for DeepSeek-V4");
  return run_batch(b, bt, logits);
}

static void v4_release(di_backend *base, uint64_t key) {
  v4_backend *b = (v4_backend *)base;
  v4_seq *s = find(b, key);
  if (!s)
    return;
  di_v4_seq_state_free(s->st);
  *s = b->seqs[--b->n_seqs];
}

static void v4_destroy(di_backend *base) {
  v4_backend *b = (v4_backend *)base;
  if (!b)
    return;
  for (int i = 0; i < b->n_seqs; i++)
    di_v4_seq_state_free(b->seqs[i].st);
  free(b->seqs);
  free_pools(b);
  free(b->rows);
  free(b->jobs);
  di_threadpool_free(b->tp);
  free(b);
}

static const di_backend_ops V4_OPS = {
    .name = "cpu (deepseek_v4)",
    .kv_groups = v4_kv_groups,
    .kv_alloc = v4_kv_alloc,
    .submit = v4_submit,
    .wait = v4_wait,
    .sample = NULL,
    .mtp = NULL, /* V4's MTP layers are not read */
    .release = v4_release,
    .destroy = v4_destroy,
    .kv_alloc_groups = v4_kv_alloc_groups,
};

di_status di_backend_cpu_v4_create(const di_model_config *cfg, const di_v4_config *v4, const di_v4_weights *w,
                                   int threads, di_backend **out) {
  if (!cfg || !v4 || !w || !out)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": NULL argument");
  if (w->n_layers != v4->n_layers)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": weights have %d layers, the config %d", w->n_layers, v4->n_layers);
  v4_backend *b = calloc(1, sizeof *b);
  if (!b)
    return di_error_set(DI_ERR_OOM, WHO ": out of memory");
  b->base.ops = &V4_OPS;
  b->base.cfg = cfg;
  b->base.vocab_size = v4->vocab_size;
  b->base.hidden_size = v4->hidden_size;
  b->base.n_mtp_layers = 0;
  b->c = v4;
  b->w = w;
  di_v4_layout_init(v4, &b->lay);
  di_v4_seq_state *probe;
  di_status st = di_v4_seq_state_create_paged(v4, &probe);
  if (st == DI_OK && threads != 1) {
    st = di_threadpool_create(threads, &b->tp);
    if (st != DI_OK)
      di_v4_seq_state_free(probe);
  }
  if (st != DI_OK) {
    free(b);
    return st;
  }
  b->bytes_per_seq = (int64_t)di_v4_seq_state_bytes(probe);
  di_v4_seq_state_free(probe);
  *out = &b->base;
  return DI_OK;
}

int di_backend_cpu_v4_live_states(const di_backend *base) {
  return base && base->ops == &V4_OPS ? ((const v4_backend *)base)->n_seqs : -1;
}
