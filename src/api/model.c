/* The public model API: loading a Hugging Face folder (config, weights, backend), facts about the
 * model, and whole-sequence scoring. */
#include "api/model_internal.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_v4_backend.h"
#include "util/json.h"
#include "model/safetensors.h"
#include "util/progress.h"
#include "util/switches.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

void di_model_options_default(di_model_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->load_format = "auto";
  opt->dummy_seed = 0;
}

di_status di_backend_create(const char *accelerator, const di_model_config *cfg, const di_ds_weights *w, int threads,
                            int batch_invariant, di_backend **out) {
  if (!accelerator || !*accelerator || strcasecmp(accelerator, "cpu") == 0)
    return di_backend_cpu_create(cfg, w, threads, out);
  if (strcasecmp(accelerator, "cuda") == 0 || strcasecmp(accelerator, "nvidia") == 0) {
#ifdef DI_HAVE_CUDA
    return di_backend_cuda_create(cfg, w, batch_invariant, out);
#else
    (void)batch_invariant;
    return di_error_set(DI_ERR_UNSUPPORTED, "accelerator \"%s\": this build has no CUDA backend (build with nvcc, DI_CUDA=ON)",
                        accelerator);
#endif
  }
  return di_error_set(DI_ERR_INVALID_ARG, "unknown accelerator \"%s\" (cpu, cuda)", accelerator);
}

/* DeepSeek-V4: its own config parser and weight binding, and the V4 CPU backend (the engine serves it;
 * no dummy weights, no CUDA). */
static di_status load_v4(di_model *m, const char *dir, int dummy, const char *acc, di_progress *pp) {
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  char *js = NULL;
  size_t jl = 0;
  DI_TRY(di_read_file(path, &js, &jl));
  di_status st = di_v4_config_parse(js, jl, &m->v4cfg);
  free(js);
  if (st != DI_OK)
    return di_error_wrap(st, "%s (model_type deepseek_v4)", path);
  if (dummy)
    return di_error_set(DI_ERR_UNSUPPORTED, "DeepSeek-V4 (model_type deepseek_v4): load format \"dummy\" is not supported; "
                        "load the safetensors weights");
  if (acc && *acc && strcasecmp(acc, "cpu") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, "DeepSeek-V4 (model_type deepseek_v4) runs on the cpu accelerator only, not \"%s\"",
                        acc);
  if (m->cfg.vocab_size != m->v4cfg.vocab_size || m->cfg.hidden_size != m->v4cfg.hidden_size ||
      m->cfg.num_hidden_layers != m->v4cfg.n_layers)
    return di_error_set(DI_ERR_INTERNAL, "DeepSeek-V4: the two config readers disagree");
  di_progress_begin(pp, "loading weights", 1);
  DI_TRY(di_tensor_source_open(dir, &m->source));
  DI_TRY(di_v4_weights_bind(&m->v4cfg, m->source, &m->v4w));
  di_progress_end(pp);
  m->is_v4 = 1;
  return di_backend_cpu_v4_create(&m->cfg, &m->v4cfg, &m->v4w, m->threads, &m->backend);
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
  const char *acc = opt.accelerator;
  if (!acc || !*acc)
    acc = di_switch_get(DI_SW_ACCELERATOR);
  di_model *m = calloc(1, sizeof *m);
  if (!m)
    return di_error_set(DI_ERR_OOM, "out of memory");
  m->dir = strdup(dir);
  m->threads = opt.threads;
  di_status st = di_model_config_load(dir, &m->cfg);
  if (st != DI_OK)
    goto fail;
  if (!opt.quiet)
    fprintf(stderr, "deepinfer: loading %s (%s, %d layers, %s weights)\n", dir, m->cfg.model_type, m->cfg.num_hidden_layers,
            dummy ? "dummy" : "safetensors");
  di_progress prog, *pp = opt.quiet ? NULL : &prog;
  if (m->cfg.arch == DI_ARCH_DEEPSEEK_V4) {
    st = load_v4(m, dir, dummy, acc, pp);
    if (st != DI_OK)
      goto fail;
    goto loaded;
  }
  di_progress_begin(pp, dummy ? "making dummy weights" : "loading weights", di_ds_weights_progress_units(&m->cfg));
  if (dummy) {
    st = di_ds_weights_dummy(&m->cfg, opt.dummy_seed, &m->weights, pp);
  } else {
    st = di_tensor_source_open(dir, &m->source);
    if (st == DI_OK)
      st = di_ds_weights_bind(&m->cfg, m->source, &m->weights, pp);
  }
  if (st != DI_OK) {
    if (pp && prog.tty)
      fputc('\n', stderr);
    goto fail;
  }
  di_progress_end(pp);
  st = di_backend_create(acc, &m->cfg, &m->weights, opt.threads, opt.batch_invariant, &m->backend);
  if (st != DI_OK)
    goto fail;
loaded:
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
  di_ds_weights_free(&m->weights);
  di_v4_weights_free(&m->v4w);
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
  if (m->is_v4) {
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
