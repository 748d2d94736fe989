/* The model configuration read from config.json (both the original DeepSeek dialect, with
 * `rope_scaling` + `rope_theta`, and the transformers>=5 one, with `rope_parameters`) and
 * generation_config.json. Everything the forward pass needs is resolved here, so the architecture
 * code never looks at JSON. */
#ifndef DI_MODEL_CONFIG_H
#define DI_MODEL_CONFIG_H
#include <stdint.h>
#include "util/status.h"

/* DI_ARCH_DEEPSEEK_V4: only the generic fields below are filled (vocabulary, sizes, context, tokens,
 * generation defaults); the architecture is di_v4_config (arch/deepseek_v4.h). */
typedef enum { DI_ARCH_DEEPSEEK_V2 = 2, DI_ARCH_DEEPSEEK_V3 = 3, DI_ARCH_DEEPSEEK_V4 = 4 } di_arch;
typedef enum { DI_SCORE_SOFTMAX, DI_SCORE_SIGMOID } di_score_func;
typedef enum { DI_TOPK_GREEDY, DI_TOPK_GROUP_LIMITED_GREEDY, DI_TOPK_NOAUX_TC } di_topk_method;

#define DI_MAX_EOS 8
/* Limits the kernels size their per-token router scratch by (DeepSeek-V3 has 256 experts, 8 groups). */
#define DI_MAX_EXPERTS 1024
#define DI_MAX_EXPERT_GROUPS 256

typedef struct di_model_config {
  di_arch arch;
  char model_type[32];
  int vocab_size;
  int hidden_size;
  int intermediate_size;       /* dense MLP */
  int moe_intermediate_size;   /* one routed expert */
  int num_hidden_layers;       /* main model layers (MTP layers come after) */
  int num_nextn_predict_layers;
  int num_attention_heads;
  /* MLA */
  int q_lora_rank;             /* 0: no q compression (q_proj) */
  int kv_lora_rank;
  int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  /* MoE */
  int n_routed_experts;        /* 0: dense model */
  int n_shared_experts;
  int num_experts_per_tok;
  int first_k_dense_replace;
  int moe_layer_freq;
  int n_group, topk_group;
  di_topk_method topk_method;
  di_score_func scoring_func;
  int norm_topk_prob;
  float routed_scaling_factor;
  /* routed_scaling_factor also scales renormalized weights (V3's code; V2's scales only weights it
   * did not renormalize): the parser sets it from model_type, so forwards need no architecture test */
  int scale_after_renorm;
  /* norms, rope */
  float rms_norm_eps;
  int max_position_embeddings;
  double rope_theta;
  int rope_interleave;         /* 1: rotate adjacent pairs (DeepSeek checkpoints); 0: half-split pairs */
  int rope_yarn;               /* YaRN scaling on */
  double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
  int yarn_original_max_pos;
  float softmax_scale;         /* resolved: 1/sqrt(qk_head_dim) * mscale(all_dim)^2 */
  float rope_attention_factor; /* resolved: multiplies cos/sin (YaRN "_mscale") */
  int tie_word_embeddings;
  /* quantization */
  int fp8;                     /* quantization_config.quant_method == fp8 */
  int fp8_block[2];            /* weight_block_size [rows, cols] */
  /* tokens */
  int bos_token_id;            /* -1: none */
  int n_eos;
  int32_t eos_token_ids[DI_MAX_EOS];
  /* generation_config.json defaults (NaN / -1 when absent) */
  float gen_temperature, gen_top_p;
  int gen_top_k;
} di_model_config;

/* Parses `dir`/config.json (and generation_config.json when present). Unknown model_type or an
 * unsupported option: DI_ERR_UNSUPPORTED naming it. */
di_status di_model_config_load(const char *dir, di_model_config *cfg);
/* Same from a JSON text (for tests and fuzzing); `gen_json` may be NULL. */
di_status di_model_config_parse(const char *json, size_t len, const char *gen_json, size_t gen_len,
                                di_model_config *cfg);
/* di_model_config_load that also hands back config.json's parsed tree (when tree is non-NULL; the
 * caller frees it with cJSON_Delete), so an architecture's own reader works on the same parse: each
 * config.json is parsed once. */
struct cJSON;
di_status di_model_config_load_tree(const char *dir, di_model_config *cfg, struct cJSON **tree);
/* The fields of a parsed config.json tree (and generation_config.json's text, may be NULL). */
di_status di_model_config_from_tree(const struct cJSON *root, const char *gen_json, size_t gen_len,
                                    di_model_config *cfg);
/* Derived sizes. */
static inline int di_cfg_qk_head_dim(const di_model_config *c) { return c->qk_nope_head_dim + c->qk_rope_head_dim; }
static inline int di_cfg_is_moe_layer(const di_model_config *c, int layer) {
  return c->n_routed_experts > 0 && layer >= c->first_k_dense_replace &&
         layer % (c->moe_layer_freq > 0 ? c->moe_layer_freq : 1) == 0;
}
/* Inverse frequencies of the rotary embedding (qk_rope_head_dim/2 values), YaRN applied. */
void di_rope_inv_freq(const di_model_config *c, double *inv_freq);
#endif
