/* MLA prefill attention in the non-absorbed (MHA) form (k_mha_prefill.cu, issue 19): the declarations,
 * apart from cuda_kernels.h so that the kernel's users alone depend on them. */
#ifndef DI_K_MHA_PREFILL_H
#define DI_K_MHA_PREFILL_H
#include "cuda_kernels.h"
#ifdef __cplusplus
extern "C" {
#endif
/* An item: query tokens t0 .. t1 - 1 (at most 64, one sequence) whose keys 0 .. nk - 1 are rows kbase ..
 * kbase + nk - 1 of the up-projected KV and the gathered latents G (a token at position p attends to
 * keys 0 .. p; p < nk). */
typedef struct di_cuk_mha_item {
  int32_t t0, t1, kbase, nk;
} di_cuk_mha_item;
#define DI_CUK_MHA_ROWS 64 /* query tokens per item, at most */
/* Head dims the kernel is built for: dn + dr = 192 with dv = 128 (V2/V3) or 48 / 32 (the tiny fixtures) */
int di_cuk_mha_prefill_ok(int N, int P, int DV);
/* out[t][h * DV + c] (row stride ldo) = softmax over keys k <= positions[t] of scale * (q_nope[t][h] .
 * KV[k][h][0:N] + q_pe[t][h] . G[k][512:512+P]) weighted KV[k][h][N:N+DV]: q_nope at q + t*ldq + h*q_hs,
 * the rope'd q_pe at qa's rope columns (the absorbed query's layout, [T*H][576]), KV [keys][ldkv] with
 * head h at h*(N+DV) ([k_nope | v]), G [keys][576] (cache entries). Grid: H x n_items (up to 65,535 items). */
di_status di_cuk_mha_prefill(const uint16_t *q, int ldq, int q_hs, const uint16_t *qa, const uint16_t *kv, int ldkv,
                             const uint16_t *g, const int32_t *positions, const di_cuk_mha_item *items, int n_items,
                             int H, int N, int P, int DV, float scale, uint16_t *out, int ldo, di_cu_stream s);
/* G[i] = cache[slots[i]] (576 bf16 entries; from kv_fp8's DI_CUK_KV8_ROW-byte entries dequantized) for i < n */
di_status di_cuk_mha_gather(const void *cache, int kv_fp8, const int32_t *slots, int n, uint16_t *G, di_cu_stream s);
#ifdef __cplusplus
}
#endif
#endif
