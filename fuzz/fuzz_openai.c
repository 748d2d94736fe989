/* libFuzzer target: OpenAI request bodies (/v1/completions and /v1/chat/completions) read into
 * engine requests: any bytes must either be read or fail with an OpenAI error, never crash. The
 * tokenizer and chat template are engine-dummy's (the default model's), loaded once from the
 * source tree ($DI_SOURCE_DIR or the working directory); without them only token-id prompts read. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/openai.h"

static di_oai_ctx ctx;
static int ready;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) {
    static di_tokenizer *tok;
    static di_chat_template *tmpl;
    const char *root = getenv("DI_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/models/engine-dummy", root ? root : ".");
    if (di_tokenizer_load(dir, &tok) != DI_OK) tok = NULL;
    if (di_chat_template_load(dir, &tmpl) != DI_OK) tmpl = NULL;
    ctx.tok = tok;
    ctx.tmpl = tmpl;
    ctx.served_name = "m";
    ctx.max_model_len = 256;
    ctx.vocab_size = 8200;
    ctx.default_temperature = 0.7f;
    ctx.default_top_p = 0.95f;
    ctx.tool_parser = 1;
    ready = 1;
  }
  for (int chat = 0; chat < 2; chat++) {
    di_oai_request r;
    di_oai_error err;
    if (di_oai_parse_request(&ctx, chat, (const char *)data, size, &r, &err) == 0) {
      if (r.n_prompts < 1 || !r.params) __builtin_trap();
      di_oai_request_free(&r);
    } else {
      if (err.status < 400 || err.status > 599 || !err.message[0]) __builtin_trap();
      free(di_oai_error_json(&err));
    }
  }
  return 0;
}
