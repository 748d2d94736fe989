/* The DeepSeek-V4 forward on CUDA: a backend of its own (vtable of backend/backend.h) with the same
 * contract as the CPU's V4 backend (backend/cpu/cpu_v4_backend.c): the engine's paged cache groups in
 * the same layout (backend/cpu/cpu_deepseek_v4_pages.h, float32), here in device memory; a table from
 * sequence keys to each sequence's open compressor windows (device buffers in the snapshot layout);
 * submit() checks the batch on the host, then queues the whole step: every layer over all the step's
 * tokens at once (kernels of k_v4_dense.cu / k_v4_attn.cu), the head for the output rows; wait() copies
 * the logits.
 *
 * Per layer: mHC collapse + norm -> q (wq_a, q_norm, wq_b, per-head norm, rope), kv (wkv, norm, rope)
 * -> kv rows into the window blocks -> CSA / HCA: compressor projections + ape, pooling of the windows
 * closing in the step into their blocks, the open windows after the step and at every block end
 * (snapshots) -> CSA: the indexer (own compressor, roped queries, ReLU scores, top-k) -> attention with
 * sinks -> grouped output (wo_a per group, wo_b) -> mHC update; then the same mHC around the MoE (router,
 * hash or biased top-k, experts + shared expert as GEMVs per token and slot, combine).
 *
 * Weights: bf16 on the device, dequantized on the host at load (cuda_upload.cu's up_rows: FP8 / MXFP4 /
 * F16 / F32 all pass through di_weight_rows_f32), or float32 with DEEPINFER_CUDA_V4_F32=1 (the tests'
 * exact mode). With DEEPINFER_CUDA_V4_NATIVE=1 (the default) the checkpoint's formats stay on the device: FP8 matrices
 * as E4M3 with one f32 scale row per weight row (cuda_upload_fp8.cu's fp8_up_rows), multiplied by issue
 * 18's W8A16 GEMVs (cuda_fp8.h: bf16-rounded activations, batch-invariant; on its tensor-core form with
 * DEEPINFER_CUDA_V4_TC=1), and MXFP4 routed experts as E2M1 + E8M0 bytes, multiplied by the V4 expert
 * kernels' MXFP4 form (k_v4_dense.cu: float32 activations, decoded in registers; the shared expert, FP8,
 * then goes through the FP8 GEMVs on its own). ape, hyper-connection, norm, sink and router parameters
 * stay float32.
 *
 * Linear layers: the GEMV kernels over float32 activations (CPU-exact up to float sums), or with
 * DEEPINFER_CUDA_V4_TC=1 the dense bf16 ones on k_tc_gemm.cu's batch-invariant tensor-core GEMM over
 * bf16 activations (lin / lin_groups; experts stay on the GEMVs).
 *
 * Sampling (k_sample.cu's kernel): inside the step when the batch carries sample_rows (the tokens then wait
 * on the device; sample() with the same rows only copies them, other rows sample again), and (unless
 * DEEPINFER_CUDA_V4_FEEDBACK=0) device token feedback (sample_async / sample_fetch: the next step's token ids
 * -1 - j are resolved on the device from the last sampled row j; the step's host metadata goes through two
 * pinned buffers, each reused only after its copy has run, so the host prepares step N+1 while N runs).
 * CUDA graphs (DEEPINFER_CUDA_V4_GRAPHS=1; off by default: on the H200 1-2.7% faster at batch 1, up to ~1-2%
 * slower at batch 64-256 before the idle-CTA trims, which are not measured yet): a step of up to V4_GRAPH_MAX_T tokens is laid out
 * for its bucket (tokens, sequences and output rows rounded up to powers of two, the compressed-entry bounds
 * to entries_bucket) and every launch's grid follows the bucket only: padding tokens (token 0 at position
 * 0 of a spare sequence with no entries, its block table all block 0) are computed and dropped, never
 * written to a cache (di_v4k_window_write's device count); the closing windows and state writes are lists
 * whose counts the kernels read on the device; the indexer's and the attention's entry loops are bounded by
 * each sequence's own count. The step's metadata goes to one fixed device block (the block tables to a
 * buffer of their own, reached through the sequences' table pointers), so a bucket's graph, captured the
 * second time it is seen, replays with the new step's data; the feedback tokens are resolved before it.
 * Every real row gets the bits of the eager step (no kernel's per-row arithmetic depends on the number
 * of rows or on the bounds). Not under expert parallel (its exchanges sync with the host).
 * MXFP4 experts on tensor cores (k_mxfp4_tc_grouped.cu): steps of >= mx_tc tokens (DEEPINFER_CUDA_V4_MX_TC; unset:
 * DI_V4_MX_TC_DEFAULT in the default mode (0 until measured; 2 proposed), never in the batch-invariant mode, which keeps
 * one form at every step size). DEEPINFER_CUDA_V4_FORK
 * (off by default): each mHC site's Sinkhorn on a stream of its own beside the sublayer (bit 1), a one-token step's
 * compressor and indexer on two more beside the q path (bit 2; bit 4: the indexer's queries on a third beside its
 * compressor): the same kernels, forked and joined by events.
 * Not yet: bf16 / fp8 caches, SWA bounded replay (refused with a message). Batches without group tables (di_model_score, log-likelihoods) run on pools of their own
 * (kv_alloc), each sequence's group-0 block table standing for its table in every group. */
#include "cuda_backend_impl.cuh"
#include "cuda_ep.cuh"
#include "cuda_v4_kernels.h"
#include "cuda_v4_mxtc.h"
extern "C" {
#include "dist/dist.h"
#include "backend/cpu/cpu_deepseek_v4_ops.h"
#include "backend/cpu/cpu_deepseek_v4_pages.h"
#include "backend/cuda/cuda_v4_backend.h"
#include "util/grow.h"
}
#include <stdio.h>

#define WHO "DeepSeek-V4 CUDA backend"

/* A device matrix: bf16 or f32 rows (p), or FP8 (fp8: q, per-row scales). */
typedef struct v4_mat {
  void *p;
  int f32, fp8;
  di_cuk_fp8w q;
} v4_mat;

typedef struct v4_dcomp {
  v4_mat wkv, wgate;
  float *ape, *norm;
} v4_dcomp;

typedef struct v4_dlayer {
  float *attn_norm, *ffn_norm;
  float *hc_attn_fn, *hc_ffn_fn, *hc_attn_base, *hc_ffn_base, *hc_attn_scale, *hc_ffn_scale;
  v4_mat wq_a, wq_b, wkv, wo_a, wo_b;
  float *q_norm, *kv_norm, *sink;
  v4_dcomp comp, icomp;
  v4_mat idx_wq_b, idx_weights;
  float *router, *router_bias;
  int32_t *tid2eid;
  void *w1, *w3, *w2; /* [E+1][I][D], [E+1][I][D], [E+1][D][I]; expert E is the shared one */
  int mx;             /* native: the routed experts MXFP4 in m1, m3, m2 ([E][..]), the shared one in sh1, sh3, sh2 */
  di_cuk_mxfp4w m1, m3, m2;
  v4_mat sh1, sh3, sh2;
} v4_dlayer;

typedef struct v4_dseq {
  uint64_t key;
  float *state, *next; /* open windows at the state's position; the next state (swapped after a step) */
  int64_t n_pos;
} v4_dseq;

/* One CUDA graph: the bucket it was captured for, and whether the bucket was seen (captured on its second step). */
#define V4_GRAPH_MAX_T 256
#define V4_MAX_GRAPHS 32
typedef struct v4_graph {
  int T, S, n_out, max_csa, max_hca, sample, own;
  int seen;
  cudaGraphExec_t exec;
} v4_graph;

typedef struct v4_pools {
  float *pool[DI_V4_N_KINDS];
  int64_t blocks[DI_V4_N_KINDS];
} v4_pools;

/* scratch slots (scratch(): one device buffer each, grown on demand) */
enum { S_X, S_IN, S_OUT, S_POST, S_COMB, S_QR, S_Q, S_KV, S_CKV, S_CGATE, S_IKV, S_IGATE, S_IQ, S_IW, S_SCORE, S_SEL,
       S_P, S_EX, S_O, S_MID, S_RLOG, S_IDS, S_WTS, S_ACT, S_Y, S_HY, S_LOGITS, S_META, S_SROWS, S_SOUT, S_TILES, S_HCP, S_TCX, S_TCWS, S_SHGU,
       S_EPACT, S_EPTILES, S_TAB, S_MXTC, S_TCXA, S_TCXB, S_TCXC, S_N };

typedef struct v4cu {
  di_backend base;
  const di_v4_config *c;
  cudaStream_t stream;
  int wf32;
  int tc; /* DEEPINFER_CUDA_V4_TC: dense bf16 linears on the batch-invariant tensor-core GEMM */
  int native; /* DEEPINFER_CUDA_V4_NATIVE: FP8 / MXFP4 weights kept as stored */
  int mx_tc;  /* DEEPINFER_CUDA_V4_MX_TC: steps of >= this many tokens take the MXFP4 tensor-core experts (0: never) */
  int invariant; /* the batch-invariant mode (create_mode's batch_invariant or DEEPINFER_BATCH_INVARIANT=1): every
                  * kernel one form at every step size */
  size_t weight_bytes; /* device bytes of the weights (alloc_dev) */
  size_t wsize;
  di_v4_layout lay;
  size_t state_floats;
  void **allocs;
  int n_allocs, cap_allocs;
  /* weights */
  v4_mat embed, head;
  float *final_norm, *hc_head_fn, *hc_head_base, *hc_head_scale;
  float *inv_main, *inv_comp; /* rope inverse frequencies */
  float af_main, af_comp;
  v4_dlayer *L;
  /* pools: the engine's groups (kv_alloc_groups), and this backend's own for batches without group
   * tables (kv_alloc: di_model_score, log-likelihoods), whose sequences use their group-0 table in every
   * group; `cur` is the step's */
  v4_pools eng, own, *cur;
  const int32_t **syn_tables; /* the group tables such a batch is given (its seqs' block tables) */
  int *syn_blocks, syn_cap;
  di_batch syn;
  /* sequences */
  v4_dseq *seqs;
  int n_seqs, cap_seqs;
  /* scratch (grown as needed) */
  void *scr[S_N];
  size_t scr_cap[S_N];
  int32_t *h_meta[2]; /* pinned, alternating per step; ev_meta[k] marks the end of buffer k's copy */
  size_t h_meta_cap[2];
  cudaEvent_t ev_meta[2];
  int meta_par;
  /* sampling: the step's (in-step) or the last sample call's tokens in d_tok; feedback */
  int32_t *d_tok, *h_tok; /* device tokens [cap_tok], pinned host copy */
  di_cuk_sample_row *h_srows, *d_srows;
  int cap_tok;
  int step_sampled;       /* d_tok holds the step's tokens for the rows in h_srows */
  int fb_n, fb_pending;   /* rows the next submit may refer to (-1 - j); a sample_fetch is due */
  int fb_rows;            /* the rows of that sample_async (sample_fetch writes as many) */
  cudaEvent_t ev_tok;
  int32_t *h_chk;         /* the batch's tokens with feedback placeholders as 0, for the checks */
  int h_chk_cap;
  /* CUDA graphs (DEEPINFER_CUDA_V4_GRAPHS) */
  int use_graphs, capturing;
  v4_graph graphs[V4_MAX_GRAPHS];
  int n_graphs;
  int64_t graph_captures, graph_replays;
  /* the step */
  const di_batch *batch;
  int n_out;
  float *d_logits;
  /* expert parallel (--enable-expert-parallel; cuda_ep.cu): this rank's block of routed experts, then
   * the shared one, in w1 / w3 / w2; NULL on one GPU */
  cu_ep_core *ep;
  const di_v4_weights *w;
  /* phase profile (di_backend_cuda_v4_profile): events at the phase starts of an eager step, tagged
   * layer * DI_V4_PROF_N + phase; the sums per tag; the batch-1 weight bytes per tag, counted at upload
   * (acct: the tag's sum alloc_dev adds to, NULL: none) */
  int prof, n_pev, cap_pev;
  cudaEvent_t *pev;
  int *ptag;
  double *pms, *pbytes, *acct;
  int64_t prof_steps;
  /* one token's grouped FP8 wo_a as one grouped GEMV: the groups as experts (off [G + 1], tiles [G], count) */
  int32_t *grp_tab;
  /* native MoE at one token: the shared expert's FP8 products on a side stream beside the routed MXFP4 kernels
   * (forked and joined through ev_fork / ev_join, so a graph captures both) */
  cudaStream_t side;
  cudaEvent_t ev_fork, ev_join;
  /* DEEPINFER_CUDA_V4_FORK: bit 1, each mHC site's post + Sinkhorn on hside (forked after the mixes through ev_hfork,
   * joined before hc_post through ev_hjoin); bit 2, a one-token step's compressor on aside[0] and indexer on aside[1]
   * (forked after q_norm through ev_afork, joined before the attention through ev_ajoin) */
  cudaStream_t hside, aside[3]; /* aside[2] (bit 4): the indexer's queries beside its compressor */
  cudaEvent_t ev_hfork, ev_hjoin, ev_afork, ev_ajoin[3];
} v4cu;


static di_status alloc_dev(v4cu *b, void **p, size_t bytes) {
  *p = NULL;
  if (!bytes) bytes = 16;
  if (!di_grow((void **)&b->allocs, &b->cap_allocs, b->n_allocs + 1, sizeof(void *), 64))
    return di_error_set(DI_ERR_OOM, WHO ": out of host memory");
  cudaError_t e = cudaMalloc(p, bytes);
  if (e != cudaSuccess)
    return di_error_set(DI_ERR_OOM, WHO ": cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
  b->allocs[b->n_allocs++] = *p;
  b->weight_bytes += bytes;
  if (b->acct) *b->acct += (double)bytes;
  return DI_OK;
}

/* The graphs hold device addresses of scratch, pools, d_tok: when one of them moves, they go. (An
 * executable graph still in flight is freed when it completes.) */
static void drop_graphs(v4cu *b) {
  for (int i = 0; i < b->n_graphs; i++)
    if (b->graphs[i].exec) cudaGraphExecDestroy(b->graphs[i].exec);
  b->n_graphs = 0;
}

static di_status scratch(v4cu *b, int slot, size_t bytes, void **out) {
  if (bytes < 16) bytes = 16;
  if (b->scr_cap[slot] < bytes) {
    /* a bucket's first (eager) step sized its buffers: growing one while capturing it is a bug */
    if (b->capturing)
      return di_error_set(DI_ERR_BACKEND, WHO ": scratch %d would grow to %zu bytes while a CUDA graph is captured", slot, bytes);
    if (slot != S_TAB) drop_graphs(b); /* (the block tables are reached through the metadata, not by the graphs) */
    if (b->scr[slot]) cudaFree(b->scr[slot]);
    b->scr[slot] = NULL;
    b->scr_cap[slot] = 0;
    size_t cap = bytes + bytes / 4;
    cudaError_t e = cudaMalloc(&b->scr[slot], cap);
    if (e != cudaSuccess)
      return di_error_set(DI_ERR_OOM, WHO ": cudaMalloc of %zu bytes of scratch failed: %s", cap, cudaGetErrorString(e));
    b->scr_cap[slot] = cap;
  }
  *out = b->scr[slot];
  return DI_OK;
}
#define SCR(var, slot, type, n) \
  type *var;                    \
  DI_TRY(scratch(b, slot, sizeof(type) * (size_t)(n), (void **)&var))

/* Phase profile: an event at the start of phase p of layer l (l < 0: the step's end). */
static void prof_mark(v4cu *b, int l, int p) {
  if (!b->prof || b->capturing || b->n_pev >= b->cap_pev) return;
  b->ptag[b->n_pev] = l < 0 ? -1 : l * DI_V4_PROF_N + p;
  cudaEventRecord(b->pev[b->n_pev++], b->stream);
}

/* ---- linear layers: the GEMV kernels, or (tc) the batch-invariant tensor-core GEMM ---------------------- */

/* y[t][r] = W[r] . x[t] as di_v4k_linear; in the tc mode (bf16 weights, shapes k_tc_gemm takes) on
 * di_cuk_tc_gemm over bf16-rounded activations, every product at every T: its per-row bits do not
 * depend on M, so batched == alone and chunk independence hold in that mode too (but its activations
 * are bf16: results within bf16 bars of the CPU, not 1e-6). G > 1: the grouped form
 * (di_v4k_linear_groups' gx, gw, gy). */
/* The FP8 products of lin_groups over activations already in bf16 (xb, row stride width): W8A16 GEMVs;
 * group g's rows start gw / C rows on. */
static di_status fp8_products(v4cu *b, const uint16_t *xb, int width, const v4_mat *Wm, int T, int R, int C, float *y, int ldy,
                              int G, int64_t gx, int64_t gw, int64_t gy) {
  /* one token, G > 1 (wo_a): group g is expert g of one grouped GEMV over the G slices of x as rows (x's row g
   * of C columns is slice g when gx == C, y's row g of R columns is group g's output when gy == R), the
   * kernel and per-row arithmetic of di_cuk_fp8_gemv's one-row pass, so the same bits in one launch not G */
  if (T == 1 && G > 1 && b->grp_tab && !b->tc && G == b->c->o_groups && gx == C && gy == R && gw == (int64_t)R * C &&
      di_cuk_fp8_gemv_vec_ok(C, xb, C, Wm->q))
    return di_cuk_fp8_grouped_gemv(xb, C, NULL, Wm->q, R, C, b->grp_tab, b->grp_tab + G + 1, b->grp_tab + 2 * G + 1, G, 1, 1, y,
                                   R, 1, b->stream);
  for (int g = 0; g < G; g++) {
    di_cuk_fp8w w = Wm->q;
    const int64_t r0 = gw / C * g;
    w.q += r0 * w.ldq;
    w.scale += r0 * w.scale_cols;
    const uint16_t *xg = xb + gx * g;
    float *yg = y + gy * g;
    if (b->tc && di_cuk_fp8_tc_ok(C, xg, width, w)) DI_TRY(di_cuk_fp8_tc_gemv(T, R, C, xg, width, w, yg, ldy, 1, 0.0f, b->stream));
    else DI_TRY(di_cuk_fp8_gemv(T, R, C, xg, width, w, yg, ldy, 1, 0.0f, b->stream));
  }
  return DI_OK;
}

/* One token's FP8 products straight from the f32 activations (di_cuk_fp8_f32x on, not the tc mode): the GEMVs round
 * them to bf16 as they load them, the same values as the bf16 copy, so the same bits without the rounding launch.
 * Returns 0 (nothing launched) where the shapes or alignment do not allow it. */
static int fp8_f32x_ok(const v4cu *b, int T) { return T == 1 && !b->tc && di_cuk_fp8_f32x_on(); }
static di_status fp8_products_f32x(v4cu *b, const float *x, const v4_mat *Wm, int R, int C, float *y, int G, int64_t gx,
                                   int64_t gw, int64_t gy, int *done) {
  *done = 0;
  if (!di_cuk_fp8_gemv1_f32x_ok(C, x, Wm->q) || (G > 1 && gx % 4)) return DI_OK;
  *done = 1;
  if (G > 1 && b->grp_tab && G == b->c->o_groups && gx == C && gy == R && gw == (int64_t)R * C) /* as fp8_products */
    return di_cuk_fp8_grouped_gemv1_f32x(x, C, NULL, Wm->q, R, C, b->grp_tab, b->grp_tab + G + 1, b->grp_tab + 2 * G + 1, G, 1, y,
                                         R, b->stream);
  for (int g = 0; g < G; g++) {
    di_cuk_fp8w w = Wm->q;
    const int64_t r0 = gw / C * g;
    w.q += r0 * w.ldq;
    w.scale += r0 * w.scale_cols;
    DI_TRY(di_cuk_fp8_gemv1_f32x(R, C, x + gx * g, w, y + gy * g, b->stream));
  }
  return DI_OK;
}

/* The bf16 copy of an FP8 product's activations: a buffer per stream that runs products at once (the forked
 * compressor's and indexer's, DEEPINFER_CUDA_V4_FORK bit 2; the shared expert's side stream overlaps only the MXFP4
 * kernels, which take float32 rows). */
static int tcx_slot(const v4cu *b) {
  return b->aside[0] && b->stream == b->aside[0]   ? S_TCXA
         : b->aside[1] && b->stream == b->aside[1] ? S_TCXB
         : b->aside[2] && b->stream == b->aside[2] ? S_TCXC
                                                   : S_TCX;
}

static di_status lin_groups(v4cu *b, const float *x, int ldx, const v4_mat *Wm, int T, int R, int C, float *y, int ldy, int G,
                            int64_t gx, int64_t gw, int64_t gy) {
  cudaStream_t s = b->stream;
  const int width = G > 1 ? (int)(gx * (G - 1)) + C : C; /* the columns of x the products read */
  if (Wm->fp8) { /* W8A16 over bf16-rounded activations */
    if (T <= 0) return DI_OK;
    if (fp8_f32x_ok(b, T)) {
      int done;
      DI_TRY(fp8_products_f32x(b, x, Wm, R, C, y, G, gx, gw, gy, &done));
      if (done) return DI_OK;
    }
    SCR(xb, tcx_slot(b), uint16_t, (size_t)T * width);
    DI_TRY(di_v4k_to_bf16(x, ldx, T, width, xb, s));
    return fp8_products(b, xb, width, Wm, T, R, C, y, ldy, G, gx, gw, gy);
  }
  const void *W = Wm->p;
  const int wf32 = Wm->f32;
  if (b->tc && !wf32 && T > 0 && width <= ldx && di_cuk_tc_gemm_ok(R, C, width, C, 0, W, W) /* (X: scratch, aligned) */ &&
      gx % 8 == 0 && gw % 8 == 0) {
    SCR(xb, S_TCX, uint16_t, (size_t)T * width);
    DI_TRY(di_v4k_to_bf16(x, ldx, T, width, xb, s));
    const size_t need = di_cuk_tc_gemm_ws_bytes(G, T, R, C);
    if (b->scr_cap[S_TCWS] < need || !b->scr[S_TCWS]) { /* its tile counters start at zero (then every call leaves them so) */
      void *ws;
      DI_TRY(scratch(b, S_TCWS, need > (16u << 10) ? need : (16u << 10), &ws));
      DI_CU(cudaMemsetAsync(ws, 0, b->scr_cap[S_TCWS], s));
    }
    return di_cuk_tc_gemm(G, T, R, C, xb, width, gx, (const uint16_t *)W, C, gw, 0, y, ldy, gy, 1, 0.0f,
                          (float *)b->scr[S_TCWS], b->scr_cap[S_TCWS], s);
  }
  if (G > 1) return di_v4k_linear_groups(x, ldx, W, wf32, T, R, C, y, ldy, G, gx, gw, gy, s);
  return di_v4k_linear(x, ldx, W, wf32, T, R, C, y, ldy, s);
}
static di_status lin(v4cu *b, const float *x, int ldx, const v4_mat *W, int T, int R, int C, float *y, int ldy) {
  return lin_groups(b, x, ldx, W, T, R, C, y, ldy, 1, 0, 0, 0);
}
/* Two products of the same activations (wq_a and wkv, the shared expert's gate and up): when both are
 * FP8 the activations are rounded to bf16 once (the same bits as two lin calls). */
static di_status lin2(v4cu *b, const float *x, int ldx, int T, int C, const v4_mat *W1, int R1, float *y1, int ldy1,
                      const v4_mat *W2, int R2, float *y2, int ldy2) {
  if (!W1->fp8 || !W2->fp8 || T <= 0 || fp8_f32x_ok(b, T)) { /* (f32x: no shared rounding to save) */
    DI_TRY(lin(b, x, ldx, W1, T, R1, C, y1, ldy1));
    return lin(b, x, ldx, W2, T, R2, C, y2, ldy2);
  }
  SCR(xb, tcx_slot(b), uint16_t, (size_t)T * C);
  DI_TRY(di_v4k_to_bf16(x, ldx, T, C, xb, b->stream));
  DI_TRY(fp8_products(b, xb, C, W1, T, R1, C, y1, ldy1, 1, 0, 0, 0));
  return fp8_products(b, xb, C, W2, T, R2, C, y2, ldy2, 1, 0, 0, 0);
}

/* ---- weights to the device ---------------------------------------------------------------------------- */

/* bf16 rows (or f32 rows in the exact mode), whatever the stored format. */
static di_status v4_upload_rows(v4cu *b, const di_weight *w, void *dst) {
  if (!b->wf32) return up_rows(w, 0, w->rows, (bf16 *)dst, w->cols);
  const int64_t chunk = 256;
  float *f = (float *)malloc(sizeof(float) * (size_t)(chunk * w->cols));
  if (!f) return di_error_set(DI_ERR_OOM, WHO ": out of host memory");
  di_status st = DI_OK;
  for (int64_t r = 0; r < w->rows && st == DI_OK; r += chunk) {
    const int64_t m = w->rows - r < chunk ? w->rows - r : chunk;
    di_weight_rows_f32(w, r, r + m, f);
    cudaError_t e = cudaMemcpy((float *)dst + r * w->cols, f, sizeof(float) * (size_t)(m * w->cols), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) st = di_error_set(DI_ERR_BACKEND, WHO ": uploading %s: %s", w->name ? w->name : "?", cudaGetErrorString(e));
  }
  free(f);
  return st;
}

/* An FP8 weight as stored (native mode): E4M3 rows padded to 16 bytes, one f32 scale row per weight row. */
static di_status v4_upload_fp8(v4cu *b, const di_weight *w, v4_mat *out) {
  di_cuk_fp8w *d = &out->q;
  const int bc = w->block_cols;
  d->ldq = (int)((w->cols + 15) / 16 * 16);
  d->block_rows = 1;
  d->block_cols = bc;
  d->scale_cols = (int)((w->cols + bc - 1) / bc);
  void *q, *sc;
  DI_TRY(alloc_dev(b, &q, (size_t)(w->rows * d->ldq)));
  DI_TRY(alloc_dev(b, &sc, sizeof(float) * (size_t)(w->rows * d->scale_cols)));
  DI_CU(cudaMemset(q, 0, (size_t)(w->rows * d->ldq)));
  d->q = (const uint8_t *)q;
  d->scale = (const float *)sc;
  out->fp8 = 1;
  return fp8_up_rows(w, 0, w->rows, 0, w->cols, d, 0);
}

/* bf16 / f32 rows whatever the format (the embedding, which is gathered, not multiplied). */
static di_status v4_upload_dense(v4cu *b, const di_weight *w, v4_mat *out) {
  memset(out, 0, sizeof *out);
  out->f32 = b->wf32;
  DI_TRY(alloc_dev(b, &out->p, (size_t)(w->rows * w->cols) * b->wsize));
  return v4_upload_rows(b, w, out->p);
}

static di_status v4_upload_matrix(v4cu *b, const di_weight *w, v4_mat *out) {
  memset(out, 0, sizeof *out);
  if (b->native && w->dtype == DI_DT_F8E4M3 && w->data && w->block_cols > 0) return v4_upload_fp8(b, w, out);
  out->f32 = b->wf32;
  DI_TRY(alloc_dev(b, &out->p, (size_t)(w->rows * w->cols) * b->wsize));
  return v4_upload_rows(b, w, out->p);
}

/* Whether every routed expert matrix is MXFP4 as the MXFP4 expert kernels read it (1 x 32 E8M0 blocks). */
static int v4_mx_ok(const di_weight *ew, int E) {
  for (int e = 0; e < E; e++)
    if (ew[e].dtype != DI_DT_F4E2M1 || !ew[e].data || !ew[e].scale_e8m0 || ew[e].block_rows != 1 || ew[e].block_cols != 32 ||
        ew[e].cols % 2 || ew[e].rows != ew[0].rows || ew[e].cols != ew[0].cols)
      return 0;
  return E > 0;
}

/* Routed experts as stored (native mode): [E][rows][ldq] code bytes, [E][rows][lds] scale bytes. */
static di_status v4_upload_mx(v4cu *b, const di_weight *ew, int E, di_cuk_mxfp4w *d) {
  const int64_t R = ew[0].rows, cb = ew[0].cols / 2, sc = ew[0].scale_cols;
  d->ldq = (int)((cb + 15) / 16 * 16);
  d->lds = (int)sc;
  void *q, *s;
  DI_TRY(alloc_dev(b, &q, (size_t)(E * R * d->ldq)));
  DI_TRY(alloc_dev(b, &s, (size_t)(E * R * sc)));
  DI_CU(cudaMemset(q, 0, (size_t)(E * R * d->ldq)));
  for (int e = 0; e < E; e++) {
    DI_CU(cudaMemcpy2D((uint8_t *)q + (size_t)(e * R * d->ldq), (size_t)d->ldq, ew[e].data, (size_t)cb, (size_t)cb, (size_t)R,
                       cudaMemcpyHostToDevice));
    DI_CU(cudaMemcpy((uint8_t *)s + (size_t)(e * R * sc), ew[e].scale_e8m0, (size_t)(R * sc), cudaMemcpyHostToDevice));
  }
  d->q = (const uint8_t *)q;
  d->scale = (const uint8_t *)s;
  return DI_OK;
}

/* Expert matrices stacked [E+1][rows][cols] (the shared expert last); under expert parallel this rank's
 * slots of layer l only, then the shared one. */
static di_status v4_upload_experts(v4cu *b, int l, const di_weight *ew, const di_weight *shared, int E, void **out) {
  const size_t one = (size_t)(shared->rows * shared->cols) * b->wsize;
  const int n = b->ep ? cu_epc_per_rank(b->ep) : E;
  DI_TRY(alloc_dev(b, out, one * (size_t)(n + 1)));
  for (int j = 0; j <= n; j++) {
    const int e = j < n && b->ep ? cu_epc_expert_of_slot(b->ep, l, j) : j;
    const di_weight *w = j < n ? &ew[e] : shared;
    if (w->rows != shared->rows || w->cols != shared->cols)
      return di_error_set(DI_ERR_INVALID_ARG, WHO ": expert %d weight %s is [%lld x %lld], the shared expert's [%lld x %lld]", e,
                          w->name ? w->name : "?", (long long)w->rows, (long long)w->cols, (long long)shared->rows,
                          (long long)shared->cols);
    DI_TRY(v4_upload_rows(b, w, (char *)*out + one * (size_t)j));
  }
  return DI_OK;
}

static di_status up_f32(v4cu *b, const float *v, size_t n, float **out) {
  DI_TRY(alloc_dev(b, (void **)out, sizeof(float) * n));
  if (v) DI_CU(cudaMemcpy(*out, v, sizeof(float) * n, cudaMemcpyHostToDevice));
  else DI_CU(cudaMemset(*out, 0, sizeof(float) * n));
  return DI_OK;
}

static di_status up_weight_f32(v4cu *b, const di_weight *w, float **out) {
  float *h = (float *)malloc(sizeof(float) * (size_t)(w->rows * w->cols));
  if (!h) return di_error_set(DI_ERR_OOM, WHO ": out of host memory");
  di_weight_rows_f32(w, 0, w->rows, h);
  di_status st = up_f32(b, h, (size_t)(w->rows * w->cols), out);
  free(h);
  return st;
}

static di_status upload_comp(v4cu *b, const di_v4_compressor *cp, int rate, v4_dcomp *d) {
  DI_TRY(v4_upload_matrix(b, &cp->wkv, &d->wkv));
  DI_TRY(v4_upload_matrix(b, &cp->wgate, &d->wgate));
  DI_TRY(up_f32(b, cp->ape, (size_t)rate * cp->width, &d->ape));
  return up_f32(b, cp->norm, (size_t)cp->dim, &d->norm);
}

/* (the profile's batch-1 bytes: alloc_dev adds to the phase ACCT names; the embedding's one row and the
 * experts' share are set by hand) */
#define ACCT(l, p) (b->acct = &b->pbytes[(size_t)(l) * DI_V4_PROF_N + (p)])
static di_status upload(v4cu *b, const di_v4_weights *w) {
  const di_v4_config *c = b->c;
  const int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, NL = c->n_layers;
  b->acct = NULL;
  DI_TRY(v4_upload_dense(b, &w->embed, &b->embed));
  b->pbytes[(size_t)NL * DI_V4_PROF_N + DI_V4_PROF_EMBED] = (double)D * (double)b->wsize; /* one row */
  ACCT(NL, DI_V4_PROF_HEAD);
  DI_TRY(v4_upload_matrix(b, &w->head, &b->head));
  DI_TRY(up_f32(b, w->final_norm, (size_t)D, &b->final_norm));
  DI_TRY(up_weight_f32(b, &w->hc_head_fn, &b->hc_head_fn));
  DI_TRY(up_f32(b, w->hc_head_base, (size_t)hc, &b->hc_head_base));
  DI_TRY(up_f32(b, w->hc_head_scale, 1, &b->hc_head_scale));
  b->L = (v4_dlayer *)calloc((size_t)c->n_layers, sizeof *b->L);
  if (!b->L) return di_error_set(DI_ERR_OOM, WHO ": out of host memory");
  for (int l = 0; l < c->n_layers; l++) {
    const di_v4_layer *s = &w->layers[l];
    v4_dlayer *d = &b->L[l];
    ACCT(l, DI_V4_PROF_HC);
    DI_TRY(up_f32(b, s->attn_norm, (size_t)D, &d->attn_norm));
    DI_TRY(up_f32(b, s->ffn_norm, (size_t)D, &d->ffn_norm));
    DI_TRY(up_weight_f32(b, &s->hc_attn_fn, &d->hc_attn_fn));
    DI_TRY(up_weight_f32(b, &s->hc_ffn_fn, &d->hc_ffn_fn));
    DI_TRY(up_f32(b, s->hc_attn_base, (size_t)mix, &d->hc_attn_base));
    DI_TRY(up_f32(b, s->hc_ffn_base, (size_t)mix, &d->hc_ffn_base));
    DI_TRY(up_f32(b, s->hc_attn_scale, 3, &d->hc_attn_scale));
    DI_TRY(up_f32(b, s->hc_ffn_scale, 3, &d->hc_ffn_scale));
    ACCT(l, DI_V4_PROF_QKV);
    DI_TRY(v4_upload_matrix(b, &s->wq_a, &d->wq_a));
    DI_TRY(v4_upload_matrix(b, &s->wq_b, &d->wq_b));
    DI_TRY(v4_upload_matrix(b, &s->wkv, &d->wkv));
    ACCT(l, DI_V4_PROF_OUT);
    DI_TRY(v4_upload_matrix(b, &s->wo_a, &d->wo_a));
    DI_TRY(v4_upload_matrix(b, &s->wo_b, &d->wo_b));
    ACCT(l, DI_V4_PROF_QKV);
    DI_TRY(up_f32(b, s->q_norm, (size_t)c->q_lora_rank, &d->q_norm));
    DI_TRY(up_f32(b, s->kv_norm, (size_t)c->head_dim, &d->kv_norm));
    ACCT(l, DI_V4_PROF_ATTEND);
    DI_TRY(up_f32(b, s->sink, (size_t)c->n_heads, &d->sink));
    ACCT(l, DI_V4_PROF_COMP);
    if (c->attn_kind[l] == DI_V4_ATTN_CSA) {
      DI_TRY(upload_comp(b, &s->comp, c->csa_rate, &d->comp));
      ACCT(l, DI_V4_PROF_INDEX);
      DI_TRY(upload_comp(b, &s->icomp, c->csa_rate, &d->icomp));
      DI_TRY(v4_upload_matrix(b, &s->idx_wq_b, &d->idx_wq_b));
      DI_TRY(v4_upload_matrix(b, &s->idx_weights, &d->idx_weights));
    } else if (c->attn_kind[l] == DI_V4_ATTN_HCA)
      DI_TRY(upload_comp(b, &s->comp, c->hca_rate, &d->comp));
    ACCT(l, DI_V4_PROF_ROUTE);
    DI_TRY(up_weight_f32(b, &s->router, &d->router));
    if (s->router_bias) DI_TRY(up_f32(b, s->router_bias, (size_t)c->n_routed_experts, &d->router_bias));
    else DI_TRY(up_f32(b, NULL, (size_t)c->n_routed_experts, &d->router_bias));
    b->acct = NULL; /* (tid2eid: one row read a token) */
    if (s->tid2eid) {
      DI_TRY(alloc_dev(b, (void **)&d->tid2eid, sizeof(int32_t) * (size_t)c->vocab_size * c->top_k));
      DI_CU(cudaMemcpy(d->tid2eid, s->tid2eid, sizeof(int32_t) * (size_t)c->vocab_size * c->top_k, cudaMemcpyHostToDevice));
    }
    const int E = c->n_routed_experts;
    double *ex = &b->pbytes[(size_t)l * DI_V4_PROF_N + DI_V4_PROF_EXPERTS], stack = 0;
    b->acct = &stack;
    /* native MXFP4 experts on one GPU (under expert parallel the ranks' expert blocks stay bf16 stacks) */
    if (b->native && !b->ep && v4_mx_ok(s->exp_w1, E) && v4_mx_ok(s->exp_w3, E) && v4_mx_ok(s->exp_w2, E)) {
      d->mx = 1;
      DI_TRY(v4_upload_mx(b, s->exp_w1, E, &d->m1));
      DI_TRY(v4_upload_mx(b, s->exp_w3, E, &d->m3));
      DI_TRY(v4_upload_mx(b, s->exp_w2, E, &d->m2));
      *ex += stack * c->top_k / E; /* top_k routed ones of the E, then the shared one */
      b->acct = ex;
      DI_TRY(v4_upload_matrix(b, &s->sh_w1, &d->sh1));
      DI_TRY(v4_upload_matrix(b, &s->sh_w3, &d->sh3));
      DI_TRY(v4_upload_matrix(b, &s->sh_w2, &d->sh2));
      b->acct = NULL;
      continue;
    }
    DI_TRY(v4_upload_experts(b, l, s->exp_w1, &s->sh_w1, E, &d->w1));
    DI_TRY(v4_upload_experts(b, l, s->exp_w3, &s->sh_w3, E, &d->w3));
    DI_TRY(v4_upload_experts(b, l, s->exp_w2, &s->sh_w2, E, &d->w2));
    const int n = b->ep ? cu_epc_per_rank(b->ep) : E; /* stacks of n + 1 (the shared one last) */
    *ex += stack * (c->top_k + 1) / (n + 1);
    b->acct = NULL;
  }
  b->acct = NULL;
  return DI_OK;
}
#undef ACCT

/* ---- cache groups --------------------------------------------------------------------------------- */

static int v4cu_kv_groups(di_backend *base, di_kv_group_info *g, int cap) {
  v4cu *b = (v4cu *)base;
  const int n = di_v4_layout_groups(&b->lay, b->c, (int)sizeof(float), g, cap) /* f32 rows, the CPU layout */;
  if (n > 0 && cap > 0) g[0].bytes_per_seq = (int64_t)(2 * b->state_floats * sizeof(float));
  return n;
}

static void free_pools(v4_pools *p) {
  for (int k = 0; k < DI_V4_N_KINDS; k++) {
    if (p->pool[k]) cudaFree(p->pool[k]);
    p->pool[k] = NULL;
    p->blocks[k] = 0;
  }
}

static di_status alloc_pools(v4cu *b, v4_pools *p, const int64_t *n_blocks, int n_groups) {
  if (b->batch) return di_error_set(DI_ERR_INVALID_ARG, WHO ": kv_alloc while a step is in flight");
  if (n_groups != b->lay.n_groups)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": %d cache groups allocated, the model has %d", n_groups, b->lay.n_groups);
  drop_graphs(b);
  free_pools(p);
  for (int k = 0; k < DI_V4_N_KINDS; k++) {
    const int gi = b->lay.group_of[k];
    if (gi < 0) continue;
    const size_t bytes = (size_t)n_blocks[gi] * b->lay.block_floats[k] * sizeof(float);
    if (n_blocks[gi] < 1) {
      free_pools(p);
      return di_error_set(DI_ERR_INVALID_ARG, WHO ": %lld blocks for cache group %d", (long long)n_blocks[gi], gi);
    }
    cudaError_t e = cudaMalloc((void **)&p->pool[k], bytes);
    if (e == cudaSuccess) e = cudaMemset(p->pool[k], 0, bytes);
    if (e != cudaSuccess) {
      p->pool[k] = NULL;
      free_pools(p);
      return di_error_set(DI_ERR_OOM, WHO ": %zu bytes for %lld blocks of cache group %d: %s", bytes, (long long)n_blocks[gi], gi,
                          cudaGetErrorString(e));
    }
    p->blocks[k] = n_blocks[gi];
  }
  return DI_OK;
}

static di_status v4cu_kv_alloc_groups(di_backend *base, const int64_t *n_blocks, int n_groups) {
  v4cu *b = (v4cu *)base;
  return alloc_pools(b, &b->eng, n_blocks, n_groups);
}

/* Batches without group tables: every group gets n_blocks blocks of this backend's own pools. */
static di_status v4cu_kv_alloc(di_backend *base, int64_t n_blocks) {
  v4cu *b = (v4cu *)base;
  if (n_blocks < 1) return di_error_set(DI_ERR_INVALID_ARG, WHO ": %lld KV blocks", (long long)n_blocks);
  int64_t nb[DI_KV_MAX_GROUPS];
  for (int g = 0; g < b->lay.n_groups; g++) nb[g] = n_blocks;
  return alloc_pools(b, &b->own, nb, b->lay.n_groups);
}

static di_status v4cu_memory_info(di_backend *base, int max_step_tokens, int max_outputs, int64_t *total, int64_t *used) {
  (void)base;
  (void)max_step_tokens;
  (void)max_outputs;
  size_t fr = 0, tot = 0;
  DI_CU(cudaMemGetInfo(&fr, &tot));
  *total = (int64_t)tot;
  *used = (int64_t)(tot - fr);
  return DI_OK;
}

/* ---- sequences ------------------------------------------------------------------------------------- */

static v4_dseq *find(v4cu *b, uint64_t key) {
  for (int i = 0; i < b->n_seqs; i++)
    if (b->seqs[i].key == key) return &b->seqs[i];
  return NULL;
}

static void v4cu_release(di_backend *base, uint64_t key) {
  v4cu *b = (v4cu *)base;
  v4_dseq *s = find(b, key);
  if (!s) return;
  cudaFree(s->state);
  cudaFree(s->next);
  *s = b->seqs[--b->n_seqs];
}

static void seq_pages(const v4cu *b, const di_batch *bt, int q, di_v4_pages *pg) {
  di_v4_batch_pages(&b->lay, b->cur->pool, b->cur->blocks, bt, q, pg);
}

static di_status seq_span(const di_batch *bt, int q, int from, int *t0, int *n) {
  return di_v4_batch_span(bt, q, from, t0, n, WHO);
}

/* The batch's checks (di_v4_batch_check, as the CPU backend's) and this backend's own: group tables, no
 * replay, each sequence continuing its state or resuming from its blocks. A bad batch changes nothing. */
static di_status check_batch(v4cu *b, const di_batch *bt) {
  DI_TRY(di_v4_batch_check(bt, b->c->vocab_size, b->lay.n_groups, WHO));
  if (bt->n_groups > 0 && !b->cur->pool[DI_V4_G_WINDOW])
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": the batch carries cache groups' tables but %s was not called",
                        b->cur == &b->own ? "kv_alloc" : "kv_alloc_groups");
  if (bt->seq_replay)
    for (int q = 0; q < bt->n_seqs; q++)
      if (bt->seq_replay[q] > 0)
        return di_error_set(DI_ERR_UNSUPPORTED, WHO ": SWA bounded replay (--swa-bounded-replay) is not supported on CUDA yet");
  int from = 0;
  for (int q = 0; q < bt->n_seqs; q++) {
    int t0, n;
    DI_TRY(seq_span(bt, q, from, &t0, &n));
    if (n == 0) continue;
    from = t0 + n;
    const v4_dseq *s = find(b, bt->seqs[q].key);
    const int64_t have = s ? s->n_pos : 0, p0 = bt->positions[t0];
    const int resume = p0 > 0 && (!s || p0 != have);
    if (resume && s)
      return di_error_set(DI_ERR_INVALID_ARG, WHO ": sequence key %llu continues at position %lld but its state holds %lld tokens",
                          (unsigned long long)bt->seqs[q].key, (long long)p0, (long long)have);
    di_v4_pages pg;
    seq_pages(b, bt, q, &pg);
    di_status st = di_v4_pages_check(&pg, p0, n, 0, 0, resume);
    if (st != DI_OK) return di_error_wrap(st, "sequence key %llu: ", (unsigned long long)bt->seqs[q].key);
  }
  return DI_OK;
}

/* The device state of sequence q starting at p0: its own, or a new one (restored from the snapshot
 * of block p0/64 - 1 when p0 > 0: a prefix hit or a resumed sequence). */
static di_status get_state(v4cu *b, uint64_t key, int64_t p0, const di_v4_pages *pg, v4_dseq **out) {
  v4_dseq *s = find(b, key);
  if (!s) {
    if (!di_grow((void **)&b->seqs, &b->cap_seqs, b->n_seqs + 1, sizeof *b->seqs, 16))
      return di_error_set(DI_ERR_OOM, WHO ": out of memory for the sequence table");
    v4_dseq ns = {key, NULL, NULL, 0};
    const size_t bytes = (b->state_floats ? b->state_floats : 4) * sizeof(float);
    cudaError_t e = cudaMalloc((void **)&ns.state, bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ns.next, bytes);
    if (e == cudaSuccess) e = cudaMemset(ns.state, 0, bytes);
    if (e != cudaSuccess) {
      cudaFree(ns.state);
      return di_error_set(DI_ERR_OOM, WHO ": %zu bytes of sequence state: %s", 2 * bytes, cudaGetErrorString(e));
    }
    if (p0 > 0 && b->state_floats) {
      const float *snap = di_v4_state_block(pg, p0 / DI_KV_BLOCK_SIZE - 1);
      DI_CU(cudaMemcpyAsync(ns.state, snap, bytes, cudaMemcpyDeviceToDevice, b->stream));
    }
    ns.n_pos = p0;
    b->seqs[b->n_seqs] = ns;
    s = &b->seqs[b->n_seqs++];
  }
  if (p0 == 0) s->n_pos = 0;
  *out = s;
  return DI_OK;
}

/* ---- the step ------------------------------------------------------------------------------------- */

/* The step as its kernels see it. Eager steps: the batch's own sizes. Graph steps (graph = 1): the bucket's
 * (T, n_out padded to powers of two; max_csa / max_hca and the list bounds from the bucket), the real
 * counts on the device in `counts`. */
typedef struct step_meta {
  int graph;
  int T, n_seqs, n_out, max_csa, max_hca;    /* rows the kernels run over; entry bounds (score / sel strides) */
  int S_p;                                   /* graph: sequences rounded up (the bucket's) */
  int32_t *tok, *pos, *seq_of, *rows;       /* device */
  di_v4k_seq *seqs;                          /* device */
  di_v4k_entry *ent_csa, *ent_hca;           /* device */
  int n_ent_csa, n_ent_hca;                  /* the lists' lengths (eager) or bounds (graph): the grids */
  di_v4k_swrite *sw_csa, *sw_hca;            /* device */
  int n_sw_csa, n_sw_hca;
  int32_t *counts;                           /* graph: device [tokens, csa entries, hca entries, csa writes, hca writes]; else NULL */
  di_cuk_sample_row *srows;                  /* device: the in-step sampling rows (n_out of them), or NULL */
} step_meta;

static int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}
/* A graph's bound on a count of compressed entries: rounded up to a multiple of 1/32 of its power of two
 * (at least 64), so a context that grows by decode takes a new graph rarely (at 4K every 256 decode steps,
 * at 128K every 8192) and the bound wastes at most ~1/32 (the score / selection / attention scratch and the
 * indexer's grid follow it: its CTAs past a query's entries return at once, but each still costs a launch
 * slot; with an eighth, graphs were ~1% slower than eager at batch 64-256 on the H200, session 12). */
static int entries_bucket(int n) {
  if (n <= 0) return 0;
  const int p = pow2_at_least(n), g = p / 32 > 64 ? p / 32 : 64;
  return (n + g - 1) / g * g;
}

static di_v4k_comp comp_desc(v4cu *b, int l, int index, const float *kv, const float *gate) {
  const di_v4_config *c = b->c;
  di_v4k_comp d;
  memset(&d, 0, sizeof d);
  const int csa = c->attn_kind[l] == DI_V4_ATTN_CSA;
  d.kind = csa ? (index ? DI_V4_G_INDEX : DI_V4_G_CSA) : DI_V4_G_HCA;
  d.rate = csa ? c->csa_rate : c->hca_rate;
  d.overlap = csa;
  d.dim = index ? c->index_head_dim : c->head_dim;
  d.width = csa ? 2 * d.dim : d.dim;
  d.lidx = b->lay.lidx[l];
  d.n_in = csa ? b->lay.n_csa : b->lay.n_hca;
  d.slots = b->lay.slots[d.kind];
  d.snap_off = (int64_t)(b->lay.snap_off[l] + (index ? b->lay.snap_floats[l] : 0));
  d.pool = b->cur->pool[d.kind];
  d.kv = kv;
  d.gate = gate;
  d.norm = index ? b->L[l].icomp.norm : b->L[l].comp.norm;
  return d;
}

/* Projections, ape, pooling and open windows of one compressor over the step. */
static di_status run_comp(v4cu *b, const step_meta *m, int l, int index, const float *a, float *kv, float *gate,
                          di_v4k_comp *out) {
  const di_v4_config *c = b->c;
  const v4_dcomp *dc = index ? &b->L[l].icomp : &b->L[l].comp;
  di_v4k_comp d = comp_desc(b, l, index, kv, gate);
  cudaStream_t s = b->stream;
  DI_TRY(lin2(b, a, c->hidden_size, m->T, c->hidden_size, &dc->wkv, d.width, kv, d.width, &dc->wgate, d.width, gate, d.width));
  DI_TRY(di_v4k_add_ape(gate, dc->ape, m->pos, m->T, d.rate, d.width, s));
  const int csa = d.overlap;
  const int32_t *cnt = m->counts;
  DI_TRY(di_v4k_pool(&d, m->seqs, csa ? m->ent_csa : m->ent_hca, csa ? m->n_ent_csa : m->n_ent_hca,
                     cnt ? cnt + (csa ? 1 : 2) : NULL, b->inv_comp, c->rope_compress.dim, b->af_comp, (float)c->rms_eps, s));
  DI_TRY(di_v4k_state_write(&d, m->seqs, csa ? m->sw_csa : m->sw_hca, csa ? m->n_sw_csa : m->n_sw_hca,
                            cnt ? cnt + (csa ? 3 : 4) : NULL, s));
  *out = d;
  return DI_OK;
}

/* The CSA indexer of layer l on b->stream: its compressor, the roped index queries from qr, the head weights, the
 * scores and top-k picks into sel. */
static di_status indexer(v4cu *b, const step_meta *m, int l, const float *a, const float *qr, int max_n, unsigned char **sel) {
  const di_v4_config *c = b->c;
  const v4_dlayer *L = &b->L[l];
  const int T = m->T, D = c->hidden_size, ql = c->q_lora_rank, nh = c->index_n_heads, di = c->index_head_dim;
  SCR(ikv, S_IKV, float, (size_t)T * 2 * di);
  SCR(ig, S_IGATE, float, (size_t)T * 2 * di);
  SCR(iq, S_IQ, float, (size_t)T * nh * di);
  SCR(iw, S_IW, float, (size_t)T * nh);
  SCR(score, S_SCORE, float, (size_t)T * (max_n > 0 ? max_n : 1));
  SCR(selb, S_SEL, unsigned char, (size_t)T * (max_n > 0 ? max_n : 1));
  /* forked with a third stream (DEEPINFER_CUDA_V4_FORK bit 4): the index queries and head weights on aside[2]
   * (waiting on the fork like the others) beside the indexer's compressor here, joined before the scores */
  const int split = b->aside[2] && b->stream == b->aside[1];
  if (split) {
    cudaStream_t s1 = b->stream;
    b->stream = b->aside[2];
    DI_CU(cudaStreamWaitEvent(b->aside[2], b->ev_afork, 0));
    di_status st = lin(b, qr, ql, &L->idx_wq_b, T, nh * di, ql, iq, nh * di);
    if (st == DI_OK) st = lin(b, a, D, &L->idx_weights, T, nh, D, iw, nh);
    if (st == DI_OK)
      st = di_v4k_rope(iq, di, T * nh, di, nh, m->pos, b->inv_comp, c->rope_compress.dim, b->af_comp, 1, b->stream);
    if (st == DI_OK && cudaEventRecord(b->ev_ajoin[2], b->aside[2]) != cudaSuccess)
      st = di_error_set(DI_ERR_BACKEND, WHO ": cannot record the index queries' event");
    b->stream = s1;
    DI_TRY(st);
  }
  di_v4k_comp icomp;
  prof_mark(b, l, DI_V4_PROF_INDEX);
  DI_TRY(run_comp(b, m, l, 1, a, ikv, ig, &icomp));
  if (split) DI_CU(cudaStreamWaitEvent(b->stream, b->ev_ajoin[2], 0));
  else {
    DI_TRY(lin(b, qr, ql, &L->idx_wq_b, T, nh * di, ql, iq, nh * di));
    DI_TRY(lin(b, a, D, &L->idx_weights, T, nh, D, iw, nh));
    DI_TRY(di_v4k_rope(iq, di, T * nh, di, nh, m->pos, b->inv_comp, c->rope_compress.dim, b->af_comp, 1, b->stream));
  }
  DI_TRY(di_v4k_indexer(iq, iw, m->pos, m->seq_of, m->seqs, &icomp, T, nh, di, c->index_topk, max_n, score, selb, b->stream));
  *sel = selb;
  return DI_OK;
}

/* The compressor (and for CSA the indexer) of layer l on two streams of their own beside the q path
 * (DEEPINFER_CUDA_V4_FORK bit 2; forked from the stream after q_norm, joined by the caller through ev_ajoin): they
 * read only a and qr and write buffers the q path does not touch (the compressor's projections, entries, open
 * windows; the indexer's), so the same results. */
static di_status comp_forked(v4cu *b, const step_meta *m, int l, const float *a, const float *qr, float *ckv, float *cg,
                             int csa, int max_n, di_v4k_comp *comp, unsigned char **sel) {
  cudaStream_t s = b->stream;
  DI_CU(cudaEventRecord(b->ev_afork, s));
  DI_CU(cudaStreamWaitEvent(b->aside[0], b->ev_afork, 0));
  if (csa) DI_CU(cudaStreamWaitEvent(b->aside[1], b->ev_afork, 0));
  b->stream = b->aside[0];
  di_status st = run_comp(b, m, l, 0, a, ckv, cg, comp);
  if (st == DI_OK && cudaEventRecord(b->ev_ajoin[0], b->aside[0]) != cudaSuccess)
    st = di_error_set(DI_ERR_BACKEND, WHO ": cannot record the compressor's event");
  if (st == DI_OK && csa) {
    b->stream = b->aside[1];
    st = indexer(b, m, l, a, qr, max_n, sel);
    if (st == DI_OK && cudaEventRecord(b->ev_ajoin[1], b->aside[1]) != cudaSuccess)
      st = di_error_set(DI_ERR_BACKEND, WHO ": cannot record the indexer's event");
  }
  b->stream = s;
  return st;
}

static di_status attention(v4cu *b, const step_meta *m, int l, const float *a, float *out) {
  const di_v4_config *c = b->c;
  const v4_dlayer *L = &b->L[l];
  const int T = m->T, D = c->hidden_size, H = c->n_heads, hd = c->head_dim, ql = c->q_lora_rank, kind = c->attn_kind[l];
  const float eps = (float)c->rms_eps;
  cudaStream_t s = b->stream;
  const float *inv = kind == DI_V4_ATTN_SLIDING ? b->inv_main : b->inv_comp;
  const float af = kind == DI_V4_ATTN_SLIDING ? b->af_main : b->af_comp;
  const int rd = kind == DI_V4_ATTN_SLIDING ? c->rope_main.dim : c->rope_compress.dim;
  SCR(qr, S_QR, float, (size_t)T * ql);
  SCR(q, S_Q, float, (size_t)T * H * hd);
  SCR(kv, S_KV, float, (size_t)T * hd);
  prof_mark(b, l, DI_V4_PROF_QKV);
  DI_TRY(lin2(b, a, D, T, D, &L->wq_a, ql, qr, ql, &L->wkv, hd, kv, hd));
  DI_TRY(di_v4k_rmsnorm(qr, ql, T, ql, L->q_norm, eps, s));
  /* one token: the compressor and indexer beside the q path (not in the tc mode: its GEMM's tile counters are one
   * buffer; not under the phase profile: its events are on one stream) */
  const int fork = b->aside[0] && T == 1 && !b->tc && !b->prof && kind != DI_V4_ATTN_SLIDING;
  di_v4k_comp comp;
  const di_v4k_comp *cp = NULL;
  unsigned char *sel = NULL;
  int max_n = 0;
  const int csa = kind == DI_V4_ATTN_CSA;
  float *ckv = NULL, *cg = NULL;
  if (kind != DI_V4_ATTN_SLIDING) {
    const int w = 2 * hd * (csa ? 1 : 0) + hd * (csa ? 0 : 1);
    DI_TRY(scratch(b, S_CKV, sizeof(float) * (size_t)T * w, (void **)&ckv));
    DI_TRY(scratch(b, S_CGATE, sizeof(float) * (size_t)T * w, (void **)&cg));
    max_n = csa ? m->max_csa : m->max_hca;
    cp = &comp;
  }
  if (fork) DI_TRY(comp_forked(b, m, l, a, qr, ckv, cg, csa, max_n, &comp, &sel));
  DI_TRY(lin(b, qr, ql, &L->wq_b, T, H * hd, ql, q, H * hd));
  DI_TRY(di_v4k_rmsnorm_rope(q, hd, T * H, hd, NULL, eps, H, m->pos, inv, rd, af, s));
  DI_TRY(di_v4k_rmsnorm_rope_window(kv, T, hd, L->kv_norm, eps, m->pos, inv, rd, af, m->seq_of, m->seqs,
                                    b->cur->pool[DI_V4_G_WINDOW], c->n_layers, l, m->counts, s));
  if (fork) {
    DI_CU(cudaStreamWaitEvent(s, b->ev_ajoin[0], 0));
    if (csa) DI_CU(cudaStreamWaitEvent(s, b->ev_ajoin[1], 0));
  } else if (kind != DI_V4_ATTN_SLIDING) {
    prof_mark(b, l, DI_V4_PROF_COMP);
    DI_TRY(run_comp(b, m, l, 0, a, ckv, cg, &comp));
    if (csa) DI_TRY(indexer(b, m, l, a, qr, max_n, &sel));
  }
  const size_t keys = (size_t)c->sliding_window + max_n;
  SCR(p, S_P, float, (size_t)T * H * keys);
  SCR(ex, S_EX, double, di_v4k_attend_ex(T, H, c->sliding_window, max_n));
  SCR(o, S_O, float, (size_t)T * H * hd);
  prof_mark(b, l, DI_V4_PROF_ATTEND);
  DI_TRY(di_v4k_attend(q, m->pos, m->seq_of, m->seqs, b->cur->pool[DI_V4_G_WINDOW], c->n_layers, l, c->sliding_window, cp,
                       kind == DI_V4_ATTN_HCA, sel, max_n, L->sink, T, H, hd, inv, rd, af, p, ex, o, s));
  /* grouped output: wo_a's rows [g*R, (g+1)*R) over slice g of the heads' outputs, then wo_b */
  const int G = c->o_groups, R = c->o_lora_rank, gin = H * hd / G;
  SCR(mid, S_MID, float, (size_t)T * G * R);
  prof_mark(b, l, DI_V4_PROF_OUT);
  DI_TRY(lin_groups(b, o, H * hd, &L->wo_a, T, R, gin, mid, G * R, G, gin, (int64_t)R * gin, R));
  return lin(b, mid, G * R, &L->wo_b, T, D, G * R, out, D);
}

/* Expert parallel (cuda_ep.cu): the received rows x [n] (D floats) through this rank's experts (local
 * slots e: the routed block, then the shared one) into y [n], with the kernels and per-slot order of
 * one GPU (a slot's sums do not depend on the tiling), so EP N == one GPU bit for bit. */
static di_status v4_ep_compute(void *user, int l, const void *x, const int32_t *e, int n, void *y) {
  v4cu *b = (v4cu *)user;
  const di_v4_config *c = b->c;
  const v4_dlayer *L = &b->L[l];
  const int D = c->hidden_size, I = c->moe_inter, E1 = cu_epc_per_rank(b->ep) + 1;
  cudaStream_t s = b->stream;
  SCR(act, S_EPACT, float, (size_t)n * I);
  int32_t *tiles = NULL;
  if (n > 1) {
    SCR(work, S_EPTILES, int32_t, 1 + 3 * (size_t)di_v4k_expert_max_tiles(n, 1, E1) + (size_t)n);
    DI_TRY(di_v4k_expert_tiles(e, n, 1, E1, work, s));
    tiles = work;
  }
  DI_TRY(di_v4k_expert_up((const float *)x, e, tiles, E1, L->w1, L->w3, b->wf32, n, 1, D, I, (float)c->swiglu_limit,
                          act, s));
  return di_v4k_expert_down(act, e, tiles, E1, L->w2, b->wf32, n, 1, D, I, (float *)y, s);
}

/* EPLB: logical expert e of layer l into local slot j (w1, w3, w2 rows), from the host weights */
static di_status v4_ep_upload(void *user, int l, int e, int j, int *done) {
  v4cu *b = (v4cu *)user;
  const di_v4_layer *s = &b->w->layers[l];
  v4_dlayer *d = &b->L[l];
  const di_weight *src[3] = {&s->exp_w1[e], &s->exp_w3[e], &s->exp_w2[e]};
  void *dst[3] = {d->w1, d->w3, d->w2};
  for (int k = 0; k < 3; k++)
    DI_TRY(v4_upload_rows(b, src[k], (char *)dst[k] + (size_t)(src[k]->rows * src[k]->cols) * b->wsize * (size_t)j));
  DI_CU(cudaDeviceSynchronize());
  *done = 1;
  return DI_OK;
}

static di_status moe(v4cu *b, const step_meta *m, int l, const float *x, float *out) {
  const di_v4_config *c = b->c;
  const v4_dlayer *L = &b->L[l];
  const int T = m->T, D = c->hidden_size, E = c->n_routed_experts, K = c->top_k, I = c->moe_inter, ns = K + 1;
  cudaStream_t s = b->stream;
  SCR(lg, S_RLOG, float, (size_t)T * E);
  SCR(ids, S_IDS, int32_t, (size_t)T * ns);
  SCR(wts, S_WTS, float, (size_t)T * ns);
  SCR(act, S_ACT, float, (size_t)T * ns * I);
  SCR(y, S_Y, float, (size_t)T * ns * D);
  prof_mark(b, l, DI_V4_PROF_ROUTE);
  DI_TRY(di_v4k_linear(x, D, L->router, 1, T, E, D, lg, E, s));
  DI_TRY(di_v4k_route(lg, L->router_bias, L->tid2eid, m->tok, T, E, K, c->scoring == DI_V4_SCORE_SIGMOID,
                      (float)c->routed_scaling, ids, wts, s));
  prof_mark(b, l, DI_V4_PROF_EXPERTS);
  if (b->ep) { /* the slots' rows on the ranks holding their experts (the shared one here), back per slot */
    const cu_ep_rows r = {ids, T, ns, x, sizeof(float) * (size_t)D, y, sizeof(float) * (size_t)D};
    DI_TRY(cu_epc_run(b->ep, l, 1, &r, NULL));
    return di_v4k_moe_combine(y, ids, wts, T, ns, D, out, s);
  }
  /* one token: every slot its own expert (tiles would only add a launch); more, or the MXFP4 tensor-core form
   * (DEEPINFER_CUDA_V4_MX_TC: steps of >= mx_tc tokens; 1: every step, so batch-invariant): grouped by expert */
  const int mx_tc = L->mx && b->mx_tc > 0 && T >= b->mx_tc && di_v4k_mx_tc_ok(L->m1, L->m3, L->m2, D, I);
  int32_t *tiles = NULL;
  if (T > 1 || mx_tc) {
    SCR(work, S_TILES, int32_t, 1 + 3 * (size_t)di_v4k_expert_max_tiles(T, ns, E + 1) + (size_t)T * ns);
    DI_TRY(di_v4k_expert_tiles(ids, T, ns, E + 1, work, s));
    tiles = work;
  }
  const float lim = (float)c->swiglu_limit;
  if (L->mx) { /* routed experts MXFP4; the shared one (slot 0 of every token) on its own weights */
    SCR(gu, S_SHGU, float, (size_t)T * 2 * I);
    /* one token: the shared expert on the side stream (its own buffers: gu, its act / y slot 0, the bf16 copies)
     * while the routed slots run here; joined before the combine (H200: 4.35 -> 4.23 ms a step at batch 1; at
     * batch 64 the fork was ~2% slower, so only at one token) */
    const int fork = b->side != NULL && T == 1;
    if (fork) {
      DI_CU(cudaEventRecord(b->ev_fork, s));
      DI_CU(cudaStreamWaitEvent(b->side, b->ev_fork, 0));
      b->stream = b->side;
    }
    di_status st = lin2(b, x, D, T, D, &L->sh1, I, gu, 2 * I, &L->sh3, I, gu + I, 2 * I);
    if (st == DI_OK) st = di_v4k_swiglu(gu, gu + I, 2 * I, T, I, lim, act, ns * I, b->stream);
    if (st == DI_OK) st = lin(b, act, ns * I, &L->sh2, T, D, I, y, ns * D);
    if (fork) {
      b->stream = s;
      if (st == DI_OK && cudaEventRecord(b->ev_join, b->side) != cudaSuccess)
        st = di_error_set(DI_ERR_BACKEND, WHO ": cannot record the shared expert's event");
    }
    DI_TRY(st);
    if (mx_tc) { /* k_mxfp4_tc_grouped.cu */
      SCR(ws, S_MXTC, uint8_t, di_v4k_mx_tc_ws_bytes(T, ns, D, I, E + 1));
      DI_TRY(di_v4k_experts_mx_tc(x, ids, tiles, E + 1, L->m1, L->m3, L->m2, T, ns, D, I, lim, ws, y, s));
    } else {
      DI_TRY(di_v4k_expert_up_mx(x, ids, tiles, E + 1, L->m1, L->m3, T, ns, D, I, lim, act, s));
      DI_TRY(di_v4k_expert_down_mx(act, ids, tiles, E + 1, L->m2, T, ns, D, I, y, s));
    }
    if (fork) DI_CU(cudaStreamWaitEvent(s, b->ev_join, 0));
    return di_v4k_moe_combine(y, ids, wts, T, ns, D, out, s);
  }
  DI_TRY(di_v4k_expert_up(x, ids, tiles, E + 1, L->w1, L->w3, b->wf32, T, ns, D, I, lim, act, s));
  DI_TRY(di_v4k_expert_down(act, ids, tiles, E + 1, L->w2, b->wf32, T, ns, D, I, y, s));
  return di_v4k_moe_combine(y, ids, wts, T, ns, D, out, s);
}

static di_status tok_room(v4cu *b, int n);

/* Host metadata of the step into one device block (the block tables into their own, S_TAB), queued on
 * the stream behind the previous step; graph = 1: laid out for the step's graph bucket (see the file
 * comment), else for its exact sizes. Then the feedback placeholders are resolved on the device. */
static di_status build_meta(v4cu *b, const di_batch *bt, step_meta *m, int graph) {
  const di_v4_config *c = b->c;
  const int T = bt->n_tokens, S = bt->n_seqs, B = DI_KV_BLOCK_SIZE, n_out = bt->n_outputs;
  memset(m, 0, sizeof *m);
  /* counts first */
  int n_ec = 0, n_eh = 0, n_wc = 0, n_wh = 0, tab_total = 0, max_csa = 0, max_hca = 0;
  for (int q = 0; q < S; q++) {
    int t0, n;
    DI_TRY(seq_span(bt, q, 0, &t0, &n));
    if (!n) continue;
    const int64_t p0 = bt->positions[t0], end = p0 + n;
    n_ec += (int)(end / c->csa_rate - p0 / c->csa_rate);
    n_eh += (int)(end / c->hca_rate - p0 / c->hca_rate);
    const int snaps = (int)(end / B - p0 / B) + 1;
    n_wc += snaps;
    n_wh += snaps;
    for (int g = 0; g < bt->n_groups; g++) tab_total += bt->group_blocks[(size_t)q * bt->n_groups + g];
    const int mc = (int)(end / c->csa_rate), mh = (int)(end / c->hca_rate);
    max_csa = mc > max_csa ? mc : max_csa;
    max_hca = mh > max_hca ? mh : max_hca;
  }
  /* the kernels' sizes: the batch's, or its bucket's. Bounds of a bucket: a sequence's n tokens close at
   * most n windows of a compressor, and need one state write plus at most (n - 1) / 64 + 1 snapshots. */
  const int Tp = graph ? pow2_at_least(T) : T, Sp = graph ? pow2_at_least(S) : S;
  const int n_out_p = graph ? pow2_at_least(n_out > 0 ? n_out : 1) : n_out;
  const int cap_e = graph ? Tp : 0, cap_w = graph ? 2 * Sp + Tp / B + 1 : 0;
  if (graph && (n_ec > cap_e || n_eh > cap_e || n_wc > cap_w))
    return di_error_set(DI_ERR_BACKEND, WHO ": a graph step's lists exceed their bounds (%d, %d entries of %d; %d writes of %d)",
                        n_ec, n_eh, cap_e, n_wc, cap_w);
  const int sample = bt->sample_rows && n_out > 0;
  m->graph = graph;
  m->T = Tp;
  m->n_seqs = S;
  m->S_p = Sp;
  m->n_out = n_out_p;
  m->max_csa = graph ? entries_bucket(max_csa) : max_csa;
  m->max_hca = graph ? entries_bucket(max_hca) : max_hca;
  m->n_ent_csa = graph ? cap_e : n_ec;
  m->n_ent_hca = graph ? cap_e : n_eh;
  m->n_sw_csa = graph ? cap_w : n_wc;
  m->n_sw_hca = graph ? cap_w : n_wh;
  if (sample) DI_TRY(tok_room(b, n_out_p)); /* (before any address below is taken: it may drop the graphs) */
  /* layout of the block (bytes, 16-aligned parts); the tables after it in the host copy */
  size_t off = 0;
#define PART(name, bytes) const size_t name = off; off += ((size_t)(bytes) + 15) & ~(size_t)15
  PART(o_tok, 4 * (size_t)Tp);
  PART(o_pos, 4 * (size_t)Tp);
  PART(o_seq, 4 * (size_t)Tp);
  PART(o_rows, 4 * (size_t)(n_out_p + 1));
  PART(o_seqs, sizeof(di_v4k_seq) * (size_t)(Sp + 1));
  PART(o_ec, sizeof(di_v4k_entry) * (size_t)(m->n_ent_csa + 1));
  PART(o_eh, sizeof(di_v4k_entry) * (size_t)(m->n_ent_hca + 1));
  PART(o_wc, sizeof(di_v4k_swrite) * (size_t)(m->n_sw_csa + 1));
  PART(o_wh, sizeof(di_v4k_swrite) * (size_t)(m->n_sw_hca + 1));
  PART(o_cnt, 4 * 8);
  PART(o_zero, 16); /* the padding sequence's block table: block 0 */
  PART(o_srows, sample ? sizeof(di_cuk_sample_row) * (size_t)n_out_p : 0);
  const size_t fixed = off;
  PART(o_tab, 4 * (size_t)(tab_total + 1));
#undef PART
  char *dev, *dtab;
  DI_TRY(scratch(b, S_META, fixed, (void **)&dev));
  DI_TRY(scratch(b, S_TAB, off - fixed, (void **)&dtab));
  const int k = b->meta_par;
  b->meta_par ^= 1;
  DI_CU(cudaEventSynchronize(b->ev_meta[k])); /* this buffer's last copy has run */
  if (b->h_meta_cap[k] < off) {
    if (b->h_meta[k]) cudaFreeHost(b->h_meta[k]);
    b->h_meta[k] = NULL;
    b->h_meta_cap[k] = 0;
    const size_t cap = off + off / 2 + 4096;
    if (cudaHostAlloc((void **)&b->h_meta[k], cap, cudaHostAllocDefault) != cudaSuccess)
      return di_error_set(DI_ERR_OOM, WHO ": %zu bytes of pinned host memory for the step's metadata", cap);
    b->h_meta_cap[k] = cap;
  }
  char *h = (char *)b->h_meta[k];
  memset(h, 0, fixed);
  memcpy(h + o_tok, bt->tokens, 4 * (size_t)T);
  memcpy(h + o_pos, bt->positions, 4 * (size_t)T);
  memcpy(h + o_seq, bt->seq_of, 4 * (size_t)T);
  for (int t = T; t < Tp; t++) ((int32_t *)(h + o_seq))[t] = S; /* padding: token 0 at position 0 of the spare sequence */
  if (n_out) memcpy(h + o_rows, bt->output_rows, 4 * (size_t)n_out); /* (padding output rows: row 0) */
  di_v4k_seq *hs = (di_v4k_seq *)(h + o_seqs);
  di_v4k_entry *ec = (di_v4k_entry *)(h + o_ec), *eh = (di_v4k_entry *)(h + o_eh);
  di_v4k_swrite *wc = (di_v4k_swrite *)(h + o_wc), *wh = (di_v4k_swrite *)(h + o_wh);
  int32_t *tabs = (int32_t *)(h + o_tab);
  int tab_at = 0;
  n_ec = n_eh = n_wc = n_wh = 0;
  for (int q = 0; q < S; q++) {
    int t0, n;
    DI_TRY(seq_span(bt, q, 0, &t0, &n));
    di_v4k_seq *d = &hs[q];
    if (!n) continue;
    const int64_t p0 = bt->positions[t0], end = p0 + n;
    di_v4_pages pg;
    seq_pages(b, bt, q, &pg);
    v4_dseq *st;
    DI_TRY(get_state(b, bt->seqs[q].key, p0, &pg, &st));
    d->t0 = t0;
    d->n = n;
    d->pos0 = (int32_t)p0;
    d->state = st->state;
    for (int k2 = 0; k2 < DI_V4_N_KINDS; k2++) {
      if (b->lay.group_of[k2] < 0) continue;
      memcpy(tabs + tab_at, pg.table[k2], 4 * (size_t)pg.n[k2]);
      d->tab[k2] = (const int32_t *)dtab + tab_at;
      tab_at += pg.n[k2];
    }
    for (int64_t e = p0 / c->csa_rate; e < end / c->csa_rate; e++) ec[n_ec++] = (di_v4k_entry){q, (int32_t)e};
    for (int64_t e = p0 / c->hca_rate; e < end / c->hca_rate; e++) eh[n_eh++] = (di_v4k_entry){q, (int32_t)e};
    /* the new state, then the snapshots of the blocks this step completes */
    wc[n_wc++] = (di_v4k_swrite){q, (int32_t)end, st->next};
    wh[n_wh++] = (di_v4k_swrite){q, (int32_t)end, st->next};
    if (b->lay.group_of[DI_V4_G_STATE] >= 0)
      for (int64_t blk = p0 / B; (blk + 1) * B <= end; blk++) {
        float *snap = di_v4_state_block(&pg, blk);
        wc[n_wc++] = (di_v4k_swrite){q, (int32_t)((blk + 1) * B), snap};
        wh[n_wh++] = (di_v4k_swrite){q, (int32_t)((blk + 1) * B), snap};
      }
  }
  if (graph) /* the spare sequence of the padding tokens: no tokens, no entries, every table block 0 */
    for (int k2 = 0; k2 < DI_V4_N_KINDS; k2++) hs[S].tab[k2] = (const int32_t *)(dev + o_zero);
  int32_t *cnt = (int32_t *)(h + o_cnt);
  cnt[0] = T;
  cnt[1] = n_ec;
  cnt[2] = n_eh;
  cnt[3] = n_wc;
  cnt[4] = n_wh;
  if (sample) { /* the in-step sampling rows (padding rows: row 0's, greedy; their tokens are not read) */
    di_cuk_sample_row *sr = (di_cuk_sample_row *)(h + o_srows);
    for (int i = 0; i < n_out_p; i++) {
      sr[i] = cuk_row(&bt->sample_rows[i < n_out ? i : 0]);
      if (i >= n_out) sr[i].temperature = 0.f;
      if (i < n_out) b->h_srows[i] = sr[i]; /* (same_rows compares with them) */
    }
  }
  DI_CU(cudaMemcpyAsync(dev, h, fixed, cudaMemcpyHostToDevice, b->stream));
  DI_CU(cudaMemcpyAsync(dtab, h + o_tab, off - o_tab, cudaMemcpyHostToDevice, b->stream));
  DI_CU(cudaEventRecord(b->ev_meta[k], b->stream));
  m->tok = (int32_t *)(dev + o_tok);
  m->pos = (int32_t *)(dev + o_pos);
  m->seq_of = (int32_t *)(dev + o_seq);
  m->rows = (int32_t *)(dev + o_rows);
  m->seqs = (di_v4k_seq *)(dev + o_seqs);
  m->ent_csa = (di_v4k_entry *)(dev + o_ec);
  m->ent_hca = (di_v4k_entry *)(dev + o_eh);
  m->sw_csa = (di_v4k_swrite *)(dev + o_wc);
  m->sw_hca = (di_v4k_swrite *)(dev + o_wh);
  m->counts = graph ? (int32_t *)(dev + o_cnt) : NULL;
  m->srows = sample ? (di_cuk_sample_row *)(dev + o_srows) : NULL;
  if (!graph) { /* eager: the lists' exact lengths */
    m->n_ent_csa = n_ec;
    m->n_ent_hca = n_eh;
    m->n_sw_csa = n_wc;
    m->n_sw_hca = n_wh;
  }
  if (b->fb_n > 0) DI_TRY(di_v4k_resolve_tokens(m->tok, T, b->d_tok, b->stream)); /* feedback placeholders */
  return DI_OK;
}

/* d_tok large enough for n rows (its tokens kept: a pending feedback step still reads them). */
static di_status tok_room(v4cu *b, int n) {
  if (n <= b->cap_tok) return DI_OK;
  const int cap = n > 256 ? n : 256;
  int32_t *d = NULL, *h = NULL;
  di_cuk_sample_row *hr = NULL, *dr = NULL;
  DI_CU(cudaStreamSynchronize(b->stream));
  drop_graphs(b); /* (in-step sampling writes d_tok) */
  if (cudaMalloc((void **)&d, sizeof(int32_t) * cap) != cudaSuccess || cudaHostAlloc((void **)&h, sizeof(int32_t) * cap, 0) != cudaSuccess ||
      cudaMalloc((void **)&dr, sizeof *dr * cap) != cudaSuccess || !(hr = (di_cuk_sample_row *)malloc(sizeof *hr * cap))) {
    cudaFree(d);
    cudaFreeHost(h);
    cudaFree(dr);
    return di_error_set(DI_ERR_OOM, WHO ": buffers for sampling %d rows", n);
  }
  if (b->cap_tok) {
    cudaMemcpy(d, b->d_tok, sizeof(int32_t) * b->cap_tok, cudaMemcpyDeviceToDevice);
    memcpy(hr, b->h_srows, sizeof *hr * b->cap_tok);
  }
  cudaFree(b->d_tok);
  cudaFreeHost(b->h_tok);
  cudaFree(b->d_srows);
  free(b->h_srows);
  b->d_tok = d;
  b->h_tok = h;
  b->d_srows = dr;
  b->h_srows = hr;
  b->cap_tok = cap;
  return DI_OK;
}

/* Samples the finished step's n output rows into d_tok (queued on the stream). */
static di_status sample_now(v4cu *b, const di_sample_row *rows, int n) {
  DI_TRY(tok_room(b, n));
  for (int i = 0; i < n; i++) b->h_srows[i] = cuk_row(&rows[i]);
  DI_CU(cudaMemcpyAsync(b->d_srows, b->h_srows, sizeof(di_cuk_sample_row) * (size_t)n, cudaMemcpyHostToDevice, b->stream));
  DI_TRY(di_cuk_sample(b->d_logits, n, b->c->vocab_size, b->d_srows, b->d_tok, b->stream));
  /* the pinned row copy is rewritten by the next call only after this copy ran: sample calls sync, or
   * (feedback) the next sample_async comes after the next step's submit, which ordered it */
  return DI_OK;
}

/* Whether the step's in-step tokens are those of these rows. */
static int same_rows(const v4cu *b, const di_sample_row *rows, int n) {
  if (!b->step_sampled || n != b->n_out) return 0;
  for (int i = 0; i < n; i++) {
    const di_cuk_sample_row r = cuk_row(&rows[i]);
    if (memcmp(&r, &b->h_srows[i], sizeof r) != 0) return 0;
  }
  return 1;
}

/* An mHC site's pre-step: the mixes, then the collapse into `in` on the stream; post and the Sinkhorn (which only
 * hc_post reads) in the same launch, or (DEEPINFER_CUDA_V4_FORK bit 1) on hside beside the sublayer, joined by the
 * caller before hc_post (the same kernel and CTAs either way: the same bits). */
static di_status hc_pre(v4cu *b, const float *X, const float *fn, const float *base, const float *scale, const float *norm, int T,
                        float *in, double *post, double *comb, double *hcp) {
  const di_v4_config *c = b->c;
  const int D = c->hidden_size, hc = c->hc_mult, it = c->hc_sinkhorn_iters;
  const float eps = (float)c->rms_eps, he = (float)c->hc_eps;
  cudaStream_t s = b->stream;
  if (!b->hside) return di_v4k_hc_pre(X, fn, base, scale, norm, T, D, hc, it, eps, he, in, post, comb, hcp, s);
  DI_TRY(di_v4k_hc_pre_parts(X, fn, base, scale, norm, T, D, hc, it, eps, he, in, post, comb, hcp, 1, s));
  DI_CU(cudaEventRecord(b->ev_hfork, s));
  DI_CU(cudaStreamWaitEvent(b->hside, b->ev_hfork, 0));
  DI_TRY(di_v4k_hc_pre_parts(X, fn, base, scale, norm, T, D, hc, it, eps, he, in, post, comb, hcp, 4, b->hside));
  DI_CU(cudaEventRecord(b->ev_hjoin, b->hside));
  return di_v4k_hc_pre_parts(X, fn, base, scale, norm, T, D, hc, it, eps, he, in, post, comb, hcp, 2, s);
}

/* The step's kernels, all on the stream (what a graph captures): embedding, the layers, the head on the
 * output rows, and (sample) the in-step sampling of those rows into d_tok. No host work depends on the
 * step's data here, only on m's sizes. */
static di_status forward(v4cu *b, const step_meta *m, int sample) {
  const di_v4_config *c = b->c;
  const int T = m->T, D = c->hidden_size, hc = c->hc_mult;
  cudaStream_t s = b->stream;
  SCR(X, S_X, float, (size_t)T * hc * D);
  SCR(in, S_IN, float, (size_t)T * D);
  SCR(out, S_OUT, float, (size_t)T * D);
  SCR(post, S_POST, double, (size_t)T * hc);
  SCR(comb, S_COMB, double, (size_t)T * hc * hc);
  SCR(hcp, S_HCP, double, di_v4k_hc_scratch(T > m->n_out ? T : m->n_out, D, hc));
  const float eps = (float)c->rms_eps, hc_eps = (float)c->hc_eps;
  const int NL = c->n_layers;
  b->n_pev = 0;
  prof_mark(b, NL, DI_V4_PROF_EMBED);
  DI_TRY(di_v4k_embed(b->embed.p, b->wf32, m->tok, T, D, hc, X, s));
  for (int l = 0; l < NL; l++) {
    const v4_dlayer *L = &b->L[l];
    prof_mark(b, l, DI_V4_PROF_HC);
    DI_TRY(hc_pre(b, X, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, L->attn_norm, T, in, post, comb, hcp));
    DI_TRY(attention(b, m, l, in, out));
    prof_mark(b, l, DI_V4_PROF_HC);
    if (b->hside) DI_CU(cudaStreamWaitEvent(s, b->ev_hjoin, 0));
    DI_TRY(di_v4k_hc_post(X, out, post, comb, T, D, hc, s));
    DI_TRY(hc_pre(b, X, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, L->ffn_norm, T, in, post, comb, hcp));
    DI_TRY(moe(b, m, l, in, out));
    prof_mark(b, l, DI_V4_PROF_HC);
    if (b->hside) DI_CU(cudaStreamWaitEvent(s, b->ev_hjoin, 0));
    DI_TRY(di_v4k_hc_post(X, out, post, comb, T, D, hc, s));
  }
  prof_mark(b, NL, DI_V4_PROF_HEAD);
  if (m->n_out > 0) {
    SCR(hy, S_HY, float, (size_t)m->n_out * D);
    SCR(lgt, S_LOGITS, float, (size_t)m->n_out * c->vocab_size);
    DI_TRY(di_v4k_head_pre(X, m->rows, m->n_out, b->hc_head_fn, b->hc_head_base, b->hc_head_scale, b->final_norm, D, hc, eps,
                           hc_eps, hy, hcp, s));
    DI_TRY(lin(b, hy, D, &b->head, m->n_out, c->vocab_size, D, lgt, c->vocab_size));
    if (sample) DI_TRY(di_cuk_sample(lgt, m->n_out, c->vocab_size, m->srows, b->d_tok, s)); /* sampling inside the step */
  }
  prof_mark(b, -1, 0);
  return DI_OK;
}

static v4_graph *find_graph(v4cu *b, const step_meta *m, int sample) {
  const int own = b->cur == &b->own;
  for (int i = 0; i < b->n_graphs; i++) {
    v4_graph *g = &b->graphs[i];
    if (g->T == m->T && g->S == m->S_p && g->n_out == m->n_out && g->max_csa == m->max_csa && g->max_hca == m->max_hca &&
        g->sample == sample && g->own == own)
      return g;
  }
  if (b->n_graphs == V4_MAX_GRAPHS) drop_graphs(b);
  v4_graph *g = &b->graphs[b->n_graphs++];
  memset(g, 0, sizeof *g);
  g->T = m->T;
  g->S = m->S_p;
  g->n_out = m->n_out;
  g->max_csa = m->max_csa;
  g->max_hca = m->max_hca;
  g->sample = sample;
  g->own = own;
  return g;
}

/* A graph step: eager the first time its bucket is seen (that sizes the scratch and sets the kernels'
 * attributes), captured the second time, replayed from then on. */
static di_status graph_step(v4cu *b, const step_meta *m, int sample) {
  v4_graph *g = find_graph(b, m, sample);
  if (!g->exec && g->seen < 1) {
    DI_TRY(forward(b, m, sample));
    find_graph(b, m, sample)->seen = 1; /* (again: growing a buffer in the forward dropped the graphs, their marks too) */
    return DI_OK;
  }
  if (!g->exec) {
    cudaGraph_t gh = NULL;
    DI_CU(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
    b->capturing = 1;
    const di_status st = forward(b, m, sample);
    b->capturing = 0;
    cudaError_t e = cudaStreamEndCapture(b->stream, &gh);
    if (st != DI_OK || e != cudaSuccess) {
      if (gh) cudaGraphDestroy(gh);
      (void)cudaGetLastError();
      return st != DI_OK ? st : di_error_set(DI_ERR_BACKEND, WHO ": CUDA graph capture failed: %s", cudaGetErrorString(e));
    }
    e = cudaGraphInstantiate(&g->exec, gh, 0);
    cudaGraphDestroy(gh);
    if (e != cudaSuccess) {
      g->exec = NULL;
      return di_error_set(DI_ERR_BACKEND, WHO ": CUDA graph instantiation failed: %s", cudaGetErrorString(e));
    }
    b->graph_captures++;
  }
  DI_CU(cudaGraphLaunch(g->exec, b->stream));
  b->graph_replays++;
  return DI_OK;
}

static di_status run_step(v4cu *b, const di_batch *bt) {
  const int graph = b->use_graphs && !b->prof && bt->n_tokens > 0 && bt->n_tokens <= V4_GRAPH_MAX_T;
  const int sample = bt->sample_rows && bt->n_outputs > 0;
  step_meta m;
  DI_TRY(build_meta(b, bt, &m, graph));
  DI_TRY(graph ? graph_step(b, &m, sample) : forward(b, &m, sample));
  b->n_out = bt->n_outputs;
  if (b->n_out > 0) {
    b->d_logits = (float *)b->scr[S_LOGITS];
    b->step_sampled = sample; /* the tokens wait in d_tok */
  }
  /* the new states become the states */
  for (int q = 0; q < bt->n_seqs; q++) {
    int t0, n;
    DI_TRY(seq_span(bt, q, 0, &t0, &n));
    if (!n) continue;
    v4_dseq *st = find(b, bt->seqs[q].key);
    float *tmp = st->state;
    st->state = st->next;
    st->next = tmp;
    st->n_pos = bt->positions[t0] + n;
  }
  return DI_OK;
}

static di_status v4cu_submit(di_backend *base, const di_batch *bt) {
  v4cu *b = (v4cu *)base;
  if (b->batch) return di_error_set(DI_ERR_INVALID_ARG, WHO ": submit while a step is in flight");
  b->cur = &b->eng;
  if (bt && bt->n_groups == 0 && bt->n_tokens > 0 && bt->seqs) { /* kv_alloc's pools, group 0's table everywhere */
    const int ng = b->lay.n_groups, need = bt->n_seqs * ng;
    if (!di_grow((void **)&b->syn_tables, &b->syn_cap, need, sizeof *b->syn_tables, 16) ||
        !(b->syn_blocks = (int *)realloc(b->syn_blocks, sizeof(int) * (size_t)b->syn_cap)))
      return di_error_set(DI_ERR_OOM, WHO ": out of host memory");
    for (int q = 0; q < bt->n_seqs; q++)
      for (int g = 0; g < ng; g++) {
        b->syn_tables[q * ng + g] = bt->seqs[q].block_table;
        b->syn_blocks[q * ng + g] = bt->seqs[q].n_blocks;
      }
    b->syn = *bt;
    b->syn.n_groups = ng;
    b->syn.group_tables = b->syn_tables;
    b->syn.group_blocks = b->syn_blocks;
    bt = &b->syn;
    b->cur = &b->own;
  }
  const di_batch *chk = bt;
  di_batch fbb;
  if (bt && bt->n_tokens > 0 && bt->tokens) { /* feedback placeholders -1 - j: rows of the last sample_async */
    int neg = 0;
    for (int t = 0; t < bt->n_tokens; t++) neg |= bt->tokens[t] < 0;
    if (neg) {
      if (!di_grow((void **)&b->h_chk, &b->h_chk_cap, bt->n_tokens, sizeof(int32_t), 256))
        return di_error_set(DI_ERR_OOM, WHO ": out of host memory");
      for (int t = 0; t < bt->n_tokens; t++) {
        const int32_t v = bt->tokens[t];
        if (v < 0 && -1 - v >= b->fb_n)
          return di_error_set(DI_ERR_INVALID_ARG, WHO ": token %d at batch row %d refers to sampled row %d, but %s", v, t, -1 - v,
                              b->fb_n ? "the last sample_async had fewer rows" : "no sample_async preceded this step");
        b->h_chk[t] = v < 0 ? 0 : v;
      }
      fbb = *bt;
      fbb.tokens = b->h_chk;
      chk = &fbb;
    }
  }
  DI_TRY(check_batch(b, chk));
  b->step_sampled = 0;
  di_status st = run_step(b, bt);
  b->fb_n = 0; /* placeholders refer to the step right after a sample_async only */
  if (st != DI_OK) {
    cudaStreamSynchronize(b->stream);
    return st;
  }
  b->batch = bt;
  return DI_OK;
}

static di_status v4cu_wait(di_backend *base, float *logits, float *hidden) {
  v4cu *b = (v4cu *)base;
  const di_batch *bt = b->batch;
  b->batch = NULL;
  if (!bt) return di_error_set(DI_ERR_INVALID_ARG, WHO ": wait without a submitted step");
  if (hidden) return di_error_set(DI_ERR_UNSUPPORTED, WHO ": final hidden states (MTP drafting) are not available for DeepSeek-V4");
  if (logits && b->n_out > 0)
    DI_CU(cudaMemcpyAsync(logits, b->d_logits, sizeof(float) * (size_t)b->n_out * b->c->vocab_size, cudaMemcpyDeviceToHost,
                          b->stream));
  DI_CU(cudaStreamSynchronize(b->stream));
  if (b->prof && b->n_pev > 1) { /* the phase times of this step */
    for (int i = 0; i + 1 < b->n_pev; i++) {
      float ms = 0;
      if (b->ptag[i] >= 0 && cudaEventElapsedTime(&ms, b->pev[i], b->pev[i + 1]) == cudaSuccess) b->pms[b->ptag[i]] += ms;
    }
    b->prof_steps++;
  }
  b->n_pev = 0;
  return DI_OK;
}

/* One token per output row of the finished step, sampled on the device from its logits (k_sample.cu,
 * the V2/V3 backend's kernel: the host sampler's semantics); the in-step tokens when the rows are those
 * the batch carried. */
static di_status v4cu_sample(di_backend *base, const di_sample_row *rows, int n, int32_t *tokens) {
  v4cu *b = (v4cu *)base;
  if (n != b->n_out || n <= 0)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": sample of %d rows after a step with %d outputs", n, b->n_out);
  if (!same_rows(b, rows, n)) DI_TRY(sample_now(b, rows, n));
  if (cudaMemcpyAsync(b->h_tok, b->d_tok, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost, b->stream) != cudaSuccess ||
      cudaStreamSynchronize(b->stream) != cudaSuccess)
    return di_error_set(DI_ERR_BACKEND, WHO ": sampling failed: %s", cudaGetErrorString(cudaGetLastError()));
  memcpy(tokens, b->h_tok, sizeof(int32_t) * (size_t)n);
  return DI_OK;
}

/* Device token feedback: the submitted step's rows sampled (or its in-step tokens kept) behind it, their
 * copy to the host queued; the step is then finished (its logits cannot be read) and the next submit may
 * name its tokens -1 - j. */
static di_status v4cu_sample_async(di_backend *base, const di_sample_row *rows, int n) {
  v4cu *b = (v4cu *)base;
  if (!b->batch) return di_error_set(DI_ERR_INVALID_ARG, WHO ": sample_async without a submitted step");
  if (b->fb_pending) return di_error_set(DI_ERR_INVALID_ARG, WHO ": sample_async before the last one's sample_fetch");
  if (n != b->n_out || n <= 0)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": sample_async of %d rows after a step with %d outputs", n, b->n_out);
  b->batch = NULL;
  if (!same_rows(b, rows, n)) DI_TRY(sample_now(b, rows, n));
  DI_CU(cudaMemcpyAsync(b->h_tok, b->d_tok, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost, b->stream));
  DI_CU(cudaEventRecord(b->ev_tok, b->stream));
  b->fb_n = b->fb_rows = n;
  b->fb_pending = 1;
  return DI_OK;
}

static di_status v4cu_sample_fetch(di_backend *base, int32_t *tokens) {
  v4cu *b = (v4cu *)base;
  if (!b->fb_pending) return di_error_set(DI_ERR_INVALID_ARG, WHO ": sample_fetch without sample_async");
  b->fb_pending = 0;
  if (cudaEventSynchronize(b->ev_tok) != cudaSuccess)
    return di_error_set(DI_ERR_BACKEND, WHO ": sampling failed: %s", cudaGetErrorString(cudaGetLastError()));
  /* (the host copy is rewritten only by the next sample_async, after this) */
  memcpy(tokens, b->h_tok, sizeof(int32_t) * (size_t)b->fb_rows);
  return DI_OK;
}

static void v4cu_destroy(di_backend *base) {
  v4cu *b = (v4cu *)base;
  if (!b) return;
  if (b->stream) cudaStreamSynchronize(b->stream);
  drop_graphs(b);
  for (int i = 0; i < b->cap_pev; i++) cudaEventDestroy(b->pev[i]);
  free(b->pev);
  free(b->ptag);
  free(b->pms);
  free(b->pbytes);
  if (b->grp_tab) cudaFree(b->grp_tab);
  for (int i = 0; i < b->n_seqs; i++) {
    cudaFree(b->seqs[i].state);
    cudaFree(b->seqs[i].next);
  }
  free(b->seqs);
  free_pools(&b->eng);
  free_pools(&b->own);
  free(b->syn_tables);
  free(b->syn_blocks);
  for (int i = 0; i < S_N; i++)
    if (b->scr[i]) cudaFree(b->scr[i]);
  cu_epc_destroy(b->ep);
  for (int i = 0; i < b->n_allocs; i++) cudaFree(b->allocs[i]);
  free(b->allocs);
  free(b->L);
  for (int k = 0; k < 2; k++) {
    if (b->h_meta[k]) cudaFreeHost(b->h_meta[k]);
    if (b->ev_meta[k]) cudaEventDestroy(b->ev_meta[k]);
  }
  cudaFree(b->d_tok);
  cudaFreeHost(b->h_tok);
  cudaFree(b->d_srows);
  free(b->h_srows);
  free(b->h_chk);
  if (b->ev_tok) cudaEventDestroy(b->ev_tok);
  if (b->ev_fork) cudaEventDestroy(b->ev_fork);
  if (b->ev_join) cudaEventDestroy(b->ev_join);
  if (b->side) cudaStreamDestroy(b->side);
  cudaEvent_t fev[6] = {b->ev_hfork, b->ev_hjoin, b->ev_afork, b->ev_ajoin[0], b->ev_ajoin[1], b->ev_ajoin[2]};
  for (int k = 0; k < 6; k++)
    if (fev[k]) cudaEventDestroy(fev[k]);
  if (b->hside) cudaStreamDestroy(b->hside);
  for (int k = 0; k < 3; k++)
    if (b->aside[k]) cudaStreamDestroy(b->aside[k]);
  if (b->stream) cudaStreamDestroy(b->stream);
  free(b);
}

static const di_backend_ops V4CU_OPS = {
    .name = "cuda (deepseek_v4)",
    .kv_groups = v4cu_kv_groups,
    .kv_alloc = v4cu_kv_alloc,
    .submit = v4cu_submit,
    .wait = v4cu_wait,
    .sample = v4cu_sample,
    .mtp = NULL,
    .release = v4cu_release,
    .sample_async = NULL,
    .sample_fetch = NULL,
    .destroy = v4cu_destroy,
    .memory_info = v4cu_memory_info,
    .kv_alloc_groups = v4cu_kv_alloc_groups,
};
/* the same with device token feedback (the default; DEEPINFER_CUDA_V4_FEEDBACK=0: without) */
static const di_backend_ops V4CU_OPS_FB = [] {
  di_backend_ops o = V4CU_OPS;
  o.sample_async = v4cu_sample_async;
  o.sample_fetch = v4cu_sample_fetch;
  return o;
}();
static int is_v4cu(const di_backend *base) { return base && (base->ops == &V4CU_OPS || base->ops == &V4CU_OPS_FB); }

static float *upload_inv_freq(v4cu *b, const di_v4_rope_tab *rt, di_status *st) {
  float *d = NULL;
  *st = up_f32(b, rt->inv_freq, (size_t)(rt->p->dim / 2 > 0 ? rt->p->dim / 2 : 1), &d);
  return d;
}

extern "C" di_status di_backend_cuda_v4_create(const di_model_config *cfg, const di_v4_config *v4, const di_v4_weights *w,
                                               di_backend **out) {
  return di_backend_cuda_v4_create_mode(cfg, v4, w, 0, out);
}

extern "C" di_status di_backend_cuda_v4_create_mode(const di_model_config *cfg, const di_v4_config *v4, const di_v4_weights *w,
                                                    int batch_invariant, di_backend **out) {
  if (!cfg || !v4 || !w || !out) return di_error_set(DI_ERR_INVALID_ARG, WHO ": NULL argument");
  *out = NULL;
  if (w->n_layers != v4->n_layers)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": weights have %d layers, the config %d", w->n_layers, v4->n_layers);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)
    return di_error_set(DI_ERR_BACKEND, WHO ": no CUDA device");
  cu_ep_pick_device(ndev); /* expert parallel under mpirun: GPU = local rank */
  v4cu *b = (v4cu *)calloc(1, sizeof *b);
  if (!b) return di_error_set(DI_ERR_OOM, WHO ": out of memory");
  b->base.ops = &V4CU_OPS;
  b->base.cfg = cfg;
  b->base.vocab_size = v4->vocab_size;
  b->base.hidden_size = v4->hidden_size;
  b->c = v4;
  b->wf32 = di_switch_bool(DI_SW_CUDA_V4_F32, 0);
  b->tc = !b->wf32 && di_switch_bool(DI_SW_CUDA_V4_TC, 0);
  b->native = !b->wf32 && di_switch_bool(DI_SW_CUDA_V4_NATIVE, 1); /* default on since session 13 (PERFORMANCE.md) */
  /* MXFP4 tensor-core experts (issue 18): set, the switch's N (the invariant mode takes only 0 or 1: N > 1 would
   * make a token's logits depend on its step, so it means 0 there); unset, the default mode's DI_V4_MX_TC_DEFAULT
   * (0 until measured; 2 proposed: one-token steps on the CUDA-core kernels, 10% faster there, larger steps on the
   * tensor cores, 1.4-2.1x faster from 16 tokens, session 15) and the invariant mode never (its bits: the CUDA-core
   * kernels' at every step, as before the mode was read here) */
  b->invariant = batch_invariant != 0 || di_switch_bool(DI_SW_BATCH_INVARIANT, 0);
  b->mx_tc = di_switch_int(DI_SW_CUDA_V4_MX_TC, b->invariant ? 0 : DI_V4_MX_TC_DEFAULT);
  if (b->mx_tc < 0 || (b->invariant && b->mx_tc > 1)) b->mx_tc = 0;
  b->wsize = b->wf32 ? 4 : 2;
  di_v4_layout_init(v4, &b->lay);
  b->state_floats = b->lay.block_floats[DI_V4_G_STATE];
  b->cur = &b->eng;
  di_status st = DI_OK;
  /* device token feedback (one GPU: under expert parallel it has not run on the device yet) */
  if (di_switch_bool(DI_SW_CUDA_V4_FEEDBACK, 1) && !di_dist_expert_parallel()) b->base.ops = &V4CU_OPS_FB;
  /* CUDA graphs (one GPU: expert parallel's exchanges sync with the host inside the step) */
  b->use_graphs = di_switch_bool(DI_SW_CUDA_V4_GRAPHS, 0) && !di_dist_expert_parallel();
  if (cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&b->ev_meta[0], cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&b->ev_meta[1], cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&b->ev_tok, cudaEventDisableTiming) != cudaSuccess)
    st = di_error_set(DI_ERR_BACKEND, WHO ": cannot create a CUDA stream or its events");
  b->w = w;
  if (st == DI_OK && di_dist_expert_parallel() && v4->n_routed_experts > 0) { /* before the experts' upload */
    const cu_ep_spec sp = {v4->n_layers, v4->n_routed_experts, v4->hidden_size, 1, 1, sizeof(float) * (size_t)v4->hidden_size,
                           sizeof(float) * (size_t)v4->hidden_size, b->stream, v4_ep_compute, v4_ep_upload, b};
    st = cu_epc_create(&sp, &b->ep);
    if (st == DI_OK && cu_epc_rank(b->ep) == 0)
      fprintf(stderr, "deepinfer: cuda expert parallel over %d rank%s (%s): DeepSeek-V4, %d routed expert slots here%s\n",
              cu_epc_size(b->ep), cu_epc_size(b->ep) > 1 ? "s" : "", cu_epc_comm_kind(b->ep), cu_epc_per_rank(b->ep),
              cu_epc_eplb(b->ep) ? " (EPLB)" : "");
  }
  /* the ropes' inverse frequencies as the CPU computes them (di_v4_ctx_init) */
  di_v4_ctx cx;
  const int32_t tok0 = 0;
  if (st == DI_OK) st = di_v4_ctx_init(&cx, v4, w, &tok0, 1, WHO);
  if (st == DI_OK) b->inv_main = upload_inv_freq(b, &cx.main_rope, &st);
  if (st == DI_OK) b->inv_comp = upload_inv_freq(b, &cx.compress_rope, &st);
  b->af_main = (float)v4->rope_main.attention_factor;
  b->af_comp = (float)v4->rope_compress.attention_factor;
  if (st == DI_OK && !(b->pbytes = (double *)calloc((size_t)(v4->n_layers + 1) * DI_V4_PROF_N, sizeof(double))))
    st = di_error_set(DI_ERR_OOM, WHO ": out of memory");
  if (st == DI_OK) st = upload(b, w);
  b->acct = NULL;
  if (st == DI_OK && b->native && v4->o_groups > 1 && b->L && v4->n_layers > 0 && b->L[0].wo_a.fp8) {
    const int G = v4->o_groups;
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * (size_t)(2 * G + 2));
    if (!h) st = di_error_set(DI_ERR_OOM, WHO ": out of memory");
    else {
      for (int g = 0; g <= G; g++) h[g] = g;              /* off: one row an expert */
      for (int g = 0; g < G; g++) h[G + 1 + g] = g << 16; /* tiles: (expert g, row tile 0) */
      h[2 * G + 1] = G;                                   /* the tile count */
      if (cudaMalloc(&b->grp_tab, sizeof(int32_t) * (size_t)(2 * G + 2)) != cudaSuccess ||
          cudaMemcpy(b->grp_tab, h, sizeof(int32_t) * (size_t)(2 * G + 2), cudaMemcpyHostToDevice) != cudaSuccess)
        st = di_error_set(DI_ERR_BACKEND, WHO ": cannot upload the output groups' table");
      free(h);
    }
  }
  if (st == DI_OK && b->native && !b->ep && di_switch_bool(DI_SW_CUDA_V4_SIDE, 1) &&
      (cudaStreamCreateWithFlags(&b->side, cudaStreamNonBlocking) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_fork, cudaEventDisableTiming) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_join, cudaEventDisableTiming) != cudaSuccess))
    st = di_error_set(DI_ERR_BACKEND, WHO ": cannot create the side stream or its events");
  const int fork = b->ep ? 0 : di_switch_int(DI_SW_CUDA_V4_FORK, 0); /* (not under expert parallel: not run there) */
  if (st == DI_OK && (fork & 1) &&
      (cudaStreamCreateWithFlags(&b->hside, cudaStreamNonBlocking) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_hfork, cudaEventDisableTiming) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_hjoin, cudaEventDisableTiming) != cudaSuccess))
    st = di_error_set(DI_ERR_BACKEND, WHO ": cannot create the mHC stream or its events");
  if (st == DI_OK && (fork & 2) &&
      (cudaStreamCreateWithFlags(&b->aside[0], cudaStreamNonBlocking) != cudaSuccess ||
       cudaStreamCreateWithFlags(&b->aside[1], cudaStreamNonBlocking) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_afork, cudaEventDisableTiming) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_ajoin[0], cudaEventDisableTiming) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_ajoin[1], cudaEventDisableTiming) != cudaSuccess))
    st = di_error_set(DI_ERR_BACKEND, WHO ": cannot create the compressor / indexer streams or their events");
  if (st == DI_OK && (fork & 2) && (fork & 4) &&
      (cudaStreamCreateWithFlags(&b->aside[2], cudaStreamNonBlocking) != cudaSuccess ||
       cudaEventCreateWithFlags(&b->ev_ajoin[2], cudaEventDisableTiming) != cudaSuccess))
    st = di_error_set(DI_ERR_BACKEND, WHO ": cannot create the index queries' stream or its event");
  if (st == DI_OK && cudaDeviceSynchronize() != cudaSuccess)
    st = di_error_set(DI_ERR_BACKEND, WHO ": uploading the weights failed: %s", cudaGetErrorString(cudaGetLastError()));
  if (st != DI_OK) {
    v4cu_destroy(&b->base);
    return st;
  }
  *out = &b->base;
  return DI_OK;
}

extern "C" int di_backend_cuda_v4_mx_tc(const di_backend *base) { return is_v4cu(base) ? ((const v4cu *)base)->mx_tc : -1; }

extern "C" int64_t di_backend_cuda_v4_weight_bytes(const di_backend *base) {
  return is_v4cu(base) ? (int64_t)((const v4cu *)base)->weight_bytes : -1;
}

extern "C" int di_backend_cuda_v4_live_states(const di_backend *base) {
  return is_v4cu(base) ? ((const v4cu *)base)->n_seqs : -1;
}

extern "C" int di_backend_cuda_v4_graph_stats(const di_backend *base, int64_t *captures, int64_t *replays) {
  if (!is_v4cu(base)) return -1;
  const v4cu *b = (const v4cu *)base;
  if (captures) *captures = b->graph_captures;
  if (replays) *replays = b->graph_replays;
  return b->use_graphs;
}

extern "C" int di_backend_cuda_v4_profile(di_backend *base, int on) {
  if (!is_v4cu(base)) return -1;
  v4cu *b = (v4cu *)base;
  const size_t n = (size_t)(b->c->n_layers + 1) * DI_V4_PROF_N;
  if (on && !b->pev) { /* at most 12 marks a layer (see forward), a few for the step */
    const int cap = 12 * b->c->n_layers + 8;
    b->pev = (cudaEvent_t *)calloc((size_t)cap, sizeof(cudaEvent_t));
    b->ptag = (int *)calloc((size_t)cap, sizeof(int));
    b->pms = (double *)calloc(n, sizeof(double));
    if (!b->pev || !b->ptag || !b->pms) return -1;
    for (int i = 0; i < cap; i++) {
      if (cudaEventCreate(&b->pev[i]) != cudaSuccess) return -1;
      b->cap_pev = i + 1;
    }
  }
  if (on) memset(b->pms, 0, sizeof(double) * n);
  if (on) b->prof_steps = 0;
  b->prof = on ? 1 : 0;
  return 0;
}

extern "C" int di_backend_cuda_v4_profile_read(const di_backend *base, int l, int p, double *ms, int64_t *steps, double *bytes1) {
  if (!is_v4cu(base)) return -1;
  const v4cu *b = (const v4cu *)base;
  if (l < 0 || l > b->c->n_layers || p < 0 || p >= DI_V4_PROF_N) return -1;
  const size_t k = (size_t)l * DI_V4_PROF_N + p;
  if (ms) *ms = b->pms ? b->pms[k] : 0;
  if (steps) *steps = b->prof_steps;
  if (bytes1) *bytes1 = b->pbytes ? b->pbytes[k] : 0;
  return 0;
}
