/* The CPU backend's row ops (RMSNorm, the SiLU-gated product, RoPE, the MoE router) and its runner of the op test table
 * (backend/op_table.h): each case computed with the kernels the forward pass uses (di_cpu_gemm for
 * every weight format, these row ops). */
#ifndef DI_CPU_OPS_H
#define DI_CPU_OPS_H
#include <stdint.h>
#include "backend/op_table.h"
#include "model/config.h"
#include "util/threadpool.h"

/* out = x / sqrt(mean(x^2) + eps) * w over n floats, in float32 as transformers (out may be x) */
void di_cpu_rmsnorm_row(float *out, const float *x, const float *w, int n, float eps);
/* g[i] = silu(g[i]) * u[i] for n floats */
void di_cpu_silu_mul(float *g, const float *u, int64_t n);
/* RoPE: cs[2i], cs[2i+1] = {cos, sin}(float(pos) * inv_freq[i]) * attn_factor for i < half (float32,
 * as torch); di_cpu_rope_apply rotates the 2 * half values of x in place: pairs (2i, 2i + 1) when
 * interleave (DeepSeek checkpoints), else (i, i + half). */
void di_cpu_rope_cos_sin(int pos, const float *inv_freq, int half, float attn_factor, float *cs);
void di_cpu_rope_apply(float *x, const float *cs, int half, int interleave);
/* The MoE router of one token: picks c->num_experts_per_tok experts of c->n_routed_experts from their
 * logits (softmax or sigmoid scores; noaux_tc adds `bias` (may be NULL) to choose; group-limited
 * methods keep topk_group of n_group groups; ties to the lower index), ids in choice order, and
 * their weights (renormalized and scaled as c says). */
void di_cpu_route(const di_model_config *c, const float *bias, const float *logits, int32_t *ids, float *wts);
/* di_op_runner of the CPU backend; ctx is a di_threadpool (may be NULL: one thread). */
di_status di_cpu_op_run(void *ctx, const di_op_data *d, float *out);
#endif
