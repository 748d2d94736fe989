/* Prompt logprobs (di_request_params.prompt_logprobs): on the mock backend, every prompt row's
 * logprob and top k equal a double log-softmax of the row's logits computed alone, with chunked
 * prefill under a small row cap, other requests in the same steps (whose outputs stay the greedy
 * reference), a prefix cache that already holds the prompt, preemption, device sampling, n > 1 and
 * max_tokens 0 (score only), and prompt_logprobs_from (positions before it unreported; the prompt up to
 * it served from the prefix cache: the multiple-choice pattern); on the dsv3-tiny fixture, they equal a double log-softmax of
 * di_model_score's logits (rel 1e-5) alone and batched. Block accounting is checked throughout. */
#include "test_util.h"
#include "mock_backend.h"
#include "sampler/rng.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 61
#define MAXP 300

typedef struct {
  int32_t prompt[MAXP];
  int n_prompt, max_tokens, k;   /* k < 0: no prompt logprobs */
  int from;                      /* prompt_logprobs_from */
  int n;                         /* samples */
  uint64_t id;
  /* got */
  int n_plp_outputs;             /* outputs carrying prompt logprobs */
  float plp[MAXP];
  int32_t rank[MAXP];
  di_token_logprob top[MAXP][DI_MAX_LOGPROBS];
  int32_t toks[64];
  int n_toks, finish, n_cached;
} case_t;

static uint64_t rs = 5;
static int rnd(int n) { return (int)(di_rng_u64(3, 0, rs++) % (uint64_t)n); }

/* log-softmax in double over `lg` [V]: lp of `target`, top k (larger first, ties: lower id) */
static double ref_row(const float *lg, int V, int32_t target, int k, int32_t *top_ids, double *top_lp) {
  double mx = -INFINITY, z = 0;
  for (int i = 0; i < V; i++) if (lg[i] > mx) mx = lg[i];
  for (int i = 0; i < V; i++) z += exp((double)lg[i] - mx);
  double lse = mx + log(z);
  for (int j = 0; j < k; j++) { /* the best after top_ids[j - 1] in (logit desc, id asc) order */
    int b = -1;
    for (int i = 0; i < V; i++) {
      if (j > 0 && (lg[i] > lg[top_ids[j - 1]] || (lg[i] == lg[top_ids[j - 1]] && i <= top_ids[j - 1]))) continue;
      if (b < 0 || lg[i] > lg[b]) b = i;
    }
    top_ids[j] = b;
    top_lp[j] = (double)lg[b] - lse;
  }
  return (double)lg[target] - lse;
}

static int close_rel(double got, double want, double rel) { return fabs(got - want) <= rel * fmax(1.0, fabs(want)); }

/* compares a case's delivered prompt logprobs with rows from `logits_of(pos)` */
static void check_case(const case_t *c, const float *rows, int V, const char *what) {
  if (c->k < 0) {
    CHECKF(c->n_plp_outputs == 0, "%s: prompt logprobs without asking", what);
    return;
  }
  CHECKF(c->n_plp_outputs == 1, "%s: prompt logprobs delivered %d times", what, c->n_plp_outputs);
  if (c->n_plp_outputs != 1) return;
  int bad = 0;
  for (int p = 0; p < c->n_prompt && p < (c->from > 1 ? c->from : 1) && bad < 3; p++)
    if (!isnan(c->plp[p]) || c->rank[p] != 0) {
      CHECKF(0, "%s: entry %d (before the first reported) is %g (rank %d), want NaN (0)", what, p, (double)c->plp[p],
             c->rank[p]);
      bad++;
    }
  for (int p = c->from > 1 ? c->from : 1; p < c->n_prompt && bad < 3; p++) {
    int32_t ids[DI_MAX_LOGPROBS];
    double lps[DI_MAX_LOGPROBS];
    double want = ref_row(rows + (size_t)(p - 1) * (size_t)V, V, c->prompt[p], c->k, ids, lps);
    const float *row = rows + (size_t)(p - 1) * (size_t)V;
    int32_t above = 0;
    for (int i = 0; i < V; i++) above += row[i] > row[c->prompt[p]];
    if (c->rank[p] != above + 1) {
      CHECKF(0, "%s: position %d: rank %d, want %d", what, p, c->rank[p], above + 1);
      bad++;
    }
    if (!close_rel(c->plp[p], want, 1e-5)) {
      CHECKF(0, "%s: position %d: logprob %.8g, want %.8g", what, p, (double)c->plp[p], want);
      bad++;
    }
    for (int j = 0; j < c->k; j++) {
      const di_token_logprob *t = &c->top[p][j];
      if (t->id != ids[j] || !close_rel(t->logprob, lps[j], 1e-5)) {
        CHECKF(0, "%s: position %d top %d: (%d, %.8g), want (%d, %.8g)", what, p, j, t->id, (double)t->logprob, ids[j],
               lps[j]);
        bad++;
        break;
      }
      if (j > 0) CHECKF(t->logprob <= c->top[p][j - 1].logprob, "%s: top not sorted at %d", what, p);
    }
    /* consistency: a token in the top list has the same logprob */
    for (int j = 0; j < c->k; j++)
      if (c->top[p][j].id == c->prompt[p]) CHECKF(c->top[p][j].logprob == c->plp[p], "%s: top vs chosen at %d", what, p);
  }
}

static void take_output(case_t *cs, int n_cases, const di_seq_output *o) {
  case_t *c = NULL;
  for (int i = 0; i < n_cases; i++)
    if (cs[i].id == o->req_id) c = &cs[i];
  if (!c) return;
  if (o->prompt_logprobs) {
    c->n_plp_outputs++;
    CHECK(o->sample_index == 0);
    CHECK(o->n_prompt_top == c->k);
    CHECK((o->prompt_top != NULL) == (c->k > 0));
    for (int p = 0; p < o->n_prompt_tokens && p < MAXP; p++) {
      c->plp[p] = o->prompt_logprobs[p];
      c->rank[p] = o->prompt_ranks ? o->prompt_ranks[p] : -1;
      for (int j = 0; j < o->n_prompt_top; j++) c->top[p][j] = o->prompt_top[(size_t)p * (size_t)o->n_prompt_top + j];
    }
  }
  if (o->sample_index != 0) return;
  for (int t = 0; t < o->n_new_tokens && c->n_toks < 64; t++) c->toks[c->n_toks++] = o->new_tokens[t];
  if (o->finish_reason) {
    c->finish = o->finish_reason;
    c->n_cached = o->n_cached_tokens;
  }
}

static void run(di_engine *e, case_t *cs, int n, const char *what) {
  for (int k = 0; k < n; k++) {
    di_request_params p;
    di_request_params_default(&p);
    p.prompt_ids = cs[k].prompt;
    p.n_prompt_ids = cs[k].n_prompt;
    p.max_tokens = cs[k].max_tokens;
    p.temperature = 0;
    p.ignore_eos = 1;
    p.prompt_logprobs = cs[k].k;
    p.prompt_logprobs_from = cs[k].from;
    p.n = cs[k].n > 0 ? cs[k].n : 1;
    cs[k].n_plp_outputs = cs[k].n_toks = cs[k].finish = 0;
    di_status st = di_engine_add_request(e, &p, &cs[k].id);
    CHECKF(st == DI_OK, "%s: add: %s", what, di_last_error());
  }
  int guard = 0;
  while (di_engine_has_unfinished(e) && guard++ < 100000) {
    di_step_output *out;
    di_status st = di_engine_step(e, &out);
    if (st != DI_OK) { CHECKF(0, "%s: step: %s", what, di_last_error()); break; }
    for (int i = 0; i < out->n; i++) take_output(cs, n, &out->seqs[i]);
    if (guard % 5 == 0) CHECKF(di_engine_check(e) == DI_OK, "%s: %s", what, di_last_error());
  }
  CHECKF(di_engine_check(e) == DI_OK, "%s: %s", what, di_last_error());
}

/* mock: expected rows of a case and its greedy tokens */
static void mock_check(const case_t *c, const char *what) {
  float *rows = malloc((size_t)(c->n_prompt + 64) * VOCAB * sizeof *rows);
  int32_t toks[MAXP + 64];
  memcpy(toks, c->prompt, (size_t)c->n_prompt * sizeof *toks);
  for (int p = 0; p < c->n_prompt; p++) mock_logits_of(toks, p + 1, VOCAB, rows + (size_t)p * VOCAB);
  check_case(c, rows, VOCAB, what);
  /* greedy continuation */
  int n = c->n_prompt;
  for (int t = 0; t < c->max_tokens; t++) {
    float lg[VOCAB];
    mock_logits_of(toks, n, VOCAB, lg);
    int b = 0;
    for (int i = 1; i < VOCAB; i++) if (lg[i] > lg[b]) b = i;
    toks[n++] = b;
  }
  CHECKF(c->n_toks == c->max_tokens, "%s: %d tokens, want %d", what, c->n_toks, c->max_tokens);
  for (int t = 0; t < c->n_toks && t < c->max_tokens; t++)
    if (c->toks[t] != toks[c->n_prompt + t]) { CHECKF(0, "%s: token %d differs", what, t); break; }
  CHECKF(c->finish == DI_FINISH_LENGTH, "%s: finish %d", what, c->finish);
  free(rows);
}

static void make_cases(case_t *cs, int n) {
  for (int i = 0; i < n; i++) {
    case_t *c = &cs[i];
    memset(c, 0, sizeof *c);
    c->n_prompt = i == 0 ? 1 : i % 4 == 1 ? 150 + rnd(90) : 2 + rnd(60);
    for (int p = 0; p < c->n_prompt; p++) c->prompt[p] = 2 + rnd(VOCAB - 2);
    c->k = i % 3 == 2 ? -1 : i % 5; /* 0..4 alternatives, or none */
    c->max_tokens = i % 4 == 3 && c->k >= 0 ? 0 : 1 + rnd(6);
  }
}

static void test_mock(int async, int device, int prefix, int64_t kv_blocks, int row_cap, const char *what) {
  enum { N = 14 };
  static case_t cs[N];
  make_cases(cs, N);
  di_engine_options o;
  di_engine_options_default(&o);
  o.max_num_batched_tokens = 48;
  o.async_scheduling = async;
  o.enable_prefix_caching = prefix;
  o.num_kv_blocks = kv_blocks;
  mock_backend *mb = mock_backend_new(VOCAB);
  if (device) mb->base.ops = &MOCK_OPS_DEV;
  di_engine *e;
  if (mock_engine(mb, &o, 0, 4096, &e) != DI_OK) { CHECKF(0, "%s: %s", what, di_last_error()); return; }
  if (row_cap > 0) {
    CHECK(di_plp_reserve(e) == DI_OK);
    e->plp_row_cap = row_cap; /* fewer rows than the buffer holds: chunks shrink to fit */
  }
  run(e, cs, N, what);
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  if (kv_blocks > 0 && kv_blocks < 8) CHECKF(st.preemptions > 0, "%s: no preemption", what);
  for (int i = 0; i < N; i++) {
    char w[128];
    snprintf(w, sizeof w, "%s case %d (prompt %d, k %d, max_tokens %d)", what, i, cs[i].n_prompt, cs[i].k, cs[i].max_tokens);
    mock_check(&cs[i], w);
  }
  CHECKF(mb->errors == 0, "%s: %d bad KV reads", what, mb->errors);
  di_engine_free(e);
  mb->base.ops->destroy(&mb->base);
}

/* a prompt whose prefix is cached already still gets every row; its samples share the blocks */
static void test_mock_cached(void) {
  static case_t cs[2];
  memset(cs, 0, sizeof cs);
  cs[0].n_prompt = cs[1].n_prompt = 200;
  for (int p = 0; p < 200; p++) cs[0].prompt[p] = cs[1].prompt[p] = 2 + rnd(VOCAB - 2);
  cs[1].prompt[199] = 3;
  cs[0].k = -1;
  cs[0].max_tokens = 2;
  cs[1].k = 2;
  cs[1].max_tokens = 3;
  cs[1].n = 3;
  di_engine_options o;
  di_engine_options_default(&o);
  o.max_num_batched_tokens = 64;
  mock_backend *mb = mock_backend_new(VOCAB);
  di_engine *e;
  if (mock_engine(mb, &o, 0, 4096, &e) != DI_OK) { CHECKF(0, "cached: %s", di_last_error()); return; }
  run(e, &cs[0], 1, "cached: warm");
  run(e, &cs[1], 1, "cached: plp");
  mock_check(&cs[0], "cached: warm");
  mock_check(&cs[1], "cached: plp");
  CHECKF(cs[1].n_cached == 0, "cached: the prompt-logprob request took %d cached tokens", cs[1].n_cached);
  /* validation */
  di_request_params p;
  di_request_params_default(&p);
  p.prompt_ids = cs[0].prompt;
  p.n_prompt_ids = 4;
  p.prompt_logprobs = DI_MAX_LOGPROBS + 1;
  uint64_t id;
  CHECK_ERR(di_engine_add_request(e, &p, &id), "prompt_logprobs must be at most");
  /* max_tokens 0 without prompt logprobs still means "up to the context" */
  p.prompt_logprobs = -1;
  p.max_tokens = 0;
  CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  CHECK(di_engine_abort(e, id) == DI_OK);
  for (int g = 0; di_engine_has_unfinished(e) && g < 100; g++) {
    di_step_output *out;
    CHECK(di_engine_step(e, &out) == DI_OK);
  }
  CHECK(di_engine_check(e) == DI_OK);
  di_engine_free(e);
  mb->base.ops->destroy(&mb->base);
}

/* prompt_logprobs_from: continuations of one 200-token context scored after each other; every one
 * after the first takes the context's full blocks from the prefix cache, and only its own positions are
 * reported */
static void test_mock_from(int async) {
  enum { N = 4, CTX = 200 };
  static case_t cs[N];
  memset(cs, 0, sizeof cs);
  for (int p = 0; p < CTX; p++) cs[0].prompt[p] = 2 + rnd(VOCAB - 2);
  for (int i = 0; i < N; i++) {
    memcpy(cs[i].prompt, cs[0].prompt, CTX * sizeof(int32_t));
    cs[i].n_prompt = CTX + 1 + i * 3;
    for (int p = CTX; p < cs[i].n_prompt; p++) cs[i].prompt[p] = 2 + rnd(VOCAB - 2);
    cs[i].k = i % 2; /* 0 or 1 alternatives */
    cs[i].from = CTX;
    cs[i].max_tokens = 0; /* score only */
  }
  cs[3].max_tokens = 2; /* and one that generates after scoring */
  di_engine_options o;
  di_engine_options_default(&o);
  o.max_num_batched_tokens = 64;
  o.async_scheduling = async;
  mock_backend *mb = mock_backend_new(VOCAB);
  di_engine *e;
  if (mock_engine(mb, &o, 0, 4096, &e) != DI_OK) { CHECKF(0, "from: %s", di_last_error()); return; }
  for (int i = 0; i < N; i++) run(e, &cs[i], 1, "from");
  for (int i = 0; i < N; i++) {
    char w[64];
    snprintf(w, sizeof w, "from (async %d) continuation %d", async, i);
    mock_check(&cs[i], w);
    /* the first computes the context; the others find its 3 full blocks (192 tokens) cached */
    CHECKF(cs[i].n_cached == (i == 0 ? 0 : 192), "%s: %d cached tokens", w, cs[i].n_cached);
  }
  CHECKF(mb->errors == 0, "from: %d bad KV reads", mb->errors);
  /* bounds: [0, prompt length], else refused when added (also with n > 1: no sample is queued) */
  di_request_params p;
  di_request_params_default(&p);
  p.prompt_ids = cs[0].prompt;
  p.n_prompt_ids = 5;
  p.prompt_logprobs = 0;
  p.prompt_logprobs_from = -1;
  uint64_t id;
  CHECK_ERR(di_engine_add_request(e, &p, &id), "prompt_logprobs_from must be >= 0");
  p.prompt_logprobs_from = 6;
  p.n = 2;
  CHECK_ERR(di_engine_add_request(e, &p, &id), "prompt_logprobs_from is 6 but the prompt has 5 tokens");
  CHECK(!di_engine_has_unfinished(e));
  p.prompt_logprobs_from = 5; /* nothing to report: delivered all NaN */
  p.max_tokens = 0;
  CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  int got = 0;
  for (int g = 0; di_engine_has_unfinished(e) && g < 100; g++) {
    di_step_output *out;
    CHECK(di_engine_step(e, &out) == DI_OK);
    for (int i = 0; i < out->n; i++)
      if (out->seqs[i].req_id == id && out->seqs[i].prompt_logprobs) {
        got++;
        for (int j = 0; j < 5; j++) CHECK(isnan(out->seqs[i].prompt_logprobs[j]) && out->seqs[i].prompt_ranks[j] == 0);
      }
  }
  CHECKF(got == 1, "from: a request with nothing to report delivered its arrays %d times", got);
  CHECK(di_engine_check(e) == DI_OK);
  di_engine_free(e);
  mb->base.ops->destroy(&mb->base);
}

/* a failure only sample 0 can have (its prompt logprobs do not fit a step with chunked prefill off)
 * ends sample 0 at once; sample 1 runs on its own. Found by the engine fuzzer: sample 1 was queued after
 * sample 0 had failed, so it kept a pointer to the leader, which is freed once reported; sample 1 read
 * it at every admission attempt while it waited (ASan: use after free). Here it waits: one sequence at
 * a time, and another request runs first. */
static void test_mock_leader_error(void) {
  di_engine_options o;
  di_engine_options_default(&o);
  o.enable_chunked_prefill = 0;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 1;
  mock_backend *mb = mock_backend_new(VOCAB);
  di_engine *e;
  if (mock_engine(mb, &o, 0, 4096, &e) != DI_OK) { CHECKF(0, "leader error: %s", di_last_error()); return; }
  CHECK(di_plp_reserve(e) == DI_OK);
  e->plp_row_cap = 8;
  int32_t prompt[40];
  for (int i = 0; i < 40; i++) prompt[i] = 2 + rnd(VOCAB - 2);
  di_request_params p;
  di_request_params_default(&p);
  p.prompt_ids = prompt;
  p.n_prompt_ids = 10;
  p.max_tokens = 6;
  p.temperature = 0;
  p.ignore_eos = 1;
  uint64_t first, id;
  CHECK(di_engine_add_request(e, &p, &first) == DI_OK); /* holds the only slot for 6 steps */
  p.n_prompt_ids = 40;
  p.prompt_logprobs = 0;
  p.n = 2;
  p.max_tokens = 3;
  CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  int fin[2] = {0, 0}, ntok[2] = {0, 0}, first_tokens = 0;
  for (int g = 0; di_engine_has_unfinished(e) && g < 100; g++) {
    di_step_output *out;
    CHECK(di_engine_step(e, &out) == DI_OK);
    for (int i = 0; i < out->n; i++) {
      const di_seq_output *so = &out->seqs[i];
      if (so->req_id == first) first_tokens += so->n_new_tokens;
      if (so->req_id != id || so->sample_index > 1) continue;
      ntok[so->sample_index] += so->n_new_tokens;
      if (so->finish_reason) fin[so->sample_index] = so->finish_reason;
    }
  }
  CHECKF(fin[0] == DI_FINISH_ERROR && ntok[0] == 0, "leader error: sample 0 finished %d with %d tokens", fin[0], ntok[0]);
  CHECKF(fin[1] == DI_FINISH_LENGTH && ntok[1] == 3, "leader error: sample 1 finished %d with %d tokens", fin[1], ntok[1]);
  CHECKF(first_tokens == 6, "leader error: the first request made %d of 6 tokens", first_tokens);
  CHECK(di_engine_check(e) == DI_OK);
  di_engine_free(e);
  mb->base.ops->destroy(&mb->base);
}

/* a real model: rows against di_model_score, alone and in a batch with small chunks, or with MTP drafts */
static void test_model(const char *dir, int spec) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.threads = 2;
  di_model *m;
  if (di_model_load(test_path(dir), &mo, &m) != DI_OK) {
    CHECKF(0, "load: %s", di_last_error());
    return;
  }
  int V = di_model_vocab_size(m);
  enum { N = 5 };
  static case_t cs[N];
  memset(cs, 0, sizeof cs);
  for (int i = 0; i < N; i++) {
    cs[i].n_prompt = i == 0 ? 70 : 6 + rnd(30);
    for (int p = 0; p < cs[i].n_prompt; p++) cs[i].prompt[p] = i > 0 && p < 20 ? cs[0].prompt[p] : rnd(V);
    cs[i].k = i == 3 ? -1 : i == 0 ? 3 : i % 3;
    cs[i].max_tokens = i == 1 ? 0 : spec ? 4 : 2; /* drafts need room: none is made for a request's last token */
  }
  float *rows[N];
  for (int i = 0; i < N; i++) {
    rows[i] = malloc((size_t)cs[i].n_prompt * (size_t)V * sizeof(float));
    CHECK(di_model_score(m, cs[i].prompt, cs[i].n_prompt, rows[i]) == DI_OK);
  }
  for (int mode = spec ? 2 : 0; mode < (spec ? 3 : 2); mode++) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.max_num_batched_tokens = mode ? 16 : 2048; /* modes 1, 2: chunked prefill across several steps */
    o.kv_cache_memory_bytes = 64 << 20;
    di_engine *e;
    if (di_engine_create(m, &o, &e) != DI_OK) { CHECKF(0, "engine: %s", di_last_error()); break; }
    /* mode 2: speculative decoding (every row of a step is an output row) */
    if (mode == 2 && di_engine_set_speculative(e, 2, 0.0f) != DI_OK) {
      CHECKF(0, "%s: speculative decoding: %s", dir, di_last_error());
      di_engine_free(e);
      break;
    }
    const char *what = mode == 2 ? "model batched, MTP drafts" : mode ? "model batched, 16-token steps" : "model alone";
    if (mode) run(e, cs, N, what);
    else
      for (int i = 0; i < N; i++) run(e, &cs[i], 1, what);
    for (int i = 0; i < N; i++) {
      char w[96];
      snprintf(w, sizeof w, "%s: case %d", what, i);
      check_case(&cs[i], rows[i], V, w);
      CHECKF(cs[i].finish == DI_FINISH_LENGTH && cs[i].n_toks == cs[i].max_tokens, "%s: finish %d, %d tokens", w,
             cs[i].finish, cs[i].n_toks);
    }
    if (mode == 2) {
      di_spec_stats ss;
      di_engine_get_spec_stats(e, &ss);
      CHECKF(ss.drafted_tokens > 0, "%s: no draft was verified", what);
    }
    di_engine_free(e);
  }
  for (int i = 0; i < N; i++) free(rows[i]);
  di_model_free(m);
}

int main(void) {
  test_mock(1, 0, 1, 0, 0, "async");
  test_mock(0, 0, 0, 0, 0, "sync, no prefix cache");
  test_mock(1, 1, 1, 0, 7, "device sampling, 7 rows per step");
  test_mock(1, 0, 1, 4, 40, "preemption, 40 rows per step");
  test_mock_cached();
  test_mock_from(1);
  test_mock_from(0);
  test_model("tests/data/models/dsv3-tiny", 0);
  test_model("models/default", 1); /* has a trained MTP layer */
  test_mock_leader_error();
  return test_finish("prompt_logprobs");
}
