/* Binding DeepSeek-V2/V3 checkpoint tensors to di_ds_weights by their Hugging Face names, and
 * the bytes a decode step reads (the dummy weights are made in deepseek_dummy_weights.c). */
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
