/* The OpenAI reader context the server-side fuzz targets share (fuzz_openai.c, fuzz_responses.c):
 * engine-dummy's tokenizer and chat template, loaded once from $DI_SOURCE_DIR (or the working
 * directory; without them only token-id prompts read), and the default model's limits. */
#ifndef DI_FUZZ_OAI_FUZZ_CTX_H
#define DI_FUZZ_OAI_FUZZ_CTX_H
#include <stdio.h>
#include <stdlib.h>
#include "server/openai.h"

static void oai_fuzz_ctx_init(di_oai_ctx *ctx, di_tokenizer **tok, di_chat_template **tmpl) {
  const char *root = getenv("DI_SOURCE_DIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/tests/data/models/engine-dummy", root ? root : ".");
  if (di_tokenizer_load(dir, tok) != DI_OK) *tok = NULL;
  if (di_chat_template_load(dir, tmpl) != DI_OK) *tmpl = NULL;
  ctx->tok = *tok;
  ctx->tmpl = *tmpl;
  ctx->served_name = "m";
  ctx->max_model_len = 256;
  ctx->vocab_size = 8200;
  ctx->default_temperature = 0.7f;
  ctx->default_top_p = 0.95f;
  ctx->tool_parser = 1;
}
#endif
