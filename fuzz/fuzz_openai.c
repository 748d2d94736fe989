/* libFuzzer target: OpenAI request bodies (/v1/completions and /v1/chat/completions) read into
 * engine requests: any bytes must either be read or fail with an OpenAI error, never crash. The
 * tokenizer and chat template are engine-dummy's, loaded once (oai_fuzz_ctx.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "oai_fuzz_ctx.h"

static di_oai_ctx ctx;
static int ready;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) {
    static di_tokenizer *tok;
    static di_chat_template *tmpl;
    oai_fuzz_ctx_init(&ctx, &tok, &tmpl);
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
