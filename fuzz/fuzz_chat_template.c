/* libFuzzer target: the chat-template lexer, parser and evaluator. The input is a template; it is
 * rendered against a fixed conversation with tool calls, under small memory, output and step
 * limits, so any input must either render or fail with an error, never crash or hang. */
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
  jj_template *t;
  if (jj_parse((const char *)data, size, &t) != DI_OK) return 0;
  jj_render_limits lim = {16 << 20, 1 << 20, 200000};
  char *out = NULL;
  size_t len;
  if (jj_render(t, vars, &lim, &out, &len) == DI_OK) free(out);
  jj_template_free(t);
  return 0;
}
