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
#endif
