/* Device helpers shared by the low-precision weight kernels (k_fp8_gemv.cu, k_fp8_tc_gemv.cu,
 * k_fp8_gemm.cu, k_mxfp4_gemv.cu): E4M3 -> float in registers (through half2, exact: every E4M3 value
 * is a half) and the tile-list decoding of the grouped forms (the same lists as k_grouped_gemm.cu). The
 * pieces every warp-per-row GEMV shares (bf16, FP8, MXFP4) are in k_skinny_kn.cuh. */
#ifndef DI_K_FP8_COMMON_CUH
#define DI_K_FP8_COMMON_CUH
#include "cuda_common.cuh"
#include "cuda_fp8.h"
#include "k_skinny_kn.cuh"
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

#endif
