/* One request sample's life: creation from the API parameters (validated and copied), appending
 * sampled tokens with every stop rule (stop tokens, stop strings spanning tokens, length, the
 * grammar), streaming text with the tail that may start a stop string held back, and its output
 * record for the step. */
#include "engine/engine_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double di_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *dup_mem(const void *p, size_t n) {
  if (n == 0) return NULL;
  void *q = malloc(n);
  if (q) memcpy(q, p, n);
  return q;
}

di_status di_req_create(di_engine *e, const di_request_params *p, const int32_t *prompt, int n_prompt,
                        int sample_index, uint64_t id, uint64_t seed, di_req **out) {
  di_req *r = calloc(1, sizeof *r);
  if (!r) return di_error_set(DI_ERR_OOM, "request: out of memory");
  r->id = id;
  r->sample_index = sample_index;
  r->n_samples = p->n > 0 ? p->n : 1;
  r->stop_token = -1;
  r->t_arrival = di_now();
  r->t_first = -1;
  r->n_prompt = n_prompt;
  int max_len = e->opt.max_model_len;
  r->max_len = max_len;
  r->score_only = p->prompt_logprobs >= 0 && p->max_tokens == 0;
  r->max_tokens = p->max_tokens > 0 ? p->max_tokens : r->score_only ? 0 : max_len;
  r->min_tokens = p->min_tokens > 0 ? p->min_tokens : 0;
  int cap_tokens = n_prompt + r->max_tokens;
  if (cap_tokens > max_len + 1 || cap_tokens < n_prompt) cap_tokens = (max_len > n_prompt ? max_len : n_prompt) + 1;
  r->cap = cap_tokens;
  r->tokens = malloc((size_t)r->cap * sizeof *r->tokens);
  di_status st = DI_OK;
  if (!r->tokens) { st = di_error_set(DI_ERR_OOM, "request: out of memory for %d tokens", r->cap); goto fail; }
  if (n_prompt) memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
  r->n_tokens = n_prompt;
  r->plp_k = sample_index == 0 && p->prompt_logprobs >= 0 ? p->prompt_logprobs : -1; /* sample 0 reports them */
  if (r->plp_k >= 0 && n_prompt > 0) {
    r->plp = malloc((size_t)n_prompt * sizeof *r->plp);
    r->plp_rank = malloc((size_t)n_prompt * sizeof *r->plp_rank);
    if (r->plp_k > 0) r->plp_top = malloc((size_t)n_prompt * (size_t)r->plp_k * sizeof *r->plp_top);
    if (!r->plp || !r->plp_rank || (r->plp_k > 0 && !r->plp_top)) {
      st = di_error_set(DI_ERR_OOM, "request: out of memory for %d prompt logprobs", n_prompt);
      goto fail;
    }
    /* the first token has no context; tokens before prompt_logprobs_from are not reported (their
     * rows need not be computed, so the prompt up to there may come from the prefix cache) */
    r->plp_from = p->prompt_logprobs_from;
    const int none = r->plp_from > 1 ? (r->plp_from < n_prompt ? r->plp_from : n_prompt) : 1;
    for (int i = 0; i < none; i++) {
      r->plp[i] = NAN;
      r->plp_rank[i] = 0;
      for (int j = 0; j < r->plp_k; j++) r->plp_top[(size_t)i * r->plp_k + j] = (di_token_logprob){-1, NAN};
    }
    r->plp_next = none - 1; /* the row at position i predicts token i + 1 */
  }

  di_sampling *sp = &r->sp;
  sp->temperature = p->temperature;
  sp->top_p = p->top_p;
  sp->top_k = p->top_k;
  sp->min_p = p->min_p;
  sp->repetition_penalty = p->repetition_penalty;
  sp->presence_penalty = p->presence_penalty;
  sp->frequency_penalty = p->frequency_penalty;
  sp->logprobs = p->logprobs;
  sp->seed = seed;
  sp->stream = (uint64_t)sample_index;
  if (p->n_logit_bias > 0) {
    r->bias_ids = dup_mem(p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof *p->logit_bias_ids);
    r->bias_values = dup_mem(p->logit_bias_values, (size_t)p->n_logit_bias * sizeof *p->logit_bias_values);
    if (!r->bias_ids || !r->bias_values) { st = di_error_set(DI_ERR_OOM, "request: out of memory"); goto fail; }
    sp->bias_ids = r->bias_ids;
    sp->bias_values = r->bias_values;
    sp->n_bias = p->n_logit_bias;
  }
  int n_eos = p->ignore_eos ? 0 : e->cfg.n_eos;
  r->stop_ids = malloc((size_t)(n_eos + p->n_stop_token_ids + 1) * sizeof *r->stop_ids);
  if (!r->stop_ids) { st = di_error_set(DI_ERR_OOM, "request: out of memory"); goto fail; }
  for (int i = 0; i < n_eos; i++) r->stop_ids[r->n_stop_ids++] = e->cfg.eos_ids[i];
  for (int i = 0; i < p->n_stop_token_ids; i++) r->stop_ids[r->n_stop_ids++] = p->stop_token_ids[i];
  if (r->min_tokens > 0) {
    sp->ban_ids = r->stop_ids;
    sp->n_ban = r->n_stop_ids;
  }
  st = di_stop_set_init(&r->stops, p->stop, p->n_stop);
  if (st != DI_OK) goto fail;
  r->include_stop_str = p->include_stop_str_in_output;
  if (e->text.stream_create) {
    st = e->text.stream_create(e->text.ctx, p->skip_special_tokens, &r->detok);
    if (st != DI_OK) goto fail;
  }
  int want_structure = p->json_schema || p->regex || p->grammar || p->json_object;
  if (want_structure) {
    if (!e->constraint.create) {
      st = di_error_set(DI_ERR_UNSUPPORTED, "%s", e->cfg.constraint_missing ? e->cfg.constraint_missing
                        : "structured outputs need the grammar engine and a tokenizer");
      goto fail;
    }
    st = e->constraint.create(e->constraint.ctx, p, &r->constraint);
    if (st != DI_OK) goto fail;
  }
  *out = r;
  return DI_OK;
fail:
  di_req_free(e, r);
  return st;
}

void di_req_free(di_engine *e, di_req *r) {
  if (!r) return;
  if (e->kv) di_req_free_kv(e, r);
  if (r->detok && e->text.stream_free) e->text.stream_free(r->detok);
  if (r->constraint && e->constraint.free) e->constraint.free(r->constraint);
  di_stop_set_destroy(&r->stops);
  free(r->tokens); free(r->bias_ids); free(r->bias_values); free(r->stop_ids);
  free(r->text); free(r->error);
  free(r->out_tokens); free(r->out_lp); free(r->out_top); free(r->out_text);
  free(r->plp); free(r->plp_top); free(r->plp_rank);
  free(r->draft_q);
  free(r);
}

uint64_t di_req_key(const di_req *r) { return r->id * 1024u + (uint64_t)r->sample_index; } /* n <= 1024 */

void di_req_free_kv(di_engine *e, di_req *r) {
  di_kv_free_seq(e->kv, &r->kv);
  if (e->be && e->be->ops->release) e->be->ops->release(e->be, di_req_key(r));
}

static void mark_output(di_engine *e, di_req *r) { (void)e; r->in_output = 1; }

void di_req_finish(di_engine *e, di_req *r, di_finish_reason why, const char *error) {
  if (r->state == DI_REQ_DONE) return;
  if (r->state == DI_REQ_RUNNING) di_engine_remove_running(e, r);
  else di_engine_remove_waiting(e, r);
  r->state = DI_REQ_DONE;
  r->finish = why;
  if (r->sample_index == 0 && r->n_samples > 1) /* followers must not keep a pointer to us */
    for (int i = 0; i < e->n_all; i++)
      if (e->all[i]->leader == r) e->all[i]->leader = NULL;
  if (error && !r->error) r->error = strdup(error);
  /* an in-flight step still reads this request's block table: the blocks go back when that step
   * has completed (di_req_release_inflight) */
  if (!r->inflight) di_req_free_kv(e, r);
  r->n_computed = r->n_valid = 0;
  /* everything still held back is final text now */
  if (why != DI_FINISH_ERROR && r->text_emitted < r->text_len) r->text_emitted = r->text_len;
  mark_output(e, r);
}

static int text_reserve(di_req *r, size_t extra) {
  if (r->text_len + extra + 1 <= r->text_cap) return 1;
  size_t cap = r->text_cap ? r->text_cap : 64;
  while (cap < r->text_len + extra + 1) cap *= 2;
  char *t = realloc(r->text, cap);
  if (!t) return 0;
  r->text = t;
  r->text_cap = cap;
  return 1;
}

static int out_reserve(di_req *r, int n_top) {
  if (r->n_out < r->out_cap) return 1;
  int cap = r->out_cap ? r->out_cap * 2 : 4;
  int32_t *t = realloc(r->out_tokens, (size_t)cap * sizeof *t);
  if (!t) return 0;
  r->out_tokens = t;
  float *lp = realloc(r->out_lp, (size_t)cap * sizeof *lp);
  if (!lp) return 0;
  r->out_lp = lp;
  if (n_top > 0) {
    di_token_logprob *tp = realloc(r->out_top, (size_t)cap * (size_t)n_top * sizeof *tp);
    if (!tp) return 0;
    r->out_top = tp;
  }
  r->out_cap = cap;
  return 1;
}

/* appends decoded text and applies stop strings; returns 1 when a stop string ended the request */
static int add_text(di_engine *e, di_req *r, const char *s, size_t n) {
  if (n == 0) return 0;
  if (!text_reserve(r, n)) {
    di_req_finish(e, r, DI_FINISH_ERROR, "out of memory for the generated text");
    return 1;
  }
  memcpy(r->text + r->text_len, s, n);
  r->text_len += n;
  r->text[r->text_len] = 0;
  if (r->stops.n == 0) {
    r->text_emitted = r->text_len;
    return 0;
  }
  int which = -1;
  long at = di_stop_find(&r->stops, r->text, r->text_len, r->text_checked, &which);
  if (at >= 0) {
    r->text_len = (size_t)at + (r->include_stop_str ? r->stops.len[which] : 0);
    r->text[r->text_len] = 0;
    if (r->text_emitted > r->text_len) r->text_emitted = r->text_len;
    if (r->state == DI_REQ_DONE) r->finish = DI_FINISH_STOP; /* it also reached its length */
    else di_req_finish(e, r, DI_FINISH_STOP, NULL);
    return 1;
  }
  r->text_checked = r->text_len;
  size_t hold = r->state == DI_REQ_DONE ? 0 : di_stop_holdback(&r->stops, r->text, r->text_len);
  if (r->text_len - hold > r->text_emitted) r->text_emitted = r->text_len - hold;
  return 0;
}

void di_req_push_token(di_engine *e, di_req *r, const di_sample_result *res) {
  int32_t t = res->token;
  double now = di_now();
  if (r->t_first < 0) r->t_first = now;
  r->t_last = now;
  DI_ASSERT(r->n_tokens < r->cap);
  r->tokens[r->n_tokens++] = t;
  int n_top = r->sp.logprobs > 0 ? r->sp.logprobs : 0;
  if (!out_reserve(r, n_top)) {
    di_req_finish(e, r, DI_FINISH_ERROR, "out of memory for the step output");
    return;
  }
  r->out_tokens[r->n_out] = t;
  r->out_lp[r->n_out] = res->logprob;
  for (int k = 0; k < n_top; k++) {
    di_token_logprob *tp = &r->out_top[(size_t)r->n_out * (size_t)n_top + (size_t)k];
    tp->id = k < res->n_top ? res->top_ids[k] : -1;
    tp->logprob = k < res->n_top ? res->top_logprobs[k] : -INFINITY;
  }
  r->n_out++;
  mark_output(e, r);
  e->generated_tokens++;
  int n_output = r->n_tokens - r->n_prompt;
  for (int i = 0; i < r->n_stop_ids; i++)
    if (r->stop_ids[i] == t && n_output >= r->min_tokens) {
      r->stop_token = t;
      di_req_finish(e, r, DI_FINISH_STOP, NULL);
      return;
    }
  if (n_output >= r->max_tokens || r->n_tokens >= r->max_len) di_req_finish(e, r, DI_FINISH_LENGTH, NULL);
}

void di_req_post_tokens(di_engine *e, di_req *r) {
  while (r->n_posted < r->n_tokens - r->n_prompt) {
    int i = r->n_prompt + r->n_posted++;
    int32_t t = r->tokens[i];
    int last = i == r->n_tokens - 1;
    if (last && r->stop_token == t && r->state == DI_REQ_DONE) break; /* the stop token adds no text */
    if (r->constraint && r->state != DI_REQ_DONE) {
      di_status st = e->constraint.accept(r->constraint, t);
      if (st != DI_OK) {
        di_req_finish(e, r, DI_FINISH_ERROR, di_last_error());
        return;
      }
    }
    if (r->detok) {
      const char *s;
      size_t n;
      di_status st = e->text.stream_push(r->detok, t, &s, &n);
      if (st != DI_OK) {
        di_req_finish(e, r, DI_FINISH_ERROR, di_last_error());
        return;
      }
      if (add_text(e, r, s, n)) return;
      if (last && r->state == DI_REQ_DONE && e->text.stream_flush(r->detok, &s, &n) == DI_OK && add_text(e, r, s, n))
        return; /* the detokenizer may hold an incomplete character: flush it through the stop check */
    }
    if (r->constraint && r->state != DI_REQ_DONE && e->constraint.is_terminated(r->constraint))
      di_req_finish(e, r, DI_FINISH_STOP, NULL);
  }
}

int di_req_output_count(const di_req *r) { return r->n_out; }

void di_req_fill_output(di_engine *e, di_req *r, di_seq_output *o) {
  memset(o, 0, sizeof *o);
  o->req_id = r->id;
  o->sample_index = r->sample_index;
  o->n_new_tokens = r->n_out;
  o->new_tokens = r->out_tokens;
  o->new_logprobs = r->sp.logprobs >= 0 && r->n_out > 0 ? r->out_lp : NULL;
  o->n_top = r->sp.logprobs > 0 ? r->sp.logprobs : 0;
  o->top = o->n_top > 0 && r->n_out > 0 ? r->out_top : NULL;
  size_t from = r->out_text_from, to = r->text_emitted;
  if (to < from) to = from;
  free(r->out_text);
  r->out_text = malloc(to - from + 1);
  if (r->out_text) {
    if (to > from) memcpy(r->out_text, r->text + from, to - from);
    r->out_text[to - from] = 0;
    o->new_text = r->out_text;
    o->new_text_len = to - from;
  } else {
    o->new_text = "";
  }
  r->out_text_from = to;
  o->finish_reason = r->state == DI_REQ_DONE ? r->finish : DI_FINISH_NONE;
  o->error = r->finish == DI_FINISH_ERROR ? (r->error ? r->error : "unknown error") : NULL;
  o->stop_token = r->stop_token;
  o->n_prompt_tokens = r->n_prompt;
  o->n_cached_tokens = r->n_cached;
  int n_output = r->n_tokens - r->n_prompt;
  o->n_output_tokens = n_output;
  o->prompt_token_ids = r->tokens;
  o->time_to_first_token = r->t_first >= 0 ? r->t_first - r->t_arrival : -1;
  o->time_per_output_token = n_output > 1 ? (r->t_last - r->t_first) / (n_output - 1) : 0;
  if (r->plp && !r->plp_sent && r->plp_next >= r->n_prompt - 1 && r->finish != DI_FINISH_ERROR &&
      r->finish != DI_FINISH_ABORT) {
    o->prompt_logprobs = r->plp;
    o->n_prompt_top = r->plp_k;
    o->prompt_top = r->plp_k > 0 ? r->plp_top : NULL;
    o->prompt_ranks = r->plp_rank;
    r->plp_sent = 1;
  }
  if (r->state == DI_REQ_DONE) r->reported = 1;
  r->in_output = 0;
  r->collected = 1;
  (void)e;
}

void di_req_reset_output(di_req *r) {
  if (!r->collected) return; /* not reported yet (a failed step): keep it for the next report */
  r->n_out = 0;
  r->collected = 0;
}
