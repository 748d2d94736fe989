/* Time to make --load-format dummy weights for a model shape (not a test), and a checksum of every
 * byte made, so a change to the generator can be shown to give the very same weights.
 *   build/bench_dummy_weights DIR_WITH_CONFIG_JSON [SEED]
 * Prints the bytes made, wall and CPU seconds (all threads), GB/s and an FNV-1a-64 hash over all matrices and vectors in binding
 * order. Memory: the whole model's weights (bf16) on the host; use a reduced shape on small machines. */
#include "arch/deepseek.h"
#include "model/config.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static uint64_t hash_mat(uint64_t h, const di_weight *w, double *bytes) {
  if (!w->data)
    return h;
  size_t n = (size_t)(w->rows * w->cols) * (size_t)di_dtype_size(w->dtype);
  *bytes += (double)n;
  return fnv(h, w->data, n);
}

static uint64_t hash_vec(uint64_t h, const float *v, int64_t n) { return v ? fnv(h, v, sizeof(float) * (size_t)n) : h; }

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_DIR [SEED]\n", argv[0]);
    return 2;
  }
  di_model_config c;
  if (di_model_config_load(argv[1], &c) != DI_OK) {
    fprintf(stderr, "%s\n", di_last_error());
    return 1;
  }
  di_ds_weights w;
  struct timespec t0, t1, c0, c1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  if (di_ds_weights_dummy(&c, argc > 2 ? strtoull(argv[2], NULL, 10) : 0, &w, NULL) != DI_OK) {
    fprintf(stderr, "%s\n", di_last_error());
    return 1;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), bytes = 0;
  const int H = c.hidden_size;
  uint64_t h = 0xcbf29ce484222325ull;
  h = hash_mat(h, &w.embed, &bytes);
  h = hash_vec(h, w.final_norm, H);
  if (w.lm_head.data != w.embed.data)
    h = hash_mat(h, &w.lm_head, &bytes);
  for (int l = 0; l < w.n_layers + w.n_mtp; l++) {
    const di_ds_layer *L = &w.layers[l];
    h = hash_vec(h, L->attn_norm, H);
    h = hash_vec(h, L->ffn_norm, H);
    const di_weight *mats[] = {&L->q_a, &L->q_b, &L->q_proj, &L->kv_a, &L->kv_b, &L->o_proj, &L->gate, &L->up,
                               &L->down, &L->router, &L->sh_gate, &L->sh_up, &L->sh_down, &L->eh_proj};
    for (size_t i = 0; i < sizeof mats / sizeof *mats; i++)
      h = hash_mat(h, mats[i], &bytes);
    if (L->is_moe)
      for (int e = 0; e < 3 * c.n_routed_experts; e++)
        h = hash_mat(h, &L->exp_gate[e], &bytes);
    h = hash_vec(h, L->router_bias, c.n_routed_experts);
  }
  printf("dummy weights: %.2f GB in %.3f s wall, %.3f s CPU (%.2f GB/s), hash %016llx\n", bytes / 1e9, s, cpu,
         bytes / 1e9 / s, (unsigned long long)h);
  di_ds_weights_free(&w);
  return 0;
}
