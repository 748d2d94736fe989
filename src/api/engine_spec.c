/* di_engine_set_speculative_config: vLLM's --speculative-config JSON turned into the engine's
 * speculative decoding. "mtp" is di_engine_set_speculative; "dspark" loads a DSpark drafter folder
 * (arch/dspark.h), runs it on the model's backend (CPU: backend/cpu/cpu_dspark.h; CUDA:
 * backend/cuda/cuda_dspark.h, its Markov and confidence heads still through the CPU code on the host)
 * with the target's hidden states of the drafter's layers captured by wait(), and hands it to the
 * engine (engine/drafter.h). The one parser of the config, for generate, serve and Python. */
#include "api/model_internal.h"
#include "arch/dspark.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dspark.h"
#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_dspark.h"
#endif
#include "engine/drafter.h"
#include "engine/spec_decode.h"
#include "util/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct dspark_binding {
  di_dspark *w;
  di_cpu_dspark *cpu; /* the CPU forward, or on CUDA only its Markov / confidence heads */
  di_backend *be;
#ifdef DI_HAVE_CUDA
  di_cuda_dspark *cuda; /* the forward on CUDA (NULL on the CPU) */
#endif
} dspark_binding;

static di_status b_kv_alloc(void *c, int64_t n) {
  dspark_binding *b = c;
#ifdef DI_HAVE_CUDA
  if (b->cuda) return di_cuda_dspark_kv_alloc(b->cuda, n);
#endif
  return di_cpu_dspark_kv_alloc(b->cpu, n);
}
static di_status b_context(void *c, int n, const float *f, const int32_t *pos, const int32_t *seq_of, const di_batch_seq *seqs) {
  dspark_binding *b = c;
#ifdef DI_HAVE_CUDA
  if (b->cuda) return di_cuda_dspark_context(b->cuda, n, f, pos, seq_of, seqs);
#endif
  return di_cpu_dspark_context(b->cpu, n, f, pos, seq_of, seqs);
}
static di_status b_propose(void *c, int n, const int32_t *tok, const int32_t *pos, const di_batch_seq *seqs,
                           const uint8_t *want, float *h, float *lg) {
  dspark_binding *b = c;
#ifdef DI_HAVE_CUDA
  if (b->cuda) return di_cuda_dspark_propose(b->cuda, n, tok, pos, seqs, want, h, lg);
#endif
  return di_cpu_dspark_propose_rows(b->cpu, n, tok, pos, seqs, want, h, lg);
}
#ifdef DI_HAVE_CUDA
static di_status b_draft_greedy(void *c, int n, const int32_t *anchor, const int32_t *cap, int limit, int32_t *tok,
                                float *conf) {
  return di_cuda_dspark_draft_greedy(((dspark_binding *)c)->cuda, n, anchor, cap, limit, tok, conf);
}
static di_status b_context_on_device(void *c, int max_step_rows) {
  return di_cuda_dspark_log_on(((dspark_binding *)c)->cuda, max_step_rows);
}
static di_status b_graph_on(void *c, int vocab_limit) { return di_cuda_dspark_graph_on(((dspark_binding *)c)->cuda, vocab_limit); }
static di_status b_graph_drafts(void *c, int n, int *made, int32_t *anchor, int32_t *tok, float *conf) {
  return di_cuda_dspark_graph_drafts(((dspark_binding *)c)->cuda, n, made, anchor, tok, conf);
}
#endif
static int is_backend(const di_model *m, const char *name) { return m->backend && strcmp(m->backend->ops->name, name) == 0; }
static di_status set_capture(dspark_binding *b, const int *ids, int n) {
#ifdef DI_HAVE_CUDA
  if (strcmp(b->be->ops->name, "cuda") == 0) return di_backend_cuda_set_capture(b->be, ids, n);
#endif
  return di_cpu_backend_set_capture(b->be, ids, n);
}
static void b_markov(void *c, int32_t prev, float *lg) { di_cpu_dspark_markov(((dspark_binding *)c)->cpu, prev, lg); }
static float b_conf(void *c, const float *h, int32_t prev) { return di_cpu_dspark_confidence(((dspark_binding *)c)->cpu, h, prev); }
static void b_destroy(void *c) {
  dspark_binding *b = c;
  if (!b) return;
  if (b->be) set_capture(b, NULL, 0);
#ifdef DI_HAVE_CUDA
  di_cuda_dspark_free(b->cuda);
#endif
  di_cpu_dspark_free(b->cpu);
  di_dspark_free(b->w);
  free(b);
}

static di_status set_dspark(di_engine *e, di_model *m, const char *dir, int k, int exact, int fixed) {
#ifdef DI_HAVE_CUDA
  const int on_cuda = is_backend(m, "cuda");
#else
  const int on_cuda = 0;
#endif
  if (!is_backend(m, "cpu") && !on_cuda)
    return di_error_set(DI_ERR_UNSUPPORTED, "speculative_config method \"dspark\" runs on the CPU and CUDA backends of a "
                        "DeepSeek-V2/V3 model (this model's backend is %s)", m->backend ? m->backend->ops->name : "none");
  char def[4200];
  if (!dir) {
    snprintf(def, sizeof def, "%s/dspark", m->dir);
    dir = def;
  }
  char cfg_path[4300];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
  if (access(cfg_path, R_OK) != 0)
    return di_error_set(DI_ERR_IO, "speculative_config: no DSpark drafter at %s (set \"model\" to a folder with config.json "
                        "and model.safetensors)", dir);
  dspark_binding *b = calloc(1, sizeof *b);
  if (!b) return di_error_set(DI_ERR_OOM, "out of memory");
  b->be = m->backend;
  di_status st = di_dspark_load(dir, &m->cfg, &m->weights.embed, &m->weights.lm_head, &b->w);
  if (st == DI_OK) st = di_cpu_dspark_create(b->w, on_cuda ? NULL : ((di_cpu_backend *)m->backend)->tp, &b->cpu);
#ifdef DI_HAVE_CUDA
  if (st == DI_OK && on_cuda) st = di_cuda_dspark_create(m->backend, b->w, &b->cuda);
#endif
  if (st == DI_OK) st = set_capture(b, b->w->feat_layers, b->w->n_feats);
  if (st == DI_OK) {
    di_drafter_ops ops = {.ctx = b, .block_size = b->w->block_size, .hidden = b->w->hidden,
                          .feat_dim = b->w->n_feats * b->w->target_hidden, .kv_alloc = b_kv_alloc,
                          /* both forwards keep float32 keys and values per layer */
                          .cache_bytes_per_token = (int64_t)b->w->n_layers * 2 * b->w->n_kv_heads * b->w->head_dim * 4,
                          .context = b_context, .propose = b_propose, .markov = b_markov, .confidence = b_conf,
                          .destroy = b_destroy};
#ifdef DI_HAVE_CUDA
    if (b->cuda) {
      ops.draft_greedy = b_draft_greedy;
      ops.context_on_device = b_context_on_device;
      ops.graph_on = b_graph_on;
      ops.graph_drafts = b_graph_drafts;
    }
#endif
    st = di_engine_set_dspark(e, &ops, k, exact, fixed);
  }
  if (st != DI_OK) b_destroy(b);
  return st;
}

di_status di_engine_set_speculative_config(di_engine *e, di_model *m, const char *json) {
  if (!json || (!e) != (!m)) return di_error_set(DI_ERR_INVALID_ARG, "di_engine_set_speculative_config: NULL argument");
  cJSON *j = NULL;
  DI_TRY(di_json_parse(json, strlen(json), "speculative_config", &j));
  di_status st = DI_OK;
  const char *method = NULL, *acceptance = NULL, *schedule = NULL, *model = NULL, *profile = NULL;
  int64_t k = -1;
  double conf = 0.3;
  if (!cJSON_IsObject(j)) {
    st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config must be a JSON object");
    goto done;
  }
  for (const cJSON *it = j->child; it; it = it->next)
    if (strcmp(it->string, "method") && strcmp(it->string, "num_speculative_tokens") && strcmp(it->string, "min_confidence") &&
        strcmp(it->string, "acceptance") && strcmp(it->string, "schedule") && strcmp(it->string, "model") &&
        strcmp(it->string, "profile")) {
      st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: unknown key \"%s\" (method, num_speculative_tokens, "
                        "min_confidence, acceptance, schedule, model, profile)", it->string);
      goto done;
    }
  if ((st = di_json_str(j, "method", NULL, "speculative_config", &method)) != DI_OK) goto done;
  if ((st = di_json_str(j, "acceptance", NULL, "speculative_config", &acceptance)) != DI_OK) goto done;
  if ((st = di_json_str(j, "schedule", "confidence", "speculative_config", &schedule)) != DI_OK) goto done;
  if ((st = di_json_str(j, "model", NULL, "speculative_config", &model)) != DI_OK) goto done;
  if ((st = di_json_str(j, "profile", "online", "speculative_config", &profile)) != DI_OK) goto done;
  if ((st = di_json_num(j, "min_confidence", 0.3, "speculative_config", &conf)) != DI_OK) goto done;
  const cJSON *nk = cJSON_GetObjectItemCaseSensitive(j, "num_speculative_tokens");
  if (nk && !di_json_int_in(nk, 0, 5, &k)) {
    st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: num_speculative_tokens must be an integer in [0, 5]");
    goto done;
  }
  if (!method || !strcmp(method, "deepseek_mtp")) method = "mtp"; /* as before: mtp when not named */
  if (strcmp(method, "mtp") && strcmp(method, "dspark")) {
    st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: method must be \"mtp\" or \"dspark\", got \"%s\"", method);
    goto done;
  }
  if (acceptance && strcmp(acceptance, "exact") && strcmp(acceptance, "rejection")) {
    st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: acceptance must be \"rejection\" or \"exact\", got \"%s\"", acceptance);
    goto done;
  }
  if (strcmp(schedule, "confidence") && strcmp(schedule, "fixed")) {
    st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: schedule must be \"confidence\" or \"fixed\", got \"%s\"", schedule);
    goto done;
  }
  if (strcmp(profile, "online") && strcmp(profile, "startup")) {
    st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: profile must be \"online\" or \"startup\", got \"%s\"", profile);
    goto done;
  }
  if (!strcmp(profile, "startup") && strcmp(method, "dspark")) {
    st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: profile \"startup\" is for method \"dspark\" (its "
                      "confidence schedule's step-time profile)");
    goto done;
  }
  if (!strcmp(method, "mtp") || !e) {
    if (strcmp(method, "mtp")) goto done; /* validation only (e and m NULL): dspark's checks need the model */
    if (acceptance && strcmp(acceptance, "exact")) {
      st = di_error_set(DI_ERR_UNSUPPORTED, "speculative_config: method \"mtp\" verifies by exact match only (acceptance \"exact\")");
      goto done;
    }
    if (model) {
      st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: \"model\" is for method \"dspark\" (mtp uses the model's own layer)");
      goto done;
    }
    if (k < 0) {
      st = di_error_set(DI_ERR_INVALID_ARG, "speculative_config: num_speculative_tokens (0..5) is required for method \"mtp\"");
      goto done;
    }
    if (e) st = di_engine_set_speculative(e, (int)k, (float)conf);
    goto done;
  }
  if (k == 0) {
    st = di_engine_set_speculative(e, 0, 0.3f);
    goto done;
  }
  st = set_dspark(e, m, model, k < 0 ? 5 : (int)k, acceptance && !strcmp(acceptance, "exact"), !strcmp(schedule, "fixed"));
  /* the confidence schedule's step times per graph bucket, measured now (else learned online) */
  if (st == DI_OK && !strcmp(profile, "startup")) st = di_spec_profile_startup(e);
done:
  cJSON_Delete(j);
  return st;
}
