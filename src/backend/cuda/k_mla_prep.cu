/* MLA preparation for one step, one block per token (for decode steps fused with the query
 * absorption, see mla_prep_absorb_kernel): RMSNorm of the compressed KV (c_kv) and RoPE of
 * the shared key part (k_pe), written as one bf16 cache entry [c_kv | k_pe] into the paged latent
 * cache (or, kv_fp8, the FP8 entry of k_kv8.cuh: the normed latent quantized per 128 channels, the rope
 * part bf16); and RoPE of every head's q_pe into the rope columns of the absorbed query Qa. The rotation
 * angle pos * inv_freq is formed in double so long positions (up to 160k) keep full precision. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_skinny_kn.cuh"
#include "k_kv8.cuh"

#include "k_mla_prep.cuh"

static __global__ void mla_prep_kernel(const bf16 *kva, int ldk, const bf16 *q, int ldq, const int32_t *positions,
                                       const int32_t *slots, int H, int N, int P, int R, const float *kv_norm,
                                       float eps, di_cuk_rope rope, bf16 *Qa, void *cache, int kv_fp8) {
  DI_PDL_ENTRY();
  mla_prep_token(blockIdx.x, kva, ldk, q, ldq, positions, slots, H, N, P, R, kv_norm, eps, rope, Qa, cache, kv_fp8);
}

/* Decode steps: the preparation and the query absorption q_lat[t][h] = q_nope[t][h] . W_UK[h] in one
 * launch. They are independent (both read the q/kv projection; they write different columns of Qa, and
 * the cache), so CTAs x < n_abs do the absorption tiles of head y and the last column of CTAs prepares
 * token y: one kernel boundary per layer less on the decode critical path. */
template <int M>
static __global__ void __launch_bounds__(KN_THREADS)
mla_prep_absorb_kernel(const bf16 *kva, int ldk, const bf16 *q, int ldq, const int32_t *positions,
                       const int32_t *slots, int H, int N, int P, int R, const float *kv_norm, float eps,
                       di_cuk_rope rope, bf16 *Qa, void *cache, int kv_fp8, const bf16 *wuk, int ldw, int64_t sw,
                       int n_abs) {
  const int bx = blockIdx.x, by = blockIdx.y;
  if (bx < n_abs) {
    if (by >= H) return;
    const bf16 *W = wuk + sw * by;
    kn_prefetch(W, ldw, R, N, bx);
    DI_PDL_ENTRY();
    /* X = q_nope of head by (row stride ldq per token), Y = Qa latent columns of head by */
    kn_tile<M>(q + (int64_t)by * (N + P), ldq, W, ldw, R, N, Qa + (int64_t)by * DI_CUK_MLA_D, H * DI_CUK_MLA_D, bx);
    return;
  }
  DI_PDL_ENTRY();
  if (by >= M) return;
  mla_prep_token(by, kva, ldk, q, ldq, positions, slots, H, N, P, R, kv_norm, eps, rope, Qa, cache, kv_fp8);
}

extern "C" di_status di_cuk_mla_prep(const uint16_t *kva, int ldk, const uint16_t *q, int ldq,
                                     const int32_t *positions, const int32_t *slots, int T, int H, int N,
                                     int P, int R,
                                     const float *kv_norm, float eps, di_cuk_rope rope, uint16_t *Qa,
                                     void *cache, int kv_fp8, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  if (P > DI_CUK_MLA_P || P % 2 || R > DI_CUK_MLA_R)
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "cuda: MLA ranks kv_lora %d / rope %d unsupported (need <= %d / even <= %d)", R,
                        P, DI_CUK_MLA_R, DI_CUK_MLA_P);
  DI_CU(di_launch(mla_prep_kernel, T, 256, 0, s, (const bf16 *)kva, ldk, (const bf16 *)q, ldq, positions, slots, H, N,
                  P, R, kv_norm, eps, rope, (bf16 *)Qa, cache, kv_fp8));
  DI_CU_LAUNCH("mla_prep");
  return DI_OK;
}

extern "C" int di_cuk_mla_prep_absorb_ok(int T, int H, int R, const uint16_t *wuk, int ldw, int64_t sw) {
  return T >= 1 && H <= 65535 && kn_ok(T, R, ldw, sw, wuk);
}

extern "C" di_status di_cuk_mla_prep_absorb(const uint16_t *kva, int ldk, const uint16_t *q, int ldq,
                                            const int32_t *positions, const int32_t *slots, int T, int H, int N, int P,
                                            int R, const float *kv_norm, float eps, di_cuk_rope rope, uint16_t *Qa,
                                            void *cache, int kv_fp8, const uint16_t *wuk, int ldw, int64_t sw,
                                            di_cu_stream s) {
  if (T <= 0) return DI_OK;
  if (P > DI_CUK_MLA_P || P % 2 || R > DI_CUK_MLA_R)
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "cuda: MLA ranks kv_lora %d / rope %d unsupported (need <= %d / even <= %d)", R,
                        P, DI_CUK_MLA_R, DI_CUK_MLA_P);
  if (!di_cuk_mla_prep_absorb_ok(T, H, R, wuk, ldw, sw))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fused MLA prep + absorption of %d tokens, rank %d", T, R);
  const int n_abs = (R + KN_COLS - 1) / KN_COLS;
  const dim3 grid(n_abs + 1, H > T ? H : T);
  const bf16 *kv = (const bf16 *)kva, *qq = (const bf16 *)q, *w = (const bf16 *)wuk;
  switch (T) {
#define PA_CASE(m)                                                                                              \
  case m:                                                                                                       \
    DI_CU(di_launch(mla_prep_absorb_kernel<m>, grid, KN_THREADS, 0, s, kv, ldk, qq, ldq, positions, slots, H, N, P, R, \
                    kv_norm, eps, rope, (bf16 *)Qa, cache, kv_fp8, w, ldw, sw, n_abs));                        \
    break;
    PA_CASE(1) PA_CASE(2) PA_CASE(3) PA_CASE(4) PA_CASE(5) PA_CASE(6) PA_CASE(7) PA_CASE(8)
#undef PA_CASE
  }
  return DI_OK;
}


/* The FP8 entry's write rule alone (tests/cuda/test_cuda_kernels.c --kv8-only checks it against the CPU's
 * di_kv_fp8_quantize bit for bit): one CTA of 4 warps per row, warp g quantizing group g. */
static __global__ void kv8_quantize_kernel(const float *x, int R, unsigned char *entries) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float *xr = x + (int64_t)blockIdx.x * R;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int c = w * 128 + lane * 4 + i;
    v[i] = c < R ? xr[c] : 0.f;
  }
  di_kv8_quant_group(v, entries + (int64_t)blockIdx.x * DI_CUK_KV8_ROW, w, lane);
}

extern "C" di_status di_cuk_kv8_quantize(const float *x, int R, int n, void *entries, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  if (R <= 0 || R > DI_CUK_MLA_R) return di_error_set(DI_ERR_INVALID_ARG, "cuda: kv8 quantize of rank %d", R);
  kv8_quantize_kernel<<<n, 128, 0, (cudaStream_t)s>>>(x, R, (unsigned char *)entries);
  DI_CU_LAUNCH("kv8_quantize");
  return DI_OK;
}

/* W_UK of every head transposed for the batch-invariant absorption in the W [N][K] form
 * (DEEPINFER_CUDA_ABSORB_NK): kv_b rows h (dn + dv) .. + dn ([dn][R]) into out + h R dn as [R][dn]; the
 * same values, so the product's chains (and bits) are the same, on whichever core takes W [N][K]. Once, at load. */
static __global__ void wuk_transpose_kernel(const bf16 *kv_b, int dn, int dv, int R, bf16 *out) {
  const int h = blockIdx.y;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < R * dn; i += gridDim.x * blockDim.x) {
    const int r = i / dn, k = i % dn;
    out[(int64_t)h * R * dn + i] = kv_b[((int64_t)h * (dn + dv) + k) * R + r];
  }
}

extern "C" di_status di_cuk_mla_wuk_transpose(const uint16_t *kv_b, int NH, int dn, int dv, int R, uint16_t *out,
                                              di_cu_stream s) {
  if (NH <= 0 || dn <= 0 || R <= 0) return DI_OK;
  wuk_transpose_kernel<<<dim3((R * dn + 255) / 256 < 256 ? (R * dn + 255) / 256 : 256, NH), 256, 0, (cudaStream_t)s>>>(
      (const bf16 *)kv_b, dn, dv, R, (bf16 *)out);
  DI_CU_LAUNCH("mla_wuk_transpose");
  return DI_OK;
}
