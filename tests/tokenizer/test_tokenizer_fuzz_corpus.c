/* Replays the tokenizer fuzz corpus (fuzz/corpus/tokenizer/) through the fuzz target itself, so
 * every crash the fuzzer once found stays fixed under the normal and sanitizer test runs. The
 * target aborts if a streamed decode ever differs from the full decode. */
#include <stdlib.h>
#include <string.h>
#include "../../fuzz/fuzz_tokenizer.c"
#include "test_util.h"
#include "util/json.h"

static void replay(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
}

int main(void) {
  int files = test_for_each_file("fuzz/corpus/tokenizer", replay, NULL);
  fuzz_tokenizer_cleanup();
  CHECKF(files >= 10, "only %d corpus files", files);
  return test_finish("test_tokenizer_fuzz_corpus");
}
