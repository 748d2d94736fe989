/* CPU decode benchmark: tokens/s of a DeepSeek-V3-shaped model with dummy weights, against the
 * machine's measured memory read bandwidth (a STREAM-style read of a buffer much larger than the
 * caches, on the same threads). Decode at batch 1 is bandwidth-bound: each token reads every active
 * weight once, so tokens/s x bytes/token over the read bandwidth is the share of the roofline reached.
 *
 * The machine may be shared: each figure is the best of --repeat runs (decode of the same positions
 * again, so the work is identical), and the bandwidth is measured on the same thread count.
 *
 * usage: bench_cpu_decode [--model DIR] [--threads N] [--tokens N] [--prompt N] [--repeat R] */
#include "api/model_internal.h"
#include "util/threadpool.h"
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process (every thread): on a shared machine the prefill's wall time mostly
 * says how busy the other cores' users were; its CPU time (the pool's spinning included) does not */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  const float *buf;
  float *sums;
} read_ctx;

static void read_task(void *p, int64_t b, int64_t e, int thread) {
  read_ctx *c = p;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = b * 4096; i < e * 4096; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(c->buf + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(c->buf + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(c->buf + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(c->buf + i + 24));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  c->sums[thread * 16] += t[0] + t[7];
}

/* Best-of-5 read bandwidth in bytes/s over `bytes`. */
static double read_bandwidth(di_threadpool *tp, size_t bytes) {
  float *buf = aligned_alloc(64, bytes);
  float sums[64 * 16] = {0};
  for (size_t i = 0; i < bytes / 4; i++)
    buf[i] = (float)(i & 7);
  read_ctx c = {buf, sums};
  double best = 0;
  for (int r = 0; r < 5; r++) {
    double t0 = now();
    di_parallel_for(tp, (int64_t)(bytes / 4 / 4096), 64, read_task, &c);
    double bw = (double)bytes / (now() - t0);
    if (bw > best)
      best = bw;
  }
  free(buf);
  return best;
}

int main(int argc, char **argv) {
  const char *dir = "bench/configs/v3-1b";
  int threads = 0, n_tokens = 32, prompt = 16, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--model"))
      dir = argv[i + 1];
    else if (!strcmp(argv[i], "--threads"))
      threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--tokens"))
      n_tokens = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--prompt"))
      prompt = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--repeat"))
      repeat = atoi(argv[i + 1]);
  }
  di_model_options o;
  di_model_options_default(&o);
  o.load_format = "dummy";
  o.threads = threads;
  o.accelerator = "cpu";
  di_model *m;
  double t0 = now();
  if (di_model_load(dir, &o, &m) != DI_OK) {
    fprintf(stderr, "%s\n", di_last_error());
    return 1;
  }
  printf("model %s: dummy weights made in %.1f s\n", dir, now() - t0);
  di_threadpool *tp;
  di_threadpool_create(threads, &tp);
  double bw = read_bandwidth(tp, (size_t)1 << 30);
  const int total = prompt + n_tokens;
  const int nb = (total + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
  m->backend->ops->kv_alloc(m->backend, nb);
  int32_t table[256];
  for (int i = 0; i < nb; i++)
    table[i] = i;
  di_batch_seq s = {table, nb, 0};
  const int V = m->cfg.vocab_size;
  float *logits = malloc(sizeof(float) * (size_t)V);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)total), *pos = malloc(sizeof(int32_t) * (size_t)total),
          *seq = calloc((size_t)total, sizeof(int32_t));
  for (int i = 0; i < total; i++) {
    ids[i] = (i * 7919 + 13) % V;
    pos[i] = i;
  }
  int32_t last = prompt - 1;
  di_batch pb = {.n_tokens = prompt, .tokens = ids, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = &s,
                 .n_outputs = 1, .output_rows = &last};
  double t_prefill = 1e30, cpu_prefill = 1e30; /* best of the repeats: the same positions are written again */
  for (int r = 0; r < (repeat > 0 ? repeat : 1); r++) {
    t0 = now();
    const double c0 = cpu_now();
    di_backend_forward(m->backend, &pb, logits);
    if (cpu_now() - c0 < cpu_prefill)
      cpu_prefill = cpu_now() - c0;
    if (now() - t0 < t_prefill)
      t_prefill = now() - t0;
  }
  int32_t row = 0;
  double per_tok = 1e30;
  for (int r = 0; r < (repeat > 0 ? repeat : 1); r++) {
    double t_dec = 0;
    for (int i = prompt; i < total; i++) {
      di_batch db = {.n_tokens = 1, .tokens = ids + i, .positions = pos + i, .seq_of = seq, .n_seqs = 1, .seqs = &s,
                     .n_outputs = 1, .output_rows = &row};
      double a = now();
      di_backend_forward(m->backend, &db, logits);
      t_dec += now() - a;
    }
    if (t_dec / n_tokens < per_tok)
      per_tok = t_dec / n_tokens;
  }
  double bytes = di_ds_weights_bytes_per_token(&m->cfg, &m->weights);
  double params = 0;
  (void)params;
  printf("threads %d | read bandwidth %.2f GB/s | weights read per token %.1f MB\n", di_threadpool_size(tp), bw / 1e9,
         bytes / 1e6);
  printf("prefill %d tokens: %.2f s (%.1f tok/s), CPU time %.2f s (%.1f tokens per CPU second)\n", prompt, t_prefill,
         prompt / t_prefill, cpu_prefill, prompt / cpu_prefill);
  printf("decode: %.2f tok/s (%.1f ms/token), effective %.2f GB/s = %.0f%% of measured read bandwidth\n", 1.0 / per_tok,
         per_tok * 1e3, bytes / per_tok / 1e9, 100.0 * bytes / per_tok / bw);
  free(logits);
  free(ids);
  free(pos);
  free(seq);
  di_threadpool_free(tp);
  di_model_free(m);
  return 0;
}
