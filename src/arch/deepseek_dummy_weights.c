/* Random weights in a model's shapes for --load-format dummy (benchmarks of real shapes without
 * the checkpoint), made in parallel but exactly the weights the sequential generator made.
 *
 * The generator is splitmix64: one 64-bit state walked through every matrix and vector in binding
 * order, each call adding the golden-ratio constant and mixing. Its k-th output from a start state s
 * is mix(s + (k+1) * gamma), so any slice of a matrix can be filled on its own (a counter-based RNG):
 * a matrix records its start state, its slices go to the thread pool, and the state moves on by the
 * number of calls the matrix used. The values are the same for any thread count, and the same as the
 * sequential walk's (bench/bench_dummy_weights prints a hash of every byte to show it).
 *
 * bf16 values are uniform in [-a, a] (a = std * sqrt(3), the variance of N(0, std^2)) from 16-bit
 * slices of each output: (2 * (u / 65535) - 1) * a rounded to bf16. For large matrices the 65536
 * possible results are tabulated once per matrix (the same float expression, so the same bits) and
 * each element is a table lookup, which is what makes a V2-Lite-sized model quick to make. */
#include "arch/deepseek.h"
#include "util/numeric.h"
#include "util/owned.h"
#include "util/progress.h"
#include "util/threadpool.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *own(di_ds_weights *w, size_t bytes) { return di_owned_alloc(&w->owned, bytes); }

#define GAMMA 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t splitmix(uint64_t *s) { return mix64(*s += GAMMA); }

/* the k-th (0-based) output of splitmix from state s0 */
static inline uint64_t splitmix_at(uint64_t s0, int64_t k) { return mix64(s0 + (uint64_t)(k + 1) * GAMMA); }

static inline uint16_t bf16_uniform(uint64_t bits16, float a) {
  float u = (float)bits16 / 65535.0f;
  return di_f32_to_bf16((2.0f * u - 1.0f) * a);
}

typedef struct {
  uint64_t s0;
  int64_t n;          /* elements */
  float a;
  uint16_t *bf16;     /* bf16 output, or NULL */
  const uint16_t *table; /* the 65536 bf16 results, or NULL (computed per element) */
  uint8_t *fp8;       /* FP8 E4M3 output, or NULL */
} fill_job;

/* calls [b, e): bf16 takes 4 values per call, FP8 one */
static void fill_range(void *ctx, int64_t b, int64_t e, int thread) {
  (void)thread;
  const fill_job *j = (const fill_job *)ctx;
  if (j->fp8) {
    for (int64_t i = b; i < e; i++) {
      uint8_t v = (uint8_t)(splitmix_at(j->s0, i) & 0xff);
      if ((v & 0x7f) == 0x7f)
        v &= 0xfe; /* avoid NaN codes */
      j->fp8[i] = v;
    }
    return;
  }
  for (int64_t c = b; c < e; c++) {
    uint64_t r = splitmix_at(j->s0, c);
    int64_t i = 4 * c;
    for (int k = 0; k < 4 && i + k < j->n; k++) {
      uint64_t u = (r >> (16 * k)) & 0xffff;
      j->bf16[i + k] = j->table ? j->table[u] : bf16_uniform(u, j->a);
    }
  }
}

typedef struct {
  di_threadpool *tp;
  uint16_t *table; /* 65536 entries, rebuilt per matrix */
} dummy_ctx;

/* Uniform in [-a, a] with the variance of N(0, std^2): a = std * sqrt(3). Fast, and the values
 * only need realistic magnitudes. */
static di_status dummy_mat(di_ds_weights *w, const di_model_config *c, di_weight *out, int64_t rows, int64_t cols,
                           float std, int quantize, uint64_t *seed, dummy_ctx *dc) {
  memset(out, 0, sizeof *out);
  out->name = "dummy";
  out->rows = rows;
  out->cols = cols;
  const int64_t n = rows * cols;
  const float a = std * 1.7320508f;
  fill_job job = {.s0 = *seed, .n = n, .a = a};
  if (c->fp8 && quantize) {
    uint8_t *q = own(w, (size_t)n);
    int64_t sr = (rows + c->fp8_block[0] - 1) / c->fp8_block[0], sc = (cols + c->fp8_block[1] - 1) / c->fp8_block[1];
    float *s = own(w, sizeof(float) * (size_t)(sr * sc));
    if (!q || !s)
      return di_error_set(DI_ERR_OOM, "dummy weights: out of memory (%lld x %lld)", (long long)rows, (long long)cols);
    /* values uniform over E4M3 codes of magnitude <= 448, one scale per block */
    for (int64_t i = 0; i < sr * sc; i++)
      s[i] = a / 448.0f;
    job.fp8 = q;
    di_parallel_for(dc->tp, n, 1 << 16, fill_range, &job);
    *seed += (uint64_t)n * GAMMA;
    out->dtype = DI_DT_F8E4M3;
    out->data = q;
    out->scale_inv = s;
    out->block_rows = c->fp8_block[0];
    out->block_cols = c->fp8_block[1];
    out->scale_cols = sc;
    return DI_OK;
  }
  uint16_t *d = own(w, sizeof(uint16_t) * (size_t)n);
  if (!d)
    return di_error_set(DI_ERR_OOM, "dummy weights: out of memory (%lld x %lld)", (long long)rows, (long long)cols);
  const int64_t calls = (n + 3) / 4;
  if (dc->table && n >= 4 * 65536) { /* the table pays for itself */
    for (uint32_t u = 0; u < 65536; u++)
      dc->table[u] = bf16_uniform(u, a);
    job.table = dc->table;
  }
  job.bf16 = d;
  di_parallel_for(dc->tp, calls, 1 << 14, fill_range, &job);
  *seed += (uint64_t)calls * GAMMA;
  out->dtype = DI_DT_BF16;
  out->data = d;
  return DI_OK;
}

static float *dummy_vec(di_ds_weights *w, int64_t n, float center, float spread, uint64_t *seed) {
  float *v = own(w, sizeof(float) * (size_t)n);
  if (!v)
    return NULL;
  for (int64_t i = 0; i < n; i++)
    v[i] = center + spread * ((float)(splitmix(seed) >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
  return v;
}

static di_status make_weights(const di_model_config *c, uint64_t seed, di_ds_weights *w, struct di_progress *progress,
                              dummy_ctx *dc) {
  memset(w, 0, sizeof *w);
  uint64_t s = seed ^ 0x5eedull;
  const int H = c->hidden_size, NH = c->num_attention_heads, dqk = di_cfg_qk_head_dim(c);
  const float sh = 1.0f / sqrtf((float)H);
  w->n_layers = c->num_hidden_layers;
  w->n_mtp = c->num_nextn_predict_layers;
  w->layers = calloc((size_t)(w->n_layers + w->n_mtp), sizeof(di_ds_layer));
  if (!w->layers)
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_status st;
#define D(out, r, cc, std, q)                                            \
  do {                                                                   \
    if ((st = dummy_mat(w, c, (out), (r), (cc), (std), (q), &s, dc)) != DI_OK) \
      goto fail;                                                         \
  } while (0)
#define V(out, n, center, spread)                                        \
  do {                                                                   \
    if (!((out) = dummy_vec(w, (n), (center), (spread), &s))) {          \
      st = di_error_set(DI_ERR_OOM, "dummy weights: out of memory");     \
      goto fail;                                                         \
    }                                                                    \
  } while (0)
  D(&w->embed, c->vocab_size, H, 1.0f, 0);
  V(w->final_norm, H, 1.0f, 0.1f);
  if (c->tie_word_embeddings)
    w->lm_head = w->embed;
  else
    D(&w->lm_head, c->vocab_size, H, sh, 0);
  di_progress_add(progress, 1);
  for (int l = 0; l < w->n_layers + w->n_mtp; l++) {
    di_ds_layer *L = &w->layers[l];
    int mtp = l >= w->n_layers;
    if (l > 0)
      di_progress_add(progress, 1);
    V(L->attn_norm, H, 1.0f, 0.1f);
    V(L->ffn_norm, H, 1.0f, 0.1f);
    if (c->q_lora_rank > 0) {
      D(&L->q_a, c->q_lora_rank, H, sh, 1);
      V(L->q_a_norm, c->q_lora_rank, 1.0f, 0.1f);
      D(&L->q_b, (int64_t)NH * dqk, c->q_lora_rank, 1.0f / sqrtf((float)c->q_lora_rank), 1);
    } else {
      D(&L->q_proj, (int64_t)NH * dqk, H, sh, 1);
    }
    D(&L->kv_a, c->kv_lora_rank + c->qk_rope_head_dim, H, sh, 1);
    V(L->kv_a_norm, c->kv_lora_rank, 1.0f, 0.1f);
    D(&L->kv_b, (int64_t)NH * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, 1.0f / sqrtf((float)c->kv_lora_rank), 1);
    D(&L->o_proj, H, (int64_t)NH * c->v_head_dim, 1.0f / sqrtf((float)(NH * c->v_head_dim)), 1);
    L->is_moe = di_cfg_is_moe_layer(c, mtp ? c->first_k_dense_replace : l);
    if (!L->is_moe) {
      const int I = c->intermediate_size;
      D(&L->gate, I, H, sh, 1);
      D(&L->up, I, H, sh, 1);
      D(&L->down, H, I, 1.0f / sqrtf((float)I), 1);
    } else {
      const int E = c->n_routed_experts, I = c->moe_intermediate_size;
      D(&L->router, E, H, sh, 0);
      if (c->topk_method == DI_TOPK_NOAUX_TC)
        V(L->router_bias, E, 0.0f, 0.1f);
      L->exp_gate = own(w, sizeof(di_weight) * 3 * (size_t)E);
      if (!L->exp_gate) {
        st = di_error_set(DI_ERR_OOM, "out of memory");
        goto fail;
      }
      L->exp_up = L->exp_gate + E;
      L->exp_down = L->exp_gate + 2 * E;
      for (int e = 0; e < E; e++) {
        D(&L->exp_gate[e], I, H, sh, 1);
        D(&L->exp_up[e], I, H, sh, 1);
        D(&L->exp_down[e], H, I, 1.0f / sqrtf((float)I), 1);
      }
      if (c->n_shared_experts > 0) {
        const int SI = I * c->n_shared_experts;
        L->has_shared = 1;
        D(&L->sh_gate, SI, H, sh, 1);
        D(&L->sh_up, SI, H, sh, 1);
        D(&L->sh_down, H, SI, 1.0f / sqrtf((float)SI), 1);
      }
    }
    if (mtp) {
      V(L->enorm, H, 1.0f, 0.1f);
      V(L->hnorm, H, 1.0f, 0.1f);
      D(&L->eh_proj, H, 2 * (int64_t)H, 1.0f / sqrtf(2.0f * H), 1);
      V(L->head_norm, H, 1.0f, 0.1f);
      L->head = w->lm_head;
      L->mtp_embed = w->embed;
    }
  }
#undef D
#undef V
  return DI_OK;
fail:
  di_ds_weights_free(w);
  return st;
}

di_status di_ds_weights_dummy(const di_model_config *c, uint64_t seed, di_ds_weights *w, struct di_progress *progress) {
  dummy_ctx dc = {0};
  if (di_threadpool_create(0, &dc.tp) != DI_OK)
    dc.tp = NULL; /* one thread then: the same weights, slower */
  dc.table = malloc(sizeof(uint16_t) * 65536);
  di_status st = make_weights(c, seed, w, progress, &dc);
  free(dc.table);
  di_threadpool_free(dc.tp);
  return st;
}
