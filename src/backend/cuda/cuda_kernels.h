/* C entry points of the CUDA backend's kernels (device pointers in, launched on `stream`, no sync).
 * The backend composes the forward pass from these; tests/cuda/ checks each one against a plain-C
 * reference. bf16 data is passed as uint16_t (the raw bits). Every function returns DI_OK or
 * DI_ERR_BACKEND with the CUDA error in the message. */
#ifndef DI_CUDA_KERNELS_H
#define DI_CUDA_KERNELS_H
#include <stdint.h>
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif
typedef struct CUstream_st *di_cu_stream; /* == cudaStream_t */

/* ---- elementwise / norms (k_norm.cu) ---- */
/* h[t][:] = float(table[tokens[t]][:]); tokens[t] < 0 takes sampled[-1 - tokens[t]] (device token
 * feedback: the previous step's sampled tokens; NULL when none may be negative) */
di_status di_cuk_embed(const uint16_t *table, const int32_t *tokens, const int32_t *sampled, int T, int hidden,
                       float *h, di_cu_stream s);
/* out[t][:] = bf16(x[t][:] / rms(x[t]) * w) over n columns; x row stride ldx, out row stride ldo.
 * out_f32 (may be NULL): the same values in f32, row stride n (the router's fp32 input). */
di_status di_cuk_rmsnorm(const float *x, int ldx, const float *w, int T, int n, float eps,
                         uint16_t *out, int ldo, float *out_f32, di_cu_stream s);
/* The same over rows[0..T) of x (out row i = norm of x row rows[i]): the final norm of a step's
 * output rows without a gather kernel before it. */
di_status di_cuk_rmsnorm_rows(const float *x, int ldx, const int32_t *rows, const float *w, int T, int n, float eps,
                              uint16_t *out, int ldo, di_cu_stream s);
/* The same with a bf16 input (q_lora's q_a output). */
di_status di_cuk_rmsnorm_bf16(const uint16_t *x, int ldx, const float *w, int T, int n, float eps,
                              uint16_t *out, int ldo, di_cu_stream s);
/* out[t][i] = silu(gu[t][i]) * gu[t][I + i]  (gu row stride 2I, out row stride I); bf16 in/out. */
di_status di_cuk_silu_mul(const uint16_t *gu, int T, int I, uint16_t *out, di_cu_stream s);
/* out[i][:] = in[rows[i]][:] for n rows of `cols` floats. */
di_status di_cuk_gather_f32(const float *in, const int32_t *rows, int n, int cols, float *out,
                            di_cu_stream s);

/* ---- MLA preparation (k_mla_prep.cu) ---- */
typedef struct di_cuk_rope {
  const float *inv_freq;  /* [rope_dim/2] device */
  float attn_factor;      /* multiplies cos and sin (YaRN mscale) */
  int interleave;         /* 1: pairs (2i, 2i+1); 0: pairs (i, i + d/2) */
} di_cuk_rope;
/* For each token t: the cache entry cache[slots[t]] = [rmsnorm(kva[t][0:R]) * kv_norm, 0.. | rope(kva[t][R:R+P]), 0..]
 * (bf16, DI_CUK_MLA_D wide: latent at 0, rope at DI_CUK_MLA_R), and q_pe of each head
 * (q[t][h*(N+P) + N ..]) roped into Qa[t][h][DI_CUK_MLA_R ..] (zeros in Qa's padding columns; the
 * latent columns [0, R) of Qa are left alone: the absorption GEMM writes them).
 * kva: bf16 [T][R+P] (row stride ldk); q: bf16 [T][H*(N+P)] (row stride ldq); Qa: bf16 [T][H][D];
 * cache: bf16 [slots][D], or with kv_fp8 DI_CUK_KV8_ROW-byte FP8 entries [slots].
 * Needs R <= 512, P <= 64. */
di_status di_cuk_mla_prep(const uint16_t *kva, int ldk, const uint16_t *q, int ldq,
                          const int32_t *positions, const int32_t *slots, int T, int H, int N, int P, int R,
                          const float *kv_norm, float eps, di_cuk_rope rope, uint16_t *Qa,
                          void *cache, int kv_fp8, di_cu_stream s);
/* di_cuk_mla_prep plus the absorption Qa[t][h][0:R] = q_nope[t][h] . W_UK[h] (W_UK[h] = wuk + h*sw,
 * [N][R] with row stride ldw: kv_b's rows for head h), equal to di_cuk_mla_prep followed by
 * di_cu_gemm_batched(..., w_kn = 1), in one launch; only where di_cuk_mla_prep_absorb_ok (T <= 8,
 * R % 8 == 0, 16-byte aligned rows). */
int di_cuk_mla_prep_absorb_ok(int T, int H, int R, const uint16_t *wuk, int ldw, int64_t sw);
di_status di_cuk_mla_prep_absorb(const uint16_t *kva, int ldk, const uint16_t *q, int ldq, const int32_t *positions,
                                 const int32_t *slots, int T, int H, int N, int P, int R, const float *kv_norm,
                                 float eps, di_cuk_rope rope, uint16_t *Qa, void *cache, int kv_fp8, const uint16_t *wuk,
                                 int ldw, int64_t sw, di_cu_stream s);

/* W_UK[h] (kv_b rows h (dn + dv) .. + dn, [dn][R]) of the NH heads transposed into out [NH][R][dn] (the
 * batch-invariant absorption's W [N][K] form; DEEPINFER_CUDA_ABSORB_NK). */
di_status di_cuk_mla_wuk_transpose(const uint16_t *kv_b, int NH, int dn, int dv, int R, uint16_t *out, di_cu_stream s);

/* The FP8 cache entry's write rule alone, as the prep kernels apply it (k_kv8.cuh): rows x [n][R] f32
 * (R <= 512) into the scales and codes of n DI_CUK_KV8_ROW-byte entries (their rope bytes untouched). */
di_status di_cuk_kv8_quantize(const float *x, int R, int n, void *entries, di_cu_stream s);

/* ---- MLA attention over the paged latent cache, absorbed form (k_mla_attn.cu) ---- */
/* One unit of work: rows [row0, row1) of the flattened (token, head) row space, all of one
 * sequence, over keys [k0, k1). part < 0: write the normalized result straight to `out`; else
 * write it (with its log-sum-exp) to partial slot `part`, merged later by di_cuk_mla_combine. */
typedef struct di_cuk_attn_item {
  int32_t row0, row1, seq, k0, k1, part;
  /* the sequence's first position in this step: keys below it were written by earlier steps, so the
   * decode attention may read them before its PDL wait (the rows from it on are written by this
   * step's MLA prep, which a later row group of a multi-token sequence must wait for) */
  int32_t kfresh;
} di_cuk_attn_item;
typedef struct di_cuk_combine_item {
  int32_t row0, row1, part0, nsplit;
} di_cuk_combine_item;
#define DI_CUK_ATTN_ROWS 64     /* rows per attention item, at most */
#define DI_CUK_ATTN_KTILE 32    /* keys per shared-memory tile; the backend's splits are multiples */
/* The cache entry and absorbed query are laid out for the kernel's fixed shape: [latent 512 | rope
 * 64], smaller ranks (the tiny test models) zero-padded, which leaves every dot product unchanged. */
#define DI_CUK_MLA_R 512
#define DI_CUK_MLA_P 64
#define DI_CUK_MLA_D 576
/* --kv-cache-dtype fp8 (issue 18): the cache entry is DI_CUK_KV8_ROW bytes, the CPU backend's format
 * (cpu_deepseek.c kv_store) at the padded shape: [4 f32 scales, one per 128 latent channels | 512 E4M3
 * latent bytes | 64 bf16 rope values]; scale = amax / 448 of its 128 channels (1 for an all-zero group),
 * code = cvt.rn.satfinite(x / scale). The kernels' `cache` arguments are then such rows (kv_fp8 = 1)
 * instead of DI_CUK_MLA_D bf16 (kv_fp8 = 0); the readers dequantize to bf16 as they stage a key tile
 * (k_kv8.cuh). */
#define DI_CUK_KV8_SCALES 0
#define DI_CUK_KV8_LAT 16
#define DI_CUK_KV8_PE (16 + DI_CUK_MLA_R)
#define DI_CUK_KV8_ROW (16 + DI_CUK_MLA_R + 2 * DI_CUK_MLA_P) /* 656 = 41 x 16 B */
/* Q: bf16 [T*H][D] (row = t*H + h); cache: bf16 [n_blocks*64][D] of this layer (kv_fp8 = 0), or its
 * FP8 entries [n_blocks*64][DI_CUK_KV8_ROW bytes] (kv_fp8 = 1; every attention form below); block_tables:
 * int32 [n_seqs][bt_stride]; positions: [T]; items: [*n_items] (device count, grid = max_items);
 * out: bf16 [T*H][R] (R = DI_CUK_MLA_R); part_o: f32 [n_parts][64][R]; part_lse: f32 [n_parts][64]. Score of row r
 * against key k (k <= positions[r / H]) = scale * Q[r] . cache[k]; out = softmax-weighted sum of
 * cache[k][0:R]. rows_per_cta: 16 or 64 (items then hold at most that many rows). */
di_status di_cuk_mla_attn(const uint16_t *Q, const void *cache, int kv_fp8, const int32_t *block_tables,
                          int bt_stride, const int32_t *positions, int H, float scale,
                          const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                          int rows_per_cta, uint16_t *out, float *part_o, float *part_lse,
                          di_cu_stream s);
/* Decode attention for steps of few sequences (k_mla_decode.cu): 16-row items in groups of `cluster`
 * (8, or 16 where di_cuk_attn_cluster_ok(16)), the splits of one row group merged inside a thread-block
 * cluster; part < 0 (the whole key range in one cluster) writes `out`, else every item of the cluster
 * carries the cluster's partial slot (merged by di_cuk_mla_combine). max_items and *n_items: multiples
 * of `cluster`. Splits are runs of DI_CUK_DECODE_KTILE keys. strided (batch-invariant mode; one cluster
 * per row group, items of di_cuk_attn_cluster_items(..., strided = 1)): CTA i of a cluster takes the
 * key tiles i, i + cluster, i + 2 * cluster, ... so a row's sums depend only on its own keys: a longer
 * item only adds tiles that are masked for it, exact no-ops of the online softmax and the merge. */
#define DI_CUK_DECODE_KTILE 64
/* fold (optional, only with one cluster per row group, i.e. every part < 0): instead of writing o_lat to
 * `out`, write v = W_UV[h] . o_lat of each row (head h = row % H, token = row / H) as bf16 at
 * v_out[token * ld_v + h * dv + d], W_UV[h] = dv rows of `ld` (= kv_lora_rank) weights at w + h * stride. */
typedef struct di_cuk_uv_fold {
  const uint16_t *w;
  int64_t stride;
  int ld, dv, ld_v;
  uint16_t *v_out;
} di_cuk_uv_fold;
int di_cuk_uv_fold_ok(int dv, int rank);
di_status di_cuk_mla_attn_cluster(const uint16_t *Q, const void *cache, int kv_fp8, const int32_t *block_tables,
                                  int bt_stride, const int32_t *positions, int H, float scale,
                                  const di_cuk_attn_item *items, const int32_t *n_items, int max_items, int cluster,
                                  int strided, uint16_t *out, float *part_o, float *part_lse,
                                  const di_cuk_uv_fold *fold, di_cu_stream s);
int di_cuk_attn_cluster_ok(int cluster);
/* Measurement switch (process-wide): the decode attention copies its first KV tile's older rows into
 * shared memory before its PDL wait (1, the default) or after it (0); the same results. */
void di_cuk_attn_set_preload(int on);
/* MLA's W_UV and o_proj of a one-token step in one kernel (k_mla_vo.cu), adding into the f32 residual:
 *   v_h = bf16(W_UV[h] . olat[h*ld_olat ..]),  h[n] += sum_h W_o[n][h*dv .. +dv] . v_h
 * W_UV[h] = wuv + h * wuv_stride, dv rows of R; W_o: H rows of ldo (>= NH * dv). _ok: whether the
 * shape is supported (T == 1, NH a power of two <= 16, dv <= 128, H a multiple of 256 or <= 512) and
 * its cluster of NH CTAs fits on this GPU. */
int di_cuk_mla_vo_ok(int T, int NH, int H, int R, int dv);
di_status di_cuk_mla_vo(const uint16_t *olat, int ld_olat, const uint16_t *wuv, int64_t wuv_stride, int R, int dv,
                        const uint16_t *wo, int ldo, int NH, int H, float *h, di_cu_stream s);
/* Items of rows [row0, row1) of sequence seq over keys [0, n_keys) (kfresh: the item field above):
 * n_clusters clusters of `cluster` CTAs with balanced runs of key tiles (some may be empty); with more
 * than one cluster, one combine item over partial slots *part .. (advanced). strided: one cluster whose
 * CTA i starts at tile i (di_cuk_mla_attn_cluster's strided form; n_clusters ignored). Returns the items
 * written. */
int di_cuk_attn_cluster_items(int row0, int row1, int seq, int n_keys, int kfresh, int cluster, int n_clusters,
                              int strided, int *part, di_cuk_attn_item *items, di_cuk_combine_item *citems,
                              int *n_citems);
di_status di_cuk_mla_combine(const di_cuk_combine_item *items, const int32_t *n_items,
                             int max_items, const float *part_o, const float *part_lse,
                             uint16_t *out, di_cu_stream s);

/* ---- MLA attention with a fixed key split: the batch-invariant form (k_mla_fixed.cu, issue 19) ---- */
/* A row's keys are cut at multiples of `split` keys (a multiple of 32, the same for every step of a
 * process; DI_CUK_ATTN_FIXED_SPLIT unless chosen), each split one online-softmax pass,
 * the splits merged in order; its bits do not depend on the batch, the chunk, or how its splits are
 * spread over CTAs. Arguments as di_cuk_mla_attn; rows_per_cta 16 or 32; an item with part < 0 covers
 * keys [0, k1) of all its splits (merged in registers, written to out), one with part >= 0 exactly one
 * split (k0 a multiple of the split), merged by di_cuk_mla_combine_fixed. */
#define DI_CUK_ATTN_FIXED_SPLIT 256
di_status di_cuk_mla_attn_fixed(const uint16_t *Q, const void *cache, int kv_fp8, const int32_t *block_tables,
                                int bt_stride, const int32_t *positions, int H, float scale, int split,
                                const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                                int rows_per_cta, uint16_t *out, float *part_o, float *part_lse, di_cu_stream s);
di_status di_cuk_mla_combine_fixed(const di_cuk_combine_item *items, const int32_t *n_items, int max_items,
                                   const float *part_o, const float *part_lse, uint16_t *out, di_cu_stream s);
/* Its decode form (k_mla_fixed.cu, DEEPINFER_CUDA_MLA_FIXED_DEC): items of up to 16 rows of a bf16 cache, a CTA
 * of 8 warps each (the score chain of a tile beside the softmax and P.V of the one before), the same bits as
 * di_cuk_mla_attn_fixed for every row; for steps of few items (decode of few sequences). ahead: key tiles
 * loaded ahead of the one in use (1 or 2). counters: NULL (split items' partials for di_cuk_mla_combine_fixed),
 * or zeroed ints, one per partial slot: the CTA that finishes a row group's last split merges its partials
 * itself (the combine kernel's bits; no combine launch) and leaves the counters zero. */
di_status di_cuk_mla_attn_fixed_dec(const uint16_t *Q, const uint16_t *cache, const int32_t *block_tables,
                                    int bt_stride, const int32_t *positions, int H, float scale, int split,
                                    const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                                    int ahead, uint16_t *out, float *part_o, float *part_lse, int32_t *counters,
                                    di_cu_stream s);
/* The same attention on wgmma (k_mla_fixed_tc.cu, DEEPINFER_CUDA_MLA_FIXED_TC): items of up to 64 rows,
 * the same bits as di_cuk_mla_attn_fixed for every row (either item form); slots: f32 scratch of
 * di_cuk_mla_fixed_tc_slot_bytes() (the merged state of each persistent CTA's row group between splits). */
di_status di_cuk_mla_attn_fixed_tc(const uint16_t *Q, const uint16_t *cache, const int32_t *block_tables,
                                   int bt_stride, const int32_t *positions, int H, float scale, int split,
                                   const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                                   uint16_t *out, float *part_o, float *part_lse, float *slots, di_cu_stream s);
size_t di_cuk_mla_fixed_tc_slot_bytes(void);
/* The items of rows [r0, r1) of sequence seq whose largest position is maxpos: one item over every
 * split, or (separate, more than one split) one per split and a combine item over partial slots *part ..
 * (advanced). Returns the items written (maxpos / split + 1 at most). */
int di_cuk_attn_fixed_items(int r0, int r1, int seq, int maxpos, int kfresh, int split, int separate, int *part,
                            di_cuk_attn_item *items, di_cuk_combine_item *citems, int *n_citems);

/* ---- MoE (k_moe.cu) ---- */
typedef struct di_cuk_router {
  int E, k, n_group, topk_group;
  int sigmoid;        /* scoring: 0 softmax, 1 sigmoid */
  int method;         /* 0 greedy, 1 group_limited_greedy, 2 noaux_tc */
  int norm_topk;      /* renormalize the k weights */
  int scale_after_norm; /* V3: multiply by routed_scaling even when renormalized */
  float routed_scale;
  int n_shared;         /* shared experts folded in as experts E .. E+n_shared-1, weight 1 */
  int block_route;      /* 1: always the block-wide routing (A/B measurements; default 0: one warp
                           routes where the router allows) */
} di_cuk_router;
/* The permutation outputs of di_cuk_moe_permute (see there). */
typedef struct di_cuk_perm {
  int bm;
  int32_t *perm_tok, *inv, *expert_off, *tiles, *n_tiles;
} di_cuk_perm;
/* Router logits in fp32 (as the reference computes them): out[t][e] = x[t] . W[e], x f32 [T][n],
 * W bf16 [E][n]. */
di_status di_cuk_router_logits(const float *x, const uint16_t *W, int T, int E, int n, float *out,
                               di_cu_stream s);
/* logits: f32 [T][E]; bias: f32 [E] or NULL. ids: int32 [T][k + n_shared]; w likewise (the shared
 * experts last, with weight 1). With T == 1 and perm non-NULL the permutation is done here too
 * (a decode step of one sequence then needs no di_cuk_moe_permute launch). */
di_status di_cuk_moe_route(const float *logits, const float *bias, int T, di_cuk_router r,
                           int32_t *ids, float *w, const di_cuk_perm *perm, di_cu_stream s);
/* The gate of a small step fused (decode): xn[t] = bf16(rmsnorm(h[t]) * norm_w) (row stride ldxn;
 * columns past H untouched), logits[t] = W . rmsnorm(h[t]) in f32 (scratch [T][E]), then
 * di_cuk_moe_route's outputs (and its T == 1 permutation). Equal to di_cuk_rmsnorm +
 * di_cuk_router_logits + di_cuk_moe_route. Only where di_cuk_moe_gate_supported(E, H) (E <= 256,
 * H <= 8192). */
int di_cuk_moe_gate_supported(int E, int H);
di_status di_cuk_moe_gate(const float *h, const float *norm_w, float eps, int T, int H, const uint16_t *W,
                          const float *bias, di_cuk_router r, uint16_t *xn, int ldxn, float *logits,
                          int32_t *ids, float *w, const di_cuk_perm *perm, di_cu_stream s);
/* Sorts the T*k assignments by expert. Outputs: perm_tok[n] (token of the j-th sorted assignment),
 * inv[a] (sorted position of assignment a), tiles[] (expert << 16 | m-tile index within expert,
 * for tiles of `bm` rows) with *n_tiles, expert_off[E+1]. Workspace: none (one block). */
di_status di_cuk_moe_permute(const int32_t *ids, int n_assign, int k, int E, int bm,
                             int32_t *perm_tok, int32_t *inv, int32_t *expert_off,
                             int32_t *tiles, int32_t *n_tiles, di_cu_stream s);
/* h[t][0:n] += sum_j w[t][j] * y[inv[t*k+j]][0:n]  (y f32 [n_assign][ldy], h [T][n]); then, when
 * norm_w is non-NULL, xn[t] = bf16(rmsnorm(h[t]) * norm_w) (row stride ldo): the next layer's
 * input norm fused in. n <= 8128. */
di_status di_cuk_moe_combine(const float *y, int ldy, const int32_t *inv, const float *w, int T, int k,
                             int n, float *h, const float *norm_w, float eps, uint16_t *xn, int ldo,
                             di_cu_stream s);

/* ---- grouped GEMM (k_grouped_gemm.cu) ---- */
/* For each tile (expert e, m-tile i): rows m in [off[e] + i*bm, min(off[e+1], ..+bm)):
 *   C[m][n] = sum_k A[arow(m)][k] * W[e][n][k],  arow(m) = a_rows ? a_rows[m] : m.
 * A bf16 (row stride lda), W bf16 [E][N][K] contiguous, C bf16 or f32 (c_f32) with row stride ldc.
 * K must be a multiple of 64, N of 128 (pad the weights). bm is 16 or 64. Grid: max_tiles x N/128,
 * or x N/64 when that grid would not fill the GPU twice over (decode: more, shorter CTAs balance the
 * weight streaming across the SMs).
 * glu: W's rows are gate/up interleaved in groups of 8 (rows 16q..16q+7 = gate rows 8q..8q+7,
 * rows 16q+8..16q+15 = up rows 8q..), and C (bf16) gets silu(gate) * up: [M][N/2]. */
di_status di_cuk_grouped_gemm(const uint16_t *A, int lda, const int32_t *a_rows, const uint16_t *W,
                              int N, int K, const int32_t *expert_off, const int32_t *tiles,
                              const int32_t *n_tiles, int max_tiles, int bm, void *C, int ldc,
                              int c_f32, int glu, di_cu_stream s);
/* The same product for decode-sized steps, as a GEMV (k_grouped_gemm.cu): max_rows (1..4) rows per
 * expert are computed per pass (more are correct, only slower); N a multiple of 64, K of 8.
 * pf_tile0 >= 0: tiles pf_tile0.. are known before the routing finishes to be experts pf_expert0..
 * (the shared experts at T == 1), whose weights are prefetched; else -1. */
di_status di_cuk_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, const uint16_t *W, int N, int K,
                              const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                              int max_tiles, int bm, int max_rows, void *C, int ldc, int c_f32, int glu,
                              int pf_tile0, int pf_expert0, di_cu_stream s);
/* Measurement switch (process-wide): one-row products in one-warp CTAs (1, the default) or 4-warp CTAs. */
void di_cuk_grouped_gemv_set_one_warp(int on);
/* Reorders rows of [gate (I rows); up (I rows)] (each `cols` wide, n_mat matrices back to back) into
 * the glu interleaving above; src and dst distinct. I must be a multiple of 8. */
/* A one-token step's MoE down projection fused with the weighted combine:
 *   h[c] += sum_j w[j] * (W[ids[j]] row c) . act[inv[j]]   for c < n, j < kt (slot order)
 * W: bf16 [experts][N][K]; act: bf16 rows of ld_act (the permuted gate/up output); the experts
 * pf_expert0 .. +n_pf (the shared ones) are prefetched into L2 before the wait. N % 16 == 0. */
di_status di_cuk_moe_down_combine(const uint16_t *act, int ld_act, const uint16_t *W, int N, int K,
                                  const int32_t *ids, const float *w, const int32_t *inv, int kt, float *h, int n,
                                  int pf_expert0, int n_pf, di_cu_stream s);
di_status di_cuk_glu_interleave(const uint16_t *src, uint16_t *dst, int n_mat, int I, int cols,
                                di_cu_stream s);

/* ---- tensor-core GEMM whose per-row arithmetic does not depend on M (k_tc_gemm.cu) ---- */
/* Y_z[M][N] = X_z[M][K] . op(W_z) (+ beta * Y_z when y_f32), z < batch: X_z = X + z*sx (rows ldx),
 * W_z = W + z*sw, op(W) = W^T for W [N][K] (rows ldw), W for W [K][N] (w_kn), Y_z = Y + z*sy (rows ldy).
 * Every row's bits are the same whatever M is and wherever the row sits: K is cut into
 * di_cuk_tc_gemm_splits(N, K) splits fixed by the weight shape. ws (f32, ws_bytes, zeroed once before
 * its first use: its first 16 KB are tile counters every call leaves at zero): where
 * di_cuk_tc_gemm_ws_bytes says a product has few CTAs, the splits run in CTAs of their own through
 * it (the same bits; without room, inside each CTA). _ok: K % 8, ldx % 8, ldw % 8, 16-byte aligned X
 * and W, N % 8 for w_kn; callers also keep sx, sw % 8. */
int di_cuk_tc_gemm_ok(int N, int K, int ldx, int ldw, int w_kn, const void *X, const void *W);
int di_cuk_tc_gemm_splits(int N, int K);
/* Process-wide: which core runs the W [N][K] products: 0 mma.sync, 1 wgmma with cp.async loads
 * (k_tc_wgmma.cuh), 2 wgmma with TMA loads, warp-specialized and persistent (k_tc_tma.cuh), 3 hybrid
 * (mma.sync up to 8 rows, TMA above; the backend's default), 4 gemv (as 3 with k_tc_gemv.cuh up to 8
 * rows); each is invariant, and on the H200 all give the same bits (DEEPINFER_CUDA_TC_CORE). */
void di_cuk_tc_gemm_set_core(int core);
/* Process-wide: 1 adds a few-CTA product's split partials in its last CTA per tile (no reduce launch),
 * 0 (default) in a reduce kernel; the same bits (DEEPINFER_CUDA_TC_FUSED_REDUCE). */
void di_cuk_tc_gemm_set_fused_reduce(int on);
size_t di_cuk_tc_gemm_ws_bytes(int batch, int M, int N, int K);
di_status di_cuk_tc_gemm(int batch, int M, int N, int K, const uint16_t *X, int ldx, int64_t sx, const uint16_t *W,
                         int ldw, int64_t sw, int w_kn, void *Y, int ldy, int64_t sy, int y_f32, float beta, float *ws,
                         size_t ws_bytes, di_cu_stream s);

/* ---- dense GEMMs through cuBLASLt / cuBLAS (gemm.cu) ---- */
typedef struct di_cu_blas di_cu_blas;
di_status di_cu_blas_create(di_cu_blas **out);
void di_cu_blas_destroy(di_cu_blas *b);
/* Y[M][N] = X[M][K] . W[N][K]^T + beta * Y   (row-major; X, W bf16; Y bf16 or f32 (y_f32)).
 * bf16 in, f32 accumulate; the beta = 1 form is how residual adds are fused. */
di_status di_cu_gemm(di_cu_blas *b, int M, int N, int K, const uint16_t *X, int ldx, const uint16_t *W,
                     int ldw, void *Y, int ldy, int y_f32, float beta, di_cu_stream s);
/* Y = RMSNorm(H; norm_w, eps) . W^T for decode-sized M (<= 8): the norm of each f32 row computed inside
 * the skinny kernel (the same bf16 activations as di_cuk_rmsnorm writes). _ok says whether it applies. */
int di_cu_gemm_normed_ok(di_cu_blas *b, int M, int K, int ldh);
di_status di_cu_gemm_normed(di_cu_blas *b, int M, int N, int K, const float *H, int ldh, const float *norm_w,
                            float eps, const uint16_t *W, int ldw, void *Y, int ldy, int y_f32, di_cu_stream s);
/* M <= 8 (decode) goes to a skinny streaming kernel of our own unless turned off here (tests). */
void di_cu_blas_set_skinny(di_cu_blas *b, int on);
/* Batch-invariant mode: every GEMM row computed with the same arithmetic whatever M is (gemm.cu). */
void di_cu_blas_set_invariant(di_cu_blas *b, int on);
/* In batch-invariant mode, every GEMM on the tensor-core kernel (k_tc_gemm.cu) rather than skinny
 * chunks (DEEPINFER_CUDA_TC_INVARIANT); _tc_invariant: whether both are on (then di_cu_gemm_normed_ok
 * is 0 and the forward must not use the one-token fusions of other arithmetic either). */
void di_cu_blas_set_tc(di_cu_blas *b, int on);
int di_cu_blas_tc_invariant(const di_cu_blas *b);
/* Default mode: dense GEMMs with min_m <= M <= 8 on the tensor-core kernel instead of the skinny one
 * (0: never; DEEPINFER_CUDA_TC_DEFAULT_MINM). */
void di_cu_blas_set_tc_default(di_cu_blas *b, int min_m);
/* Default mode: di_cu_gemm's skinny products of >= min_n outputs (0: none) on a persistent form of the skinny
 * kernel (each warp walks row pairs; the same bits; DEEPINFER_CUDA_SKINNY_ROWS). */
void di_cu_blas_set_skinny_rows(di_cu_blas *b, int min_n);
/* Batched over `batch` heads, row-major, bf16 in/out, f32 accumulate:
 *   Y_h[M][N] = X_h[M][K] . op(W_h)  with op(W_h) = W_h ([K][N]) when w_kn, else W_h^T (W_h [N][K]).
 * X_h = X + h*sx (row stride ldx), W_h = W + h*sw (row stride ldw), Y_h = Y + h*sy (row stride ldy). */
di_status di_cu_gemm_batched(di_cu_blas *b, int batch, int M, int N, int K, const uint16_t *X, int ldx,
                             int64_t sx, const uint16_t *W, int ldw, int64_t sw, int w_kn, uint16_t *Y,
                             int ldy, int64_t sy, di_cu_stream s);

/* ---- sampling (k_sample.cu) ---- */
typedef struct di_cuk_sample_row {
  float temperature, top_p, min_p;
  int top_k, vocab_limit;
  uint64_t seed, counter;
} di_cuk_sample_row;
/* One token per row of logits (f32 [n][V]); rows' parameters in device memory. */
di_status di_cuk_sample(const float *logits, int n, int V, const di_cuk_sample_row *rows,
                        int32_t *out, di_cu_stream s);
/* The uniform draw in [0,1) of (seed, counter); the same function on host and device. */
double di_cuk_uniform(uint64_t seed, uint64_t counter);

/* ---- helpers for tests and benchmarks (cuda_testapi.cu) ---- */
void *di_cut_malloc(size_t bytes);          /* NULL on failure */
void di_cut_free(void *p);
int di_cut_h2d(void *dst, const void *src, size_t bytes);
int di_cut_d2h(void *dst, const void *src, size_t bytes);
int di_cut_sync(void);                      /* 0 when the device is fine */
int di_cut_device_ok(void);                 /* a CUDA device is present */
int di_cut_mem_info(size_t *free_bytes, size_t *total_bytes); /* cudaMemGetInfo after a sync; 0 on success */
double di_cut_time_ms(void);                /* host wall clock, ms */
#ifdef __cplusplus
}
#endif
#endif
