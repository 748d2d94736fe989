/* DeepSeek-V2/V3 weights, bound by name from a checkpoint (or made up for --load-format dummy).
 * These are host views of the checkpoint tensors (no copies, except the few small conversions
 * noted); every backend builds its own device form from them. Shapes are [rows][cols] = [out][in]. */
#ifndef DI_ARCH_DEEPSEEK_H
#define DI_ARCH_DEEPSEEK_H
#include "model/config.h"
#include "model/weights.h"
#include "backend/backend.h"

typedef struct di_tensor_source di_tensor_source; /* see model/tensor_source.h */

typedef struct di_ds_layer {
  float *attn_norm;            /* [hidden] input_layernorm (f32 copy) */
  float *ffn_norm;             /* [hidden] post_attention_layernorm */
  /* attention (MLA) */
  di_weight q_a;               /* [q_lora, hidden]                      (q_lora_rank > 0) */
  float *q_a_norm;             /* [q_lora] */
  di_weight q_b;               /* [H*(nope+rope), q_lora]               (q_lora_rank > 0) */
  di_weight q_proj;            /* [H*(nope+rope), hidden]               (q_lora_rank == 0) */
  di_weight kv_a;              /* [kv_lora+rope, hidden] kv_a_proj_with_mqa */
  float *kv_a_norm;            /* [kv_lora] */
  di_weight kv_b;              /* [H*(nope+v), kv_lora] */
  di_weight o_proj;            /* [hidden, H*v] */
  /* feed-forward: dense MLP or MoE */
  int is_moe;
  di_weight gate, up, down;    /* dense: [inter, hidden], [inter, hidden], [hidden, inter] */
  di_weight router;            /* [E, hidden] mlp.gate.weight */
  float *router_bias;          /* [E] e_score_correction_bias (noaux_tc), else NULL */
  di_weight *exp_gate, *exp_up, *exp_down; /* [E] each [moe_inter, hidden] / [hidden, moe_inter] */
  di_weight sh_gate, sh_up, sh_down;       /* shared experts merged: [n_shared*moe_inter, hidden] ... */
  int has_shared;
  /* MTP module extras (only for layers >= num_hidden_layers) */
  float *enorm, *hnorm;        /* [hidden] */
  di_weight eh_proj;           /* [hidden, 2*hidden] */
  float *head_norm;            /* [hidden] shared_head.norm */
  di_weight head;              /* [vocab, hidden] shared_head.head */
  di_weight mtp_embed;         /* [vocab, hidden] embed_tokens copy in the MTP layer */
} di_ds_layer;

typedef struct di_ds_weights {
  di_weight embed;             /* [vocab, hidden] */
  float *final_norm;           /* [hidden] */
  di_weight lm_head;           /* [vocab, hidden] (== embed when tied) */
  int n_layers;                /* main layers */
  int n_mtp;                   /* MTP layers present (0 if the checkpoint has none) */
  di_ds_layer *layers;         /* [n_layers + n_mtp] */
  void *owned;                 /* allocations made while binding (f32 copies, dummy data) */
} di_ds_weights;

/* Both report one unit per layer to `progress` (NULL: silent), which the caller has begun with
 * di_ds_weights_progress_units() units. */
struct di_progress;
int di_ds_weights_progress_units(const di_model_config *cfg);
/* Binds every tensor the config calls for; a missing tensor or a shape/dtype that disagrees with
 * the config is an error naming the tensor (and the file it is in). */
di_status di_ds_weights_bind(const di_model_config *cfg, di_tensor_source *src, di_ds_weights *w,
                             struct di_progress *progress);
/* Random weights in the shapes the config describes (bf16, or FP8 block-scaled when the config
 * says fp8), deterministic in `seed`. */
di_status di_ds_weights_dummy(const di_model_config *cfg, uint64_t seed, di_ds_weights *w,
                              struct di_progress *progress);
void di_ds_weights_free(di_ds_weights *w);
/* --quantization fp8: the linear layers DeepSeek ships in FP8 quantized to 128 x 128 block FP8
 * (deepseek_quantize.c says which stay bf16). */
di_status di_ds_weights_quantize_fp8(const di_model_config *cfg, di_ds_weights *w);
/* Bytes of weights a decode step reads for one token (for roofline reports): attention, dense,
 * shared experts, top-k routed experts, lm_head; embedding row ignored. */
double di_ds_weights_bytes_per_token(const di_model_config *cfg, const di_ds_weights *w);
/* The KV cache groups of a V2/V3 model (deepseek_kv_groups.c): one group, the MLA latents of the
 * num_hidden_layers layers and the n_mtp_cached MTP layers the backend keeps, rows of row_stride
 * values (0: kv_lora_rank + qk_rope_head_dim, unpadded) of elem_bytes each. Every backend's kv_groups
 * and the registry entry answer through it. Returns 1 (<= cap). */
int di_ds_kv_groups(const di_model_config *cfg, int n_mtp_cached, int elem_bytes, int row_stride, di_kv_group_info *g,
                    int cap);
#endif
