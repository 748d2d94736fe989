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

/* The same forward as a cached run that fed the tokens in chunks would compute it: position t
 * belongs to the chunk ending (exclusive) at chunk_end[t] (non-decreasing, t < chunk_end[t] <= n).
 * The only difference a chunking makes is in the CSA indexer's top-k: torch ranks every compressed
 * entry that exists when the chunk runs (chunk_end[t]/rate of them, the not-yet-complete ones for
 * query t at -inf), and which of several exactly tied scores it keeps depends on that count. So
 * position t's logits equal forward_full over tokens[0..chunk_end[t]) at t. chunk_end NULL: all n
 * (forward_full). The oracle of the cached forward (cpu_deepseek_v4_cache.h). */
di_status di_cpu_v4_forward_chunked(const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                                    const int *chunk_end, float *logits_out);

#endif
