/* A DSpark block drafter (arXiv 2607.05147; DeepSpec's checkpoint layout): its config and weights.
 *
 * A folder with config.json (a Qwen3 config plus DSpark's fields: block_size, target_layer_ids,
 * mask_token_id, markov_rank, markov_head_type, enable_confidence_head, confidence_head_with_markov)
 * and model.safetensors (DeepSpec's names: fc, hidden_norm, layers.N.{input_layernorm,
 * post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj},
 * norm, markov_head.markov_w1/markov_w2, confidence_head.proj). embed_tokens.weight and lm_head.weight
 * may be absent: DeepSpec copies them from the target and freezes them, so the target's are used
 * (then the drafter's hidden size must equal the target's). training/dspark_model.py writes this
 * layout; the forward is src/backend/cpu/cpu_dspark.c. */
#ifndef DI_ARCH_DSPARK_H
#define DI_ARCH_DSPARK_H
#include <cjson/cJSON.h>
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

#define DI_DSPARK_MAX_FEATS 16

typedef struct di_dspark_layer {
  float *in_norm, *post_norm;  /* [hidden] */
  float *q_norm, *k_norm;      /* [head_dim] (Qwen3: per-head RMSNorm of q and k) */
  di_weight q, k, v, o, gate, up, down;
} di_dspark_layer;

typedef struct di_dspark {
  int hidden, inter, n_layers, n_heads, n_kv_heads, head_dim, vocab;
  int block_size, mask_token, markov_rank, has_conf, conf_with_markov;
  int n_feats;                           /* target layers whose hidden states are the context */
  int feat_layers[DI_DSPARK_MAX_FEATS];  /* HF numbering: output of that layer; the last after the norm */
  int target_hidden;                     /* one feature row is n_feats * target_hidden floats */
  float eps, rope_theta;
  di_tensor_source *src;
  di_weight fc;                          /* [hidden][n_feats * target_hidden] */
  di_weight embed, lm_head;              /* the drafter's, or the target's */
  float *hidden_norm, *norm;             /* [hidden] */
  di_dspark_layer *layers;
  di_weight markov_w1, markov_w2;        /* [vocab][rank] each (w2 is a Linear(rank, vocab)) */
  float *conf_w;                         /* [hidden (+ rank)] */
  float conf_b;
  int conf_dim;
} di_dspark;

/* Loads the drafter in `dir` for a target with config `target` whose embedding and output head are
 * `t_embed` / `t_head` (used when the checkpoint has none). Errors name the file and the field. */
di_status di_dspark_load(const char *dir, const di_model_config *target, const di_weight *t_embed,
                         const di_weight *t_head, di_dspark **out);
void di_dspark_free(di_dspark *d);
/* The config half of di_dspark_load: d's shape and DSpark fields from the parsed config.json `j`
 * (`path` names it in errors), each checked against its range and the target. Exposed for the fuzz
 * target (fuzz/fuzz_dspark_config.c). */
di_status di_dspark_read_config(di_dspark *d, const cJSON *j, const char *path, const di_model_config *t);
#endif
