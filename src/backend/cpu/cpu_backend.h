/* The CPU backend: weights used in place (memory-mapped checkpoint), a float32 paged latent KV pool,
 * grow-only scratch buffers sized by the largest step seen, and a thread pool. */
#ifndef DI_CPU_BACKEND_H
#define DI_CPU_BACKEND_H

#define DI_CPU_ATTN_GROUP 8 /* heads of a token that share one pass over its keys (prefill) */
#include "backend/backend.h"
#include "arch/deepseek.h"
#include "util/threadpool.h"

typedef struct di_cpu_backend {
  di_backend base;
  const di_model_config *cfg;
  const di_ds_weights *w;
  di_threadpool *tp;
  float inv_freq[256];
  /* absorbed MLA matrices, float32: W_UK^T [layer][head][kv_lora][nope], W_UV [layer][head][v][kv_lora] */
  float **w_uk, **w_uv;
  /* KV pool: [block][cache layer][slot][kv_stride floats]; an entry is [c_kv | k_pe] in f32 (kv_stride =
   * kv_dim = kv_lora_rank + qk_rope_head_dim), or with --kv-cache-dtype fp8 (kv_fp8) [one f32 scale per
   * 128 latent channels | c_kv in E4M3 | k_pe in bf16] in kv_stride 4-byte words (cpu_deepseek.c) */
  float *kv_pool;
  int64_t n_blocks;
  int n_cache_layers, kv_dim, kv_stride, kv_fp8;
  /* scratch (capacity in tokens / attention positions) */
  int cap_tokens, cap_positions;
  float *s_x, *s_h, *s_o, *s_q, *s_qa, *s_kv, *s_attn, *s_g, *s_u, *s_router, *s_topk_w;
  float *s_exp_in, *s_exp_out, *s_shared, *s_mtp_cat;
  float *s_rope; /* [T][rope_dim/2][cos, sin] of the step's positions */
  int32_t *s_topk_ids, *s_exp_count, *s_exp_start, *s_exp_rows, *s_exp_fill, *s_exp_where;
  struct di_gemm_job *s_jobs; /* [2 * n_experts + 2] */
  float *attn_scratch; /* per thread: DI_CPU_ATTN_GROUP heads' attention scratch */
  float *s_kv_tmp;     /* per thread: 4 keys decoded from the fp8 cache (4 * kv_dim) */
  size_t attn_scratch_per_thread;
  const di_batch *pending; /* submitted, not yet run */
  /* feature capture for a DSpark drafter (di_cpu_backend_set_capture): when n_capture > 0, wait()'s
   * hidden rows are [n_outputs][n_capture * hidden]: per id the output of that layer (-1: the
   * embedding; the last layer's after the final norm, as HF's output_hidden_states) */
  int n_capture;
  int capture[16];
} di_cpu_backend;

di_status di_backend_cpu_create(const di_model_config *cfg, const di_ds_weights *w, int threads, di_backend **out);
/* --kv-cache-dtype fp8: the latent cache in E4M3 with one scale per token per 128 latent channels, the
 * rope part in bf16 (before the first kv_alloc). */
di_status di_backend_cpu_set_kv_fp8(di_backend *be);
/* Grows the scratch buffers for a step of T tokens (and its longest attention span). */
di_status di_cpu_backend_reserve(di_cpu_backend *b, int T, const di_batch *batch);
/* An attention-only backend: what di_cpu_mla_attend reads for one cache layer (cfg's attention fields,
 * the caller's thread pool and absorbed matrices, a KV pool of n_blocks blocks, scratch for n_tokens
 * tokens at positions below n_positions), set up by the same code as the full backend's, so the op
 * table's MLA runner (cpu_ops.c) cannot drift from the forward's layout. Free with the function below
 * (it leaves the pool and matrices to their owner). */
di_status di_cpu_attention_backend_init(di_cpu_backend *b, const di_model_config *cfg, di_threadpool *tp, float **w_uk,
                                        float **w_uv, int64_t n_blocks, int n_tokens, int n_positions);
void di_cpu_attention_backend_free(di_cpu_backend *b);
/* Sets (n > 0) or clears (n == 0) the feature capture above; ids increasing in [-1, n_layers). */
di_status di_cpu_backend_set_capture(di_backend *b, const int *layer_ids, int n);
di_status di_cpu_deepseek_forward(di_cpu_backend *b, const di_batch *batch, float *logits, float *hidden);
/* MLA attention of a step's tokens at one layer in the absorbed form (cpu_deepseek.c), over cache
 * entries already written (the step's own included): q [T][heads][nope | rope] with q_pe not yet
 * roped (s_rope holds the step's cos/sin rows), out [T][heads][v_head_dim]. The forward's, and the
 * op table's MLA rows'. */
void di_cpu_mla_attend(di_cpu_backend *b, const di_batch *batch, int layer, const float *q, float *out);
/* MTP module `mtp_index`: tokens[t] is the token after the one whose final hidden state is
 * prev_hidden[t]; writes the MTP logits (predicting the token after tokens[t]) of the output rows. The
 * MTP layer keeps its own KV entries in the same block tables. */
di_status di_cpu_deepseek_mtp_forward(di_cpu_backend *b, int mtp_index, const di_batch *batch, const float *prev_hidden,
                                      float *logits, float *hidden_out);
/* The MoE layer's experts under expert parallel (cpu_deepseek_ep.c): routing done (s_topk_ids/w,
 * s_exp_where); fills s_exp_out's expert-sorted rows and s_shared. Ends the job on a failed exchange. */
void di_cpu_deepseek_moe_ep(di_cpu_backend *b, const di_ds_layer *L, const float *x, int T);
#endif
