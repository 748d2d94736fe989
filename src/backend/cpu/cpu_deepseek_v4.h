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

/* The same forward as a cached run that fed the tokens in chunks computes it: position t belongs to
 * the chunk ending (exclusive) at chunk_end[t] (non-decreasing, t < chunk_end[t] <= n). The only
 * difference a chunking makes is in the CSA indexer's top-k: transformers (with its cache) ranks every
 * compressed entry that exists when the chunk runs (chunk_end[t]/rate of them, those not complete for
 * query t at -inf), and which of several exactly tied scores torch.topk keeps depends on that count;
 * ties are frequent (a score is exactly 0 when relu zeroes every index head), and a different pick
 * changes that position's hidden state and, through the window and the compressed entries, later
 * ones. So the logits depend on the chunking, as transformers' do (tests/model/test_v4_cached.c checks
 * this against transformers run chunk by chunk). chunk_end NULL: one chunk (forward_full). The oracle
 * of the cached forward (cpu_deepseek_v4_cache.h). */
di_status di_cpu_v4_forward_chunked(const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                                    const int *chunk_end, float *logits_out);

#endif
