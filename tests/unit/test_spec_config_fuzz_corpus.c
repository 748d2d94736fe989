/* Replays the --speculative-config fuzz corpus (fuzz/corpus/spec_config/) through the fuzz target
 * (which runs `generate --speculative-config <input> --output-format ?`: exit 2 before any model
 * load), so every input the fuzzer once found stays fixed under the normal and sanitizer runs; the
 * named seeds (ok_*, bad_*) must be read / refused by the config check itself. */
#include "../../fuzz/fuzz_spec_config.c"
#include "test_util.h"

static int named;

static void replay(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  (*(int *)ctx)++;
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
  /* named seeds (session 15: "profile"): ok_* read by the config's own check, bad_* refused */
  if (strncmp(name, "ok_", 3) == 0 || strncmp(name, "bad_", 4) == 0) {
    named++;
    di_status st = di_engine_set_speculative_config(NULL, NULL, data);
    if (name[0] == 'o')
      CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
    else
      CHECKF(st != DI_OK && di_last_error()[0], "%s was accepted", rel);
  }
}

int main(void) {
  int seen = 0;
  int files = test_for_each_file("fuzz/corpus/spec_config", replay, &seen);
  CHECKF(files >= 8 && seen == files, "only %d corpus files", files);
  CHECKF(named >= 4, "only %d named seeds", named);
  return test_finish("test_spec_config_fuzz_corpus");
}
