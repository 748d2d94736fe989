/* --kv-cache-dtype fp8 on the CPU backend (di_model_options.kv_cache_dtype; cpu_deepseek.c kv_store /
 * kv_key): the latent cache in E4M3 with one f32 scale per token per 128 latent channels, the rope
 * part in bf16.
 *   - bytes per token from the backend's KV group: (ceil(R/128) + R/4 + dr/2) 4-byte words a layer;
 *   - attention reads the stored values, the current step's included, so a sequence scored in one
 *     forward equals the same sequence decoded one token per step through the paged cache, bit for bit
 *     (the chunking equality; batch-equals-alone follows from the same per-token arithmetic);
 *   - accuracy against the f32 cache over 1,024 positions (printed): top-1 agreement and relative L2
 *     error of the logits on the shipped model (README.md's text; measured 0.960 / 0.020) and a random
 *     fixture (0.950 / 0.073); bounds agreement >= 0.9 / error < 0.05 and >= 0.8 / < 0.15 (a broken
 *     cache gives chance agreement);
 *   - bad values refused naming the flag. */
#include "api/model_internal.h"
#include "util/json.h"
#include "test_models.h"
#include <math.h>
/* positions of the shipped-model comparison: 1,024 (the measurement); under the sanitizers (CI's ASan
 * run, ~15x slower here) 256, which still exercises every path */
#if defined(__SANITIZE_ADDRESS__)
#define MODEL_POSITIONS 256
#else
#define MODEL_POSITIONS 1024
#endif
#include <stdlib.h>
#include <string.h>

static di_model *load(const char *dir, const char *kv) {
  di_model_options o;
  test_model_options(&o);
  o.kv_cache_dtype = kv;
  char what[64];
  snprintf(what, sizeof what, "kv %s", kv ? kv : "auto");
  return test_load_model(dir, &o, what);
}

static void test_bytes(const char *dir) {
  di_model *a = load(dir, NULL), *q = load(dir, "fp8");
  if (a && q) {
    di_kv_group_info ga, gq;
    CHECK(a->backend->ops->kv_groups(a->backend, &ga, 1) == 1 && q->backend->ops->kv_groups(q->backend, &gq, 1) == 1);
    const int R = a->cfg.kv_lora_rank, dr = a->cfg.qk_rope_head_dim, L = a->cfg.num_hidden_layers + a->weights.n_mtp;
    CHECK(ga.bytes_per_token == (int64_t)L * (R + dr) * 4);
    CHECK(gq.bytes_per_token == (int64_t)L * 4 * ((R + 127) / 128 + R / 4 + (dr + 1) / 2));
    printf("kv cache bytes per token: f32 %lld, fp8 %lld (%.2fx the tokens in one budget)\n",
           (long long)ga.bytes_per_token, (long long)gq.bytes_per_token,
           (double)ga.bytes_per_token / (double)gq.bytes_per_token);
  }
  di_model_free(a);
  di_model_free(q);
}

/* one token per forward through the paged cache (a scrambled block table) vs the whole sequence */
static void test_chunking(const char *dir, const int32_t *ids, int n) {
  di_model *m = load(dir, "fp8");
  if (!m) return;
  const int V = m->cfg.vocab_size, nb = (n + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
  float *whole = malloc(sizeof(float) * (size_t)n * V), *step = malloc(sizeof(float) * (size_t)n * V);
  CHECKF(di_model_score(m, ids, n, whole) == DI_OK, "%s", di_last_error());
  CHECK(m->backend->ops->kv_alloc(m->backend, nb + 3) == DI_OK);
  int32_t table[64];
  for (int i = 0; i < nb; i++) table[i] = (nb + 2) - i;
  di_batch_seq s = {table, nb, 0};
  for (int i = 0; i < n; i++) {
    int32_t pos = i, seq = 0, row = 0;
    di_batch b = {.n_tokens = 1, .tokens = ids + i, .positions = &pos, .seq_of = &seq, .n_seqs = 1, .seqs = &s,
                  .n_outputs = 1, .output_rows = &row};
    CHECKF(di_backend_forward(m->backend, &b, step + (size_t)i * V) == DI_OK, "%s", di_last_error());
  }
  CHECKF(memcmp(whole, step, sizeof(float) * (size_t)n * V) == 0, "fp8 cache: stepwise decode differs from the whole pass");
  free(whole);
  free(step);
  di_model_free(m);
}

static void compare(const char *name, const char *dir, const int32_t *ids, int n, double min_agree, double max_err) {
  test_compare_models("--kv-cache-dtype fp8 vs f32 cache", name, load(dir, NULL), load(dir, "fp8_e4m3"), ids, n, min_agree,
                      max_err);
}

int main(void) {
  char dir[600], fx[600];
  snprintf(dir, sizeof dir, "%s", test_path("models/default"));
  snprintf(fx, sizeof fx, "%s", test_path("tests/data/models/dsv3-tiny"));
  di_model_options o;
  di_model_options_default(&o);
  o.quiet = 1;
  o.kv_cache_dtype = "fp8_e5m2";
  di_model *bad = NULL;
  CHECK_ERR(di_model_load(dir, &o, &bad), "--kv-cache-dtype \"fp8_e5m2\"");
  test_bytes(dir);
  size_t n = 0;
  int32_t *ids = test_readme_ids(dir, 1024, &n);
  if (ids) {
    compare("models/default (README.md)", dir, ids, MODEL_POSITIONS, 0.9, 0.05);
    test_chunking(dir, ids, 150);
  }
  int32_t rid[1024];
  uint64_t r = 12345;
  for (int i = 0; i < 1024; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    rid[i] = (int32_t)((r >> 33) % 256);
  }
  compare("dsv3-tiny fixture (random ids)", fx, rid, 256, 0.8, 0.15); /* 256: CI time (1,024 measured 0.950 / 0.073) */
  test_chunking(fx, rid, 64);
  free(ids);
  printf("%d passed, %d failed\n", di_test_passed, di_test_failed);
  return di_test_failed ? 1 : 0;
}
