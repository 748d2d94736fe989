/* Speculative decoding with the MTP layer (di_engine_set_speculative) on models/default (trained MTP
 * layer) and on dummy weights in its shapes: outputs (ids, text, logprobs, finish reasons) are
 * identical to plain decoding for greedy and seeded sampling with penalties, batched and one at a
 * time, under a tiny token budget (chunked prefill + cut drafts), a tiny KV pool (preemption), stop
 * tokens / stop strings / max_tokens falling inside accepted drafts, structured-output requests; no
 * KV block leaks; drafts are really accepted on the trained model; argument errors. */
#include "test_util.h"
#include "deepinfer.h"
#include "sampler/rng.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NREQ 14
#define MAXP 80
#define MAXT 36

typedef struct {
  int32_t prompt[MAXP];
  int n_prompt, max_tokens;
  int32_t stop_id;          /* -1: none */
  const char *stop_str;     /* NULL: none */
  int json;
  int32_t got[MAXT + 1];
  float lp[MAXT + 1];
  char text[4096];
  size_t text_len;
  int n_got, finish;
  uint64_t id;
} rq_t;

typedef struct {
  int spec_k;
  float conf;
  float temperature;
  int max_seqs, budget, blocks, prefix;
} run_cfg;

static uint64_t rs = 1;
static int64_t last_preemptions;
static int rnd(int n) { return (int)(di_rng_u64(5, 0, rs++) % (uint64_t)n); }

static int run(di_model *m, rq_t *rq, int n, const run_cfg *c, di_spec_stats *ss, const char *what) {
  di_engine_options o;
  di_engine_options_default(&o);
  if (c->max_seqs) o.max_num_seqs = c->max_seqs;
  if (c->budget) o.max_num_batched_tokens = c->budget;
  if (c->blocks) o.num_kv_blocks = c->blocks;
  o.enable_prefix_caching = c->prefix;
  o.seed = 3;
  di_engine *e;
  di_status s = di_engine_create(m, &o, &e);
  CHECKF(s == DI_OK, "%s: %s", what, di_last_error());
  if (s != DI_OK) return 0;
  if (c->spec_k) {
    s = di_engine_set_speculative(e, c->spec_k, c->conf);
    CHECKF(s == DI_OK, "%s: set_speculative: %s", what, di_last_error());
  }
  for (int k = 0; k < n; k++) {
    di_request_params p;
    di_request_params_default(&p);
    p.prompt_ids = rq[k].prompt;
    p.n_prompt_ids = rq[k].n_prompt;
    p.max_tokens = rq[k].max_tokens;
    p.temperature = c->temperature;
    p.top_p = c->temperature > 0 ? 0.9f : 1.0f;
    p.repetition_penalty = c->temperature > 0 && k % 3 == 0 ? 1.2f : 1.0f;
    p.presence_penalty = c->temperature > 0 && k % 4 == 1 ? 0.5f : 0.0f;
    p.logprobs = k % 5 == 0 ? 2 : -1;
    p.min_tokens = k % 7 == 3 ? 3 : 0;
    p.has_seed = 1;
    p.seed = 100 + (uint64_t)k;
    p.ignore_eos = k % 2;
    p.stop_token_ids = &rq[k].stop_id;
    p.n_stop_token_ids = rq[k].stop_id >= 0;
    const char *stops[1] = {rq[k].stop_str};
    p.stop = stops;
    p.n_stop = rq[k].stop_str != NULL;
    p.json_object = rq[k].json;
    rq[k].n_got = 0;
    rq[k].finish = 0;
    rq[k].text_len = 0;
    CHECKF(di_engine_add_request(e, &p, &rq[k].id) == DI_OK, "%s: add: %s", what, di_last_error());
  }
  int guard = 0;
  while (di_engine_has_unfinished(e) && guard++ < 20000) {
    di_step_output *out;
    if (di_engine_step(e, &out) != DI_OK) { CHECKF(0, "%s: step: %s", what, di_last_error()); break; }
    for (int i = 0; i < out->n; i++) {
      const di_seq_output *so = &out->seqs[i];
      rq_t *r = &rq[so->req_id - rq[0].id];
      for (int t = 0; t < so->n_new_tokens && r->n_got <= MAXT; t++) {
        r->lp[r->n_got] = so->new_logprobs ? so->new_logprobs[t] : 0;
        r->got[r->n_got++] = so->new_tokens[t];
      }
      if (r->text_len + so->new_text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, so->new_text, so->new_text_len);
        r->text_len += so->new_text_len;
      }
      if (so->finish_reason) r->finish = so->finish_reason;
      if (so->finish_reason == DI_FINISH_ERROR) CHECKF(0, "%s: request error: %s", what, so->error);
    }
  }
  CHECKF(di_engine_check(e) == DI_OK, "%s: %s", what, di_last_error());
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  CHECKF(st.kv_blocks_used == 0, "%s: %lld blocks leaked", what, (long long)st.kv_blocks_used);
  last_preemptions = st.preemptions;
  di_engine_get_spec_stats(e, ss);
  di_engine_free(e);
  return 1;
}

static void compare(const rq_t *a, const rq_t *b, int n, const char *what) {
  int bad = 0;
  for (int k = 0; k < n && bad < 3; k++) {
    int same = a[k].n_got == b[k].n_got && a[k].finish == b[k].finish && a[k].text_len == b[k].text_len &&
               memcmp(a[k].text, b[k].text, a[k].text_len) == 0;
    for (int t = 0; same && t < a[k].n_got; t++) same = a[k].got[t] == b[k].got[t] && a[k].lp[t] == b[k].lp[t];
    if (!same) {
      bad++;
      CHECKF(0, "%s: request %d differs: %d tokens (finish %d) vs %d (finish %d)", what, k, a[k].n_got, a[k].finish,
             b[k].n_got, b[k].finish);
      for (int t = 0; t < a[k].n_got && t < b[k].n_got; t++)
        if (a[k].got[t] != b[k].got[t]) { printf("  first difference at token %d: %d vs %d\n", t, a[k].got[t], b[k].got[t]); break; }
    }
  }
}

static void make_requests(rq_t *rq, int n, int V) {
  int32_t shared[40];
  for (int i = 0; i < 40; i++) shared[i] = 3 + rnd(V - 3);
  for (int k = 0; k < n; k++) {
    rq_t *r = &rq[k];
    memset(r, 0, sizeof *r);
    r->n_prompt = 1 + rnd(MAXP);
    int from_shared = k % 3 == 0 ? (r->n_prompt < 40 ? r->n_prompt : 40) : 0; /* prefix-cache hits */
    for (int i = 0; i < r->n_prompt; i++) r->prompt[i] = i < from_shared ? shared[i] : 3 + rnd(V - 3);
    r->max_tokens = k % 4 == 0 ? 1 + rnd(6) : 8 + rnd(MAXT - 8);
    r->stop_id = -1;
  }
}

static rq_t base[NREQ], got[NREQ];

static void suite(di_model *m, const char *name, int expect_accept, int n_temps, int n_cfg_sampled) {
  int V = di_model_vocab_size(m);
  di_spec_stats ss;
  char what[160];
  for (int temp = 0; temp < n_temps; temp++) {
    float T = temp ? 0.8f : 0.0f;
    make_requests(base, NREQ, V);
    run_cfg plain = {.temperature = T, .prefix = 1};
    run(m, base, NREQ, &plain, &ss, "plain");
    CHECK(ss.num_tokens == 0 && ss.drafted_tokens == 0);
    /* stop tokens inside drafts: a token the plain run produced at index 2..5 becomes a stop token;
     * stop strings: a character of the plain run's text */
    for (int k = 0; k < NREQ; k++) {
      if (k % 3 == 1 && base[k].n_got > 4) base[k].stop_id = base[k].got[2 + k % 3];
      if (k % 5 == 2) base[k].stop_str = k % 2 ? "e" : " t";
      if (k == 7) base[k].json = 1;
    }
    run(m, base, NREQ, &plain, &ss, "plain with stops");
    const run_cfg cfgs[] = {
        {.spec_k = 5, .conf = 0.0f, .temperature = T, .prefix = 1},
        {.spec_k = 5, .conf = 0.0f, .temperature = T, .prefix = 1, .blocks = 4},
        {.spec_k = 3, .conf = 0.3f, .temperature = T, .prefix = 0},
        {.spec_k = 5, .conf = 0.05f, .temperature = T, .prefix = 1, .budget = 16},
        {.spec_k = 2, .conf = 0.0f, .temperature = T, .prefix = 0, .max_seqs = 1},
        {.spec_k = 1, .conf = 0.9f, .temperature = T, .prefix = 1, .budget = 40},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0] && (temp == 0 || (int)c < n_cfg_sampled); c++) {
      memcpy(got, base, sizeof got);
      run(m, got, NREQ, &cfgs[c], &ss, name);
      snprintf(what, sizeof what, "%s T=%.1f k=%d conf=%.2f budget=%d blocks=%d seqs=%d", name, (double)T, cfgs[c].spec_k,
               (double)cfgs[c].conf, cfgs[c].budget, cfgs[c].blocks, cfgs[c].max_seqs);
      compare(base, got, NREQ, what);
      printf("%s: drafted %lld accepted %lld (%.1f%%) mean accepted length %.2f; per position", what,
             (long long)ss.drafted_tokens, (long long)ss.accepted_tokens, 100 * ss.acceptance_rate, ss.mean_accepted_length);
      for (int j = 0; j < cfgs[c].spec_k; j++)
        printf(" %lld/%lld", (long long)ss.accepted_at[j], (long long)ss.drafted_at[j]);
      printf("\n");
      CHECKF(ss.num_tokens == cfgs[c].spec_k, "%s: stats num_tokens %d", what, ss.num_tokens);
      CHECKF(ss.accepted_tokens <= ss.drafted_tokens, "%s", what);
      int64_t sum_d = 0, sum_a = 0;
      for (int j = 0; j < 5; j++) {
        sum_d += ss.drafted_at[j];
        sum_a += ss.accepted_at[j];
        CHECKF(j >= cfgs[c].spec_k ? ss.drafted_at[j] == 0 : 1, "%s: drafts beyond k", what);
        if (j > 0) CHECKF(ss.drafted_at[j] <= ss.drafted_at[j - 1], "%s: position %d drafted more than %d", what, j, j - 1);
      }
      CHECKF(sum_d == ss.drafted_tokens && sum_a == ss.accepted_tokens, "%s: per-position stats", what);
      if (c == 0) {
        CHECKF(ss.drafted_tokens > 30, "%s: only %lld drafts", what, (long long)ss.drafted_tokens);
        if (expect_accept && temp == 0) /* first draft position, along greedy outputs of random prompts */
          CHECKF(ss.accepted_at[0] > 0.4 * (double)ss.drafted_at[0], "%s: acceptance at 1: %lld/%lld", what,
                 (long long)ss.accepted_at[0], (long long)ss.drafted_at[0]);
      }
      if (cfgs[c].blocks) CHECKF(last_preemptions > 0, "%s: no preemption", what);
    }
  }
}

static void test_errors(di_model *m, di_model *no_mtp) {
  di_engine *e;
  CHECK(di_engine_create(m, NULL, &e) == DI_OK);
  CHECK_ERR(di_engine_set_speculative(e, 6, 0.1f), "must be in [0, 5]");
  CHECK_ERR(di_engine_set_speculative(e, -1, 0.1f), "must be in [0, 5]");
  CHECK_ERR(di_engine_set_speculative(e, 2, 1.5f), "threshold must be in [0, 1]");
  CHECK_ERR(di_engine_set_speculative(e, 2, NAN), "threshold must be in [0, 1]");
  CHECK(di_engine_set_speculative(e, 2, 0.1f) == DI_OK);
  CHECK(di_engine_set_speculative(e, 0, 0.1f) == DI_OK); /* off again */
  di_spec_stats ss;
  di_engine_get_spec_stats(e, &ss);
  CHECK(ss.num_tokens == 0);
  di_request_params p;
  di_request_params_default(&p);
  int32_t ids[3] = {5, 6, 7};
  p.prompt_ids = ids;
  p.n_prompt_ids = 3;
  uint64_t id;
  CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
  CHECK_ERR(di_engine_set_speculative(e, 2, 0.1f), "before the first request"); /* too late */
  di_engine_free(e);
  if (no_mtp) {
    CHECK(di_engine_create(no_mtp, NULL, &e) == DI_OK);
    CHECK_ERR(di_engine_set_speculative(e, 2, 0.1f), "MTP layer");
    di_engine_free(e);
  }
}

int main(void) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.threads = 2;
  di_model *m = NULL, *dm = NULL, *tiny = NULL;
  di_status s = di_model_load(test_path("models/default"), &mo, &m);
  CHECKF(s == DI_OK, "models/default: %s", di_last_error());
  if (s == DI_OK) suite(m, "default", 1, 2, 3);
  mo.load_format = "dummy";
  mo.dummy_seed = 11;
  s = di_model_load(test_path("models/default"), &mo, &dm);
  CHECKF(s == DI_OK, "dummy: %s", di_last_error());
  if (s == DI_OK) suite(dm, "dummy", 0, 1, 0);
  mo.load_format = NULL;
  s = di_model_load(test_path("tests/data/models/dsv3-tiny"), &mo, &tiny);
  CHECKF(s == DI_OK, "dsv3-tiny: %s", di_last_error());
  if (m) test_errors(m, tiny);
  di_model_free(m);
  di_model_free(dm);
  di_model_free(tiny);
  return test_finish("spec");
}
