/* Prompt logprobs: the rows of prefill steps that predict each prompt token (vLLM's prompt_logprobs).
 * The scheduler asks the backend for the logits of those rows next to the sampled ones (at most
 * plp_row_cap per step, which bounds the host logits buffer); after the step they become
 * log-softmax values of the raw logits (double sums, ids >= vocab_limit excluded, as the sampler)
 * plus the top k ids, stored per request and delivered once with its first output. */
#include "engine/engine_internal.h"
#include <math.h>
#include <stdlib.h>

/* Logits the host buffer may hold for prompt rows; at least 16 rows, at most a step's tokens. */
#define DI_PLP_LOGITS_BYTES ((size_t)256 << 20)

int di_plp_rows(const di_req *r, int start, int n, int *first) {
  if (r->plp_k < 0) return 0;
  int a = start > r->plp_next ? start : r->plp_next;
  int b = start + n < r->n_prompt - 1 ? start + n : r->n_prompt - 1;
  if (first) *first = a;
  return b > a ? b - a : 0;
}

di_status di_plp_reserve(di_engine *e) {
  if (e->plp_row_cap > 0) return DI_OK;
  int budget = e->opt.max_num_batched_tokens;
  if (e->spec) { /* speculative decoding already keeps every row of a step */
    e->plp_row_cap = budget;
    return DI_OK;
  }
  size_t row_bytes = (size_t)e->cfg.vocab_size * sizeof(float);
  size_t cap = DI_PLP_LOGITS_BYTES / row_bytes;
  if (cap < 16) cap = 16;
  if (cap > (size_t)budget) cap = (size_t)budget;
  size_t rows = (size_t)e->opt.max_num_seqs + cap;
  float *lg = realloc(e->logits, rows * row_bytes);
  if (!lg)
    return di_error_set(DI_ERR_OOM, "prompt logprobs: out of memory for %zu logits rows of %d", rows, e->cfg.vocab_size);
  e->logits = lg;
  e->plp_row_cap = (int)cap;
  return DI_OK;
}

/* is (la, a) ranked before (lb, b): larger logit, then lower id */
static int before(float la, int a, float lb, int b) { return la > lb || (la == lb && a < b); }

static void row_logprobs(const float *l, int V, int k, int32_t target, float *lp, int32_t *rank, di_token_logprob *top) {
  float mx;
  (void)di_row_argmax(l, V, &mx); /* NaN never wins */
  int ok = target >= 0 && target < V && !isnan(l[target]);
  float lt = ok ? l[target] : INFINITY;
  int32_t above = 0;
  for (int i = 0; i < V; i++) above += l[i] > lt;
  double lse = (double)mx + log(di_row_expsum(l, V, mx));
  *lp = ok ? (float)((double)l[target] - lse) : -INFINITY;
  *rank = ok ? above + 1 : V;
  if (k <= 0) return;
  int32_t ids[DI_MAX_LOGPROBS];
  int n = 0;
  for (int i = 0; i < V; i++) {
    if (isnan(l[i]) || l[i] == -INFINITY) continue;
    if (n == k && !before(l[i], i, l[ids[n - 1]], ids[n - 1])) continue;
    int j = n < k ? n++ : k - 1;
    while (j > 0 && before(l[i], i, l[ids[j - 1]], ids[j - 1])) {
      ids[j] = ids[j - 1];
      j--;
    }
    ids[j] = i;
  }
  for (int j = 0; j < k; j++) {
    top[j].id = j < n ? ids[j] : -1;
    top[j].logprob = j < n ? (float)((double)l[ids[j]] - lse) : -INFINITY;
  }
}

void di_plp_extract(di_engine *e, const di_sched *s) {
  int V = e->cfg.vocab_limit > 0 && e->cfg.vocab_limit < e->cfg.vocab_size ? e->cfg.vocab_limit : e->cfg.vocab_size;
  for (int i = 0; i < s->n; i++) {
    const di_sched_entry *en = &s->e[i];
    di_req *r = en->r;
    if (en->dropped || en->plp_n <= 0 || r->state == DI_REQ_DONE || !r->plp) continue;
    int k = r->plp_k;
    for (int j = 0; j < en->plp_n; j++) {
      int pos = en->plp_pos0 + j; /* its row predicts the token at pos + 1 */
      const float *l = e->logits + (size_t)(en->plp_row0 + j) * (size_t)e->cfg.vocab_size;
      row_logprobs(l, V, k, r->tokens[pos + 1], &r->plp[pos + 1], &r->plp_rank[pos + 1],
                   k > 0 ? r->plp_top + (size_t)(pos + 1) * (size_t)k : NULL);
    }
    if (en->plp_pos0 + en->plp_n > r->plp_next) r->plp_next = en->plp_pos0 + en->plp_n;
  }
}

void di_plp_finish_scored(di_engine *e, const di_sched *s) {
  for (int i = 0; i < s->n; i++) {
    di_req *r = s->e[i].r;
    if (s->e[i].dropped || !r->score_only || r->state == DI_REQ_DONE) continue;
    if (r->n_valid >= r->n_prompt) di_req_finish(e, r, DI_FINISH_LENGTH, NULL);
  }
}
