/* Device helpers shared by the low-precision weight kernels (k_fp8_gemv.cu, k_fp8_tc_gemv.cu,
 * k_fp8_gemm.cu, k_mxfp4_gemv.cu): E4M3 -> float in registers (through half2, exact: every E4M3 value
 * is a half), the tile-list decoding of the grouped forms (the same lists as k_grouped_gemm.cu), and
 * the pieces the warp-per-row GEMVs share: a pass's activation row pointers, 16 bf16 widened to
 * floats, and the warp reduction + store of the NR x MR accumulators. */
#ifndef DI_K_FP8_COMMON_CUH
#define DI_K_FP8_COMMON_CUH
#include "cuda_common.cuh"
#include "cuda_fp8.h"
#include <cuda_fp16.h>
#include <cuda_fp8.h>

/* 4 E4M3 values (byte 0 first) to floats. */
static __device__ __forceinline__ void fp8x4_to_f32(uint32_t v, float *f) {
  __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
  __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
  float2 a = __half22float2(*(__half2 *)&lo), b = __half22float2(*(__half2 *)&hi);
  f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
}
static __device__ __forceinline__ float fp8_to_f32(uint8_t v) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
  return __half2float(*(__half *)&h);
}

/* The rows [m0, mend) and expert e of this CTA: the tile list's entry blockIdx.y (tile = e << 16 | i,
 * rows off[e] + i*bm ..), or without a list (dense) m-tile blockIdx.y of M rows. */
struct fp8_rows { int e, m0, mend; };
static __device__ __forceinline__ fp8_rows fp8_tile_rows(const int32_t *off, const int32_t *tiles, int bm, int M) {
  fp8_rows t;
  if (tiles) {
    const int tile = tiles[blockIdx.y];
    t.e = tile >> 16;
    t.m0 = off[t.e] + (tile & 0xffff) * bm;
    t.mend = min(off[t.e + 1], t.m0 + bm);
  } else {
    t.e = 0;
    t.m0 = (int)blockIdx.y * bm;
    t.mend = min(M, t.m0 + bm);
  }
  return t;
}

/* The activation rows of a pass of MR rows from mb (nm of them live; the rest point at row mb, computed
 * and not stored), through the gather list a_rows when there is one. */
template <int MR>
static __device__ __forceinline__ void gv_act_rows(const bf16 **xr, const bf16 *A, int lda, const int32_t *a_rows,
                                                   int mb, int nm) {
#pragma unroll
  for (int m = 0; m < MR; m++) {
    const int mm = mb + (m < nm ? m : 0);
    xr[m] = A + (int64_t)(a_rows ? a_rows[mm] : mm) * lda;
  }
}

/* 16 bf16 at p (32-byte aligned) to floats. */
static __device__ __forceinline__ void bf16x16_to_f32(const bf16 *p, float *xf) {
  const uint4 x0 = __ldg((const uint4 *)p), x1 = __ldg((const uint4 *)p + 1);
  const __nv_bfloat162 *p0 = (const __nv_bfloat162 *)&x0, *p1 = (const __nv_bfloat162 *)&x1;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float2 a = __bfloat1622float2(p0[j]), b = __bfloat1622float2(p1[j]);
    xf[2 * j] = a.x; xf[2 * j + 1] = a.y; xf[8 + 2 * j] = b.x; xf[8 + 2 * j + 1] = b.y;
  }
}

/* The tail of a warp-per-NR-rows GEMV pass: each lane's acc[r][m] summed across the warp (a fixed
 * butterfly: the same order whatever the other rows), then lane r * MR + m stores output column n0 + r of
 * row mb + m (bf16, or f32 with y += the sum when beta != 0) where it exists. The lane's value is picked
 * with constant indices so that acc stays in registers. */
template <int NR, int MR>
static __device__ __forceinline__ void gv_reduce_store(float (*acc)[MR], int lane, int n0, int N, int mb, int nm,
                                                       void *C, int ldc, int c_f32, float beta) {
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int m = 0; m < MR; m++) {
      float v = acc[r][m];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][m] = v;
    }
  if (lane >= NR * MR) return;
  const int r = lane / MR, m = lane % MR, n = n0 + r;
  float v = 0.f;
#pragma unroll
  for (int rr = 0; rr < NR; rr++)
#pragma unroll
    for (int mm = 0; mm < MR; mm++)
      if (rr == r && mm == m) v = acc[rr][mm];
  if (n >= N || m >= nm) return;
  if (c_f32) {
    float *y = (float *)C + (int64_t)(mb + m) * ldc + n;
    *y = beta != 0.f ? v + beta * *y : v;
  } else {
    ((bf16 *)C)[(int64_t)(mb + m) * ldc + n] = di_fb(v);
  }
}
#endif
