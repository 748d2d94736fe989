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

#endif
