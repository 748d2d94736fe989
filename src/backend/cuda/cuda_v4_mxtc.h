/* C entry points of the DeepSeek-V4 MXFP4 routed experts on the tensor cores (k_mxfp4_tc_grouped.cu): W4A16
 * as SGLang runs V4's experts on Hopper. The E2M1 codes and E8M0 scales (cuda_mxfp4.h's layout) are
 * dequantized to bf16 in registers (exactly: a code times a power of two) for mma.sync m16n8k16, fp32
 * accumulate; the activations are rounded to bf16 (the CUDA-core kernels of k_v4_dense.cu keep them in
 * float32, so the two forms differ by that rounding, ~1e-3 relative). Each output's sum runs over K in one
 * fixed order whatever the tile holds: a slot's result does not depend on the step's other tokens
 * (batch-invariant), nor on the tile size. Used by cuda_deepseek_v4.cu's moe() for steps of at least
 * DEEPINFER_CUDA_V4_MX_TC tokens (0, the default: never). Device pointers, no sync. */
#ifndef DI_CUDA_V4_MXTC_H
#define DI_CUDA_V4_MXTC_H
#include "cuda_mxfp4.h"
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Whether the tensor-core form takes these stacks (w1, w3: [E][I][D]; w2: [E][D][I]): D, I % 32, scale rows
 * a multiple of 4 bytes (lds % 4), code rows 16-byte aligned. */
int di_v4k_mx_tc_ok(di_cuk_mxfp4w w1, di_cuk_mxfp4w w3, di_cuk_mxfp4w w2, int D, int I);
/* The token tile (8, 16, 32 or 64 slots of one expert) the form picks for T tokens of n_slots over E1 - 1 routed
 * experts, unless di_v4k_mx_tc_tile forced one (0: pick; for tests and A/B benchmarks, not thread-safe). */
int di_v4k_mx_tc_pick_tile(int T, int n_slots, int E1);
void di_v4k_mx_tc_tile(int bt);
/* Bytes of the workspace di_v4k_experts_mx_tc needs (bf16 x, bf16 act, its tile list). */
size_t di_v4k_mx_tc_ws_bytes(int T, int n_slots, int D, int I, int E1);
/* y[ts][d] = w2[e] . act(ts) for each routed slot ts (ids[ts] = e in 0..E1-2; the shared expert's id E1 - 1 and
 * unused slots (-1) are skipped, their rows of y untouched), act(ts)[i] = swiglu with the clamp `limit` of w1[e]
 * and w3[e] rows i on x[ts / n_slots] (as di_v4k_expert_up_mx / _down_mx). tiles8: the step's
 * di_v4k_expert_tiles work (its expert-grouped slot order is reused). */
di_status di_v4k_experts_mx_tc(const float *x, const int32_t *ids, const int32_t *tiles8, int E1, di_cuk_mxfp4w w1,
                               di_cuk_mxfp4w w3, di_cuk_mxfp4w w2, int T, int n_slots, int D, int I, float limit, void *ws,
                               float *y, di_cu_stream s);
/* The form (0: a code byte per bf16 pair, activations in order; 1, the default: nibbles j, j + 4 of a code word
 * per pair, activations stored with each 8 positions as 0 4 1 5 2 6 3 7; 2: form 1 on 8 warps, each stage's two
 * K halves on two warps, summed at the end); the same results up to the sum order. For tests and A/B
 * benchmarks; not thread-safe. */
void di_v4k_mx_tc_form(int form);
int di_v4k_mx_tc_get_form(void);
/* The pieces, for tests: rows of f32 to bf16 in the form's order (n % 8 == 0); the tile list of bt slots (work: 1 + 3 * di_v4k_mx_tc_max_tiles
 * ints: the count, then (expert, first, count) into perm) from tiles8, skipping expert e_skip; the two products
 * (xb [T][D] bf16; act bf16 [T * n_slots][I], both in the form's order; perm: tiles8's slot order, tiles8 + 1 + 3 *
 * di_v4k_expert_max_tiles(T, n_slots, E1)). */
di_status di_v4k_mx_tc_acts(const float *x, int n, uint16_t *xb, di_cu_stream s);
int di_v4k_mx_tc_max_tiles(int T, int n_slots, int E1, int bt);
di_status di_v4k_mx_tc_tiles(const int32_t *tiles8, int T, int n_slots, int E1, int e_skip, int bt, int32_t *work,
                             di_cu_stream s);
di_status di_v4k_mx_tc_up(const uint16_t *xb, const int32_t *perm, const int32_t *tiles, int max_tiles, int bt,
                          di_cuk_mxfp4w w1, di_cuk_mxfp4w w3, int T, int n_slots, int D, int I, float limit, uint16_t *act,
                          di_cu_stream s);
di_status di_v4k_mx_tc_down(const uint16_t *act, const int32_t *perm, const int32_t *tiles, int max_tiles, int bt,
                            di_cuk_mxfp4w w2, int T, int n_slots, int D, int I, float *y, di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
