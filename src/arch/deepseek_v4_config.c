/* DeepSeek-V4 config.json -> di_v4_config. Follows transformers 5.17's DeepseekV4Config, including
 * its defaults and the legacy keys original checkpoints ship (compress_ratios, num_hash_layers,
 * qk_rope_head_dim, rope_scaling); every problem is an error naming the field. */
#include "arch/deepseek_v4.h"
#include "util/json.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#define W "config.json"

/* A required positive integer field that fits an int. */
static di_status req_int(const cJSON *o, const char *key, int *out) {
  int64_t v;
  DI_TRY(di_json_int(o, key, INT64_MIN, W, &v));
  if (v == INT64_MIN)
    return di_error_set(DI_ERR_NOT_FOUND, W ": missing required field \"%s\"", key);
  if (v <= 0 || v > (1 << 30))
    return di_error_set(DI_ERR_FORMAT, W ": \"%s\" must be a positive integer (got %lld)", key, (long long)v);
  *out = (int)v;
  return DI_OK;
}

/* An optional integer field in [lo, hi]. */
static di_status opt_int(const cJSON *o, const char *key, int def, int lo, int hi, int *out) {
  int64_t v;
  DI_TRY(di_json_int(o, key, def, W, &v));
  if (v < lo || v > hi)
    return di_error_set(DI_ERR_FORMAT, W ": \"%s\" must be in [%d, %d] (got %lld)", key, lo, hi, (long long)v);
  *out = (int)v;
  return DI_OK;
}

static di_status opt_pos_num(const cJSON *o, const char *key, double def, double *out) {
  DI_TRY(di_json_num(o, key, def, W, out));
  if (!(*out > 0) || !isfinite(*out))
    return di_error_set(DI_ERR_FORMAT, W ": \"%s\" must be a positive number (got %g)", key, *out);
  return DI_OK;
}

/* YaRN's default attention factor (transformers' get_mscale), used when the config names none. */
static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* One rope setting from a dict holding rope_type/type, rope_theta, factor, ... `what` names it. */
static di_status parse_rope(const cJSON *d, const char *what, double theta_def, double partial_def, int head_dim,
                            int force_attn_one, di_v4_rope *r) {
  const char *type = "default";
  if (d) {
    DI_TRY(di_json_str(d, "type", "default", what, &type));
    DI_TRY(di_json_str(d, "rope_type", type, what, &type));
  }
  double partial = partial_def;
  memset(r, 0, sizeof *r);
  r->theta = theta_def;
  r->attention_factor = 1.0;
  if (d) {
    DI_TRY(di_json_num(d, "rope_theta", theta_def, what, &r->theta));
    DI_TRY(di_json_num(d, "partial_rotary_factor", partial_def, what, &partial));
  }
  if (!(r->theta > 1) || !isfinite(r->theta))
    return di_error_set(DI_ERR_FORMAT, W ": %s rope_theta must be > 1 (got %g)", what, r->theta);
  if (!(partial > 0) || partial > 1)
    return di_error_set(DI_ERR_FORMAT, W ": %s partial_rotary_factor must be in (0, 1] (got %g)", what, partial);
  int64_t dim = 0;
  if (!di_double_to_int_in(head_dim * partial, 0, head_dim, &dim) || dim < 2 || dim % 2)
    return di_error_set(DI_ERR_FORMAT, W ": %s rotary dimension head_dim*partial_rotary_factor = %lld must be even and >= 2", what,
                        (long long)dim);
  r->dim = (int)dim;
  if (strcmp(type, "default") == 0)
    return DI_OK;
  if (strcmp(type, "yarn") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, W ": %s rope_type \"%s\" is not supported (supported: default, yarn)", what, type);
  r->yarn = 1;
  DI_TRY(opt_pos_num(d, "factor", 1.0, &r->factor));
  int64_t omax = -1;
  DI_TRY(di_json_int(d, "original_max_position_embeddings", -1, what, &omax));
  if (omax == -1)
    return di_error_set(DI_ERR_NOT_FOUND, W ": %s yarn needs \"original_max_position_embeddings\"", what);
  if (omax < 1 || omax > (1 << 30))
    return di_error_set(DI_ERR_FORMAT, W ": %s \"original_max_position_embeddings\" must be an integer in [1, 2^30] (got %lld)",
                        what, (long long)omax);
  r->original_max_pos = omax;
  /* transformers: `get("beta_fast") or 32`, so 0 also means the default */
  DI_TRY(di_json_num(d, "beta_fast", 32, what, &r->beta_fast));
  DI_TRY(di_json_num(d, "beta_slow", 1, what, &r->beta_slow));
  if (r->beta_fast == 0)
    r->beta_fast = 32;
  if (r->beta_slow == 0)
    r->beta_slow = 1;
  double af = -1, mscale = 0, mscale_all = 0;
  DI_TRY(di_json_num(d, "attention_factor", -1, what, &af));
  DI_TRY(di_json_num(d, "mscale", 0, what, &mscale));
  DI_TRY(di_json_num(d, "mscale_all_dim", 0, what, &mscale_all));
  if (af < 0 && force_attn_one)
    af = 1.0; /* DeepseekV4Config sets 1.0 for the compress rope it builds from flat parameters */
  if (af < 0)
    af = (mscale != 0 && mscale_all != 0) ? yarn_mscale(r->factor, mscale) / yarn_mscale(r->factor, mscale_all)
                                          : yarn_mscale(r->factor, 1);
  r->attention_factor = af;
  return DI_OK;
}

static di_status parse_layer_kinds(const cJSON *root, di_v4_config *c) {
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
  const cJSON *cr = cJSON_GetObjectItemCaseSensitive(root, "compress_ratios");
  if (lt && !cJSON_IsNull(lt)) {
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) < c->n_layers)
      return di_error_set(DI_ERR_FORMAT, W ": \"layer_types\" must be an array of at least num_hidden_layers (%d) strings",
                          c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
      const cJSON *e = cJSON_GetArrayItem(lt, l);
      const char *s = cJSON_IsString(e) ? e->valuestring : "";
      if (strcmp(s, "sliding_attention") == 0)
        c->attn_kind[l] = DI_V4_ATTN_SLIDING;
      else if (strcmp(s, "compressed_sparse_attention") == 0)
        c->attn_kind[l] = DI_V4_ATTN_CSA;
      else if (strcmp(s, "heavily_compressed_attention") == 0)
        c->attn_kind[l] = DI_V4_ATTN_HCA;
      else
        return di_error_set(DI_ERR_FORMAT,
                            W ": layer_types[%d] = \"%s\" (expected sliding_attention, compressed_sparse_attention or "
                              "heavily_compressed_attention)",
                            l, s);
    }
  } else if (cr && !cJSON_IsNull(cr)) {
    if (!cJSON_IsArray(cr) || cJSON_GetArraySize(cr) < c->n_layers)
      return di_error_set(DI_ERR_FORMAT, W ": \"compress_ratios\" must be an array of at least num_hidden_layers (%d) integers",
                          c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
      const cJSON *e = cJSON_GetArrayItem(cr, l);
      double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
      if (v == 0)
        c->attn_kind[l] = DI_V4_ATTN_SLIDING;
      else if (v == 4)
        c->attn_kind[l] = DI_V4_ATTN_CSA;
      else if (v == 128)
        c->attn_kind[l] = DI_V4_ATTN_HCA;
      else
        return di_error_set(DI_ERR_FORMAT, W ": compress_ratios[%d] must be 0, 4 or 128", l);
    }
  } else {
    /* transformers' default: two HCA layers, then CSA/HCA alternating */
    for (int l = 0; l < c->n_layers; l++)
      c->attn_kind[l] = l < 2 ? DI_V4_ATTN_HCA : ((l - 2) % 2 ? DI_V4_ATTN_CSA : DI_V4_ATTN_HCA);
  }
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "mlp_layer_types");
  if (mt && !cJSON_IsNull(mt)) {
    if (!cJSON_IsArray(mt) || cJSON_GetArraySize(mt) < c->n_layers)
      return di_error_set(DI_ERR_FORMAT, W ": \"mlp_layer_types\" must be an array of at least num_hidden_layers (%d) strings",
                          c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
      const cJSON *e = cJSON_GetArrayItem(mt, l);
      const char *s = cJSON_IsString(e) ? e->valuestring : "";
      if (strcmp(s, "moe") == 0)
        c->ffn_kind[l] = DI_V4_FFN_MOE;
      else if (strcmp(s, "hash_moe") == 0)
        c->ffn_kind[l] = DI_V4_FFN_HASH_MOE;
      else
        return di_error_set(DI_ERR_FORMAT, W ": mlp_layer_types[%d] = \"%s\" (expected moe or hash_moe)", l, s);
    }
  } else {
    int n_hash = 0;
    DI_TRY(opt_int(root, "num_hash_layers", 3, 0, 1 << 20, &n_hash));
    for (int l = 0; l < c->n_layers; l++)
      c->ffn_kind[l] = l < n_hash ? DI_V4_FFN_HASH_MOE : DI_V4_FFN_MOE;
  }
  return DI_OK;
}

static di_status parse_ropes(const cJSON *root, di_v4_config *c) {
  double rope_theta, compress_theta, partial;
  DI_TRY(di_json_num(root, "rope_theta", 10000.0, W, &rope_theta));
  DI_TRY(di_json_num(root, "compress_rope_theta", 160000.0, W, &compress_theta));
  int64_t qk_rope = -1;
  DI_TRY(di_json_int(root, "qk_rope_head_dim", -1, W, &qk_rope));
  DI_TRY(di_json_num(root, "partial_rotary_factor", qk_rope > 0 ? (double)qk_rope / c->head_dim : 64.0 / 512.0, W, &partial));
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
  if (rp && !cJSON_IsNull(rp) && !cJSON_IsObject(rp))
    return di_error_set(DI_ERR_FORMAT, W ": \"rope_parameters\" must be an object");
  const cJSON *main_d = rp ? cJSON_GetObjectItemCaseSensitive(rp, "main") : NULL;
  const cJSON *comp_d = rp ? cJSON_GetObjectItemCaseSensitive(rp, "compress") : NULL;
  if (cJSON_IsObject(main_d) && cJSON_IsObject(comp_d)) {
    /* transformers reads each nested dict on its own: a missing partial_rotary_factor there means 1 */
    DI_TRY(parse_rope(main_d, "rope_parameters.main", rope_theta, 1.0, c->head_dim, 0, &c->rope_main));
    DI_TRY(parse_rope(comp_d, "rope_parameters.compress", compress_theta, 1.0, c->head_dim, 0, &c->rope_compress));
    return DI_OK;
  }
  /* flat form: main is plain RoPE at rope_theta; compress takes the flat (YaRN) parameters at
   * compress_rope_theta. rope_theta / partial factor inside the flat dict are overridden, as
   * DeepseekV4Config does. */
  const cJSON *flat = (rp && cJSON_IsObject(rp)) ? rp : cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  if (flat && !cJSON_IsNull(flat) && !cJSON_IsObject(flat))
    return di_error_set(DI_ERR_FORMAT, W ": \"rope_scaling\" must be an object");
  if (flat && cJSON_IsNull(flat))
    flat = NULL;
  DI_TRY(parse_rope(NULL, "main rope", rope_theta, partial, c->head_dim, 0, &c->rope_main));
  DI_TRY(parse_rope(flat, "rope_scaling", compress_theta, partial, c->head_dim, 1, &c->rope_compress));
  c->rope_compress.theta = compress_theta;
  return DI_OK;
}

static di_status parse(const cJSON *root, di_v4_config *c) {
  if (!cJSON_IsObject(root))
    return di_error_set(DI_ERR_FORMAT, W ": top level must be an object");
  const char *mt = NULL;
  DI_TRY(di_json_str(root, "model_type", NULL, W, &mt));
  if (!mt)
    return di_error_set(DI_ERR_NOT_FOUND, W ": missing required field \"model_type\"");
  if (strcmp(mt, "deepseek_v4") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, W ": model_type \"%s\" is not deepseek_v4", mt);
  DI_TRY(req_int(root, "vocab_size", &c->vocab_size));
  DI_TRY(req_int(root, "hidden_size", &c->hidden_size));
  DI_TRY(req_int(root, "num_hidden_layers", &c->n_layers));
  if (c->n_layers > DI_V4_MAX_LAYERS)
    return di_error_set(DI_ERR_UNSUPPORTED, W ": num_hidden_layers %d exceeds %d", c->n_layers, DI_V4_MAX_LAYERS);
  DI_TRY(req_int(root, "num_attention_heads", &c->n_heads));
  DI_TRY(req_int(root, "head_dim", &c->head_dim));
  DI_TRY(req_int(root, "q_lora_rank", &c->q_lora_rank));
  DI_TRY(req_int(root, "o_groups", &c->o_groups));
  DI_TRY(req_int(root, "o_lora_rank", &c->o_lora_rank));
  DI_TRY(req_int(root, "n_routed_experts", &c->n_routed_experts));
  DI_TRY(req_int(root, "num_experts_per_tok", &c->top_k));
  DI_TRY(req_int(root, "moe_intermediate_size", &c->moe_inter));
  DI_TRY(opt_int(root, "n_shared_experts", 1, 0, 1 << 20, &c->n_shared_experts));
  int kv_heads;
  DI_TRY(opt_int(root, "num_key_value_heads", 1, 1, 1 << 20, &kv_heads));
  if (kv_heads != 1)
    return di_error_set(DI_ERR_UNSUPPORTED, W ": num_key_value_heads must be 1 for deepseek_v4 (got %d)", kv_heads);
  const char *act = NULL;
  DI_TRY(di_json_str(root, "hidden_act", "silu", W, &act));
  if (strcmp(act, "silu") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, W ": hidden_act \"%s\" is not supported (supported: silu)", act);
  const char *sf = NULL;
  DI_TRY(di_json_str(root, "scoring_func", "sqrtsoftplus", W, &sf));
  if (strcmp(sf, "sqrtsoftplus") == 0)
    c->scoring = DI_V4_SCORE_SQRTSOFTPLUS;
  else if (strcmp(sf, "sigmoid") == 0)
    c->scoring = DI_V4_SCORE_SIGMOID;
  else
    return di_error_set(DI_ERR_UNSUPPORTED, W ": scoring_func \"%s\" is not supported (supported: sqrtsoftplus, sigmoid)", sf);
  DI_TRY(opt_pos_num(root, "routed_scaling_factor", 1.5, &c->routed_scaling));
  DI_TRY(opt_pos_num(root, "rms_norm_eps", 1e-6, &c->rms_eps));
  DI_TRY(opt_pos_num(root, "hc_eps", 1e-6, &c->hc_eps));
  DI_TRY(opt_int(root, "hc_mult", 4, 1, 64, &c->hc_mult));
  DI_TRY(opt_int(root, "hc_sinkhorn_iters", 20, 1, 1000, &c->hc_sinkhorn_iters));
  DI_TRY(opt_pos_num(root, "swiglu_limit", 10.0, &c->swiglu_limit));
  DI_TRY(opt_int(root, "sliding_window", 128, 1, 1 << 30, &c->sliding_window));
  c->csa_rate = 4;
  c->hca_rate = 128;
  const cJSON *rates = cJSON_GetObjectItemCaseSensitive(root, "compress_rates");
  if (rates && !cJSON_IsNull(rates)) {
    if (!cJSON_IsObject(rates))
      return di_error_set(DI_ERR_FORMAT, W ": \"compress_rates\" must be an object");
    DI_TRY(opt_int(rates, "compressed_sparse_attention", 4, 1, 1 << 20, &c->csa_rate));
    DI_TRY(opt_int(rates, "heavily_compressed_attention", 128, 1, 1 << 20, &c->hca_rate));
  }
  DI_TRY(opt_int(root, "compress_rate_csa", c->csa_rate, 1, 1 << 20, &c->csa_rate));
  DI_TRY(opt_int(root, "compress_rate_hca", c->hca_rate, 1, 1 << 20, &c->hca_rate));
  DI_TRY(parse_layer_kinds(root, c));
  int has_csa = 0;
  for (int l = 0; l < c->n_layers; l++)
    has_csa |= c->attn_kind[l] == DI_V4_ATTN_CSA;
  if (has_csa) {
    DI_TRY(req_int(root, "index_n_heads", &c->index_n_heads));
    DI_TRY(req_int(root, "index_head_dim", &c->index_head_dim));
    DI_TRY(req_int(root, "index_topk", &c->index_topk));
  }
  DI_TRY(parse_ropes(root, c));
  /* consistency */
  if (c->top_k > c->n_routed_experts)
    return di_error_set(DI_ERR_FORMAT, W ": num_experts_per_tok (%d) exceeds n_routed_experts (%d)", c->top_k, c->n_routed_experts);
  if (((int64_t)c->n_heads * c->head_dim) % c->o_groups)
    return di_error_set(DI_ERR_FORMAT, W ": o_groups (%d) must divide num_attention_heads*head_dim (%lld)", c->o_groups,
                        (long long)c->n_heads * c->head_dim);
  if (c->rope_main.dim > c->head_dim || c->rope_compress.dim > c->head_dim)
    return di_error_set(DI_ERR_FORMAT, W ": rotary dimension exceeds head_dim (%d)", c->head_dim);
  if (has_csa && c->rope_compress.dim > c->index_head_dim)
    return di_error_set(DI_ERR_FORMAT, W ": index_head_dim (%d) is smaller than the compress rotary dimension (%d)",
                        c->index_head_dim, c->rope_compress.dim);
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
  if (q && cJSON_IsObject(q)) {
    const char *qm = NULL;
    DI_TRY(di_json_str(q, "quant_method", "", W ".quantization_config", &qm));
    if (strcmp(qm, "fp8") != 0)
      return di_error_set(DI_ERR_UNSUPPORTED, W ": quantization_config.quant_method \"%s\" is not supported (supported: fp8)", qm);
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    int64_t rows, cols;
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !di_json_int_in(cJSON_GetArrayItem(bs, 0), 1, 1 << 20, &rows) ||
        !di_json_int_in(cJSON_GetArrayItem(bs, 1), 1, 1 << 20, &cols))
      return di_error_set(DI_ERR_FORMAT, W ": quantization_config.weight_block_size must be two positive integers");
    c->fp8 = 1;
    c->fp8_block[0] = (int)rows;
    c->fp8_block[1] = (int)cols;
  }
  return DI_OK;
}

di_status di_v4_config_from_tree(const cJSON *root, di_v4_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  di_status st = parse(root, cfg);
  if (st != DI_OK)
    memset(cfg, 0, sizeof *cfg);
  return st;
}

di_status di_v4_config_parse(const char *json, size_t len, di_v4_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cJSON *root = NULL;
  DI_TRY(di_json_parse(json, len, W, &root));
  di_status st = di_v4_config_from_tree(root, cfg);
  cJSON_Delete(root);
  return st;
}
