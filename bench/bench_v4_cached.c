/* DeepSeek-V4 CPU cached forward benchmark: prefill P tokens in one chunk, then D one-token decode steps,
 * against one full recompute of P+D tokens by the reference forward. Float32, single-threaded.
 *   bench_v4_cached [model_dir (default tests/data/models/dsv4-tiny)] [P (1000)] [D (200)] */
#include "arch/deepseek_v4.h"
#include "backend/cpu/cpu_deepseek_v4.h"
#include "backend/cpu/cpu_deepseek_v4_cache.h"
#include "model/safetensors.h"
#include "util/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "tests/data/models/dsv4-tiny";
  const int P = argc > 2 ? atoi(argv[2]) : 1000, D = argc > 3 ? atoi(argv[3]) : 200;
  if (P < 1 || D < 1) {
    fprintf(stderr, "usage: %s [model_dir] [prefill >= 1] [decode steps >= 1]\n", argv[0]);
    return 2;
  }
  char path[4096], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/config.json", dir);
  di_v4_config cfg;
  di_tensor_source *src = NULL;
  di_v4_weights w;
  di_v4_seq_state *st = NULL;
  if (di_read_file(path, &text, &len) != DI_OK || di_v4_config_parse(text, len, &cfg) != DI_OK ||
      di_tensor_source_open(dir, &src) != DI_OK || di_v4_weights_bind(&cfg, src, &w) != DI_OK ||
      di_v4_seq_state_create(&cfg, &st) != DI_OK) {
    fprintf(stderr, "bench_v4_cached: %s\n", di_last_error());
    return 1;
  }
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)(P + D));
  float *lg = malloc(sizeof(float) * (size_t)(P + D) * cfg.vocab_size);
  if (!tok || !lg)
    return 1;
  unsigned s = 9;
  for (int t = 0; t < P + D; t++) {
    s = s * 1103515245u + 12345u;
    tok[t] = (int32_t)((s >> 8) % (unsigned)cfg.vocab_size);
  }
  double t0 = now();
  di_status rc = di_cpu_v4_forward_step(&cfg, &w, st, tok, P, lg);
  double t1 = now();
  for (int i = 0; i < D && rc == DI_OK; i++)
    rc = di_cpu_v4_forward_step(&cfg, &w, st, tok + P + i, 1, lg);
  double t2 = now();
  if (rc == DI_OK)
    rc = di_cpu_v4_forward_full(&cfg, &w, tok, P + D, lg);
  double t3 = now();
  if (rc != DI_OK) {
    fprintf(stderr, "bench_v4_cached: %s\n", di_last_error());
    return 1;
  }
  printf("prefill %d tokens (one chunk): %.3f s, %.0f tok/s\n", P, t1 - t0, P / (t1 - t0));
  printf("decode %d steps at positions %d..%d: %.3f ms/step\n", D, P, P + D - 1, (t2 - t1) / D * 1e3);
  printf("reference full recompute of %d tokens: %.3f s\n", P + D, t3 - t2);
  printf("state after %d tokens: %zu bytes\n", P + D, di_v4_seq_state_bytes(st));
  di_v4_seq_state_free(st);
  di_v4_weights_free(&w);
  di_tensor_source_free(src);
  free(text);
  free(tok);
  free(lg);
  return 0;
}
