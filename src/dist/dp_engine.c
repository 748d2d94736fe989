/* The data-parallel front end and its workers (see dp_engine.h).
 *
 * One tick (every rank, per di_engine_step of rank 0):
 *   1. rank 0 posts {payload bytes, stop} to every worker (di_comm_post_work: a worker waits for it
 *      without a deadline, so an idle server's workers neither time out nor spin), then broadcasts
 *      the payload: the new requests (their rank, id, parameters) and the aborted ids;
 *   2. every rank adds its new requests, applies the aborts it owns and steps its engine if it has
 *      work; with expert parallel it then listens (joins the others' forwards with zero tokens);
 *   3. every rank's {output bytes, load} is all-gathered, the outputs go to rank 0 (alltoallv).
 *
 * Wire format: a request is its di_request_params struct copied whole (so new scalar fields travel
 * without code here) followed by what its pointers point to; a NEW POINTER FIELD in
 * di_request_params must be added to put_request / get_request. Arrays are 8-byte aligned in the
 * buffers, so the reader points into the received bytes without copies (and without unaligned
 * loads). Text prompts are encoded on rank 0, so every rank gets token ids. */
#include "dist/dp_engine.h"
#include "dist/dist.h"
#include "engine/engine_internal.h"
#include "util/status.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- byte buffers ------------------------------------------------------------------------------ */
typedef struct {
  uint8_t *p;
  size_t n, cap;
  int oom;
} wbuf;

static void put(wbuf *b, const void *src, size_t n) {
  size_t pad = (8 - b->n % 8) % 8;
  if (b->n + pad + n > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->n + pad + n)
      c *= 2;
    uint8_t *q = realloc(b->p, c);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q, b->cap = c;
  }
  if (pad)
    memset(b->p + b->n, 0, pad);
  b->n += pad;
  if (src && n) /* NULL: room only (the receive buffers) */
    memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void put_i64(wbuf *b, int64_t v) { put(b, &v, sizeof v); }
/* a nullable string: length + 1 (0: NULL), then the bytes with their NUL */
static void put_str(wbuf *b, const char *s) {
  put_i64(b, s ? (int64_t)strlen(s) + 1 : 0);
  if (s)
    put(b, s, strlen(s) + 1);
}

typedef struct {
  const uint8_t *p;
  size_t n, at;
  int bad;
} rbuf;

static const void *get(rbuf *b, size_t n) {
  size_t at = b->at + (8 - b->at % 8) % 8;
  if (b->bad || at > b->n || n > b->n - at) {
    b->bad = 1;
    return NULL;
  }
  b->at = at + n;
  return b->p + at;
}
static int64_t get_i64(rbuf *b) {
  const int64_t *v = get(b, sizeof *v);
  return v ? *v : 0;
}
static const char *get_str(rbuf *b) {
  const int64_t n = get_i64(b);
  if (n <= 0)
    return NULL;
  const char *s = get(b, (size_t)n);
  return s && s[n - 1] == '\0' ? s : (b->bad = 1, NULL);
}
/* an array of n elements of `size` bytes (n from the stream, checked against what is left) */
static const void *get_arr(rbuf *b, int64_t n, size_t size) {
  if (n < 0 || (n && (size_t)n > (b->n - b->at) / size)) {
    b->bad = 1;
    return NULL;
  }
  return n ? get(b, (size_t)n * size) : NULL;
}

/* ---- requests ---------------------------------------------------------------------------------- */
static void put_request(wbuf *b, const di_request_params *p, const int32_t *prompt, int n_prompt) {
  put(b, p, sizeof *p);
  put_i64(b, n_prompt);
  put(b, prompt, sizeof(int32_t) * (size_t)n_prompt);
  put(b, p->logit_bias_ids, sizeof(int32_t) * (size_t)(p->n_logit_bias > 0 ? p->n_logit_bias : 0));
  put(b, p->logit_bias_values, sizeof(float) * (size_t)(p->n_logit_bias > 0 ? p->n_logit_bias : 0));
  put(b, p->stop_token_ids, sizeof(int32_t) * (size_t)(p->n_stop_token_ids > 0 ? p->n_stop_token_ids : 0));
  for (int i = 0; i < p->n_stop; i++)
    put_str(b, p->stop[i]);
  put_str(b, p->json_schema);
  put_str(b, p->regex);
  put_str(b, p->grammar);
}

/* stops: room for the stop strings' pointers (the caller frees it) */
static di_request_params get_request(rbuf *b, const char ***stops) {
  di_request_params p;
  const di_request_params *raw = get(b, sizeof p);
  if (!raw) {
    memset(&p, 0, sizeof p);
    return p;
  }
  p = *raw;
  p.prompt = NULL;
  p.prompt_is_rendered = 0;
  p.n_prompt_ids = (int)get_i64(b);
  p.prompt_ids = get_arr(b, p.n_prompt_ids, sizeof(int32_t));
  const int nb = p.n_logit_bias > 0 ? p.n_logit_bias : 0;
  p.logit_bias_ids = get_arr(b, nb, sizeof(int32_t));
  p.logit_bias_values = get_arr(b, nb, sizeof(float));
  p.stop_token_ids = get_arr(b, p.n_stop_token_ids > 0 ? p.n_stop_token_ids : 0, sizeof(int32_t));
  *stops = NULL;
  if (p.n_stop > 0) {
    *stops = calloc((size_t)p.n_stop, sizeof(char *));
    for (int i = 0; *stops && i < p.n_stop; i++)
      (*stops)[i] = get_str(b);
    if (!*stops)
      b->bad = 1;
  }
  p.stop = *stops;
  p.json_schema = get_str(b);
  p.regex = get_str(b);
  p.grammar = get_str(b);
  return p;
}

/* ---- step outputs ------------------------------------------------------------------------------ */
static void put_output(wbuf *b, const di_seq_output *o, uint64_t id) {
  const int64_t nt = o->n_new_tokens > 0 ? o->n_new_tokens : 0;
  const int64_t np = o->n_prompt_tokens > 0 ? o->n_prompt_tokens : 0;
  const int64_t k = o->top && o->n_top > 0 ? o->n_top : 0, kp = o->prompt_top && o->n_prompt_top > 0 ? o->n_prompt_top : 0;
  const int64_t head[] = {(int64_t)id, o->sample_index, nt, (int64_t)o->new_text_len, o->new_logprobs != NULL, k,
                          o->finish_reason, o->stop_token, np, o->n_cached_tokens, o->n_output_tokens,
                          o->prompt_logprobs != NULL, kp, o->prompt_ranks != NULL};
  put(b, head, sizeof head);
  const double times[2] = {o->time_to_first_token, o->time_per_output_token};
  put(b, times, sizeof times);
  put(b, o->new_tokens, sizeof(int32_t) * (size_t)nt);
  put(b, o->new_text ? o->new_text : "", o->new_text_len);
  if (o->new_logprobs)
    put(b, o->new_logprobs, sizeof(float) * (size_t)nt);
  put(b, o->top, sizeof(di_token_logprob) * (size_t)(nt * k));
  put_str(b, o->error);
  if (o->prompt_logprobs)
    put(b, o->prompt_logprobs, sizeof(float) * (size_t)np);
  put(b, o->prompt_top, sizeof(di_token_logprob) * (size_t)(np * kp));
  if (o->prompt_ranks)
    put(b, o->prompt_ranks, sizeof(int32_t) * (size_t)np);
}

static di_seq_output get_output(rbuf *b) {
  di_seq_output o;
  memset(&o, 0, sizeof o);
  const int64_t *h = get(b, 14 * sizeof(int64_t));
  const double *t = get(b, 2 * sizeof(double));
  if (!h || !t)
    return o;
  o.req_id = (uint64_t)h[0];
  o.sample_index = (int)h[1];
  o.n_new_tokens = (int)h[2];
  o.new_text_len = (size_t)h[3];
  o.n_top = (int)h[5];
  o.finish_reason = (di_finish_reason)h[6];
  o.stop_token = (int32_t)h[7];
  o.n_prompt_tokens = (int)h[8];
  o.n_cached_tokens = (int)h[9];
  o.n_output_tokens = (int)h[10];
  o.n_prompt_top = (int)h[12];
  o.time_to_first_token = t[0];
  o.time_per_output_token = t[1];
  o.new_tokens = get_arr(b, h[2], sizeof(int32_t));
  const char *text = get_arr(b, h[3], 1);
  o.new_text = text ? text : "";
  o.new_logprobs = h[4] ? get_arr(b, h[2], sizeof(float)) : NULL;
  o.top = get_arr(b, h[2] * h[5], sizeof(di_token_logprob));
  o.error = get_str(b);
  o.prompt_logprobs = h[11] ? get_arr(b, h[8], sizeof(float)) : NULL;
  o.prompt_top = get_arr(b, h[8] * h[12], sizeof(di_token_logprob));
  o.prompt_ranks = h[13] ? get_arr(b, h[8], sizeof(int32_t)) : NULL;
  return o;
}

/* ---- shared by both sides ---------------------------------------------------------------------- */
typedef struct {
  uint64_t id;       /* rank 0's id */
  uint64_t local_id; /* the worker's engine id (workers) */
  int rank, n_samples, done;
  int32_t *prompt;   /* rank 0: the encoded prompt, what its outputs' prompt_token_ids point to */
  int n_prompt;
} dp_req;

typedef struct {
  dp_req *r;
  int n, cap;
} dp_table;

static dp_req *table_add(dp_table *t) {
  if (t->n == t->cap) {
    int c = t->cap ? 2 * t->cap : 64;
    dp_req *q = realloc(t->r, sizeof *q * (size_t)c);
    if (!q)
      return NULL;
    t->r = q, t->cap = c;
  }
  memset(&t->r[t->n], 0, sizeof t->r[0]);
  return &t->r[t->n++];
}

/* the tokens of a rank's unfinished requests: what placement balances */
static int64_t engine_load(const di_engine *e) {
  int64_t load = 0;
  for (int i = 0; i < e->n_all; i++)
    if (!e->all[i]->reported)
      load += e->all[i]->n_tokens;
  return load;
}

typedef struct {
  int64_t payload_bytes, stop;
} work_header;

typedef struct {
  int64_t out_bytes, load;
  di_engine_stats stats; /* the rank's engine's own (plain numbers: every rank runs the same binary) */
} rank_report;

/* steps 3 of a tick: reports all-gathered, outputs to rank 0 (recv: rank 0's buffer of all of them) */
static di_status gather_outputs(di_comm *c, const wbuf *out, const di_engine *e, rank_report *reports, size_t *sb,
                                size_t *rb, wbuf *recv) {
  rank_report mine;
  memset(&mine, 0, sizeof mine);
  mine.out_bytes = (int64_t)out->n;
  mine.load = engine_load(e);
  di_engine_get_stats_local(e, &mine.stats);
  DI_TRY(di_comm_allgather(c, &mine, sizeof mine, reports));
  size_t total = 0;
  for (int r = 0; r < c->size; r++) { /* workers send theirs to rank 0, which keeps its own */
    sb[r] = c->rank != 0 && r == 0 ? out->n : 0;
    rb[r] = c->rank == 0 && r > 0 ? (size_t)reports[r].out_bytes : 0;
    total += rb[r];
  }
  recv->n = 0;
  put(recv, NULL, total);
  if (recv->oom)
    return di_error_set(DI_ERR_OOM, "data parallel: out of memory for the outputs");
  return di_comm_alltoallv(c, out->p, sb, recv->p, rb);
}

/* ---- the worker --------------------------------------------------------------------------------- */
/* A request this rank could not take (its own failure, out of memory: rank 0 validated it): every
 * sample of it finishes at once with DI_FINISH_ERROR and the reason, the job goes on. */
static void put_failed_request(wbuf *out, uint64_t id, int n_samples, int rank) {
  char why[400];
  snprintf(why, sizeof why, "data parallel: rank %d could not take the request: %s", rank, di_last_error());
  for (int k = 0; k < n_samples; k++) {
    di_seq_output o;
    memset(&o, 0, sizeof o);
    o.sample_index = k;
    o.finish_reason = DI_FINISH_ERROR;
    o.stop_token = -1;
    o.error = why;
    put_i64(out, 1);
    put_output(out, &o, id);
  }
}

static di_status worker_tick(di_comm *c, di_engine *e, di_ep *ep, dp_table *t, const work_header *h, wbuf *payload,
                             wbuf *out, wbuf *recv, rank_report *reports, size_t *sb, size_t *rb) {
  payload->n = 0;
  put(payload, NULL, (size_t)h->payload_bytes);
  if (payload->oom)
    return di_error_set(DI_ERR_OOM, "data parallel: out of memory");
  DI_TRY(di_comm_broadcast(c, payload->p, (size_t)h->payload_bytes, 0));
  rbuf in = {payload->p, payload->n, 0, 0};
  out->n = 0;
  const int64_t n_new = get_i64(&in);
  for (int64_t i = 0; i < n_new && !in.bad; i++) {
    const int rank = (int)get_i64(&in);
    const uint64_t id = (uint64_t)get_i64(&in);
    const char **stops = NULL;
    di_request_params p = get_request(&in, &stops);
    if (rank == c->rank && !in.bad) {
      dp_req *q = table_add(t);
      if (!q) {
        free(stops);
        return di_error_set(DI_ERR_OOM, "data parallel: out of memory");
      }
      q->id = id;
      q->n_samples = p.n > 0 ? p.n : 1;
      di_status st = di_dist_test_fail_add() ? di_error_set(DI_ERR_OOM, "DEEPINFER_DIST_TEST_FAIL: out of memory")
                                             : di_engine_add_request(e, &p, &q->local_id);
      if (st != DI_OK) { /* rank 0 validated it: a failure here is this rank's own (memory) */
        put_failed_request(out, id, q->n_samples, c->rank);
        t->n--;
      }
    }
    free(stops);
  }
  const int64_t n_abort = get_i64(&in);
  for (int64_t i = 0; i < n_abort && !in.bad; i++) {
    const uint64_t id = (uint64_t)get_i64(&in);
    for (int k = 0; k < t->n; k++)
      if (t->r[k].id == id)
        di_engine_abort(e, t->r[k].local_id); /* NOT_FOUND: it finished meanwhile */
  }
  if (in.bad)
    return di_error_set(DI_ERR_INTERNAL, "data parallel: a malformed work message on rank %d", c->rank);
  if (di_engine_has_unfinished(e)) {
    di_step_output *so = NULL;
    DI_TRY(di_engine_step(e, &so));
    for (int s = 0; so && s < so->n; s++) {
      const di_seq_output *o = &so->seqs[s];
      for (int k = 0; k < t->n; k++) {
        if (t->r[k].local_id != o->req_id)
          continue;
        put_i64(out, 1); /* one more output */
        put_output(out, o, t->r[k].id);
        if (o->finish_reason != DI_FINISH_NONE && ++t->r[k].done == t->r[k].n_samples)
          t->r[k--] = t->r[--t->n];
        break;
      }
    }
  }
  put_i64(out, 0); /* the end (and 8 bytes even without outputs) */
  if (out->oom)
    return di_error_set(DI_ERR_OOM, "data parallel: out of memory for the outputs");
  if (ep)
    DI_TRY(di_ep_listen(ep));
  return gather_outputs(c, out, e, reports, sb, rb, recv);
}

__attribute__((noreturn)) static void worker_run(di_comm *c, di_engine *e, di_ep *ep) {
  dp_table t = {0};
  wbuf payload = {0}, out = {0}, recv = {0};
  rank_report *reports = calloc((size_t)c->size, sizeof *reports);
  size_t *sb = calloc((size_t)c->size, sizeof *sb), *rb = calloc((size_t)c->size, sizeof *rb);
  if (!reports || !sb || !rb)
    di_comm_abort(c, "data parallel worker: out of memory");
  for (;;) {
    work_header h;
    if (di_comm_wait_work(c, &h, sizeof h) != DI_OK)
      di_dist_fail();
    if (h.stop)
      break;
    if (worker_tick(c, e, ep, &t, &h, &payload, &out, &recv, reports, sb, rb) != DI_OK)
      di_dist_fail();
  }
  free(t.r), free(payload.p), free(out.p), free(recv.p), free(reports), free(sb), free(rb);
  di_engine_free(e);
  exit(di_dist_cli_finish(0));
}

/* ---- the front end (rank 0) --------------------------------------------------------------------- */
struct di_dp_front {
  di_comm *c;
  di_ep *ep;
  dp_table live;           /* unfinished remote requests */
  dp_table ended;          /* finished ones whose prompt the last output still points to */
  wbuf news;               /* serialized new requests of the next tick */
  int64_t n_news;
  uint64_t *aborts;
  int n_aborts, cap_aborts;
  int64_t *est;            /* load per rank: the last reports + the prompts placed since */
  rank_report *reports;
  size_t *sb, *rb;
  wbuf payload, out, recv;
  di_seq_output *merged;
  int cap_merged;
  di_step_output step;
};

int di_dp_front_place(di_dp_front *f, int n_prompt) {
  int best = 0;
  for (int r = 1; r < f->c->size; r++)
    if (f->est[r] < f->est[best])
      best = r;
  f->est[best] += n_prompt > 0 ? n_prompt : 1;
  return best;
}

di_status di_dp_front_add(di_dp_front *f, int rank, const di_request_params *p, const int32_t *prompt, int n_prompt,
                          uint64_t id, uint64_t seed) {
  dp_req *q = table_add(&f->live);
  int32_t *copy = malloc(sizeof(int32_t) * (size_t)(n_prompt > 0 ? n_prompt : 1));
  if (!q || !copy) {
    if (q)
      f->live.n--;
    free(copy);
    return di_error_set(DI_ERR_OOM, "data parallel: out of memory");
  }
  memcpy(copy, prompt, sizeof(int32_t) * (size_t)n_prompt);
  *q = (dp_req){.id = id, .rank = rank, .n_samples = p->n > 0 ? p->n : 1, .prompt = copy, .n_prompt = n_prompt};
  di_request_params fixed = *p;
  fixed.has_seed = 1;
  fixed.seed = seed;
  put_i64(&f->news, rank);
  put_i64(&f->news, (int64_t)id);
  put_request(&f->news, &fixed, prompt, n_prompt);
  f->n_news++;
  if (f->news.oom)
    return di_error_set(DI_ERR_OOM, "data parallel: out of memory");
  return DI_OK;
}

int di_dp_front_abort(di_dp_front *f, uint64_t id) {
  for (int k = 0; k < f->live.n; k++) {
    if (f->live.r[k].id != id)
      continue;
    if (f->n_aborts == f->cap_aborts) {
      int c = f->cap_aborts ? 2 * f->cap_aborts : 64;
      uint64_t *a = realloc(f->aborts, sizeof *a * (size_t)c);
      if (!a)
        return 1; /* not forwarded: the request runs to its end */
      f->aborts = a, f->cap_aborts = c;
    }
    f->aborts[f->n_aborts++] = id;
    return 1;
  }
  return 0;
}

int di_dp_front_busy(const di_dp_front *f) { return f->live.n > 0 || f->n_news > 0 || f->n_aborts > 0; }

static di_status merge_seq(di_dp_front *f, int *n, const di_seq_output *o) {
  if (*n == f->cap_merged) {
    int c = f->cap_merged ? 2 * f->cap_merged : 64;
    di_seq_output *m = realloc(f->merged, sizeof *m * (size_t)c);
    if (!m)
      return di_error_set(DI_ERR_OOM, "data parallel: out of memory for the outputs");
    f->merged = m, f->cap_merged = c;
  }
  f->merged[(*n)++] = *o;
  return DI_OK;
}

di_status di_dp_front_step(di_dp_front *f, di_engine *e, di_step_output **out) {
  di_comm *c = f->c;
  for (int k = 0; k < f->ended.n; k++)
    free(f->ended.r[k].prompt);
  f->ended.n = 0;
  /* 1: the work of this tick */
  f->payload.n = 0;
  put_i64(&f->payload, f->n_news);
  put(&f->payload, f->news.p, f->news.n);
  put_i64(&f->payload, f->n_aborts);
  put(&f->payload, f->aborts, sizeof(uint64_t) * (size_t)f->n_aborts);
  if (f->payload.oom)
    return di_error_set(DI_ERR_OOM, "data parallel: out of memory");
  f->news.n = 0, f->n_news = 0, f->n_aborts = 0;
  const work_header h = {(int64_t)f->payload.n, 0};
  DI_TRY(di_comm_post_work(c, &h, sizeof h));
  DI_TRY(di_comm_broadcast(c, f->payload.p, f->payload.n, 0));
  /* 2: rank 0's own step, then the listening */
  di_step_output *local = NULL;
  di_status st = DI_OK;
  if (di_engine_has_unfinished_local(e))
    st = di_engine_step_local(e, &local);
  if (st != DI_OK) /* the others are in this tick's collectives: a failed step here ends the job */
    di_dist_fail();
  if (f->ep)
    DI_TRY(di_ep_listen(f->ep));
  /* 3: the others' outputs */
  f->out.n = 0;
  DI_TRY(gather_outputs(c, &f->out, e, f->reports, f->sb, f->rb, &f->recv));
  int n = 0;
  for (int s = 0; local && s < local->n; s++)
    DI_TRY(merge_seq(f, &n, &local->seqs[s]));
  size_t at = 0;
  for (int r = 1; r < c->size; r++) {
    rbuf in = {f->recv.p + at, f->rb[r], 0, 0};
    at += f->rb[r];
    while (get_i64(&in) == 1 && !in.bad) {
      di_seq_output o = get_output(&in);
      if (in.bad)
        return di_error_set(DI_ERR_INTERNAL, "data parallel: malformed outputs from rank %d", r);
      for (int k = 0; k < f->live.n; k++) {
        dp_req *q = &f->live.r[k];
        if (q->id != o.req_id)
          continue;
        o.prompt_token_ids = q->prompt;
        if (o.finish_reason != DI_FINISH_NONE && ++q->done == q->n_samples) {
          dp_req *d = table_add(&f->ended);
          if (!d)
            return di_error_set(DI_ERR_OOM, "data parallel: out of memory");
          *d = *q;
          f->live.r[k] = f->live.r[--f->live.n];
        }
        break;
      }
      DI_TRY(merge_seq(f, &n, &o));
    }
    if (in.bad)
      return di_error_set(DI_ERR_INTERNAL, "data parallel: malformed outputs from rank %d", r);
  }
  for (int r = 0; r < c->size; r++)
    f->est[r] = f->reports[r].load;
  f->step.n = n;
  f->step.seqs = f->merged;
  *out = &f->step;
  return DI_OK;
}

void di_dp_front_add_stats(const di_dp_front *f, di_engine_stats *s) {
  for (int r = 1; r < f->c->size; r++) {
    const di_engine_stats *o = &f->reports[r].stats;
    s->kv_blocks_total += o->kv_blocks_total, s->kv_blocks_used += o->kv_blocks_used;
    s->kv_blocks_free += o->kv_blocks_free, s->kv_blocks_cached += o->kv_blocks_cached;
    s->prefix_cache_hit_tokens += o->prefix_cache_hit_tokens, s->prefix_cache_query_tokens += o->prefix_cache_query_tokens;
    s->n_running += o->n_running, s->n_waiting += o->n_waiting;
    s->steps += o->steps, s->prompt_tokens += o->prompt_tokens, s->generated_tokens += o->generated_tokens;
    s->preemptions += o->preemptions, s->prefix_waits += o->prefix_waits;
    s->prompt_tokens_per_s += o->prompt_tokens_per_s, s->generation_tokens_per_s += o->generation_tokens_per_s;
    s->host_time_s += o->host_time_s, s->hidden_host_time_s += o->hidden_host_time_s;
    s->backend_wait_s += o->backend_wait_s;
  }
  s->prefix_cache_hit_rate = s->prefix_cache_query_tokens > 0
                                 ? (double)s->prefix_cache_hit_tokens / (double)s->prefix_cache_query_tokens
                                 : 0;
}

void di_dp_front_free(di_dp_front *f) {
  if (!f)
    return;
  const work_header h = {0, 1};
  if (di_comm_post_work(f->c, &h, sizeof h) != DI_OK)
    di_dist_fail();
  for (int k = 0; k < f->live.n; k++)
    free(f->live.r[k].prompt);
  for (int k = 0; k < f->ended.n; k++)
    free(f->ended.r[k].prompt);
  free(f->live.r), free(f->ended.r), free(f->news.p), free(f->aborts), free(f->est), free(f->reports);
  free(f->sb), free(f->rb), free(f->payload.p), free(f->out.p), free(f->recv.p), free(f->merged);
  free(f);
  di_dist_cli_finish(0); /* the workers do the same after the stop: every rank tears down together */
}

di_status di_dp_prepare(di_model *m) {
  di_comm *c = di_dist_comm();
  const int want = di_dist_dp_size();
  if (!c || strcmp(c->kind, "mpi") != 0 || c->size != want)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "--data-parallel-size %d: this process is not one of %d MPI ranks (started by `deepinfer ... "
                        "--data-parallel-size N` or `mpirun -np N`)",
                        want, want);
  if (!di_dist_expert_parallel() || di_ep_has_forward(di_dist_ep_current()))
    return DI_OK;
  /* one forward on every rank (before the engine: a score sets up its own KV pool), so the exchange
   * knows the MoE layers a listening rank replays */
  const int32_t warm[1] = {1};
  float *lg = malloc(sizeof(float) * (size_t)di_model_vocab_size(m));
  if (!lg)
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_status st = di_model_score(m, warm, 1, lg);
  free(lg);
  return st;
}

di_status di_dp_attach(di_engine *e) {
  di_comm *c = di_dist_comm();
  di_ep *ep = di_dist_ep_current();
  if (c->rank != 0)
    worker_run(c, e, ep);
  di_dp_front *f = calloc(1, sizeof *f);
  if (!f)
    return di_error_set(DI_ERR_OOM, "out of memory");
  f->c = c, f->ep = ep;
  f->est = calloc((size_t)c->size, sizeof *f->est);
  f->reports = calloc((size_t)c->size, sizeof *f->reports);
  f->sb = calloc((size_t)c->size, sizeof *f->sb);
  f->rb = calloc((size_t)c->size, sizeof *f->rb);
  if (!f->est || !f->reports || !f->sb || !f->rb) {
    free(f->est), free(f->reports), free(f->sb), free(f->rb), free(f);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  e->dp = f;
  return DI_OK;
}
