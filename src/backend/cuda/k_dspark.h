/* C entry points of the DSpark drafter's kernels and the target's feature capture (k_dspark.cu), in
 * the style of cuda_kernels.h (device pointers, launched on the stream, no sync); used by
 * cuda_dspark.cu. Kept apart from cuda_kernels.h so that the other kernel files do not depend on it. */
#ifndef DI_CUDA_K_DSPARK_H
#define DI_CUDA_K_DSPARK_H
#include "cuda_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif
/* dst row (*row0 + i) (row0 a device int, NULL: 0) = h[rows[i]][0..H), RMS-normed by norm_w (eps) when
 * norm_w != NULL. */
di_status di_cuk_capture_rows(const float *h, int H, const int32_t *rows, int n, const float *norm_w, float eps,
                              float *dst, int ld_dst, const int32_t *row0, di_cu_stream s);
/* out[i] = bf16(x[i]) for n floats. */
di_status di_cuk_f32_to_bf16(const float *x, int64_t n, uint16_t *out, di_cu_stream s);
/* In place, each of n_heads heads of n_rows rows (row stride ld): RMSNorm over hd with w, then RoPE of
 * half-split pairs at position pos[r / rows_per_pos] + r % rows_per_pos (angle pos * inv_freq[i] in f32). */
di_status di_cuk_head_norm_rope(float *x, int ld, int n_rows, int n_heads, int hd, const float *w, float eps,
                                const int32_t *pos, int rows_per_pos, const float *inv_freq, di_cu_stream s);
/* cache_layer[gslot[t]] = [k[t] | v[t]] (kvd floats each) for t < n (rows with gslot[t] < 0 skipped). */
di_status di_cuk_dspark_cache_write(const float *k, const float *v, int kvd, int n, const int32_t *gslot,
                                    float *cache_layer, di_cu_stream s);
/* Grouped-query attention of n proposal blocks of B rows: block i's rows attend (not causally) to the
 * anchor[i] cached context rows of its block table bt[i] (row stride bt_stride, DI_KV_BLOCK_SIZE slots a
 * block; cache rows [K | V] of NKV * hd floats) and to the block's own keys kb / values vb
 * ([n * B][NKV * hd]); q and out [n * B][NH * hd], out in bf16. max_keys >= every anchor + B. */
di_status di_cuk_dspark_attend(const float *q, const float *kb, const float *vb, const float *cache_layer,
                               const int32_t *bt, int bt_stride, const int32_t *anchor, int n, int B, int NH, int NKV,
                               int hd, float scale, int max_keys, uint16_t *out, di_cu_stream s);

/* Round j of greedy drafting for n proposal blocks of B rows (logits [n * B][V] and normed hidden rows
 * hid [n * B][H] of the proposal, on the device): row j += markov_w2 . markov_w1[prev[i]] (w1, w2 f32
 * [V][rank]; rank 0: none; logits are not changed), its argmax over [0, limit) (first maximum) is draft j of block i, its
 * confidence sigmoid(conf_w . [h_j ; markov_w1[prev]] + conf_b) (1 without a head); prev[i] becomes
 * the draft. j >= cap[i], or a block whose previous round found none: -1. */
di_status di_cuk_dspark_greedy_round(float *logits, const float *hid, int32_t *prev, const int32_t *cap, int j, int n,
                                     int B, int V, int limit, int H, int rank, const float *w1, const float *w2,
                                     const float *conf_w, float conf_b, int has_conf, int conf_markov,
                                     int32_t *out_tok, float *out_conf, void *scratch, di_cu_stream s);
/* bytes of the device scratch di_cuk_dspark_greedy_round needs for n blocks (per-chunk maxima) */
size_t di_cuk_dspark_greedy_scratch(int n);
/* A proposal inside the step: block i's anchor from the step's samples (k_dspark.cu's comment): the
 * drafts in rows first[i] + 1 .. last[i] accepted while equal to the samples before them, the anchor
 * the sample after the last accepted one; writes the blocks' tokens [n * B] (anchor, then mask), their
 * anchor positions, prev (the anchor) and cap_out (cap, 0 for padding) for the greedy rounds, and
 * anchor_out [n][2] (token, position; -1 for padding). */
di_status di_cuk_dspark_anchor(int n, const int32_t *first, const int32_t *last, const int32_t *cap,
                               const int32_t *tokens, const int32_t *positions, const int32_t *sampled, int B, int mask,
                               int32_t *block_tok, int32_t *anchor_pos, int32_t *prev, int32_t *cap_out,
                               int32_t *anchor_out, di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
