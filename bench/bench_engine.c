/* Engine benchmarks (not tests).
 *
 *   bench_engine host [SEQS] [VOCAB] [SLEEP_MS]
 *       Host scheduling + sampling time per step with SEQS running sequences (default 256) against a
 *       backend that only sleeps SLEEP_MS per step (default 5), with async scheduling off and on:
 *       how much host time each step costs and what share of it the overlap hides. Greedy sampling
 *       over VOCAB logits per sequence (default 129280, DeepSeek-V3's vocabulary; the logits are
 *       cheap made-up rows).
 *   bench_engine prefix MODEL_DIR [N_REQ] [SYS_LEN]
 *       Shared-system-prompt workload on the CPU backend: N_REQ requests (default 32) = the same
 *       SYS_LEN-token system prompt (default 1024) + 16 own tokens, 8 new tokens each; wall time
 *       with prefix caching off and on.
 *   bench_engine model MODEL_DIR [auto|dummy] [cpu|cuda] [SEQS] [PROMPT_LEN] [default-kv]
 *       The engine over a real backend: 100 decode steps with SEQS running sequences (default 64),
 *       async scheduling off and on; ms per step, tokens/s, host time and its hidden share. The KV
 *       pool holds every sequence's prompt + 300 tokens, or with default-kv the engine's own default
 *       (gpu_memory_utilization on CUDA), whose choice and preemptions are printed.
 *       DEEPINFER_HOST_SAMPLING=1 samples on the host even when the backend offers to. */
#include "deepinfer.h"
#include "engine/engine_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "util/switches.h"

typedef struct sleep_backend {
  di_backend base;
  int vocab;
  double sleep_s, t_submit;
  int n_out, zeroed_rows;
} sleep_backend;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int sb_groups(di_backend *b, di_kv_group_info *g, int cap) {
  (void)b;
  if (cap < 1) return 0;
  g[0] = (di_kv_group_info){.n_layers = 61, .bytes_per_token = 70272, .tokens_per_entry = 1, .window = 0};
  return 1;
}
static di_status sb_alloc(di_backend *b, int64_t n) { (void)b; (void)n; return DI_OK; }
static di_status sb_submit(di_backend *b, const di_batch *bt) {
  sleep_backend *s = (sleep_backend *)b;
  s->n_out = bt->n_outputs;
  s->t_submit = now_s();
  return DI_OK;
}
static di_status sb_wait(di_backend *b, float *logits, float *hidden) {
  sleep_backend *s = (sleep_backend *)b;
  (void)hidden;
  double until = s->t_submit + s->sleep_s;
  for (double t = now_s(); t < until; t = now_s()) {
    struct timespec ts = {0, (long)((until - t) * 1e9)};
    nanosleep(&ts, NULL);
  }
  /* a device would have written the logits during the step; cheap rows keep the copy out of the
   * host-time figure except for what any host sampler must read */
  if (logits && s->n_out > s->zeroed_rows) { /* once: the buffer starts uninitialised */
    memset(logits, 0, (size_t)s->n_out * (size_t)s->vocab * sizeof *logits);
    s->zeroed_rows = s->n_out;
  }
  if (logits)
    for (int r = 0; r < s->n_out; r++) logits[(size_t)r * (size_t)s->vocab + (size_t)(r * 7919) % (size_t)s->vocab] = 1.0f;
  return DI_OK;
}
static void sb_destroy(di_backend *b) { free(b); }
/* device sampling: the token comes back with the step (as from a GPU sampler) */
static di_status sb_sample(di_backend *b, const di_sample_row *rows, int n, int32_t *tokens) {
  sleep_backend *s = (sleep_backend *)b;
  for (int i = 0; i < n; i++) tokens[i] = 2 + (int32_t)((rows[i].counter * 7919 + (uint64_t)i) % (uint64_t)(s->vocab - 2));
  return DI_OK;
}
static const di_backend_ops SB_OPS = {.name = "sleep", .kv_groups = sb_groups, .kv_alloc = sb_alloc, .submit = sb_submit,
                                      .wait = sb_wait, .destroy = sb_destroy};
static const di_backend_ops SB_OPS_DEV = {.name = "sleep+sample", .kv_groups = sb_groups, .kv_alloc = sb_alloc,
                                          .submit = sb_submit, .wait = sb_wait, .sample = sb_sample, .destroy = sb_destroy};

static int bench_host(int seqs, int vocab, double sleep_ms) {
  printf("host scheduling: %d running sequences, vocab %d, backend sleeps %.1f ms per step\n", seqs, vocab, sleep_ms);
  for (int mode = 0; mode < 4; mode++) {
    int async = mode & 1, dev = mode >> 1;
    sleep_backend *sb = calloc(1, sizeof *sb);
    sb->base.ops = dev ? &SB_OPS_DEV : &SB_OPS;
    sb->vocab = vocab;
    sb->sleep_s = sleep_ms * 1e-3;
    static const int32_t eos[1] = {1};
    di_engine_core_config cfg = {.backend = &sb->base, .vocab_size = vocab, .vocab_limit = vocab, .max_context = 8192,
                                 .eos_ids = eos, .n_eos = 1};
    di_engine_options o;
    di_engine_options_default(&o);
    o.max_num_seqs = seqs;
    o.max_num_batched_tokens = 8192;
    o.async_scheduling = async;
    o.num_kv_blocks = (int64_t)seqs * 12;
    di_engine *e;
    if (di_engine_core_create(&cfg, &o, &e) != DI_OK) {
      fprintf(stderr, "bench: %s\n", di_last_error());
      return 1;
    }
    int32_t *prompt = malloc(512 * sizeof *prompt);
    for (int k = 0; k < seqs; k++) {
      for (int i = 0; i < 512; i++) prompt[i] = 2 + (k * 131 + i * 7) % (vocab - 2);
      di_request_params p;
      di_request_params_default(&p);
      p.prompt_ids = prompt;
      p.n_prompt_ids = 512;
      p.max_tokens = 200;
      p.temperature = 0;
      p.ignore_eos = 1;
      uint64_t id;
      di_engine_add_request(e, &p, &id);
    }
    /* warm up: prefill every prompt, then measure steady decode with all sequences running */
    di_step_output *out;
    for (int i = 0; i < 80; i++) di_engine_step(e, &out);
    di_engine_stats s0, s1;
    di_engine_get_stats(e, &s0);
    double t0 = now_s();
    int steps = 100;
    for (int i = 0; i < steps; i++) di_engine_step(e, &out);
    double wall = now_s() - t0;
    di_engine_get_stats(e, &s1);
    double host = (s1.host_time_s - s0.host_time_s) / steps * 1e3;
    double hidden = (s1.hidden_host_time_s - s0.hidden_host_time_s) / steps * 1e3;
    printf("  %s sampling, async %-3s: %d running, wall %.3f ms/step (device %.1f), host %.3f ms/step, hidden %.3f ms (%.0f%%), "
           "exposed host %.3f ms/step\n", dev ? "device" : "host", async ? "on" : "off", s1.n_running, wall / steps * 1e3, sleep_ms, host, hidden,
           host > 0 ? 100 * hidden / host : 0, wall / steps * 1e3 - sleep_ms);
    free(prompt);
    di_engine_free(e);
    sb_destroy(&sb->base);
  }
  return 0;
}

static int bench_prefix(const char *dir, int n_req, int sys_len) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  di_model *m;
  if (di_model_load(dir, &mo, &m) != DI_OK) {
    fprintf(stderr, "bench: %s\n", di_last_error());
    return 1;
  }
  int V = di_model_vocab_size(m);
  printf("prefix caching: %s, %d requests = %d-token shared system prompt + 16 own tokens, 8 new tokens each\n", dir,
         n_req, sys_len);
  int32_t *ids = malloc((size_t)(sys_len + 16) * sizeof *ids);
  double walls[2];
  for (int pc = 0; pc <= 1; pc++) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.enable_prefix_caching = pc;
    o.num_kv_blocks = (int64_t)n_req * ((sys_len + 24) / 64 + 2);
    di_engine *e;
    if (di_engine_create(m, &o, &e) != DI_OK) {
      fprintf(stderr, "bench: %s\n", di_last_error());
      return 1;
    }
    double t0 = now_s();
    for (int k = 0; k < n_req; k++) {
      for (int i = 0; i < sys_len + 16; i++) ids[i] = i < sys_len ? 2 + (i * 37) % (V - 2) : 2 + (k * 101 + i) % (V - 2);
      di_request_params p;
      di_request_params_default(&p);
      p.prompt_ids = ids;
      p.n_prompt_ids = sys_len + 16;
      p.max_tokens = 8;
      p.temperature = 0;
      p.ignore_eos = 1;
      uint64_t id;
      di_engine_add_request(e, &p, &id);
    }
    di_step_output *out;
    while (di_engine_has_unfinished(e)) di_engine_step(e, &out);
    walls[pc] = now_s() - t0;
    di_engine_stats s;
    di_engine_get_stats(e, &s);
    printf("  prefix caching %-3s: %.3f s, %lld steps, hit rate %.2f, %.0f prompt tok/s\n", pc ? "on" : "off", walls[pc],
           (long long)s.steps, s.prefix_cache_hit_rate, (double)s.prompt_tokens / walls[pc]);
    di_engine_free(e);
  }
  printf("  speedup %.2fx\n", walls[0] / walls[1]);
  free(ids);
  di_model_free(m);
  return 0;
}

/* The engine over a real backend: decode steps with SEQS running sequences, async off and on. */
static int bench_model(const char *dir, const char *load_format, const char *accel, int seqs, int prompt_len,
                       int default_kv) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.load_format = load_format;
  mo.accelerator = accel;
  mo.quiet = 1;
  di_model *m;
  double tl = now_s();
  if (di_model_load(dir, &mo, &m) != DI_OK) {
    fprintf(stderr, "bench: %s\n", di_last_error());
    return 1;
  }
  int V = di_model_vocab_size(m);
  const int host_sampling = di_switch_bool(DI_SW_HOST_SAMPLING, 0);
  printf("engine on %s (%s weights, %s, loaded in %.1f s): %d sequences, %d-token prompts, greedy, %s sampling\n", dir,
         load_format, accel, now_s() - tl, seqs, prompt_len, host_sampling ? "host" : "device if offered");
  int32_t *ids = malloc((size_t)prompt_len * sizeof *ids);
  for (int async = 0; async <= 1; async++) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.max_num_seqs = seqs;
    o.max_num_batched_tokens = 8192;
    o.async_scheduling = async;
    if (!default_kv) o.num_kv_blocks = (int64_t)seqs * ((prompt_len + 300) / 64 + 1);
    di_engine *e;
    if (di_engine_create(m, &o, &e) != DI_OK) {
      fprintf(stderr, "bench: %s\n", di_last_error());
      return 1;
    }
    printf("  %s\n", di_engine_kv_summary(e));
    for (int k = 0; k < seqs; k++) {
      for (int i = 0; i < prompt_len; i++) ids[i] = 3 + (int32_t)((k * 7919 + i * 104729) % (V - 3));
      di_request_params p;
      di_request_params_default(&p);
      p.prompt_ids = ids;
      p.n_prompt_ids = prompt_len;
      p.max_tokens = 256;
      p.temperature = 0;
      p.ignore_eos = 1;
      uint64_t id;
      di_engine_add_request(e, &p, &id);
    }
    di_step_output *out;
    di_engine_stats s0, s1;
    for (int i = 0; i < 200; i++) { /* until every prompt is in and decoding */
      di_engine_step(e, &out);
      di_engine_get_stats(e, &s0);
      if (s0.n_waiting == 0 && s0.generated_tokens >= 2 * seqs) break;
    }
    di_engine_get_stats(e, &s0);
    int steps = 100;
    double t0 = now_s();
    for (int i = 0; i < steps; i++) di_engine_step(e, &out);
    double wall = now_s() - t0;
    di_engine_get_stats(e, &s1);
    double host = (s1.host_time_s - s0.host_time_s) / steps * 1e3, hid = (s1.hidden_host_time_s - s0.hidden_host_time_s) / steps * 1e3;
    double wait = (s1.backend_wait_s - s0.backend_wait_s) / steps * 1e3;
    printf("  async %-3s: %d running, %.3f ms/step, %.0f tok/s, host %.3f ms/step (hidden %.3f ms, %.0f%%), "
           "blocked in wait %.3f ms/step, %lld preemptions\n", async ? "on" : "off", s1.n_running, wall / steps * 1e3,
           (double)(s1.generated_tokens - s0.generated_tokens) / wall, host, hid, host > 0 ? 100 * hid / host : 0, wait,
           (long long)s1.preemptions);
    di_engine_free(e);
  }
  free(ids);
  di_model_free(m);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "model") == 0)
    return bench_model(argv[2], argc > 3 ? argv[3] : "auto", argc > 4 ? argv[4] : "cpu", argc > 5 ? atoi(argv[5]) : 64,
                       argc > 6 ? atoi(argv[6]) : 128, argc > 7 && strcmp(argv[7], "default-kv") == 0);
  if (argc >= 2 && strcmp(argv[1], "host") == 0)
    return bench_host(argc > 2 ? atoi(argv[2]) : 256, argc > 3 ? atoi(argv[3]) : 129280, argc > 4 ? atof(argv[4]) : 5.0);
  if (argc >= 3 && strcmp(argv[1], "prefix") == 0)
    return bench_prefix(argv[2], argc > 3 ? atoi(argv[3]) : 32, argc > 4 ? atoi(argv[4]) : 1024);
  fprintf(stderr, "usage: bench_engine host [SEQS] [VOCAB] [SLEEP_MS] | bench_engine prefix MODEL_DIR [N_REQ] [SYS_LEN]\n"
                  "       bench_engine model MODEL_DIR [auto|dummy] [cpu|cuda] [SEQS] [PROMPT_LEN]\n");
  return 2;
}
