/* The DeepSeek-V4 fixture's golden prompts (tests/data/models/dsv4-tiny/golden.safetensors, written by
 * ../shared/tools/make_fixtures_v4.py): for prompt p, its ids [T], transformers' logits [T][V], the
 * greedy continuation [G] and its margins [G]. Shared by the reference and cached-forward tests. */
#ifndef DI_TEST_V4_GOLDEN_H
#define DI_TEST_V4_GOLDEN_H
#include "model/safetensors.h"
#include "test_util.h"
#include <stdio.h>

/* The four tensors of prompt p; 0 (a failed check) when one is missing. */
static int v4_golden_prompt(const di_st_file *g, int p, const di_st_tensor **ids, const di_st_tensor **logits,
                            const di_st_tensor **greedy, const di_st_tensor **margin) {
  static const char *const what[4] = {"ids", "logits", "greedy", "margin"};
  const di_st_tensor **out[4] = {ids, logits, greedy, margin};
  int ok = 1;
  for (int i = 0; i < 4; i++) {
    char k[32];
    snprintf(k, sizeof k, "p%d.%s", p, what[i]);
    *out[i] = di_st_file_find(g, k);
    ok &= *out[i] != NULL;
  }
  CHECKF(ok, "golden prompt p%d: a tensor is missing", p);
  return ok;
}

/* Logits under DeepInfer's fixed indexer tie rule (got) against transformers' golden ones (want),
 * [T][V] each. The two agree until the first query where the rule decided a tie at the top-k
 * boundary (first_tie, -1: none; torch.topk may keep another of the tied entries there, see
 * cpu_deepseek_v4.h): every position before it must match (rel L2 < 1e-5); from it on they may
 * differ, and the worst difference is only reported. Returns the worst error before first_tie. */
static inline double v4_check_golden_until_tie(const char *name, const float *got, const float *want, int T, int V, int first_tie) {
  const int until = first_tie < 0 || first_tie > T ? T : first_tie;
  double before = 0, after = 0;
  for (int t = 0; t < T; t++) {
    double e = test_rel_l2(got + (size_t)t * V, want + (size_t)t * V, (size_t)V);
    if (t < until)
      before = e > before ? e : before;
    else
      after = e > after ? e : after;
  }
  CHECKF(before < 1e-5, "%s: positions before the first indexer tie (%d) differ from the golden by rel L2 %.3e", name, until,
         before);
  printf("%s: fixed tie rule vs golden: positions 0..%d (before the first top-k boundary tie) worst rel L2 %.2e", name,
         until - 1, before);
  if (until < T)
    printf("; from position %d (tie decided earlier-first, torch kept another) worst %.2e\n", until, after);
  else
    printf("; no tie at the top-k boundary\n");
  return before;
}
#endif
