/* Replays the tokenizer fuzz corpus (fuzz/corpus/tokenizer/) through the fuzz target itself, so
 * every crash the fuzzer once found stays fixed under the normal and sanitizer test runs. The
 * target aborts if a streamed decode ever differs from the full decode. The tokenizer_config.json
 * seeds (tokcfg_ok_* / tokcfg_bad_*) are also checked to load or to fail naming the file. */
#include <stdlib.h>
#include <string.h>
#include "../../fuzz/fuzz_tokenizer.c"
#include "test_util.h"
#include "util/json.h"

static void replay(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
  /* the tokenizer_config.json seeds (mode 3): the good ones load, the bad ones fail naming the file */
  int ok = strncmp(name, "tokcfg_ok", 9) == 0, bad = strncmp(name, "tokcfg_bad", 10) == 0;
  if ((ok || bad) && json0) {
    di_tokenizer *t = NULL;
    di_status st = di_tokenizer_load_mem(json0, strlen(json0), data + 1, n - 1, "fuzz", &t);
    CHECKF(ok ? st == DI_OK : st != DI_OK && strstr(di_last_error(), "tokenizer_config.json") != NULL, "%s: %s", rel,
           st == DI_OK ? "loaded" : di_last_error());
    di_tokenizer_free(t);
    (*(int *)ctx)++;
  }
}

int main(void) {
  int cfg_seeds = 0;
  int files = test_for_each_file("fuzz/corpus/tokenizer", replay, &cfg_seeds);
  fuzz_tokenizer_cleanup();
  CHECKF(files >= 10, "only %d corpus files", files);
  CHECKF(cfg_seeds >= 6, "only %d tokenizer_config.json seeds checked", cfg_seeds);
  return test_finish("test_tokenizer_fuzz_corpus");
}
