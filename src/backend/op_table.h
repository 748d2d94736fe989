/* One table of op test cases run against every backend, in the manner of ggml's test-backend-ops: a
 * row is an op, its shapes, the weight format for products, and a normalized error bound (relative L2
 * against a float64 reference) for backends that compute in f32 and for those that round operands to
 * bf16. The float64 references live here beside the table (op_table.c), not inside a test; each backend
 * offers a runner (di_op_runner) that computes a case with its own kernels: the CPU one in
 * backend/cpu/cpu_ops.c, the CUDA one in backend/cuda/cuda_ops.cu. tests/unit/test_backend_ops.c runs
 * the table on the CPU in CI, tests/cuda/test_cuda_ops.c on the GPU. A new kernel gets its test by
 * adding rows here and a case to each runner (a runner answers DI_ERR_UNSUPPORTED for an op it lacks,
 * reported as such, never as passed). */
#ifndef DI_OP_TABLE_H
#define DI_OP_TABLE_H
#include <stdint.h>
#include <stdio.h>
#include "arch/deepseek_v4.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/status.h"

typedef enum {
  DI_OP_GEMM,     /* y[m][n] = sum_k x[m][k] * W[n][k]; W in the row's weight format */
  DI_OP_RMSNORM,  /* y[m][:] = x[m][:] / sqrt(mean(x[m]^2) + eps) * w, n columns */
  DI_OP_SILU_MUL, /* y[m][i] = silu(x[m][i]) * x[m][n + i], x [m][2n] (gate | up) */
  /* RoPE of m tokens' n values (n/2 pairs) at random positions below p[2]: y = rotate(x, pos *
   * inv_freq) * attention factor. p[0]: interleaved pairs (2i, 2i+1) (V2/V3 checkpoints) else halves
   * (i, i + n/2); p[1]: YaRN (factor 40, beta 32 / 1, original 4096 positions, mscale 1 / 0: the
   * attention factor 0.1 ln 40 + 1), else theta 10000 plain. The reference forms inv_freq and the
   * angle in float64 from the formula; a float32 angle (the CPU's, as torch) is off by up to half an
   * ulp of pos * inv_freq, hence the bound. */
  DI_OP_ROPE,
  /* The MoE router of m tokens over n experts (f32 logits x [m][n]): top p[0] experts; p[3] = 0:
   * sigmoid scores, noaux_tc (choice = score + bias, groups by the sum of their top 2), p[1] groups
   * keeping p[2], renormalized and scaled by 2.5 (V3); 1: softmax, greedy, scaled by 1 (V2-Lite); 2:
   * softmax, group_limited_greedy (groups by their max), scaled by 16, not renormalized (V2). Output
   * [m][p[0]] expert ids (exact, in choice order) then [m][p[0]] weights. Inputs are redrawn until
   * every decision of the float64 reference has a margin of 1e-4 (no near ties). */
  DI_OP_ROUTER,
  /* Grouped expert GEMM: y[i][:] = x[i] . W[e(i)]^T, x [m][k], W bf16 [p[0] experts][n][k], rows
   * skewed over the experts (half of them to expert 1, a few experts none, the rest random). */
  DI_OP_GROUPED_GEMM,
  /* Embedding gather: y[i][:] = float(table[tok[i]][:]), table bf16 [p[0]][n]; exact. */
  DI_OP_EMBED,
  /* Greedy sampling: y[i] = the index of row i's largest logit (x [m][n]), the lowest one on ties
   * (p[0]: rows with a planted tie at the maximum); exact. */
  DI_OP_ARGMAX,
  /* MLA attention, absorbed form, over a paged latent cache (64-row blocks, tables in reverse order):
   * m query tokens, n heads, nope = v head dim p[2], rope dim p[1], kv_lora_rank p[0]. p[3] = 1:
   * prefill, one sequence of k cached rows whose last m are the queries (causal: query i sees rows
   * [0, k - m + i]); p[3] = m: decode, m sequences of k - 37 i rows, one query at each's last row.
   * x = q [m][n][nope | rope] (q_pe unroped: rotated at its position, plain RoPE theta 10000,
   * interleaved), kv [sequences][k][rank | rope] (the cache rows: normalized latent, roped key), W_UK
   * [n][rank][nope], W_UV [n][v][rank]; y [m][n][v] = W_UV . softmax((W_UK^T q_nope) . c + q_pe .
   * k_pe) / sqrt(nope + rope)) . c. */
  DI_OP_MLA_ATTN,
  /* DeepSeek-V4's ops (the CPU's; no CUDA kernels yet: the CUDA runner answers unsupported) */
  /* mHC mixing weights of m tokens: n = hidden size, p[0] = hc streams, p[1] = Sinkhorn iterations;
   * x = X [m][hc][n], fnw [(2 + hc) hc][hc n], base [(2 + hc) hc], scale [3]; y [m][pre hc | post hc |
   * comb hc x hc] (softmax rows + eps, then column / row normalizations in transformers' order). */
  DI_OP_V4_HC,
  /* V4's router: n experts, top p[0] of sqrt(softplus(logit)) + bias (p[1] = 1: hash routing, the
   * experts given per token, one repeated), weights normalized to 1 and scaled by 1.5; y [m][n], zero
   * where not chosen. Inputs redrawn until the reference's top-k has a 1e-4 margin. */
  DI_OP_V4_ROUTE,
  /* The indexer's top-k: the p[0] best of n scores per row, equal scores by the earlier index
   * (scores on a grid of 1/4: many ties); y [m][n] flags, exact. */
  DI_OP_V4_TOPK,
  DI_OP_COUNT
} di_op_kind;

typedef struct di_op_case {
  di_op_kind op;
  const char *label;
  int m, n, k;              /* GEMM: x [m][k], W [n][k]; the others: m rows of n */
  di_dtype wtype;           /* GEMM's weight format: BF16, F32, F8E4M3 or F4E2M1 */
  int block_rows, block_cols, e8m0; /* FP8 block shape and scale type (MXFP4: 1 x 32, E8M0) */
  double tol_f32, tol_bf16; /* relative L2 bounds: f32 arithmetic / bf16 operands */
  int p[4];                 /* the op's own parameters (see the op) */
} di_op_case;

#define DI_OP_MAX_ROPE 128 /* rope dims of the ROPE rows, at most */
extern const di_op_case di_op_cases[];
extern const int di_n_op_cases;

/* A case's inputs (random, from a seed) and its float64 reference. */
typedef struct di_op_data {
  const di_op_case *c;
  float *x;      /* GEMM [m][k]; RMSNORM [m][n]; SILU_MUL [m][2n] */
  float *nw;     /* RMSNORM's weight [n] */
  float eps;
  di_weight w;   /* GEMM's weight, as a checkpoint would store it */
  void *wdata, *wscales;
  double *ref;   /* [n_out] */
  int64_t n_out; /* m * n, or what the op writes */
  int64_t n_exact; /* outputs [0, n_exact) must equal the reference exactly (ids, gathered values) */
  int32_t *ids;  /* ROPE: positions [m]; EMBED: tokens [m]; GROUPED_GEMM: each row's expert [m] */
  float *bias;   /* ROUTER: the noaux_tc correction bias [n] */
  float *inv_freq; /* ROPE: the model's float32 inverse frequencies (di_rope_inv_freq) [n/2] */
  di_model_config cfg; /* ROPE, ROUTER, MLA_ATTN: the configuration fields the op reads */
  float *kv, *w_uk, *w_uv; /* MLA_ATTN: cache rows [seqs][k][rank + rope], W_UK, W_UV (see the op) */
  int n_seqs;            /* MLA_ATTN */
  di_v4_config v4;       /* V4_*: the configuration fields the op reads */
  float *aux;            /* V4_HC: fnw, then base and scale */
  int32_t *hash_ids;     /* V4_ROUTE with hash routing: [m][top-k] */
} di_op_data;

di_status di_op_data_make(const di_op_case *c, uint64_t seed, di_op_data *d);
void di_op_data_free(di_op_data *d);

/* The float64 references (inputs as stored: weights dequantized exactly, f32 activations). */
void di_op_ref_gemm(const float *x, int m, int k, const di_weight *w, double *y);
void di_op_ref_rmsnorm(const float *x, int m, int n, const float *w, double eps, double *y);
void di_op_ref_silu_mul(const float *x, int m, int n, double *y);
void di_op_ref_rope(const float *x, int m, int n, const int32_t *pos, const di_model_config *c, double *y);
/* returns the smallest margin of any decision (top-k, groups) */
double di_op_ref_route(const float *logits, const float *bias, const di_model_config *c, int32_t *ids, double *w);
void di_op_ref_grouped_gemm(const float *x, int m, int k, const int32_t *expert, const di_weight *w, int n, double *y);
void di_op_ref_argmax(const float *x, int m, int n, double *y);
void di_op_ref_mla_attn(const di_op_data *d, double *y);
void di_op_ref_v4_hc(const di_op_data *d, double *y);
/* returns the top-k's margin (hash routing: infinity) */
double di_op_ref_v4_route(const di_v4_config *c, const float *logits, const float *bias, const int32_t *hash_ids, double *y);
void di_op_ref_v4_topk(const float *x, int m, int n, int k, double *y);
/* MLA_ATTN: query i's sequence and position */
void di_op_mla_query(const di_op_case *c, int i, int *seq, int *pos);

/* A backend's runner: computes d's case into out (d->n_out floats); DI_ERR_UNSUPPORTED for an op or
 * format the backend lacks. */
typedef di_status (*di_op_runner)(void *ctx, const di_op_data *d, float *out);

typedef struct di_op_report {
  int run, passed, failed, unsupported;
} di_op_report;

/* Runs every row of the table through `run` (bf16_operands: the bound is the row's tol_bf16, else
 * tol_f32), printing a line per row to log (may be NULL). */
di_op_report di_op_check(const char *backend, di_op_runner run, void *ctx, int bf16_operands, uint64_t seed,
                         FILE *log);
#endif
