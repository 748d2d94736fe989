/* Replays the Responses API fuzz corpus (fuzz/corpus/responses/) through the fuzz target itself, so
 * every input the fuzzer once found stays fixed under the normal and sanitizer test runs; the target
 * traps on an error without a status and message, or a translated body it cannot take again. */
#include <stdlib.h>
#include "../../fuzz/fuzz_responses.c"
#include "test_util.h"

static void replay(const char *name, const char *rel, const char *data, size_t n, void *count) {
  (void)name;
  (void)rel;
  (*(int *)count)++;
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
}

int main(void) {
  char root[4096];
  snprintf(root, sizeof root, "%s", test_path(""));
  setenv("DI_SOURCE_DIR", root, 1); /* the target's tokenizer and template: engine-dummy's */
  int seen = 0;
  int files = test_for_each_file("fuzz/corpus/responses", replay, &seen);
  CHECKF(files >= 10 && seen == files, "only %d corpus files", files);
  CHECKF(ctx.tok && ctx.tmpl, "the engine-dummy tokenizer and template did not load");
  fuzz_responses_cleanup();
  return test_finish("test_responses_fuzz_corpus");
}
