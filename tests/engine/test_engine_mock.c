/* Engine tests against the mock backend (mock_backend.h): batching, chunked prefill, prefix
 * caching, preemption and async stepping must not change any request's output (each compared
 * with the request generated alone by a plain loop), per-request errors, aborts, stop strings,
 * `n` samples, backend faults, and block accounting (no leak) after every scenario. */
#include "test_util.h"
#include "mock_backend.h"
#include "sampler/rng.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 61
#define NREQ 64
#define MAXP 1000
#define MAXT 24

typedef struct {
  int32_t prompt[MAXP];
  int n_prompt, max_tokens;
  di_sampling sp;
  int has_seed;
  int32_t want[MAXT + 1];
  int n_want, want_finish;
  int32_t got[MAXT + 1];
  int n_got, got_finish;
  uint64_t id;
} case_t;

/* the request alone: plain loop, same sampler, counter = position */
static void reference(case_t *c) {
  di_sampler *s;
  di_sampler_create(VOCAB, &s);
  int32_t toks[MAXP + MAXT + 1];
  memcpy(toks, c->prompt, (size_t)c->n_prompt * sizeof *toks);
  int n = c->n_prompt;
  float lg[VOCAB];
  c->n_want = 0;
  c->want_finish = DI_FINISH_LENGTH;
  while (c->n_want < c->max_tokens) {
    mock_logits_of(toks, n, VOCAB, lg);
    di_sample_result res;
    di_sampler_sample(s, lg, VOCAB, &c->sp, toks, c->n_prompt, n, NULL, (uint64_t)n, &res);
    toks[n++] = res.token;
    c->want[c->n_want++] = res.token;
    if (res.token == MOCK_EOS[0]) { c->want_finish = DI_FINISH_STOP; break; }
  }
  di_sampler_free(s);
}

static uint64_t rng_state = 42;
static int rnd(int n) { return (int)(di_rng_u64(7, 0, rng_state++) % (uint64_t)n); }

static void make_cases(case_t *cs, int n, int sampled) {
  int32_t sys[200];
  for (int i = 0; i < 200; i++) sys[i] = 2 + rnd(VOCAB - 2);
  for (int k = 0; k < n; k++) {
    case_t *c = &cs[k];
    memset(c, 0, sizeof *c);
    /* a few long ones: their block tables grow (realloc) while a step that reads them is in flight */
    c->n_prompt = k % 16 == 0 ? 520 + rnd(MAXP - 520) : 1 + rnd(k % 4 == 0 ? 300 : 90);
    int shared = k % 3 == 0 ? (c->n_prompt < 200 ? c->n_prompt : 200) : 0; /* shared system prompt */
    for (int i = 0; i < c->n_prompt; i++) c->prompt[i] = i < shared ? sys[i] : 2 + rnd(VOCAB - 2);
    c->max_tokens = 1 + rnd(MAXT);
    c->sp = (di_sampling){.temperature = 0, .top_p = 1, .repetition_penalty = 1, .logprobs = -1};
    if (sampled) {
      c->sp.temperature = k % 2 ? 1.0f : 0.7f;
      c->sp.top_p = k % 3 ? 0.9f : 1.0f;
      c->sp.top_k = k % 4 ? 0 : 10;
      c->sp.seed = 1000 + (uint64_t)k;
      c->has_seed = 1;
    }
    reference(c);
  }
}

static void fill_params(di_request_params *p, const case_t *c) {
  di_request_params_default(p);
  p->prompt_ids = c->prompt;
  p->n_prompt_ids = c->n_prompt;
  p->max_tokens = c->max_tokens;
  p->temperature = c->sp.temperature;
  p->top_p = c->sp.top_p;
  p->top_k = c->sp.top_k;
  p->has_seed = c->has_seed;
  p->seed = c->sp.seed;
}

/* runs all cases in one engine, returns the number of mismatching cases */
static int run_engine(case_t *cs, int n, di_engine_options *opt, mock_backend **mb_out, di_engine_stats *st_out,
                      const char *what, int device_sampling) {
  mock_backend *mb = mock_backend_new(VOCAB);
  if (device_sampling == 1) mb->base.ops = &MOCK_OPS_DEV;
  if (device_sampling == 3) mb->base.ops = &MOCK_OPS_FB; /* device sampling with token feedback */
  if (device_sampling == 2) setenv("DEEPINFER_SAMPLER_THREADS", "3", 1); /* host rows over 3 threads */
  di_engine *e;
  di_status st = mock_engine(mb, opt, 0, 4096, &e);
  unsetenv("DEEPINFER_SAMPLER_THREADS");
  if (st == DI_OK && device_sampling == 2) di_row_sampler_set_min_work(e->rows, 0);
  CHECKF(st == DI_OK, "%s: create: %s", what, di_last_error());
  if (st != DI_OK) return n;
  for (int k = 0; k < n; k++) {
    di_request_params p;
    fill_params(&p, &cs[k]);
    cs[k].n_got = 0;
    cs[k].got_finish = 0;
    st = di_engine_add_request(e, &p, &cs[k].id);
    CHECKF(st == DI_OK, "%s: add: %s", what, di_last_error());
  }
  int guard = 0;
  while (di_engine_has_unfinished(e) && guard++ < 100000) {
    di_step_output *out;
    st = di_engine_step(e, &out);
    if (st != DI_OK) { CHECKF(0, "%s: step: %s", what, di_last_error()); break; }
    for (int i = 0; i < out->n; i++) {
      const di_seq_output *o = &out->seqs[i];
      case_t *c = &cs[o->req_id - cs[0].id];
      for (int t = 0; t < o->n_new_tokens && c->n_got <= MAXT; t++) c->got[c->n_got++] = o->new_tokens[t];
      if (o->finish_reason) c->got_finish = o->finish_reason;
    }
    if (guard % 7 == 0) CHECKF(di_engine_check(e) == DI_OK, "%s: %s", what, di_last_error());
  }
  int bad = 0;
  for (int k = 0; k < n; k++) {
    case_t *c = &cs[k];
    int same = c->n_got == c->n_want && c->got_finish == c->want_finish &&
               memcmp(c->got, c->want, (size_t)c->n_want * sizeof *c->got) == 0;
    if (!same) {
      bad++;
      if (bad < 4)
        fprintf(stderr, "%s: case %d (prompt %d, max %d): got %d tokens finish %d, want %d finish %d\n", what, k,
                c->n_prompt, c->max_tokens, c->n_got, c->got_finish, c->n_want, c->want_finish);
    }
  }
  CHECKF(mb->errors == 0, "%s: the mock read %d slots not written for their position", what, mb->errors);
  CHECKF(di_engine_check(e) == DI_OK, "%s: %s", what, di_last_error());
  di_engine_stats s;
  di_engine_get_stats(e, &s);
  CHECKF(s.kv_blocks_used == 0, "%s: %lld blocks still used", what, (long long)s.kv_blocks_used);
  if (st_out) *st_out = s;
  di_engine_free(e);
  if (mb_out) *mb_out = mb;
  else mock_destroy(&mb->base);
  return bad;
}

static void test_equivalence(int sampled) {
  static case_t cs[NREQ];
  make_cases(cs, NREQ, sampled);
  const char *names[] = {"default", "no prefix cache", "no chunked prefill", "sync", "tiny budget", "one by one",
                         "device sampling", "threaded host sampling", "device token feedback",
                         "token feedback, tiny budget"};
  for (int v = 0; v < 10; v++) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.max_num_batched_tokens = 256;
    o.seed = 5;
    if (v == 1) o.enable_prefix_caching = 0;
    if (v == 2) { o.enable_chunked_prefill = 0; o.max_num_batched_tokens = 1024; }
    if (v == 3) o.async_scheduling = 0;
    if (v == 4 || v == 9) { o.num_kv_blocks = 18; o.max_num_batched_tokens = 100; }
    if (v == 5) o.max_num_seqs = 1;
    di_engine_stats st;
    memset(&st, 0, sizeof st);
    char what[64];
    snprintf(what, sizeof what, "%s/%s", sampled ? "sampled" : "greedy", names[v]);
    mock_backend *mb = NULL;
    int bad = run_engine(cs, NREQ, &o, &mb, &st, what, v == 6 ? 1 : v == 7 ? 2 : v >= 8 ? 3 : 0);
    if (v == 6) CHECKF(mb->device_samples > 0, "%s: no row was sampled on the device", what);
    if (v >= 8) CHECKF(mb->fb_resolved > 0, "%s: no step was queued with its tokens left on the device", what);
    if (v == 6 || v >= 8) { /* the rows planned at submit (di_batch.sample_rows) are the ones sampled */
      CHECKF(mb->rows_planned > 0, "%s: no step carried its sample rows", what);
      CHECKF(mb->rows_mismatched == 0, "%s: %lld of %lld rows planned at submit differ from those sampled", what,
             (long long)mb->rows_mismatched, (long long)mb->rows_planned);
    }
    mock_destroy(&mb->base);
    CHECKF(bad == 0, "%s: %d of %d requests differ from the request alone", what, bad, NREQ);
    if (v == 0) CHECKF(st.prefix_cache_hit_tokens > 0, "%s: no prefix-cache hits on shared prompts", what);
    if (v == 1) CHECK(st.prefix_cache_hit_tokens == 0);
    if (v == 4 || v == 9) CHECKF(st.preemptions > 0, "%s: expected preemptions with 18 blocks, got none", what);
  }
}

/* Requests that share a 300-token prompt prefix and arrive together: the first computes it, the others
 * wait for its blocks (prefix_in_flight in the scheduler) and take them from the prefix cache, so the
 * shared part is computed once; outputs stay those of each request alone. Without prefix caching
 * nothing waits. */
static void test_prefix_in_flight(void) {
  static case_t cs[8];
  int32_t sys[300];
  for (int i = 0; i < 300; i++) sys[i] = 2 + rnd(VOCAB - 2);
  for (int k = 0; k < 8; k++) {
    case_t *c = &cs[k];
    memset(c, 0, sizeof *c);
    c->n_prompt = 320;
    for (int i = 0; i < c->n_prompt; i++) c->prompt[i] = i < 300 ? sys[i] : 2 + rnd(VOCAB - 2);
    c->max_tokens = 4;
    c->sp = (di_sampling){.temperature = 0, .top_p = 1, .repetition_penalty = 1, .logprobs = -1};
    reference(c);
  }
  for (int v = 0; v < 3; v++) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.max_num_batched_tokens = 4096; /* room for all eight prompts in one step */
    o.seed = 5;
    if (v == 1) o.async_scheduling = 0;
    if (v == 2) o.enable_prefix_caching = 0;
    di_engine_stats st;
    memset(&st, 0, sizeof st);
    const char *what = v == 0 ? "prefix in flight" : v == 1 ? "prefix in flight, sync" : "prefix in flight, no cache";
    int bad = run_engine(cs, 8, &o, NULL, &st, what, 0);
    CHECKF(bad == 0, "%s: %d of 8 requests differ from the request alone", what, bad);
    if (v < 2) {
      CHECKF(st.prefix_waits > 0, "%s: no request waited for the shared blocks", what);
      CHECKF(st.prefix_cache_hit_tokens >= 7 * 256, "%s: %lld prefix-cache hit tokens, want >= %d (4 blocks x 7)",
             what, (long long)st.prefix_cache_hit_tokens, 7 * 256);
    } else {
      CHECKF(st.prefix_waits == 0 && st.prefix_cache_hit_tokens == 0, "%s: %lld waits, %lld hits", what,
             (long long)st.prefix_waits, (long long)st.prefix_cache_hit_tokens);
    }
    printf("%-28s waits %lld, prefix hits %lld tokens, steps %lld\n", what, (long long)st.prefix_waits,
           (long long)st.prefix_cache_hit_tokens, (long long)st.steps);
  }
}

typedef struct {
  char text[256];
  size_t len;
  int32_t toks[64];
  int n_tok, finish, n_out;
} acc_t;

static void drain(di_engine *e, acc_t *acc, uint64_t base, int n) {
  int guard = 0;
  while (di_engine_has_unfinished(e) && guard++ < 10000) {
    di_step_output *out;
    if (di_engine_step(e, &out) != DI_OK) break;
    for (int i = 0; i < out->n; i++) {
      const di_seq_output *o = &out->seqs[i];
      int k = (int)(o->req_id - base);
      if (k < 0 || k >= n) continue;
      acc_t *a = &acc[k * 4 + o->sample_index];
      CHECK(o->new_text_len == strlen(o->new_text));
      if (a->len + o->new_text_len < sizeof a->text) { memcpy(a->text + a->len, o->new_text, o->new_text_len); a->len += o->new_text_len; }
      for (int t = 0; t < o->n_new_tokens && a->n_tok < 64; t++) a->toks[a->n_tok++] = o->new_tokens[t];
      if (o->finish_reason) { a->finish = o->finish_reason; a->n_out = o->n_output_tokens; }
    }
  }
}

static void test_stop_strings_and_text(void) {
  mock_backend *mb = mock_backend_new(VOCAB);
  di_engine *e;
  di_engine_options o;
  di_engine_options_default(&o);
  CHECK(mock_engine(mb, &o, 1, 4096, &e) == DI_OK);
  /* generate once without stops to learn the text, then stop on a 3-letter piece of it */
  di_request_params p;
  di_request_params_default(&p);
  p.prompt = "hello world";
  p.temperature = 0;
  p.max_tokens = 20;
  p.ignore_eos = 1;
  uint64_t id;
  CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  acc_t acc[8];
  memset(acc, 0, sizeof acc);
  drain(e, acc, id, 1);
  CHECK(acc[0].finish == DI_FINISH_LENGTH && acc[0].n_tok == 20);
  acc[0].text[acc[0].len] = 0;
  char full[256];
  strcpy(full, acc[0].text);
  CHECKF(strlen(full) >= 10, "text \"%s\"", full);
  /* stop string spanning tokens 5..7 (one letter per token here) */
  char stop[4] = {full[5], full[6], full[7], 0};
  const char *stops[2] = {stop, "zzzzzzzzzz"};
  p.stop = stops;
  p.n_stop = 2;
  CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  memset(acc, 0, sizeof acc);
  drain(e, acc, id, 1);
  acc[0].text[acc[0].len] = 0;
  const char *first = strstr(full, stop);
  CHECKF(acc[0].finish == DI_FINISH_STOP, "finish %d", acc[0].finish);
  CHECKF(first && acc[0].len == (size_t)(first - full) && strncmp(acc[0].text, full, acc[0].len) == 0,
         "stopped text \"%s\" (full \"%s\", stop \"%s\")", acc[0].text, full, stop);
  /* include_stop_str_in_output */
  p.include_stop_str_in_output = 1;
  CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  memset(acc, 0, sizeof acc);
  drain(e, acc, id, 1);
  CHECK(first && acc[0].len == (size_t)(first - full) + 3);
  /* no tokenizer: stop strings and text prompts are refused */
  CHECK(di_engine_check(e) == DI_OK);
  di_engine_free(e);
  mock_destroy(&mb->base);

  mb = mock_backend_new(VOCAB);
  CHECK(mock_engine(mb, &o, 0, 4096, &e) == DI_OK);
  CHECK_ERR(di_engine_add_request(e, &p, &id), "stop strings need a tokenizer");
  p.n_stop = 0;
  CHECK_ERR(di_engine_add_request(e, &p, &id), "text prompt needs a tokenizer");
  p.regex = "[a-z]+";
  p.prompt = NULL;
  int32_t ids[3] = {5, 6, 7};
  p.prompt_ids = ids;
  p.n_prompt_ids = 3;
  CHECK_ERR(di_engine_add_request(e, &p, &id), "structured outputs need");
  di_engine_free(e);
  mock_destroy(&mb->base);
}

static void test_errors_aborts_samples(void) {
  mock_backend *mb = mock_backend_new(VOCAB);
  di_engine *e;
  di_engine_options o;
  di_engine_options_default(&o);
  o.num_kv_blocks = 64;
  CHECK(mock_engine(mb, &o, 0, 256, &e) == DI_OK);
  di_request_params p;
  di_request_params_default(&p);
  int32_t ids[300];
  for (int i = 0; i < 300; i++) ids[i] = 2 + i % 50;
  p.prompt_ids = ids;
  uint64_t id;
  /* invalid parameters: refused at once */
  p.n_prompt_ids = 3;
  p.top_p = 0;
  CHECK_ERR(di_engine_add_request(e, &p, &id), "top_p");
  p.top_p = 1;
  ids[1] = VOCAB + 5;
  CHECK_ERR(di_engine_add_request(e, &p, &id), "outside the vocabulary");
  ids[1] = 3;
  /* a prompt longer than the context: its own error; the others carry on */
  p.n_prompt_ids = 300;
  uint64_t too_long;
  CHECK(di_engine_add_request(e, &p, &too_long) == DI_OK);
  p.n_prompt_ids = 10;
  p.max_tokens = 8;
  p.temperature = 1;
  p.n = 3;
  p.has_seed = 1;
  p.seed = 9;
  p.logprobs = 2;
  uint64_t multi, aborted;
  CHECK(di_engine_add_request(e, &p, &multi) == DI_OK);
  p.n = 1;
  p.max_tokens = 200;
  p.ignore_eos = 1;
  CHECK(di_engine_add_request(e, &p, &aborted) == DI_OK);
  int fin_err = 0, fin_abort = 0, n_multi_done = 0, steps = 0, lp_ok = 1;
  int32_t samples[3][8];
  int n_s[3] = {0, 0, 0};
  while (di_engine_has_unfinished(e) && steps < 1000) {
    di_step_output *out;
    CHECK(di_engine_step(e, &out) == DI_OK);
    if (++steps == 3) CHECK(di_engine_abort(e, aborted) == DI_OK);
    for (int i = 0; i < out->n; i++) {
      const di_seq_output *so = &out->seqs[i];
      if (so->req_id == too_long && so->finish_reason == DI_FINISH_ERROR) {
        fin_err++;
        CHECKF(strstr(so->error, "max_model_len") != NULL, "error \"%s\"", so->error);
      }
      if (so->req_id == aborted && so->finish_reason == DI_FINISH_ABORT) fin_abort++;
      if (so->req_id == multi) {
        for (int t = 0; t < so->n_new_tokens; t++) {
          if (n_s[so->sample_index] < 8) samples[so->sample_index][n_s[so->sample_index]++] = so->new_tokens[t];
          if (!so->new_logprobs || so->n_top != 2 || !(so->new_logprobs[t] <= 0) ||
              so->top[t * 2].logprob < so->top[t * 2 + 1].logprob || so->top[t * 2].logprob < so->new_logprobs[t])
            lp_ok = 0;
        }
        if (so->finish_reason) n_multi_done++;
      }
    }
  }
  CHECK(fin_err == 1);
  CHECK(fin_abort == 1);
  CHECK(n_multi_done == 3);
  CHECK(lp_ok);
  CHECK(di_engine_abort(e, aborted) != DI_OK);
  CHECKF(n_s[0] > 0 && (memcmp(samples[0], samples[1], sizeof samples[0]) != 0 || n_s[0] != n_s[1]),
         "the samples of one request should differ");
  di_engine_stats s;
  di_engine_get_stats(e, &s);
  CHECK(s.kv_blocks_used == 0);
  CHECK(di_engine_check(e) == DI_OK);
  di_engine_free(e);
  mock_destroy(&mb->base);
}

static void test_backend_fault(void) {
  mock_backend *mb = mock_backend_new(VOCAB);
  mb->fail_at_step = 4;
  di_engine *e;
  di_engine_options o;
  di_engine_options_default(&o);
  CHECK(mock_engine(mb, &o, 0, 4096, &e) == DI_OK);
  di_request_params p;
  di_request_params_default(&p);
  int32_t ids[5] = {3, 4, 5, 6, 7};
  p.prompt_ids = ids;
  p.n_prompt_ids = 5;
  p.max_tokens = 10;
  p.ignore_eos = 1;
  uint64_t id;
  for (int k = 0; k < 4; k++) CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  int failed = 0, errors = 0, guard = 0;
  while (di_engine_has_unfinished(e) && guard++ < 100) {
    di_step_output *out;
    di_status st = di_engine_step(e, &out);
    if (st != DI_OK) {
      failed++;
      CHECK(strstr(di_last_error(), "mock device fault") != NULL);
      continue;
    }
    for (int i = 0; i < out->n; i++) errors += out->seqs[i].finish_reason == DI_FINISH_ERROR;
  }
  CHECK(failed == 1);
  CHECKF(errors == 4, "errors %d", errors);
  CHECK(di_engine_check(e) == DI_OK);
  di_engine_free(e);
  mock_destroy(&mb->base);
}

/* 2,000 random requests, random aborts and stop strings, tiny pool: no leaked block at the end */
static void test_soak(void) {
  mock_backend *mb = mock_backend_new(VOCAB);
  di_engine *e;
  di_engine_options o;
  di_engine_options_default(&o);
  o.num_kv_blocks = 12;
  o.max_num_seqs = 48;
  o.max_num_batched_tokens = 300;
  o.seed = 3;
  CHECK(mock_engine(mb, &o, 1, 1024, &e) == DI_OK);
  int added = 0, finished = 0, guard = 0, reasons[5] = {0};
  uint64_t live[4096];
  int n_live = 0;
  int32_t ids[400];
  while ((added < 2000 || di_engine_has_unfinished(e)) && guard++ < 200000) {
    for (int k = rnd(10); k > 0 && added < 2000; k--) {
      di_request_params p;
      di_request_params_default(&p);
      int n = rnd(3) == 0 ? 57 + rnd(7) : 1 + rnd(k == 1 ? 400 : 100); /* some cross a block boundary while decoding */
      for (int i = 0; i < n; i++) ids[i] = 2 + (i < 64 && rnd(2) ? i : rnd(VOCAB - 2));
      p.prompt_ids = ids;
      p.n_prompt_ids = n;
      p.max_tokens = 1 + rnd(8);
      p.temperature = rnd(2) ? 0.8f : 0;
      p.n = 1 + (rnd(10) == 0);
      const char *stops[1] = {rnd(2) ? "ab" : "q"};
      if (rnd(3) == 0) { p.stop = stops; p.n_stop = 1; }
      uint64_t id;
      if (di_engine_add_request(e, &p, &id) == DI_OK) { added++; live[n_live++ % 4096] = id; }
    }
    if (n_live > 3 && rnd(4) == 0) di_engine_abort(e, live[(n_live - 1 - rnd(3)) % 4096]); /* often still running */
    di_step_output *out;
    if (di_engine_step(e, &out) != DI_OK) { CHECKF(0, "soak step: %s", di_last_error()); break; }
    for (int i = 0; i < out->n; i++) {
      finished += out->seqs[i].finish_reason != DI_FINISH_NONE;
      reasons[out->seqs[i].finish_reason]++;
      if (out->seqs[i].finish_reason == DI_FINISH_ERROR && reasons[4] < 3) fprintf(stderr, "soak error: %s\n", out->seqs[i].error);
    }
    if (guard % 97 == 0 && di_engine_check(e) != DI_OK) { CHECKF(0, "soak: %s", di_last_error()); break; }
  }
  CHECKF(added == 2000 && finished >= 2000, "added %d finished %d", added, finished);
  di_engine_stats s;
  di_engine_get_stats(e, &s);
  CHECKF(s.kv_blocks_used == 0, "%lld blocks in use after the soak", (long long)s.kv_blocks_used);
  CHECK(di_engine_check(e) == DI_OK);
  CHECK(mb->errors == 0);
  CHECKF(s.preemptions > 0, "soak: %lld steps, %lld preemptions, %lld cache hits", (long long)s.steps,
         (long long)s.preemptions, (long long)s.prefix_cache_hit_tokens);
  fprintf(stderr, "soak: finish stop %d length %d abort %d error %d\n", reasons[1], reasons[2], reasons[3], reasons[4]);
  di_engine_free(e);
  mock_destroy(&mb->base);
}

int main(void) {
  test_equivalence(0);
  test_equivalence(1);
  test_prefix_in_flight();
  test_stop_strings_and_text();
  test_errors_aborts_samples();
  test_backend_fault();
  test_soak();
  return test_finish("test_engine_mock");
}
