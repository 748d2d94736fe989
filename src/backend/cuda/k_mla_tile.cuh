/* The per-tile steps shared by the MLA attention kernels (k_mla_attn.cu, k_mla_decode.cu): a warp's
 * 16 x 8 slice of the score tile, the online softmax (FlashAttention-2) step, and the P fragments of
 * the P.V product. For the softmax a thread holds two rows (rA, rA + 8) of an m16n8k16 score tile, N scores each in
 * log2 units; the four lanes that share a row (lane % 4) combine their maxima and sums with two
 * shuffles. The step turns the scores into exp2(s - new max), updates each row's running max m and
 * sum l, and gives the factors al0 / al1 that rescale the row's accumulated output (0 while a row has
 * seen only masked keys: m = -inf). */
#ifndef DI_K_MLA_TILE_CUH
#define DI_K_MLA_TILE_CUH
#include "cuda_common.cuh"
#include "cuda_kernels.h"

/* S[16 rows][8 keys] = Q . K^T over the DI_CUK_MLA_D dims: qrow / krow are this lane's ldmatrix rows in
 * the Q tile and among the warp's 8 keys; s gets the accumulator fragment. Two accumulators halve the
 * chain of dependent MMAs (36 in one chain would serialize on their latency). */
static __device__ __forceinline__ void di_qk_slice(const bf16 *qrow, const bf16 *krow, float *s) {
  float s2[4] = {0.f, 0.f, 0.f, 0.f};
  s[0] = s[1] = s[2] = s[3] = 0.f;
#pragma unroll 6
  for (int kk = 0; kk < DI_CUK_MLA_D / 16; kk += 2) {
    uint32_t a[4], a2[4], b[4];
    di_ldsm_x4(a, qrow + kk * 16);
    di_ldsm_x4(a2, qrow + kk * 16 + 16);
    di_ldsm_x4(b, krow + kk * 16);
    di_mma16816(s, a, b);
    di_mma16816(s2, a2, b + 2);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) s[i] += s2[i];
}

/* di_qk_slice with the warp's Q fragments held in registers (qa[i]: the ldmatrix x4 of qrow + 16i, which
 * di_qk_slice loads again for every key tile): the same two chains of the same MMAs on the same values,
 * so the same bits. */
static __device__ __forceinline__ void di_qk_slice_qreg(const uint32_t (&qa)[DI_CUK_MLA_D / 16][4], const bf16 *krow,
                                                        float *s) {
  float s2[4] = {0.f, 0.f, 0.f, 0.f};
  s[0] = s[1] = s[2] = s[3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < DI_CUK_MLA_D / 16; kk += 2) {
    uint32_t b[4];
    di_ldsm_x4(b, krow + kk * 16);
    di_mma16816(s, qa[kk], b);
    di_mma16816(s2, qa[kk + 1], b + 2);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) s[i] += s2[i];
}

template <int N>
static __device__ __forceinline__ void di_online_softmax2(float *s0, float *s1, float &m0, float &m1, float &l0,
                                                          float &l1, float &al0, float &al1) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; i++) { mx0 = fmaxf(mx0, s0[i]); mx1 = fmaxf(mx1, s1[i]); }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float nm0 = fmaxf(m0, mx0), nm1 = fmaxf(m1, mx1);
  const float ref0 = nm0 == -INFINITY ? 0.f : nm0, ref1 = nm1 == -INFINITY ? 0.f : nm1;
  al0 = exp2f(m0 - ref0); /* m = -inf -> 0 */
  al1 = exp2f(m1 - ref1);
  float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int i = 0; i < N; i++) {
    s0[i] = exp2f(s0[i] - ref0); sum0 += s0[i];
    s1[i] = exp2f(s1[i] - ref1); sum1 += s1[i];
  }
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
  l0 = l0 * al0 + sum0;
  l1 = l1 * al1 + sum1;
  m0 = nm0;
  m1 = nm1;
}

/* The probabilities of keys 16ks .. 16ks+15 as the A fragment of the P.V product (the scores were read
 * as keys 8q + (lane % 4) * 2 + {0, 1}, q = 0, 1, ...) */
static __device__ __forceinline__ void di_p_fragment(const float *s0, const float *s1, int ks, uint32_t *pa) {
  pa[0] = di_pack_bf16(s0[4 * ks], s0[4 * ks + 1]);
  pa[1] = di_pack_bf16(s1[4 * ks], s1[4 * ks + 1]);
  pa[2] = di_pack_bf16(s0[4 * ks + 2], s0[4 * ks + 3]);
  pa[3] = di_pack_bf16(s1[4 * ks + 2], s1[4 * ks + 3]);
}
#endif
