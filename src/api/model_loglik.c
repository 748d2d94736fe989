/* di_model_loglikelihood(_batch): log p(continuation | context) and "is the continuation greedy" from
 * one forward pass, as lm-evaluation-harness scores multiple-choice answers. Only the logits rows that
 * predict continuation tokens are computed, a bounded number of rows per forward call; short sequences
 * share forward calls (one KV block table each), long ones run alone in chunks through the cache. */
#include "api/model_loglik.h"
#include "api/model_internal.h"
#include "sampler/sampler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tokens fed per forward call when sequences are packed together (the engine's default step). */
#define DI_LL_BATCH_TOKENS 2048
/* Sequences per packed call at most: their keys 0 .. 1023 stay below every engine sequence's key
 * (request id * 1024 + sample, ids from 1), for backends with per-sequence state (DeepSeek-V4). */
#define DI_LL_MAX_GROUP 1024

/* Default rows per forward call: ~64 MiB of float logits (64 rows at least). */
static int default_rows(int vocab) {
  long r = (64L << 20) / (4L * (vocab > 0 ? vocab : 1));
  return r < 64 ? 64 : (int)r;
}

/* Rows per forward call for the given request. Where an architecture's logits depend on how a sequence
 * is cut into forward calls (its registry entry's whole_sequence: DeepSeek-V4's compressed attention, as
 * in transformers' cached runs), a sequence is never cut: the rows grow to its whole continuation (the
 * logits of one call then hold them all). */
static int rows_per_call(const di_model *m, int max_rows, int longest_continuation) {
  const int R = max_rows > 0 ? max_rows : default_rows(m->cfg.vocab_size);
  return m->arch->whole_sequence && longest_continuation > R ? longest_continuation : R;
}

/* One row's log-softmax at `target` (double) and whether `target` is its argmax. NaN logits are
 * ignored (never the argmax, no mass), as the sampler treats them; the argmax's ties go to the
 * lowest id, as greedy sampling breaks them. */
static double row_logprob(const float *l, int V, int32_t target, int *greedy) {
  float mx;
  const int32_t best = di_row_argmax(l, V, &mx);
  *greedy = best == target;
  if (best < 0) /* every logit -inf or NaN: nothing has probability */
    return -INFINITY;
  const double z = di_row_expsum(l, V, mx);
  if (isnan(l[target]))
    return -INFINITY;
  return (double)l[target] - (double)mx - log(z);
}

/* The checks of one sequence; `which` >= 0 names it in the message (batch calls). */
static di_status check_seq(const di_model *m, const int32_t *ids, int n, int start, int which) {
  char who[48] = "";
  if (which >= 0)
    snprintf(who, sizeof who, " sequence %d:", which);
  if (!ids)
    return di_error_set(DI_ERR_INVALID_ARG, "di_model_loglikelihood:%s NULL argument", who);
  if (n < 2)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "di_model_loglikelihood:%s sequence of %d tokens (need at least one context and one continuation token)",
                        who, n);
  if (start < 1 || start >= n)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "di_model_loglikelihood:%s start %d out of range [1, %d] (the context must be non-empty and the "
                        "continuation ids[start..%d) non-empty)", who, start, n - 1, n);
  if (n > m->cfg.max_position_embeddings)
    return di_error_set(DI_ERR_CONTEXT_OVERFLOW, "di_model_loglikelihood:%s sequence of %d tokens is longer than the context (%d)",
                        who, n, m->cfg.max_position_embeddings);
  const int V = m->cfg.vocab_size;
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V)
      return di_error_set(DI_ERR_INVALID_ARG, "di_model_loglikelihood:%s token %d at position %d is outside the vocabulary [0, %d)",
                          who, ids[i], i, V);
  return DI_OK;
}

static int blocks_for(int tokens) { return (tokens + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE; }

/* Scratch of one call: R logits rows and the batch arrays for up to `cap` tokens and `nb` blocks. */
typedef struct ll_scratch {
  int R, cap, nb;
  int32_t *table, *pos, *seq_of, *rows;
  di_batch_seq *seqs;
  float *logits;
} ll_scratch;

static void scratch_free(ll_scratch *w) {
  free(w->table);
  free(w->pos);
  free(w->seq_of);
  free(w->rows);
  free(w->seqs);
  free(w->logits);
}

static di_status scratch_init(ll_scratch *w, int R, int cap, int nb, int max_seqs, int V) {
  *w = (ll_scratch){.R = R, .cap = cap, .nb = nb};
  w->table = malloc(sizeof(int32_t) * (size_t)nb);
  w->pos = malloc(sizeof(int32_t) * (size_t)cap);
  w->seq_of = malloc(sizeof(int32_t) * (size_t)cap);
  w->rows = malloc(sizeof(int32_t) * (size_t)R);
  w->seqs = malloc(sizeof(di_batch_seq) * (size_t)max_seqs);
  w->logits = malloc(sizeof(float) * (size_t)R * (size_t)V);
  if (!w->table || !w->pos || !w->seq_of || !w->rows || !w->seqs || !w->logits) {
    scratch_free(w);
    return di_error_set(DI_ERR_OOM, "di_model_loglikelihood: out of memory for %d rows of %d logits", R, V);
  }
  for (int i = 0; i < nb; i++)
    w->table[i] = i;
  return DI_OK;
}

/* Drops what a backend keeps per sequence beside the blocks (DeepSeek-V4's state) for the keys
 * [0, n) used here (n <= DI_LL_MAX_GROUP; each sequence here starts at position 0, which restarts its
 * key's state). */
static void release_keys(di_model *m, int n) {
  if (m->backend->ops->release)
    for (int k = 0; k < n; k++)
      m->backend->ops->release(m->backend, (uint64_t)k);
}

/* One sequence alone, in chunks: the first holds the whole context plus up to R rows, later ones R
 * tokens each (they see the earlier chunks through the cache). The last token is only predicted,
 * never fed: rows [0, n-1) run, rows [start-1, n-1) are kept. Blocks [0, blocks_for(n-1)) are used. */
static di_status run_alone(di_model *m, const int32_t *ids, int n, int start, ll_scratch *w, double *sum, int *greedy) {
  const int V = m->cfg.vocab_size, R = w->R, T = n - 1;
  const int first = start - 1 + R < T ? start - 1 + R : T;
  w->seqs[0] = (di_batch_seq){w->table, blocks_for(T), 0};
  *sum = 0;
  *greedy = 1;
  for (int a = 0, b = first; a < T; a = b, b = b + R < T ? b + R : T) {
    const int lo = a > start - 1 ? a : start - 1; /* first kept row of this chunk (absolute) */
    for (int i = a; i < b; i++) {
      w->pos[i - a] = i;
      w->seq_of[i - a] = 0;
    }
    for (int r = lo; r < b; r++)
      w->rows[r - lo] = r - a;
    di_batch bt = {.n_tokens = b - a, .tokens = ids + a, .positions = w->pos, .seq_of = w->seq_of, .n_seqs = 1,
                   .seqs = w->seqs, .n_outputs = b - lo, .output_rows = w->rows};
    DI_TRY(di_backend_forward(m->backend, &bt, w->logits));
    for (int r = lo; r < b; r++) { /* logits at r predict ids[r + 1] */
      int g;
      *sum += row_logprob(w->logits + (size_t)(r - lo) * V, V, ids[r + 1], &g);
      *greedy &= g;
    }
  }
  return DI_OK;
}

/* Sequences [i0, i1) packed into one forward call (each fits: together at most w->cap fed tokens
 * and w->R kept rows), each with its own run of blocks. */
static di_status run_group(di_model *m, const int32_t *const *ids, const int *n, const int *start, int i0, int i1,
                           ll_scratch *w, int32_t *tokens, double *sum, int *greedy) {
  const int V = m->cfg.vocab_size;
  int t = 0, o = 0, blk = 0;
  for (int i = i0; i < i1; i++) {
    const int T = n[i] - 1, k = i - i0;
    w->seqs[k] = (di_batch_seq){w->table + blk, blocks_for(T), (uint64_t)k};
    blk += blocks_for(T);
    for (int p = 0; p < T; p++, t++) {
      tokens[t] = ids[i][p];
      w->pos[t] = p;
      w->seq_of[t] = k;
      if (p >= start[i] - 1)
        w->rows[o++] = t;
    }
  }
  di_batch bt = {.n_tokens = t, .tokens = tokens, .positions = w->pos, .seq_of = w->seq_of, .n_seqs = i1 - i0,
                 .seqs = w->seqs, .n_outputs = o, .output_rows = w->rows};
  DI_TRY(di_backend_forward(m->backend, &bt, w->logits));
  o = 0;
  for (int i = i0; i < i1; i++) {
    sum[i] = 0;
    greedy[i] = 1;
    for (int p = start[i] - 1; p < n[i] - 1; p++, o++) {
      int g;
      sum[i] += row_logprob(w->logits + (size_t)o * V, V, ids[i][p + 1], &g);
      greedy[i] &= g;
    }
  }
  return DI_OK;
}

di_status di_model_loglikelihood_chunked(di_model *m, const int32_t *ids, int n, int start, int max_rows,
                                         float *logprob, int *is_greedy) {
  if (!m || !logprob)
    return di_error_set(DI_ERR_INVALID_ARG, "di_model_loglikelihood: NULL argument");
  DI_TRY(check_seq(m, ids, n, start, -1));
  const int R = rows_per_call(m, max_rows, n - start);
  const int first = start - 1 + R < n - 1 ? start - 1 + R : n - 1;
  ll_scratch w;
  DI_TRY(m->backend->ops->kv_alloc(m->backend, blocks_for(n - 1)));
  DI_TRY(scratch_init(&w, R, first > R ? first : R, blocks_for(n - 1), 1, m->cfg.vocab_size));
  double sum;
  int greedy;
  di_status st = run_alone(m, ids, n, start, &w, &sum, &greedy);
  release_keys(m, 1);
  if (st == DI_OK) {
    *logprob = (float)sum;
    if (is_greedy)
      *is_greedy = greedy;
  }
  scratch_free(&w);
  return st;
}

di_status di_model_loglikelihood(di_model *m, const int32_t *ids, int n, int start, float *logprob, int *is_greedy) {
  return di_model_loglikelihood_chunked(m, ids, n, start, 0, logprob, is_greedy);
}

/* A sequence that runs alone: more fed tokens or kept rows than one packed call takes. */
static int is_long(int n, int start, int R, int cap) { return n - 1 > cap || n - start > R; }

/* The packed group starting at sequence i (not long): consecutive short sequences while their fed
 * tokens fit `cap` and their kept rows fit R. Returns the end (exclusive), > i. */
static int group_end(const int *n, const int *start, int n_seqs, int i, int R, int cap) {
  int j = i, toks = 0, rows = 0;
  while (j < n_seqs && j - i < DI_LL_MAX_GROUP && !is_long(n[j], start[j], R, cap) && toks + n[j] - 1 <= cap &&
         rows + n[j] - start[j] <= R) {
    toks += n[j] - 1;
    rows += n[j] - start[j];
    j++;
  }
  return j;
}

di_status di_model_loglikelihood_batch_rows(di_model *m, int n_seqs, const int32_t *const *ids, const int *n,
                                            const int *start, int max_rows, float *logprob, int *is_greedy) {
  if (!m || n_seqs < 0 || (n_seqs > 0 && (!ids || !n || !start || !logprob)))
    return di_error_set(DI_ERR_INVALID_ARG, "di_model_loglikelihood_batch: NULL argument or negative count");
  for (int i = 0; i < n_seqs; i++)
    DI_TRY(check_seq(m, ids[i], n[i], start[i], i));
  if (n_seqs == 0)
    return DI_OK;
  int longest = 0;
  for (int i = 0; i < n_seqs; i++)
    longest = n[i] - start[i] > longest ? n[i] - start[i] : longest;
  const int V = m->cfg.vocab_size, R = rows_per_call(m, max_rows, longest);
  const int cap = DI_LL_BATCH_TOKENS > R ? DI_LL_BATCH_TOKENS : R;
  /* plan: blocks and scratch for the largest packed group and the largest lone sequence */
  int max_blocks = 0, max_tokens = cap, max_group = 1;
  for (int i = 0; i < n_seqs;) {
    if (is_long(n[i], start[i], R, cap)) {
      const int first = start[i] - 1 + R < n[i] - 1 ? start[i] - 1 + R : n[i] - 1;
      max_blocks = blocks_for(n[i] - 1) > max_blocks ? blocks_for(n[i] - 1) : max_blocks;
      max_tokens = first > max_tokens ? first : max_tokens;
      i++;
      continue;
    }
    const int j = group_end(n, start, n_seqs, i, R, cap);
    int blk = 0;
    for (int k = i; k < j; k++)
      blk += blocks_for(n[k] - 1);
    max_blocks = blk > max_blocks ? blk : max_blocks;
    max_group = j - i > max_group ? j - i : max_group;
    i = j;
  }
  DI_TRY(m->backend->ops->kv_alloc(m->backend, max_blocks));
  ll_scratch w;
  DI_TRY(scratch_init(&w, R, max_tokens, max_blocks, max_group, V));
  double *sum = malloc(sizeof(double) * (size_t)n_seqs);
  int *greedy = malloc(sizeof(int) * (size_t)n_seqs);
  int32_t *tokens = malloc(sizeof(int32_t) * (size_t)cap);
  di_status st = DI_OK;
  if (!sum || !greedy || !tokens)
    st = di_error_set(DI_ERR_OOM, "di_model_loglikelihood_batch: out of memory for %d sequences", n_seqs);
  for (int i = 0; i < n_seqs && st == DI_OK;) {
    if (is_long(n[i], start[i], R, cap)) {
      st = run_alone(m, ids[i], n[i], start[i], &w, &sum[i], &greedy[i]);
      i++;
      continue;
    }
    const int j = group_end(n, start, n_seqs, i, R, cap);
    st = run_group(m, ids, n, start, i, j, &w, tokens, sum, greedy);
    i = j;
  }
  release_keys(m, max_group);
  if (st == DI_OK) /* outputs only on success */
    for (int i = 0; i < n_seqs; i++) {
      logprob[i] = (float)sum[i];
      if (is_greedy)
        is_greedy[i] = greedy[i];
    }
  free(sum);
  free(greedy);
  free(tokens);
  scratch_free(&w);
  return st;
}

di_status di_model_loglikelihood_batch(di_model *m, int n_seqs, const int32_t *const *ids, const int *n, const int *start,
                                       float *logprob, int *is_greedy) {
  return di_model_loglikelihood_batch_rows(m, n_seqs, ids, n, start, 0, logprob, is_greedy);
}
