/* Replays the DSpark drafter config fuzz corpus (fuzz/corpus/dspark_config/) through the fuzz target
 * (di_dspark_read_config against a fixed target; the target traps on a shape outside the reader's
 * bounds), so every input the fuzzer once found stays fixed; the seeds it knows are checked: the
 * ok_* configs are read, each bad_* one is refused. */
#include "../../fuzz/fuzz_dspark_config.c"
#include "test_util.h"

int main(void) {
  int ok, bad;
  const int files = test_replay_ok_bad("fuzz/corpus/dspark_config", LLVMFuzzerTestOneInput, &fuzz_dspark_accepted, &ok, &bad);
  CHECKF(files >= 14 && ok >= 2 && bad >= 12, "%d corpus files (%d ok_, %d bad_)", files, ok, bad);
  return test_finish("test_dspark_config_fuzz_corpus");
}
