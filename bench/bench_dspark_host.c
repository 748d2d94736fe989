/* The engine's host time per step with DSpark against plain decoding, on a backend that only sleeps (not a
 * test; the CUDA path's host side without a GPU):
 *
 *   bench_dspark_host [run] [SEQS] [STEPS | TOKENS] [SLEEP_MS] [PER_TOKEN_US] [PROPOSAL_US]
 *   bench_dspark_host model MODEL_DIR [cpu|cuda] [SEQS,SEQS..] [STEPS]   (see bench_model below)
 *
 * SEQS running sequences (default 64) decode STEPS steps (default 400, after 100 of warm-up), or with
 * `run` bench/bench_dspark.py's shape (a warm-up generate of 8 tokens, then TOKENS tokens each, default
 * 128, timed), against a backend that samples "on the device" (tokens from a hash, with device token
 * feedback, as the CUDA backend) and takes SLEEP_MS + PER_TOKEN_US x tokens (+ PROPOSAL_US when the
 * step carries a proposal) a step (defaults 0.25 ms + 2 us + 300 us: about the H200's batch-64 step of
 * the shipped model; steps queue as on a stream). Two engines: plain decoding, and DSpark's confidence
 * schedule over a drafter that plays the CUDA one (context fed "on the device", proposals inside the
 * step: anchors found from the step's samples by the device's rule, drafts of low confidence, so that
 * after its probe and exploration the schedule verifies nothing and pauses, as on the shipped model).
 * Prints host ms per step (the engine's host_time_s: scheduling, bookkeeping, drafting, outputs), wall
 * ms per step, tokens/s and the step kinds. `valgrind --tool=callgrind --instr-atstart=no` counts the
 * timed steps only (BENCH_ONLY=plain or dspark: that engine, once). */
#include "deepinfer.h"
#include "engine/drafter.h"
#include "engine/engine_internal.h"
#include "engine/spec_decode.h"
#include "engine/spec_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(DI_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h> /* under callgrind --instr-atstart=no: only the measured steps are counted */
#endif
#endif
#ifndef CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

#define VOCAB 8192
#define BLOCK 5

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct sleep_dev {
  di_backend base;
  double sleep_s, per_token_s, prop_s, t_end; /* t_end: when the last submitted step is done (steps queue) */
  di_batch last;          /* the submitted batch (its arrays live until the engine builds the next) */
  int32_t *fb, *sampled;  /* feedback tokens; the last step's samples by row */
  int n_fb, n_sampled, cap;
  int64_t proposals;      /* steps that carried a proposal */
} sleep_dev;

static sleep_dev *g_dev;

static int sd_groups(di_backend *b, di_kv_group_info *g, int cap) {
  (void)b;
  if (cap < 1) return 0;
  g[0] = (di_kv_group_info){.n_layers = 4, .bytes_per_token = 4096, .tokens_per_entry = 1, .window = 0};
  return 1;
}
static di_status sd_alloc(di_backend *b, int64_t n) { (void)b; (void)n; return DI_OK; }
static void sd_sleep(sleep_dev *s) {
  double until = s->t_end;
  for (double t = now_s(); t < until; t = now_s()) {
    struct timespec ts = {0, (long)((until - t) * 1e9)};
    nanosleep(&ts, NULL);
  }
}
static di_status sd_submit(di_backend *b, const di_batch *bt) {
  sleep_dev *s = (sleep_dev *)b;
  const double t = now_s(); /* a queued step starts when the one before it ends */
  s->t_end = (s->t_end > t ? s->t_end : t) + s->sleep_s + s->per_token_s * bt->n_tokens +
             (bt->propose_row ? s->prop_s : 0);
  s->last = *bt;
  s->proposals += bt->propose_row != NULL;
  return DI_OK;
}
static di_status sd_wait(di_backend *b, float *logits, float *hidden) {
  (void)logits; (void)hidden;
  sd_sleep((sleep_dev *)b);
  return DI_OK;
}
static void keep(sleep_dev *s, const int32_t *tok, int n) {
  if (n > s->cap) {
    s->cap = 2 * n;
    s->fb = realloc(s->fb, sizeof *s->fb * (size_t)s->cap);
    s->sampled = realloc(s->sampled, sizeof *s->sampled * (size_t)s->cap);
  }
  memcpy(s->sampled, tok, sizeof *tok * (size_t)n);
  s->n_sampled = n;
}
static void draw(const di_sample_row *rows, int n, int32_t *tokens) {
  for (int i = 0; i < n; i++) tokens[i] = 3 + (int32_t)((rows[i].counter * 7919 + (uint64_t)i * 31) % (VOCAB - 3));
}
static di_status sd_sample(di_backend *b, const di_sample_row *rows, int n, int32_t *tokens) {
  sleep_dev *s = (sleep_dev *)b;
  sd_sleep(s);
  draw(rows, n, tokens);
  keep(s, tokens, n);
  return DI_OK;
}
static di_status sd_sample_async(di_backend *b, const di_sample_row *rows, int n) {
  sleep_dev *s = (sleep_dev *)b;
  int32_t *tmp = malloc(sizeof *tmp * (size_t)(n > 0 ? n : 1));
  if (!tmp) return di_error_set(DI_ERR_OOM, "bench: out of memory");
  draw(rows, n, tmp);
  keep(s, tmp, n);
  memcpy(s->fb, tmp, sizeof *tmp * (size_t)n);
  s->n_fb = n;
  free(tmp);
  return DI_OK;
}
static di_status sd_sample_fetch(di_backend *b, int32_t *tokens) {
  sleep_dev *s = (sleep_dev *)b;
  sd_sleep(s); /* the step the tokens came from is done before they are */
  memcpy(tokens, s->fb, sizeof *tokens * (size_t)s->n_fb);
  return DI_OK;
}
static void sd_destroy(di_backend *b) {
  sleep_dev *s = (sleep_dev *)b;
  free(s->fb);
  free(s->sampled);
  free(s);
}
static const di_backend_ops SD_OPS = {.name = "sleep-device", .kv_groups = sd_groups, .kv_alloc = sd_alloc,
                                      .submit = sd_submit, .wait = sd_wait, .sample = sd_sample,
                                      .sample_async = sd_sample_async, .sample_fetch = sd_sample_fetch,
                                      .destroy = sd_destroy};

/* the drafter: context "on the device", proposals inside the step (graph_drafts by the device's rule) */
static di_status d_kv_alloc(void *c, int64_t n) { (void)c; (void)n; return DI_OK; }
static di_status d_context(void *c, int n, const float *f, const int32_t *p, const int32_t *q, const di_batch_seq *s) {
  (void)c; (void)n; (void)f; (void)p; (void)q; (void)s;
  return DI_OK;
}
static di_status d_propose(void *c, int n, const int32_t *t, const int32_t *p, const di_batch_seq *s, const uint8_t *w,
                           float *h, float *lg) {
  (void)c; (void)n; (void)t; (void)p; (void)s; (void)w; (void)h; (void)lg;
  return DI_OK;
}
static di_status d_draft_greedy(void *c, int n, const int32_t *a, const int32_t *cap, int limit, int32_t *tok, float *conf) {
  (void)c; (void)limit;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < BLOCK; j++) {
      tok[i * BLOCK + j] = j < cap[i] ? (a[i] + j + 1) % VOCAB : -1;
      conf[i * BLOCK + j] = 0.05f;
    }
  return DI_OK;
}
static di_status d_context_on_device(void *c, int rows) { (void)c; (void)rows; return DI_OK; }
static di_status d_graph_on(void *c, int limit) { (void)c; (void)limit; return DI_OK; }
static di_status d_graph_drafts(void *c, int n, int *made, int32_t *anchor, int32_t *tok, float *conf) {
  (void)c;
  const sleep_dev *s = g_dev;
  const di_batch *bt = &s->last;
  *made = 0;
  if (!bt->propose_row || n != bt->n_seqs || s->n_sampled != bt->n_tokens) return DI_OK;
  for (int q = 0; q < n; q++) {
    anchor[2 * q] = anchor[2 * q + 1] = -1;
    for (int j = 0; j < BLOCK; j++) tok[q * BLOCK + j] = -1, conf[q * BLOCK + j] = 0;
    const int f = bt->propose_row[q];
    if (f < 0) continue;
    int last = f, a = 0;
    while (last + 1 < bt->n_tokens && bt->seq_of[last + 1] == q) last++;
    while (f + a < last && s->sampled[f + a] == bt->tokens[f + a + 1]) a++;
    anchor[2 * q] = s->sampled[f + a];
    anchor[2 * q + 1] = bt->positions[f + a] + 1;
    for (int j = 0; j < bt->propose_cap[q] && j < BLOCK; j++) {
      tok[q * BLOCK + j] = (anchor[2 * q] + j + 1) % VOCAB;
      conf[q * BLOCK + j] = 0.05f;
    }
  }
  *made = 1;
  return DI_OK;
}
static void d_markov(void *c, int32_t prev, float *lg) { (void)c; (void)prev; (void)lg; }
static float d_conf(void *c, const float *h, int32_t prev) { (void)c; (void)h; (void)prev; return 0.05f; }
static void d_destroy(void *c) { (void)c; }

typedef struct bench_cfg {
  int seqs, steps, run_tokens; /* run_tokens > 0: bench_dspark.py's shape instead of steady steps */
  double sleep_ms, per_token_us, prop_us;
} bench_cfg;

static void add_all(di_engine *e, int seqs, int max_tokens) {
  int32_t prompt[128];
  for (int k = 0; k < seqs; k++) {
    for (int i = 0; i < 128; i++) prompt[i] = 3 + (k * 131 + i * 7) % (VOCAB - 3);
    di_request_params p;
    di_request_params_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = 8 + k % 8; /* short prompts: decoding steps dominate */
    p.max_tokens = max_tokens;
    p.temperature = 0;
    p.ignore_eos = 1;
    uint64_t id;
    if (di_engine_add_request(e, &p, &id) != DI_OK) fprintf(stderr, "bench: %s\n", di_last_error());
  }
}

static int step_until_done(di_engine *e) {
  di_step_output *out;
  while (di_engine_has_unfinished(e))
    if (di_engine_step(e, &out) != DI_OK) {
      fprintf(stderr, "bench: step: %s\n", di_last_error());
      return 1;
    }
  return 0;
}

static int run(int dspark, const bench_cfg *c) {
  sleep_dev *sd = calloc(1, sizeof *sd);
  if (!sd) return 1;
  sd->base.ops = &SD_OPS;
  sd->sleep_s = c->sleep_ms * 1e-3;
  sd->per_token_s = c->per_token_us * 1e-6;
  sd->prop_s = c->prop_us * 1e-6;
  g_dev = sd;
  static const int32_t eos[1] = {1};
  di_engine_core_config cfg = {.backend = &sd->base, .vocab_size = VOCAB, .vocab_limit = VOCAB, .max_context = 8192,
                               .eos_ids = eos, .n_eos = 1};
  di_engine_options o;
  di_engine_options_default(&o);
  o.max_num_seqs = c->seqs;
  o.max_num_batched_tokens = 2048;
  o.async_scheduling = 1;
  o.num_kv_blocks = (int64_t)c->seqs * ((c->run_tokens > c->steps + 150 ? c->run_tokens : c->steps + 150) / 64 + 3);
  di_engine *e;
  if (di_engine_core_create(&cfg, &o, &e) != DI_OK) {
    fprintf(stderr, "bench: %s\n", di_last_error());
    sd_destroy(&sd->base);
    return 1;
  }
  if (dspark) {
    di_drafter_ops d = {.ctx = NULL, .block_size = BLOCK, .hidden = 8, .feat_dim = 8, .cache_bytes_per_token = 1024,
                        .kv_alloc = d_kv_alloc, .context = d_context, .propose = d_propose, .draft_greedy = d_draft_greedy,
                        .context_on_device = d_context_on_device, .graph_on = d_graph_on, .graph_drafts = d_graph_drafts,
                        .markov = d_markov, .confidence = d_conf, .destroy = d_destroy};
    if (di_engine_set_dspark(e, &d, BLOCK, 0, 0) != DI_OK) {
      fprintf(stderr, "bench: %s\n", di_last_error());
      di_engine_free(e);
      sd_destroy(&sd->base);
      return 1;
    }
  }
  int rc = 0;
  di_engine_stats s0, s1;
  double t0, wall;
  int64_t p0, f0, n_steps;
  if (c->run_tokens > 0) { /* bench_dspark.py: a warm-up generate of 8 tokens, then the timed one */
    add_all(e, c->seqs, 8);
    rc |= step_until_done(e);
    di_engine_get_stats(e, &s0);
    p0 = sd->proposals;
    f0 = e->feedback_steps;
    add_all(e, c->seqs, c->run_tokens);
    t0 = now_s();
    CALLGRIND_START_INSTRUMENTATION;
    rc |= step_until_done(e);
    CALLGRIND_STOP_INSTRUMENTATION;
    wall = now_s() - t0;
  } else {
    add_all(e, c->seqs, 100 + c->steps + 50);
    di_step_output *out;
    for (int i = 0; i < 100; i++) di_engine_step(e, &out);
    di_engine_get_stats(e, &s0);
    p0 = sd->proposals;
    f0 = e->feedback_steps;
    t0 = now_s();
    CALLGRIND_START_INSTRUMENTATION;
    for (int i = 0; i < c->steps && !rc; i++)
      if (di_engine_step(e, &out) != DI_OK) {
        fprintf(stderr, "bench: step: %s\n", di_last_error());
        rc = 1;
      }
    CALLGRIND_STOP_INSTRUMENTATION;
    wall = now_s() - t0;
  }
  di_engine_get_stats(e, &s1);
  di_spec_stats ss;
  di_engine_get_spec_stats(e, &ss);
  n_steps = s1.steps - s0.steps > 0 ? s1.steps - s0.steps : 1;
  const int64_t toks = s1.generated_tokens - s0.generated_tokens;
  printf("  %-18s host %.4f ms/step, wall %.4f ms/step, %.0f tok/s, %lld steps (%lld with token feedback, %lld with a "
         "proposal), %lld verify steps, %lld drafted\n", dspark ? "dspark confidence" : "plain",
         (s1.host_time_s - s0.host_time_s) * 1e3 / (double)n_steps, wall * 1e3 / (double)n_steps, (double)toks / wall,
         (long long)n_steps, (long long)(e->feedback_steps - f0), (long long)(sd->proposals - p0),
         (long long)ss.verify_steps, (long long)ss.drafted_tokens);
  di_engine_free(e);
  sd_destroy(&sd->base);
  return rc;
}

/* ---- the same over a real backend: `bench_dspark_host model MODEL_DIR [cpu|cuda] [SEQS,SEQS..] [STEPS]` ----
 * The engine on the model (and its DSpark drafter, MODEL_DIR/dspark), plain against DSpark's confidence
 * schedule (online, and from the startup profile), then plain again (the machine's noise), SEQS running sequences (default 16,64,256) decoding
 * STEPS timed steps (default 300) after 100; the backend's ops are timed through a wrapper, so the
 * host's time per step is split into the backend calls (submit: the input block, its upload, the graph
 * launch, feature-log flushes; sample_async; sample_fetch / wait: blocked on the device) and the engine's
 * own part; the spread of the steps' wall times (median, p90, max, and what the steps slower than twice the
 * median cost above it, per step) and, on CUDA, the graphs captured and the steps run eagerly meanwhile; for
 * DSpark the schedule's looks (how many had their full cost measured, the last one's cost, the pause left
 * and its length) and the context rows the host path left unfed while paused. BENCH_LOOK_EVERY=N cuts the
 * pauses to N steps (what looks cost, measured). */
typedef struct timed_backend {
  di_backend base;
  di_backend *real;
  di_backend_ops ops;
  double t[6];
  int64_t n[6];
} timed_backend;
enum { OP_SUBMIT, OP_WAIT, OP_SAMPLE, OP_ASYNC, OP_FETCH, OP_RELEASE };
static const char *const OP_NAME[6] = {"submit", "wait", "sample", "sample_async", "sample_fetch", "release"};
#define TB(b) ((timed_backend *)(b))
#define TIMED(op, call)                  \
  do {                                   \
    const double t0_ = now_s();          \
    di_status st_ = (call);              \
    TB(b)->t[op] += now_s() - t0_;       \
    TB(b)->n[op]++;                      \
    return st_;                          \
  } while (0)
static int tb_kv_groups(di_backend *b, di_kv_group_info *g, int cap) { return TB(b)->real->ops->kv_groups(TB(b)->real, g, cap); }
static di_status tb_kv_alloc(di_backend *b, int64_t n) { return TB(b)->real->ops->kv_alloc(TB(b)->real, n); }
static di_status tb_submit(di_backend *b, const di_batch *bt) { TIMED(OP_SUBMIT, TB(b)->real->ops->submit(TB(b)->real, bt)); }
static di_status tb_wait(di_backend *b, float *lg, float *h) { TIMED(OP_WAIT, TB(b)->real->ops->wait(TB(b)->real, lg, h)); }
static di_status tb_sample(di_backend *b, const di_sample_row *r, int n, int32_t *t) {
  TIMED(OP_SAMPLE, TB(b)->real->ops->sample(TB(b)->real, r, n, t));
}
static di_status tb_async(di_backend *b, const di_sample_row *r, int n) {
  TIMED(OP_ASYNC, TB(b)->real->ops->sample_async(TB(b)->real, r, n));
}
static di_status tb_fetch(di_backend *b, int32_t *t) { TIMED(OP_FETCH, TB(b)->real->ops->sample_fetch(TB(b)->real, t)); }
static void tb_release(di_backend *b, uint64_t key) {
  const double t0 = now_s();
  TB(b)->real->ops->release(TB(b)->real, key);
  TB(b)->t[OP_RELEASE] += now_s() - t0;
  TB(b)->n[OP_RELEASE]++;
}
static int tb_buckets(di_backend *b, int *t, int cap) { return TB(b)->real->ops->graph_buckets(TB(b)->real, t, cap); }

/* the engine's backend wrapped (every op the real one has, timed) */
static void wrap(timed_backend *tb, di_engine *e) {
  memset(tb, 0, sizeof *tb);
  tb->real = e->be;
  tb->base = *e->be;
  const di_backend_ops *r = e->be->ops;
  tb->ops = *r;
  tb->ops.kv_groups = r->kv_groups ? tb_kv_groups : NULL;
  tb->ops.kv_alloc = r->kv_alloc ? tb_kv_alloc : NULL;
  tb->ops.submit = tb_submit;
  tb->ops.wait = tb_wait;
  tb->ops.sample = r->sample ? tb_sample : NULL;
  tb->ops.sample_async = r->sample_async ? tb_async : NULL;
  tb->ops.sample_fetch = r->sample_fetch ? tb_fetch : NULL;
  tb->ops.release = r->release ? tb_release : NULL;
  tb->ops.graph_buckets = r->graph_buckets ? tb_buckets : NULL;
  tb->base.ops = &tb->ops;
  e->be = &tb->base;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int bench_on_model(di_model *m, const char *name, const char *spec, int seqs, int steps) {
  di_engine_options o;
  di_engine_options_default(&o);
  o.max_num_seqs = seqs;
  o.async_scheduling = 1;
  o.num_kv_blocks = (int64_t)seqs * ((steps + 200) / 64 + 3);
  di_engine *e;
  if (di_engine_create(m, &o, &e) != DI_OK) {
    fprintf(stderr, "bench: %s\n", di_last_error());
    return 1;
  }
  const double t_spec = now_s();
  if (spec && di_engine_set_speculative_config(e, m, spec) != DI_OK) {
    fprintf(stderr, "bench: %s: %s\n", spec, di_last_error());
    di_engine_free(e);
    return 1;
  }
  const double spec_s = now_s() - t_spec;
  timed_backend tb;
  wrap(&tb, e);
  const int V = di_model_vocab_size(m);
  int32_t prompt[8];
  for (int k = 0; k < seqs; k++) {
    for (int i = 0; i < 8; i++) prompt[i] = 3 + (int32_t)((k * 7919 + i * 104729) % (V - 3));
    di_request_params p;
    di_request_params_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = 8;
    p.max_tokens = 100 + steps + 50;
    p.temperature = 0;
    p.ignore_eos = 1;
    uint64_t id;
    if (di_engine_add_request(e, &p, &id) != DI_OK) fprintf(stderr, "bench: %s\n", di_last_error());
  }
  di_step_output *out;
  int rc = 0;
  for (int i = 0; i < 100 && !rc; i++) rc = di_engine_step(e, &out) != DI_OK;
  di_engine_stats s0, s1;
  di_engine_get_stats(e, &s0);
  timed_backend t0 = tb;
#if defined(DI_HAVE_CUDA)
  di_cuda_stats cs0 = {0}, cs1 = {0};
  const int cuda = strcmp(tb.real->ops->name, "cuda") == 0;
  if (cuda) di_backend_cuda_stats(tb.real, &cs0);
#endif
  double *st_ms = malloc(sizeof(double) * (size_t)(steps > 0 ? steps : 1));
  const double w0 = now_s();
  /* BENCH_LOOK_EVERY=N: pauses cut to N steps (looks every N + 1 steps: what one costs, measured) */
  const int look_every = getenv("BENCH_LOOK_EVERY") ? atoi(getenv("BENCH_LOOK_EVERY")) : 0;
  CALLGRIND_START_INSTRUMENTATION; /* (valgrind --tool=callgrind --instr-atstart=no: the timed steps only) */
  for (int i = 0; i < steps && !rc; i++) {
    if (look_every > 0 && e->spec && e->spec->pause > look_every) e->spec->pause = look_every;
    const double ts = now_s();
    rc = di_engine_step(e, &out) != DI_OK;
    if (st_ms) st_ms[i] = (now_s() - ts) * 1e3;
  }
  const double wall = now_s() - w0;
  CALLGRIND_STOP_INSTRUMENTATION;
#if defined(DI_HAVE_CUDA)
  if (cuda) di_backend_cuda_stats(tb.real, &cs1);
#endif
  /* the steps' spread: the median step, and what the steps slower than 2x the median cost above it */
  double med = 0, p90 = 0, mx = 0, slow_ms = 0;
  int n_slow = 0;
  if (st_ms && steps > 0 && !rc) {
    double *srt = malloc(sizeof(double) * (size_t)steps);
    if (srt) {
      memcpy(srt, st_ms, sizeof(double) * (size_t)steps);
      qsort(srt, (size_t)steps, sizeof *srt, cmp_double);
      med = srt[steps / 2], p90 = srt[(steps * 9) / 10], mx = srt[steps - 1];
      for (int i = 0; i < steps; i++)
        if (st_ms[i] > 2 * med) n_slow++, slow_ms += st_ms[i] - med;
      free(srt);
    }
  }
  free(st_ms);
  if (rc) fprintf(stderr, "bench: step: %s\n", di_last_error());
  di_engine_get_stats(e, &s1);
  di_spec_stats ss;
  di_engine_get_spec_stats(e, &ss);
  const double k = 1e3 / steps;
  const double host = (s1.host_time_s - s0.host_time_s) * k;
  printf("| %d | %s | %.0f | %.4f | %.4f |", seqs, name, (double)(s1.generated_tokens - s0.generated_tokens) / wall,
         wall * k, host);
  double in_ops = 0;
  for (int op = 0; op < 6; op++) {
    const double ms = (tb.t[op] - t0.t[op]) * k;
    printf(" %.4f (%lld) |", ms, (long long)(tb.n[op] - t0.n[op]));
    if (op == OP_SUBMIT || op == OP_ASYNC || op == OP_SAMPLE || op == OP_RELEASE) in_ops += ms;
  }
  printf(" %.4f | %lld / %lld | %.2f s | %.4f / %.4f / %.3f | %d, %.4f |", host - in_ops, (long long)ss.proposals_in_step,
         (long long)ss.drafted_tokens, spec ? spec_s : 0.0, med, p90, mx, n_slow, slow_ms / steps);
#if defined(DI_HAVE_CUDA)
  if (cuda) printf(" %lld / %lld |", (long long)(cs1.graph_captures - cs0.graph_captures), (long long)(cs1.steps - cs0.steps -
                                                                                                      (cs1.graph_replays - cs0.graph_replays)));
  else printf(" - |");
#else
  printf(" - |");
#endif
  /* the schedule's looks (spec_dspark.c di_spec_call_done): measured, the last one's full cost, the pause
   * running at the end; the host path's context rows left unfed while paused */
  if (e->spec) printf(" %lld, %.2f ms, %d / %d | %lld |", (long long)e->spec->looks, e->spec->look_cost_ms, e->spec->pause,
                      e->spec->pause_len, (long long)e->spec->rows_unfed);
  else printf(" - | - |");
  printf("\n");
  e->be = tb.real;
  di_engine_free(e);
  return rc;
}

static int bench_model(const char *dir, const char *accel, const char *seq_list, int steps) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.accelerator = accel;
  mo.quiet = 1;
  di_model *m;
  if (di_model_load(dir, &mo, &m) != DI_OK) {
    fprintf(stderr, "bench: %s\n", di_last_error());
    return 1;
  }
  printf("%s on %s: %d timed decoding steps after 100, greedy; ms per step; backend ops: ms per step (calls); "
         "engine = host - submit - sample_async - sample - release\n\n", dir, accel, steps);
  printf("| seqs | config | tok/s | wall | host |");
  for (int op = 0; op < 6; op++) printf(" %s |", OP_NAME[op]);
  printf(" engine | in-step proposals / drafted | spec setup | step median / p90 / max | steps > 2x median, their ms a step "
         "above it | CUDA graphs captured / eager steps | looks measured, the last one's cost, pause left / length | rows unfed |\n|");
  for (int c = 0; c < 19; c++) printf(" --- |");
  printf("\n");
  /* plain twice (first and last: the spread between them is the noise of the machine) */
  static const char *const names[4] = {"plain", "dspark scheduled", "dspark scheduled, startup profile", "plain again"};
  static const char *const specs[4] = {NULL, "{\"method\": \"dspark\"}", "{\"method\": \"dspark\", \"profile\": \"startup\"}",
                                       NULL};
  int rc = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", seq_list);
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
    for (int c = 0; c < 4; c++)
      if (!getenv("BENCH_ONLY") || atoi(getenv("BENCH_ONLY")) == c) /* 0 plain, 1 dspark, 2 startup, 3 plain (for perf) */
        rc |= bench_on_model(m, names[c], specs[c], atoi(tok), steps);
  di_model_free(m);
  return rc;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "model") == 0)
    return bench_model(argv[2], argc > 3 ? argv[3] : "cpu", argc > 4 ? argv[4] : "16,64,256", argc > 5 ? atoi(argv[5]) : 300);
  bench_cfg c = {.seqs = 64, .steps = 400, .run_tokens = 0, .sleep_ms = 0.25, .per_token_us = 2.0, .prop_us = 300};
  int a = 1;
  if (a < argc && strcmp(argv[a], "run") == 0) c.run_tokens = 128, a++;
  if (a < argc) c.seqs = atoi(argv[a++]);
  if (a < argc) (c.run_tokens ? &c.run_tokens : &c.steps)[0] = atoi(argv[a++]);
  if (a < argc) c.sleep_ms = atof(argv[a++]);
  if (a < argc) c.per_token_us = atof(argv[a++]);
  if (a < argc) c.prop_us = atof(argv[a++]);
  if (c.seqs < 1 || c.steps < 1 || c.run_tokens < 0 || !(c.sleep_ms >= 0) || !(c.per_token_us >= 0) || !(c.prop_us >= 0)) {
    fprintf(stderr, "usage: bench_dspark_host [run] [SEQS] [STEPS|TOKENS] [SLEEP_MS] [PER_TOKEN_US] [PROPOSAL_US]\n");
    return 2;
  }
  if (c.run_tokens)
    printf("bench_dspark.py's shape: %d requests, 8 tokens of warm-up, then %d tokens timed", c.seqs, c.run_tokens);
  else
    printf("%d sequences, %d steady decoding steps after 100", c.seqs, c.steps);
  printf("; backend %.3f ms + %.1f us a token + %.0f us a proposal (device sampling, feedback)\n", c.sleep_ms, c.per_token_us,
         c.prop_us);
  const char *only = getenv("BENCH_ONLY"); /* "plain" / "dspark": that engine, once (for callgrind) */
  int rc = 0;
  for (int r = 0; r < (only ? 1 : 2); r++) {
    if (!only || strcmp(only, "plain") == 0) rc |= run(0, &c);
    if (!only || strcmp(only, "dspark") == 0) rc |= run(1, &c);
  }
  return rc;
}
