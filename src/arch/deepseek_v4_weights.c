/* Binding DeepSeek-V4 checkpoint tensors to di_v4_weights by name. Both naming flavours are read:
 * the original checkpoints' ("embed.weight", "layers.L.attn.wq_a.weight", "hc_head_fn") and the one
 * transformers' save_pretrained writes ("model.embed_tokens.weight", "model.layers.L...", "model.hc_head.hc_fn").
 * Matrices stay views of the checkpoint (any dtype the weight views handle); 1-D tensors are copied to f32. */
#include "arch/deepseek_v4.h"
#include "model/safetensors.h"
#include "util/owned.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *own(di_v4_weights *w, size_t bytes) { return di_owned_alloc(&w->owned, bytes); }

void di_v4_weights_free(di_v4_weights *w) {
  if (!w)
    return;
  di_owned_free(&w->owned);
  if (w->layers)
    for (int l = 0; l < w->n_layers; l++)
      free(w->layers[l].exp_w1); /* one block for w1, w2, w3 */
  free(w->layers);
  memset(w, 0, sizeof *w);
}

typedef struct {
  const di_v4_config *cfg;
  const di_tensor_source *src;
  di_v4_weights *w;
  const char *layer_prefix; /* "model.layers" or "layers" */
  int hf;                   /* transformers' flavour */
  char name[512];
} binder;

static di_status bind_mat_named(binder *b, di_weight *out, int64_t rows, int64_t cols) {
  DI_TRY(di_tensor_source_weight(b->src, b->name, rows, cols, b->cfg->fp8 ? b->cfg->fp8_block : NULL, out));
  if (di_weight_align_scales(out, &b->w->owned))
    return di_error_set(DI_ERR_OOM, "out of memory");
  return DI_OK;
}

/* A matrix of layer `l` named by its suffix ("attn.wq_a.weight"). */
static di_status bind_mat(binder *b, di_weight *out, int64_t rows, int64_t cols, int l, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static di_status bind_mat(binder *b, di_weight *out, int64_t rows, int64_t cols, int l, const char *fmt, ...) {
  int n = l >= 0 ? snprintf(b->name, sizeof b->name, "%s.%d.", b->layer_prefix, l) : 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->name + n, sizeof b->name - (size_t)n, fmt, ap);
  va_end(ap);
  return bind_mat_named(b, out, rows, cols);
}

/* A tensor copied to float32: 1-D [n] when rows == 0, else [rows][n]. */
static di_status bind_f32(binder *b, float **out, int64_t rows, int64_t n, int l, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static di_status bind_f32(binder *b, float **out, int64_t rows, int64_t n, int l, const char *fmt, ...) {
  int k = l >= 0 ? snprintf(b->name, sizeof b->name, "%s.%d.", b->layer_prefix, l) : 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->name + k, sizeof b->name - (size_t)k, fmt, ap);
  va_end(ap);
  di_weight v;
  DI_TRY(di_tensor_source_weight(b->src, b->name, rows, n, NULL, &v));
  if (v.dtype == DI_DT_F8E4M3)
    return di_error_set(DI_ERR_FORMAT, "tensor '%s' is FP8; expected F32, BF16 or F16", b->name);
  float *f = own(b->w, sizeof(float) * (size_t)(rows ? rows : 1) * (size_t)n);
  if (!f)
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_weight_rows_f32(&v, 0, v.rows, f);
  *out = f;
  return DI_OK;
}

/* Hash routing table: integer [vocab][top_k] of expert ids, copied to int32 and range-checked. */
static di_status bind_tid2eid(binder *b, int l, int32_t **out) {
  const di_v4_config *c = b->cfg;
  snprintf(b->name, sizeof b->name, "%s.%d.ffn.gate.tid2eid", b->layer_prefix, l);
  const di_st_tensor *t = di_tensor_source_find(b->src, b->name);
  if (!t)
    return di_error_set(DI_ERR_NOT_FOUND, "missing tensor '%s' (hash-routed layer %d) in %s", b->name, l,
                        di_tensor_source_describe(b->src));
  if (t->dtype != DI_DT_I32 && t->dtype != DI_DT_I64)
    return di_error_set(DI_ERR_FORMAT, "tensor '%s' has dtype %s (expected I32 or I64)", b->name, t->dtype_name);
  if (t->ndim != 2 || t->shape[0] != c->vocab_size || t->shape[1] != c->top_k)
    return di_error_set(DI_ERR_FORMAT, "tensor '%s' must have shape [%d, %d] (vocab_size, num_experts_per_tok)", b->name,
                        c->vocab_size, c->top_k);
  size_t n = (size_t)c->vocab_size * (size_t)c->top_k;
  int32_t *ids = own(b->w, n * sizeof(int32_t));
  if (!ids)
    return di_error_set(DI_ERR_OOM, "out of memory");
  const unsigned char *p = t->data;
  for (size_t i = 0; i < n; i++) {
    int64_t v;
    if (t->dtype == DI_DT_I64) {
      memcpy(&v, p + 8 * i, 8);
    } else {
      int32_t v32;
      memcpy(&v32, p + 4 * i, 4);
      v = v32;
    }
    if (v < 0 || v >= c->n_routed_experts)
      return di_error_set(DI_ERR_FORMAT, "tensor '%s': entry [%zu][%zu] = %lld is not an expert id (n_routed_experts %d)", b->name,
                          i / (size_t)c->top_k, i % (size_t)c->top_k, (long long)v, c->n_routed_experts);
    ids[i] = (int32_t)v;
  }
  *out = ids;
  return DI_OK;
}

static di_status bind_compressor(binder *b, int l, const char *pfx, int dim, int overlap, int rate, di_v4_compressor *cp) {
  const int D = b->cfg->hidden_size;
  cp->dim = dim;
  cp->width = overlap ? 2 * dim : dim;
  DI_TRY(bind_mat(b, &cp->wkv, cp->width, D, l, "%s.wkv.weight", pfx));
  DI_TRY(bind_mat(b, &cp->wgate, cp->width, D, l, "%s.wgate.weight", pfx));
  DI_TRY(bind_f32(b, &cp->ape, rate, cp->width, l, "%s.ape", pfx));
  DI_TRY(bind_f32(b, &cp->norm, 0, dim, l, "%s.norm.weight", pfx));
  return DI_OK;
}

static di_status bind_layer(binder *b, int l, di_v4_layer *L) {
  const di_v4_config *c = b->cfg;
  const int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, NH = c->n_heads, hd = c->head_dim;
  const int E = c->n_routed_experts, I = c->moe_inter;
  DI_TRY(bind_f32(b, &L->attn_norm, 0, D, l, "attn_norm.weight"));
  DI_TRY(bind_f32(b, &L->ffn_norm, 0, D, l, "ffn_norm.weight"));
  DI_TRY(bind_mat(b, &L->hc_attn_fn, mix, (int64_t)hc * D, l, "hc_attn_fn"));
  DI_TRY(bind_f32(b, &L->hc_attn_base, 0, mix, l, "hc_attn_base"));
  DI_TRY(bind_f32(b, &L->hc_attn_scale, 0, 3, l, "hc_attn_scale"));
  DI_TRY(bind_mat(b, &L->hc_ffn_fn, mix, (int64_t)hc * D, l, "hc_ffn_fn"));
  DI_TRY(bind_f32(b, &L->hc_ffn_base, 0, mix, l, "hc_ffn_base"));
  DI_TRY(bind_f32(b, &L->hc_ffn_scale, 0, 3, l, "hc_ffn_scale"));

  DI_TRY(bind_mat(b, &L->wq_a, c->q_lora_rank, D, l, "attn.wq_a.weight"));
  DI_TRY(bind_f32(b, &L->q_norm, 0, c->q_lora_rank, l, "attn.q_norm.weight"));
  DI_TRY(bind_mat(b, &L->wq_b, (int64_t)NH * hd, c->q_lora_rank, l, "attn.wq_b.weight"));
  DI_TRY(bind_mat(b, &L->wkv, hd, D, l, "attn.wkv.weight"));
  DI_TRY(bind_f32(b, &L->kv_norm, 0, hd, l, "attn.norm.weight"));
  DI_TRY(bind_mat(b, &L->wo_a, (int64_t)c->o_groups * c->o_lora_rank, (int64_t)NH * hd / c->o_groups, l, "attn.wo_a.weight"));
  DI_TRY(bind_mat(b, &L->wo_b, D, (int64_t)c->o_groups * c->o_lora_rank, l, "attn.wo_b.weight"));
  DI_TRY(bind_f32(b, &L->sink, 0, NH, l, "attn.attn_sink"));
  if (c->attn_kind[l] == DI_V4_ATTN_CSA) {
    DI_TRY(bind_compressor(b, l, "attn.compressor", hd, 1, c->csa_rate, &L->comp));
    DI_TRY(bind_compressor(b, l, "attn.indexer.compressor", c->index_head_dim, 1, c->csa_rate, &L->icomp));
    DI_TRY(bind_mat(b, &L->idx_wq_b, (int64_t)c->index_n_heads * c->index_head_dim, c->q_lora_rank, l, "attn.indexer.wq_b.weight"));
    DI_TRY(bind_mat(b, &L->idx_weights, c->index_n_heads, D, l, "attn.indexer.weights_proj.weight"));
  } else if (c->attn_kind[l] == DI_V4_ATTN_HCA) {
    DI_TRY(bind_compressor(b, l, "attn.compressor", hd, 0, c->hca_rate, &L->comp));
  }

  DI_TRY(bind_mat(b, &L->router, E, D, l, "ffn.gate.weight"));
  if (c->ffn_kind[l] == DI_V4_FFN_HASH_MOE)
    DI_TRY(bind_tid2eid(b, l, &L->tid2eid));
  else
    DI_TRY(bind_f32(b, &L->router_bias, 0, E, l, "ffn.gate.bias"));
  L->exp_w1 = calloc((size_t)E * 3, sizeof(di_weight));
  if (!L->exp_w1)
    return di_error_set(DI_ERR_OOM, "out of memory");
  L->exp_w2 = L->exp_w1 + E;
  L->exp_w3 = L->exp_w1 + 2 * E;
  for (int e = 0; e < E; e++) {
    DI_TRY(bind_mat(b, &L->exp_w1[e], I, D, l, "ffn.experts.%d.w1.weight", e));
    DI_TRY(bind_mat(b, &L->exp_w2[e], D, I, l, "ffn.experts.%d.w2.weight", e));
    DI_TRY(bind_mat(b, &L->exp_w3[e], I, D, l, "ffn.experts.%d.w3.weight", e));
  }
  /* transformers builds one shared MLP moe_intermediate_size wide whatever n_shared_experts says */
  DI_TRY(bind_mat(b, &L->sh_w1, I, D, l, "ffn.shared_experts.w1.weight"));
  DI_TRY(bind_mat(b, &L->sh_w2, D, I, l, "ffn.shared_experts.w2.weight"));
  DI_TRY(bind_mat(b, &L->sh_w3, I, D, l, "ffn.shared_experts.w3.weight"));
  return DI_OK;
}

static di_status bind_all(binder *b) {
  const di_v4_config *c = b->cfg;
  di_v4_weights *w = b->w;
  const int D = c->hidden_size, hc = c->hc_mult;
  if (b->hf) {
    DI_TRY(bind_mat(b, &w->embed, c->vocab_size, D, -1, "model.embed_tokens.weight"));
    DI_TRY(bind_f32(b, &w->final_norm, 0, D, -1, "model.norm.weight"));
    DI_TRY(bind_mat(b, &w->hc_head_fn, hc, (int64_t)hc * D, -1, "model.hc_head.hc_fn"));
    DI_TRY(bind_f32(b, &w->hc_head_base, 0, hc, -1, "model.hc_head.hc_base"));
    DI_TRY(bind_f32(b, &w->hc_head_scale, 0, 1, -1, "model.hc_head.hc_scale"));
  } else {
    DI_TRY(bind_mat(b, &w->embed, c->vocab_size, D, -1, "embed.weight"));
    DI_TRY(bind_f32(b, &w->final_norm, 0, D, -1, "norm.weight"));
    DI_TRY(bind_mat(b, &w->hc_head_fn, hc, (int64_t)hc * D, -1, "hc_head_fn"));
    DI_TRY(bind_f32(b, &w->hc_head_base, 0, hc, -1, "hc_head_base"));
    DI_TRY(bind_f32(b, &w->hc_head_scale, 0, 1, -1, "hc_head_scale"));
  }
  /* the output head is "head.weight" in both flavours (save_pretrained keeps the original name) */
  const char *head = di_tensor_source_find(b->src, "lm_head.weight") && !di_tensor_source_find(b->src, "head.weight")
                         ? "lm_head.weight"
                         : "head.weight";
  DI_TRY(bind_mat(b, &w->head, c->vocab_size, D, -1, "%s", head));
  w->layers = calloc((size_t)c->n_layers, sizeof(di_v4_layer));
  if (!w->layers)
    return di_error_set(DI_ERR_OOM, "out of memory");
  w->n_layers = c->n_layers;
  for (int l = 0; l < c->n_layers; l++)
    DI_TRY(bind_layer(b, l, &w->layers[l]));
  return DI_OK;
}

di_status di_v4_weights_bind(const di_v4_config *cfg, const di_tensor_source *src, di_v4_weights *w) {
  memset(w, 0, sizeof *w);
  binder b = {.cfg = cfg, .src = src, .w = w};
  b.hf = di_tensor_source_find(src, "model.embed_tokens.weight") != NULL ||
         di_tensor_source_find(src, "model.layers.0.attn_norm.weight") != NULL;
  b.layer_prefix = b.hf ? "model.layers" : "layers";
  di_status st = bind_all(&b);
  if (st != DI_OK)
    di_v4_weights_free(w);
  return st;
}
