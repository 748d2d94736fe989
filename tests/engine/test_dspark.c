/* DSpark speculative decoding (di_engine_set_speculative_config, method "dspark") on models/default
 * with its shipped drafter (models/default/dspark):
 *  - greedy: identical to plain decoding, 21 prompts x 48 tokens (1,008 tokens), under the
 *    confidence schedule, fixed k = 1, 3 and 5, acceptance "exact", a 16-token budget (chunked prefill,
 *    cut grants) and a 6-block pool (preemption); no KV block leaked; drafts are accepted;
 *  - temperature 1: the distribution of the 2nd and 3rd generated tokens over 600 seeds each equals plain
 *    sampling's (two-sample chi-square homogeneity test at level 0.001 on the categories with >= 10
 *    expected counts, the rest pooled; fixed seeds, so the verdict is reproducible); again with top-k,
 *    top-p, min-p, repetition / frequency / presence penalties and a logit bias on every request;
 *  - structured outputs draft under their grammar: json_object, a JSON schema and a regex, greedy and
 *    seeded T = 0.8, 40 tokens each, equal to plain constrained decoding under the fixed and the
 *    confidence schedule, with drafts made and accepted (fixed schedule); every output ends valid
 *    or is cut by max_tokens, as plain decoding's;
 *  - the drafter's cache group (drafter_group below): pool sizes, prefix hits that keep the drafts,
 *    batch == alone with drafts, no block leaked through preemption;
 *  - the same grammar runs with method "mtp" (its drafts masked by the grammar state, exact match);
 *  - a grammar that completes under ignore_eos ends the request where plain decoding ends it (DSpark
 *    and MTP): verification accepts nothing past the grammar's end;
 *  - aborts mid-draft leak no KV; bad configs are refused with the field named.
 * Under AddressSanitizer (CI's ./build.sh asan, ~10x slower) the same paths run at a smaller size
 * (6 prompts x 24 tokens, 2 configs; the chi-square needs its sample size and is left to the other
 * three CI runs of this test). */
#include "test_util.h"
#include "test_requests.h"
#include "deepinfer.h"
#include "util/switches.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#define MAXT 48

typedef struct {
  char text[96];
  test_got out;
} rq_t;

static di_model *g_model;
/* sampling processing every request of run() gets when g_proc (top-k / top-p / min-p, penalties, bias) */
static int g_proc;
static int32_t g_bias_ids[2] = {13, 262}; /* set to the plain T = 1 run's two most frequent 2nd tokens */
static const float g_bias_val[2] = {-1.0f, 1.0f};

static di_engine *make_engine(const char *spec, int budget, int blocks, int max_seqs) {
  di_engine_options o;
  di_engine_options_default(&o);
  if (budget) o.max_num_batched_tokens = budget;
  if (blocks) o.num_kv_blocks = blocks;
  if (max_seqs) o.max_num_seqs = max_seqs;
  o.seed = 7;
  di_engine *e = NULL;
  CHECKF(di_engine_create(g_model, &o, &e) == DI_OK, "%s", di_last_error());
  if (e && spec) CHECKF(di_engine_set_speculative_config(e, g_model, spec) == DI_OK, "%s: %s", spec, di_last_error());
  return e;
}

/* runs every request to its end; temperature < 0: greedy */
static void run(di_engine *e, rq_t *rq, int n, float temperature, int max_tokens, uint64_t seed0, const char *what) {
  for (int k = 0; k < n; k++) {
    di_request_params p = test_params(rq[k].text, NULL, 0, max_tokens, temperature, seed0 + (uint64_t)k);
    if (g_proc) {
      p.top_k = 40;
      p.top_p = 0.9f;
      p.min_p = 0.02f;
      p.repetition_penalty = 1.3f;
      p.frequency_penalty = 0.6f;
      p.presence_penalty = 0.4f;
      p.logit_bias_ids = g_bias_ids;
      p.logit_bias_values = g_bias_val;
      p.n_logit_bias = 2;
    }
    test_add(e, &p, &rq[k].out, what);
  }
  test_run_to_end(e, &rq[0].out, sizeof *rq, n, 100000, NULL, NULL, what);
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  CHECKF(st.kv_blocks_used == 0, "%s: %lld KV blocks leaked", what, (long long)st.kv_blocks_used);
  CHECKF(di_engine_check(e) == DI_OK, "%s: %s", what, di_last_error());
}

static void make_prompts(rq_t *rq, int n) {
  static const char *texts[] = {"The sea is", "Once upon a time", "The history of the city", "In the beginning",
                                "This program is free software", "The quick brown fox", "What does \"sea\" mean?",
                                "Copyright (C) 2004", "The function returns", "A long time ago in a"};
  for (int k = 0; k < n; k++) snprintf(rq[k].text, sizeof rq[k].text, "%s%s", texts[k % 10], k >= 10 ? (k >= 20 ? " and" : " the") : "");
}

/* the model runs on CUDA with DSpark's proposals inside the step's graph (their switches' defaults) */
static int on_cuda_graph_proposals(void) {
  const char *acc = di_switch_get(DI_SW_ACCELERATOR);
  return acc && (strcmp(acc, "cuda") == 0 || strcmp(acc, "nvidia") == 0) && di_switch_bool(DI_SW_DSPARK_DEVICE_STEPS, 1) &&
         di_switch_bool(DI_SW_DSPARK_GRAPH_PROPOSE, 1);
}

static void greedy_identity(void) {
  enum { NMAX = 21 };
  static rq_t ref[NMAX], got[NMAX];
  const int N = UNDER_ASAN ? 6 : NMAX, T = UNDER_ASAN ? 24 : MAXT;
  make_prompts(ref, N);
  di_engine *e = make_engine(NULL, 0, 0, 0);
  run(e, ref, N, -1, T, 1, "plain");
  di_engine_free(e);
  const struct { const char *spec; int budget, blocks; } cfgs[] = {
      {"{\"method\": \"dspark\", \"num_speculative_tokens\": 5}", 0, 0},
      {"{\"method\": \"dspark\", \"num_speculative_tokens\": 1, \"schedule\": \"fixed\"}", 0, 0},
      {"{\"method\": \"dspark\", \"num_speculative_tokens\": 5, \"schedule\": \"fixed\", \"acceptance\": \"exact\"}", 16, 0},
      {"{\"method\": \"dspark\", \"num_speculative_tokens\": 3, \"schedule\": \"fixed\"}", 0, 6},
  };
  const size_t n_cfgs = UNDER_ASAN ? 2 : sizeof cfgs / sizeof cfgs[0];
  for (size_t c = UNDER_ASAN ? 2 : 0; c < n_cfgs + (UNDER_ASAN ? 2 : 0); c++) {
    memcpy(got, ref, sizeof got);
    e = make_engine(cfgs[c].spec, cfgs[c].budget, cfgs[c].blocks, 0);
    if (!e) continue;
    run(e, got, N, -1, T, 1, cfgs[c].spec);
    int same = 1, tokens = 0;
    for (int k = 0; k < N; k++) {
      same &= got[k].out.n == ref[k].out.n && memcmp(got[k].out.tok, ref[k].out.tok, sizeof(int32_t) * (size_t)ref[k].out.n) == 0;
      tokens += got[k].out.n;
    }
    CHECKF(same && tokens == N * T, "%s (budget %d, blocks %d): greedy output differs from plain decoding", cfgs[c].spec,
           cfgs[c].budget, cfgs[c].blocks);
    di_spec_stats ss;
    di_engine_get_spec_stats(e, &ss);
    /* the confidence schedule may find that no draft pays for its step on this CPU (then it drafts
     * nothing, which is its job); fixed schedules must draft and get drafts accepted */
    CHECKF(ss.method == 1 && (c == 0 || (ss.drafted_tokens > 0 && ss.accepted_tokens > 0)), "%s: drafted %lld accepted %lld",
           cfgs[c].spec, (long long)ss.drafted_tokens, (long long)ss.accepted_tokens);
    /* on CUDA (device steps and proposals in the step on, the defaults) the fixed schedules' greedy
     * steps propose inside their CUDA graph, and every block's device-found anchor is the host's */
    CHECKF(ss.proposals_missed == 0, "%s: %lld proposals in the step with an anchor the host did not confirm", cfgs[c].spec,
           (long long)ss.proposals_missed);
    if (c > 0 && on_cuda_graph_proposals())
      CHECKF(ss.proposals_in_step > 0, "%s: no step proposed inside its CUDA graph", cfgs[c].spec);
    /* calibration counts the drafts verification reached (a draft after a rejected one is not judged) */
    int64_t cal = 0, cal_acc = 0;
    for (int b = 0; b < 10; b++) {
      cal += ss.calib_count[b];
      cal_acc += ss.calib_accepted[b];
    }
    CHECKF(cal <= ss.drafted_tokens && cal_acc == ss.accepted_tokens, "calibration: %lld judged (of %lld drafted), %lld accepted "
           "(of %lld)", (long long)cal, (long long)ss.drafted_tokens, (long long)cal_acc, (long long)ss.accepted_tokens);
    printf("%s budget %d blocks %d: %lld drafted, %lld accepted (%.1f%%), mean accepted length %.2f, ECE %.3f, %lld proposals "
           "in the step\n", cfgs[c].spec, cfgs[c].budget, cfgs[c].blocks, (long long)ss.drafted_tokens,
           (long long)ss.accepted_tokens, 100 * ss.acceptance_rate, ss.mean_accepted_length, ss.calibration_error,
           (long long)ss.proposals_in_step);
    di_engine_free(e);
  }
}

/* upper quantile of chi-square(dof) at level alpha (Wilson-Hilferty), z for alpha = 0.001 */
static double chi2_crit(int dof) {
  const double z = 3.0902, k = dof;
  double t = 1 - 2 / (9 * k) + z * sqrt(2 / (9 * k));
  return k * t * t * t;
}

/* two-sample homogeneity: counts a[], b[] over V ids; categories with expected count >= 10 in both
 * samples, the rest pooled into one */
static void chi2_same(const int *a, const int *b, int V, int na, int nb, const char *what) {
  double stat = 0;
  int cats = 0;
  double pa = 0, pb = 0;
  for (int v = 0; v <= V; v++) {
    double ca, cb;
    if (v < V) {
      double tot = a[v] + b[v];
      if (tot * na / (na + nb) < 10 || tot * nb / (na + nb) < 10) { pa += a[v]; pb += b[v]; continue; }
      ca = a[v]; cb = b[v];
    } else {
      ca = pa; cb = pb;
      if (ca + cb == 0) break;
    }
    double tot = ca + cb, ea = tot * na / (na + nb), eb = tot * nb / (na + nb);
    stat += (ca - ea) * (ca - ea) / ea + (cb - eb) * (cb - eb) / eb;
    cats++;
  }
  double crit = cats > 1 ? chi2_crit(cats - 1) : 0;
  printf("%s: chi-square %.2f over %d categories (critical %.2f at level 0.001)\n", what, stat, cats, crit);
  CHECKF(cats >= 3, "%s: only %d categories", what, cats);
  CHECKF(stat < crit, "%s: chi-square %.2f >= %.2f: the distributions differ", what, stat, crit);
}

/* proc: every request with top-k 40, top-p 0.9, min-p 0.02, repetition / frequency / presence penalties
 * and a logit bias, which rejection sampling must apply to the draft distribution q as the sampler
 * applies them to the target's p (the penalties counting the drafts before each position) */
static void sampling_distribution(int proc) {
  enum { N = 600, V = 8192 };
  static rq_t a[N], b[N];
  const char *tag = proc ? "T=1 processed" : "T=1";
  for (int k = 0; k < N; k++) {
    snprintf(a[k].text, sizeof a[k].text, "The history of the city");
    snprintf(b[k].text, sizeof b[k].text, "The history of the city");
  }
  g_proc = proc;
  di_engine *e = make_engine(NULL, 0, 0, 0);
  /* processed: 4 tokens, so the 2nd request step verifies two drafts (the second one's q counts the first) */
  const int T = proc ? 4 : 3;
  run(e, a, N, 1.0f, T, 1000, "plain T=1");
  di_engine_free(e);
  e = make_engine("{\"method\": \"dspark\", \"num_speculative_tokens\": 5, \"schedule\": \"fixed\"}", 0, 0, 0);
  if (!e) { g_proc = 0; return; }
  run(e, b, N, 1.0f, T, 5000, "dspark T=1");
  g_proc = 0;
  di_spec_stats ss;
  di_engine_get_spec_stats(e, &ss);
  printf("%s: %lld drafted, %lld accepted\n", tag, (long long)ss.drafted_tokens, (long long)ss.accepted_tokens);
  CHECKF(ss.accepted_tokens > N / 4, "%s: only %lld drafts accepted (the test needs accepted drafts to mean anything)", tag,
         (long long)ss.accepted_tokens);
  di_engine_free(e);
  static int ca[V], cb[V];
  if (!proc) { /* the processed run's logit bias: on the two tokens most often 2nd here (a bias that matters) */
    memset(ca, 0, sizeof ca);
    for (int k = 0; k < N; k++)
      if (a[k].out.n > 1) ca[a[k].out.tok[1]]++;
    for (int r = 0; r < 2; r++) {
      int best = 0;
      for (int v = 1; v < V; v++)
        if (ca[v] > ca[best]) best = v;
      g_bias_ids[r] = best;
      ca[best] = -1;
    }
  }
  for (int pos = 1; pos < T; pos++) {
    memset(ca, 0, sizeof ca);
    memset(cb, 0, sizeof cb);
    for (int k = 0; k < N; k++) {
      if (a[k].out.n > pos) ca[a[k].out.tok[pos]]++;
      if (b[k].out.n > pos) cb[b[k].out.tok[pos]]++;
    }
    char what[64];
    snprintf(what, sizeof what, "%s token %d", tag, pos + 1);
    chi2_same(ca, cb, V, N, N, what);
  }
}

/* constrained requests: 0 json_object, 1 a JSON schema, 2 a regex; greedy and T = 0.8 (seeded) */
static void grammar_drafts(const char *fixed_spec, const char *sched_spec, const char *what) {
  enum { N = 12, T = 40 };
  static rq_t ref[N], got[N];
  static const char *schema = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                              "\"age\": {\"type\": \"integer\"}}, \"required\": [\"name\", \"age\"]}";
  make_prompts(ref, N);
  const char *specs[] = {NULL, fixed_spec, sched_spec};
  for (int c = 0; c < (UNDER_ASAN || !sched_spec ? 2 : 3); c++) {
    rq_t *rq = c == 0 ? ref : got;
    if (c > 0) memcpy(got, ref, sizeof got);
    di_engine *e = make_engine(specs[c], 0, 0, 0);
    if (!e) return;
    for (int k = 0; k < N; k++) {
      di_request_params p = test_params(rq[k].text, NULL, 0, T, k % 2 ? 0.8f : 0, 100 + (uint64_t)k);
      p.ignore_eos = 0;
      if (k % 3 == 0) p.json_object = 1;
      if (k % 3 == 1) p.json_schema = schema;
      if (k % 3 == 2) p.regex = "[a-z]+( [a-z]+)*\\.";
      test_add(e, &p, &rq[k].out, "grammar request");
    }
    test_run_to_end(e, &rq[0].out, sizeof *rq, N, 100000, NULL, NULL, "grammar");
    if (c > 0) {
      for (int k = 0; k < N; k++)
        CHECKF(test_got_equal(&got[k].out, &ref[k].out),
               "%s %s: constrained request %d (%s, T %s) differs from plain constrained decoding", what, specs[c], k,
               k % 3 == 0 ? "json_object" : k % 3 == 1 ? "json_schema" : "regex", k % 2 ? "0.8" : "0");
      di_spec_stats ss;
      di_engine_get_spec_stats(e, &ss);
      CHECKF(c == 2 || (ss.drafted_tokens > 0 && ss.accepted_tokens > 0), "%s %s under grammars: drafted %lld accepted %lld",
             what, specs[c], (long long)ss.drafted_tokens, (long long)ss.accepted_tokens);
      printf("grammars, %s %s: %lld drafted, %lld accepted, mean accepted length %.2f\n", what, specs[c], (long long)ss.drafted_tokens,
             (long long)ss.accepted_tokens, ss.mean_accepted_length);
    }
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0, "grammar run: %lld KV blocks leaked", (long long)st.kv_blocks_used);
    CHECKF(di_engine_check(e) == DI_OK, "%s", di_last_error());
    di_engine_free(e);
  }
}

/* a grammar that completes under ignore_eos: plain decoding ends the request at the grammar's end (the
 * token that completes it is the last); verification must not accept a token past it (the bonus row
 * after an accepted final draft). Short regexes, greedy and seeded T = 0.8, a fixed schedule so that
 * drafts reach the grammar's end. */
static void grammar_end_ignore_eos(const char *spec, const char *what) {
  enum { NMAX = 12, T = 24 };
  const int N = UNDER_ASAN ? 6 : NMAX;
  static rq_t ref[NMAX], got[NMAX];
  static const char *res[] = {"[a-z]+\\.", "(yes|no)", "[a-z]+ [a-z]+"};
  make_prompts(ref, N);
  int ended = 0;
  for (int c = 0; c < 2; c++) {
    rq_t *rq = c == 0 ? ref : got;
    if (c > 0) memcpy(got, ref, sizeof got);
    di_engine *e = make_engine(c ? spec : NULL, 0, 0, 0);
    if (!e) return;
    for (int k = 0; k < N; k++) {
      di_request_params p = test_params(rq[k].text, NULL, 0, T, k % 2 ? 0.8f : 0, 300 + (uint64_t)k);
      p.regex = res[k % 3];
      test_add(e, &p, &rq[k].out, what);
    }
    test_run_to_end(e, &rq[0].out, sizeof *rq, N, 100000, NULL, NULL, what);
    if (c == 0)
      for (int k = 0; k < N; k++) ended += ref[k].out.n < T; /* the grammar ended it */
    if (c > 0) {
      for (int k = 0; k < N; k++)
        CHECKF(test_got_equal(&got[k].out, &ref[k].out),
               "%s: regex %s request %d (T %s, ignore_eos): %d tokens (finish %d) vs plain decoding's %d (finish %d)", what,
               res[k % 3], k, k % 2 ? "0.8" : "0", got[k].out.n, got[k].out.finish, ref[k].out.n, ref[k].out.finish);
      di_spec_stats ss;
      di_engine_get_spec_stats(e, &ss);
      CHECKF(ss.drafted_tokens > 0 && ss.accepted_tokens > 0, "%s: drafted %lld accepted %lld", what,
             (long long)ss.drafted_tokens, (long long)ss.accepted_tokens);
      printf("grammar end under ignore_eos, %s: %d of %d requests ended by their grammar; %lld drafted, %lld accepted\n", what,
             ended, N, (long long)ss.drafted_tokens, (long long)ss.accepted_tokens);
    }
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0, "%s: %lld KV blocks leaked", what, (long long)st.kv_blocks_used);
    CHECKF(di_engine_check(e) == DI_OK, "%s", di_last_error());
    di_engine_free(e);
  }
  CHECKF(ended >= N / 2, "%s: only %d of %d plain requests ended by their grammar (the test needs grammar ends)", what, ended, N);
}

/* runs one request per entry of rq alone in its own pass (the same engine); its outputs into rq */
static void run_alone(di_engine *e, rq_t *rq, int n, float temperature, int max_tokens, uint64_t seed0, const char *what) {
  for (int k = 0; k < n; k++) run(e, rq + k, 1, temperature, max_tokens, seed0 + (uint64_t)k, what);
}

/* The drafter's cache is its own KV group (blocks of 16 tokens):
 *  - the pool: num_kv_blocks N gives the target N blocks and the drafter 4 N (as many tokens);
 *  - prefix hits take the drafter's cached blocks too: a long prompt run again hits >= 128 tokens, and
 *    its drafts (fixed k = 5, greedy) are accepted as often as the first time with the same summed
 *    confidences (relative 1e-4; the CPU's steps are batch-invariant, so there the drafter's context is
 *    the same bits whether computed or cached): drafter blocks given out fresh instead of the cached
 *    ones (tried: a mutation of kv_manager.c) change the sum by 5e-3;
 *  - batch == alone with drafts: 8 requests together equal each alone (greedy, and seeded T = 0.8 under
 *    acceptance "exact", which holds whatever the schedule);
 *  - accounting: 16 requests of 60 tokens through a 4-block pool (preemption) leak no block of either group. */
static void drafter_group(void) {
  const char *fixed = "{\"method\": \"dspark\", \"num_speculative_tokens\": 5, \"schedule\": \"fixed\"}";
  const char *exact = "{\"method\": \"dspark\", \"num_speculative_tokens\": 5, \"schedule\": \"fixed\", \"acceptance\": \"exact\"}";
  di_engine *e = make_engine(fixed, 0, 10, 0);
  if (!e) return;
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  CHECKF(st.kv_blocks_total == 10 + 40, "num_kv_blocks 10 with the drafter's group: %lld blocks in all (10 + 40 expected)",
         (long long)st.kv_blocks_total);
  CHECKF(strstr(di_engine_kv_summary(e), "drafter blocks of 16 tokens") != NULL, "KV summary: %s", di_engine_kv_summary(e));
  di_engine_free(e);

  /* prefix hits */
  static rq_t a[2];
  snprintf(a[0].text, sizeof a[0].text, "%s", "The history of the city is the history of its river, its bridges and its ");
  char long_prompt[2048] = "";
  for (int i = 0; i < 12; i++) strcat(long_prompt, a[0].text);
  e = make_engine(fixed, 0, 0, 0);
  if (!e) return;
  /* pass 0: the long prompt; pass 1: another prompt, which takes free blocks (were the drafter's blocks of
   * pass 0 not kept for the prefix, they would be the first handed out and overwritten here); pass 2: the
   * long prompt again */
  int64_t acc[3], acc_before = 0;
  double conf[3], conf_before = 0; /* the drafts' predicted confidences summed: any change in the drafter's context shows */
  int32_t first[MAXT];
  for (int pass = 0; pass < 3; pass++) {
    di_request_params p;
    di_request_params_default(&p);
    p.prompt = pass == 1 ? "Once upon a time there was a river that ran through the old city, past the bridges and the" : long_prompt;
    p.max_tokens = 32;
    p.temperature = 0;
    p.ignore_eos = 1;
    uint64_t id;
    CHECKF(di_engine_add_request(e, &p, &id) == DI_OK, "%s", di_last_error());
    int n_got = 0, cached = -1;
    int32_t got[MAXT + 8];
    while (di_engine_has_unfinished(e)) {
      di_step_output *out;
      if (di_engine_step(e, &out) != DI_OK) { CHECKF(0, "prefix pass %d: %s", pass, di_last_error()); break; }
      for (int i = 0; i < out->n; i++) {
        for (int t = 0; t < out->seqs[i].n_new_tokens && n_got < MAXT + 8; t++) got[n_got++] = out->seqs[i].new_tokens[t];
        cached = out->seqs[i].n_cached_tokens;
      }
    }
    di_spec_stats ss;
    di_engine_get_spec_stats(e, &ss);
    double csum = 0;
    for (int b = 0; b < 10; b++) csum += ss.calib_predicted[b];
    acc[pass] = ss.accepted_tokens - acc_before;
    conf[pass] = csum - conf_before;
    acc_before = ss.accepted_tokens;
    conf_before = csum;
    CHECKF(n_got == 32, "prefix pass %d: %d tokens", pass, n_got);
    if (pass == 1) continue;
    if (pass == 0) memcpy(first, got, sizeof(int32_t) * 32);
    else CHECKF(memcmp(first, got, sizeof(int32_t) * 32) == 0, "prefix hit: output differs from the first run");
    CHECKF(pass == 0 ? cached == 0 : cached >= 128, "prefix pass %d: %d tokens cached", pass, cached);
  }
  acc[1] = acc[2];
  conf[1] = conf[2];
  CHECKF(acc[0] > 0 && acc[0] == acc[1] && fabs(conf[0] - conf[1]) <= 1e-4 * fabs(conf[0]),
         "prefix hit: drafts accepted %lld the first time, %lld after the hit; confidences summed %.9g vs %.9g (the drafter's "
         "cached blocks must hold what the first run wrote)", (long long)acc[0], (long long)acc[1], conf[0], conf[1]);
  printf("drafter group, prefix hit: %lld drafts accepted in both runs, their confidences summed %.9g / %.9g\n",
         (long long)acc[0], conf[0], conf[1]);
  di_engine_get_stats(e, &st);
  CHECKF(st.kv_blocks_used == 0 && di_engine_check(e) == DI_OK, "prefix runs: %lld blocks used", (long long)st.kv_blocks_used);
  di_engine_free(e);

  /* batch == alone */
  enum { N = 8 };
  static rq_t batch[N], alone[N];
  for (int t = 0; t < (UNDER_ASAN ? 0 : 2); t++) { /* under ASan: the batch and alone paths run elsewhere here */
    make_prompts(batch, N);
    make_prompts(alone, N);
    const char *spec = t ? exact : fixed;
    const float temp = t ? 0.8f : -1;
    e = make_engine(spec, 0, 0, 0);
    if (!e) return;
    run(e, batch, N, temp, 24, 40, t ? "batch, exact T=0.8" : "batch, greedy");
    run_alone(e, alone, N, temp, 24, 40, t ? "alone, exact T=0.8" : "alone, greedy");
    for (int k = 0; k < N; k++)
      CHECKF(batch[k].out.n == alone[k].out.n &&
                 memcmp(batch[k].out.tok, alone[k].out.tok, sizeof(int32_t) * (size_t)alone[k].out.n) == 0,
             "%s: request %d in a batch differs from alone", t ? "exact T=0.8" : "greedy", k);
    di_spec_stats ss;
    di_engine_get_spec_stats(e, &ss);
    CHECKF(ss.accepted_tokens > 0, "batch == alone (%s): no draft accepted", spec);
    di_engine_free(e);
  }

  /* accounting through preemption */
  enum { M = 16 };
  static rq_t many[M];
  make_prompts(many, M);
  e = make_engine(fixed, 0, 4, 0);
  if (!e) return;
  run(e, many, M, 0.8f, 60, 7, "16 requests, 4-block pool"); /* checks: no block used after, invariants */
  di_engine_get_stats(e, &st);
  CHECKF(st.preemptions > 0, "16 requests of 60 tokens through a 4-block pool: no preemption");
  CHECKF(st.kv_blocks_free == st.kv_blocks_total, "%lld of %lld blocks free after 16 requests", (long long)st.kv_blocks_free,
         (long long)st.kv_blocks_total);
  printf("drafter group, 16 requests through 4 + 16 blocks: %lld preemptions, no block leaked\n", (long long)st.preemptions);
  di_engine_free(e);
}

static void structured_and_aborts(void) {
  enum { N = 16 };
  static rq_t rq[N];
  make_prompts(rq, N);
  for (int with = 0; with < 2; with++) {
    di_engine *e = make_engine(with ? "{\"method\": \"dspark\"}" : NULL, 0, 0, 0);
    if (!e) return;
    uint64_t ids[N];
    for (int k = 0; k < N; k++) {
      di_request_params p;
      di_request_params_default(&p);
      p.prompt = rq[k].text;
      p.max_tokens = 40;
      p.temperature = k % 2 ? 0.8f : 0;
      p.has_seed = 1;
      p.seed = (uint64_t)k;
      p.ignore_eos = 1;
      p.json_object = k == 3;
      CHECK(di_engine_add_request(e, &p, &ids[k]) == DI_OK);
    }
    int steps = 0;
    while (di_engine_has_unfinished(e) && steps < 10000) {
      di_step_output *out;
      if (di_engine_step(e, &out) != DI_OK) { CHECKF(0, "step: %s", di_last_error()); break; }
      if (++steps == 4)
        for (int k = 0; k < N; k += 3) CHECK(di_engine_abort(e, ids[k]) == DI_OK || 1);
    }
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0, "aborts (%s): %lld KV blocks leaked", with ? "dspark" : "plain", (long long)st.kv_blocks_used);
    CHECKF(di_engine_check(e) == DI_OK, "%s", di_last_error());
    di_engine_free(e);
  }
}

static void bad_configs(void) {
  di_engine *e = make_engine(NULL, 0, 0, 0);
  if (!e) return;
  CHECK_ERR(di_engine_set_speculative_config(e, g_model, "{\"method\": \"eagle\"}"), "method");
  CHECK_ERR(di_engine_set_speculative_config(e, g_model, "{\"method\": \"dspark\", \"num_speculative_tokens\": 9}"), "[0, 5]");
  CHECK_ERR(di_engine_set_speculative_config(e, g_model, "{\"method\": \"dspark\", \"acceptance\": \"maybe\"}"), "acceptance");
  CHECK_ERR(di_engine_set_speculative_config(e, g_model, "{\"method\": \"dspark\", \"model\": \"/nonexistent\"}"), "/nonexistent");
  CHECK_ERR(di_engine_set_speculative_config(e, g_model, "{\"method\": \"dspark\", \"k\": 2}"), "unknown key");
  CHECK_ERR(di_engine_set_speculative_config(e, g_model, "{\"method\": \"mtp\", \"num_speculative_tokens\": 2, "
                                                         "\"acceptance\": \"rejection\"}"), "exact");
  CHECK_ERR(di_engine_set_speculative_config(e, g_model, "[1]"), "object");
  di_engine_free(e);
}

int main(void) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.threads = 2;
  mo.quiet = 1;
  if (di_model_load(test_path("models/default"), &mo, &g_model) != DI_OK) {
    CHECKF(0, "%s", di_last_error());
    return test_finish("test_dspark");
  }
  greedy_identity();
  if (!UNDER_ASAN) sampling_distribution(0);
  if (!UNDER_ASAN) sampling_distribution(1);
  drafter_group();
  grammar_drafts("{\"method\": \"dspark\", \"schedule\": \"fixed\"}", "{\"method\": \"dspark\"}", "dspark");
  grammar_end_ignore_eos("{\"method\": \"dspark\", \"schedule\": \"fixed\"}", "dspark");
  /* the MTP layer drafts under grammars too (exact match, as it always verifies) */
  grammar_drafts("{\"method\": \"mtp\", \"num_speculative_tokens\": 3, \"min_confidence\": 0}", NULL, "mtp");
  grammar_end_ignore_eos("{\"method\": \"mtp\", \"num_speculative_tokens\": 3, \"min_confidence\": 0}", "mtp");
  structured_and_aborts();
  bad_configs();
  di_model_free(g_model);
  return test_finish("test_dspark");
}
