/* Glue between the public engine API and a loaded model: the tokenizer as the engine's text
 * adapter, and the grammar engine as its structured-output adapter. */
#ifndef DI_API_ENGINE_API_H
#define DI_API_ENGINE_API_H
#include "engine/engine_internal.h"

typedef struct di_engine_text_ctx {
  struct di_tokenizer *tok;
  int owns_tok;
  int model_vocab;
  int32_t eos[16];
  int n_eos;
  struct di_grammar_vocab *gvocab;
} di_engine_text_ctx;

void di_engine_constraint_ops(di_engine_text_ctx *c, di_constraint_ops *ops);
#endif
