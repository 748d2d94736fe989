/* MXFP4 (E2M1 values two per byte, column 2i in the low nibble, with an E8M0 scale per 32 values of a
 * row: DeepSeek-V4's routed experts) GEMV, W4A16 on the CUDA cores: C = A . dequant(W)^T for decode-sized
 * rows, dense or grouped over experts with k_grouped_gemm.cu's tile lists. Hopper has no FP4 tensor
 * cores; this reads each weight byte once (16 bytes = 32 values = one scale per lane step, FG-style
 * chunking: one warp per 2 weight rows, 2 steps of 1,024 columns in flight) and decodes in registers:
 * a nibble s.ee.m is the half 0 / 0.5 (ee = 0) or (1 + m/2) * 2^(ee-1), built from its bits. The 32
 * products of a step are summed in fp32, then scaled (acc = fma(sum, 2^(e-127), acc)); fixed reduction
 * order, so a row's result does not depend on the others (batch-invariant). */
#include "k_fp8_common.cuh"
#include "cuda_mxfp4.h"

#define MX_WARPS 4
#define MX_NR 2
#define MX_U 2
#define MX_STEP 1024 /* columns per warp step: 32 lanes x 32 values */

/* the half bits of an E2M1 code (low 4 bits of c) */
static __device__ __forceinline__ uint32_t e2m1_half(uint32_t c) {
  const uint32_t e = (c >> 1) & 3, m = c & 1;
  const uint32_t mag = e ? ((e + 14) << 10 | m << 9) : (m ? 0x3800u : 0u);
  return (c & 8) << 12 | mag;
}
/* 8 values (4 bytes, byte 0 low nibble first) to floats */
static __device__ __forceinline__ void e2m1x8_to_f32(uint32_t v, float *f) {
#pragma unroll
  for (int b = 0; b < 4; b++) {
    const uint32_t byte = (v >> (8 * b)) & 0xff, h2 = e2m1_half(byte) | e2m1_half(byte >> 4) << 16;
    const float2 x = __half22float2(*(const __half2 *)&h2);
    f[2 * b] = x.x;
    f[2 * b + 1] = x.y;
  }
}
static __device__ __forceinline__ float e8m0_f32(uint32_t e) {
  return e == 255 ? __uint_as_float(0x7fc00000u) : e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(e << 23);
}

template <int MR>
static __global__ void __launch_bounds__(MX_WARPS * 32)
mxfp4_gemv_kernel(const bf16 *A, int lda, const int32_t *a_rows, di_cuk_mxfp4w w, int N, int K, const int32_t *off,
                  const int32_t *tiles, const int32_t *n_tiles, int bm, int M, void *C, int ldc, int c_f32) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = (blockIdx.x * MX_WARPS + warp) * MX_NR;
  DI_PDL_ENTRY();
  if (tiles && (int)blockIdx.y >= *n_tiles) return;
  if (n0 >= N) return;
  const fp8_rows t = fp8_tile_rows(off, tiles, bm, M);
  const uint8_t *wr[MX_NR], *sr[MX_NR];
#pragma unroll
  for (int r = 0; r < MX_NR; r++) {
    const int64_t n = (int64_t)t.e * N + (n0 + r < N ? n0 + r : n0);
    wr[r] = w.q + n * w.ldq;
    sr[r] = w.scale + n * w.lds;
  }
  for (int mb = t.m0; mb < t.mend; mb += MR) {
    const int nm = min(MR, t.mend - mb);
    const bf16 *xr[MR];
    gv_act_rows<MR>(xr, A, lda, a_rows, mb, nm);
    float acc[MX_NR][MR];
#pragma unroll
    for (int r = 0; r < MX_NR; r++)
#pragma unroll
      for (int m = 0; m < MR; m++) acc[r][m] = 0.f;
    for (int k0 = 0; k0 < K; k0 += MX_U * MX_STEP) {
      uint4 wv[MX_NR][MX_U];
      uint32_t sv[MX_NR][MX_U];
#pragma unroll
      for (int u = 0; u < MX_U; u++) {
        const int k = k0 + u * MX_STEP + lane * 32;
#pragma unroll
        for (int r = 0; r < MX_NR; r++) {
          wv[r][u] = k < K ? di_ld_stream16(wr[r] + k / 2) : make_uint4(0, 0, 0, 0);
          sv[r][u] = k < K ? __ldg(sr[r] + k / 32) : 127u;
        }
      }
#pragma unroll
      for (int u = 0; u < MX_U; u++) {
        const int k = k0 + u * MX_STEP + lane * 32;
        if (k >= K) break;
#pragma unroll
        for (int h = 0; h < 2; h++) { /* the step's two halves of 16 values */
          float wf[MX_NR][16];
#pragma unroll
          for (int r = 0; r < MX_NR; r++) {
            const uint32_t *p = (const uint32_t *)&wv[r][u];
            e2m1x8_to_f32(p[2 * h], wf[r]);
            e2m1x8_to_f32(p[2 * h + 1], wf[r] + 8);
          }
#pragma unroll
          for (int m = 0; m < MR; m++) {
            float xf[16];
            bf16x16_to_f32(xr[m] + k + 16 * h, xf);
#pragma unroll
            for (int r = 0; r < MX_NR; r++) {
              float p = 0.f;
#pragma unroll
              for (int j = 0; j < 16; j++) p = fmaf(xf[j], wf[r][j], p);
              acc[r][m] = fmaf(p, e8m0_f32(sv[r][u]), acc[r][m]);
            }
          }
        }
      }
    }
    gv_reduce_store<MX_NR, MR>(acc, lane, n0, N, mb, nm, C, ldc, c_f32, 0.f);
  }
}

static di_status mx_launch(int rows, dim3 grid, cudaStream_t s, const bf16 *A, int lda, const int32_t *a_rows,
                           di_cuk_mxfp4w w, int N, int K, const int32_t *off, const int32_t *tiles,
                           const int32_t *n_tiles, int bm, int M, void *C, int ldc, int c_f32) {
  if (K % 32 || lda % 8 || w.ldq % 16 || w.lds < K / 32 || ((uintptr_t)A & 15) || ((uintptr_t)w.q & 15) || grid.y > 65535)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: mxfp4 gemv K %d lda %d ldq %d lds %d (K %% 32, aligned rows)", K, lda,
                        w.ldq, w.lds);
  const int mr = rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8;
  switch (mr) {
#define MX_CASE(m) \
  case m: DI_CU(di_launch(mxfp4_gemv_kernel<m>, grid, MX_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off, tiles, n_tiles, bm, M, C, ldc, c_f32)); break;
    MX_CASE(1) MX_CASE(2) MX_CASE(4) MX_CASE(8)
#undef MX_CASE
  }
  DI_CU_LAUNCH("mxfp4_gemv");
  return DI_OK;
}

extern "C" di_status di_cuk_mxfp4_gemv(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_mxfp4w w, void *Y,
                                       int ldy, int y_f32, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  const int bm = M < 8 ? M : 8;
  const dim3 grid((N + MX_WARPS * MX_NR - 1) / (MX_WARPS * MX_NR), (M + bm - 1) / bm);
  return mx_launch(bm, grid, s, (const bf16 *)X, ldx, NULL, w, N, K, NULL, NULL, NULL, bm, M, Y, ldy, y_f32);
}

extern "C" di_status di_cuk_mxfp4_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_mxfp4w w, int N,
                                               int K, const int32_t *expert_off, const int32_t *tiles,
                                               const int32_t *n_tiles, int max_tiles, int bm, int max_rows, void *C,
                                               int ldc, int c_f32, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  const dim3 grid((N + MX_WARPS * MX_NR - 1) / (MX_WARPS * MX_NR), max_tiles);
  return mx_launch(max_rows < bm ? max_rows : bm, grid, s, (const bf16 *)A, lda, a_rows, w, N, K, expert_off, tiles,
                   n_tiles, bm, 0, C, ldc, c_f32);
}
