/* config.json / generation_config.json parsing (see config.h). Both dialects: the original
 * DeepSeek one (rope_scaling + rope_theta) and transformers>=5 (rope_parameters). Anything the
 * engine would silently compute wrongly is rejected by name. */
#include "model/config.h"
#include "util/json.h"
#include <math.h>
#include <string.h>

#define W "config.json"

static double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static di_status get_int(const cJSON *j, const char *key, int64_t def, int *out) {
  int64_t v;
  DI_TRY(di_json_int(j, key, def, W, &v));
  if (v < INT32_MIN || v > INT32_MAX)
    return di_error_set(DI_ERR_FORMAT, W ": \"%s\" out of range", key);
  *out = (int)v;
  return DI_OK;
}

static di_status require_int(const cJSON *j, const char *key, int min, int *out) {
  if (!cJSON_GetObjectItemCaseSensitive(j, key))
    return di_error_set(DI_ERR_FORMAT, W ": missing \"%s\"", key);
  DI_TRY(get_int(j, key, 0, out));
  if (*out < min)
    return di_error_set(DI_ERR_FORMAT, W ": \"%s\" is %d, must be >= %d", key, *out, min);
  return DI_OK;
}

static di_status parse_eos(const cJSON *v, const char *what, di_model_config *c) {
  if (!v || cJSON_IsNull(v))
    return DI_OK;
  c->n_eos = 0;
  if (cJSON_IsNumber(v)) {
    int64_t id;
    if (!di_json_int_in(v, INT32_MIN, INT32_MAX, &id))
      return di_error_set(DI_ERR_FORMAT, "%s: \"eos_token_id\" must be an integer or a list of integers", what);
    c->eos_token_ids[c->n_eos++] = (int32_t)id;
    return DI_OK;
  }
  if (!cJSON_IsArray(v))
    return di_error_set(DI_ERR_FORMAT, "%s: \"eos_token_id\" must be an integer or a list of integers", what);
  for (const cJSON *e = v->child; e; e = e->next) {
    int64_t id;
    if (!di_json_int_in(e, INT32_MIN, INT32_MAX, &id))
      return di_error_set(DI_ERR_FORMAT, "%s: \"eos_token_id\" must be an integer or a list of integers", what);
    if (c->n_eos < DI_MAX_EOS)
      c->eos_token_ids[c->n_eos++] = (int32_t)id;
  }
  return DI_OK;
}

/* Rope settings from either dialect. `rp` is rope_scaling (old) or rope_parameters (new). */
static di_status parse_rope(const cJSON *root, di_model_config *c) {
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
  const char *key = "rope_parameters";
  DI_TRY(di_json_num(root, "rope_theta", 10000.0, W, &c->rope_theta));
  if (!rp || cJSON_IsNull(rp)) {
    rp = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    key = "rope_scaling";
  } else if (cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) {
    DI_TRY(di_json_num(rp, "rope_theta", c->rope_theta, W, &c->rope_theta));
  }
  c->rope_yarn = 0;
  if (rp && !cJSON_IsNull(rp)) {
    if (!cJSON_IsObject(rp))
      return di_error_set(DI_ERR_FORMAT, W ": \"%s\" must be an object or null", key);
    const char *type = NULL;
    DI_TRY(di_json_str(rp, "rope_type", NULL, W, &type));
    if (!type)
      DI_TRY(di_json_str(rp, "type", "default", W, &type));
    if (strcmp(type, "yarn") == 0) {
      c->rope_yarn = 1;
      DI_TRY(di_json_num(rp, "factor", 1.0, W, &c->yarn_factor));
      DI_TRY(di_json_num(rp, "beta_fast", 32.0, W, &c->yarn_beta_fast));
      DI_TRY(di_json_num(rp, "beta_slow", 1.0, W, &c->yarn_beta_slow));
      DI_TRY(di_json_num(rp, "mscale", 1.0, W, &c->yarn_mscale));
      DI_TRY(di_json_num(rp, "mscale_all_dim", 0.0, W, &c->yarn_mscale_all_dim));
      DI_TRY(get_int(rp, "original_max_position_embeddings", c->max_position_embeddings, &c->yarn_original_max_pos));
      int truncate = 1;
      DI_TRY(di_json_bool(rp, "truncate", 1, W, &truncate));
      if (!truncate)
        return di_error_set(DI_ERR_UNSUPPORTED, W ": %s.truncate = false is not supported", key);
      if (c->yarn_factor < 1.0 || c->yarn_original_max_pos <= 0)
        return di_error_set(DI_ERR_FORMAT, W ": %s: yarn needs factor >= 1 and original_max_position_embeddings > 0", key);
      double af = NAN;
      DI_TRY(di_json_num(rp, "attention_factor", NAN, W, &af));
      if (!isnan(af))
        c->rope_attention_factor = (float)af;
      else if (c->yarn_mscale != 0.0 && c->yarn_mscale_all_dim != 0.0)
        c->rope_attention_factor = (float)(yarn_get_mscale(c->yarn_factor, c->yarn_mscale) /
                                           yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim));
      else
        c->rope_attention_factor = (float)yarn_get_mscale(c->yarn_factor, 1.0);
    } else if (strcmp(type, "default") != 0) {
      return di_error_set(DI_ERR_UNSUPPORTED, W ": %s type \"%s\" is not supported (default, yarn)", key, type);
    }
  }
  return DI_OK;
}

di_status di_model_config_from_tree(const cJSON *root, const char *gen_json, size_t gen_len, di_model_config *cfg) {
  di_model_config c;
  memset(&c, 0, sizeof c);
  cJSON *gen = NULL;
  di_status st = DI_OK;
#define T(x)                  \
  do {                        \
    if ((st = (x)) != DI_OK)  \
      goto done;              \
  } while (0)
  if (!cJSON_IsObject(root)) {
    st = di_error_set(DI_ERR_FORMAT, W ": not a JSON object");
    goto done;
  }
  const char *mt = NULL;
  T(di_json_str(root, "model_type", NULL, W, &mt));
  if (!mt) {
    st = di_error_set(DI_ERR_FORMAT, W ": missing \"model_type\"");
    goto done;
  }
  if (strcmp(mt, "deepseek_v3") == 0)
    c.arch = DI_ARCH_DEEPSEEK_V3;
  else if (strcmp(mt, "deepseek_v2") == 0)
    c.arch = DI_ARCH_DEEPSEEK_V2;
  else if (strcmp(mt, "deepseek_v4") == 0)
    c.arch = DI_ARCH_DEEPSEEK_V4;
  else {
    st = di_error_set(DI_ERR_UNSUPPORTED, W ": unknown model_type \"%.40s\" (supported: deepseek_v2, deepseek_v3, deepseek_v4)", mt);
    goto done;
  }
  snprintf(c.model_type, sizeof c.model_type, "%s", mt);
  double d;
  if (c.arch == DI_ARCH_DEEPSEEK_V4) {
    /* V4's architecture is read by di_v4_config_parse (arch/deepseek_v4.h); here only what the engine
     * and the API use: vocabulary, sizes, context, special tokens, generation defaults */
    T(require_int(root, "vocab_size", 1, &c.vocab_size));
    T(require_int(root, "hidden_size", 1, &c.hidden_size));
    T(require_int(root, "num_hidden_layers", 1, &c.num_hidden_layers));
    T(get_int(root, "max_position_embeddings", 4096, &c.max_position_embeddings));
    T(get_int(root, "num_nextn_predict_layers", 0, &c.num_nextn_predict_layers));
    if (c.max_position_embeddings < 1 || c.num_nextn_predict_layers < 0) {
      st = di_error_set(DI_ERR_FORMAT, W ": max_position_embeddings must be >= 1 and num_nextn_predict_layers >= 0");
      goto done;
    }
    goto tokens;
  }

  T(require_int(root, "vocab_size", 1, &c.vocab_size));
  T(require_int(root, "hidden_size", 1, &c.hidden_size));
  T(require_int(root, "num_hidden_layers", 1, &c.num_hidden_layers));
  T(require_int(root, "num_attention_heads", 1, &c.num_attention_heads));
  T(require_int(root, "kv_lora_rank", 1, &c.kv_lora_rank));
  T(require_int(root, "qk_nope_head_dim", 0, &c.qk_nope_head_dim));
  T(require_int(root, "qk_rope_head_dim", 2, &c.qk_rope_head_dim));
  T(require_int(root, "v_head_dim", 1, &c.v_head_dim));
  if (c.qk_rope_head_dim % 2) {
    st = di_error_set(DI_ERR_FORMAT, W ": qk_rope_head_dim must be even");
    goto done;
  }
  T(get_int(root, "q_lora_rank", 0, &c.q_lora_rank));
  T(get_int(root, "intermediate_size", 0, &c.intermediate_size));
  T(get_int(root, "moe_intermediate_size", 0, &c.moe_intermediate_size));
  T(get_int(root, "num_nextn_predict_layers", 0, &c.num_nextn_predict_layers));
  T(get_int(root, "n_routed_experts", 0, &c.n_routed_experts));
  T(get_int(root, "n_shared_experts", 0, &c.n_shared_experts));
  T(get_int(root, "num_experts_per_tok", 0, &c.num_experts_per_tok));
  T(get_int(root, "first_k_dense_replace", 0, &c.first_k_dense_replace));
  T(get_int(root, "moe_layer_freq", 1, &c.moe_layer_freq));
  T(get_int(root, "n_group", 1, &c.n_group));
  T(get_int(root, "topk_group", 1, &c.topk_group));
  T(get_int(root, "max_position_embeddings", 4096, &c.max_position_embeddings));
  if (c.q_lora_rank < 0 || c.n_routed_experts < 0 || c.n_shared_experts < 0 || c.num_nextn_predict_layers < 0 ||
      c.max_position_embeddings < 1) {
    st = di_error_set(DI_ERR_FORMAT, W ": negative sizes");
    goto done;
  }
  T(di_json_num(root, "rms_norm_eps", 1e-6, W, &d));
  c.rms_norm_eps = (float)d;
  T(di_json_num(root, "routed_scaling_factor", 1.0, W, &d));
  c.routed_scaling_factor = (float)d;
  T(di_json_bool(root, "norm_topk_prob", 0, W, &c.norm_topk_prob));
  c.scale_after_renorm = c.arch == DI_ARCH_DEEPSEEK_V3;
  T(di_json_bool(root, "tie_word_embeddings", 0, W, &c.tie_word_embeddings));
  int attn_bias = 0;
  T(di_json_bool(root, "attention_bias", 0, W, &attn_bias));
  if (attn_bias) {
    st = di_error_set(DI_ERR_UNSUPPORTED, W ": attention_bias = true is not supported");
    goto done;
  }
  const char *act = NULL;
  T(di_json_str(root, "hidden_act", "silu", W, &act));
  if (strcmp(act, "silu") != 0) {
    st = di_error_set(DI_ERR_UNSUPPORTED, W ": hidden_act \"%.40s\" is not supported (silu)", act);
    goto done;
  }
  /* router */
  if (c.n_routed_experts > 0) {
    if (c.moe_intermediate_size <= 0 || c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.n_routed_experts) {
      st = di_error_set(DI_ERR_FORMAT, W ": MoE needs moe_intermediate_size > 0 and 0 < num_experts_per_tok <= n_routed_experts");
      goto done;
    }
    if (c.n_routed_experts > DI_MAX_EXPERTS || c.n_group > DI_MAX_EXPERT_GROUPS) {
      st = di_error_set(DI_ERR_UNSUPPORTED, W ": %d routed experts in %d groups (at most %d experts, %d groups)",
                        c.n_routed_experts, c.n_group, DI_MAX_EXPERTS, DI_MAX_EXPERT_GROUPS);
      goto done;
    }
    const char *tm = NULL, *sf = NULL;
    T(di_json_str(root, "topk_method", c.arch == DI_ARCH_DEEPSEEK_V3 ? "noaux_tc" : "greedy", W, &tm));
    T(di_json_str(root, "scoring_func", c.arch == DI_ARCH_DEEPSEEK_V3 ? "sigmoid" : "softmax", W, &sf));
    if (strcmp(tm, "greedy") == 0)
      c.topk_method = DI_TOPK_GREEDY;
    else if (strcmp(tm, "group_limited_greedy") == 0)
      c.topk_method = DI_TOPK_GROUP_LIMITED_GREEDY;
    else if (strcmp(tm, "noaux_tc") == 0)
      c.topk_method = DI_TOPK_NOAUX_TC;
    else {
      st = di_error_set(DI_ERR_UNSUPPORTED, W ": topk_method \"%.40s\" is not supported (greedy, group_limited_greedy, noaux_tc)", tm);
      goto done;
    }
    if (strcmp(sf, "softmax") == 0)
      c.scoring_func = DI_SCORE_SOFTMAX;
    else if (strcmp(sf, "sigmoid") == 0)
      c.scoring_func = DI_SCORE_SIGMOID;
    else {
      st = di_error_set(DI_ERR_UNSUPPORTED, W ": scoring_func \"%.40s\" is not supported (softmax, sigmoid)", sf);
      goto done;
    }
    if (c.topk_method != DI_TOPK_GREEDY) {
      if (c.n_group < 1 || c.n_routed_experts % c.n_group != 0 || c.topk_group < 1 || c.topk_group > c.n_group) {
        st = di_error_set(DI_ERR_FORMAT, W ": n_group must divide n_routed_experts and 1 <= topk_group <= n_group");
        goto done;
      }
      if (c.topk_method == DI_TOPK_NOAUX_TC && c.n_routed_experts / c.n_group < 2) {
        st = di_error_set(DI_ERR_FORMAT, W ": noaux_tc needs at least 2 experts per group");
        goto done;
      }
      if (c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group)) {
        st = di_error_set(DI_ERR_FORMAT, W ": num_experts_per_tok exceeds the experts in topk_group groups");
        goto done;
      }
    }
  }
  if (c.first_k_dense_replace > 0 || c.n_routed_experts == 0) {
    if (c.intermediate_size <= 0) {
      st = di_error_set(DI_ERR_FORMAT, W ": dense layers need intermediate_size > 0");
      goto done;
    }
  }
  /* rope */
  T(parse_rope(root, &c));
  c.rope_interleave = 1;
  if (cJSON_GetObjectItemCaseSensitive(root, "rope_interleave"))
    T(di_json_bool(root, "rope_interleave", 1, W, &c.rope_interleave));
  if (!c.rope_yarn)
    c.rope_attention_factor = 1.0f;
  double scale = 1.0 / sqrt((double)(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope_yarn && c.yarn_mscale_all_dim != 0.0) {
    double m = yarn_get_mscale(c.yarn_factor, c.yarn_mscale_all_dim);
    scale *= m * m;
  }
  c.softmax_scale = (float)scale;
  /* quantization */
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
  if (q && !cJSON_IsNull(q)) {
    const char *qm = NULL, *fmt = NULL;
    T(di_json_str(q, "quant_method", NULL, W, &qm));
    if (!qm || strcmp(qm, "fp8") != 0) {
      st = di_error_set(DI_ERR_UNSUPPORTED, W ": quantization_config.quant_method \"%.40s\" is not supported (fp8)", qm ? qm : "(none)");
      goto done;
    }
    T(di_json_str(q, "fmt", "e4m3", W, &fmt));
    if (strcmp(fmt, "e4m3") != 0) {
      st = di_error_set(DI_ERR_UNSUPPORTED, W ": quantization_config.fmt \"%.40s\" is not supported (e4m3)", fmt);
      goto done;
    }
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    int64_t rows, cols;
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !di_json_int_in(cJSON_GetArrayItem(bs, 0), 1, 1 << 20, &rows) ||
        !di_json_int_in(cJSON_GetArrayItem(bs, 1), 1, 1 << 20, &cols)) {
      st = di_error_set(DI_ERR_FORMAT, W ": quantization_config.weight_block_size must be [rows, cols] of positive integers");
      goto done;
    }
    c.fp8 = 1;
    c.fp8_block[0] = (int)rows;
    c.fp8_block[1] = (int)cols;
  }
tokens:
  T(get_int(root, "bos_token_id", -1, &c.bos_token_id));
  T(parse_eos(cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), W, &c));
  c.gen_temperature = NAN;
  c.gen_top_p = NAN;
  c.gen_top_k = -1;
  if (gen_json) {
    if ((st = di_json_parse(gen_json, gen_len, "generation_config.json", &gen)) != DI_OK)
      goto done;
    if (cJSON_IsObject(gen)) {
      const char *G = "generation_config.json";
      int do_sample = 1;
      T(di_json_bool(gen, "do_sample", 1, G, &do_sample));
      T(di_json_num(gen, "temperature", NAN, G, &d));
      c.gen_temperature = do_sample ? (float)d : 0.0f;
      T(di_json_num(gen, "top_p", NAN, G, &d));
      c.gen_top_p = (float)d;
      int64_t k;
      T(di_json_int(gen, "top_k", -1, G, &k));
      c.gen_top_k = (int)k;
      T(parse_eos(cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id"), G, &c));
      if (cJSON_GetObjectItemCaseSensitive(gen, "bos_token_id"))
        T(get_int(gen, "bos_token_id", c.bos_token_id, &c.bos_token_id));
    }
  }
  *cfg = c;
done:
#undef T
  cJSON_Delete(gen);
  return st;
}

di_status di_model_config_parse(const char *json, size_t len, const char *gen_json, size_t gen_len,
                                di_model_config *cfg) {
  cJSON *root = NULL;
  DI_TRY(di_json_parse(json, len, W, &root));
  di_status st = di_model_config_from_tree(root, gen_json, gen_len, cfg);
  cJSON_Delete(root);
  return st;
}

di_status di_model_config_load_tree(const char *dir, di_model_config *cfg, cJSON **tree) {
  char path[4096], gpath[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  snprintf(gpath, sizeof gpath, "%s/generation_config.json", dir);
  char *js = NULL, *gs = NULL;
  size_t jl = 0, gl = 0;
  cJSON *root = NULL;
  di_status st = di_read_file(path, &js, &jl);
  if (st != DI_OK)
    return st;
  if (di_read_file(gpath, &gs, &gl) != DI_OK)
    gs = NULL;
  st = di_json_parse(js, jl, W, &root);
  if (st == DI_OK)
    st = di_model_config_from_tree(root, gs, gl, cfg);
  if (st != DI_OK)
    di_error_wrap(st, "%s", dir);
  free(js);
  free(gs);
  if (st == DI_OK && tree)
    *tree = root;
  else
    cJSON_Delete(root);
  return st;
}

di_status di_model_config_load(const char *dir, di_model_config *cfg) {
  return di_model_config_load_tree(dir, cfg, NULL);
}

void di_rope_inv_freq(const di_model_config *c, double *inv_freq) {
  int dim = c->qk_rope_head_dim, half = dim / 2;
  double base = c->rope_theta;
  for (int i = 0; i < half; i++) {
    /* torch computes base ** (arange/dim) in float32; mirror its rounding */
    float expo = (float)(2 * i) / (float)dim;
    float pos_freq = powf((float)base, expo);
    float extra = 1.0f / pos_freq;
    if (!c->rope_yarn) {
      inv_freq[i] = extra;
      continue;
    }
    float inter = 1.0f / ((float)c->yarn_factor * pos_freq);
    double omax = c->yarn_original_max_pos;
    double low = floor(dim * log(omax / (c->yarn_beta_fast * 2 * M_PI)) / (2 * log(base)));
    double high = ceil(dim * log(omax / (c->yarn_beta_slow * 2 * M_PI)) / (2 * log(base)));
    if (low < 0)
      low = 0;
    if (high > dim - 1)
      high = dim - 1;
    if (low == high)
      high += 0.001;
    float ramp = (float)(((double)i - low) / (high - low));
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    float extra_mask = 1.0f - ramp;
    inv_freq[i] = inter * (1.0f - extra_mask) + extra * extra_mask;
  }
}
