/* The CPU backend's row ops (RMSNorm, the SiLU-gated product) and its runner of the op test table
 * (backend/op_table.h): each case computed with the kernels the forward pass uses (di_cpu_gemm for
 * every weight format, these row ops). */
#ifndef DI_CPU_OPS_H
#define DI_CPU_OPS_H
#include <stdint.h>
#include "backend/op_table.h"
#include "util/threadpool.h"

/* out = x / sqrt(mean(x^2) + eps) * w over n floats, in float32 as transformers (out may be x) */
void di_cpu_rmsnorm_row(float *out, const float *x, const float *w, int n, float eps);
/* g[i] = silu(g[i]) * u[i] for n floats */
void di_cpu_silu_mul(float *g, const float *u, int64_t n);
/* di_op_runner of the CPU backend; ctx is a di_threadpool (may be NULL: one thread). */
di_status di_cpu_op_run(void *ctx, const di_op_data *d, float *out);
#endif
