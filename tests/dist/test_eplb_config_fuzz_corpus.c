/* Replays the --eplb-config fuzz corpus (fuzz/corpus/eplb_config/) through the fuzz target (it traps
 * on settings outside the parser's bounds or a refusal without a message), so every input the fuzzer
 * once found stays fixed; the seeds it knows are checked: ok_* are read, each bad_* is refused. The
 * bad_huge* seeds are the target's first finding (1e300 cast to long long before the range check:
 * undefined behaviour, which the ASan/UBSan run of this test reports). */
#include "../../fuzz/fuzz_eplb_config.c"
#include "test_util.h"

typedef struct { int files, ok, bad; } replay_ctx;

static void replay(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  (void)rel;
  replay_ctx *c = ctx;
  c->files++;
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
  if (strncmp(name, "ok_", 3) == 0) {
    c->ok++;
    CHECKF(fuzz_eplb_accepted, "%s refused", name);
  } else if (strncmp(name, "bad_", 4) == 0) {
    c->bad++;
    CHECKF(!fuzz_eplb_accepted, "%s was accepted", name);
  }
}

int main(void) {
  replay_ctx c = {0, 0, 0};
  int files = test_for_each_file("fuzz/corpus/eplb_config", replay, &c);
  CHECKF(files >= 14 && c.files == files && c.ok >= 4 && c.bad >= 10, "%d corpus files (%d ok_, %d bad_)", files, c.ok,
         c.bad);
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
