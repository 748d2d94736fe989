/* C entry points of the DeepSeek-V4 kernels (k_v4_*.cu), used by cuda_deepseek_v4.cu and checked by
 * tests/cuda/test_cuda_v4.c. Device pointers in, launched on `s`, no sync. Activations are float32;
 * weights are bf16 or float32 (`wf32`: the test mode that makes the arithmetic the CPU's up to the
 * order of float sums). Shapes and semantics are those of the CPU ops (backend/cpu/cpu_deepseek_v4_ops.c),
 * named beside each entry. Every per-row (per-token) result is independent of the batch and the chunking. */
#ifndef DI_CUDA_V4_KERNELS_H
#define DI_CUDA_V4_KERNELS_H
#include <stddef.h>
#include <stdint.h>
#include "util/status.h"
#include "cuda_mxfp4.h"

#ifdef __cplusplus
extern "C" {
#endif
typedef struct CUstream_st *di_cu_stream;

/* y[t][r] = sum_c W[r][c] x[t][c] (di_v4_linear), r < R, c < C; x row stride ldx, y row stride ldy.
 * W: [R][C] row-major, bf16 or (wf32) float32. f32 accumulation. */
di_status di_v4k_linear(const float *x, int ldx, const void *W, int wf32, int T, int R, int C, float *y, int ldy,
                        di_cu_stream s);
/* G products in one launch (the grouped wo_a): group g multiplies x + g*gx by W + g*gw (elements) into
 * y + g*gy, each as di_v4k_linear. */
di_status di_v4k_linear_groups(const float *x, int ldx, const void *W, int wf32, int T, int R, int C, float *y, int ldy,
                               int G, int64_t gx, int64_t gw, int64_t gy, di_cu_stream s);
/* y[t][c] = x[t][c] rounded to bf16 (y: [T][C] dense, raw bits), the tensor-core mode's activations. */
di_status di_v4k_to_bf16(const float *x, int ldx, int T, int C, uint16_t *y, di_cu_stream s);
/* In-place RMSNorm of n_rows rows of n floats (row stride ld); weight NULL: unweighted (di_v4_rmsnorm). */
di_status di_v4k_rmsnorm(float *x, int ld, int n_rows, int n, const float *weight, float eps, di_cu_stream s);
/* Rotary embedding on the trailing rope_dim channels of each row (interleaved pairs; di_v4_rope_apply):
 * row i of n_rows (row length n, stride ld) belongs to token i / rows_per_token at position pos[token];
 * inv_freq: [rope_dim/2] device; sign -1: inverse rotation. */
di_status di_v4k_rope(float *x, int ld, int n_rows, int n, int rows_per_token, const int32_t *pos, const float *inv_freq,
                      int rope_dim, float attn_factor, int sign, di_cu_stream s);
/* di_v4k_rmsnorm then di_v4k_rope (sign 1) of the same rows: with di_v4k_fuse(1) or (2) (the default) in one launch (the
 * same bits), else the two launches. */
di_status di_v4k_rmsnorm_rope(float *x, int ld, int n_rows, int n, const float *weight, float eps, int rows_per_token,
                              const int32_t *pos, const float *inv_freq, int rope_dim, float attn_factor, di_cu_stream s);
/* The kernel-form setters below (di_v4k_lin_form, _fuse, _hc_form, _route_form, _attend_form, _state_ctas,
 * _index_form, _mx_form): a negative value restores the default. */
/* 1: one token's bf16 linears (di_v4k_linear / _groups, T == 1) on the barrier-free GEMV (a warp takes 1 or 2
 * rows, activations from L1; 2: 4 rows from 8,192 rows, the head), and f32 ones a row a warp; 0 (the default): the
 * staged form. The same bits. For tests and A/B benchmarks. */
void di_v4k_lin_form(int form);
/* 1: the mHC and head collapses (di_v4k_hc_pre, di_v4k_head_pre) with their loads grouped four columns a thread
 * ahead of the sums; 2: and the mixes' (8 rows ahead); 0 (the default): the plain loops. The same bits. For tests
 * and A/B benchmarks. */
void di_v4k_hc_form(int form);
/* 1: di_v4k_route with a warp per token (the experts scored by the lanes); 0 (the default): a thread per token. The
 * same picks and weights. For tests and A/B benchmarks. */
void di_v4k_route_form(int form);
/* 1: di_v4k_attend (head_dim 129..512) with two keys a warp in flight at one token, 2: at any T; 0: one; 3: the split
 * kernels (each key row widened once per 8 / 4 heads; hd % 128 == 0, H % 8 == 0, else as 1); 4 (the default): 1 for
 * one token over at most 256 keys, else 3. The same bits. */
void di_v4k_attend_form(int form);
/* CTAs per compressor state write (di_v4k_state_write; 1..128, default 4): the same copies. For A/B benchmarks. */
void di_v4k_state_ctas(int n);
/* 1: di_v4k_rmsnorm_rope in one launch, 2 (the default): and di_v4k_rmsnorm_rope_window too; 0: two (three) launches.
 * The same bits. For tests and A/B benchmarks. */
void di_v4k_fuse(int on);
/* X[t][j][:] = embed[tokens[t]][:] for every stream j < hc (di_v4_embed); embed bf16 or f32 [V][D]. */
di_status di_v4k_embed(const void *embed, int wf32, const int32_t *tokens, int T, int D, int hc, float *X, di_cu_stream s);
/* The mHC site's front half (hc_weights + collapse + norm of di_v4_hc_site): per token, the mixes of
 * the hc streams X[t] ([hc][D]) with fn ([(2+hc)*hc][hc*D] f32), pre / post / comb (Sinkhorn, iters),
 * in[t] = RMSNorm(sum_j pre[j] X[t][j]) * norm. post: [T][hc], comb: [T][hc][hc] (double). part: scratch of
 * di_v4k_hc_scratch(T, D, hc) doubles (the mixes' column-split partial sums; also enough for the head). */
size_t di_v4k_hc_scratch(int T, int D, int hc);
di_status di_v4k_hc_pre(const float *X, const float *fn, const float *base, const float *scale, const float *norm, int T,
                        int D, int hc, int iters, float eps, float hc_eps, float *in, double *post, double *comb,
                        double *part, di_cu_stream s);
/* di_v4k_hc_pre in parts, for running the Sinkhorn beside the sublayer: parts 1 the mixes (into part), 2 the collapse
 * (in; reads part), 4 post and the Sinkhorn (post, comb; reads part); 6 both halves in one launch (di_v4k_hc_pre is
 * 1 then 6). Every output the same bits whatever the parts (the same CTAs' code). */
di_status di_v4k_hc_pre_parts(const float *X, const float *fn, const float *base, const float *scale, const float *norm,
                              int T, int D, int hc, int iters, float eps, float hc_eps, float *in, double *post, double *comb,
                              double *part, int parts, di_cu_stream s);
/* The back half: X[t][k] = post[k] * out[t] + sum_j comb[j][k] X[t][j]. */
di_status di_v4k_hc_post(float *X, const float *out, const double *post, const double *comb, int T, int D, int hc,
                         di_cu_stream s);
/* The head's collapse (di_v4_head before the projection): for output row i (token rows[i]),
 * y[i] = RMSNorm(sum_j (sigmoid(fn_j . X / rms * scale + base_j) + hc_eps) X[j]) * final_norm. part: scratch
 * of di_v4k_hc_scratch(n, D, hc) doubles. */
di_status di_v4k_head_pre(const float *X, const int32_t *rows, int n, const float *fn, const float *base,
                          const float *scale, const float *final_norm, int D, int hc, float eps, float hc_eps, float *y,
                          double *part, di_cu_stream s);
/* gate[t][:] += ape[pos[t] % rate][:] (the compressor's position bias; width columns). */
di_status di_v4k_add_ape(float *gate, const float *ape, const int32_t *pos, int T, int rate, int width, di_cu_stream s);

/* ---- paged caches (the layout of backend/cpu/cpu_deepseek_v4_pages.h) ---- */
/* One sequence of a step on the device. */
typedef struct di_v4k_seq {
  int32_t t0, n, pos0, pad;
  const int32_t *tab[5];   /* block tables per kind (csa, index, hca, window, state), device */
  float *state;            /* the open compressor windows at pos0 (the snapshot layout), device */
} di_v4k_seq;
/* Where one compressor of one layer lives in the pools. */
typedef struct di_v4k_comp {
  int kind;                /* 0 csa, 1 index, 2 hca (pool kinds) */
  int rate, overlap, dim, width;
  int lidx, n_in, slots;   /* the layer's index among its kind, layers of the kind, entry slots per block */
  int64_t snap_off;        /* float offset of this compressor's open windows in a state / snapshot */
  float *pool;             /* the kind's pool */
  const float *kv, *gate;  /* the step's projected rows [T][width] (gate with ape added) */
  const float *norm;       /* [dim] */
} di_v4k_comp;
typedef struct di_v4k_entry { int32_t seq, e; } di_v4k_entry;
typedef struct di_v4k_swrite { int32_t seq, P; float *dst; } di_v4k_swrite;
/* Device counts: the three kernels below launch grids of the given bound (T, max_ents, max_w: a CUDA
 * graph's bucket) and, where the count pointer (device int32) is not NULL, work on the first *count of
 * them only (the rest of the grid returns at once); NULL: all of them (the eager steps' exact counts). */
/* K=V rows of the step into the window pool: row t at block tab[3][pos/64] of its sequence
 * ([block][n_layers][64][hd]), layer l; rows t >= *n_tok (graph padding) are not written. */
di_status di_v4k_window_write(const float *kv, const int32_t *pos, const int32_t *seq_of, const di_v4k_seq *seqs,
                              float *pool, int n_layers, int l, int hd, int T, const int32_t *n_tok, di_cu_stream s);
/* The kv row's di_v4k_rmsnorm_rope (one row a token) then di_v4k_window_write: with di_v4k_fuse(2) one launch. */
di_status di_v4k_rmsnorm_rope_window(float *kv, int T, int hd, const float *weight, float eps, const int32_t *pos,
                                     const float *inv_freq, int rope_dim, float attn_factor, const int32_t *seq_of,
                                     const di_v4k_seq *seqs, float *pool, int n_layers, int l, const int32_t *n_tok,
                                     di_cu_stream s);
/* Pools each listed window (di_v4_pool_window) from the step's rows and the sequences' open windows,
 * norms it, ropes it at e*rate and stores it in its block slot. */
di_status di_v4k_pool(const di_v4k_comp *c, const di_v4k_seq *seqs, const di_v4k_entry *ents, int max_ents,
                      const int32_t *n_ents, const float *inv_freq, int rope_dim, float attn_factor, float eps,
                      di_cu_stream s);
/* Writes the compressor's open windows at position P of sequence seq (P in [pos0, pos0 + n]) to
 * dst + snap_off, for each listed write: the new state after the step and the snapshots at block ends. */
di_status di_v4k_state_write(const di_v4k_comp *c, const di_v4k_seq *seqs, const di_v4k_swrite *w, int max_w,
                             const int32_t *n_w, di_cu_stream s);
/* Indexer scores (di_v4_index_scores) of token t over the entries complete at it (valid = (pos+1)/rate)
 * of its sequence's indexer keys (kind 1 pool), then the top min(topk, valid) with equal scores going to
 * the earlier entry (di_v4_topk_earlier_first): sel[t][s] = 1 for picks, 0 else, for s below the token's
 * sequence's entry count at the end of the step (sel past it is not written: di_v4k_attend reads no further);
 * max_n: the step's bound on those counts (the row stride of score and sel). q: the
 * roped index queries [T][nh][di]; hw: [T][nh]; score scratch [T][max_n]. */
di_status di_v4k_indexer(const float *q, const float *hw, const int32_t *pos, const int32_t *seq_of,
                         const di_v4k_seq *seqs, const di_v4k_comp *ic, int T, int nh, int di, int topk, int max_n,
                         float *score, unsigned char *sel, di_cu_stream s);
/* The score kernel di_v4k_indexer takes: 0 index_score_k, 1 the register-tiled index_score2_k (64 heads; the same
 * bits, slower on the H200), 2 index_score_k with 8 entries a CTA up to 4,096 entries (the same bits), 3
 * index_score3_k (64 heads, di % 4 == 0; else form 0): each float widened to double once per CTA or per 16 products,
 * and past 4,096 entries a 1,024-thread top-k (the same bits and picks); 4 (the default): form 3 with 4 entries a lane
 * past 8,192.
 * For tests and A/B benchmarks; not thread-safe. */
void di_v4k_index_form(int form);
/* Sparse attention (di_v4_attend) of token t, every head: the window rows [max(pos-W+1,0), pos] of layer
 * l, then the entries of comp (NULL: none) visible at it (HCA: complete windows; CSA: those with sel[t][e];
 * entries counted to the sequence's end of step), with the per-head sink; the output's rope channels
 * rotated back at pos. q: [T][H][hd] roped; o: [T][H][hd]. Scratch: p (float) [T*H][W + max_n] and ex (double:
 * its slots hold the list of key rows) of di_v4k_attend_ex(T, H, W, max_n) doubles. */
size_t di_v4k_attend_ex(int T, int H, int W, int max_n);
di_status di_v4k_attend(const float *q, const int32_t *pos, const int32_t *seq_of, const di_v4k_seq *seqs,
                        const float *window_pool, int n_layers, int l, int W, const di_v4k_comp *comp, int hca,
                        const unsigned char *sel, int max_n, const float *sink, int T, int H, int hd,
                        const float *inv_freq, int rope_dim, float attn_factor, float *p, double *ex, float *o,
                        di_cu_stream s);
/* MoE routing of each token (di_v4_moe): sqrtsoftplus (or sigmoid) scores of the router logits, the
 * experts from tid2eid (hash layers, may be NULL) or the top-k of score + bias (exact ties as torch.topk / the
 * CPU: backend/v4_torch_select.h), weights
 * normalised times `scaling`. Writes per token n_slots = K + 1 slots: slot 0 the shared expert (id E,
 * weight 1), then the picked experts by ascending id (a repeated id once, weights summed), unused
 * slots id -1. */
di_status di_v4k_route(const float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tokens, int T,
                       int E, int K, int sigmoid_scores, float scaling, int32_t *ids, float *wts, di_cu_stream s);
/* The step's (token, slot) pairs grouped by expert (E1 = experts + 1, the shared one included) into tiles
 * of up to 8 in `work` (int32, 1 + 3 * di_v4k_expert_max_tiles + T * n_slots entries), for the tiled form
 * of the two expert kernels below: each tile's expert rows are read once for its slots. */
int di_v4k_expert_max_tiles(int T, int n_slots, int E1);
di_status di_v4k_expert_tiles(const int32_t *ids, int T, int n_slots, int E1, int32_t *work, di_cu_stream s);
/* act[ts][i] = swiglu-with-clamp of expert ids[ts]'s gate / up rows (w1, w3: [E+1][I][D]) on x[ts / n_slots]
 * for each of T * n_slots slots (id < 0: skipped); tiles NULL: a CTA row per slot, else the tiles of
 * di_v4k_expert_tiles (same results: each slot's sums run in the same order). */
di_status di_v4k_expert_up(const float *x, const int32_t *ids, const int32_t *tiles, int E1, const void *w1, const void *w3,
                           int wf32, int T, int n_slots, int D, int I, float limit, float *act, di_cu_stream s);
/* y[ts][d] = w2[ids[ts]][d] . act[ts] (w2: [E+1][D][I]); tiles as above. */
di_status di_v4k_expert_down(const float *act, const int32_t *ids, const int32_t *tiles, int E1, const void *w2, int wf32, int T,
                             int n_slots, int D, int I, float *y, di_cu_stream s);
/* The same two products over MXFP4 routed experts (the native mode: w1, w3 [E][I][D], w2 [E][D][I] as
 * cuda_mxfp4.h lays them out; E = E1 - 1), decoded in registers with float32 activations; slots of id E
 * (the shared expert) are skipped: the caller computes them (di_v4k_swiglu over its FP8 products). */
di_status di_v4k_expert_up_mx(const float *x, const int32_t *ids, const int32_t *tiles, int E1, di_cuk_mxfp4w w1,
                              di_cuk_mxfp4w w3, int T, int n_slots, int D, int I, float limit, float *act, di_cu_stream s);
di_status di_v4k_expert_down_mx(const float *act, const int32_t *ids, const int32_t *tiles, int E1, di_cuk_mxfp4w w2, int T,
                                int n_slots, int D, int I, float *y, di_cu_stream s);
/* Which kernels the two take where rows allow (C % 32 == 0, aligned): 1 (the default) the staged form (a CTA's
 * activations in shared memory, 4 weight rows a warp), 2 / 3 its variants (registers capped at one token; 2 rows
 * a warp), 4 / 5 forms 1 / 3 with the E2M1 codes decoded by byte permutes and one token's row staged whole (4: the
 * default), 6 / 7 form 4 with 2 / 4 row groups a warp at one token a CTA (fewer, longer CTAs: one staging for more
 * rows; tiles as form 4), 0 the lane form (a row a warp); all give the same bits. For tests and A/B benchmarks; not thread-safe (set it
 * before launching). */
void di_v4k_mx_form(int form);
/* act[t][i] (row stride ldo) = swiglu with the clamp of gate g[t][i] and up u[t][i] (row stride ldg), as
 * di_v4k_expert_up's epilogue. */
di_status di_v4k_swiglu(const float *g, const float *u, int ldg, int T, int I, float limit, float *act, int ldo, di_cu_stream s);
/* Device token feedback: tok[t] < 0 (-1 - j) becomes fb[j] (the previous step's sampled row j). */
di_status di_v4k_resolve_tokens(int32_t *tok, int T, const int32_t *fb, di_cu_stream s);
/* out[t] = y[t][0] + sum over slots 1.. (id >= 0, in order) of wts * y[t][slot]. */
di_status di_v4k_moe_combine(const float *y, const int32_t *ids, const float *wts, int T, int n_slots, int D, float *out,
                             di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
