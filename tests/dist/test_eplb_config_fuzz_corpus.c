/* Replays the --eplb-config fuzz corpus (fuzz/corpus/eplb_config/) through the fuzz target (it traps
 * on settings outside the parser's bounds or a refusal without a message), so every input the fuzzer
 * once found stays fixed; the seeds it knows are checked: ok_* are read, each bad_* is refused. The
 * bad_huge* seeds are the target's first finding (1e300 cast to long long before the range check:
 * undefined behaviour, which the ASan/UBSan run of this test reports). */
#include "../../fuzz/fuzz_eplb_config.c"
#include "test_util.h"

int main(void) {
  int ok, bad;
  const int files = test_replay_ok_bad("fuzz/corpus/eplb_config", LLVMFuzzerTestOneInput, &fuzz_eplb_accepted, &ok, &bad);
  CHECKF(files >= 14 && ok >= 4 && bad >= 10, "%d corpus files (%d ok_, %d bad_)", files, ok, bad);
  /* what the parser writes, and its message for a value out of range */
  di_ep_config cfg = {0, 9, 9, 9};
  char err[256] = "";
  CHECK(di_dist_parse_eplb_config("{\"window_size\": 3, \"step_interval\": 1000000}", &cfg, err, sizeof err) == 0);
  CHECK(cfg.num_redundant_experts == 9 && cfg.window_size == 3 && cfg.step_interval == 1000000);
  CHECK(di_dist_parse_eplb_config("{\"num_redundant_experts\": 1e300}", &cfg, err, sizeof err) != 0);
  CHECKF(strstr(err, "\"num_redundant_experts\" must be an integer in [0, 1000000]") != NULL, "message: %s", err);
  CHECK(cfg.num_redundant_experts == 9);
  return test_finish("test_eplb_config_fuzz_corpus");
}
