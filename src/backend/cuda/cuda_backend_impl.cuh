/* Internals of the CUDA backend shared by its files (cuda_backend.cu: create / destroy and the switches;
 * cuda_memory.cu: device memory, activations and the KV pool; cuda_upload.cu: host weights to the
 * device; cuda_step.cu: step inputs and CUDA graphs; cuda_sampling.cu: sampling and token feedback;
 * cuda_mtp.cu: the MTP drafting step; cuda_deepseek2.cu: the DeepSeek-V2/V3 weights and forward).
 *
 * A step: submit() lays the batch's host arrays (tokens, positions, cache slots, block tables, the
 * attention work list) out in one pinned buffer, copies it to the device in one transfer and
 * enqueues the forward pass; wait() synchronizes and copies the wanted logits. Steps of at most
 * DI_CUDA_GRAPH_MAX_T tokens are padded to a power-of-two bucket (padding tokens live in a spare
 * KV block) and, from the second time a bucket is seen, replayed from a captured CUDA graph, so a
 * decode step costs one graph launch. Everything whose size depends on the data (expert counts,
 * split attention items) is read by the kernels from device memory, which is what lets one graph
 * serve every step of its bucket.
 *
 * Numerics: fp32 residual stream; bf16 GEMM operands with f32 accumulation; norms, softmax, router
 * and rotary in fp32; the absorbed query and the KV cache in bf16. */
#ifndef DI_CUDA_BACKEND_IMPL_CUH
#define DI_CUDA_BACKEND_IMPL_CUH
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "cuda_fp8.h"
extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "util/numeric.h"
#include "util/switches.h"
}
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define DI_CUDA_GRAPH_MAX_T 256
/* the largest step (rows) that may carry a DSpark proposal (di_batch.propose_row): the graph steps. Larger
 * ones (prompt chunks, verify steps of many sequences) leave it to the eager proposal after the step:
 * measured on the H200 (session 13, req-2), a proposal inside an eager step was slower than after it
 * (batch 256 fixed k = 1..5: 0.50-0.66x of plain against 0.65-0.81x; batch 64, k = 4 / 5: 0.19x / 0.16x
 * against 0.20x / 0.17x), inside a graph step faster (batch 1-64, k <= 3: up to 2.3x the eager rate) */
#define DI_CUDA_PROP_MAX_T DI_CUDA_GRAPH_MAX_T
#define GATE_FUSE_MAX_T 64 /* steps up to this many tokens use the fused MoE gate */
#define GEMV_MAX_T 4       /* ... and up to this many the GEMV form of the expert products */


/* DEEPINFER_CUDA_SKIP=a,b,...: leave these phases out of every step (benchmarking only: the outputs
 * are garbage). The marginal cost of a phase inside a replayed graph, with the launch overlap, is the
 * step time with it minus without it, which a kernel profiler (serialized, cold caches) cannot show. */
enum {
  SKIP_QKV = 1, SKIP_PREP = 2, SKIP_ABSORB = 4, SKIP_ATTN = 8, SKIP_VO = 16, SKIP_GATE = 32,
  SKIP_EXPERTS = 64, SKIP_COMBINE = 128, SKIP_LMHEAD = 256
};
#define SKIP(bit) (b->skip & (bit))
#define MAX_GRAPHS 64
#define MAX_MARKS 2048

typedef struct cu_layer {
  float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm, *router_bias;
  bf16 *qkv_a;                 /* [q_a (qr) or q_proj (NH*dqk) | kv_a (R+dr)][H]: one GEMM */
  bf16 *q_b, *kv_b, *o_proj;
  bf16 *wuk_t; /* W_UK transposed per head [NH][R][dn] (DEEPINFER_CUDA_ABSORB_NK, invariant mode), or NULL */
  int is_moe, has_shared;
  bf16 *gate_up, *down;        /* dense MLP: [2I][H], [H][I] */
  bf16 *router;                /* [E][H] */
  bf16 *exp_gu, *exp_down;     /* [Et][2Ip][Hp] gate/up interleaved by 8 rows (glu), [Et][Hp][Ip]; zero
                                  padded; Et = E + n_sh (shared experts folded in as experts) */
  bf16 *sh_gu, *sh_down;       /* [2Is][H], [H][Is] */
  /* DEEPINFER_CUDA_FP8=1 with FP8 weights (cuda_upload_fp8.cu): these groups in FP8 on the device, the
   * bf16 pointers of the same group NULL. Same row layouts as the bf16 ones except the experts' gate/up,
   * which are [Et][gate Ip rows | up Ip rows][Hp] (not interleaved: silu_mul runs after the product). */
  di_cuk_fp8w f_qkv_a, f_q_b, f_o, f_gate_up, f_down, f_exp_gu, f_exp_down, f_sh_gu, f_sh_down;
} cu_layer;

typedef struct graph_entry {
  int T, n_out, bt_stride, max_items, max_citems, bm, attn_cl, n_seq_rows, step_sample, n_lg;
  int prop_blk, prop_bt;       /* a DSpark proposal in the step: its padded block count and table stride (0: none) */
  /* a DSpark proposal's own graph (prop_only: launched after the step's plain graph, cu_submit), keyed by
   * T, prop_blk, prop_bt and prop_off, the offset of its inputs in the step's input block */
  int prop_only;
  size_t prop_off;
  int seen;                    /* eager runs so far; captured on the second */
  cudaGraphExec_t exec;
} graph_entry;

typedef struct cu_backend {
  di_backend base;
  cudaStream_t stream;
  di_cu_blas *blas;
  int sms, use_graphs, skip, attn_min_split, split_keys, attn_cluster, down_combine, fold_uv;
  int vo_fused; /* one-token W_UV + o_proj in one kernel (DEEPINFER_CUDA_VO_FUSED=0: the two GEMMs) */
  int invariant; /* batch-invariant mode (DEEPINFER_BATCH_INVARIANT=1; see create) */
  int attn_fixed; /* > 0: attention in the fixed-split form at every step, splits of this many keys
                   * (k_mla_fixed.cu; see create) */
  int fixed_tc;   /* DEEPINFER_CUDA_MLA_FIXED_TC: 1 prefill-like steps, 2 every step of the fixed split on
                   * k_mla_fixed_tc.cu (cuda_step.cu decides per step) */
  int fixed_dec;  /* DEEPINFER_CUDA_MLA_FIXED_DEC: 1 decode steps that fit one CTA an SM, 2 every 16-row step of the
                   * fixed split on its decode form (di_cuk_mla_attn_fixed_dec; cuda_deepseek2.cu decides) */
  int inv_down_combine; /* DEEPINFER_CUDA_INV_DOWN_COMBINE: up to this many tokens, the invariant combine in the down GEMM */
  int inv_prep_absorb;  /* DEEPINFER_CUDA_INV_PREP_ABSORB: the invariant prep in the absorption's launch */
  int32_t *gg_cnt;      /* its counters (di_cuk_grouped_gemm_combine: Hp / 64 + 1, zero between launches) */
  int fixed_dec_merge; /* DEEPINFER_CUDA_MLA_FIXED_DEC_MERGE: the decode form merges its partials itself */
  float *tc_slots; /* that kernel's per-CTA merge slots (allocated at its first step) */
  int absorb_nk; /* DEEPINFER_CUDA_ABSORB_NK: the invariant absorption on cu_layer.wuk_t */
  const di_model_config *cfg; /* the model's (outlives the backend) */
  int fp8;       /* DEEPINFER_CUDA_FP8=1: FP8 weights stay FP8 on the device */
  int fp8_gv16;  /* DEEPINFER_CUDA_FP8_GV16 (1): 1 / 2 the 16-row FP8 expert GEMVs (2: pipelined loads), 0 off */
  int fp8_gmma;  /* DEEPINFER_CUDA_FP8_GMMA (1): experts of steps of > 16 tokens on k_fp8_grouped_mma.cu's GEMM */
  int fp8_gmma_min_t; /* DEEPINFER_CUDA_FP8_GMMA_MIN_T (4): the fewest tokens of a step for the grouped GEMMs */
  int fp8_tcg;   /* DEEPINFER_CUDA_FP8_TCG (1): those on k_fp8_tc_grouped.cu where the widths allow */
  int fp8_fuse;  /* DEEPINFER_CUDA_FP8_FUSE (1): the FP8 path's decode fusions (cuda_deepseek2.cu) */
  void *fp8_ws;  /* activation quantization of the FP8 GEMMs (ensure_acts) */
  size_t fp8_ws_bytes;
  di_cu_fp8lt *fp8lt; /* DEEPINFER_CUDA_FP8_LT=1: prefill-sized dense FP8 products on cuBLASLt (gemm_fp8_lt.cu) */
  bf16 *egu;     /* FP8 experts: the gate/up product [A][2Ip] before silu_mul */
  /* shapes */
  int H, Hp, NH, dn, dr, dv, R, dqk, V, E, K, Ip, Idense, Ish, qr; /* Hp: H rounded up to 128 (MoE tiles) */
  int n_sh, Et, Kt, Wa;        /* folded shared experts; experts and picks per token with them; qkv_a rows */
  /* the first MTP layer (speculative decoding; DEEPINFER_CUDA_MTP=0 skips it): its decoder
   * layer is L[n_layers] with KV entries in the pool after the main layers' */
  int n_mtp;
  bf16 *mtp_embed, *mtp_eh, *mtp_head; /* embed / head alias the main model's when the checkpoint shares them */
  float *mtp_enorm, *mtp_hnorm, *mtp_head_norm;
  float *mtp_prev;             /* [cap_T][H] the previous hidden states of an MTP batch */
  bf16 *mtp_cat;               /* [cap_T][2H] [enorm(embed) | hnorm(prev)] */
  int mtp_cap;
  bf16 *stage;                 /* upload staging for one layer's experts */
  /* expert parallel (cuda_ep.cu; NULL unless --enable-expert-parallel): routed experts
   * [ep_e0, ep_e0 + ep_El) live here, at local indices 0..ep_El-1 */
  struct cu_ep *ep;
  int ep_e0, ep_El;
  float eps;
  di_cuk_router router;
  di_cuk_rope rope;
  /* weights */
  bf16 *embed, *lm_head;
  float *final_norm, *inv_freq;
  cu_layer *L;
  int n_layers;
  void **allocs;
  int n_allocs, cap_allocs;
  /* KV pool: [layer][(n_blocks + 1) * 64][576 bf16], or with --kv-cache-dtype fp8 (kv_fp8) [layer][(n_blocks +
   * 1) * 64][DI_CUK_KV8_ROW bytes] (cuda_kernels.h); block n_blocks is the padding tokens' scratch */
  bf16 *kv;
  int64_t n_blocks;
  int kv_fp8;
  /* activations, for cap_T tokens */
  int cap_T, cap_out, cap_parts;
  float *h, *xf, *router_logits, *topk_w, *y, *hout, *logits, *part_o, *part_lse;
  int32_t *part_cnt; /* per partial slot: the fixed split's decode form counts a row group's finished splits there */
  bf16 *xn, *qkv, *q, *qa_n, *Qa, *olat, *attn, *gu, *act, *hn;
  int32_t *topk_ids, *perm_tok, *inv, *expert_off, *tiles, *n_tiles;
  /* step inputs: pinned host mirror and device copy */
  int32_t *in_host, *in_dev;
  size_t in_cap; /* int32 elements */
  /* the step in flight */
  int pending, T, Tp, n_out, n_out_p, bt_stride, max_items, max_citems, bm, attn_cl, n_seq_rows;
  size_t in_used;
  int32_t *d_tokens, *d_pos, *d_slots, *d_out_rows, *d_bt, *d_nitems, *d_ncitems;
  di_cuk_attn_item *d_items;
  di_cuk_combine_item *d_citems;
  int32_t *d_sample_out;
  di_cuk_sample_row *d_sample_rows;
  di_cuk_sample_row *h_sample_rows;
  int32_t *h_sample_out;
  /* sampling inside the step (di_batch.sample_rows; DEEPINFER_CUDA_STEP_SAMPLE=0 turns it off): the
   * rows travel in the input block (d_step_rows), the graph ends with the sample kernel, and
   * sample / sample_async only copy the tokens back when their rows equal the submitted ones
   * (sub_rows, the host copy) */
  int step_sample_on, step_sample;
  di_cuk_sample_row *d_step_rows;
  di_sample_row *sub_rows;
  /* graphs */
  graph_entry graphs[MAX_GRAPHS];
  int n_graphs;
  di_cuda_stats stats;
  /* DEEPINFER_CUDA_PROFILE=1: per-phase device time of eager steps (graphs off), printed at destroy */
  int prof, n_marks;
  cudaEvent_t marks[MAX_MARKS];
  int gpu_time, timing;        /* DEEPINFER_CUDA_GPU_TIME=1; this step's graph is between ev_g0/ev_g1 */
  cudaEvent_t ev_g0, ev_g1;
  /* device token feedback (sample_async / sample_fetch): rows of the last queued sampling (token ids
   * -1 - j < 0 of the next batch refer to them), the event after its copy to the host, and the event
   * after each input upload (prepare() must not rewrite the pinned input block before that copy ran) */
  int fb_n, fb_pending, fb_par;
  /* sampled tokens come back through two pinned halves of h_sample_out (tok_par: the latest copy's),
   * each completing on its event: with token feedback step n+1's copy is queued before the host has
   * read step n's. tok_queued: the submitted step's copy is queued already (it sampled in-step). */
  int tok_par, tok_queued;
  int out_cap0; /* the first output capacity (16; DEEPINFER_CUDA_OUT_CAP for tests: growth under feedback) */
  cudaEvent_t ev_sampled[2], ev_h2d;
  int h2d_recorded;
  const char *mark_label[MAX_MARKS];
  /* per-phase device time summed over profiled steps: [0] decode-sized steps (T <= the graph limit),
   * [1] larger ones (prefill); printed at destroy or by di_backend_cuda_profile_dump */
  struct cu_prof_acc {
    const char *label[64];
    double ms[64];
    int n;
    int64_t steps;
  } prof_acc[2];
  int prof_graphs_saved; /* use_graphs before di_backend_cuda_set_profile turned profiling on */
  /* di_backend_cuda_set_invariant: the default mode's settings while the invariant mode is on */
  int saved_vo_fused, saved_fold_uv, saved_attn_fixed;
  /* DEEPINFER_CUDA_PREFILL_MHA: steps of at least prefill_mha tokens (0: never) run attention in the MHA
   * form (k_mha_prefill.cu). This step's: mha_step, its items and the keys' cache slots (in the input
   * block), the gathered latents mha_g [keys][576] and up-projected keys / values mha_kv
   * [keys][NH * (dn + dv)] (grown to mha_cap keys) */
  int prefill_mha, mha_step, n_mha_items, n_mha_keys;
  int64_t mha_cap;
  const struct di_cuk_mha_item *d_mha_items;
  const int32_t *d_mha_slots;
  void *mha_g, *mha_kv;
  /* feature capture for a DSpark drafter (di_backend_cuda_set_capture; cuda_dspark.cu): when n_capture
   * > 0 the forward copies each output row's output of the layers capture[] (-1: the embedding; the last
   * layer's after the final norm) into cap_buf [cap_rows][n_capture * H] f32, and wait() returns those
   * rows as its hidden states instead of the final normed ones */
  int n_capture;
  int capture[16];
  float *cap_buf;
  int cap_rows;
  /* the drafter's feature log (DSpark with its context fed on the device: di_cuda_dspark_log_on): when
   * flog != NULL the capture writes a step's rows at row flog_n of flog [flog_cap][n_capture * H] instead
   * of cap_buf (that offset travels in the step's input block, d_flog_row0, so one CUDA graph serves
   * every offset); prepare() keeps each row's position and cache slot (-1: a padding row) on the host
   * and first calls flog_flush(flog_ctx), which turns the logged rows into drafter cache entries and
   * empties the log, when the step's rows would not fit */
  float *flog;
  int flog_cap, flog_n;
  int32_t *flog_pos, *flog_slot; /* host [flog_cap] */
  const int32_t *d_flog_row0;
  di_status (*flog_flush)(void *ctx);
  void *flog_ctx;
  /* a DSpark proposal inside the step (di_batch.propose_row; di_cuda_dspark_graph_on): prop_forward
   * (after the step's sampling, inside its graph) turns the step's logged rows into drafter cache
   * entries, finds each block's anchor on the device and drafts; prop_prepare (in prepare(), before any
   * capture) sizes its scratch for rows context rows and blk blocks. prop_on: this step proposes;
   * prop_blk its padded block count, prop_bt the stride of its drafter tables, d_prop its inputs in
   * the step's input block (first row [prop_blk], last row [prop_blk], cap [prop_blk], tables
   * [prop_blk][prop_bt], context slots [Tp]). */
  di_status (*prop_prepare)(void *ctx, int rows, int blk);
  di_status (*prop_forward)(void *ctx);
  void *prop_ctx;
  int prop_on, prop_blk, prop_n, prop_bt;
  const int32_t *d_prop;
  /* forward() leaves the proposal out (cu_submit launches it as a graph of its own after the step's:
   * the step's graph is then the plain step's, already captured, and a look after a pause replays it);
   * prop_split: so for every graph step (DEEPINFER_DSPARK_PROP_GRAPH, read at graph_on; default 0) */
  int prop_defer, prop_split;
  /* di_batch.output_logits of the step in flight (want_on): wait() copies only those logits rows. With
   * a drafter's feature log on (DSpark: its rows' features come from the capture, not from hn) and some rows
   * unwanted, the output head runs on the wanted rows only (lg_gather): logits row k is output row
   * lg_out[k] (k < n_lg; n_lg_p rows, padded, go through the GEMM, d_lg_rows their token rows) */
  uint8_t *want_host;
  int want_cap, want_on;
  int lg_gather, n_lg, n_lg_p;
  int32_t *lg_out;               /* host [want_cap] */
  const int32_t *d_lg_rows;
} cu_backend;

#define REALLOC(ptr, bytes)                                                      \
  do {                                                                           \
    dev_free(b, (void *)(ptr));                                                  \
    (ptr) = NULL;                                                                \
    DI_TRY(dev_alloc(b, (void **)&(ptr), (size_t)(bytes)));                      \
  } while (0)

/* the sample kernel's row of an engine sample row */
static inline di_cuk_sample_row cuk_row(const di_sample_row *r) {
  return (di_cuk_sample_row){r->temperature, r->top_p, r->min_p, r->top_k, r->vocab_limit, r->seed, r->counter};
}

/* cuda_memory.cu: device allocations (every one freed at destroy), activations for T tokens, the KV pool */
di_status dev_alloc(cu_backend *b, void **p, size_t bytes);
void dev_free(cu_backend *b, void *p);
void drop_graphs(cu_backend *b);
/* only the graphs of steps that carry a DSpark proposal (graph_entry.prop_blk > 0): the others never
 * name the drafter's scratch, so its growth keeps them */
void drop_proposal_graphs(cu_backend *b);
di_status ensure_acts(cu_backend *b, int T, int n_out, int n_parts);
int cu_kv_groups(di_backend *bb, di_kv_group_info *g, int cap);
di_status cu_kv_alloc(di_backend *bb, int64_t n_blocks);
di_status cu_set_kv_fp8(di_backend *bb);
/* bytes of one token's entry in one layer's pool: 576 bf16, or the FP8 entry */
static inline size_t cu_kv_row_bytes(const cu_backend *b) { return b->kv_fp8 ? DI_CUK_KV8_ROW : DI_CUK_MLA_D * 2; }
di_status cu_memory_info(di_backend *bb, int max_step_tokens, int max_outputs, int64_t *total_bytes,
                         int64_t *used_bytes);
/* cuda_upload.cu: host weights (any di_weight dtype) to bf16 device rows */
di_status up_rows(const di_weight *w, int64_t r0, int64_t r1, bf16 *dst, int64_t dst_ld);
di_status up_cols(const di_weight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, bf16 *dst, int64_t dst_ld);
di_status check_shape(const di_weight *w, int64_t rows, int64_t cols, const char *what);
di_status up_mat(cu_backend *b, const di_weight *w, int64_t rows, int64_t cols, bf16 **out, const char *what);
di_status up_vec(cu_backend *b, const float *v, int64_t n, float **out);
/* cuda_upload_fp8.cu: FP8 weights kept FP8 on the device (DEEPINFER_CUDA_FP8=1), with one scale row per
 * weight row; fp8_alloc zero-fills (padding rows / columns), fp8_up_rows copies rows [r0, r1), columns
 * [c0, c1) of w (c0 a multiple of its block_cols) to rows dst_row.. , columns 0.. of d. */
di_status fp8_alloc(cu_backend *b, int64_t rows, int K, int block_cols, di_cuk_fp8w *d);
di_status fp8_up_rows(const di_weight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const di_cuk_fp8w *d,
                      int64_t dst_row);
/* whether every weight given (NULL-terminated) is FP8 with block_cols bc, columns c0 multiples of it */
int fp8_uploadable(int bc, const di_weight *const *ws);
/* cuda_step.cu: a step's inputs laid out and uploaded, its forward eager or from a graph */
di_status prepare(cu_backend *b, const di_batch *bt);
di_status cu_submit(di_backend *bb, const di_batch *batch);
di_status cu_wait(di_backend *bb, float *logits, float *hidden);
/* cuda_sampling.cu */
di_status queue_tokens(cu_backend *b, int n);
di_status cu_sample(di_backend *bb, const di_sample_row *rows, int n, int32_t *tokens);
di_status cu_sample_async(di_backend *bb, const di_sample_row *rows, int n);
di_status cu_sample_fetch(di_backend *bb, int32_t *tokens);
/* cuda_dspark.cu: the capture above, inside forward() after layer l (-1: the embedding) */
di_status capture_layer(cu_backend *b, int l);
/* cuda_mtp.cu */
di_status cu_mtp(di_backend *bb, const di_batch *batch, const float *prev_hidden, float *logits, float *hidden_out);
/* cuda_deepseek2.cu: the DeepSeek-V2/V3 architecture: shapes and weights to the device, one decoder
 * layer, the whole forward of a prepared step */
di_status ds2_load(cu_backend *b, const di_model_config *c, const di_ds_weights *w);
di_status ds2_wuk_t(cu_backend *b); /* every layer's wuk_t, if not there yet (cuda_deepseek2.cu) */
di_status layer_step(cu_backend *b, int l, int *xn_ready_io, int normed_gemm);
di_status forward(cu_backend *b);
/* cuda_ep.cu: expert parallel (see there) */
void cu_ep_pick_device(int ndev);
di_status cu_ep_setup(cu_backend *b, const di_model_config *c);
di_status cu_ep_moe(cu_backend *b, int l, int T, const int32_t **inv_out);
void cu_ep_destroy(cu_backend *b);
#endif
