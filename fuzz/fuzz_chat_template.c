/* libFuzzer target: the chat-template lexer, parser and evaluator, and the conversation JSON
 * reader. The input is a template, optionally followed by a NUL byte and a conversation (JSON
 * text, as `deepinfer chat-template --messages` reads it). Without one, the template renders
 * against a fixed conversation with tool calls. Small memory, output and step limits: any input
 * must either render or fail with an error, never crash or hang. The fixed conversation is parsed
 * once (LLVMFuzzerInitialize). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "chat/jinja.h"

static cJSON *vars;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!vars)
    vars = cJSON_Parse(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"hi \\u00e9\"},"
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
        "{\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]}, {\"role\": \"tool\", \"content\": \"1\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"bos_token\": \"<s>\","
        "\"eos_token\": \"</s>\", \"add_generation_prompt\": true}");
  const uint8_t *nul = memchr(data, 0, size);
  size_t tlen = nul ? (size_t)(nul - data) : size;
  jj_template *t;
  if (jj_parse((const char *)data, tlen, &t) != DI_OK) return 0;
  /* limits small enough that a loop that runs to one costs about a millisecond (at 200,000 steps and
   * 16 MiB a few such inputs held the target near 100 runs a second); reaching one is still an error
   * path the fuzzer covers */
  jj_render_options lim = {.max_memory = 4 << 20, .max_output = 256 << 10, .max_steps = 20000};
  char *out = NULL;
  size_t len;
  if (!nul) {
    if (jj_render(t, vars, &lim, &out, &len) == DI_OK) free(out);
  } else {
    jj_vars v;
    if (jj_vars_init(&v) == DI_OK) {
      jv conv;
      size_t clen = size - tlen - 1;
      if (jj_json_parse(&v.arena, (const char *)nul + 1, clen, "conversation", &conv) == DI_OK &&
          jj_vars_set(&v, "messages", conv) == DI_OK && jj_render_vars(t, &v, &lim, &out, &len) == DI_OK)
        free(out);
    }
    jj_vars_free(&v);
  }
  jj_template_free(t);
  return 0;
}
