/* di_model_loglikelihood: log p(continuation | context) and "is the continuation greedy" from one
 * forward pass, as lm-evaluation-harness scores multiple-choice answers. Only the logits rows that
 * predict continuation tokens are computed, a bounded number of rows per forward call. */
#include "api/model_loglik.h"
#include "api/model_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Default rows per forward call: ~64 MiB of float logits (64 rows at least). */
static int default_rows(int vocab) {
  long r = (64L << 20) / (4L * (vocab > 0 ? vocab : 1));
  return r < 64 ? 64 : (int)r;
}

/* One row's log-softmax at `target` (double) and whether `target` is its argmax. NaN logits are
 * ignored (never the argmax, no mass), as the sampler treats them; the argmax's ties go to the
 * lowest id, as greedy sampling breaks them. */
static double row_logprob(const float *l, int V, int32_t target, int *greedy) {
  float mx = -INFINITY;
  int best = -1;
  for (int v = 0; v < V; v++)
    if (l[v] > mx) { /* strict: the first maximum wins; false for NaN */
      mx = l[v];
      best = v;
    }
  *greedy = best == target;
  if (best < 0) /* every logit -inf or NaN: nothing has probability */
    return -INFINITY;
  double z = 0;
  for (int v = 0; v < V; v++)
    if (!isnan(l[v]))
      z += exp((double)l[v] - (double)mx);
  if (isnan(l[target]))
    return -INFINITY;
  return (double)l[target] - (double)mx - log(z);
}

di_status di_model_loglikelihood_chunked(di_model *m, const int32_t *ids, int n, int start, int max_rows,
                                         float *logprob, int *is_greedy) {
  if (!m || !ids || !logprob)
    return di_error_set(DI_ERR_INVALID_ARG, "di_model_loglikelihood: NULL argument");
  if (n < 2)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "di_model_loglikelihood: sequence of %d tokens (need at least one context and one continuation token)", n);
  if (start < 1 || start >= n)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "di_model_loglikelihood: start %d out of range [1, %d] (the context must be non-empty and the "
                        "continuation ids[start..%d) non-empty)", start, n - 1, n);
  if (n > m->cfg.max_position_embeddings)
    return di_error_set(DI_ERR_CONTEXT_OVERFLOW, "di_model_loglikelihood: sequence of %d tokens is longer than the context (%d)", n,
                        m->cfg.max_position_embeddings);
  const int V = m->cfg.vocab_size;
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V)
      return di_error_set(DI_ERR_INVALID_ARG, "di_model_loglikelihood: token %d at position %d is outside the vocabulary [0, %d)",
                          ids[i], i, V);
  const int R = max_rows > 0 ? max_rows : default_rows(V);
  /* The last token is only predicted, never fed: rows [0, n-1) run, rows [start-1, n-1) are kept. */
  const int T = n - 1;
  const int nb = (T + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
  di_status st = m->backend->ops->kv_alloc(m->backend, nb);
  if (st != DI_OK)
    return st;
  /* the first chunk holds the whole context plus up to R rows; later chunks R tokens each */
  const int first = start - 1 + R < T ? start - 1 + R : T;
  const int cap = first > R ? first : R;
  int32_t *table = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * (size_t)cap),
          *seq = calloc((size_t)cap, sizeof(int32_t)), *rows = malloc(sizeof(int32_t) * (size_t)R);
  float *logits = malloc(sizeof(float) * (size_t)R * (size_t)V);
  if (!table || !pos || !seq || !rows || !logits) {
    st = di_error_set(DI_ERR_OOM, "di_model_loglikelihood: out of memory for %d rows of %d logits", R, V);
    goto done;
  }
  for (int i = 0; i < nb; i++)
    table[i] = i;
  di_batch_seq s = {table, nb};
  double sum = 0;
  int greedy = 1;
  for (int a = 0, b = first; a < T; a = b, b = b + R < T ? b + R : T) {
    const int lo = a > start - 1 ? a : start - 1; /* first kept row of this chunk (absolute) */
    for (int i = a; i < b; i++)
      pos[i - a] = i;
    for (int r = lo; r < b; r++)
      rows[r - lo] = r - a;
    di_batch bt = {.n_tokens = b - a, .tokens = ids + a, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = &s,
                   .n_outputs = b - lo, .output_rows = rows};
    st = di_backend_forward(m->backend, &bt, logits);
    if (st != DI_OK)
      goto done;
    for (int r = lo; r < b; r++) { /* logits at r predict ids[r + 1] */
      int g;
      sum += row_logprob(logits + (size_t)(r - lo) * V, V, ids[r + 1], &g);
      greedy &= g;
    }
  }
  *logprob = (float)sum;
  if (is_greedy)
    *is_greedy = greedy;
done:
  free(table);
  free(pos);
  free(seq);
  free(rows);
  free(logits);
  return st;
}

di_status di_model_loglikelihood(di_model *m, const int32_t *ids, int n, int start, float *logprob, int *is_greedy) {
  return di_model_loglikelihood_chunked(m, ids, n, start, 0, logprob, is_greedy);
}
