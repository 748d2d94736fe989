/* Replays the --speculative-config fuzz corpus (fuzz/corpus/spec_config/) through the fuzz target
 * (which runs `generate --speculative-config <input> --output-format ?`: exit 2 before any model
 * load), so every input the fuzzer once found stays fixed under the normal and sanitizer runs. */
#include "../../fuzz/fuzz_spec_config.c"
#include "test_util.h"

static void replay(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  (void)name;
  (void)rel;
  (*(int *)ctx)++;
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
}

int main(void) {
  int seen = 0;
  int files = test_for_each_file("fuzz/corpus/spec_config", replay, &seen);
  CHECKF(files >= 8 && seen == files, "only %d corpus files", files);
  return test_finish("test_spec_config_fuzz_corpus");
}
