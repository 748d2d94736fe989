/* Block-FP8 decode GEMV (W8A16): Y = X . dequant(W)^T for a few rows, reading each FP8 weight byte
 * once and dequantizing it in registers. One warp per FG_NR output columns (weight rows); each lane
 * reads 16 weight bytes of a row per step of 512 columns, FG_U steps of each row in flight (chunked
 * and software-pipelined as gemm.cu's bf16 skinny kernel: chunk c+1 issued before chunk c is used).
 * The 16 values of a lane's step share one block scale when block_cols % 16 == 0: their products
 * with the bf16 activations are summed in fp32 and then scaled, acc = fma(sum, scale, acc). The
 * lanes' sums are reduced across the warp in a fixed order, so a row's result depends only on that
 * row (batch-invariant at any M). Weights whose block_cols is not a multiple of 16, or unaligned
 * rows, take fp8_gemv_any_kernel (one warp per output element, scale per element). */
#include "k_fp8_common.cuh"

#define FG_WARPS 4
#define FG_NR 2
#define FG_STEP 512 /* columns per warp step: 32 lanes x 16 bytes */

template <int NR, int U>
static __device__ __forceinline__ void fg_load(uint4 (*w)[U], const uint8_t *const *wr, int K, int k0, int lane) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int k = k0 + u * FG_STEP + lane * 16;
#pragma unroll
    for (int r = 0; r < NR; r++) w[r][u] = k < K ? di_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
  }
}

template <int MR, int NR, int U>
static __device__ __forceinline__ void fg_fma(float (*acc)[MR], const uint4 (*w)[U], const bf16 *const *xr,
                                              const float *const *sr, int bc, int K, int k0, int lane) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int k = k0 + u * FG_STEP + lane * 16;
    if (k >= K) break;
    float wf[NR][16], sc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
      fp8x4_to_f32(w[r][u].x, wf[r]);
      fp8x4_to_f32(w[r][u].y, wf[r] + 4);
      fp8x4_to_f32(w[r][u].z, wf[r] + 8);
      fp8x4_to_f32(w[r][u].w, wf[r] + 12);
      sc[r] = __ldg(sr[r] + k / bc);
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
      float xf[16];
      bf16x16_to_f32(xr[m] + k, xf);
#pragma unroll
      for (int r = 0; r < NR; r++) {
        float p = 0.f;
#pragma unroll
        for (int j = 0; j < 16; j++) p = fmaf(xf[j], wf[r][j], p);
        acc[r][m] = fmaf(p, sc[r], acc[r][m]);
      }
    }
  }
}

/* grid (N / (FG_WARPS * FG_NR), tiles); rows of a tile in passes of MR. Dense: tiles == NULL, tile y
 * is rows [y * bm, +bm) of M. */
template <int MR>
static __global__ void __launch_bounds__(FG_WARPS * 32)
fp8_gemv_kernel(const bf16 *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K, const int32_t *off,
                const int32_t *tiles, const int32_t *n_tiles, int bm, int M, void *C, int ldc, int c_f32, float beta) {
  constexpr int NR = FG_NR, U = MR <= 4 ? 4 : 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = (blockIdx.x * FG_WARPS + warp) * NR;
  if (!tiles && n0 < N) /* dense: this warp's weight rows into L2 while the previous kernel finishes */
    for (int r = 0; r < NR && n0 + r < N; r++)
      for (int k = lane * 128; k < K; k += 32 * 128) di_prefetch_l2(w.q + (int64_t)(n0 + r) * w.ldq + k);
  DI_PDL_ENTRY();
  if (tiles && (int)blockIdx.y >= *n_tiles) return;
  if (n0 >= N) return;
  const fp8_rows t = fp8_tile_rows(off, tiles, bm, M);
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  const uint8_t *wq = w.q + (int64_t)t.e * N * w.ldq;
  const float *ws = w.scale + (int64_t)t.e * sblocks * w.scale_cols;
  const uint8_t *wr[NR];
  const float *sr[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) {
    const int n = n0 + r < N ? n0 + r : n0; /* past N: a copy, not stored */
    wr[r] = wq + (int64_t)n * w.ldq;
    sr[r] = ws + (int64_t)(n / w.block_rows) * w.scale_cols;
  }
  constexpr int CHUNK = U * FG_STEP;
  for (int mb = t.m0; mb < t.mend; mb += MR) {
    const int nm = min(MR, t.mend - mb);
    const bf16 *xr[MR];
    gv_act_rows<MR>(xr, A, lda, a_rows, mb, nm);
    float acc[NR][MR];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
      for (int m = 0; m < MR; m++) acc[r][m] = 0.f;
    uint4 cur[NR][U], nxt[NR][U];
    fg_load<NR, U>(cur, wr, K, 0, lane);
    for (int k0 = 0; k0 < K; k0 += CHUNK) {
      const bool more = k0 + CHUNK < K;
      if (more) fg_load<NR, U>(nxt, wr, K, k0 + CHUNK, lane);
      fg_fma<MR, NR, U>(acc, cur, xr, sr, w.block_cols, K, k0, lane);
      if (more) {
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
          for (int u = 0; u < U; u++) cur[r][u] = nxt[r][u];
      }
    }
    gv_reduce_store<NR, MR>(acc, lane, n0, N, mb, nm, C, ldc, c_f32, beta);
  }
}

/* Any shape and block shape: one warp per output element (grid (ceil(N / 8), M), 256 threads), lanes
 * strided over K, the scale looked up per element; a fixed reduction (batch-invariant too). */
static __global__ void __launch_bounds__(256)
fp8_gemv_any_kernel(const bf16 *X, int ldx, di_cuk_fp8w w, int N, int K, void *Y, int ldy, int y_f32, float beta) {
  DI_PDL_ENTRY();
  const int lane = threadIdx.x & 31, n = blockIdx.x * 8 + (threadIdx.x >> 5), m = blockIdx.y;
  if (n >= N) return;
  const bf16 *x = X + (int64_t)m * ldx;
  const uint8_t *q = w.q + (int64_t)n * w.ldq;
  const float *sr = w.scale + (int64_t)(n / w.block_rows) * w.scale_cols;
  float acc = 0.f;
  for (int k = lane; k < K; k += 32) acc = fmaf(di_bf(x[k]), fp8_to_f32(q[k]) * __ldg(sr + k / w.block_cols), acc);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane) return;
  if (y_f32) {
    float *y = (float *)Y + (int64_t)m * ldy + n;
    *y = beta != 0.f ? acc + beta * *y : acc;
  } else {
    ((bf16 *)Y)[(int64_t)m * ldy + n] = di_fb(acc);
  }
}

static bool fg_vector_ok(int K, const void *X, int ldx, di_cuk_fp8w w) {
  return K % 16 == 0 && ldx % 8 == 0 && w.ldq % 16 == 0 && w.block_cols % 16 == 0 && ((uintptr_t)X & 15) == 0 &&
         ((uintptr_t)w.q & 15) == 0;
}

static di_status fg_launch(int mr, dim3 grid, cudaStream_t s, const bf16 *A, int lda, const int32_t *a_rows,
                           di_cuk_fp8w w, int N, int K, const int32_t *off, const int32_t *tiles, const int32_t *n_tiles,
                           int bm, int M, void *C, int ldc, int c_f32, float beta) {
  switch (mr) {
#define FG_CASE(m) \
  case m: DI_CU(di_launch(fp8_gemv_kernel<m>, grid, FG_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off, tiles, n_tiles, bm, M, C, ldc, c_f32, beta)); break;
    FG_CASE(1) FG_CASE(2) FG_CASE(4) FG_CASE(8) FG_CASE(16)
#undef FG_CASE
    default: return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gemv with %d rows per pass", mr);
  }
  DI_CU_LAUNCH("fp8_gemv");
  return DI_OK;
}

static int fg_rows_per_pass(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }

extern "C" di_status di_cuk_fp8_gemv(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y, int ldy,
                                     int y_f32, float beta, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  if (w.block_rows <= 0 || w.block_cols <= 0 || w.scale_cols < (K + w.block_cols - 1) / w.block_cols)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gemv: block %d x %d with %d scale columns for K %d",
                        w.block_rows, w.block_cols, w.scale_cols, K);
  if (!fg_vector_ok(K, X, ldx, w)) {
    if (M > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fp8 gemv of %d rows", M);
    DI_CU(di_launch(fp8_gemv_any_kernel, dim3((N + 7) / 8, M), 256, 0, s, (const bf16 *)X, ldx, w, N, K, Y, ldy,
                    y_f32, beta));
    DI_CU_LAUNCH("fp8_gemv_any");
    return DI_OK;
  }
  const int bm = M < 16 ? M : 16;
  const dim3 grid((N + FG_WARPS * FG_NR - 1) / (FG_WARPS * FG_NR), (M + bm - 1) / bm);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fp8 gemv of %d rows", M);
  return fg_launch(fg_rows_per_pass(bm), grid, s, (const bf16 *)X, ldx, NULL, w, N, K, NULL, NULL, NULL, bm, M, Y, ldy,
                   y_f32, beta);
}

extern "C" di_status di_cuk_fp8_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N,
                                             int K, const int32_t *expert_off, const int32_t *tiles,
                                             const int32_t *n_tiles, int max_tiles, int bm, int max_rows, void *C,
                                             int ldc, int c_f32, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!fg_vector_ok(K, A, lda, w) || max_tiles > 65535 || w.block_rows <= 0)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "cuda: fp8 grouped gemv K %d lda %d block %d x %d tiles %d (K %% 16, block_cols %% 16, aligned)",
                        K, lda, w.block_rows, w.block_cols, max_tiles);
  const dim3 grid((N + FG_WARPS * FG_NR - 1) / (FG_WARPS * FG_NR), max_tiles);
  return fg_launch(fg_rows_per_pass(max_rows < bm ? max_rows : bm), grid, s, (const bf16 *)A, lda, a_rows, w, N, K, expert_off, tiles, n_tiles, bm,
                   0, C, ldc, c_f32, 0.f);
}
