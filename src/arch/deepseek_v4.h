/* DeepSeek-V4 (model_type "deepseek_v4"): the configuration read from config.json and the checkpoint
 * tensors bound by name. A building block for the float32 CPU reference forward
 * (backend/cpu/cpu_deepseek_v4.h); the model loader does not serve V4 yet. Shapes are [out][in]. */
#ifndef DI_ARCH_DEEPSEEK_V4_H
#define DI_ARCH_DEEPSEEK_V4_H
#include <stddef.h>
#include <stdint.h>
#include "model/weights.h"
#include "util/status.h"

#define DI_V4_MAX_LAYERS 256

typedef enum { DI_V4_ATTN_SLIDING = 0, DI_V4_ATTN_CSA, DI_V4_ATTN_HCA } di_v4_attn_kind;
typedef enum { DI_V4_FFN_MOE = 0, DI_V4_FFN_HASH_MOE } di_v4_ffn_kind;
typedef enum { DI_V4_SCORE_SQRTSOFTPLUS = 0, DI_V4_SCORE_SIGMOID } di_v4_score_fn;

/* One rotary setting ("main": sliding-only layers; "compress": CSA/HCA layers, their compressors and
 * the indexer). Interleaved pairs on the trailing `dim` channels of a head. */
typedef struct di_v4_rope {
  int dim;                   /* rotated channels: int(head_dim * partial_rotary_factor), even */
  double theta;
  int yarn;                  /* 0: plain RoPE */
  double factor, beta_fast, beta_slow;
  int64_t original_max_pos;
  double attention_factor;   /* cos/sin multiplier (1 for plain RoPE) */
} di_v4_rope;

typedef struct di_v4_config {
  int vocab_size, hidden_size, n_layers;
  int n_heads, head_dim;     /* one shared K=V head of head_dim */
  int q_lora_rank;
  int o_groups, o_lora_rank; /* grouped low-rank output projection */
  int n_routed_experts, n_shared_experts, top_k, moe_inter;
  double routed_scaling;
  di_v4_score_fn scoring;
  double rms_eps, hc_eps;
  int hc_mult, hc_sinkhorn_iters;
  double swiglu_limit;
  int sliding_window;
  int csa_rate, hca_rate;    /* source tokens per compressed entry */
  int index_n_heads, index_head_dim, index_topk;
  di_v4_rope rope_main, rope_compress;
  int fp8, fp8_block[2];     /* block-scaled FP8 linear weights (quantization_config) */
  uint8_t attn_kind[DI_V4_MAX_LAYERS]; /* di_v4_attn_kind per layer */
  uint8_t ffn_kind[DI_V4_MAX_LAYERS];  /* di_v4_ffn_kind per layer */
} di_v4_config;

/* Parses config.json text. Missing required fields, values of the wrong type and inconsistent values
 * are errors naming the field. Accepts both the transformers 5.x form (layer_types, mlp_layer_types,
 * nested rope_parameters {main, compress}) and the original one (compress_ratios, num_hash_layers,
 * qk_rope_head_dim, rope_scaling + compress_rope_theta). */
di_status di_v4_config_parse(const char *json, size_t len, di_v4_config *cfg);
/* The same from config.json's parsed tree (the model loader's one parse; model/config.h). */
struct cJSON;
di_status di_v4_config_from_tree(const struct cJSON *root, di_v4_config *cfg);

/* A compressor: per source token a KV projection and a gate projection (2*dim wide for CSA's two
 * overlapping series, dim for HCA), an additive position bias per slot of the window, an RMSNorm. */
typedef struct di_v4_compressor {
  int dim, width;            /* width = 2*dim (overlapping windows) or dim */
  di_weight wkv, wgate;      /* [width, hidden] */
  float *ape;                /* [rate][width] */
  float *norm;               /* [dim] */
} di_v4_compressor;

typedef struct di_v4_layer {
  float *attn_norm, *ffn_norm;           /* [hidden] */
  /* hyper-connections, one set before attention and one before the FFN */
  di_weight hc_attn_fn, hc_ffn_fn;       /* [(2+hc)*hc, hc*hidden] */
  float *hc_attn_base, *hc_ffn_base;     /* [(2+hc)*hc] */
  float *hc_attn_scale, *hc_ffn_scale;   /* [3]: pre, post, comb */
  /* attention */
  di_weight wq_a;                        /* [q_lora, hidden] */
  float *q_norm;                         /* [q_lora] */
  di_weight wq_b;                        /* [heads*head_dim, q_lora] */
  di_weight wkv;                         /* [head_dim, hidden] */
  float *kv_norm;                        /* [head_dim] */
  di_weight wo_a;                        /* [o_groups*o_lora, heads*head_dim/o_groups] */
  di_weight wo_b;                        /* [hidden, o_groups*o_lora] */
  float *sink;                           /* [heads] */
  di_v4_compressor comp;                 /* CSA / HCA layers */
  di_v4_compressor icomp;                /* CSA: the indexer's own compressor (index_head_dim) */
  di_weight idx_wq_b;                    /* CSA: [index_heads*index_head_dim, q_lora] */
  di_weight idx_weights;                 /* CSA: [index_heads, hidden] */
  /* MoE */
  di_weight router;                      /* [E, hidden] */
  float *router_bias;                    /* [E] (learned top-k routing) */
  int32_t *tid2eid;                      /* [vocab][top_k] (hash routing) */
  di_weight *exp_w1, *exp_w2, *exp_w3;   /* [E]: gate [moe_inter, hidden], down [hidden, moe_inter], up */
  di_weight sh_w1, sh_w2, sh_w3;         /* shared expert, moe_inter wide */
} di_v4_layer;

typedef struct di_v4_weights {
  di_weight embed;                       /* [vocab, hidden] */
  di_weight head;                        /* [vocab, hidden] */
  float *final_norm;                     /* [hidden] */
  di_weight hc_head_fn;                  /* [hc, hc*hidden] */
  float *hc_head_base;                   /* [hc] */
  float *hc_head_scale;                  /* [1] */
  int n_layers;
  di_v4_layer *layers;
  void *owned;                           /* allocations made while binding */
} di_v4_weights;

struct di_tensor_source;
/* Binds every tensor the config calls for, under either naming flavour: the original one
 * ("embed.weight", "layers.L.attn.wq_a.weight", "hc_head_fn", ...) or the one transformers'
 * save_pretrained writes ("model.embed_tokens.weight", "model.layers.L.attn.wq_a.weight",
 * "model.hc_head.hc_fn", ...). A missing tensor or a shape that disagrees with the config is an error
 * naming the tensor. */
di_status di_v4_weights_bind(const di_v4_config *cfg, const struct di_tensor_source *src, di_v4_weights *w);
void di_v4_weights_free(di_v4_weights *w);

#endif
