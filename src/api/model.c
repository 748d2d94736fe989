/* The public model API: loading a Hugging Face folder (config, weights, backend), facts about the
 * model, and whole-sequence scoring. */
#include "api/model_internal.h"
#include "util/json.h"
#include "model/safetensors.h"
#include "util/progress.h"
#include "util/switches.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void di_model_options_default(di_model_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->load_format = "auto";
  opt->dummy_seed = 0;
}

di_status di_model_load(const char *dir, const di_model_options *opt_in, di_model **out) {
  if (!dir || !out)
    return di_error_set(DI_ERR_INVALID_ARG, "di_model_load: NULL argument");
  di_model_options opt;
  if (opt_in)
    opt = *opt_in;
  else
    di_model_options_default(&opt);
  const char *fmt = opt.load_format && *opt.load_format ? opt.load_format : "auto";
  int dummy = strcmp(fmt, "dummy") == 0;
  if (!dummy && strcmp(fmt, "auto") != 0 && strcmp(fmt, "safetensors") != 0)
    return di_error_set(DI_ERR_INVALID_ARG, "unknown load format \"%s\" (auto, safetensors, dummy)", fmt);
  int quantize_fp8 = 0;
  if (opt.quantization && *opt.quantization && strcmp(opt.quantization, "none") != 0) {
    if (strcmp(opt.quantization, "fp8") != 0)
      return di_error_set(DI_ERR_INVALID_ARG, "--quantization \"%s\" is not supported (fp8, none)", opt.quantization);
    quantize_fp8 = 1;
  }
  int kv_fp8 = 0;
  if (opt.kv_cache_dtype && *opt.kv_cache_dtype && strcmp(opt.kv_cache_dtype, "auto") != 0) {
    if (strcmp(opt.kv_cache_dtype, "fp8") != 0 && strcmp(opt.kv_cache_dtype, "fp8_e4m3") != 0)
      return di_error_set(DI_ERR_INVALID_ARG, "--kv-cache-dtype \"%s\" is not supported (auto, fp8, fp8_e4m3)",
                          opt.kv_cache_dtype);
    kv_fp8 = 1;
  }
  const char *acc = opt.accelerator;
  if (!acc || !*acc)
    acc = di_switch_get(DI_SW_ACCELERATOR);
  di_model *m = calloc(1, sizeof *m);
  if (!m)
    return di_error_set(DI_ERR_OOM, "out of memory");
  m->dir = strdup(dir);
  m->threads = opt.threads;
  cJSON *config = NULL; /* config.json, parsed once: the generic fields here, the architecture's own by its entry */
  di_status st = di_model_config_load_tree(dir, &m->cfg, &config);
  if (st != DI_OK)
    goto fail;
  m->arch = di_arch_entry_find(m->cfg.arch);
  if (!m->arch) {
    cJSON_Delete(config);
    st = di_error_set(DI_ERR_INTERNAL, "model_type %s has no architecture entry", m->cfg.model_type);
    goto fail;
  }
  if (!opt.quiet)
    fprintf(stderr, "deepinfer: loading %s (%s, %d layers, %s weights)\n", dir, m->cfg.model_type, m->cfg.num_hidden_layers,
            dummy ? "dummy" : "safetensors");
  di_progress prog, *pp = opt.quiet ? NULL : &prog;
  if ((quantize_fp8 || kv_fp8) && m->cfg.arch != DI_ARCH_DEEPSEEK_V2 && m->cfg.arch != DI_ARCH_DEEPSEEK_V3) {
    cJSON_Delete(config);
    st = di_error_set(DI_ERR_UNSUPPORTED, "%s: not supported for model_type %s (deepseek_v2, deepseek_v3)",
                      quantize_fp8 ? "--quantization fp8" : "--kv-cache-dtype fp8", m->cfg.model_type);
    goto fail;
  }
  const di_arch_load in = {dir, config, dummy, opt.dummy_seed, acc, opt.threads, opt.batch_invariant, quantize_fp8, kv_fp8, pp};
  st = m->arch->load(m, &in);
  cJSON_Delete(config);
  if (st != DI_OK)
    goto fail;
  m->tokenizer_vocab = m->cfg.vocab_size;
  if (!opt.quiet)
    fprintf(stderr, "deepinfer: loaded on %s\n", m->backend->ops->name);
  *out = m;
  return DI_OK;
fail:
  di_error_wrap(st, "loading model");
  di_model_free(m);
  return st;
}

void di_model_free(di_model *m) {
  if (!m)
    return;
  if (m->backend)
    m->backend->ops->destroy(m->backend);
  if (m->arch)
    m->arch->free(m);
  di_tensor_source_free(m->source);
  free(m->dir);
  free(m);
}

int di_model_vocab_size(const di_model *m) { return m ? m->cfg.vocab_size : 0; }
int di_model_max_context(const di_model *m) { return m ? m->cfg.max_position_embeddings : 0; }
const char *di_model_type(const di_model *m) { return m ? m->cfg.model_type : ""; }
const char *di_model_dir(const di_model *m) { return m ? m->dir : ""; }

int di_model_eos_ids(const di_model *m, int32_t *ids, int cap) {
  if (!m)
    return 0;
  for (int i = 0; i < m->cfg.n_eos && i < cap; i++)
    ids[i] = m->cfg.eos_token_ids[i];
  return m->cfg.n_eos;
}

di_status di_model_score(di_model *m, const int32_t *ids, int n, float *logits) {
  if (!m || !ids || !logits || n <= 0)
    return di_error_set(DI_ERR_INVALID_ARG, "di_model_score: empty sequence or NULL argument");
  if (n > m->cfg.max_position_embeddings)
    return di_error_set(DI_ERR_CONTEXT_OVERFLOW, "sequence of %d tokens is longer than the context (%d)", n,
                        m->cfg.max_position_embeddings);
  if (m->arch->check_token_ids) {
    for (int i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
        return di_error_set(DI_ERR_INVALID_ARG, "di_model_score: token %d at position %d is outside the vocabulary [0, %d)",
                            ids[i], i, m->cfg.vocab_size);
  }
  const int nb = (n + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
  di_status st = m->backend->ops->kv_alloc(m->backend, nb);
  if (st != DI_OK)
    return st;
  int32_t *table = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * (size_t)n),
          *seq = calloc((size_t)n, sizeof(int32_t)), *rows = malloc(sizeof(int32_t) * (size_t)n);
  if (!table || !pos || !seq || !rows) {
    st = di_error_set(DI_ERR_OOM, "out of memory");
    goto done;
  }
  for (int i = 0; i < nb; i++)
    table[i] = i;
  for (int i = 0; i < n; i++)
    pos[i] = rows[i] = i;
  /* key 0 is never an engine sequence's (those are request id * 1024 + sample, ids from 1): a V4
   * backend scores in a state of its own, restarted at position 0 and dropped afterwards */
  di_batch_seq s = {table, nb, 0};
  di_batch b = {.n_tokens = n, .tokens = ids, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = &s,
                .n_outputs = n, .output_rows = rows};
  st = di_backend_forward(m->backend, &b, logits);
  if (m->backend->ops->release)
    m->backend->ops->release(m->backend, 0);
done:
  free(table);
  free(pos);
  free(seq);
  free(rows);
  return st;
}
