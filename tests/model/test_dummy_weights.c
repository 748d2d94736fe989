/* --load-format dummy weights (src/arch/deepseek_dummy_weights.c), made in parallel with a table
 * for large bf16 matrices, against a sequential splitmix64 walk written here: the embedding, the
 * final norm, the LM head and layer 0's norms and first projection, element by element (bf16 through
 * the table path in engine-dummy's 8200 x 128 embedding, FP8 codes and block scales in
 * dsv3-tiny-fp8), in the order the weights are made. Same seed: the same bytes; another seed: others. */
#include "arch/deepseek.h"
#include "model/config.h"
#include "util/numeric.h"
#include "test_util.h"
#include <math.h>
#include <stdlib.h>

static uint64_t ref_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* the next bf16 matrix of n elements (std) from the walk; returns mismatches */
static int64_t ref_bf16(uint64_t *s, const di_weight *w, float std) {
  const int64_t n = w->rows * w->cols;
  const float a = std * 1.7320508f;
  const uint16_t *d = (const uint16_t *)w->data;
  int64_t bad = w->dtype == DI_DT_BF16 ? 0 : n;
  for (int64_t i = 0; i < n; i += 4) {
    uint64_t r = ref_next(s);
    for (int k = 0; k < 4 && i + k < n; k++) {
      float u = (float)((r >> (16 * k)) & 0xffff) / 65535.0f;
      if (!bad && d[i + k] != di_f32_to_bf16((2.0f * u - 1.0f) * a))
        bad++;
    }
  }
  return bad;
}

static int64_t ref_fp8(uint64_t *s, const di_weight *w, float std) {
  const int64_t n = w->rows * w->cols;
  const uint8_t *q = (const uint8_t *)w->data;
  int64_t bad = w->dtype == DI_DT_F8E4M3 ? 0 : n;
  for (int64_t i = 0; i < n; i++) {
    uint8_t v = (uint8_t)(ref_next(s) & 0xff);
    if ((v & 0x7f) == 0x7f)
      v &= 0xfe;
    if (!bad && q[i] != v)
      bad++;
  }
  if (!bad && w->scale_inv[0] != std * 1.7320508f / 448.0f)
    bad++;
  return bad;
}

static int64_t ref_vec(uint64_t *s, const float *v, int64_t n, float center, float spread) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float want = center + spread * ((float)(ref_next(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    if (v[i] != want)
      bad++;
  }
  return bad;
}

static void check_model(const char *rel, uint64_t seed) {
  di_model_config c;
  di_ds_weights w, again, other;
  CHECKF(di_model_config_load(test_path(rel), &c) == DI_OK, "%s: %s", rel, di_last_error());
  CHECKF(di_ds_weights_dummy(&c, seed, &w, NULL) == DI_OK, "%s", di_last_error());
  const int H = c.hidden_size;
  const float sh = 1.0f / sqrtf((float)H);
  uint64_t s = seed ^ 0x5eedull;
  CHECKF(ref_bf16(&s, &w.embed, 1.0f) == 0, "%s embed", rel);
  CHECKF(ref_vec(&s, w.final_norm, H, 1.0f, 0.1f) == 0, "%s final norm", rel);
  CHECK(!c.tie_word_embeddings);
  CHECKF(ref_bf16(&s, &w.lm_head, sh) == 0, "%s lm_head", rel);
  CHECKF(ref_vec(&s, w.layers[0].attn_norm, H, 1.0f, 0.1f) == 0, "%s attn norm", rel);
  CHECKF(ref_vec(&s, w.layers[0].ffn_norm, H, 1.0f, 0.1f) == 0, "%s ffn norm", rel);
  CHECK(c.q_lora_rank > 0);
  int64_t bad = c.fp8 ? ref_fp8(&s, &w.layers[0].q_a, sh) : ref_bf16(&s, &w.layers[0].q_a, sh);
  CHECKF(bad == 0, "%s q_a: %lld mismatches", rel, (long long)bad);
  /* the same seed gives the same bytes; another seed other bytes */
  CHECK(di_ds_weights_dummy(&c, seed, &again, NULL) == DI_OK);
  CHECK(di_ds_weights_dummy(&c, seed + 1, &other, NULL) == DI_OK);
  const di_weight *last = &w.layers[w.n_layers - 1].o_proj, *last2 = &again.layers[w.n_layers - 1].o_proj;
  size_t bytes = (size_t)(last->rows * last->cols) * (size_t)di_dtype_size(last->dtype);
  CHECK(memcmp(last->data, last2->data, bytes) == 0);
  CHECK(memcmp(last->data, other.layers[w.n_layers - 1].o_proj.data, bytes) != 0);
  di_ds_weights_free(&w);
  di_ds_weights_free(&again);
  di_ds_weights_free(&other);
}

int main(void) {
  check_model("tests/data/models/engine-dummy", 3);
  check_model("tests/data/models/dsv3-tiny-fp8", 11);
  return test_finish("test_dummy_weights");
}
