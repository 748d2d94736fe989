/* libFuzzer target: config.json parsing (both dialects) on arbitrary bytes: a config or an error.
 * Bytes after a line "#generation_config.json" are the model folder's generation_config.json, read
 * with the config (its sampling defaults and EOS ids); inputs without the line are config.json alone,
 * as the corpus had them before generation_config.json was read here. */
#include "model/config.h"
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as the two files (tests/model/test_fuzz_corpus.c replays through it). */
static di_status fuzz_config_parse(const char *text, size_t size, di_model_config *c) {
  static const char mark[] = "\n#generation_config.json\n";
  const char *gen = memmem(text, size, mark, sizeof mark - 1);
  size_t len = gen ? (size_t)(gen - text) : size;
  const char *gen_json = gen ? gen + sizeof mark - 1 : NULL;
  return di_model_config_parse(text, len, gen_json, gen ? size - len - (sizeof mark - 1) : 0, c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  di_model_config c;
  (void)fuzz_config_parse((const char *)data, size, &c);
  return 0;
}
