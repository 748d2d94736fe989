/* libFuzzer target: the engine's request lifecycle and scheduler on the mock backend (see
 * tests/engine/engine_fuzz_body.h). A violated invariant aborts, which the fuzzer reports. */
#include <stdint.h>
#include <stdlib.h>
#include "../tests/engine/engine_fuzz_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (engine_fuzz_one(data, size) != 0) abort();
  return 0;
}
