/* Replays the DSpark drafter config fuzz corpus (fuzz/corpus/dspark_config/) through the fuzz target
 * (di_dspark_read_config against a fixed target; the target traps on a shape outside the reader's
 * bounds), so every input the fuzzer once found stays fixed; the seeds it knows are checked: the
 * ok_* configs are read, each bad_* one is refused. */
#include "../../fuzz/fuzz_dspark_config.c"
#include "test_util.h"

typedef struct { int files, ok, bad; } replay_ctx;

static void replay(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  (void)rel;
  replay_ctx *c = ctx;
  c->files++;
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
  if (strncmp(name, "ok_", 3) == 0) {
    c->ok++;
    CHECKF(fuzz_dspark_accepted, "%s refused: %s", name, di_last_error());
  } else if (strncmp(name, "bad_", 4) == 0) {
    c->bad++;
    CHECKF(!fuzz_dspark_accepted, "%s was accepted", name);
  }
}

int main(void) {
  replay_ctx c = {0, 0, 0};
  int files = test_for_each_file("fuzz/corpus/dspark_config", replay, &c);
  CHECKF(files >= 14 && c.files == files && c.ok >= 2 && c.bad >= 12, "%d corpus files (%d ok_, %d bad_)", files, c.ok, c.bad);
  return test_finish("test_dspark_config_fuzz_corpus");
}
