/* libFuzzer target: config.json parsing (both dialects) on arbitrary bytes: a config or an error. */
#include "model/config.h"
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  di_model_config c;
  (void)di_model_config_parse((const char *)data, size, NULL, 0, &c);
  return 0;
}
