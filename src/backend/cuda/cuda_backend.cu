/* The CUDA backend: device weights, the paged latent KV pool and the DeepSeek-V2/V3 forward pass
 * composed from the kernels of this folder, behind backend/backend.h's vtable.
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
#include "cuda_common.cuh"
#include "cuda_kernels.h"
extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "util/numeric.h"
}
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define DI_CUDA_GRAPH_MAX_T 256
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

static int parse_skip(const char *phases) {
  static const char *names[] = {"qkv", "prep", "absorb", "attn", "vo", "gate", "experts", "combine", "lmhead"};
  int m = 0;
  for (int i = 0; phases && i < 9; i++)
    if (strstr(phases, names[i])) m |= 1 << i;
  return m;
}
#define MAX_GRAPHS 64
#define MAX_MARKS 2048

typedef struct cu_layer {
  float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm, *router_bias;
  bf16 *qkv_a;                 /* [q_a (qr) or q_proj (NH*dqk) | kv_a (R+dr)][H]: one GEMM */
  bf16 *q_b, *kv_b, *o_proj;
  int is_moe, has_shared;
  bf16 *gate_up, *down;        /* dense MLP: [2I][H], [H][I] */
  bf16 *router;                /* [E][H] */
  bf16 *exp_gu, *exp_down;     /* [Et][2Ip][Hp] gate/up interleaved by 8 rows (glu), [Et][Hp][Ip]; zero
                                  padded; Et = E + n_sh (shared experts folded in as experts) */
  bf16 *sh_gu, *sh_down;       /* [2Is][H], [H][Is] */
} cu_layer;

typedef struct graph_entry {
  int T, n_out, bt_stride, max_items, max_citems, bm, attn_cl, n_seq_rows, step_sample;
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
  /* KV pool: [layer][(n_blocks + 1) * 64][576]; block n_blocks is the padding tokens' scratch */
  bf16 *kv;
  int64_t n_blocks;
  /* activations, for cap_T tokens */
  int cap_T, cap_out, cap_parts;
  float *h, *xf, *router_logits, *topk_w, *y, *hout, *logits, *part_o, *part_lse;
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
  const char *plabel[64];
  double ptime[64];
  int n_plabel;
  int64_t prof_steps;
} cu_backend;

/* ---- allocation --------------------------------------------------------------------------------- */

static di_status dev_alloc(cu_backend *b, void **p, size_t bytes) {
  if (b->n_allocs == b->cap_allocs) {
    int nc = b->cap_allocs ? 2 * b->cap_allocs : 256;
    void **na = (void **)realloc(b->allocs, sizeof(void *) * (size_t)nc);
    if (!na) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
    b->allocs = na;
    b->cap_allocs = nc;
  }
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
  if (e != cudaSuccess)
    return di_error_set(DI_ERR_OOM, "cuda: cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
  b->allocs[b->n_allocs++] = *p;
  return DI_OK;
}

static void dev_free(cu_backend *b, void *p) {
  if (!p) return;
  for (int i = 0; i < b->n_allocs; i++)
    if (b->allocs[i] == p) {
      cudaFree(p);
      b->allocs[i] = b->allocs[--b->n_allocs];
      return;
    }
}

/* ---- weight upload ------------------------------------------------------------------------------- */

/* Rows [r0, r1) of w (all its columns) to dst, whose rows are dst_ld elements apart. */
static di_status up_rows(const di_weight *w, int64_t r0, int64_t r1, bf16 *dst, int64_t dst_ld) {
  const int64_t C = w->cols, n = r1 - r0;
  if (n <= 0) return DI_OK;
  if (w->dtype == DI_DT_BF16) {
    const uint16_t *src = (const uint16_t *)w->data + r0 * C;
    if (dst_ld == C) DI_CU(cudaMemcpy(dst, src, (size_t)(n * C) * 2, cudaMemcpyHostToDevice));
    else DI_CU(cudaMemcpy2D(dst, (size_t)dst_ld * 2, src, (size_t)C * 2, (size_t)C * 2, (size_t)n, cudaMemcpyHostToDevice));
    return DI_OK;
  }
  /* other dtypes (FP8 with block scales, F16, F32): dequantize on the host, 256 rows at a time */
  const int64_t chunk = 256;
  float *f = (float *)malloc(sizeof(float) * (size_t)(chunk * C));
  uint16_t *hb = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(chunk * C));
  if (!f || !hb) { free(f); free(hb); return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory converting %s", w->name ? w->name : "?"); }
  di_status st = DI_OK;
  for (int64_t r = r0; r < r1 && st == DI_OK; r += chunk) {
    int64_t m = r1 - r < chunk ? r1 - r : chunk;
    di_weight_rows_f32(w, r, r + m, f);
    for (int64_t i = 0; i < m * C; i++) hb[i] = di_f32_to_bf16(f[i]);
    cudaError_t e = cudaMemcpy2D(dst + (r - r0) * dst_ld, (size_t)dst_ld * 2, hb, (size_t)C * 2, (size_t)C * 2,
                                 (size_t)m, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) st = di_error_set(DI_ERR_BACKEND, "cuda: uploading %s: %s", w->name ? w->name : "?", cudaGetErrorString(e));
  }
  free(f);
  free(hb);
  return st;
}

/* Columns [c0, c1) of rows [r0, r1) of w to dst (row stride dst_ld). */
static di_status up_cols(const di_weight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, bf16 *dst, int64_t dst_ld) {
  const int64_t C = w->cols, n = r1 - r0, wd = c1 - c0;
  if (n <= 0 || wd <= 0) return DI_OK;
  if (w->dtype == DI_DT_BF16) {
    DI_CU(cudaMemcpy2D(dst, (size_t)dst_ld * 2, (const uint16_t *)w->data + r0 * C + c0, (size_t)C * 2, (size_t)wd * 2,
                       (size_t)n, cudaMemcpyHostToDevice));
    return DI_OK;
  }
  float *f = (float *)malloc(sizeof(float) * (size_t)C);
  uint16_t *hb = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(n * wd));
  if (!f || !hb) { free(f); free(hb); return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory"); }
  for (int64_t r = 0; r < n; r++) {
    di_weight_rows_f32(w, r0 + r, r0 + r + 1, f);
    for (int64_t c = 0; c < wd; c++) hb[r * wd + c] = di_f32_to_bf16(f[c0 + c]);
  }
  cudaError_t e = cudaMemcpy2D(dst, (size_t)dst_ld * 2, hb, (size_t)wd * 2, (size_t)wd * 2, (size_t)n, cudaMemcpyHostToDevice);
  free(f);
  free(hb);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda: upload: %s", cudaGetErrorString(e));
  return DI_OK;
}

static di_status check_shape(const di_weight *w, int64_t rows, int64_t cols, const char *what) {
  if (!w->data || w->rows != rows || w->cols != cols)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: weight %s is [%lld x %lld], expected [%lld x %lld]",
                        w->name ? w->name : what, (long long)w->rows, (long long)w->cols, (long long)rows, (long long)cols);
  return DI_OK;
}

static di_status up_mat(cu_backend *b, const di_weight *w, int64_t rows, int64_t cols, bf16 **out, const char *what) {
  DI_TRY(check_shape(w, rows, cols, what));
  DI_TRY(dev_alloc(b, (void **)out, (size_t)(rows * cols) * 2));
  return up_rows(w, 0, rows, *out, cols);
}

static di_status up_vec(cu_backend *b, const float *v, int64_t n, float **out) {
  DI_TRY(dev_alloc(b, (void **)out, sizeof(float) * (size_t)n));
  if (v) DI_CU(cudaMemcpy(*out, v, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  else DI_CU(cudaMemset(*out, 0, sizeof(float) * (size_t)n));
  return DI_OK;
}

static di_status upload_layer(cu_backend *b, const di_model_config *c, const di_ds_layer *s, cu_layer *d, int l) {
  const int H = b->H;
  DI_TRY(up_vec(b, s->attn_norm, H, &d->attn_norm));
  DI_TRY(up_vec(b, s->ffn_norm, H, &d->ffn_norm));
  /* the attention's input projections as one matrix: [q_a or q_proj ; kv_a] */
  const int qrows = b->qr > 0 ? b->qr : b->NH * b->dqk;
  DI_TRY(dev_alloc(b, (void **)&d->qkv_a, (size_t)b->Wa * H * 2));
  if (b->qr > 0) {
    DI_TRY(check_shape(&s->q_a, b->qr, H, "q_a_proj"));
    DI_TRY(up_rows(&s->q_a, 0, b->qr, d->qkv_a, H));
    DI_TRY(up_vec(b, s->q_a_norm, b->qr, &d->q_a_norm));
    DI_TRY(up_mat(b, &s->q_b, (int64_t)b->NH * b->dqk, b->qr, &d->q_b, "q_b_proj"));
  } else {
    DI_TRY(check_shape(&s->q_proj, qrows, H, "q_proj"));
    DI_TRY(up_rows(&s->q_proj, 0, qrows, d->qkv_a, H));
  }
  DI_TRY(check_shape(&s->kv_a, b->R + b->dr, H, "kv_a_proj_with_mqa"));
  DI_TRY(up_rows(&s->kv_a, 0, b->R + b->dr, d->qkv_a + (size_t)qrows * H, H));
  DI_TRY(up_vec(b, s->kv_a_norm, b->R, &d->kv_a_norm));
  DI_TRY(up_mat(b, &s->kv_b, (int64_t)b->NH * (b->dn + b->dv), b->R, &d->kv_b, "kv_b_proj"));
  DI_TRY(up_mat(b, &s->o_proj, H, (int64_t)b->NH * b->dv, &d->o_proj, "o_proj"));
  d->is_moe = s->is_moe;
  if (!s->is_moe) {
    const int I = b->Idense;
    DI_TRY(check_shape(&s->gate, I, H, "mlp.gate_proj"));
    DI_TRY(check_shape(&s->up, I, H, "mlp.up_proj"));
    DI_TRY(dev_alloc(b, (void **)&d->gate_up, (size_t)2 * I * H * 2));
    DI_TRY(up_rows(&s->gate, 0, I, d->gate_up, H));
    DI_TRY(up_rows(&s->up, 0, I, d->gate_up + (int64_t)I * H, H));
    DI_TRY(up_mat(b, &s->down, H, I, &d->down, "mlp.down_proj"));
    return DI_OK;
  }
  const int E = b->E, I = c->moe_intermediate_size, Ip = b->Ip;
  DI_TRY(up_mat(b, &s->router, E, H, &d->router, "mlp.gate"));
  if (s->router_bias) DI_TRY(up_vec(b, s->router_bias, E, &d->router_bias));
  const int Hp = b->Hp, Et = b->Et;
  const size_t gu_e = (size_t)2 * Ip * Hp, dn_e = (size_t)Hp * Ip;
  DI_TRY(dev_alloc(b, (void **)&d->exp_gu, gu_e * Et * 2));
  DI_TRY(dev_alloc(b, (void **)&d->exp_down, dn_e * Et * 2));
  if (!b->stage) DI_TRY(dev_alloc(b, (void **)&b->stage, gu_e * Et * 2));
  if (Ip != I || Hp != H) {
    DI_CU(cudaMemset(b->stage, 0, gu_e * Et * 2));
    DI_CU(cudaMemset(d->exp_down, 0, dn_e * Et * 2));
  }
  /* staging layout per expert: gate rows [0, Ip), up rows [Ip, 2Ip); then interleaved for the glu GEMM */
  for (int e = 0; e < E; e++) {
    DI_TRY(check_shape(&s->exp_gate[e], I, H, "experts.gate_proj"));
    DI_TRY(check_shape(&s->exp_up[e], I, H, "experts.up_proj"));
    DI_TRY(check_shape(&s->exp_down[e], H, I, "experts.down_proj"));
    DI_TRY(up_rows(&s->exp_gate[e], 0, I, b->stage + gu_e * e, Hp));
    DI_TRY(up_rows(&s->exp_up[e], 0, I, b->stage + gu_e * e + (size_t)Ip * Hp, Hp));
    DI_TRY(up_rows(&s->exp_down[e], 0, H, d->exp_down + dn_e * e, Ip));
  }
  d->has_shared = s->has_shared;
  if (s->has_shared && b->n_sh > 0) {
    /* shared MLP of width n_sh*I == n_sh experts of width I (a slice of its rows / columns each) */
    DI_TRY(check_shape(&s->sh_gate, (int64_t)b->n_sh * I, H, "shared_experts.gate_proj"));
    DI_TRY(check_shape(&s->sh_up, (int64_t)b->n_sh * I, H, "shared_experts.up_proj"));
    DI_TRY(check_shape(&s->sh_down, H, (int64_t)b->n_sh * I, "shared_experts.down_proj"));
    for (int j = 0; j < b->n_sh; j++) {
      const int e = E + j;
      DI_TRY(up_rows(&s->sh_gate, (int64_t)j * I, (int64_t)(j + 1) * I, b->stage + gu_e * e, Hp));
      DI_TRY(up_rows(&s->sh_up, (int64_t)j * I, (int64_t)(j + 1) * I, b->stage + gu_e * e + (size_t)Ip * Hp, Hp));
      DI_TRY(up_cols(&s->sh_down, 0, H, (int64_t)j * I, (int64_t)(j + 1) * I, d->exp_down + dn_e * e, Ip));
    }
  } else if (s->has_shared) {
    const int Is = (int)s->sh_gate.rows;
    if (b->Ish && Is != b->Ish)
      return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: layer %d shared experts %d wide, others %d", l, Is, b->Ish);
    b->Ish = Is;
    DI_TRY(check_shape(&s->sh_up, Is, H, "shared_experts.up_proj"));
    DI_TRY(check_shape(&s->sh_gate, Is, H, "shared_experts.gate_proj"));
    DI_TRY(dev_alloc(b, (void **)&d->sh_gu, (size_t)2 * Is * H * 2));
    DI_TRY(up_rows(&s->sh_gate, 0, Is, d->sh_gu, H));
    DI_TRY(up_rows(&s->sh_up, 0, Is, d->sh_gu + (int64_t)Is * H, H));
    DI_TRY(up_mat(b, &s->sh_down, H, Is, &d->sh_down, "shared_experts.down_proj"));
  }
  DI_TRY(di_cuk_glu_interleave((const uint16_t *)b->stage, (uint16_t *)d->exp_gu, Et, Ip, Hp, NULL));
  DI_CU(cudaDeviceSynchronize()); /* the staging buffer is reused by the next layer */
  return DI_OK;
}

/* ---- activations -------------------------------------------------------------------------------- */

static void drop_graphs(cu_backend *b) {
  for (int i = 0; i < b->n_graphs; i++)
    if (b->graphs[i].exec) cudaGraphExecDestroy(b->graphs[i].exec);
  b->n_graphs = 0;
}

#define REALLOC(ptr, bytes)                                                      \
  do {                                                                           \
    dev_free(b, (void *)(ptr));                                                  \
    (ptr) = NULL;                                                                \
    DI_TRY(dev_alloc(b, (void **)&(ptr), (size_t)(bytes)));                      \
  } while (0)

static di_status ensure_acts(cu_backend *b, int T, int n_out, int n_parts) {
  if (T > b->cap_T) {
    int c = b->cap_T ? b->cap_T : 256;
    while (c < T) c *= 2;
    drop_graphs(b);
    b->cap_T = c;
    const int64_t A = (int64_t)c * b->Kt; /* expert assignments */
    int64_t act_w = (int64_t)b->Ip * A;
    if ((int64_t)b->Idense * c > act_w) act_w = (int64_t)b->Idense * c;
    if ((int64_t)b->Ish * c > act_w) act_w = (int64_t)b->Ish * c;
    int64_t gu_w = 2 * (int64_t)b->Idense * c;
    if (2 * (int64_t)b->Ish * c > gu_w) gu_w = 2 * (int64_t)b->Ish * c;
    REALLOC(b->h, sizeof(float) * (size_t)c * b->H);
    REALLOC(b->xf, sizeof(float) * (size_t)c * b->H);
    REALLOC(b->xn, 2 * (size_t)c * b->Hp);
    DI_CU(cudaMemset(b->xn, 0, 2 * (size_t)c * b->Hp)); /* padding columns stay zero */
    REALLOC(b->qkv, 2 * (size_t)c * b->Wa);
    REALLOC(b->q, 2 * (size_t)c * b->NH * b->dqk);
    REALLOC(b->qa_n, 2 * (size_t)c * (b->qr > 0 ? b->qr : 1));
    REALLOC(b->Qa, 2 * (size_t)c * b->NH * DI_CUK_MLA_D);
    REALLOC(b->olat, 2 * (size_t)c * b->NH * DI_CUK_MLA_R);
    REALLOC(b->attn, 2 * (size_t)c * b->NH * b->dv);
    REALLOC(b->router_logits, sizeof(float) * (size_t)c * (b->E > 0 ? b->E : 1));
    REALLOC(b->topk_ids, sizeof(int32_t) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->topk_w, sizeof(float) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->perm_tok, sizeof(int32_t) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->inv, sizeof(int32_t) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->tiles, sizeof(int32_t) * (size_t)(A / 16 + b->Et + 1));
    REALLOC(b->expert_off, sizeof(int32_t) * (size_t)(b->Et + 1));
    REALLOC(b->n_tiles, sizeof(int32_t) * 4);
    REALLOC(b->gu, 2 * (size_t)(gu_w > 0 ? gu_w : 1));
    REALLOC(b->act, 2 * (size_t)(act_w > 0 ? act_w : 1));
    REALLOC(b->y, sizeof(float) * (size_t)(A > 0 ? A : 1) * b->Hp);
    /* the padded garbage rows of Qa's latent columns are rewritten every step; start finite */
    DI_CU(cudaMemset(b->Qa, 0, 2 * (size_t)c * b->NH * DI_CUK_MLA_D));
  }
  if (n_out > b->cap_out) {
    int c = b->cap_out ? b->cap_out : b->out_cap0;
    while (c < n_out) c *= 2;
    drop_graphs(b);
    /* with token feedback this step may read the last step's samples (d_sample_out, the embedding of
     * its -1 - row ids) and the host may still fetch them (a half of h_sample_out): both keep their
     * contents across the growth (rare: the capacity doubles), after the stream has drained */
    DI_CU(cudaStreamSynchronize(b->stream));
    const int old_cap = b->cap_out;
    int32_t *old_d = b->d_sample_out, *old_h = b->h_sample_out;
    b->d_sample_out = NULL;
    b->h_sample_out = NULL;
    REALLOC(b->hout, sizeof(float) * (size_t)c * b->H);
    REALLOC(b->hn, 2 * (size_t)c * b->H);
    REALLOC(b->logits, sizeof(float) * (size_t)c * b->V);
    REALLOC(b->d_sample_rows, sizeof(di_cuk_sample_row) * (size_t)c);
    DI_TRY(dev_alloc(b, (void **)&b->d_sample_out, sizeof(int32_t) * (size_t)c));
    if (old_d) {
      DI_CU(cudaMemcpy(b->d_sample_out, old_d, sizeof(int32_t) * (size_t)old_cap, cudaMemcpyDeviceToDevice));
      dev_free(b, old_d);
    }
    free(b->sub_rows);
    b->sub_rows = (di_sample_row *)malloc(sizeof(di_sample_row) * (size_t)c);
    if (!b->sub_rows) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
    cudaFreeHost(b->h_sample_rows);
    b->h_sample_rows = NULL;
    DI_CU(cudaMallocHost((void **)&b->h_sample_rows, sizeof(di_cuk_sample_row) * (size_t)c));
    DI_CU(cudaMallocHost((void **)&b->h_sample_out, 2 * sizeof(int32_t) * (size_t)c));
    if (old_h) {
      for (int half = 0; half < 2; half++)
        memcpy(b->h_sample_out + (size_t)half * c, old_h + (size_t)half * old_cap, sizeof(int32_t) * (size_t)old_cap);
      cudaFreeHost(old_h);
    }
    b->cap_out = c;
  }
  if (n_parts > b->cap_parts) {
    int c = b->cap_parts ? b->cap_parts : 512;
    while (c < n_parts) c *= 2;
    drop_graphs(b);
    b->cap_parts = c;
    REALLOC(b->part_o, sizeof(float) * (size_t)c * DI_CUK_ATTN_ROWS * DI_CUK_MLA_R);
    REALLOC(b->part_lse, sizeof(float) * (size_t)c * DI_CUK_ATTN_ROWS);
  }
  return DI_OK;
}

/* ---- the forward pass ---------------------------------------------------------------------------- */

static bf16 *layer_cache(cu_backend *b, int l) {
  return b->kv + (size_t)l * (size_t)(b->n_blocks + 1) * DI_KV_BLOCK_SIZE * DI_CUK_MLA_D;
}

static di_status mlp_dense(cu_backend *b, int T, const bf16 *gate_up, const bf16 *down, int I) {
  cudaStream_t s = b->stream;
  DI_TRY(di_cu_gemm(b->blas, T, 2 * I, b->H, (const uint16_t *)b->xn, b->Hp, (const uint16_t *)gate_up, b->H,
                    b->gu, 2 * I, 0, 0.f, s));
  DI_TRY(di_cuk_silu_mul((const uint16_t *)b->gu, T, I, (uint16_t *)b->act, s));
  DI_TRY(di_cu_gemm(b->blas, T, b->H, I, (const uint16_t *)b->act, I, (const uint16_t *)down, I, b->h, b->H, 1,
                    1.f, s));
  return DI_OK;
}

#define PROF(label) prof_mark(b, label)

static void prof_mark(cu_backend *b, const char *label) {
  if (!b->prof || b->n_marks >= MAX_MARKS) return;
  cudaEventRecord(b->marks[b->n_marks], b->stream);
  b->mark_label[b->n_marks++] = label;
}

/* One decoder layer on b->h (T rows): main layer l, or the MTP layer (l = n_layers + i). *xn_ready_io:
 * in, the previous layer's MoE combine already wrote this layer's normed input to xn; out, the same
 * for the layer after it. normed_gemm: decode-sized steps norm inside the q/kv GEMM (see forward). */
static di_status layer_step(cu_backend *b, int l, int *xn_ready_io, int normed_gemm) {
  cudaStream_t s = b->stream;
  const int T = b->Tp, H = b->H, Hp = b->Hp, NH = b->NH;
  const uint16_t *xn = (const uint16_t *)b->xn;
  int xn_ready = *xn_ready_io;
  const cu_layer *L = &b->L[l];
  if (!xn_ready && normed_gemm) { /* decode: the attention norm inside the q/kv GEMM */
    if (!SKIP(SKIP_QKV))
      DI_TRY(di_cu_gemm_normed(b->blas, T, b->Wa, H, b->h, H, L->attn_norm, b->eps, (const uint16_t *)L->qkv_a, H,
                               b->qkv, b->Wa, 0, s));
  } else {
    if (!xn_ready) DI_TRY(di_cuk_rmsnorm(b->h, H, L->attn_norm, T, H, b->eps, (uint16_t *)b->xn, Hp, NULL, s));
    PROF("norm");
    if (!SKIP(SKIP_QKV))
      DI_TRY(di_cu_gemm(b->blas, T, b->Wa, H, xn, Hp, (const uint16_t *)L->qkv_a, H, b->qkv, b->Wa, 0, 0.f, s));
  }
  xn_ready = 0;
  const uint16_t *q, *kva;
  int ldq;
  if (b->qr > 0) {
    DI_TRY(di_cuk_rmsnorm_bf16((const uint16_t *)b->qkv, b->Wa, L->q_a_norm, T, b->qr, b->eps, (uint16_t *)b->qa_n,
                               b->qr, s));
    DI_TRY(di_cu_gemm(b->blas, T, NH * b->dqk, b->qr, (const uint16_t *)b->qa_n, b->qr, (const uint16_t *)L->q_b,
                      b->qr, b->q, NH * b->dqk, 0, 0.f, s));
    q = (const uint16_t *)b->q;
    ldq = NH * b->dqk;
    kva = (const uint16_t *)b->qkv + b->qr;
  } else {
    q = (const uint16_t *)b->qkv;
    ldq = b->Wa;
    kva = (const uint16_t *)b->qkv + NH * b->dqk;
  }
  PROF("q/kv proj");
  bf16 *cache = layer_cache(b, l);
  const uint16_t *wuk = (const uint16_t *)L->kv_b; /* W_UK[h] = kv_b rows h*(dn+dv) .. +dn, [dn][R] */
  const int64_t wuk_stride = (int64_t)(b->dn + b->dv) * b->R;
  /* (bit-equal to the two kernels it replaces: test_mla_prep_absorb; so batch-invariant mode too) */
  if (!SKIP(SKIP_PREP) && !SKIP(SKIP_ABSORB) && di_cuk_mla_prep_absorb_ok(T, NH, b->R, wuk, b->R, wuk_stride)) {
    /* decode: both in one launch */
    DI_TRY(di_cuk_mla_prep_absorb(kva, b->Wa, q, ldq, b->d_pos, b->d_slots, T, NH, b->dn, b->dr, b->R, L->kv_a_norm,
                                  b->eps, b->rope, (uint16_t *)b->Qa, (uint16_t *)cache, wuk, b->R, wuk_stride, s));
  } else {
    if (!SKIP(SKIP_PREP))
      DI_TRY(di_cuk_mla_prep(kva, b->Wa, q, ldq, b->d_pos, b->d_slots, T, NH, b->dn, b->dr, b->R, L->kv_a_norm, b->eps,
                           b->rope, (uint16_t *)b->Qa, (uint16_t *)cache, s));
    /* q_lat[t][h] = q_nope[t][h] . W_UK[h]  (W_UK[h] = kv_b rows h*(dn+dv) .. +dn, [dn][R]) */
    if (!SKIP(SKIP_ABSORB))
      DI_TRY(di_cu_gemm_batched(b->blas, NH, T, b->R, b->dn, q, ldq, b->dqk, (const uint16_t *)L->kv_b, b->R,
                              (int64_t)(b->dn + b->dv) * b->R, 1, (uint16_t *)b->Qa, NH * DI_CUK_MLA_D, DI_CUK_MLA_D, s));
  }
  PROF("mla prep+absorb");
  /* decode with one cluster per row group: W_UV applied in the attention kernel's epilogue */
  const int fold_uv = b->attn_cl && b->max_citems == 0 && di_cuk_uv_fold_ok(b->dv, b->R) && !SKIP(SKIP_VO) &&
                      b->fold_uv;
  const di_cuk_uv_fold fold = {(const uint16_t *)(L->kv_b + (int64_t)b->dn * b->R), (int64_t)(b->dn + b->dv) * b->R,
                               b->R, b->dv, NH * b->dv, (uint16_t *)b->attn};
  if (!SKIP(SKIP_ATTN) && b->attn_cl)
    DI_TRY(di_cuk_mla_attn_cluster((const uint16_t *)b->Qa, (const uint16_t *)cache, b->d_bt, b->bt_stride, b->d_pos,
                                   NH, b->base.cfg->softmax_scale, b->d_items, b->d_nitems, b->max_items,
                                   b->attn_cl, b->invariant, (uint16_t *)b->olat, b->part_o, b->part_lse,
                                   fold_uv ? &fold : NULL, s));
  else if (!SKIP(SKIP_ATTN))
    DI_TRY(di_cuk_mla_attn((const uint16_t *)b->Qa, (const uint16_t *)cache, b->d_bt, b->bt_stride, b->d_pos, NH,
                         b->base.cfg->softmax_scale, b->d_items, b->d_nitems, b->max_items, b->bm,
                         (uint16_t *)b->olat, b->part_o, b->part_lse, s));
  if (b->max_citems > 0 && !SKIP(SKIP_ATTN))
    DI_TRY(di_cuk_mla_combine(b->d_citems, b->d_ncitems, b->max_citems, b->part_o, b->part_lse,
                              (uint16_t *)b->olat, s));
  PROF("mla attention");
  /* v[t][h] = W_UV[h] . o_lat[t][h]  (W_UV[h] = kv_b rows h*(dn+dv)+dn .. +dv, [dv][R]), then o_proj into
   * h: at one token both in one kernel (DEEPINFER_CUDA_VO_FUSED=0: the two GEMMs) */
  const int vo_fused = b->vo_fused && !fold_uv && !SKIP(SKIP_VO) && di_cuk_mla_vo_ok(T, NH, H, b->R, b->dv);
  if (vo_fused)
    DI_TRY(di_cuk_mla_vo((const uint16_t *)b->olat, DI_CUK_MLA_R, (const uint16_t *)(L->kv_b + (int64_t)b->dn * b->R),
                         (int64_t)(b->dn + b->dv) * b->R, b->R, b->dv, (const uint16_t *)L->o_proj, NH * b->dv, NH, H,
                         b->h, s));
  if (!SKIP(SKIP_VO) && !fold_uv && !vo_fused)
    DI_TRY(di_cu_gemm_batched(b->blas, NH, T, b->dv, b->R, (const uint16_t *)b->olat, NH * DI_CUK_MLA_R,
                            DI_CUK_MLA_R, (const uint16_t *)(L->kv_b + (int64_t)b->dn * b->R), b->R,
                            (int64_t)(b->dn + b->dv) * b->R, 0, (uint16_t *)b->attn, NH * b->dv, b->dv, s));
  if (!SKIP(SKIP_VO) && !vo_fused)
    DI_TRY(di_cu_gemm(b->blas, T, H, NH * b->dv, (const uint16_t *)b->attn, NH * b->dv, (const uint16_t *)L->o_proj,
                    NH * b->dv, b->h, H, 1, 1.f, s));
  PROF("v + o_proj");
  /* small steps: the MoE gate's norm, router logits and routing are one kernel (di_cuk_moe_gate) */
  /* (xn, logits, ids and weights bit-equal to the unfused kernels: test_moe_gate; so batch-invariant mode too) */
  const int fused_gate = L->is_moe && T <= GATE_FUSE_MAX_T && di_cuk_moe_gate_supported(b->E, H);
  if (!fused_gate)
    DI_TRY(di_cuk_rmsnorm(b->h, H, L->ffn_norm, T, H, b->eps, (uint16_t *)b->xn, Hp, L->is_moe ? b->xf : NULL, s));
  if (!L->is_moe) {
    DI_TRY(mlp_dense(b, T, L->gate_up, L->down, b->Idense));
    PROF("dense mlp");
    *xn_ready_io = 0;
    return DI_OK;
  }
  const int E = b->E, Et = b->Et, Kt = b->Kt, A = T * Kt, bm = A >= 32 * Et ? 64 : 16;
  int max_tiles = (A + bm - 1) / bm + Et;
  if (max_tiles > A) max_tiles = A;
  const di_cuk_perm pm = {bm, b->perm_tok, b->inv, b->expert_off, b->tiles, b->n_tiles};
  if (SKIP(SKIP_GATE)) {
  } else if (fused_gate) {
    DI_TRY(di_cuk_moe_gate(b->h, L->ffn_norm, b->eps, T, H, (const uint16_t *)L->router, L->router_bias, b->router,
                           (uint16_t *)b->xn, Hp, b->router_logits, b->topk_ids, b->topk_w, &pm, s));
  } else {
    DI_TRY(di_cuk_router_logits(b->xf, (const uint16_t *)L->router, T, E, H, b->router_logits, s));
    DI_TRY(di_cuk_moe_route(b->router_logits, L->router_bias, T, b->router, b->topk_ids, b->topk_w, &pm, s));
  }
  if (T > 1 && !SKIP(SKIP_GATE))
    DI_TRY(di_cuk_moe_permute(b->topk_ids, A, Kt, Et, bm, b->perm_tok, b->inv, b->expert_off, b->tiles, b->n_tiles, s));
  PROF("router");
  const int down_combine =
      normed_gemm && T == 1 && !b->invariant && !(L->has_shared && b->n_sh == 0) && !SKIP(SKIP_EXPERTS);
  /* decode: an expert has at most T rows, weight streaming as a GEMV; batch-invariant mode: always (a
   * row's arithmetic there does not depend on the rows beside it, up to GEMV_MAX_T at a time) */
  if (T <= GEMV_MAX_T || b->invariant) {
    const int gv_rows = T < GEMV_MAX_T ? T : GEMV_MAX_T;
    const int pf0 = T == 1 && L->has_shared && b->n_sh > 0 ? Kt - b->n_sh : -1; /* shared experts: last tiles */
    if (!SKIP(SKIP_EXPERTS)) {
      DI_TRY(di_cuk_grouped_gemv(xn, Hp, b->perm_tok, (const uint16_t *)L->exp_gu, 2 * b->Ip, Hp, b->expert_off,
                                 b->tiles, b->n_tiles, max_tiles, bm, gv_rows, b->act, b->Ip, 0, 1, pf0, E, s));
      PROF("experts gate/up");
      if (down_combine)
        DI_TRY(di_cuk_moe_down_combine((const uint16_t *)b->act, b->Ip, (const uint16_t *)L->exp_down, Hp, b->Ip,
                                       b->topk_ids, b->topk_w, b->inv, Kt, b->h, H, E, pf0 >= 0 ? b->n_sh : 0, s));
      else
        DI_TRY(di_cuk_grouped_gemv((const uint16_t *)b->act, b->Ip, NULL, (const uint16_t *)L->exp_down, Hp, b->Ip,
                                   b->expert_off, b->tiles, b->n_tiles, max_tiles, bm, gv_rows, b->y, Hp, 1, 0, pf0, E,
                                   s));
    }
  } else {
    DI_TRY(di_cuk_grouped_gemm(xn, Hp, b->perm_tok, (const uint16_t *)L->exp_gu, 2 * b->Ip, Hp, b->expert_off,
                               b->tiles, b->n_tiles, max_tiles, bm, b->act, b->Ip, 0, 1, s));
    PROF("experts gate/up");
    DI_TRY(di_cuk_grouped_gemm((const uint16_t *)b->act, b->Ip, NULL, (const uint16_t *)L->exp_down, Hp, b->Ip,
                               b->expert_off, b->tiles, b->n_tiles, max_tiles, bm, b->y, Hp, 1, 0, s));
  }
  PROF("experts down");
  if (L->has_shared && b->n_sh == 0) DI_TRY(mlp_dense(b, T, L->sh_gu, L->sh_down, b->Ish));
  const int fuse = l + 1 < b->n_layers && !(L->has_shared && b->n_sh == 0) && !normed_gemm;
  if (!SKIP(SKIP_COMBINE) && !down_combine)
    DI_TRY(di_cuk_moe_combine(b->y, Hp, b->inv, b->topk_w, T, Kt, H, b->h, fuse ? b->L[l + 1].attn_norm : NULL,
                            b->eps, (uint16_t *)b->xn, Hp, s));
  *xn_ready_io = fuse;
  PROF("combine");
  return DI_OK;
}

static di_status forward(cu_backend *b) {
  cudaStream_t s = b->stream;
  const int T = b->Tp, H = b->H;
  b->n_marks = 0;
  PROF("start");
  DI_TRY(di_cuk_embed((const uint16_t *)b->embed, b->d_tokens, b->d_sample_out, T, H, b->h, s));
  int xn_ready = 0; /* the MoE combine already wrote this layer's normed input */
  /* decode-sized steps: each layer's attention norm is done by its q/kv GEMM, and a one-token step's
   * MoE down projection adds the weighted expert outputs to h itself (DEEPINFER_CUDA_DOWN_COMBINE=0:
   * the separate combine kernel, which then also writes the next layer's normed input) */
  const int normed_gemm = b->down_combine && di_cu_gemm_normed_ok(b->blas, T, H, H);
  for (int l = 0; l < b->n_layers; l++) DI_TRY(layer_step(b, l, &xn_ready, normed_gemm));
  DI_TRY(di_cuk_rmsnorm_rows(b->h, H, b->d_out_rows, b->final_norm, b->n_out_p, H, b->eps, (uint16_t *)b->hn, H, s));
  if (!SKIP(SKIP_LMHEAD))
    DI_TRY(di_cu_gemm(b->blas, b->n_out_p, b->V, H, (const uint16_t *)b->hn, H, (const uint16_t *)b->lm_head, H,
                    b->logits, b->V, 1, 0.f, s));
  PROF("lm_head");
  if (b->step_sample) DI_TRY(di_cuk_sample(b->logits, b->n_out_p, b->V, b->d_step_rows, b->d_sample_out, s));
  return DI_OK;
}

/* ---- step preparation ---------------------------------------------------------------------------- */

static int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

static di_status ensure_inputs(cu_backend *b, size_t n) {
  if (n <= b->in_cap) return DI_OK;
  size_t c = b->in_cap ? b->in_cap : ((size_t)1 << 20);
  while (c < n) c *= 2;
  drop_graphs(b);
  cudaFreeHost(b->in_host);
  b->in_host = NULL;
  dev_free(b, b->in_dev);
  b->in_dev = NULL;
  DI_CU(cudaMallocHost((void **)&b->in_host, c * sizeof(int32_t)));
  DI_TRY(dev_alloc(b, (void **)&b->in_dev, c * sizeof(int32_t)));
  b->in_cap = c;
  return DI_OK;
}

/* the sample kernel's row of an engine sample row */
static di_cuk_sample_row cuk_row(const di_sample_row *r) {
  return (di_cuk_sample_row){r->temperature, r->top_p, r->min_p, r->top_k, r->vocab_limit, r->seed, r->counter};
}

static di_status prepare(cu_backend *b, const di_batch *bt) {
  const int T = bt->n_tokens, NH = b->NH;
  /* the pinned input block is rewritten below: the previous step's upload must have run (with token
   * feedback that step may still be queued) */
  if (b->h2d_recorded) DI_CU(cudaEventSynchronize(b->ev_h2d));
  if (T <= 0) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: empty batch");
  if (bt->n_outputs < 0 || bt->n_outputs > T)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: %d outputs for %d tokens", bt->n_outputs, T);
  if (!b->kv) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: submit before kv_alloc");
  const int graph = b->use_graphs && T <= DI_CUDA_GRAPH_MAX_T;
  const int Tp = graph ? pow2_at_least(T) : T;
  const int n_out = bt->n_outputs, n_out_p = graph ? pow2_at_least(n_out > 0 ? n_out : 1) : (n_out > 0 ? n_out : 1);
  int max_blocks = 1;
  for (int t = 0; t < T; t++) {
    int sq = bt->seq_of[t], pos = bt->positions[t];
    if (sq < 0 || sq >= bt->n_seqs) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: token %d: sequence %d of %d", t, sq, bt->n_seqs);
    if (bt->tokens[t] >= b->V || (bt->tokens[t] < 0 && -1 - bt->tokens[t] >= b->fb_n))
      return di_error_set(DI_ERR_INVALID_ARG, bt->tokens[t] < 0 ? "token id %d: no sampled row %d to take it from" :
                          "token id %d out of range [0, %d)", bt->tokens[t], bt->tokens[t] < 0 ? -1 - bt->tokens[t] : b->V);
    if (pos < 0 || pos / DI_KV_BLOCK_SIZE >= bt->seqs[sq].n_blocks)
      return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: token %d: position %d beyond its %d blocks", t, pos, bt->seqs[sq].n_blocks);
    if (pos / DI_KV_BLOCK_SIZE + 1 > max_blocks) max_blocks = pos / DI_KV_BLOCK_SIZE + 1;
  }
  for (int i = 0; i < n_out; i++)
    if (bt->output_rows[i] < 0 || bt->output_rows[i] >= T)
      return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: output row %d out of range", bt->output_rows[i]);
  const int bt_stride = pow2_at_least(max_blocks);

  /* attention chunks: runs of consecutive tokens of one sequence, cut into rows of bm; padding
   * tokens form their own run (the spare sequence T_p, position 0) */
  const int rows_total = Tp * NH;
  int n_runs = 0;
  for (int t = 0; t < T; t++)
    if (t == 0 || bt->seq_of[t] != bt->seq_of[t - 1]) n_runs++;
  if (Tp > T) n_runs++;
  const int bm = rows_total / n_runs >= 64 && !b->invariant ? 64 : 16;
  /* count chunks */
  int n_chunks = 0;
  for (int t = 0; t < Tp;) {
    int u = t + 1;
    while (u < Tp && (t >= T ? 1 : (u < T && bt->seq_of[u] == bt->seq_of[t]))) u++;
    n_chunks += (((u - t) * NH) + bm - 1) / bm;
    t = u;
  }
  const int target = 2 * b->sms;
  /* batch-invariant mode: no key splits (a split's boundaries would follow the batch's longest row of
   * the item; one pass over keys 0.. in fixed tiles gives every row the same sums, the tiles past its
   * own position being exact no-ops of the online softmax) */
  int S_max = n_chunks >= target || b->invariant ? 1 : (target + n_chunks - 1) / n_chunks;
  const int KS = b->split_keys;
  int tiles_cap = (bt_stride * DI_KV_BLOCK_SIZE + KS - 1) / KS;
  if (S_max > tiles_cap) S_max = tiles_cap;
  /* decode of few sequences (<= 2 x SMs / cluster size of them): the cluster form (splits merged inside
   * a cluster of CTAs, k_mla_decode.cu), one cluster per row group up to CL_TILES key tiles of 64 per
   * CTA (contexts <= 2048 keys with clusters of 16, 1024 with 8), so short contexts need no combine
   * kernel in the graph; longer ones take more clusters, merged by mla_combine */
  const int CL = b->attn_cluster, CL_TILES = 2;
  /* batch-invariant mode: every step in this form, one cluster per row group, key tiles dealt to its
   * CTAs round-robin (the strided form of di_cuk_mla_attn_cluster) */
  const int cluster = CL > 0 && bm == 16 && (n_chunks * CL <= target || b->invariant);
  int C_max = 1;
  if (cluster && !b->invariant) {
    const int ktiles_cap = (bt_stride * DI_KV_BLOCK_SIZE + DI_CUK_DECODE_KTILE - 1) / DI_CUK_DECODE_KTILE;
    C_max = (ktiles_cap + CL * CL_TILES - 1) / (CL * CL_TILES);
    const int c_fit = target / (CL * n_chunks);
    if (C_max > c_fit) C_max = c_fit > 1 ? c_fit : 1;
  }
  if (cluster) S_max = C_max; /* partial slots: one per cluster */
  const int max_items = cluster ? n_chunks * C_max * CL : n_chunks * S_max, max_citems = S_max > 1 ? n_chunks : 0;
  DI_TRY(ensure_acts(b, Tp, n_out_p, max_items));

  /* layout of the input block (int32 units); the last block-table row is the padding tokens' */
  const int n_seq_rows = (bt->n_seqs > Tp ? bt->n_seqs : Tp) + 1, spare_seq = n_seq_rows - 1;
  size_t o = 0;
  const size_t o_tok = o; o += Tp;
  const size_t o_pos = o; o += Tp;
  const size_t o_slot = o; o += Tp;
  const size_t o_out = o; o += n_out_p;
  const size_t o_bt = o; o += (size_t)n_seq_rows * bt_stride;
  const size_t o_n = o; o += 4;
  o = (o + 3) & ~(size_t)3;
  const size_t o_items = o; o += (size_t)max_items * (sizeof(di_cuk_attn_item) / sizeof(int32_t));
  const size_t o_citems = o; o += (size_t)(max_citems > 0 ? max_citems : 1) * 4;
  o = (o + 1) & ~(size_t)1; /* 8-byte fields */
  const size_t o_srows = o; o += (size_t)n_out_p * (sizeof(di_cuk_sample_row) / sizeof(int32_t));
  DI_TRY(ensure_inputs(b, o));
  int32_t *hi = b->in_host;
  const int32_t spare = (int32_t)b->n_blocks;
  for (int t = 0; t < Tp; t++) {
    if (t < T) {
      const di_batch_seq *sq = &bt->seqs[bt->seq_of[t]];
      int pos = bt->positions[t];
      hi[o_tok + t] = bt->tokens[t];
      hi[o_pos + t] = pos;
      hi[o_slot + t] = sq->block_table[pos / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + pos % DI_KV_BLOCK_SIZE;
    } else {
      hi[o_tok + t] = 0;
      hi[o_pos + t] = 0;
      hi[o_slot + t] = spare * DI_KV_BLOCK_SIZE;
    }
  }
  for (int i = 0; i < n_out_p; i++) hi[o_out + i] = i < n_out ? bt->output_rows[i] : 0;
  b->step_sample = bt->sample_rows && b->step_sample_on && n_out > 0;
  if (b->step_sample) {
    di_cuk_sample_row *sr = (di_cuk_sample_row *)(hi + o_srows);
    for (int i = 0; i < n_out_p; i++) {
      const di_sample_row *r = &bt->sample_rows[i < n_out ? i : 0];
      sr[i] = cuk_row(r);
      if (i >= n_out) sr[i].temperature = 0.f; /* padding rows: greedy, ignored */
    }
    memcpy(b->sub_rows, bt->sample_rows, sizeof(di_sample_row) * (size_t)n_out);
  }
  for (int sidx = 0; sidx < n_seq_rows; sidx++) {
    int32_t *row = hi + o_bt + (size_t)sidx * bt_stride;
    int nb = 0;
    if (sidx < bt->n_seqs) {
      nb = bt->seqs[sidx].n_blocks < bt_stride ? bt->seqs[sidx].n_blocks : bt_stride;
      for (int j = 0; j < nb; j++) {
        int32_t id = bt->seqs[sidx].block_table[j];
        if (id < 0 || id >= b->n_blocks)
          return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: block id %d out of range [0, %lld)", id, (long long)b->n_blocks);
        row[j] = id;
      }
    }
    for (int j = nb; j < bt_stride; j++) row[j] = spare;
  }
  /* items */
  di_cuk_attn_item *items = (di_cuk_attn_item *)(hi + o_items);
  di_cuk_combine_item *citems = (di_cuk_combine_item *)(hi + o_citems);
  int ni = 0, nci = 0, part = 0;
  for (int t = 0; t < Tp;) {
    int u = t + 1;
    while (u < Tp && (t >= T ? 1 : (u < T && bt->seq_of[u] == bt->seq_of[t]))) u++;
    const int seq = t >= T ? spare_seq : bt->seq_of[t];
    int kfresh = t < T ? bt->positions[t] : 0; /* the sequence's smallest position in this step */
    for (int tt = t + 1; tt < u && tt < T; tt++)
      if (bt->positions[tt] < kfresh) kfresh = bt->positions[tt];
    for (int r0 = t * NH; r0 < u * NH; r0 += bm) {
      int r1 = r0 + bm < u * NH ? r0 + bm : u * NH;
      int maxpos = 0;
      for (int tt = r0 / NH; tt <= (r1 - 1) / NH; tt++) {
        int p = tt < T ? bt->positions[tt] : 0;
        if (p > maxpos) maxpos = p;
      }
      if (cluster) {
        const int nkt = (maxpos + DI_CUK_DECODE_KTILE) / DI_CUK_DECODE_KTILE;
        int nc = (nkt + CL * CL_TILES - 1) / (CL * CL_TILES);
        if (nc > C_max) nc = C_max;
        ni += di_cuk_attn_cluster_items(r0, r1, seq, maxpos + 1, kfresh, CL, nc, b->invariant, &part, items + ni, citems,
                                        &nci);
        continue;
      }
      const int nkt = (maxpos + KS) / KS;
      /* at least attn_min_split x split_keys keys per split (DEEPINFER_CUDA_ATTN_MIN_SPLIT, default
       * 1; DEEPINFER_CUDA_ATTN_SPLIT_KEYS, default DI_CUK_ATTN_KTILE = 32): a split's work is a
       * latency-bound chain of key tiles, so at decode more, shorter splits finish sooner (measured:
       * 2 x 64 keys per split was 5% slower per token than 1 x 64 at a 600-token context) */
      const int s_len = (nkt + b->attn_min_split - 1) / b->attn_min_split;
      int S = S_max < s_len ? S_max : s_len;
      const int per = (nkt + S - 1) / S;
      S = (nkt + per - 1) / per;
      if (S == 1) {
        items[ni++] = (di_cuk_attn_item){r0, r1, seq, 0, maxpos + 1, -1, kfresh};
      } else {
        citems[nci++] = (di_cuk_combine_item){r0, r1, part, S};
        for (int sp = 0; sp < S; sp++) {
          int k0 = sp * per * KS, k1 = (sp + 1) * per * KS;
          if (k1 > maxpos + 1) k1 = maxpos + 1;
          items[ni++] = (di_cuk_attn_item){r0, r1, seq, k0, k1, part++, kfresh};
        }
      }
    }
    t = u;
  }
  DI_ASSERT(ni <= max_items && nci <= (max_citems > 0 ? max_citems : 0) + 0);
  hi[o_n] = ni;
  hi[o_n + 1] = nci;
  int32_t *d = b->in_dev;
  b->d_tokens = d + o_tok; b->d_pos = d + o_pos; b->d_slots = d + o_slot; b->d_out_rows = d + o_out;
  b->d_bt = d + o_bt; b->d_nitems = d + o_n; b->d_ncitems = d + o_n + 1;
  b->d_items = (di_cuk_attn_item *)(d + o_items);
  b->d_step_rows = (di_cuk_sample_row *)(d + o_srows);
  b->d_citems = (di_cuk_combine_item *)(d + o_citems);
  b->T = T; b->Tp = Tp; b->n_out = n_out; b->n_out_p = n_out_p; b->bt_stride = bt_stride;
  b->max_items = max_items; b->max_citems = max_citems; b->bm = bm; b->attn_cl = cluster ? CL : 0; b->in_used = o;
  b->n_seq_rows = n_seq_rows;
  return DI_OK;
}

/* ---- vtable ---------------------------------------------------------------------------------------- */

static int cu_kv_groups(di_backend *bb, di_kv_group_info *g, int cap) {
  cu_backend *b = (cu_backend *)bb;
  if (cap < 1) return 1;
  g[0].n_layers = b->n_layers + b->n_mtp;
  g[0].bytes_per_token = (int64_t)(b->n_layers + b->n_mtp) * DI_CUK_MLA_D * 2;
  g[0].tokens_per_entry = 1;
  g[0].window = 0;
  return 1;
}

static di_status cu_kv_alloc(di_backend *bb, int64_t n_blocks) {
  cu_backend *b = (cu_backend *)bb;
  if (n_blocks <= 0) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: kv_alloc of %lld blocks", (long long)n_blocks);
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: kv_alloc while a step is in flight");
  drop_graphs(b);
  dev_free(b, b->kv);
  b->kv = NULL;
  size_t bytes = (size_t)(b->n_layers + b->n_mtp) * (size_t)(n_blocks + 1) * DI_KV_BLOCK_SIZE * DI_CUK_MLA_D * 2;
  DI_TRY(dev_alloc(b, (void **)&b->kv, bytes));
  DI_CU(cudaMemset(b->kv, 0, bytes));
  b->n_blocks = n_blocks;
  return DI_OK;
}

/* gpu_memory_utilization's inputs (backend.h): the largest step's activation and output buffers are
 * reserved first (they then count as used), then the device's total and in-use bytes are read. The
 * attention's partial-result slots and the CUDA graphs grow later; the (1 - utilization) headroom
 * covers them. A pool left by an earlier engine is not counted: the new engine's kv_alloc replaces it. */
static di_status cu_memory_info(di_backend *bb, int max_step_tokens, int max_outputs, int64_t *total_bytes,
                                int64_t *used_bytes) {
  cu_backend *b = (cu_backend *)bb;
  DI_TRY(ensure_acts(b, max_step_tokens > 256 ? max_step_tokens : 256, max_outputs > 16 ? max_outputs : 16, 512));
  DI_CU(cudaDeviceSynchronize());
  size_t free_b = 0, total_b = 0;
  DI_CU(cudaMemGetInfo(&free_b, &total_b));
  /* a KV pool from an earlier engine over this backend is about to be replaced (kv_alloc frees it
   * first): it does not count as used */
  const size_t pool = b->kv ? (size_t)(b->n_layers + b->n_mtp) * (size_t)(b->n_blocks + 1) * DI_KV_BLOCK_SIZE * DI_CUK_MLA_D * 2 : 0;
  *total_bytes = (int64_t)total_b;
  *used_bytes = (int64_t)(total_b - free_b) - (int64_t)pool;
  return DI_OK;
}

static graph_entry *find_graph(cu_backend *b) {
  for (int i = 0; i < b->n_graphs; i++) {
    graph_entry *g = &b->graphs[i];
    if (g->T == b->Tp && g->n_out == b->n_out_p && g->bt_stride == b->bt_stride && g->max_items == b->max_items &&
        g->max_citems == b->max_citems && g->bm == b->bm && g->attn_cl == b->attn_cl && g->n_seq_rows == b->n_seq_rows &&
        g->step_sample == b->step_sample)
      return g;
  }
  if (b->n_graphs == MAX_GRAPHS) drop_graphs(b);
  graph_entry *g = &b->graphs[b->n_graphs++];
  memset(g, 0, sizeof *g);
  g->T = b->Tp; g->n_out = b->n_out_p; g->bt_stride = b->bt_stride; g->max_items = b->max_items;
  g->max_citems = b->max_citems; g->bm = b->bm; g->attn_cl = b->attn_cl; g->n_seq_rows = b->n_seq_rows;
  g->step_sample = b->step_sample;
  return g;
}

/* the device's sampled tokens of the last step to the host (the next half of h_sample_out) */
static di_status queue_tokens(cu_backend *b, int n) {
  b->tok_par ^= 1;
  DI_CU(cudaMemcpyAsync(b->h_sample_out + (size_t)b->tok_par * b->cap_out, b->d_sample_out, sizeof(int32_t) * (size_t)n,
                        cudaMemcpyDeviceToHost, b->stream));
  DI_CU(cudaEventRecord(b->ev_sampled[b->tok_par], b->stream));
  return DI_OK;
}

/* a step is on the stream: when it samples in-step, its tokens' copy to the host goes right behind it */
static di_status step_queued(cu_backend *b) {
  b->pending = 1;
  b->tok_queued = b->step_sample;
  if (b->step_sample) DI_TRY(queue_tokens(b, b->n_out));
  return DI_OK;
}

static di_status cu_submit(di_backend *bb, const di_batch *batch) {
  cu_backend *b = (cu_backend *)bb;
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: submit while a step is in flight");
  DI_TRY(prepare(b, batch));
  DI_CU(cudaMemcpyAsync(b->in_dev, b->in_host, b->in_used * sizeof(int32_t), cudaMemcpyHostToDevice, b->stream));
  DI_CU(cudaEventRecord(b->ev_h2d, b->stream));
  b->h2d_recorded = 1;
  b->stats.steps++;
  const int graph = b->use_graphs && b->T <= DI_CUDA_GRAPH_MAX_T;
  if (!graph) {
    DI_TRY(forward(b));
    return step_queued(b);
  }
  graph_entry *g = find_graph(b);
  if (!g->exec && g->seen < 1) { /* first sight: eager (sets kernel attributes, plans GEMMs) */
    g->seen++;
    DI_TRY(forward(b));
    return step_queued(b);
  }
  if (!g->exec) {
    cudaGraph_t graph_h = NULL;
    DI_CU(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
    di_status st = forward(b);
    cudaError_t e = cudaStreamEndCapture(b->stream, &graph_h);
    if (st != DI_OK) { if (graph_h) cudaGraphDestroy(graph_h); return st; }
    if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda: graph capture failed: %s", cudaGetErrorString(e));
    e = cudaGraphInstantiate(&g->exec, graph_h, 0);
    cudaGraphDestroy(graph_h);
    if (e != cudaSuccess) { g->exec = NULL; return di_error_set(DI_ERR_BACKEND, "cuda: graph instantiate failed: %s", cudaGetErrorString(e)); }
    b->stats.graph_captures++;
  }
  if (b->gpu_time) DI_CU(cudaEventRecord(b->ev_g0, b->stream));
  DI_CU(cudaGraphLaunch(g->exec, b->stream));
  if (b->gpu_time) DI_CU(cudaEventRecord(b->ev_g1, b->stream));
  b->timing = b->gpu_time;
  b->stats.graph_replays++;
  return step_queued(b);
}

static di_status cu_wait(di_backend *bb, float *logits, float *hidden) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: wait without submit");
  b->pending = 0;
  DI_CU(cudaStreamSynchronize(b->stream));
  if (b->timing) {
    float ms = 0;
    DI_CU(cudaEventElapsedTime(&ms, b->ev_g0, b->ev_g1));
    b->stats.graph_ms += ms;
    b->stats.timed_replays++;
    b->timing = 0;
  }
  if (b->prof && b->n_marks > 1 && b->T <= DI_CUDA_GRAPH_MAX_T) { /* decode-sized steps only */
    b->prof_steps++;
    for (int i = 1; i < b->n_marks; i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, b->marks[i - 1], b->marks[i]);
      int k = 0;
      while (k < b->n_plabel && strcmp(b->plabel[k], b->mark_label[i])) k++;
      if (k == b->n_plabel && k < 64) b->plabel[b->n_plabel++] = b->mark_label[i];
      if (k < 64) b->ptime[k] += ms;
    }
  }
  if (logits && b->n_out > 0)
    DI_CU(cudaMemcpy(logits, b->logits, sizeof(float) * (size_t)b->n_out * b->V, cudaMemcpyDeviceToHost));
  if (hidden && b->n_out > 0) {
    size_t n = (size_t)b->n_out * b->H;
    uint16_t *tmp = (uint16_t *)malloc(n * 2);
    if (!tmp) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
    cudaError_t e = cudaMemcpy(tmp, b->hn, n * 2, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) { free(tmp); return di_error_set(DI_ERR_BACKEND, "cuda: hidden copy: %s", cudaGetErrorString(e)); }
    for (size_t i = 0; i < n; i++) hidden[i] = di_bf16_to_f32(tmp[i]);
    free(tmp);
  }
  return DI_OK;
}

/* The step sampled these rows already: the rows submitted with it equal them (a greedy row's seed and
 * counter do not matter). */
static int sampled_in_step(const cu_backend *b, const di_sample_row *rows, int n) {
  if (!b->step_sample || n != b->n_out) return 0;
  for (int i = 0; i < n; i++) {
    const di_sample_row *a = &rows[i], *c = &b->sub_rows[i];
    const int greedy = !(a->temperature > 0.f) || a->top_k == 1;
    if (a->temperature != c->temperature || a->top_k != c->top_k || a->vocab_limit != c->vocab_limit) return 0;
    if (!greedy && (a->top_p != c->top_p || a->min_p != c->min_p || a->seed != c->seed || a->counter != c->counter))
      return 0;
  }
  return 1;
}

/* the sample kernel's work of cu_sample / cu_sample_async where the step did not do it */
static di_status sample_rows_now(cu_backend *b, const di_sample_row *rows, int n) {
  for (int i = 0; i < n; i++) b->h_sample_rows[i] = cuk_row(&rows[i]);
  DI_CU(cudaMemcpyAsync(b->d_sample_rows, b->h_sample_rows, sizeof(di_cuk_sample_row) * (size_t)n,
                        cudaMemcpyHostToDevice, b->stream));
  DI_TRY(di_cuk_sample(b->logits, n, b->V, b->d_sample_rows, b->d_sample_out, b->stream));
  b->stats.resamples++;
  return DI_OK;
}

/* the tokens of the submitted step on their way to the host: sampled again where its rows differ */
static di_status tokens_for(cu_backend *b, const di_sample_row *rows, int n) {
  const int in_step = sampled_in_step(b, rows, n);
  if (in_step && b->tok_queued) return DI_OK;
  if (!in_step) DI_TRY(sample_rows_now(b, rows, n));
  b->tok_queued = 0;
  return queue_tokens(b, n);
}

static di_status cu_sample(di_backend *bb, const di_sample_row *rows, int n, int32_t *tokens) {
  cu_backend *b = (cu_backend *)bb;
  if (n != b->n_out) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample of %d rows after a step with %d outputs", n, b->n_out);
  DI_TRY(tokens_for(b, rows, n));
  DI_CU(cudaEventSynchronize(b->ev_sampled[b->tok_par]));
  memcpy(tokens, b->h_sample_out + (size_t)b->tok_par * b->cap_out, sizeof(int32_t) * (size_t)n);
  return DI_OK;
}

/* The MTP layer (DeepSeek-V3's multi-token prediction module) for speculative decoding, as the CPU
 * backend's di_cpu_deepseek_mtp_forward: x = eh_proj([enorm(embed(token)) | hnorm(prev_hidden)]), one
 * decoder layer (its KV entries in the pool at layer n_layers), then shared_head's norm and head for
 * the output rows; hidden_out gets the layer's output before that norm. Eager (no graph), synchronous. */
static di_status cu_mtp(di_backend *bb, const di_batch *batch, const float *prev_hidden, float *logits,
                        float *hidden_out) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->n_mtp) return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: the MTP layer is not loaded");
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: mtp while a step is in flight");
  if (!prev_hidden) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: mtp without previous hidden states");
  DI_TRY(prepare(b, batch));
  cudaStream_t s = b->stream;
  const int T = b->T, Tp = b->Tp, H = b->H;
  if (Tp > b->mtp_cap) {
    REALLOC(b->mtp_prev, sizeof(float) * (size_t)Tp * H);
    REALLOC(b->mtp_cat, 2 * (size_t)Tp * 2 * H);
    b->mtp_cap = Tp;
  }
  DI_CU(cudaMemcpyAsync(b->in_dev, b->in_host, b->in_used * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  DI_CU(cudaMemsetAsync(b->mtp_prev, 0, sizeof(float) * (size_t)Tp * H, s)); /* padding rows */
  DI_CU(cudaMemcpyAsync(b->mtp_prev, prev_hidden, sizeof(float) * (size_t)T * H, cudaMemcpyHostToDevice, s));
  DI_TRY(di_cuk_embed((const uint16_t *)b->mtp_embed, b->d_tokens, b->d_sample_out, Tp, H, b->h, s));
  DI_TRY(di_cuk_rmsnorm(b->h, H, b->mtp_enorm, Tp, H, b->eps, (uint16_t *)b->mtp_cat, 2 * H, NULL, s));
  DI_TRY(di_cuk_rmsnorm(b->mtp_prev, H, b->mtp_hnorm, Tp, H, b->eps, (uint16_t *)b->mtp_cat + H, 2 * H, NULL, s));
  DI_TRY(di_cu_gemm(b->blas, Tp, H, 2 * H, (const uint16_t *)b->mtp_cat, 2 * H, (const uint16_t *)b->mtp_eh, 2 * H,
                    b->h, H, 1, 0.f, s));
  int xn_ready = 0;
  const int normed_gemm = b->down_combine && di_cu_gemm_normed_ok(b->blas, Tp, H, H);
  DI_TRY(layer_step(b, b->n_layers, &xn_ready, normed_gemm));
  DI_TRY(di_cuk_gather_f32(b->h, b->d_out_rows, b->n_out_p, H, b->hout, s));
  DI_TRY(di_cuk_rmsnorm(b->hout, H, b->mtp_head_norm, b->n_out_p, H, b->eps, (uint16_t *)b->hn, H, NULL, s));
  if (logits && b->n_out > 0)
    DI_TRY(di_cu_gemm(b->blas, b->n_out_p, b->V, H, (const uint16_t *)b->hn, H, (const uint16_t *)b->mtp_head, H,
                      b->logits, b->V, 1, 0.f, s));
  DI_CU(cudaStreamSynchronize(s));
  if (logits && b->n_out > 0)
    DI_CU(cudaMemcpy(logits, b->logits, sizeof(float) * (size_t)b->n_out * b->V, cudaMemcpyDeviceToHost));
  if (hidden_out && b->n_out > 0)
    DI_CU(cudaMemcpy(hidden_out, b->hout, sizeof(float) * (size_t)b->n_out * H, cudaMemcpyDeviceToHost));
  return DI_OK;
}

/* Device token feedback: cu_sample's work queued without waiting (the step then counts as finished for
 * submit(); its logits are not read), and the host copy of the tokens behind an event. The next
 * submit may name these tokens as -1 - row; embed_kernel reads them from d_sample_out, which the
 * stream orders before it. */
static di_status cu_sample_async(di_backend *bb, const di_sample_row *rows, int n) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample_async without a submitted step");
  if (n != b->n_out) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample of %d rows after a step with %d outputs", n, b->n_out);
  DI_TRY(tokens_for(b, rows, n));
  b->pending = 0;
  b->timing = 0;
  b->fb_n = n;
  b->fb_par = b->tok_par;
  b->fb_pending = 1;
  return DI_OK;
}

static di_status cu_sample_fetch(di_backend *bb, int32_t *tokens) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->fb_pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample_fetch without sample_async");
  DI_CU(cudaEventSynchronize(b->ev_sampled[b->fb_par]));
  memcpy(tokens, b->h_sample_out + (size_t)b->fb_par * b->cap_out, sizeof(int32_t) * (size_t)b->fb_n);
  b->fb_pending = 0;
  return DI_OK;
}

static void cu_destroy(di_backend *bb) {
  cu_backend *b = (cu_backend *)bb;
  if (!b) return;
  if (b->stream) cudaStreamSynchronize(b->stream);
  if (b->prof && b->prof_steps) {
    double tot = 0;
    for (int k = 0; k < b->n_plabel; k++) tot += b->ptime[k];
    fprintf(stderr, "cuda profile over %lld eager decode-sized steps (device time per phase, all layers):\n",
            (long long)b->prof_steps);
    for (int k = 0; k < b->n_plabel; k++)
      fprintf(stderr, "  %-18s %10.3f ms  %5.1f%%\n", b->plabel[k], b->ptime[k], 100.0 * b->ptime[k] / tot);
  }
  const char *sv = getenv("DEEPINFER_CUDA_STATS");
  if (sv && sv[0] == '1')
    fprintf(stderr, "cuda stats: steps %lld, graphs captured %lld, replays %lld, resamples %lld\n",
            (long long)b->stats.steps, (long long)b->stats.graph_captures, (long long)b->stats.graph_replays,
            (long long)b->stats.resamples);
  if (b->prof)
    for (int i = 0; i < MAX_MARKS; i++) if (b->marks[i]) cudaEventDestroy(b->marks[i]);
  if (b->ev_g0) cudaEventDestroy(b->ev_g0);
  for (int i = 0; i < 2; i++) if (b->ev_sampled[i]) cudaEventDestroy(b->ev_sampled[i]);
  if (b->ev_h2d) cudaEventDestroy(b->ev_h2d);
  if (b->ev_g1) cudaEventDestroy(b->ev_g1);
  drop_graphs(b);
  for (int i = 0; i < b->n_allocs; i++) cudaFree(b->allocs[i]);
  free(b->allocs);
  free(b->L);
  cudaFreeHost(b->in_host);
  cudaFreeHost(b->h_sample_rows);
  cudaFreeHost(b->h_sample_out);
  free(b->sub_rows);
  di_cu_blas_destroy(b->blas);
  if (b->stream) cudaStreamDestroy(b->stream);
  free(b);
}

static const di_backend_ops CU_OPS = {"cuda", cu_kv_groups, cu_kv_alloc, cu_submit, cu_wait, cu_sample, cu_mtp,
                                      NULL /* release */, cu_sample_async, cu_sample_fetch, cu_destroy,
                                      cu_memory_info};

static di_status create(const di_model_config *c, const di_ds_weights *w, cu_backend *b) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0)
    return di_error_set(DI_ERR_BACKEND, "cuda: no CUDA device available (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  int dev = 0;
  DI_CU(cudaGetDevice(&dev));
  DI_CU(cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, dev));
  int cc_major = 0, cc_minor = 0;
  DI_CU(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  DI_CU(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (cc_major != 9) /* sm_90a code only (clusters, PDL, Hopper-specific instructions) */
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "cuda: the CUDA backend is built for sm_90 (H100/H200); device %d is sm_%d%d", dev, cc_major,
                        cc_minor);
  DI_CU(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
  DI_TRY(di_cu_blas_create(&b->blas));
  const char *ge = getenv("DEEPINFER_CUDA_GRAPHS");
  b->use_graphs = !(ge && strcmp(ge, "0") == 0);
  b->skip = parse_skip(getenv("DEEPINFER_CUDA_SKIP"));
  const char *ms = getenv("DEEPINFER_CUDA_ATTN_MIN_SPLIT");
  b->attn_min_split = ms && atoi(ms) > 0 ? atoi(ms) : 1;
  /* DEEPINFER_CUDA_FOLD_UV=1: W_UV in the decode attention's epilogue; off by default (batch 1 on the
   * H200: 430 tok/s with it, 437 without: the epilogue's 128 KB of W_UV per CTA costs more than the
   * kernel it saves) */
  const char *fuv = getenv("DEEPINFER_CUDA_FOLD_UV");
  b->fold_uv = fuv && fuv[0] == '1';
  const char *oc = getenv("DEEPINFER_CUDA_OUT_CAP");
  b->out_cap0 = oc && atoi(oc) >= 1 && atoi(oc) <= 4096 ? atoi(oc) : 16;
  const char *ss = getenv("DEEPINFER_CUDA_STEP_SAMPLE");
  b->step_sample_on = !(ss && ss[0] == '0');
  const char *vof = getenv("DEEPINFER_CUDA_VO_FUSED");
  b->vo_fused = !(vof && vof[0] == '0');
  /* Batch-invariant mode (di_model_options.batch_invariant, or DEEPINFER_BATCH_INVARIANT=1): a row's
   * logits do not depend on what else is in the step (the CPU backend always is). Every product runs a
   * form whose per-row arithmetic is fixed: GEMMs in chunks of the skinny kernels (gemm.cu), experts as
   * the grouped GEMV, attention in the strided cluster form (without clusters: one pass over the keys
   * per item), none of the one-token fusions that change the arithmetic (the fused gate and prep +
   * absorb are bit-equal to their unfused kernels and stay). Slower. */
  const char *inv = getenv("DEEPINFER_BATCH_INVARIANT");
  b->invariant = b->invariant || (inv && inv[0] == '1');
  if (b->invariant) {
    di_cu_blas_set_invariant(b->blas, 1);
    b->vo_fused = b->fold_uv = 0; /* the one-token fusions that change the arithmetic */
  }
  const char *apl = getenv("DEEPINFER_CUDA_ATTN_PRELOAD");
  di_cuk_attn_set_preload(!(apl && apl[0] == '0'));
  const char *gvw = getenv("DEEPINFER_CUDA_GV_WARPS");
  di_cuk_grouped_gemv_set_one_warp(!(gvw && atoi(gvw) == 4));
  const char *dcb = getenv("DEEPINFER_CUDA_DOWN_COMBINE");
  b->down_combine = !(dcb && dcb[0] == '0');
  /* decode attention in clusters of 16 CTAs where the GPU can place them (H200: 417 vs 404 tok/s at
   * batch 1 with 8), else 8; DEEPINFER_CUDA_ATTN_CLUSTER=8, 16 or 0 (splits + a combine kernel, the
   * prefill kernel's form) */
  const char *acl = getenv("DEEPINFER_CUDA_ATTN_CLUSTER");
  const int want_cl = acl ? atoi(acl) : 16;
  b->attn_cluster = want_cl == 0 ? 0 : want_cl == 16 && di_cuk_attn_cluster_ok(16) ? 16 : 8;
  const char *sk2 = getenv("DEEPINFER_CUDA_ATTN_SPLIT_KEYS");
  b->split_keys = sk2 && atoi(sk2) >= 32 && atoi(sk2) % 32 == 0 ? atoi(sk2) : DI_CUK_ATTN_KTILE;
  for (int i = 0; i < 2; i++) DI_CU(cudaEventCreateWithFlags(&b->ev_sampled[i], cudaEventDisableTiming));
  DI_CU(cudaEventCreateWithFlags(&b->ev_h2d, cudaEventDisableTiming));
  const char *gt = getenv("DEEPINFER_CUDA_GPU_TIME");
  if (gt && strcmp(gt, "1") == 0) {
    DI_CU(cudaEventCreate(&b->ev_g0));
    DI_CU(cudaEventCreate(&b->ev_g1));
    b->gpu_time = 1;
  }
  const char *pe = getenv("DEEPINFER_CUDA_PROFILE");
  if (pe && strcmp(pe, "1") == 0) {
    b->prof = 1;
    b->use_graphs = 0;
    for (int i = 0; i < MAX_MARKS; i++) DI_CU(cudaEventCreate(&b->marks[i]));
  }
  b->H = c->hidden_size; b->NH = c->num_attention_heads; b->dn = c->qk_nope_head_dim; b->dr = c->qk_rope_head_dim;
  b->dv = c->v_head_dim; b->R = c->kv_lora_rank; b->dqk = b->dn + b->dr; b->V = c->vocab_size;
  b->qr = c->q_lora_rank; b->eps = c->rms_norm_eps; b->Idense = c->intermediate_size;
  b->E = c->n_routed_experts; b->K = c->n_routed_experts > 0 ? c->num_experts_per_tok : 0;
  b->Ip = (c->moe_intermediate_size + 63) / 64 * 64;
  b->Hp = b->E > 0 ? (b->H + 127) / 128 * 128 : b->H;
  b->Wa = (b->qr > 0 ? b->qr : b->NH * b->dqk) + b->R + b->dr;
  /* shared experts fold into the grouped GEMM when they are n_shared experts' worth of width */
  b->n_sh = 0;
  if (b->E > 0 && c->n_shared_experts > 0) {
    int fold = 1;
    for (int l = 0; l < w->n_layers; l++)
      if (w->layers[l].is_moe && w->layers[l].has_shared &&
          w->layers[l].sh_gate.rows != (int64_t)c->n_shared_experts * c->moe_intermediate_size)
        fold = 0;
    if (fold) b->n_sh = c->n_shared_experts;
  }
  b->Et = b->E + b->n_sh;
  b->Kt = b->K + b->n_sh;
  if (b->R > DI_CUK_MLA_R || b->dr > DI_CUK_MLA_P || b->dr % 2)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: kv_lora_rank %d / rope dim %d unsupported (<= %d / even <= %d)",
                        b->R, b->dr, DI_CUK_MLA_R, DI_CUK_MLA_P);
  if (b->E > 0 && b->K > 8)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: MoE top-k <= 8 supported (got %d)", b->K);
  b->router.E = b->E; b->router.k = b->K; b->router.n_group = c->n_group; b->router.topk_group = c->topk_group;
  b->router.sigmoid = c->scoring_func == DI_SCORE_SIGMOID;
  b->router.method = c->topk_method == DI_TOPK_GREEDY ? 0 : c->topk_method == DI_TOPK_GROUP_LIMITED_GREEDY ? 1 : 2;
  b->router.norm_topk = c->norm_topk_prob;
  b->router.scale_after_norm = c->arch == DI_ARCH_DEEPSEEK_V3;
  b->router.routed_scale = c->routed_scaling_factor;
  b->router.n_shared = b->n_sh;
  const char *br = getenv("DEEPINFER_CUDA_BLOCK_ROUTE"); /* A/B: the block-wide routing everywhere */
  b->router.block_route = br && br[0] == '1';
  double invf[DI_CUK_MLA_P / 2];
  float invf32[DI_CUK_MLA_P / 2];
  di_rope_inv_freq(c, invf);
  for (int i = 0; i < b->dr / 2; i++) invf32[i] = (float)invf[i];
  DI_TRY(up_vec(b, invf32, b->dr / 2, &b->inv_freq));
  b->rope.inv_freq = b->inv_freq;
  b->rope.attn_factor = c->rope_attention_factor;
  b->rope.interleave = c->rope_interleave;
  /* weights */
  DI_TRY(up_mat(b, &w->embed, b->V, b->H, &b->embed, "embed_tokens"));
  DI_TRY(up_mat(b, &w->lm_head, b->V, b->H, &b->lm_head, "lm_head"));
  DI_TRY(up_vec(b, w->final_norm, b->H, &b->final_norm));
  b->n_layers = w->n_layers;
  /* the MTP layer when the checkpoint has one (checked on the H200 against the CPU's MTP forward and
   * in speculative decoding); DEEPINFER_CUDA_MTP=0 leaves it on the host (no weights, no KV for it) */
  const char *mtp_env = getenv("DEEPINFER_CUDA_MTP");
  b->n_mtp = w->n_mtp > 0 && !(mtp_env && mtp_env[0] == '0') ? 1 : 0;
  b->L = (cu_layer *)calloc((size_t)(b->n_layers + b->n_mtp > 0 ? b->n_layers + b->n_mtp : 1), sizeof(cu_layer));
  if (!b->L) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
  for (int l = 0; l < b->n_layers + b->n_mtp; l++) DI_TRY(upload_layer(b, c, &w->layers[l], &b->L[l], l));
  if (b->n_mtp) {
    const di_ds_layer *m = &w->layers[w->n_layers];
    DI_TRY(up_vec(b, m->enorm, b->H, &b->mtp_enorm));
    DI_TRY(up_vec(b, m->hnorm, b->H, &b->mtp_hnorm));
    DI_TRY(up_vec(b, m->head_norm, b->H, &b->mtp_head_norm));
    DI_TRY(up_mat(b, &m->eh_proj, b->H, 2 * (int64_t)b->H, &b->mtp_eh, "eh_proj"));
    if (m->mtp_embed.data == w->embed.data) b->mtp_embed = b->embed;
    else DI_TRY(up_mat(b, &m->mtp_embed, b->V, b->H, &b->mtp_embed, "mtp embed_tokens"));
    if (m->head.data == w->lm_head.data) b->mtp_head = b->lm_head;
    else DI_TRY(up_mat(b, &m->head, b->V, b->H, &b->mtp_head, "shared_head.head"));
    b->base.n_mtp_layers = 1;
  }
  dev_free(b, b->stage);
  b->stage = NULL;
  DI_TRY(ensure_acts(b, 256, 16, 512));
  DI_CU(cudaDeviceSynchronize());
  return DI_OK;
}

extern "C" di_status di_backend_cuda_create(const di_model_config *cfg, const di_ds_weights *w, int batch_invariant,
                                            di_backend **out) {
  cu_backend *b = (cu_backend *)calloc(1, sizeof *b);
  if (!b) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
  b->invariant = batch_invariant != 0;
  b->base.ops = &CU_OPS;
  b->base.cfg = cfg;
  b->base.vocab_size = cfg->vocab_size;
  b->base.hidden_size = cfg->hidden_size;
  di_status st = create(cfg, w, b);
  if (st != DI_OK) {
    cu_destroy(&b->base);
    return st;
  }
  *out = &b->base;
  return DI_OK;
}

extern "C" int64_t di_backend_cuda_free_bytes(void) {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
  return (int64_t)fr;
}

extern "C" void di_backend_cuda_set_skip(di_backend *bb, const char *phases) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old phase list */
  b->skip = parse_skip(phases);
}

extern "C" void di_backend_cuda_stats(di_backend *bb, di_cuda_stats *out) {
  *out = ((cu_backend *)bb)->stats;
}
