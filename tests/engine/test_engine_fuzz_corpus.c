/* Replays fuzz/corpus/engine (inputs of fuzz/fuzz_engine.c) through the same fuzz case, plus a few
 * hundred pseudo-random inputs, so CI exercises the engine state machine the fuzzer explored. */
#include "test_util.h"
#include "engine_fuzz_body.h"
#include "sampler/rng.h"
#include "util/json.h"
#include <stdlib.h>

static void replay(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  int bad = engine_fuzz_one((const uint8_t *)buf, len);
  CHECKF(bad == 0, "%s: %d violations", rel, bad);
}

int main(void) {
  int n = test_for_each_file("fuzz/corpus/engine", replay, NULL);
  CHECKF(n >= 10, "only %d corpus files", n);
  uint8_t in[256];
  for (int c = 0; c < 300; c++) {
    size_t len = 8 + di_rng_u64(3, 1, (uint64_t)c) % 248;
    for (size_t i = 0; i < len; i++) in[i] = (uint8_t)di_rng_u64(3, 2, (uint64_t)c * 1000 + i);
    int bad = engine_fuzz_one(in, len);
    CHECKF(bad == 0, "random case %d: %d violations", c, bad);
  }
  CHECKF(fz_compared > 300, "only %ld samples compared with their reference", fz_compared);
  CHECKF(fz_plp_checked > 30 && fz_scored > 10, "only %ld prompt-logprob outputs checked, %ld score-only requests",
         fz_plp_checked, fz_scored);
  CHECKF(fz_fb_tokens > 20, "only %ld tokens went through device token feedback", fz_fb_tokens);
  /* the budgets of engine_fuzz_body.h must keep these paths: prompts longer than the smallest pool, and
   * preemption of running requests on small pools (1,118 and 325 in session 12; with the budgets
   * halved, 515 and 71, and less coverage: why they stay) */
  CHECKF(fz_long_prompts > 600 && fz_preemptions > 150, "only %ld prompts over 192 tokens, %ld preemptions",
         fz_long_prompts, fz_preemptions);
  fprintf(stderr, "%ld samples equal to their reference, %ld prompt-logprob outputs, %ld score-only requests, "
          "%ld tokens fed back on the device, %ld prompts over 192 tokens, %ld preemptions\n", fz_compared,
          fz_plp_checked, fz_scored, fz_fb_tokens, fz_long_prompts, fz_preemptions);
  return test_finish("test_engine_fuzz_corpus");
}
