/* The engine core: the request table and queues, and the step loop with async ("zero-overhead")
 * scheduling. While the backend computes step n, the host plans and builds step n+1 as if each
 * sample of step n yielded a token (the token ids are patched in once step n is sampled), so the
 * host work of scheduling overlaps the device; requests that finish in step n are dropped from the
 * plan before it is submitted. When the plan for n+1 would need preemption, the engine plans it
 * after step n instead (synchronously), so preemption never touches an in-flight sequence. */
#include "engine/engine_internal.h"
#include "engine/spec_decode.h"
#include "dist/dp_engine.h"
#include "kv/kv_budget.h"
#include "sampler/rng.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "util/switches.h"

const char *di_finish_reason_str(di_finish_reason r) {
  switch (r) {
  case DI_FINISH_STOP: return "stop";
  case DI_FINISH_LENGTH: return "length";
  case DI_FINISH_ABORT: return "abort";
  case DI_FINISH_ERROR: return "error";
  default: return "";
  }
}

void di_engine_options_default(di_engine_options *o) {
  memset(o, 0, sizeof *o);
  o->max_num_seqs = 256;
  o->max_num_batched_tokens = 2048;
  o->enable_prefix_caching = 1;
  o->enable_chunked_prefill = 1;
  o->async_scheduling = 1;
  o->kv_cache_memory_bytes = 0; /* sized at create: kv_budget.h */
  o->gpu_memory_utilization = (float)DI_GPU_MEMORY_UTILIZATION_DEFAULT;
}

void di_request_params_default(di_request_params *p) {
  memset(p, 0, sizeof *p);
  p->n = 1;
  p->temperature = 1.0f;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
  p->logprobs = -1;
  p->prompt_logprobs = -1;
  p->max_tokens = 16;
  p->skip_special_tokens = 1;
}

di_status di_engine_core_create(const di_engine_core_config *cfg, const di_engine_options *opt_in, di_engine **out) {
  di_engine_options opt;
  if (opt_in) opt = *opt_in; else di_engine_options_default(&opt);
  if (opt.max_num_seqs <= 0) return di_error_set(DI_ERR_INVALID_ARG, "max_num_seqs must be positive, got %d", opt.max_num_seqs);
  if (opt.max_num_batched_tokens <= 0)
    return di_error_set(DI_ERR_INVALID_ARG, "max_num_batched_tokens must be positive, got %d", opt.max_num_batched_tokens);
  if (opt.max_model_len <= 0 || opt.max_model_len > cfg->max_context) opt.max_model_len = cfg->max_context;
  if (opt.max_model_len <= 0) return di_error_set(DI_ERR_INVALID_ARG, "the model's context length is %d", cfg->max_context);
  if (!(opt.gpu_memory_utilization > 0)) opt.gpu_memory_utilization = (float)DI_GPU_MEMORY_UTILIZATION_DEFAULT;
  if (opt.gpu_memory_utilization > 1)
    return di_error_set(DI_ERR_INVALID_ARG, "gpu_memory_utilization must be in (0, 1], got %g", opt.gpu_memory_utilization);

  di_backend *be = cfg->backend;
  char kv_how[256];
  kv_how[0] = 0;
  if (opt.num_kv_blocks > 0) {
    snprintf(kv_how, sizeof kv_how, "num_kv_blocks given");
  } else if (opt.kv_cache_memory_bytes > 0) {
    snprintf(kv_how, sizeof kv_how, "kv_cache_memory given");
  } else if (be->ops->memory_info) {
    int64_t total = 0, used = 0;
    DI_TRY(be->ops->memory_info(be, opt.max_num_batched_tokens, opt.max_num_seqs, &total, &used));
    DI_TRY(di_kv_budget_from_device(total, used, opt.gpu_memory_utilization, &opt.kv_cache_memory_bytes));
    snprintf(kv_how, sizeof kv_how, "gpu_memory_utilization %.2f of %.1f GiB, %.1f GiB in use before it",
             opt.gpu_memory_utilization, (double)total / (1 << 30), (double)used / (1 << 30));
  } else {
    opt.kv_cache_memory_bytes = DI_KV_CPU_DEFAULT_BYTES;
    snprintf(kv_how, sizeof kv_how, "the fixed host default");
  }
  di_kv_group_info groups[DI_KV_MAX_GROUPS];
  memset(groups, 0, sizeof groups); /* backends set the fields they know; the rest stay 0 */
  int ng = be->ops->kv_groups(be, groups, DI_KV_MAX_GROUPS);
  if (ng < 1 || ng > DI_KV_MAX_GROUPS) return di_error_set(DI_ERR_BACKEND, "backend %s reports %d KV cache groups", be->ops->name, ng);
  int64_t nb[DI_KV_MAX_GROUPS];
  if (opt.num_kv_blocks > 0) {
    for (int g = 0; g < ng; g++) nb[g] = opt.num_kv_blocks;
  } else {
    DI_TRY(di_kv_plan(groups, ng, opt.kv_cache_memory_bytes, opt.max_num_seqs, opt.max_num_batched_tokens, nb));
  }
  /* a backend with several groups takes every group's tables (DeepSeek-V4); others address group 0 */
  if (ng > 1 && !be->ops->kv_alloc_groups)
    return di_error_set(DI_ERR_UNSUPPORTED, "backend %s reports %d KV cache groups but cannot allocate more than one pool", be->ops->name, ng);

  di_engine *e = calloc(1, sizeof *e);
  if (!e) return di_error_set(DI_ERR_OOM, "engine: out of memory");
  e->cfg = *cfg;
  if (cfg->text) e->text = *cfg->text;
  if (cfg->constraint) e->constraint = *cfg->constraint;
  e->opt = opt;
  e->be = be;
  {
    int64_t bytes = 0;
    for (int g = 0; g < ng; g++) bytes += nb[g] * groups[g].bytes_per_token * DI_KV_BLOCK_SIZE;
    snprintf(e->kv_summary, sizeof e->kv_summary, "KV cache: %lld blocks of %d tokens (%.2f GiB): %s",
             (long long)nb[0], DI_KV_BLOCK_SIZE, (double)bytes / (1 << 30), kv_how);
  }
  e->seed_state = opt.seed ? opt.seed : (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)e << 16);
  e->next_id = 1;
  di_status st = di_kv_manager_create(groups, ng, nb, opt.enable_prefix_caching, &e->kv);
  if (st == DI_OK) st = be->ops->kv_alloc_groups ? be->ops->kv_alloc_groups(be, nb, ng) : be->ops->kv_alloc(be, nb[0]);
  e->n_kv_groups = be->ops->kv_alloc_groups ? ng : 0; /* 0: batches carry group 0's tables only */
  for (int g = 0; g < ng && st == DI_OK && opt.swa_bounded_replay; g++)
    if (groups[g].kind == DI_KV_SLIDING && groups[g].window > 1 && groups[g].window - 1 > e->replay_len)
      e->replay_len = groups[g].window - 1;
  if (e->replay_len > 0) di_kv_set_bounded_replay(e->kv);
  if (st == DI_OK) st = di_row_sampler_create(cfg->vocab_size, 0, &e->rows);
  if (st == DI_OK) {
    e->logits = malloc((size_t)opt.max_num_seqs * (size_t)cfg->vocab_size * sizeof *e->logits);
    e->dev_rows = malloc((size_t)opt.max_num_seqs * sizeof *e->dev_rows);
    e->step_rows = malloc((size_t)opt.max_num_seqs * sizeof *e->step_rows);
    e->dev_tokens = malloc((size_t)opt.max_num_seqs * sizeof *e->dev_tokens);
    e->device_sampling = be->ops->sample != NULL && !di_switch_bool(DI_SW_HOST_SAMPLING, 0);
    e->feedback = e->device_sampling && be->ops->sample_async && be->ops->sample_fetch && opt.async_scheduling &&
                  !di_switch_bool(DI_SW_NO_FEEDBACK, 0);
    e->jobs = calloc((size_t)opt.max_num_seqs, sizeof *e->jobs); /* .spec 0: plain sampling */
    e->cap_queue = 64;
    e->running = malloc((size_t)e->cap_queue * sizeof *e->running);
    e->waiting = malloc((size_t)e->cap_queue * sizeof *e->waiting);
    if (!e->logits || !e->jobs || !e->running || !e->waiting || !e->dev_rows || !e->step_rows || !e->dev_tokens)
      st = di_error_set(DI_ERR_OOM, "engine: out of memory for %d x %d logits", opt.max_num_seqs, cfg->vocab_size);
  }
  if (st != DI_OK) {
    e->cfg.on_free = NULL; /* the caller still owns its context on failure */
    di_engine_free(e);
    return st;
  }
  *out = e;
  return DI_OK;
}

const char *di_engine_kv_summary(const di_engine *e) { return e ? e->kv_summary : ""; }

/* The DSpark drafter's cache as one more KV-manager group (see spec_decode.h). The manager is made
 * again with the backend's groups plus the drafter's: from the same byte budget (di_kv_plan over all
 * of them, so every group holds the same number of tokens) or, with num_kv_blocks given, that many
 * blocks per backend group and as many tokens' worth of drafter blocks. */
di_status di_engine_add_drafter_group(di_engine *e, int64_t bytes_per_token, int block_tokens, int64_t *n_blocks) {
  if (e->n_all > 0 || e->n_grave > 0 || e->steps > 0 || e->inflight_active)
    return di_error_set(DI_ERR_INVALID_ARG, "a drafter's KV cache group can only be added before the first request");
  if (bytes_per_token <= 0 || block_tokens <= 0 || DI_KV_BLOCK_SIZE % block_tokens != 0)
    return di_error_set(DI_ERR_INVALID_ARG, "drafter KV cache group: %lld bytes per token in blocks of %d tokens (a divisor "
                        "of %d)", (long long)bytes_per_token, block_tokens, DI_KV_BLOCK_SIZE);
  di_kv_group_info groups[DI_KV_MAX_GROUPS];
  int64_t nb[DI_KV_MAX_GROUPS], old[DI_KV_MAX_GROUPS];
  const int ng = e->drafter_group > 0 ? e->drafter_group : di_kv_num_groups(e->kv); /* a drafter set again: its group anew */
  if (ng + 1 > DI_KV_MAX_GROUPS)
    return di_error_set(DI_ERR_UNSUPPORTED, "the model has %d KV cache groups: no room for the drafter's (%d at most)", ng,
                        DI_KV_MAX_GROUPS);
  for (int g = 0; g < ng; g++) {
    groups[g] = *di_kv_group(e->kv, g);
    old[g] = di_kv_group_blocks(e->kv, g);
  }
  groups[ng] = (di_kv_group_info){.n_layers = 1, .bytes_per_token = bytes_per_token, .tokens_per_entry = 1,
                                  .kind = DI_KV_FULL, .bytes_per_entry = bytes_per_token, .block_tokens = block_tokens};
  if (e->opt.num_kv_blocks > 0) {
    for (int g = 0; g < ng; g++) nb[g] = old[g];
    nb[ng] = old[0] * (DI_KV_BLOCK_SIZE / block_tokens);
  } else {
    DI_TRY(di_kv_plan(groups, ng + 1, e->opt.kv_cache_memory_bytes, e->opt.max_num_seqs, e->opt.max_num_batched_tokens, nb));
  }
  di_kv_manager *kv = NULL;
  DI_TRY(di_kv_manager_create(groups, ng + 1, nb, e->opt.enable_prefix_caching, &kv));
  if (e->replay_len > 0) di_kv_set_bounded_replay(kv);
  int changed = 0;
  for (int g = 0; g < ng; g++) changed |= nb[g] != old[g];
  di_status st = DI_OK;
  if (changed) { /* the backend's pools shrink to make room */
    st = e->be->ops->kv_alloc_groups ? e->be->ops->kv_alloc_groups(e->be, nb, ng) : e->be->ops->kv_alloc(e->be, nb[0]);
    if (st != DI_OK) { /* back to the old pools (the error stays the one returned) */
      char msg[512];
      snprintf(msg, sizeof msg, "%s", di_last_error());
      if (e->be->ops->kv_alloc_groups) e->be->ops->kv_alloc_groups(e->be, old, ng);
      else e->be->ops->kv_alloc(e->be, old[0]);
      di_kv_manager_free(kv);
      return di_error_set(st, "%s", msg);
    }
  }
  di_kv_manager_free(e->kv);
  e->kv = kv;
  e->drafter_group = ng;
  *n_blocks = nb[ng];
  int64_t bytes = 0;
  for (int g = 0; g <= ng; g++) bytes += nb[g] * groups[g].bytes_per_token * di_kv_group(kv, g)->block_tokens;
  size_t n = strlen(e->kv_summary);
  snprintf(e->kv_summary + n, sizeof e->kv_summary - n, "; with the drafter's group: %lld blocks + %lld drafter blocks of %d "
           "tokens (%lld B/token), %.2f GiB in all", (long long)nb[0], (long long)nb[ng], block_tokens,
           (long long)bytes_per_token, (double)bytes / (1 << 30));
  return DI_OK;
}

void di_engine_free(di_engine *e) {
  if (!e) return;
  di_dp_front_free(e->dp); /* stops the other data-parallel ranks */
  if (e->inflight_active) {
    e->be->ops->wait(e->be, NULL, NULL); /* the step's arrays must outlive it */
    e->inflight_active = 0;
  }
  for (int i = 0; i < e->n_all; i++) di_req_free(e, e->all[i]);
  for (int i = 0; i < e->n_grave; i++) di_req_free(e, e->graveyard[i]);
  free(e->all); free(e->graveyard); free(e->running); free(e->waiting); free(e->outs);
  di_sched_free(&e->sched[0]);
  di_sched_free(&e->sched[1]);
  di_kv_manager_free(e->kv);
  di_row_sampler_free(e->rows);
  di_spec_free(e);
  free(e->logits); free(e->jobs); free(e->dev_rows); free(e->step_rows); free(e->dev_tokens);
  if (e->cfg.on_free) e->cfg.on_free(e->cfg.on_free_ctx);
  free(e);
}

static di_status push_ptr(di_req ***arr, int *n, int *cap, di_req *r) {
  if (*n == *cap) {
    int c = *cap ? *cap * 2 : 64;
    di_req **a = realloc(*arr, (size_t)c * sizeof *a);
    if (!a) return di_error_set(DI_ERR_OOM, "engine: out of memory");
    *arr = a;
    *cap = c;
  }
  (*arr)[(*n)++] = r;
  return DI_OK;
}

static di_status queue_reserve(di_engine *e, int extra) {
  int need = e->n_all + extra; /* every queued request is in `all`, so this bounds both queues */
  if (need <= e->cap_queue) return DI_OK;
  int c = e->cap_queue;
  while (c < need) c *= 2;
  di_req **a = realloc(e->running, (size_t)c * sizeof *a);
  if (!a) return di_error_set(DI_ERR_OOM, "engine: out of memory");
  e->running = a;
  a = realloc(e->waiting, (size_t)c * sizeof *a);
  if (!a) return di_error_set(DI_ERR_OOM, "engine: out of memory");
  e->waiting = a;
  e->cap_queue = c;
  return DI_OK;
}

static di_status validate(const di_engine *e, const di_request_params *p) {
  if (p->n < 0 || p->n > 1024) return di_error_set(DI_ERR_INVALID_ARG, "n must be in [1, 1024], got %d", p->n);
  if (p->n_prompt_ids < 0 || (p->n_prompt_ids > 0 && !p->prompt_ids))
    return di_error_set(DI_ERR_INVALID_ARG, "prompt_ids: %d ids but no array", p->n_prompt_ids);
  if (p->n_prompt_ids > 0 && p->prompt)
    return di_error_set(DI_ERR_INVALID_ARG, "give either prompt_ids or a text prompt, not both");
  if (p->n_prompt_ids == 0 && !p->prompt) return di_error_set(DI_ERR_INVALID_ARG, "the request has no prompt");
  for (int i = 0; i < p->n_prompt_ids; i++)
    if (p->prompt_ids[i] < 0 || p->prompt_ids[i] >= e->cfg.vocab_size)
      return di_error_set(DI_ERR_INVALID_ARG, "prompt_ids[%d] = %d is outside the vocabulary [0, %d)", i,
                          p->prompt_ids[i], e->cfg.vocab_size);
  for (int i = 0; i < p->n_stop_token_ids; i++)
    if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= e->cfg.vocab_size)
      return di_error_set(DI_ERR_INVALID_ARG, "stop_token_ids[%d] = %d is outside the vocabulary", i, p->stop_token_ids[i]);
  if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && (!p->logit_bias_ids || !p->logit_bias_values)))
    return di_error_set(DI_ERR_INVALID_ARG, "logit_bias: %d entries but no arrays", p->n_logit_bias);
  if (p->max_tokens < 0) return di_error_set(DI_ERR_INVALID_ARG, "max_tokens must be >= 0, got %d", p->max_tokens);
  if (p->prompt_logprobs > DI_MAX_LOGPROBS)
    return di_error_set(DI_ERR_INVALID_ARG, "prompt_logprobs must be at most %d, got %d", DI_MAX_LOGPROBS, p->prompt_logprobs);
  if (p->prompt_logprobs_from < 0)
    return di_error_set(DI_ERR_INVALID_ARG, "prompt_logprobs_from must be >= 0, got %d", p->prompt_logprobs_from);
  if (p->min_tokens < 0) return di_error_set(DI_ERR_INVALID_ARG, "min_tokens must be >= 0, got %d", p->min_tokens);
  if (p->max_tokens > 0 && p->min_tokens > p->max_tokens)
    return di_error_set(DI_ERR_INVALID_ARG, "min_tokens must be at most max_tokens (%d), got %d", p->max_tokens, p->min_tokens);
  if (p->n_stop > 0 && !e->text.stream_create)
    return di_error_set(DI_ERR_UNSUPPORTED, "stop strings need a tokenizer (the model folder has no tokenizer.json)");
  if (p->prompt && !e->text.encode_prompt)
    return di_error_set(DI_ERR_UNSUPPORTED, "a text prompt needs a tokenizer (the model folder has no tokenizer.json)");
  int n_struct = !!p->json_schema + !!p->regex + !!p->grammar + !!p->json_object;
  if (n_struct > 1) return di_error_set(DI_ERR_INVALID_ARG, "give at most one of json_schema, regex, grammar, json_object");
  di_sampling sp = {.temperature = p->temperature, .top_p = p->top_p, .top_k = p->top_k, .min_p = p->min_p,
                    .repetition_penalty = p->repetition_penalty, .presence_penalty = p->presence_penalty,
                    .frequency_penalty = p->frequency_penalty, .bias_ids = p->logit_bias_ids,
                    .bias_values = p->logit_bias_values, .n_bias = p->n_logit_bias, .logprobs = p->logprobs};
  return di_sampling_validate(&sp, e->cfg.vocab_size);
}

/* a request that can never run ends with an error of its own at once */
static const char *admission_error(const di_engine *e, const di_req *r, char *buf, size_t cap) {
  if (r->n_prompt == 0) return "the prompt is empty";
  if (r->n_prompt > e->opt.max_model_len || (r->n_prompt == e->opt.max_model_len && !r->score_only)) {
    snprintf(buf, cap, "the prompt has %d tokens; max_model_len is %d (the prompt must leave room for one token)",
             r->n_prompt, e->opt.max_model_len);
    return buf;
  }
  if (!e->opt.enable_chunked_prefill && r->n_prompt > e->opt.max_num_batched_tokens) {
    snprintf(buf, cap, "the prompt has %d tokens, more than max_num_batched_tokens (%d) with chunked prefill off",
             r->n_prompt, e->opt.max_num_batched_tokens);
    return buf;
  }
  if (!e->opt.enable_chunked_prefill && r->plp_k >= 0 && r->n_prompt - 1 > e->plp_row_cap) {
    snprintf(buf, cap, "the prompt has %d tokens; with chunked prefill off, prompt logprobs are computed for prompts of "
             "at most %d tokens", r->n_prompt, e->plp_row_cap + 1);
    return buf;
  }
  int64_t longest = (int64_t)r->n_prompt + r->max_tokens;
  if (longest > e->opt.max_model_len) longest = e->opt.max_model_len;
  int g;
  int64_t blocks;
  if (!di_kv_fits(e->kv, longest, e->opt.max_num_batched_tokens, &g, &blocks)) {
    snprintf(buf, cap, "the request may need %lld KV blocks (%lld tokens) but the KV pool%s has %lld; raise the KV cache memory",
             (long long)blocks, (long long)longest, g ? " of its cache group" : "", (long long)di_kv_group_blocks(e->kv, g));
    return buf;
  }
  return NULL;
}

di_status di_engine_add_request(di_engine *e, const di_request_params *p, uint64_t *req_id) {
  DI_TRY(validate(e, p));
  int32_t *ids = NULL;
  size_t n_ids = 0;
  const int32_t *prompt = p->prompt_ids;
  int n_prompt = p->n_prompt_ids;
  if (p->prompt) {
    DI_TRY(e->text.encode_prompt(e->text.ctx, p->prompt, p->prompt_is_rendered, &ids, &n_ids));
    prompt = ids;
    n_prompt = (int)n_ids;
  }
  if (p->prompt_logprobs >= 0 && p->prompt_logprobs_from > n_prompt) {
    free(ids);
    return di_error_set(DI_ERR_INVALID_ARG, "prompt_logprobs_from is %d but the prompt has %d tokens",
                        p->prompt_logprobs_from, n_prompt);
  }
  int where = e->dp ? di_dp_front_place(e->dp, n_prompt) : 0;
  if (where > 0) { /* another data-parallel rank's: numbered and seeded here, in arrival order */
    uint64_t id = e->next_id++, seed = p->has_seed ? p->seed : di_rng_draw_seed(&e->seed_state);
    di_status st = di_dp_front_add(e->dp, where, p, prompt, n_prompt, id, seed);
    free(ids);
    if (st == DI_OK) *req_id = id;
    return st;
  }
  int n = p->n > 0 ? p->n : 1;
  di_status st = p->prompt_logprobs >= 0 ? di_plp_reserve(e) : DI_OK;
  if (st == DI_OK) st = queue_reserve(e, n);
  if (st != DI_OK) { free(ids); return st; }
  uint64_t id = e->next_id++;
  uint64_t seed = p->has_seed ? p->seed : di_rng_draw_seed(&e->seed_state);
  di_req *leader = NULL;
  di_req *made[1024];
  for (int s = 0; s < n; s++) {
    st = di_req_create(e, p, prompt, n_prompt, s, id, seed, &made[s]);
    if (st != DI_OK) {
      for (int k = 0; k < s; k++) di_req_free(e, made[k]);
      free(ids);
      return st;
    }
    made[s]->leader = leader;
    if (s == 0) leader = made[0];
  }
  free(ids);
  char buf[256];
  for (int s = 0; s < n; s++) {
    di_req *r = made[s];
    if (push_ptr(&e->all, &e->n_all, &e->cap_all, r) != DI_OK) {
      for (int k = s; k < n; k++) di_req_free(e, made[k]);
      return DI_ERR_OOM;
    }
    r->state = DI_REQ_WAITING;
    e->waiting[e->n_waiting++] = r;
  }
  /* after every sample is in e->all: a leader that fails here (an error only sample 0 can have, e.g.
   * its prompt logprobs) clears its followers' pointers to it as it finishes */
  for (int s = 0; s < n; s++) {
    const char *why = admission_error(e, made[s], buf, sizeof buf);
    if (why) di_req_finish(e, made[s], DI_FINISH_ERROR, why);
  }
  *req_id = id;
  return DI_OK;
}

di_status di_engine_abort(di_engine *e, uint64_t req_id) {
  if (e->dp && di_dp_front_abort(e->dp, req_id)) return DI_OK;
  int found = 0;
  for (int i = 0; i < e->n_all; i++) {
    di_req *r = e->all[i];
    if (r->id != req_id || r->state == DI_REQ_DONE) continue;
    found = 1;
    r->abort_requested = 1;
    if (!r->inflight) di_req_finish(e, r, DI_FINISH_ABORT, NULL);
  }
  if (!found) return di_error_set(DI_ERR_NOT_FOUND, "no unfinished request with id %llu", (unsigned long long)req_id);
  return DI_OK;
}

int di_engine_has_unfinished(const di_engine *e) {
  return (e->dp && di_dp_front_busy(e->dp)) || di_engine_has_unfinished_local(e);
}

int di_engine_has_unfinished_local(const di_engine *e) {
  if (e->inflight_active) return 1; /* its requests may all have ended; stepping it drains the pipeline */
  for (int i = 0; i < e->n_all; i++)
    if (!e->all[i]->reported) return 1;
  return 0;
}

static void set_inflight(di_sched *s, int v) {
  for (int i = 0; i < s->n; i++)
    if (!s->e[i].dropped) {
      s->e[i].r->inflight = v;
      if (s->e[i].sample && v) s->e[i].r->pending = 1;
    }
}

/* The device draw of request r's row with the generator's counter at `counter` (the tokens it has
 * when the row is drawn). */
static di_sample_row device_row(const di_engine *e, const di_req *r, uint64_t counter) {
  return (di_sample_row){.temperature = r->sp.temperature, .top_p = r->sp.top_p, .top_k = r->sp.top_k,
                         .min_p = r->sp.min_p, .seed = r->sp.seed, .counter = counter,
                         .vocab_limit = e->cfg.vocab_limit};
}

/* A row the backend can sample on the device: nothing but temperature / top-k / top-p / min-p and
 * the seed (the device draws with the same counter-based generator, for sample 0). n_tok: the tokens
 * the request has when the row is drawn (min_tokens no longer bans EOS then). */
static int device_row_ok(const di_req *r, int n_tok) {
  const di_sampling *sp = &r->sp;
  return !r->constraint && sp->logprobs < 0 && sp->n_bias == 0 && sp->repetition_penalty == 1.0f &&
         sp->presence_penalty == 0 && sp->frequency_penalty == 0 && r->sample_index == 0 &&
         n_tok - r->n_prompt >= r->min_tokens;
}

/* The rows of step s for device sampling, into rows[]; 0 when some row must be sampled on the host.
 * ahead: planned at submit, before the step's requests have the tokens still in flight (the step
 * before it, with device token feedback): each such request will have one token more then, which
 * the draw's counter counts. */
static int plan_rows(di_engine *e, di_sched *s, di_sample_row *rows, int ahead) {
  if (!e->device_sampling || s->batch.n_outputs == 0 || s->n_plp > 0) return 0; /* one row per sample only */
  int k = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped || !en->sample) continue;
    di_req *r = en->r;
    const int n_tok = r->n_tokens + (ahead ? r->pending : 0);
    if (r->state != DI_REQ_DONE && !device_row_ok(r, n_tok)) return 0;
    rows[k++] = device_row(e, r, (uint64_t)n_tok);
  }
  return 1;
}

static int plan_device_sampling(di_engine *e, di_sched *s) { return plan_rows(e, s, e->dev_rows, 0); }

/* A speculative verify step (DSpark device steps) whose sampled rows the device can draw: every row
 * of a decoding entry from its first verified one is drawn as plain decoding would draw it at that
 * position (round j: the request then has n_tokens + pending + j tokens; pending: a step planned
 * while the one before it ran, queued with token feedback, whose requests do not have that step's
 * token yet), the other rows are greedy fillers nobody reads. Only requests whose drafts are verified
 * by exact match (greedy ones, or acceptance "exact"): rejection sampling needs the target's
 * distribution on the host. 0: the host samples. */
static int plan_verify_rows(di_engine *e, di_sched *s, di_sample_row *rows) {
  if (!rows || !e->device_sampling || s->n_plp > 0 || s->batch.n_outputs != s->batch.n_tokens) return 0;
  int t = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    di_req *r = en->r;
    const int live = en->sample && r->state != DI_REQ_DONE, n_tok = r->n_tokens + r->pending;
    if (live && (r->draft_sampled || !device_row_ok(r, n_tok))) return 0;
    const int first = live ? en->n_new - 1 - r->n_spec : en->n_new;
    for (int k = 0; k < en->n_new; k++, t++)
      rows[t] = k >= first ? device_row(e, r, (uint64_t)(n_tok + k - first))
                           : (di_sample_row){.temperature = 0.f, .top_p = 1.f, .vocab_limit = e->cfg.vocab_limit};
  }
  return t == s->batch.n_outputs;
}

/* Samples the rows of a completed step and applies what the next step depends on.
 * on_device: 1 sample on the device now, 2 the tokens are in e->dev_tokens already (feedback_step). A
 * request that is also in the step queued after this one (in_next) stays in flight: its blocks and its
 * pending token belong to that step now. */
static di_status sample_step(di_engine *e, di_sched *s, int on_device) {
  int n_jobs = 0;
  if (on_device == 1) DI_TRY(e->be->ops->sample(e->be, e->dev_rows, s->batch.n_outputs, e->dev_tokens));
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    di_req *r = en->r;
    r->inflight = r->in_next;
    if (!r->in_next) r->pending = 0;
    int my_row = en->sample ? en->sample_row : -1;
    if (r->state == DI_REQ_DONE) { /* ended while the step ran: its blocks can go back now */
      di_req_free_kv(e, r);
      continue;
    }
    r->n_valid = en->start + en->n_new;
    di_kv_commit(e->kv, &r->kv, r->tokens, r->n_valid < r->n_tokens ? r->n_valid : r->n_tokens);
    if (r->abort_requested) {
      di_req_finish(e, r, DI_FINISH_ABORT, NULL);
      continue;
    }
    if (my_row < 0) continue;
    if (on_device) {
      di_sample_result res = {.token = e->dev_tokens[my_row]};
      di_req_push_token(e, r, &res);
    } else {
      e->jobs[n_jobs].r = r;
      e->jobs[n_jobs].spec = 0;
      e->jobs[n_jobs++].row = my_row;
    }
  }
  if (n_jobs == 0) return DI_OK;
  di_row_sampler_run(e->rows, e, e->jobs, n_jobs);
  for (int j = 0; j < n_jobs; j++) {
    di_row_job *jb = &e->jobs[j];
    if (jb->st != DI_OK) di_req_finish(e, jb->r, DI_FINISH_ERROR, jb->err);
    else di_req_push_token(e, jb->r, &jb->res);
  }
  return DI_OK;
}

/* Detokenisation, stop strings and the grammar for the tokens of a completed step. */
static void post_step(di_engine *e, di_sched *s) {
  for (int i = 0; i < s->n; i++)
    if (!s->e[i].dropped && s->e[i].sample) di_req_post_tokens(e, s->e[i].r);
}

/* Moves every request with something to report into the step output. */
static di_status collect_outputs(di_engine *e) {
  e->n_outs = 0;
  /* room for every output first: filling one marks it reported, so none may be filled and lost */
  int need = 0;
  for (int i = 0; i < e->n_all; i++) need += e->all[i]->in_output != 0;
  if (need > e->cap_outs) {
    int c = e->cap_outs ? e->cap_outs : 64;
    while (c < need) c *= 2;
    di_seq_output *o = realloc(e->outs, (size_t)c * sizeof *o);
    if (!o) return di_error_set(DI_ERR_OOM, "engine: out of memory for outputs");
    e->outs = o;
    e->cap_outs = c;
  }
  for (int i = 0; i < e->n_all; i++) {
    di_req *r = e->all[i];
    if (!r->in_output) continue;
    di_req_fill_output(e, r, &e->outs[e->n_outs++]);
  }
  /* reported finished requests leave the table; they are freed at the next step (one the graveyard
   * has no room for stays in the table until a later step: the outputs filled above must go out) */
  int k = 0;
  for (int i = 0; i < e->n_all; i++) {
    di_req *r = e->all[i];
    if (r->reported && !r->inflight && push_ptr(&e->graveyard, &e->n_grave, &e->cap_grave, r) == DI_OK) continue;
    e->all[k++] = r;
  }
  e->n_all = k;
  e->step_out.n = e->n_outs;
  e->step_out.seqs = e->outs;
  return DI_OK;
}

static di_status submit(di_engine *e, di_sched *s) {
  /* the sampling of the step goes with it to the device where it can (see di_batch.sample_rows); with
   * speculative decoding only a step that verifies no draft (DSpark's device steps) */
  const int rows = (!e->spec || di_spec_plain_ok(e, s)) && plan_rows(e, s, e->step_rows, 1);
  s->batch.sample_rows = rows ? e->step_rows : NULL;
  s->spec_plain = e->spec && rows;
  if (s->spec_plain) di_spec_plain_submitted(e, s);
  s->spec_devverify = e->spec && !rows && plan_verify_rows(e, s, di_spec_verify_rows(e));
  if (s->spec_devverify) s->batch.sample_rows = di_spec_verify_rows(e);
  /* DSpark: the next drafts proposed inside this device-sampled step (no round trip after it) */
  s->spec_gprop = e->spec && (s->spec_plain || s->spec_devverify) && di_spec_graph_propose(e, s);
  const double ts = di_now();
  DI_TRY(e->be->ops->submit(e->be, &s->batch));
  e->t_submit = di_now();
  e->t_submit0 = ts;
  if (e->spec) di_spec_submitted(e, s, e->t_submit - ts);
  e->inflight_active = 1;
  set_inflight(s, 1);
  e->steps++;
  return DI_OK;
}

static di_status fail_inflight(di_engine *e, di_sched *s, di_status st) {
  /* the engine cannot go on with this step: its requests end with the backend's message */
  char msg[512];
  snprintf(msg, sizeof msg, "%s", di_last_error());
  for (int i = 0; i < s->n; i++) {
    di_req *r = s->e[i].r;
    r->inflight = r->pending = 0;
    if (s->e[i].dropped) continue;
    if (r->state == DI_REQ_DONE) di_req_free_kv(e, r); /* ended while in flight */
    else di_req_finish(e, r, DI_FINISH_ERROR, msg);
  }
  di_sched_clear(s);
  e->inflight_active = 0;
  di_error_set(st, "%s", msg);
  return st;
}

/* A plan that could not be made (out of memory building it): its requests end with the error
 * (di_last_error's message), the plan is cleared. */
static void fail_plan(di_engine *e, di_sched *next) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", di_last_error());
  for (int i = 0; i < next->n; i++) di_req_finish(e, next->e[i].r, DI_FINISH_ERROR, msg);
  di_sched_clear(next);
  di_error_set(DI_ERR_OOM, "%s", msg);
}

/* A failed step: the plan made for the step after it is void too; the requests of both end with the
 * error (its message kept across the calls that end them). */
static di_status fail_with_plan(di_engine *e, di_sched *cur, di_sched *next, di_status st) {
  fail_plan(e, next);
  return fail_inflight(e, cur, st);
}

/* The planned step `next` without the requests that ended (while the step before it ran) or were
 * aborted: their entries are marked dropped; 1 when any was, so the batch must be built again. */
static int drop_ended(di_engine *e, di_sched *next) {
  int dropped = 0;
  for (int i = 0; i < next->n; i++) {
    di_req *r = next->e[i].r;
    if (r->state == DI_REQ_DONE) { next->e[i].dropped = 1; dropped = 1; continue; }
    if (r->abort_requested) { di_req_finish(e, r, DI_FINISH_ABORT, NULL); next->e[i].dropped = 1; dropped = 1; }
  }
  return dropped;
}

/* Device token feedback ("zero-overhead" decoding): the in-flight step `cur` is sampled on the device
 * and `next` (planned while cur ran, its placeholders being cur's samples) is queued right behind that
 * sampling, before the host has the tokens; then the host fetches them (next computes meanwhile) and
 * does cur's bookkeeping. A request that ends with cur's token (a stop token, its length) is already
 * in next: it stays in flight there, and that step's token for it is dropped when it completes, as
 * for a stop string found while a step runs. Called only when every row of cur is sampled on the
 * device (plan_device_sampling) and next has work. */
static di_status feedback_step(di_engine *e, di_sched *cur, di_sched *next, double *t_blocked) {
  di_backend *be = e->be;
  di_status st = be->ops->sample_async(be, e->dev_rows, cur->batch.n_outputs);
  e->inflight_active = 0;
  if (st != DI_OK) return fail_with_plan(e, cur, next, st);
  if (drop_ended(e, next)) DI_TRY(di_sched_build_batch(e, next));
  /* placeholders: the token cur samples for the request, by its output row */
  for (int i = 0; i < cur->n; i++) {
    di_sched_entry *en = &cur->e[i];
    if (!en->dropped) en->r->fb_row = en->sample ? en->sample_row : -1;
  }
  int t = 0, ok = 1;
  for (int i = 0; i < next->n; i++) {
    di_sched_entry *en = &next->e[i];
    if (en->dropped) continue;
    for (int k = 0; k < en->n_new; k++, t++)
      if (next->tokens[t] < 0) {
        if (en->r->fb_row < 0) ok = 0; /* cannot happen: a placeholder is always cur's sample */
        next->tokens[t] = -1 - en->r->fb_row;
      }
  }
  for (int i = 0; i < cur->n; i++)
    if (!cur->e[i].dropped) cur->e[i].r->fb_row = -1;
  DI_ASSERT(ok);
  if (next->batch.n_tokens > 0) {
    st = submit(e, next);
    if (st != DI_OK) {
      /* cur's tokens are still on the device: fetch them so cur completes, then fail next */
      char msg[512];
      snprintf(msg, sizeof msg, "%s", di_last_error());
      if (be->ops->sample_fetch(be, e->dev_tokens) == DI_OK) (void)sample_step(e, cur, 2);
      di_error_set(st, "%s", msg);
      return fail_inflight(e, next, st);
    }
    e->cur ^= 1;
    e->feedback_steps++;
    next->fb_queued = 1;
    for (int i = 0; i < next->n; i++)
      if (!next->e[i].dropped) next->e[i].r->in_next = 1;
  } else {
    di_sched_clear(next);
  }
  /* cur's tokens, while next computes */
  double tf = di_now();
  st = be->ops->sample_fetch(be, e->dev_tokens);
  const double tfe = di_now();
  *t_blocked += tfe - tf;
  /* a plain step queued behind the one before it: its tokens' time after that one's is what it cost */
  if (st == DI_OK && e->spec && cur->fb_queued && cur->spec_plain && e->t_done > 0)
    di_spec_record_pipelined(e, cur->n_tokens, tfe - e->t_done);
  e->t_done = tfe;
  if (st == DI_OK) st = sample_step(e, cur, 2);
  for (int i = 0; i < next->n; i++)
    if (!next->e[i].dropped) next->e[i].r->in_next = 0;
  if (st != DI_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", di_last_error());
    if (e->inflight_active) { /* drain the queued step, then fail both */
      (void)be->ops->wait(be, NULL, NULL);
      fail_inflight(e, next, st);
    }
    di_error_set(st, "%s", msg);
    return fail_inflight(e, cur, st);
  }
  di_plp_finish_scored(e, cur);
  di_sched_patch_tokens(next); /* the host copy of its tokens, now known */
  return DI_OK;
}

di_status di_engine_step(di_engine *e, di_step_output **out) {
  return e->dp ? di_dp_front_step(e->dp, e, out) : di_engine_step_local(e, out);
}

di_status di_engine_step_local(di_engine *e, di_step_output **out) {
  double t0 = di_now(), t_blocked = 0;
  di_status st_spec = DI_OK;
  for (int i = 0; i < e->n_grave; i++) di_req_free(e, e->graveyard[i]);
  e->n_grave = 0;
  for (int i = 0; i < e->n_all; i++) di_req_reset_output(e->all[i]);
  di_status st = DI_OK;

  if (!e->inflight_active) {
    di_sched *s = &e->sched[e->cur];
    st = di_schedule(e, s, 0);
    if (st == DI_OK && s->n > 0) st = di_sched_build_batch(e, s);
    if (st != DI_OK) return fail_inflight(e, s, st); /* (not submitted) its requests end with the error */
    if (s->n > 0) {
      double ts = di_now();
      st = submit(e, s);
      t_blocked += di_now() - ts;
      if (st != DI_OK) return fail_inflight(e, s, st);
    }
  }
  if (e->inflight_active) {
    di_sched *cur = &e->sched[e->cur], *next = &e->sched[e->cur ^ 1];
    di_sched_clear(next);
    if (e->opt.async_scheduling || cur->spec_ahead) {
      st = di_schedule(e, next, 1);
      if (st == DI_OK && next->n > 0) st = di_sched_build_batch(e, next);
      if (st != DI_OK) fail_plan(e, next); /* its requests end with the error; the step in flight goes on */
      st = DI_OK;
    }
    int on_device = (!e->spec || cur->spec_plain) && plan_device_sampling(e, cur);
    if (on_device && e->feedback && next->n > 0 && cur->n_plp == 0) {
      e->hidden_s += di_now() - (e->t_submit > t0 ? e->t_submit : t0);
      st = feedback_step(e, cur, next, &t_blocked);
      if (st != DI_OK) {
        collect_outputs(e);
        *out = &e->step_out;
        return st;
      }
    } else {
      double tw = di_now();
      e->hidden_s += tw - (e->t_submit > t0 ? e->t_submit : t0); /* host work done while it computed */
      st = e->be->ops->wait(e->be, on_device || cur->spec_devverify ? NULL : e->logits, e->spec ? di_spec_hidden_for(e, cur) : NULL);
      double tw1 = di_now();
      e->t_done = tw1;
      t_blocked += tw1 - tw;
      e->wait_s += tw1 - tw;
      e->inflight_active = 0;
      if (st == DI_OK && e->spec) di_spec_record_step(e, cur->n_tokens, tw1 - e->t_submit0, cur->spec_gprop);
      if (st != DI_OK) {
        fail_with_plan(e, cur, next, st);
        collect_outputs(e);
        *out = &e->step_out;
        return st;
      }
      if (cur->n_plp > 0) di_plp_extract(e, cur);
      st = e->spec && !cur->spec_plain ? di_spec_sample_step(e, cur) : sample_step(e, cur, on_device);
      if (st == DI_OK) di_plp_finish_scored(e, cur);
      if (st != DI_OK) return fail_with_plan(e, cur, next, st);
      if (next->n > 0) {
        if (drop_ended(e, next)) {
          if (di_sched_build_batch(e, next) != DI_OK) fail_plan(e, next);
        } else {
          di_sched_patch_tokens(next);
        }
        if (next->batch.n_tokens > 0) {
          double ts = di_now();
          st = submit(e, next);
          t_blocked += di_now() - ts;
          e->cur ^= 1;
          if (st != DI_OK) return fail_inflight(e, next, st);
        } else {
          di_sched_clear(next);
        }
      }
    }
    /* the rest of step n's results, while step n+1 computes */
    double tp = di_now();
    post_step(e, cur);
    if (e->spec) { /* synchronous unless cur was a plain step with no proposal after it (spec_ahead) */
      if (!cur->spec_plain) di_spec_after_post(e, cur);
      st_spec = di_spec_draft(e, cur);
    }
    di_sched_clear(cur);
    if (e->inflight_active) e->hidden_s += di_now() - tp;
  }
  double tc = di_now();
  DI_TRY(collect_outputs(e));
  double t1 = di_now();
  if (e->inflight_active) e->hidden_s += t1 - tc;
  e->busy_s += t1 - t0;
  e->host_s += (t1 - t0) - t_blocked;
  if (e->spec) di_spec_call_done(e, t1 - t0);
  *out = &e->step_out;
  if (st_spec != DI_OK) return st_spec; /* MTP failure: the message is set, its requests ended with it */
  return DI_OK;
}

void di_engine_get_stats(const di_engine *e, di_engine_stats *s) {
  di_engine_get_stats_local(e, s);
  if (e->dp) di_dp_front_add_stats(e->dp, s); /* data parallel: every rank's engine, as of the last step */
}

void di_engine_get_stats_local(const di_engine *e, di_engine_stats *s) {
  memset(s, 0, sizeof *s);
  di_kv_stats k;
  di_kv_get_stats(e->kv, &k);
  s->kv_blocks_total = k.total_blocks;
  s->kv_blocks_used = k.used_blocks;
  s->kv_blocks_free = k.free_blocks;
  s->kv_blocks_cached = k.cached_blocks;
  s->prefix_cache_hit_tokens = k.hit_tokens;
  s->prefix_cache_query_tokens = k.query_tokens;
  s->prefix_cache_hit_rate = k.query_tokens > 0 ? (double)k.hit_tokens / (double)k.query_tokens : 0;
  s->n_running = e->n_running;
  s->n_waiting = e->n_waiting;
  s->steps = e->steps;
  s->prompt_tokens = e->prompt_tokens;
  s->generated_tokens = e->generated_tokens;
  s->preemptions = e->preemptions;
  s->prompt_tokens_per_s = e->busy_s > 0 ? (double)e->prompt_tokens / e->busy_s : 0;
  s->generation_tokens_per_s = e->busy_s > 0 ? (double)e->generated_tokens / e->busy_s : 0;
  s->host_time_s = e->host_s;
  s->hidden_host_time_s = e->hidden_s < e->host_s ? e->hidden_s : e->host_s;
  s->backend_wait_s = e->wait_s;
  s->prefix_waits = e->prefix_waits;
}

di_status di_engine_check(const di_engine *e) {
  int64_t refs = 0;
  for (int i = 0; i < e->n_all; i++) refs += di_kv_seq_refs(e->kv, &e->all[i]->kv);
  for (int i = 0; i < e->n_grave; i++) refs += di_kv_seq_refs(e->kv, &e->graveyard[i]->kv);
  return di_kv_check(e->kv, refs);
}
