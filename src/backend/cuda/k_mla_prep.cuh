/* Token t's MLA preparation (the latent's norm, the cache entry, the roped query parts) as one CTA's
 * device code: k_mla_prep.cu's kernels and the tensor-core absorption's fused form (k_tc_gemm.cu). */
#ifndef DI_K_MLA_PREP_CUH
#define DI_K_MLA_PREP_CUH
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_kv8.cuh"

static __device__ __forceinline__ void rope_pair(int i, int P, int interleave, int *a, int *b) {
  if (interleave) { *a = 2 * i; *b = 2 * i + 1; }
  else { *a = i; *b = i + P / 2; }
}

/* Token t's preparation by one CTA (all its threads). VT = 0: the latent's sum of squares as blockDim.x
 * threads leave it (thread x: columns x, x + blockDim.x, ...; di_block_sum); VT = 256 on a CTA of 128
 * threads: as 256 threads leave it, each thread forming two of them (tid, tid + 128) and each warp two of
 * the 8 warp sums (the tensor-core absorption's CTAs, k_tc_gemm.cu: mla_prep_kernel's bits). The rest is
 * elementwise (any blockDim.x >= 128). */
template <int VT = 0>
static __device__ void mla_prep_token(int t, const bf16 *kva, int ldk, const bf16 *q, int ldq,
                                      const int32_t *positions, const int32_t *slots, int H, int N, int P, int R,
                                      const float *kv_norm, float eps, const di_cuk_rope &rope, bf16 *Qa,
                                      void *cache, int kv_fp8) {
  __shared__ float red[32];
  __shared__ float cs[2][DI_CUK_MLA_P / 2]; /* cos, sin per pair */
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
  if (VT == 0) {
    for (int i = threadIdx.x; i < R; i += blockDim.x) ss += di_bf(x[i]) * di_bf(x[i]);
    ss = di_block_sum(ss, red); /* also orders the cs[] writes above */
  } else {
    static_assert(VT == 0 || VT == 256, "the emulated width");
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float s2[2];
#pragma unroll
    for (int hv = 0; hv < 2; hv++) {
      float v = 0.f;
      for (int i = threadIdx.x + 128 * hv; i < R; i += VT) v += di_bf(x[i]) * di_bf(x[i]);
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      s2[hv] = v;
    }
    __syncthreads(); /* also orders the cs[] writes above */
    if (lane == 0) {
      red[w] = s2[0];
      red[w + 4] = s2[1];
    }
    __syncthreads();
    ss = lane < VT / 32 ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  }
  float inv = rsqrtf(ss / R + eps);
  const int D = DI_CUK_MLA_D, RP = DI_CUK_MLA_R; /* padded entry layout */
  bf16 *pe; /* the entry's 64 rope columns (the latent's are written here) */
  if (kv_fp8) { /* warp g < 4 quantizes latent group g (blockDim >= 128) */
    unsigned char *e8 = (unsigned char *)cache + (int64_t)slots[t] * DI_CUK_KV8_ROW;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (w < RP / 128) {
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int c = w * 128 + lane * 4 + i;
        v[i] = c < R ? di_bf(x[c]) * inv * kv_norm[c] : 0.f;
      }
      di_kv8_quant_group(v, e8, w, lane);
    }
    pe = (bf16 *)(e8 + DI_CUK_KV8_PE);
  } else {
    bf16 *ce = (bf16 *)cache + (int64_t)slots[t] * D;
    for (int i = threadIdx.x; i < RP; i += blockDim.x) ce[i] = di_fb(i < R ? di_bf(x[i]) * inv * kv_norm[i] : 0.f);
    pe = ce + RP;
  }
  for (int i = P + threadIdx.x; i < DI_CUK_MLA_P; i += blockDim.x) pe[i] = di_fb(0.f);
  for (int i = threadIdx.x; i < P / 2; i += blockDim.x) {
    int a, b;
    rope_pair(i, P, rope.interleave, &a, &b);
    float xa = di_bf(x[R + a]), xb = di_bf(x[R + b]), c = cs[0][i], sn = cs[1][i];
    pe[a] = di_fb(xa * c - xb * sn);
    pe[b] = di_fb(xb * c + xa * sn);
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

#endif
