/* Binding DeepSeek-V2/V3 checkpoint tensors to di_ds_weights by their Hugging Face names, and
 * making random weights of the same shapes for --load-format dummy. */
#include "arch/deepseek.h"
#include "model/safetensors.h"
#include "util/numeric.h"
#include "util/owned.h"
#include "util/progress.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Allocations made while binding are chained so one free releases them. */
static void *own(di_ds_weights *w, size_t bytes) { return di_owned_alloc(&w->owned, bytes); }

void di_ds_weights_free(di_ds_weights *w) {
  if (!w)
    return;
  di_owned_free(&w->owned);
  free(w->layers);
  memset(w, 0, sizeof *w);
}

/* ---- binding from a checkpoint ---------------------------------------------------------------- */

typedef struct {
  const di_model_config *cfg;
  di_tensor_source *src;
  di_ds_weights *w;
  char name[512];
} binder;

static di_status bind_mat(binder *b, di_weight *out, int64_t rows, int64_t cols, int quantizable, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static di_status bind_mat(binder *b, di_weight *out, int64_t rows, int64_t cols, int quantizable, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->name, sizeof b->name, fmt, ap);
  va_end(ap);
  (void)quantizable;
  DI_TRY(di_tensor_source_weight(b->src, b->name, rows, cols, b->cfg->fp8 ? b->cfg->fp8_block : NULL, out));
  if (di_weight_align_scales(out, &b->w->owned))
    return di_error_set(DI_ERR_OOM, "out of memory");
  return DI_OK;
}

/* A 1-D tensor copied to float32 (norms, biases). */
static di_status bind_vec(binder *b, float **out, int64_t n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static di_status bind_vec(binder *b, float **out, int64_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->name, sizeof b->name, fmt, ap);
  va_end(ap);
  di_weight v;
  DI_TRY(di_tensor_source_weight(b->src, b->name, 0, n, NULL, &v));
  if (v.dtype == DI_DT_F8E4M3)
    return di_error_set(DI_ERR_FORMAT, "tensor '%s' is FP8; 1-D tensors must be F32, BF16 or F16", b->name);
  float *f = own(b->w, sizeof(float) * (size_t)n);
  if (!f)
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_weight_rows_f32(&v, 0, 1, f);
  *out = f;
  return DI_OK;
}

static di_status bind_layer(binder *b, int l, di_ds_layer *L, int mtp) {
  const di_model_config *c = b->cfg;
  const int H = c->hidden_size, NH = c->num_attention_heads, dqk = di_cfg_qk_head_dim(c);
  const char *p = "model.layers";
  DI_TRY(bind_vec(b, &L->attn_norm, H, "%s.%d.input_layernorm.weight", p, l));
  DI_TRY(bind_vec(b, &L->ffn_norm, H, "%s.%d.post_attention_layernorm.weight", p, l));
  if (c->q_lora_rank > 0) {
    DI_TRY(bind_mat(b, &L->q_a, c->q_lora_rank, H, 1, "%s.%d.self_attn.q_a_proj.weight", p, l));
    DI_TRY(bind_vec(b, &L->q_a_norm, c->q_lora_rank, "%s.%d.self_attn.q_a_layernorm.weight", p, l));
    DI_TRY(bind_mat(b, &L->q_b, (int64_t)NH * dqk, c->q_lora_rank, 1, "%s.%d.self_attn.q_b_proj.weight", p, l));
  } else {
    DI_TRY(bind_mat(b, &L->q_proj, (int64_t)NH * dqk, H, 1, "%s.%d.self_attn.q_proj.weight", p, l));
  }
  DI_TRY(bind_mat(b, &L->kv_a, c->kv_lora_rank + c->qk_rope_head_dim, H, 1, "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, l));
  DI_TRY(bind_vec(b, &L->kv_a_norm, c->kv_lora_rank, "%s.%d.self_attn.kv_a_layernorm.weight", p, l));
  DI_TRY(bind_mat(b, &L->kv_b, (int64_t)NH * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, 1,
                  "%s.%d.self_attn.kv_b_proj.weight", p, l));
  DI_TRY(bind_mat(b, &L->o_proj, H, (int64_t)NH * c->v_head_dim, 1, "%s.%d.self_attn.o_proj.weight", p, l));
  if (mtp) { /* the MTP layer's feed-forward is whatever the checkpoint holds */
    char nm[256];
    snprintf(nm, sizeof nm, "%s.%d.mlp.gate.weight", p, l);
    L->is_moe = c->n_routed_experts > 0 && di_tensor_source_find(b->src, nm) != NULL;
  } else {
    L->is_moe = di_cfg_is_moe_layer(c, l);
  }
  if (!L->is_moe) {
    DI_TRY(bind_mat(b, &L->gate, c->intermediate_size, H, 1, "%s.%d.mlp.gate_proj.weight", p, l));
    DI_TRY(bind_mat(b, &L->up, c->intermediate_size, H, 1, "%s.%d.mlp.up_proj.weight", p, l));
    DI_TRY(bind_mat(b, &L->down, H, c->intermediate_size, 1, "%s.%d.mlp.down_proj.weight", p, l));
  } else {
    const int E = c->n_routed_experts, I = c->moe_intermediate_size;
    DI_TRY(bind_mat(b, &L->router, E, H, 0, "%s.%d.mlp.gate.weight", p, l));
    if (c->topk_method == DI_TOPK_NOAUX_TC)
      DI_TRY(bind_vec(b, &L->router_bias, E, "%s.%d.mlp.gate.e_score_correction_bias", p, l));
    di_weight *ew = own(b->w, sizeof(di_weight) * 3 * (size_t)E);
    if (!ew)
      return di_error_set(DI_ERR_OOM, "out of memory");
    L->exp_gate = ew;
    L->exp_up = ew + E;
    L->exp_down = ew + 2 * E;
    for (int e = 0; e < E; e++) {
      DI_TRY(bind_mat(b, &L->exp_gate[e], I, H, 1, "%s.%d.mlp.experts.%d.gate_proj.weight", p, l, e));
      DI_TRY(bind_mat(b, &L->exp_up[e], I, H, 1, "%s.%d.mlp.experts.%d.up_proj.weight", p, l, e));
      DI_TRY(bind_mat(b, &L->exp_down[e], H, I, 1, "%s.%d.mlp.experts.%d.down_proj.weight", p, l, e));
    }
    if (c->n_shared_experts > 0) {
      const int SI = I * c->n_shared_experts;
      L->has_shared = 1;
      DI_TRY(bind_mat(b, &L->sh_gate, SI, H, 1, "%s.%d.mlp.shared_experts.gate_proj.weight", p, l));
      DI_TRY(bind_mat(b, &L->sh_up, SI, H, 1, "%s.%d.mlp.shared_experts.up_proj.weight", p, l));
      DI_TRY(bind_mat(b, &L->sh_down, H, SI, 1, "%s.%d.mlp.shared_experts.down_proj.weight", p, l));
    }
  }
  if (mtp) {
    DI_TRY(bind_vec(b, &L->enorm, H, "%s.%d.enorm.weight", p, l));
    DI_TRY(bind_vec(b, &L->hnorm, H, "%s.%d.hnorm.weight", p, l));
    DI_TRY(bind_mat(b, &L->eh_proj, H, 2 * (int64_t)H, 1, "%s.%d.eh_proj.weight", p, l));
    DI_TRY(bind_vec(b, &L->head_norm, H, "%s.%d.shared_head.norm.weight", p, l));
    /* real V3 checkpoints carry copies of the embedding and head inside the MTP layer */
    char nm[256];
    snprintf(nm, sizeof nm, "%s.%d.shared_head.head.weight", p, l);
    if (di_tensor_source_find(b->src, nm))
      DI_TRY(bind_mat(b, &L->head, c->vocab_size, H, 0, "%s", nm));
    else
      L->head = b->w->lm_head;
    snprintf(nm, sizeof nm, "%s.%d.embed_tokens.weight", p, l);
    if (di_tensor_source_find(b->src, nm))
      DI_TRY(bind_mat(b, &L->mtp_embed, c->vocab_size, H, 0, "%s", nm));
    else
      L->mtp_embed = b->w->embed;
  }
  return DI_OK;
}

int di_ds_weights_progress_units(const di_model_config *cfg) {
  return cfg->num_hidden_layers + cfg->num_nextn_predict_layers + 1;
}

di_status di_ds_weights_bind(const di_model_config *cfg, di_tensor_source *src, di_ds_weights *w,
                             struct di_progress *progress) {
  memset(w, 0, sizeof *w);
  binder b = {cfg, src, w, {0}};
  const int H = cfg->hidden_size;
  di_status st;
  /* MTP layers are optional: use them when the checkpoint has them */
  int n_mtp = 0;
  for (int j = 0; j < cfg->num_nextn_predict_layers; j++) {
    char nm[256];
    snprintf(nm, sizeof nm, "model.layers.%d.eh_proj.weight", cfg->num_hidden_layers + j);
    if (di_tensor_source_find(src, nm))
      n_mtp++;
    else
      break;
  }
  w->n_layers = cfg->num_hidden_layers;
  w->n_mtp = n_mtp;
  w->layers = calloc((size_t)(w->n_layers + n_mtp), sizeof(di_ds_layer));
  if (!w->layers)
    return di_error_set(DI_ERR_OOM, "out of memory");
  if ((st = bind_mat(&b, &w->embed, cfg->vocab_size, H, 0, "model.embed_tokens.weight")) != DI_OK)
    goto fail;
  if ((st = bind_vec(&b, &w->final_norm, H, "model.norm.weight")) != DI_OK)
    goto fail;
  if (cfg->tie_word_embeddings && !di_tensor_source_find(src, "lm_head.weight"))
    w->lm_head = w->embed;
  else if ((st = bind_mat(&b, &w->lm_head, cfg->vocab_size, H, 0, "lm_head.weight")) != DI_OK)
    goto fail;
  di_progress_add(progress, 1);
  for (int l = 0; l < w->n_layers + n_mtp; l++) {
    if ((st = bind_layer(&b, l, &w->layers[l], l >= w->n_layers)) != DI_OK)
      goto fail;
    di_progress_add(progress, 1);
  }
  return DI_OK;
fail:
  di_ds_weights_free(w);
  return st;
}

/* ---- dummy weights ------------------------------------------------------------------------------ */

typedef struct {
  uint64_t s;
} rng64;

static inline uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-a, a] with the variance of N(0, std^2): a = std * sqrt(3). Fast, and the values
 * only need realistic magnitudes. */
static di_status dummy_mat(di_ds_weights *w, const di_model_config *c, di_weight *out, int64_t rows, int64_t cols,
                           float std, int quantize, uint64_t *seed) {
  memset(out, 0, sizeof *out);
  out->name = "dummy";
  out->rows = rows;
  out->cols = cols;
  const int64_t n = rows * cols;
  const float a = std * 1.7320508f;
  if (c->fp8 && quantize) {
    uint8_t *q = own(w, (size_t)n);
    int64_t sr = (rows + c->fp8_block[0] - 1) / c->fp8_block[0], sc = (cols + c->fp8_block[1] - 1) / c->fp8_block[1];
    float *s = own(w, sizeof(float) * (size_t)(sr * sc));
    if (!q || !s)
      return di_error_set(DI_ERR_OOM, "dummy weights: out of memory (%lld x %lld)", (long long)rows, (long long)cols);
    /* values uniform over E4M3 codes of magnitude <= 448, one scale per block */
    for (int64_t i = 0; i < sr * sc; i++)
      s[i] = a / 448.0f;
    for (int64_t i = 0; i < n; i++) {
      uint8_t v = (uint8_t)(splitmix(seed) & 0xff);
      if ((v & 0x7f) == 0x7f)
        v &= 0xfe; /* avoid NaN codes */
      q[i] = v;
    }
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
  for (int64_t i = 0; i < n; i += 4) {
    uint64_t r = splitmix(seed);
    for (int k = 0; k < 4 && i + k < n; k++) {
      float u = (float)((r >> (16 * k)) & 0xffff) / 65535.0f;
      d[i + k] = di_f32_to_bf16((2.0f * u - 1.0f) * a);
    }
  }
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

di_status di_ds_weights_dummy(const di_model_config *c, uint64_t seed, di_ds_weights *w, struct di_progress *progress) {
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
    if ((st = dummy_mat(w, c, (out), (r), (cc), (std), (q), &s)) != DI_OK) \
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

static double wbytes(const di_weight *w) {
  if (!w->data)
    return 0;
  double b = (double)di_weight_bytes(w);
  if (w->scale_inv || w->scale_e8m0)
    b += (w->scale_inv ? 4.0 : 1.0) * (double)((w->rows + w->block_rows - 1) / w->block_rows) * (double)w->scale_cols;
  return b;
}

double di_ds_weights_bytes_per_token(const di_model_config *c, const di_ds_weights *w) {
  double b = wbytes(&w->lm_head);
  for (int l = 0; l < w->n_layers; l++) {
    const di_ds_layer *L = &w->layers[l];
    b += wbytes(&L->q_a) + wbytes(&L->q_b) + wbytes(&L->q_proj) + wbytes(&L->kv_a) + wbytes(&L->kv_b) +
         wbytes(&L->o_proj);
    if (!L->is_moe) {
      b += wbytes(&L->gate) + wbytes(&L->up) + wbytes(&L->down);
    } else {
      b += wbytes(&L->router);
      double per_expert = wbytes(&L->exp_gate[0]) + wbytes(&L->exp_up[0]) + wbytes(&L->exp_down[0]);
      b += per_expert * c->num_experts_per_tok;
      if (L->has_shared)
        b += wbytes(&L->sh_gate) + wbytes(&L->sh_up) + wbytes(&L->sh_down);
    }
  }
  return b;
}
