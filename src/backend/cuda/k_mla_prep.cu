/* MLA preparation for one step, one block per token: RMSNorm of the compressed KV (c_kv) and RoPE of
 * the shared key part (k_pe), written as one bf16 cache entry [c_kv | k_pe] into the paged latent
 * cache; and RoPE of every head's q_pe into the rope columns of the absorbed query Qa. The rotation
 * angle pos * inv_freq is formed in double so long positions (up to 160k) keep full precision. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

static __device__ __forceinline__ void rope_pair(int i, int P, int interleave, int *a, int *b) {
  if (interleave) { *a = 2 * i; *b = 2 * i + 1; }
  else { *a = i; *b = i + P / 2; }
}

static __global__ void mla_prep_kernel(const bf16 *kva, int ldk, const bf16 *q, int ldq,
                                       const int32_t *positions,
                                       const int32_t *slots, int H, int N, int P, int R,
                                       const float *kv_norm, float eps, di_cuk_rope rope, bf16 *Qa,
                                       bf16 *cache) {
  __shared__ float red[32];
  __shared__ float cs[2][DI_CUK_MLA_P / 2]; /* cos, sin per pair */
  DI_PDL_ENTRY();
  int t = blockIdx.x;
  const bf16 *x = kva + (int64_t)t * ldk;
  int pos = positions[t];
  for (int i = threadIdx.x; i < P / 2; i += blockDim.x) {
    double ang = (double)pos * (double)rope.inv_freq[i];
    double sn, cn;
    sincos(ang, &sn, &cn);
    cs[0][i] = (float)cn * rope.attn_factor;
    cs[1][i] = (float)sn * rope.attn_factor;
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < R; i += blockDim.x) ss += di_bf(x[i]) * di_bf(x[i]);
  ss = di_block_sum(ss, red); /* also orders the cs[] writes above */
  float inv = rsqrtf(ss / R + eps);
  const int D = DI_CUK_MLA_D, RP = DI_CUK_MLA_R; /* padded entry layout */
  bf16 *ce = cache + (int64_t)slots[t] * D;
  for (int i = threadIdx.x; i < RP; i += blockDim.x) ce[i] = di_fb(i < R ? di_bf(x[i]) * inv * kv_norm[i] : 0.f);
  for (int i = P + threadIdx.x; i < DI_CUK_MLA_P; i += blockDim.x) ce[RP + i] = di_fb(0.f);
  for (int i = threadIdx.x; i < P / 2; i += blockDim.x) {
    int a, b;
    rope_pair(i, P, rope.interleave, &a, &b);
    float xa = di_bf(x[R + a]), xb = di_bf(x[R + b]), c = cs[0][i], sn = cs[1][i];
    ce[RP + a] = di_fb(xa * c - xb * sn);
    ce[RP + b] = di_fb(xb * c + xa * sn);
  }
  for (int j = threadIdx.x; j < H * (P / 2); j += blockDim.x) {
    int h = j / (P / 2), i = j % (P / 2), a, b;
    rope_pair(i, P, rope.interleave, &a, &b);
    const bf16 *qp = q + (int64_t)t * ldq + (int64_t)h * (N + P) + N;
    float xa = di_bf(qp[a]), xb = di_bf(qp[b]), c = cs[0][i], sn = cs[1][i];
    bf16 *qo = Qa + ((int64_t)t * H + h) * D + RP;
    qo[a] = di_fb(xa * c - xb * sn);
    qo[b] = di_fb(xb * c + xa * sn);
  }
  /* zero padding of Qa: latent columns [R, 512) and rope columns [P, 64) */
  int padw = (RP - R) + (DI_CUK_MLA_P - P);
  for (int j = threadIdx.x; j < H * padw; j += blockDim.x) {
    int h = j / padw, c = j % padw;
    int col = c < RP - R ? R + c : RP + P + (c - (RP - R));
    Qa[((int64_t)t * H + h) * D + col] = di_fb(0.f);
  }
}

extern "C" di_status di_cuk_mla_prep(const uint16_t *kva, int ldk, const uint16_t *q, int ldq,
                                     const int32_t *positions, const int32_t *slots, int T, int H, int N,
                                     int P, int R,
                                     const float *kv_norm, float eps, di_cuk_rope rope, uint16_t *Qa,
                                     uint16_t *cache, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  if (P > DI_CUK_MLA_P || P % 2 || R > DI_CUK_MLA_R)
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "cuda: MLA ranks kv_lora %d / rope %d unsupported (need <= %d / even <= %d)", R,
                        P, DI_CUK_MLA_R, DI_CUK_MLA_P);
  DI_CU(di_launch(mla_prep_kernel, T, 256, 0, s, (const bf16 *)kva, ldk, (const bf16 *)q, ldq, positions, slots, H, N,
                  P, R, kv_norm, eps, rope, (bf16 *)Qa, (bf16 *)cache));
  DI_CU_LAUNCH("mla_prep");
  return DI_OK;
}

