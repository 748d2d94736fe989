/* DSpark's startup step-time profile (di_spec_profile_startup, engine/spec_profile.c; speculative_config
 * "profile": "startup") on the mock backend with the mock CUDA drafter (mock_drafter.h), whose steps take
 * a known time per padded token (graph buckets 1, 2, 4, 8, 16; a proposal costs more).
 * Held: every count a bucket pads holds that bucket's time, never below the mock's model (sleeps make it
 * a lower bound, so the check cannot be flaky), the proposing profile apart and above it; sizes beyond
 * the buckets measured at powers of two and the largest decoding step only; without buckets (and on the
 * host-sampled path without proposals in the step) only the measured sizes. The profile's scratch KV is
 * given back, its sequence keys released, the mock's slot checks clean. With it, the confidence
 * schedule decides from the profile from the first step: on a mock where no draft pays it verifies
 * none, where drafts pay it verifies them; outputs equal plain decoding's. Misuse: no
 * DSpark, after a request, bad or misplaced "profile" values. */
#include "test_util.h"
#include "mock_drafter.h"
#include "test_requests.h"
#include "deepinfer.h"
#include "engine/spec_internal.h"
#include <stdlib.h>
#include <string.h>

#define VOCAB 53
#define BLOCK 4
#define SEQS 8
#define NREQ 8
#define MAXT 24
#define PER_TOKEN_S 0.25e-3
#define PROPOSAL_S 0.5e-3

/* a mock engine with DSpark (confidence schedule unless fixed; device: the mock CUDA drafter with
 * device sampling and proposals in the step, else the host path); spec 0: plain decoding; steps of
 * step_s + per_token_s a padded token, drafts of confidence conf */
static di_engine *make_engine_model(mock_backend **mo, int spec, int device, int fixed, double step_s, double per_token_s,
                                    double proposal_s, float conf) {
  mock_backend *m = mock_backend_new(VOCAB);
  m->base.ops = device ? &MOCK_DRAFTER_OPS : &MOCK_OPS;
  mock_drafter_reset(m, BLOCK);
  g_md.step_s = step_s;
  g_md.per_token_s = per_token_s;
  g_md.proposal_s = proposal_s;
  g_md.conf_right = g_md.conf_wrong = conf;
  if (per_token_s <= 0) m->sleep_s = 0.2e-3;
  di_engine_options o;
  di_engine_options_default(&o);
  o.num_kv_blocks = 256;
  o.max_num_seqs = SEQS;
  o.max_num_batched_tokens = 64;
  o.seed = 3;
  di_engine *e = NULL;
  CHECKF(mock_engine(m, &o, 0, 4096, &e) == DI_OK, "%s", di_last_error());
  if (e && spec) {
    di_drafter_ops d = mock_drafter_ops();
    if (!device) d.draft_greedy = NULL, d.context_on_device = NULL, d.graph_on = NULL, d.graph_drafts = NULL;
    CHECKF(di_engine_set_dspark(e, &d, BLOCK, 1, fixed) == DI_OK, "%s", di_last_error());
  }
  *mo = m;
  return e;
}
static di_engine *make_engine(mock_backend **mo, int spec, int device, int fixed, double per_token_s) {
  return make_engine_model(mo, spec, device, fixed, 0, per_token_s, PROPOSAL_S, 0.4f);
}

static void free_engine(di_engine *e, mock_backend *m) {
  if (e) di_engine_free(e);
  mock_destroy(&m->base);
}

/* the scratch KV given back, keys released, the mock's checks clean */
static void check_clean(di_engine *e, mock_backend *m, const char *what) {
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  CHECKF(st.kv_blocks_used == 0, "%s: %lld KV blocks held after the profile", what, (long long)st.kv_blocks_used);
  CHECKF(di_engine_check(e) == DI_OK, "%s: %s", what, di_last_error());
  CHECKF(m->n_keys == 0 && m->key_errors == 0 && m->errors == 0, "%s: %d live keys, %d key errors, %d slot errors", what,
         m->n_keys, m->key_errors, m->errors);
}

static void test_buckets(void) {
  mock_backend *m;
  di_engine *e = make_engine(&m, 1, 1, 0, PER_TOKEN_S);
  if (!e) { free_engine(e, m); return; }
  CHECKF(di_spec_profile_startup(e) == DI_OK, "%s", di_last_error());
  const struct di_spec *sp = e->spec;
  /* sizes: buckets 1..16, then 32 and the largest decoding step 8 x (1 + 4) = 40 */
  CHECKF(sp->profiled_sizes == 7, "%d sizes profiled", sp->profiled_sizes);
  int bucket_ok = 1, model_ok = 1, prop_ok = 1, gaps_ok = 1;
  for (int c = 1; c <= DI_SPEC_PROFILE_MAX; c++) {
    const int measured = c <= MOCK_DRAFTER_BUCKET_MAX || c == 32 || c == 40;
    if (!measured) {
      gaps_ok &= sp->prof_ms[c] == 0 && sp->prof_prop_ms[c] == 0;
      continue;
    }
    const int pad = mock_drafter_padded(c);
    bucket_ok &= sp->prof_ms[c] == sp->prof_ms[pad] && sp->prof_prop_ms[c] == sp->prof_prop_ms[pad];
    model_ok &= sp->prof_ms[c] >= 1e3 * mock_drafter_step_s(c, 0) - 1e-6;
    prop_ok &= sp->prof_prop_ms[c] >= 1e3 * mock_drafter_step_s(c, 1) - 1e-6;
  }
  CHECKF(bucket_ok, "a bucket's counts do not all hold its time");
  CHECKF(model_ok, "a plain step's time below the mock's (prof_ms[1] %.3f ms, prof_ms[40] %.3f ms)", sp->prof_ms[1],
         sp->prof_ms[40]);
  CHECKF(prop_ok, "a proposing step's time below the mock's (prof_prop_ms[1] %.3f ms)", sp->prof_prop_ms[1]);
  CHECKF(gaps_ok, "counts beyond the buckets other than the sizes measured hold a time");
  /* every size measured with proposals, made inside each step by the mock drafter: 7 sizes x 5 runs */
  CHECKF(g_md.proposing_submits == 35 && g_md.emulated == 35, "%lld proposing steps, %lld proposals made",
         (long long)g_md.proposing_submits, (long long)g_md.emulated);
  check_clean(e, m, "buckets");
  printf("profile: plain %.3f / %.3f / %.3f ms at 1 / 16 / 40 tokens, proposing %.3f / %.3f / %.3f ms\n", sp->prof_ms[1],
         sp->prof_ms[16], sp->prof_ms[40], sp->prof_prop_ms[1], sp->prof_prop_ms[16], sp->prof_prop_ms[40]);
  free_engine(e, m);
}

/* no graph buckets (the mock without a step-time model), and the host path without proposals in the step */
static void test_no_buckets(void) {
  for (int device = 1; device >= 0; device--) {
    mock_backend *m;
    di_engine *e = make_engine(&m, 1, device, 0, 0);
    if (!e) { free_engine(e, m); continue; }
    CHECKF(di_spec_profile_startup(e) == DI_OK, "%s", di_last_error());
    const struct di_spec *sp = e->spec;
    CHECKF(sp->profiled_sizes == 7, "device %d: %d sizes profiled", device, sp->profiled_sizes);
    int ok = 1;
    for (int c = 1; c <= 64; c++) {
      const int measured = c == 1 || c == 2 || c == 4 || c == 8 || c == 16 || c == 32 || c == 40;
      ok &= measured ? sp->prof_ms[c] > 0 : sp->prof_ms[c] == 0;
      ok &= (measured && device) ? sp->prof_prop_ms[c] > 0 : sp->prof_prop_ms[c] == 0;
    }
    CHECKF(ok, "device %d: without buckets only the sizes measured hold times (prof_ms[3] %.3f)", device, sp->prof_ms[3]);
    check_clean(e, m, device ? "no buckets" : "host path");
    free_engine(e, m);
  }
}

typedef struct {
  int32_t prompt[8];
  int n_prompt;
  test_got out;
} rq_t;

/* NREQ greedy requests to the end; returns the drafted tokens (the spec stats) */
static int64_t generate(di_engine *e, rq_t *rq) {
  for (int k = 0; k < NREQ; k++) {
    rq[k].n_prompt = 3 + (k * 3) % 5; /* every prompt in the first step: then decoding steps only */
    for (int i = 0; i < rq[k].n_prompt; i++) rq[k].prompt[i] = 2 + (int32_t)(mock_mix((uint64_t)(k * 100 + i)) % (VOCAB - 2));
    const di_request_params p = test_params(NULL, rq[k].prompt, rq[k].n_prompt, MAXT, 0, 0);
    test_add(e, &p, &rq[k].out, "generate");
  }
  test_run_to_end(e, &rq[0].out, sizeof *rq, NREQ, 5000, NULL, NULL, "generate");
  di_spec_stats ss;
  di_engine_get_spec_stats(e, &ss);
  return ss.drafted_tokens;
}

/* the schedule from the startup profile: where no draft pays (decoding steps only, a padded token costs
 * 0.25 ms, a proposal 0.5 ms, drafts of confidence 0.4) none is verified from the first step; where drafts pay (2 ms a step,
 * 1 us a token, 0.1 ms a proposal, confidence 0.9) they are, and also where only all of them together pay
 * for a proposal of 0.5 ms; outputs equal plain decoding's either way. */
static void test_schedule(void) {
  static rq_t ref[NREQ], got[NREQ];
  mock_backend *m;
  di_engine *e = make_engine(&m, 0, 1, 0, PER_TOKEN_S);
  if (!e) { free_engine(e, m); return; }
  generate(e, ref);
  free_engine(e, m);
  static const struct { const char *what; double step_s, per_token_s, proposal_s; float conf; int pays; } cfgs[] = {
      {"no draft pays", 0, PER_TOKEN_S, PROPOSAL_S, 0.4f, 0},
      {"drafts pay", 2e-3, 1e-6, 0.1e-3, 0.9f, 1},
      /* the first draft alone does not pay the proposal's 0.5 ms, all of them do (8.9 tokens in 2.5 ms
       * against 8 in 2.0 ms; 32.8 in 2.5 ms): the best prefix, not the first that stops improving */
      {"drafts pay together", 2e-3, 1e-6, 0.5e-3, 0.9f, 1}};
  for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
    e = make_engine_model(&m, 1, 1, 0, cfgs[c].step_s, cfgs[c].per_token_s, cfgs[c].proposal_s, cfgs[c].conf);
    if (!e) { free_engine(e, m); continue; }
    CHECKF(di_spec_profile_startup(e) == DI_OK, "%s", di_last_error());
    const int64_t drafted = generate(e, got);
    int same = 1;
    for (int k = 0; k < NREQ; k++) same &= got[k].out.n == MAXT && test_got_equal(&got[k].out, &ref[k].out);
    CHECKF(same, "%s: outputs differ from plain decoding", cfgs[c].what);
    if (cfgs[c].pays) CHECKF(drafted > 0, "%s: none verified", cfgs[c].what);
    else CHECKF(drafted == 0, "%s: %lld drafts verified", cfgs[c].what, (long long)drafted);
    printf("startup profile, %s: %lld drafts verified\n", cfgs[c].what, (long long)drafted);
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0 && di_engine_check(e) == DI_OK, "%lld KV blocks leaked", (long long)st.kv_blocks_used);
    free_engine(e, m);
  }
}

/* a plain step's time measured much too slow (one noisy probe) makes drafts that do not pay look paying;
 * while drafts are verified no plain step is measured, so the schedule probes one again every 32
 * schedules (and a faster plain measurement replaces a slower one at once): verification stops there,
 * sooner (here ~250 drafts verified; ~650 without the probe and the faster-replaces rule) */
static void test_reprobe(void) {
  enum { LONG_T = 160 };
  mock_backend *m;
  di_engine *e = make_engine_model(&m, 1, 1, 0, 0, PER_TOKEN_S, PROPOSAL_S, 0.4f);
  if (!e) { free_engine(e, m); return; }
  CHECKF(di_spec_profile_startup(e) == DI_OK, "%s", di_last_error());
  for (int c = 1; c <= DI_SPEC_PROFILE_MAX; c++) e->spec->prof_ms[c] *= 10;
  const double inflated = e->spec->prof_ms[SEQS];
  static rq_t rq[NREQ];
  for (int k = 0; k < NREQ; k++) {
    rq[k].n_prompt = 3 + (k * 3) % 5;
    for (int i = 0; i < rq[k].n_prompt; i++) rq[k].prompt[i] = 2 + (int32_t)(mock_mix((uint64_t)(k * 100 + i)) % (VOCAB - 2));
    const di_request_params p = test_params(NULL, rq[k].prompt, rq[k].n_prompt, LONG_T, 0, 0);
    test_add(e, &p, &rq[k].out, "reprobe");
  }
  test_run_to_end(e, &rq[0].out, sizeof *rq, NREQ, 20000, NULL, NULL, "reprobe");
  di_spec_stats ss;
  di_engine_get_spec_stats(e, &ss);
  printf("a 10x plain time: %lld drafts verified over %d tokens a request\n", (long long)ss.drafted_tokens, LONG_T);
  CHECKF(ss.drafted_tokens > 0, "the wrong plain time admitted nothing (the case does not test the probe)");
  /* the probe's effect on the profile, not on how many drafts were verified meanwhile (that count rose from
   * ~250 to ~750 when a loaded 2-core machine stretched the mock's sleeps): the plain step time at the batch's
   * size must have been measured again, well below the 10x it was set to (it stays 10x without the re-probe,
   * since a schedule that always verifies never times a plain step) */
  const double after = e->spec->prof_ms[SEQS];
  printf("the plain step time at %d sequences: set to %.3f ms, %.3f ms at the end\n", SEQS, inflated, after);
  CHECKF(after < 0.5 * inflated, "the plain step time at %d sequences stayed %.3f ms (set to %.3f): not probed again",
         SEQS, after, inflated);
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  CHECKF(st.kv_blocks_used == 0 && di_engine_check(e) == DI_OK, "%lld KV blocks leaked", (long long)st.kv_blocks_used);
  free_engine(e, m);
}

/* The confidence schedule's pauses (spec_dspark.c) where no draft pays (confidence 0.05): the first
 * schedule's probe and exploration measured as a look (its full cost, from the steps' wall times), the
 * pause then at least that cost over 1% of a paused step, so a run of LONG_T tokens holds no look after
 * it; with device token feedback the pipelined plain steps timed; on the host path the decoding rows of
 * a pause's steps (but its last 16) not fed to the drafter, every row with DEEPINFER_DSPARK_PAUSE_FEED=1;
 * outputs equal plain decoding's in all three. */
static void run_long(di_engine *e, rq_t *rq, int T, const char *what) {
  for (int k = 0; k < NREQ; k++) {
    rq[k].n_prompt = 3 + (k * 3) % 5;
    for (int i = 0; i < rq[k].n_prompt; i++) rq[k].prompt[i] = 2 + (int32_t)(mock_mix((uint64_t)(k * 100 + i)) % (VOCAB - 2));
    const di_request_params p = test_params(NULL, rq[k].prompt, rq[k].n_prompt, T, 0, 0);
    test_add(e, &p, &rq[k].out, what);
  }
  test_run_to_end(e, &rq[0].out, sizeof *rq, NREQ, 40000, NULL, NULL, what);
}

static void test_pauses(void) {
  enum { LONG_T = 200 };
  static rq_t ref[NREQ], got[NREQ];
  mock_backend *m;
  di_engine *e = make_engine(&m, 0, 1, 0, PER_TOKEN_S);
  if (!e) { free_engine(e, m); return; }
  run_long(e, ref, LONG_T, "pauses, plain");
  free_engine(e, m);
  static const char *const what[3] = {"device drafter", "host path", "host path, every row fed"};
  int64_t fed[3] = {0};
  for (int c = 0; c < 3; c++) {
    if (c == 2) setenv("DEEPINFER_DSPARK_PAUSE_FEED", "1", 1);
    e = make_engine_model(&m, 1, c == 0, 0, 0, c == 0 ? PER_TOKEN_S : 0, PROPOSAL_S, 0.05f); /* (host path: 0.2 ms a step) */
    unsetenv("DEEPINFER_DSPARK_PAUSE_FEED");
    if (!e) { free_engine(e, m); continue; }
    run_long(e, got, LONG_T, what[c]);
    int same = 1;
    for (int k = 0; k < NREQ; k++) same &= ref[k].out.n == LONG_T && test_got_equal(&got[k].out, &ref[k].out);
    CHECKF(same, "%s: outputs differ from plain decoding", what[c]);
    const struct di_spec *sp = e->spec;
    di_spec_stats ss;
    di_engine_get_spec_stats(e, &ss);
    printf("pauses, %s: %lld looks measured, the last %.2f ms against a %.3f ms paused step, pause %d; %lld proposing "
           "submits, %lld drafts verified; pipelined plain steps %d (%.3f ms); %lld rows unfed, %lld fed\n", what[c],
           (long long)sp->looks, sp->look_cost_ms, sp->steady_ms, sp->pause_len, (long long)g_md.proposing_submits,
           (long long)ss.drafted_tokens, sp->pipe_count, sp->pipe_ms, (long long)sp->rows_unfed, (long long)g_md.context_rows);
    CHECKF(sp->looks >= 1 && sp->look_cost_ms > 0 && sp->steady_ms > 0, "%s: the first schedule's look not measured", what[c]);
    if (c == 0) {
      /* its pause outlasts the run (the exploration verifies 8 x 4 drafts: a step of 5x a paused one; the host
       * path's mock proposals cost nothing, so its looks are cheap and its pauses short) */
      CHECKF(sp->pause_len > LONG_T, "%s: a pause of %d steps after a look of %.2f ms (steps of %.3f ms)", what[c],
             sp->pause_len, sp->look_cost_ms, sp->steady_ms);
      CHECKF(sp->pipe_count >= 8 && sp->pipe_ms > 0, "%s: %d pipelined plain steps timed", what[c], sp->pipe_count);
      CHECKF(g_md.proposing_submits <= 4, "%s: %lld steps proposed (looks after the first)", what[c],
             (long long)g_md.proposing_submits);
      CHECKF(sp->rows_unfed == 0, "%s: %lld rows unfed (the context is fed on the device)", what[c], (long long)sp->rows_unfed);
    }
    if (c == 1) CHECKF(sp->rows_unfed > (int64_t)NREQ * (LONG_T / 2), "%s: %lld rows unfed", what[c], (long long)sp->rows_unfed);
    if (c == 2) CHECKF(sp->rows_unfed == 0, "%s: %lld rows unfed", what[c], (long long)sp->rows_unfed);
    fed[c] = g_md.context_rows;
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0 && di_engine_check(e) == DI_OK, "%lld KV blocks leaked", (long long)st.kv_blocks_used);
    free_engine(e, m);
  }
  CHECKF(fed[1] + (int64_t)NREQ * (LONG_T / 2) < fed[2], "host path: %lld rows fed, %lld with every row fed", (long long)fed[1],
         (long long)fed[2]);
}

static void test_misuse(void) {
  mock_backend *m;
  di_engine *e = make_engine(&m, 0, 1, 0, PER_TOKEN_S);
  if (e) CHECK_ERR(di_spec_profile_startup(e), "for DSpark");
  free_engine(e, m);
  e = make_engine(&m, 1, 1, 1, PER_TOKEN_S); /* fixed: nothing to profile */
  if (e) {
    CHECK(di_spec_profile_startup(e) == DI_OK && e->spec->profiled_sizes == 0 && g_md.proposing_submits == 0);
    int32_t prompt[3] = {5, 6, 7};
    di_request_params p;
    di_request_params_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = 3;
    uint64_t id;
    CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
    CHECK_ERR(di_spec_profile_startup(e), "before the first request");
  }
  free_engine(e, m);
  /* the speculative_config key, validated without a model */
  CHECK(di_engine_set_speculative_config(NULL, NULL, "{\"method\": \"dspark\", \"profile\": \"startup\"}") == DI_OK);
  CHECK(di_engine_set_speculative_config(NULL, NULL, "{\"method\": \"dspark\", \"profile\": \"online\"}") == DI_OK);
  CHECK_ERR(di_engine_set_speculative_config(NULL, NULL, "{\"method\": \"dspark\", \"profile\": \"sometimes\"}"),
            "profile must be \"online\" or \"startup\"");
  CHECK_ERR(di_engine_set_speculative_config(NULL, NULL, "{\"method\": \"mtp\", \"num_speculative_tokens\": 1, "
                                                         "\"profile\": \"startup\"}"),
            "is for method \"dspark\"");
  CHECK_ERR(di_engine_set_speculative_config(NULL, NULL, "{\"method\": \"dspark\", \"profile\": 1}"), "profile");
}

int main(void) {
  test_buckets();
  test_no_buckets();
  test_schedule();
  test_reprobe();
  test_pauses();
  test_misuse();
  free(g_md.sampled);
  return test_finish("test_dspark_profile");
}
