/* Skinny GEMM with W stored [K][N] (row-major, rows ldw apart) for decode-sized M: Y = X W, one CTA of
 * 256 threads per KN_COLS output columns. This is MLA's query absorption q_lat[h] = q_nope[h] . W_UK[h]
 * (K = 128, N = 512 per head), which at small M would otherwise be a cuBLAS batched call outside the
 * PDL chain. Each thread owns 8 consecutive columns (one 16-byte load per W row) and every KN_KG-th
 * row, and the KN_KG partial sums of a column are added in shared memory in a fixed order. The tile is
 * a device function so that gemm.cu's batched kernel and k_mla_prep.cu's fused prep + absorption
 * kernel run the same code (their results are equal).
 * Below it, the pieces the warp-per-row GEMVs share (gemm.cu's bf16 skinny kernel, k_fp8_gemv.cu,
 * k_mxfp4_gemv.cu, k_fp8_grouped_gemv.cu): a pass's activation row pointers, 16 bf16 widened to floats, and
 * the warp reduction (gv_warp_reduce) + store of the NR x MR accumulators. */
#ifndef DI_K_SKINNY_KN_CUH
#define DI_K_SKINNY_KN_CUH
#include "cuda_common.cuh"

#define KN_COLS 128
#define KN_KG 16
#define KN_THREADS 256

/* Before the PDL wait: this thread's share of the weight tile into L2. */
static __device__ __forceinline__ void kn_prefetch(const bf16 *W, int ldw, int N, int K, int bx) {
  const int cg = threadIdx.x % (KN_COLS / 8), kg = threadIdx.x / (KN_COLS / 8);
  const int n = bx * KN_COLS + cg * 8;
  if (n < N && (cg & 7) == 0)
    for (int k = kg; k < K; k += KN_KG) di_prefetch_l2(W + (int64_t)k * ldw + n);
}

/* Columns [bx * KN_COLS, +KN_COLS) of Y[M][N] = X[M][K] . W[K][N]; all 256 threads of the CTA. */
template <int M>
static __device__ __forceinline__ void kn_tile(const bf16 *X, int ldx, const bf16 *W, int ldw, int N, int K, bf16 *Y,
                                               int ldy, int bx) {
  __shared__ float part[KN_KG][KN_COLS + 4];
  const int cg = threadIdx.x % (KN_COLS / 8), kg = threadIdx.x / (KN_COLS / 8);
  const int n = bx * KN_COLS + cg * 8;
  const bool live = n < N; /* N % 8 == 0 (checked by the callers) */
  float acc[M][8];
#pragma unroll
  for (int m = 0; m < M; m++)
#pragma unroll
    for (int j = 0; j < 8; j++) acc[m][j] = 0.f;
  if (live) {
    /* chunks of 8 rows per thread, all 8 loads issued before their FMAs (dn = 128: one chunk) */
    for (int k0 = kg; k0 < K; k0 += 8 * KN_KG) {
      uint4 wv[8];
      bf16 xs[8][M];
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int k = k0 + u * KN_KG;
        wv[u] = k < K ? di_ld_stream16(W + (int64_t)k * ldw + n) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int m = 0; m < M; m++) xs[u][m] = k < K ? X[(int64_t)m * ldx + k] : di_fb(0.f);
      }
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&wv[u];
#pragma unroll
        for (int m = 0; m < M; m++) {
          float xv = di_bf(xs[u][m]);
#pragma unroll
          for (int j = 0; j < 4; j++) {
            float2 c = __bfloat1622float2(wp[j]);
            acc[m][2 * j] = fmaf(xv, c.x, acc[m][2 * j]);
            acc[m][2 * j + 1] = fmaf(xv, c.y, acc[m][2 * j + 1]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; m++) {
#pragma unroll
    for (int j = 0; j < 8; j++) part[kg][cg * 8 + j] = acc[m][j];
    __syncthreads();
    if (threadIdx.x < KN_COLS) {
      const int c = threadIdx.x, nn = bx * KN_COLS + c;
      float v = 0.f;
#pragma unroll
      for (int g = 0; g < KN_KG; g++) v += part[g][c];
      if (nn < N) Y[(int64_t)m * ldy + nn] = di_fb(v);
    }
    __syncthreads();
  }
}

/* The conditions both callers check: decode-sized M and 16-byte aligned weight rows. */
static inline bool kn_ok(int M, int N, int ldw, int64_t sw, const void *W) {
  return M >= 1 && M <= 8 && N % 8 == 0 && ldw % 8 == 0 && sw % 8 == 0 && ((uintptr_t)W & 15) == 0;
}

/* The activation rows of a pass of MR rows from mb (nm of them live; the rest point at row mb, computed
 * and not stored), through the gather list a_rows when there is one (its entries divided by per: the V4
 * expert kernels' slot lists, per slots a token). Also k_grouped_gemm.cu's and the V4 kernels' (f32) walks. */
template <int MR, typename T>
static __device__ __forceinline__ void gv_act_rows(const T **xr, const T *A, int64_t lda, const int32_t *a_rows, int mb,
                                                   int nm, int per = 1) {
#pragma unroll
  for (int m = 0; m < MR; m++) {
    const int mm = mb + (m < nm ? m : 0);
    xr[m] = A + (int64_t)(a_rows ? a_rows[mm] / per : mm) * lda;
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

/* The warp sum of each of V values per lane (v[0 .. V), V a power of two), by the butterfly tree xor 16,
 * 8, 4, 2, 1 with each lane's own value first: the bits of `for each value: v += shfl_xor(v, o)`, whatever
 * V is (a row's sum does not depend on the rows beside it), but as a halving exchange: while more than one
 * value is left, a step sends half of them and keeps the other half (V - 1 shuffles in all for V <= 32,
 * instead of 5 V). On return, for V <= 32: v[0] is the sum of value lane >> (5 - log2 V) (every lane of a
 * group of 32 / V holds it); for V > 32: v[i] (i < V / 32) is the sum of value i + (V / 32) * lane. */
template <int V, int O>
static __device__ __forceinline__ void gv_halve(float *v, int lane) {
  if constexpr (O > 0) {
    if constexpr (V > 1) {
      constexpr int H = V / 2;
      const bool upper = (lane & O) != 0;
#pragma unroll
      for (int i = 0; i < H; i++) {
        const float send = upper ? v[i] : v[i + H], keep = upper ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      gv_halve<H, O / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
      gv_halve<1, O / 2>(v, lane);
    }
  }
}
/* The NR x MR accumulators of a warp-per-NR-rows GEMV pass (value r * MR + m) summed across the warp as
 * above: gv_halve on acc viewed flat. */
template <int NR, int MR>
static __device__ __forceinline__ void gv_warp_reduce(float (*acc)[MR], int lane) {
  static_assert(((NR * MR) & (NR * MR - 1)) == 0, "gv_warp_reduce: NR * MR a power of two");
  gv_halve<NR * MR, 16>(&acc[0][0], lane);
}

/* The tail of a warp-per-NR-rows GEMV pass: each lane's acc[r][m] summed across the warp (gv_halve's tree,
 * one value at a time: the same order whatever the other rows), then lane r * MR + m stores output column
 * n0 + r of row mb + m (bf16, or f32 with y += the sum when beta != 0) where it exists. The lane's value is
 * picked with constant indices so that acc stays in registers. (gv_warp_reduce would give the same bits in
 * fewer shuffles; these kernels keep the one-value form, whose register use and speed are measured.) */
template <int NR, int MR>
static __device__ __forceinline__ void gv_reduce_store(float (*acc)[MR], int lane, int n0, int N, int mb, int nm,
                                                       void *C, int ldc, int c_f32, float beta) {
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int m = 0; m < MR; m++) gv_halve<1, 16>(&acc[r][m], lane);
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
