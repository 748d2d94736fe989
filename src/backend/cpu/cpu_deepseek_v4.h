/* DeepSeek-V4 float32 reference forward pass on the CPU over a whole token sequence (no KV cache):
 * the ground truth later cached / engine / CUDA implementations are tested against. Checked against
 * transformers 5.17's DeepseekV4ForCausalLM by tests/model/test_v4_reference.c. */
#ifndef DI_BACKEND_CPU_DEEPSEEK_V4_H
#define DI_BACKEND_CPU_DEEPSEEK_V4_H
#include <stdint.h>
#include "arch/deepseek_v4.h"

/* Logits of every position: logits_out is [n][vocab_size]. Token ids outside the vocabulary are an
 * error; so is n < 1. Single-threaded; reductions in double. */
di_status di_cpu_v4_forward_full(const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                                 float *logits_out);

/* The CSA indexer keeps the index_topk best-scored compressed entries of a query. Exact score ties
 * are frequent (a score is exactly 0 when relu zeroes every index head). DeepInfer breaks them by a
 * fixed rule: among equal scores the EARLIER entry is kept. Then a query's picks depend on the
 * scores alone, and the logits are the same however a prompt is cut into forward calls (chunked
 * prefill, token-by-token decode, a prefix-cache hit): forward_full is the oracle of the cached
 * forward (cpu_deepseek_v4_cache.h) under any chunking.
 * Where this differs from transformers: torch.topk ranks every entry that exists when the chunk runs
 * (the incomplete ones at -inf) and keeps whichever tied entries its CPU selection (a heap select
 * when k*64 <= n, else an introselect) leaves in front, so its pick depends on the number of entries
 * and therefore on the chunking (per-position rel L2 up to 0.41 on dsv4-tiny between chunkings).
 * Both agree wherever the k-th and (k+1)-th best scores of a query differ. */
typedef struct di_v4_ref_options {
  int torch_ties;        /* 1: break the indexer's ties as torch.topk does in transformers' run */
  const int *chunk_end;  /* with torch_ties: position t ran in the chunk ending (exclusive) at chunk_end[t]
                          * (non-decreasing, t < chunk_end[t] <= n); NULL: one chunk */
  int boundary_ties;     /* out (fixed rule): queries whose k-th and (k+1)-th best scores were equal */
  int first_tie_pos;     /* out: the position of the first such query, -1 if none */
} di_v4_ref_options;

/* forward_full with options (NULL: the fixed rule, as forward_full). torch_ties reproduces
 * transformers' choices in the indexer (the goldens' test oracle). logits_out may be NULL (only the
 * tie report is wanted). */
di_status di_cpu_v4_forward_with(const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                                 di_v4_ref_options *opt, float *logits_out);

#endif
