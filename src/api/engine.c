/* di_engine_create: the engine over a loaded model. Wires the model's backend, vocabulary, EOS ids
 * and context into the engine core, the tokenizer (loaded here from the folder's
 * tokenizer.json) as its text adapter, and the grammar engine for structured outputs. */
#include "api/engine_api.h"
#include "api/model_internal.h"
#include "dist/dist.h"
#include "dist/dp_engine.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static di_status t_encode(void *ctx, const char *text, int raw, int32_t **ids, size_t *n) {
  const di_tokenizer *t = ((di_engine_text_ctx *)ctx)->tok;
  if (raw) return di_tokenizer_encode(t, text, strlen(text), 0, ids, n);
  return di_tokenizer_encode_prompt(t, text, strlen(text), ids, n);
}
static di_status t_create(void *ctx, int skip, void **stream) {
  return di_detok_stream_create(((di_engine_text_ctx *)ctx)->tok, skip, (di_detok_stream **)stream);
}
static di_status t_push(void *s, int32_t id, const char **text, size_t *len) { return di_detok_stream_push(s, id, text, len); }
static di_status t_flush(void *s, const char **text, size_t *len) { return di_detok_stream_flush(s, text, len); }
static void t_free(void *s) { di_detok_stream_free(s); }

static void ctx_free(void *p) {
  di_engine_text_ctx *c = p;
  if (!c) return;
  if (c->owns_tok) di_tokenizer_free(c->tok);
  di_grammar_vocab_free(c->gvocab);
  free(c);
}

di_status di_engine_create(di_model *m, const di_engine_options *opt, di_engine **out) {
  if (!m || !out) return di_error_set(DI_ERR_INVALID_ARG, "di_engine_create: NULL argument");
  di_engine_text_ctx *c = calloc(1, sizeof *c);
  if (!c) return di_error_set(DI_ERR_OOM, "out of memory");
  c->model_vocab = m->cfg.vocab_size;
  char path[4200];
  snprintf(path, sizeof path, "%s/tokenizer.json", m->dir);
  if (access(path, R_OK) == 0) {
    di_status st = di_tokenizer_load(m->dir, &c->tok);
    if (st != DI_OK) {
      free(c);
      return di_error_wrap(st, "engine");
    }
    c->owns_tok = 1;
  }
  for (int i = 0; i < m->cfg.n_eos && c->n_eos < 16; i++) c->eos[c->n_eos++] = m->cfg.eos_token_ids[i];
  if (c->n_eos == 0 && c->tok && di_tokenizer_eos_id(c->tok) >= 0) c->eos[c->n_eos++] = di_tokenizer_eos_id(c->tok);

  di_text_ops text = {c, t_encode, t_create, t_push, t_flush, t_free};
  di_constraint_ops cons;
  di_engine_constraint_ops(c, &cons);
  di_engine_core_config cfg = {0};
  cfg.backend = m->backend;
  cfg.vocab_size = m->cfg.vocab_size;
  int limit = m->cfg.vocab_size;
  if (c->tok && di_tokenizer_vocab_size(c->tok) < limit) limit = di_tokenizer_vocab_size(c->tok);
  if (m->tokenizer_vocab > 0 && m->tokenizer_vocab < limit) limit = m->tokenizer_vocab;
  cfg.vocab_limit = limit;
  cfg.max_context = m->cfg.max_position_embeddings;
  cfg.eos_ids = c->eos;
  cfg.n_eos = c->n_eos;
  cfg.text = c->tok ? &text : NULL;
  cfg.constraint = c->tok ? &cons : NULL;
  cfg.constraint_missing = "structured outputs need a tokenizer (the model folder has no tokenizer.json)";
  cfg.on_free = ctx_free;
  cfg.on_free_ctx = c;
  di_status st = di_dist_dp_size() > 1 ? di_dp_prepare(m) : DI_OK;
  if (st == DI_OK) st = di_engine_core_create(&cfg, opt, out);
  if (st != DI_OK) ctx_free(c);
  if (st == DI_OK && di_dist_dp_size() > 1) { /* rank 0: a front end; other ranks work here until the end */
    st = di_dp_attach(*out);
    if (st != DI_OK) {
      di_engine_free(*out);
      *out = NULL;
    }
  }
  return st;
}

size_t di_abi_sizeof(const char *name) {
  if (!name) return 0;
  if (strcmp(name, "di_engine_options") == 0) return sizeof(di_engine_options);
  if (strcmp(name, "di_request_params") == 0) return sizeof(di_request_params);
  if (strcmp(name, "di_seq_output") == 0) return sizeof(di_seq_output);
  if (strcmp(name, "di_step_output") == 0) return sizeof(di_step_output);
  if (strcmp(name, "di_engine_stats") == 0) return sizeof(di_engine_stats);
  if (strcmp(name, "di_model_options") == 0) return sizeof(di_model_options);
  if (strcmp(name, "di_token_logprob") == 0) return sizeof(di_token_logprob);
  return 0;
}
