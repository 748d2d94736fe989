/* libFuzzer target: the DeepSeek-V4 config.json parser (src/arch/deepseek_v4_config.c). Any input
 * must either parse into a config whose values the forward can trust or fail with a message. */
#include <stdint.h>
#include <stdlib.h>
#include "arch/deepseek_v4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  di_v4_config c;
  if (di_v4_config_parse((const char *)data, size, &c) == DI_OK) {
    /* invariants the forward relies on */
    if (c.n_layers < 1 || c.n_layers > DI_V4_MAX_LAYERS || c.top_k > c.n_routed_experts || c.rope_main.dim < 2 ||
        c.rope_main.dim > c.head_dim || c.rope_compress.dim > c.head_dim || ((int64_t)c.n_heads * c.head_dim) % c.o_groups)
      abort();
  } else if (!di_last_error()[0]) {
    abort();
  }
  return 0;
}
