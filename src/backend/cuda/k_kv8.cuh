/* The FP8 latent cache entry (--kv-cache-dtype fp8, issue 18; layout in cuda_kernels.h, DI_CUK_KV8_*):
 * the write rule (one token's 512 latent values, f32, to 4 scales + 512 E4M3 codes, the CPU backend's
 * kv_store rule bit for bit: scale = amax / 448, 1 for an all-zero group, code = cvt.rn.satfinite of
 * x / scale with IEEE division) and the read step every attention kernel uses to stage keys: one
 * 16-byte chunk of the bf16 entry layout (8 values at column col of [latent 512 | rope 64]) fetched
 * from either pool format. From the FP8 pool the latent chunk is dequantized in registers, bf16(code *
 * scale) (the tensor cores take bf16), and the rope chunk copied; the kernels then run unchanged on
 * the staged tile. */
#ifndef DI_K_KV8_CUH
#define DI_K_KV8_CUH
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include <cuda_fp8.h>

/* the address of key row crow in a layer's pool of either format */
static __device__ __forceinline__ const unsigned char *di_kv_row(const void *cache, int kv_fp8, int64_t crow) {
  return (const unsigned char *)cache + crow * (kv_fp8 ? DI_CUK_KV8_ROW : DI_CUK_MLA_D * 2);
}

/* 8 E4M3 codes (8 bytes) times scale s as 8 bf16 (16 bytes) */
static __device__ __forceinline__ uint4 di_kv8_dequant8(uint2 q, float s) {
  uint4 r;
  uint32_t *o = &r.x;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t w = h ? q.y : q.x;
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w >> (16 * p)) & 0xffffu), __NV_E4M3);
      const float2 f = __half22float2(*(const __half2 *)&hr); /* exact: every E4M3 value is a half */
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
      o[2 * h + p] = *(const uint32_t *)&b;
    }
  }
  return r;
}

/* The 16 bytes at bf16 column col (a multiple of 8) of key row `row` (di_kv_row), zeros when !ok, into
 * shared memory at dst: cp.async for the bf16 pool (the caller's commit / wait), a load, dequantize and
 * store for the FP8 pool (visible after the caller's next __syncthreads, like the cp.async data). */
/* The 8 bf16 values at column col (a multiple of 8) of an FP8 entry, as 16 bytes */
static __device__ __forceinline__ uint4 di_kv8_chunk16(const unsigned char *row, int col) {
  if (col < DI_CUK_MLA_R) {
    const uint2 q = __ldg((const uint2 *)(row + DI_CUK_KV8_LAT + col));
    const float s = __ldg((const float *)(row + DI_CUK_KV8_SCALES) + (col >> 7));
    return di_kv8_dequant8(q, s);
  }
  return __ldg((const uint4 *)(row + DI_CUK_KV8_PE + (col - DI_CUK_MLA_R) * 2));
}

template <int KV8>
static __device__ __forceinline__ void di_kv_stage16(bf16 *dst, const unsigned char *row, int col, bool ok) {
  if (!KV8) {
    di_cp_async16(dst, row + col * 2, ok);
    return;
  }
  *(uint4 *)dst = ok ? di_kv8_chunk16(row, col) : make_uint4(0u, 0u, 0u, 0u);
}

/* The write rule for one 128-channel group, by one warp: lane i holds x[4i .. 4i+3] (f32); writes the
 * scale (lane 0) and the 128 codes (4 per lane) of group g into entry e. Returns nothing; the CPU's
 * kv_store is the reference (tests/cuda/test_cuda_kv8.c checks it bit for bit). */
static __device__ __forceinline__ void di_kv8_quant_group(const float (&x)[4], unsigned char *e, int g, int lane) {
  float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
  uint32_t w = 0;
#pragma unroll
  for (int i = 0; i < 4; i++)
    w |= (uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(x[i], s), __NV_SATFINITE, __NV_E4M3) << (8 * i);
  *(uint32_t *)(e + DI_CUK_KV8_LAT + g * 128 + lane * 4) = w;
  if (lane == 0) *((float *)(e + DI_CUK_KV8_SCALES) + g) = s;
}
#endif
