/* Loading a DSpark drafter folder (see dspark.h): config.json checked field by field against the
 * target, then every tensor bound by name and shape from the memory-mapped safetensors. Norm vectors
 * and the confidence head are copied to float32 (the row ops take float vectors); matrices stay as
 * stored (the CPU GEMM reads BF16/F16/F32/FP8 in place). */
#include "arch/dspark.h"
#include "util/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void di_dspark_free(di_dspark *d) {
  if (!d) return;
  if (d->layers)
    for (int l = 0; l < d->n_layers; l++) {
      free(d->layers[l].in_norm); free(d->layers[l].post_norm);
      free(d->layers[l].q_norm); free(d->layers[l].k_norm);
    }
  free(d->layers);
  free(d->hidden_norm); free(d->norm); free(d->conf_w);
  di_tensor_source_free(d->src);
  free(d);
}

static di_status cfg_int(const cJSON *j, const char *key, int64_t def, int64_t lo, int64_t hi, const char *what, int *out) {
  int64_t v;
  DI_TRY(di_json_int(j, key, def, what, &v));
  if (v < lo || v > hi)
    return di_error_set(DI_ERR_INVALID_ARG, "%s: %s = %lld is outside [%lld, %lld]", what, key, (long long)v,
                        (long long)lo, (long long)hi);
  *out = (int)v;
  return DI_OK;
}

di_status di_dspark_read_config(di_dspark *d, const cJSON *j, const char *path, const di_model_config *t) {
  di_status st = DI_OK;
  double eps = 1e-6, theta = 10000;
  const char *mtype = "vanilla";
  int tie = 0, sliding = 0;
#define C(x) do { st = (x); if (st != DI_OK) goto done; } while (0)
  C(cfg_int(j, "hidden_size", -1, 1, 65536, path, &d->hidden));
  C(cfg_int(j, "intermediate_size", -1, 1, 1 << 20, path, &d->inter));
  C(cfg_int(j, "num_hidden_layers", -1, 1, 256, path, &d->n_layers));
  C(cfg_int(j, "num_attention_heads", -1, 1, 1024, path, &d->n_heads));
  C(cfg_int(j, "num_key_value_heads", d->n_heads, 1, 1024, path, &d->n_kv_heads));
  C(cfg_int(j, "head_dim", d->hidden / d->n_heads, 2, 1024, path, &d->head_dim));
  C(cfg_int(j, "vocab_size", t->vocab_size, 1, 1 << 24, path, &d->vocab));
  C(cfg_int(j, "block_size", -1, 1, 64, path, &d->block_size));
  C(cfg_int(j, "mask_token_id", -1, 0, d->vocab - 1, path, &d->mask_token));
  C(cfg_int(j, "markov_rank", 0, 0, 1024, path, &d->markov_rank));
  C(di_json_bool(j, "enable_confidence_head", 0, path, &d->has_conf));
  C(di_json_bool(j, "confidence_head_with_markov", 0, path, &d->conf_with_markov));
  C(di_json_bool(j, "tie_word_embeddings", 0, path, &tie));
  C(di_json_bool(j, "use_sliding_window", 0, path, &sliding));
  C(di_json_num(j, "rms_norm_eps", 1e-6, path, &eps));
  C(di_json_num(j, "rope_theta", 10000, path, &theta));
  C(di_json_str(j, "markov_head_type", "vanilla", path, &mtype));
#undef C
  d->eps = (float)eps;
  d->rope_theta = (float)theta;
  if (d->n_heads % d->n_kv_heads || d->head_dim % 2) {
    st = di_error_set(DI_ERR_INVALID_ARG, "%s: num_attention_heads %d must be a multiple of num_key_value_heads %d and "
                      "head_dim %d even", path, d->n_heads, d->n_kv_heads, d->head_dim);
    goto done;
  }
  if (d->vocab != t->vocab_size) {
    st = di_error_set(DI_ERR_INVALID_ARG, "%s: vocab_size %d differs from the target's %d", path, d->vocab, t->vocab_size);
    goto done;
  }
  if (d->markov_rank > 0 && strcmp(mtype, "vanilla") != 0) {
    st = di_error_set(DI_ERR_UNSUPPORTED, "%s: markov_head_type \"%s\" is not supported (only \"vanilla\")", path, mtype);
    goto done;
  }
  if (tie || sliding) {
    st = di_error_set(DI_ERR_UNSUPPORTED, "%s: %s is not supported for a DSpark drafter", path,
                      tie ? "tie_word_embeddings" : "use_sliding_window");
    goto done;
  }
  if (d->conf_with_markov && d->markov_rank == 0) {
    st = di_error_set(DI_ERR_INVALID_ARG, "%s: confidence_head_with_markov needs markov_rank > 0", path);
    goto done;
  }
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "target_layer_ids");
  int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
  if (n < 1 || n > DI_DSPARK_MAX_FEATS) {
    st = di_error_set(DI_ERR_INVALID_ARG, "%s: target_layer_ids must be an array of 1..%d layer ids", path, DI_DSPARK_MAX_FEATS);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    int64_t v;
    if (!di_json_int_in(cJSON_GetArrayItem(ids, i), -1, t->num_hidden_layers - 1, &v) || (i > 0 && v <= d->feat_layers[i - 1])) {
      st = di_error_set(DI_ERR_INVALID_ARG, "%s: target_layer_ids[%d] must be increasing ids in [-1, %d] (the target's "
                        "layers; -1 = the embedding)", path, i, t->num_hidden_layers - 1);
      goto done;
    }
    d->feat_layers[i] = (int)v;
  }
  d->n_feats = n;
  d->target_hidden = t->hidden_size;
done:
  return st;
}

static di_status read_config(di_dspark *d, const char *path, const di_model_config *t) {
  cJSON *j = NULL;
  DI_TRY(di_json_read_file(path, &j));
  di_status st = di_dspark_read_config(d, j, path, t);
  cJSON_Delete(j);
  return st;
}

static di_status vec(const di_dspark *d, const char *name, int64_t n, float **out) {
  di_weight w;
  DI_TRY(di_tensor_source_weight(d->src, name, 0, n, NULL, &w));
  *out = malloc(sizeof(float) * (size_t)n);
  if (!*out) return di_error_set(DI_ERR_OOM, "out of memory for %s", name);
  di_weight_rows_f32(&w, 0, 1, *out);
  return DI_OK;
}

static di_status mat(const di_dspark *d, const char *name, int64_t rows, int64_t cols, di_weight *out) {
  return di_tensor_source_weight(d->src, name, rows, cols, NULL, out);
}

static di_status bind(di_dspark *d, const di_weight *t_embed, const di_weight *t_head) {
  const int64_t H = d->hidden, V = d->vocab, R = d->markov_rank, HD = d->head_dim;
  DI_TRY(mat(d, "fc.weight", H, (int64_t)d->n_feats * d->target_hidden, &d->fc));
  DI_TRY(vec(d, "hidden_norm.weight", H, &d->hidden_norm));
  DI_TRY(vec(d, "norm.weight", H, &d->norm));
  if (di_tensor_source_find(d->src, "embed_tokens.weight")) DI_TRY(mat(d, "embed_tokens.weight", V, H, &d->embed));
  else if (t_embed && t_embed->cols == H) d->embed = *t_embed;
  else return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafter: no embed_tokens.weight and the target's hidden size %lld "
                           "differs from the drafter's %lld", (long long)(t_embed ? t_embed->cols : 0), (long long)H);
  if (di_tensor_source_find(d->src, "lm_head.weight")) DI_TRY(mat(d, "lm_head.weight", V, H, &d->lm_head));
  else if (t_head && t_head->cols == H) d->lm_head = *t_head;
  else return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafter: no lm_head.weight and the target's head does not fit");
  d->layers = calloc((size_t)d->n_layers, sizeof *d->layers);
  if (!d->layers) return di_error_set(DI_ERR_OOM, "out of memory");
  char nm[160];
  for (int l = 0; l < d->n_layers; l++) {
    di_dspark_layer *L = &d->layers[l];
#define N(suffix) (snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix), nm)
    DI_TRY(vec(d, N("input_layernorm.weight"), H, &L->in_norm));
    DI_TRY(vec(d, N("post_attention_layernorm.weight"), H, &L->post_norm));
    DI_TRY(vec(d, N("self_attn.q_norm.weight"), HD, &L->q_norm));
    DI_TRY(vec(d, N("self_attn.k_norm.weight"), HD, &L->k_norm));
    DI_TRY(mat(d, N("self_attn.q_proj.weight"), d->n_heads * HD, H, &L->q));
    DI_TRY(mat(d, N("self_attn.k_proj.weight"), d->n_kv_heads * HD, H, &L->k));
    DI_TRY(mat(d, N("self_attn.v_proj.weight"), d->n_kv_heads * HD, H, &L->v));
    DI_TRY(mat(d, N("self_attn.o_proj.weight"), H, d->n_heads * HD, &L->o));
    DI_TRY(mat(d, N("mlp.gate_proj.weight"), d->inter, H, &L->gate));
    DI_TRY(mat(d, N("mlp.up_proj.weight"), d->inter, H, &L->up));
    DI_TRY(mat(d, N("mlp.down_proj.weight"), H, d->inter, &L->down));
#undef N
  }
  if (R > 0) {
    DI_TRY(mat(d, "markov_head.markov_w1.weight", V, R, &d->markov_w1));
    DI_TRY(mat(d, "markov_head.markov_w2.weight", V, R, &d->markov_w2));
  }
  if (d->has_conf) {
    d->conf_dim = (int)(H + (d->conf_with_markov ? R : 0));
    di_weight cw;
    DI_TRY(mat(d, "confidence_head.proj.weight", 1, d->conf_dim, &cw));
    d->conf_w = malloc(sizeof(float) * (size_t)d->conf_dim);
    if (!d->conf_w) return di_error_set(DI_ERR_OOM, "out of memory");
    di_weight_rows_f32(&cw, 0, 1, d->conf_w);
    float *b = NULL;
    DI_TRY(vec(d, "confidence_head.proj.bias", 1, &b));
    d->conf_b = b[0];
    free(b);
  }
  return DI_OK;
}

di_status di_dspark_load(const char *dir, const di_model_config *target, const di_weight *t_embed,
                         const di_weight *t_head, di_dspark **out) {
  if (!dir || !target || !out) return di_error_set(DI_ERR_INVALID_ARG, "di_dspark_load: NULL argument");
  di_dspark *d = calloc(1, sizeof *d);
  if (!d) return di_error_set(DI_ERR_OOM, "out of memory");
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  di_status st = read_config(d, path, target);
  if (st == DI_OK) st = di_tensor_source_open(dir, &d->src);
  if (st == DI_OK) st = bind(d, t_embed, t_head);
  if (st != DI_OK) {
    di_dspark_free(d);
    return di_error_wrap(st, "DSpark drafter");
  }
  *out = d;
  return DI_OK;
}
