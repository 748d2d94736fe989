/* Block-FP8 skinny product on the tensor cores (W8A16): Y[M][N] = X . dequant(W)^T for decode-sized M
 * (1..64 rows a pass), each FP8 weight byte read once per pass and widened to bf16 in registers, the
 * product on mma.sync m16n8k16 bf16 with fp32 accumulation. The CUDA-core GEMV (k_fp8_gemv.cu) spends
 * one FMA per weight per row and binds on issue above ~2 rows; here one mma covers 16 weight rows x 8
 * activation rows x 16 K, so the per-weight work (the E4M3 -> bf16 conversion) does not grow with M.
 *
 * Layout ("swap AB"): the weight rows are the mma's M side (A, 16 rows per CTA), the activation rows
 * its N side (B, 8 per n-tile, MT n-tiles a pass). A dot product does not care in which order its K
 * terms are summed, so the K index inside a 64-wide chunk is permuted to suit the loads: lane (g, t)
 * (g = lane / 4, t = lane % 4) loads 16 contiguous bytes of weight rows g and g + 8 and 16 contiguous
 * bf16 of its activation row, at K offset 16 t of the chunk, and word i of those 16 bytes is mma i's
 * fragment (its logical K 2t, 2t+1, 2t+8, 2t+9 are physical 16t + 4i + 0..3), for A and B alike.
 * Conversions are exact (every E4M3 value is a bf16), so the only rounding is the mma's fp32 sum.
 *
 * Block scales: each 128-wide K piece (one block of 128-wide blocks, block_cols a multiple of 128) is
 * summed into a fresh fp32 partial and promoted with its row's scale, acc = fma(part, scale, acc),
 * DeepGEMM's promotion. The 8 warps of a CTA take the pieces round-robin (split K) and their
 * accumulators are added in shared memory in warp order; nothing in a row's arithmetic depends on the
 * other rows, so the result is batch-invariant (the same bits at any M, in any n-tile slot).
 * Weights past N are clamped copies (not stored); K past the end is zero on both sides.
 *
 * glu: W is [gate; up] (N = 2 I rows, gate rows then up rows, as the FP8 upload lays them out) and the
 * CTA's 16 mma rows are gate rows j0 .. j0+7 and the up rows of the same j, so one thread holds both
 * halves and writes C[m][j] = silu(gate) * up (bf16, I columns): the silu_mul kernel and the [T][2I]
 * round trip of the unfused form are gone (the product is rounded once, not gate and up first). */
#include "k_fp8_common.cuh"
#include "util/switches.h"

#define FT_WARPS 8   /* warps per CTA, all on the CTA's 16 weight rows, splitting K by pieces */
#define FT_ROWS 16   /* weight rows (output columns) per CTA: the mma's M */
#define FT_PIECE 128 /* K per piece: one block scale per row */
#define FT_MAX_MT 8  /* n-tiles of 8 activation rows per pass: up to 64 rows */

/* 4 E4M3 bytes to two bf16x2: bytes 0, 1 into lo, bytes 2, 3 into hi (exact). */
static __device__ __forceinline__ void fp8x4_to_bf16x4(uint32_t v, uint32_t &lo, uint32_t &hi) {
  __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
  __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
  __nv_bfloat162 x = __float22bfloat162_rn(__half22float2(*(__half2 *)&a));
  __nv_bfloat162 y = __float22bfloat162_rn(__half22float2(*(__half2 *)&b));
  lo = *(uint32_t *)&x;
  hi = *(uint32_t *)&y;
}

/* This lane's 16 bytes of rows a and b for the two 64-wide chunks of piece p (zeros past K). */
static __device__ __forceinline__ void ft_load(uint4 *r, const uint8_t *wa, const uint8_t *wb, int K, int p, int t) {
#pragma unroll
  for (int c = 0; c < 2; c++) {
    const int k = p * FT_PIECE + c * 64 + t * 16;
    const bool in = k < K;
    r[c] = in ? di_ld_stream16(wa + k) : make_uint4(0, 0, 0, 0);
    r[2 + c] = in ? di_ld_stream16(wb + k) : make_uint4(0, 0, 0, 0);
  }
}

/* Piece p (K [128 p, 128 p + 128)) of this lane's rows: its two 64-wide chunks on the tensor cores into a
 * fresh partial, promoted into acc with the rows' block scales. */
template <int MT>
static __device__ __forceinline__ void ft_piece(float (*acc)[4], const uint4 *cur, const bf16 *const *xr,
                                                const float *sa, const float *sb, int ppb, int K, int p, int t) {
  float part[MT][4];
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int q = 0; q < 4; q++) part[j][q] = 0.f;
#pragma unroll
  for (int c = 0; c < 2; c++) {
    const int k = p * FT_PIECE + c * 64 + t * 16;
    const bool in = k < K;
    uint32_t af[4][4];
    const uint32_t *ra = (const uint32_t *)&cur[c], *rb = (const uint32_t *)&cur[2 + c];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      fp8x4_to_bf16x4(ra[i], af[i][0], af[i][2]);
      fp8x4_to_bf16x4(rb[i], af[i][1], af[i][3]);
    }
#pragma unroll
    for (int j = 0; j < MT; j++) {
      uint4 x[2];
      x[0] = in ? __ldg((const uint4 *)(xr[j] + k)) : make_uint4(0, 0, 0, 0);
      x[1] = in ? __ldg((const uint4 *)(xr[j] + k) + 1) : make_uint4(0, 0, 0, 0);
      const uint32_t *xb = (const uint32_t *)x;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const uint32_t b[2] = {xb[2 * i], xb[2 * i + 1]};
        di_mma16816(part[j], af[i], b);
      }
    }
  }
  const float s_a = __ldg(sa + p / ppb), s_b = __ldg(sb + p / ppb);
#pragma unroll
  for (int j = 0; j < MT; j++) {
    acc[j][0] = fmaf(part[j][0], s_a, acc[j][0]);
    acc[j][1] = fmaf(part[j][1], s_a, acc[j][1]);
    acc[j][2] = fmaf(part[j][2], s_b, acc[j][2]);
    acc[j][3] = fmaf(part[j][3], s_b, acc[j][3]);
  }
}

/* grid (ceil(N / 16), tiles); 8 warps. Dense: tiles == NULL, tile y is rows [y * bm, +bm) of M. Rows of
 * a tile in passes of MT * 8. */
template <int MT, int RING>
static __global__ void __launch_bounds__(FT_WARPS * 32)
fp8_tc_gemv_kernel(const bf16 *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K, const int32_t *off,
                   const int32_t *tiles, const int32_t *n_tiles, int bm, int M, void *C, int ldc, int c_f32,
                   float beta, int glu) {
  __shared__ float red[FT_WARPS][FT_ROWS][MT * 8 + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int half = N / 2, n0 = glu ? blockIdx.x * (FT_ROWS / 2) : blockIdx.x * FT_ROWS;
  /* the weight row of mma row r (0..15) */
#define FT_ROW(r) (glu ? ((r) < 8 ? min(n0 + (r), half - 1) : half + min(n0 + (r) - 8, half - 1)) : min(n0 + (r), N - 1))
  if (!tiles) { /* dense: the CTA's weight rows into L2 while the previous kernel finishes */
    const int lines = (K + 127) / 128;
    for (int i = threadIdx.x; i < FT_ROWS * lines; i += FT_WARPS * 32) {
      const int r = i % FT_ROWS;
      di_prefetch_l2(w.q + (int64_t)FT_ROW(r) * w.ldq + (i / FT_ROWS) * 128);
    }
  }
  DI_PDL_ENTRY();
  if (tiles && (int)blockIdx.y >= *n_tiles) return;
  const fp8_rows tr = fp8_tile_rows(off, tiles, bm, M);
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  const uint8_t *wq = w.q + (int64_t)tr.e * N * w.ldq;
  const float *ws = w.scale + (int64_t)tr.e * sblocks * w.scale_cols;
  const int na = FT_ROW(g), nb = FT_ROW(g + 8);
#undef FT_ROW
  const uint8_t *wa = wq + (int64_t)na * w.ldq, *wb = wq + (int64_t)nb * w.ldq;
  const float *sa = ws + (int64_t)(na / w.block_rows) * w.scale_cols;
  const float *sb = ws + (int64_t)(nb / w.block_rows) * w.scale_cols;
  const int npieces = (K + FT_PIECE - 1) / FT_PIECE, ppb = w.block_cols / FT_PIECE;
  for (int mb = tr.m0; mb < tr.mend; mb += MT * 8) {
    const int nm = min(MT * 8, tr.mend - mb);
    const bf16 *xr[MT]; /* n-tile j: activation row j * 8 + g (past nm: row mb, not stored) */
#pragma unroll
    for (int j = 0; j < MT; j++) {
      const int mm = j * 8 + g, row = mb + (mm < nm ? mm : 0);
      xr[j] = A + (int64_t)(a_rows ? a_rows[row] : row) * lda;
    }
    float acc[MT][4];
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) acc[j][q] = 0.f;
    /* RING pieces' loads in flight per warp (named buffers: no dynamic register indexing); pieces are
     * summed in the order p, p + 8, p + 16, ... whatever the ring (the same bits for RING 2 and 3) */
    uint4 b0[4], b1[4], b2[4];
    constexpr int S = FT_WARPS;
    if constexpr (RING == 2) {
      if (warp < npieces) ft_load(b0, wa, wb, K, warp, t);
      for (int p = warp; p < npieces; p += 2 * S) {
        if (p + S < npieces) ft_load(b1, wa, wb, K, p + S, t);
        ft_piece<MT>(acc, b0, xr, sa, sb, ppb, K, p, t);
        if (p + S >= npieces) break;
        if (p + 2 * S < npieces) ft_load(b0, wa, wb, K, p + 2 * S, t);
        ft_piece<MT>(acc, b1, xr, sa, sb, ppb, K, p + S, t);
      }
    } else {
    if (warp < npieces) ft_load(b0, wa, wb, K, warp, t);
    if (warp + S < npieces) ft_load(b1, wa, wb, K, warp + S, t);
    for (int p = warp; p < npieces; p += 3 * S) {
      if (p + 2 * S < npieces) ft_load(b2, wa, wb, K, p + 2 * S, t);
      ft_piece<MT>(acc, b0, xr, sa, sb, ppb, K, p, t);
      if (p + S >= npieces) break;
      if (p + 3 * S < npieces) ft_load(b0, wa, wb, K, p + 3 * S, t);
      ft_piece<MT>(acc, b1, xr, sa, sb, ppb, K, p + S, t);
      if (p + 2 * S >= npieces) break;
      if (p + 4 * S < npieces) ft_load(b1, wa, wb, K, p + 4 * S, t);
      ft_piece<MT>(acc, b2, xr, sa, sb, ppb, K, p + 2 * S, t);
    }
    }
#pragma unroll
    for (int j = 0; j < MT; j++) {
      red[warp][g][j * 8 + 2 * t] = acc[j][0];
      red[warp][g][j * 8 + 2 * t + 1] = acc[j][1];
      red[warp][g + 8][j * 8 + 2 * t] = acc[j][2];
      red[warp][g + 8][j * 8 + 2 * t + 1] = acc[j][3];
    }
    __syncthreads();
    if (glu) {
      for (int i = threadIdx.x; i < (FT_ROWS / 2) * MT * 8; i += FT_WARPS * 32) {
        const int r = i % (FT_ROWS / 2), m = i / (FT_ROWS / 2), n = n0 + r;
        float ga = 0.f, up = 0.f;
#pragma unroll
        for (int q = 0; q < FT_WARPS; q++) {
          ga += red[q][r][m];
          up += red[q][r + 8][m];
        }
        if (n < half && m < nm) ((bf16 *)C)[(int64_t)(mb + m) * ldc + n] = di_fb(ga / (1.f + __expf(-ga)) * up);
      }
    } else {
    for (int i = threadIdx.x; i < FT_ROWS * MT * 8; i += FT_WARPS * 32) {
      const int r = i % FT_ROWS, m = i / FT_ROWS, n = n0 + r;
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < FT_WARPS; q++) v += red[q][r][m];
      if (n < N && m < nm) {
        if (c_f32) {
          float *y = (float *)C + (int64_t)(mb + m) * ldc + n;
          *y = beta != 0.f ? v + beta * *y : v;
        } else {
          ((bf16 *)C)[(int64_t)(mb + m) * ldc + n] = di_fb(v);
        }
      }
    }
    }
    __syncthreads();
  }
}

static int ft_tiles_per_pass(int rows) { return rows <= 8 ? 1 : rows <= 16 ? 2 : rows <= 32 ? 4 : 8; }

static di_status ft_launch(int mt, dim3 grid, cudaStream_t s, const bf16 *A, int lda, const int32_t *a_rows,
                           di_cuk_fp8w w, int N, int K, const int32_t *off, const int32_t *tiles,
                           const int32_t *n_tiles, int bm, int M, void *C, int ldc, int c_f32, float beta,
                           int glu) {
  if (glu && (N % 2 || c_f32)) return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 tc gemv glu: N %d (even), bf16 out", N);
  grid.x = glu ? (N / 2 + FT_ROWS / 2 - 1) / (FT_ROWS / 2) : (N + FT_ROWS - 1) / FT_ROWS;
  /* two pieces in flight per warp (DEEPINFER_CUDA_FP8_TC_RING=3: three, 3-6% slower on the H200);
   * 64-row passes keep two (registers) */
  const int ring3 = mt < 8 && di_switch_int(DI_SW_CUDA_FP8_TC_RING, 2) == 3;
  switch (mt * 2 + ring3) {
#define FT_CASE(m, r)                                                                                                 \
  case m * 2 + (r == 3):                                                                                              \
    DI_CU(di_launch(fp8_tc_gemv_kernel<m, r>, grid, FT_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off, tiles, n_tiles, \
                    bm, M, C, ldc, c_f32, beta, glu));                                                                \
    break;
    FT_CASE(1, 2) FT_CASE(2, 2) FT_CASE(4, 2) FT_CASE(8, 2) FT_CASE(1, 3) FT_CASE(2, 3) FT_CASE(4, 3)
#undef FT_CASE
    default: return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 tc gemv with %d n-tiles per pass", mt);
  }
  DI_CU_LAUNCH("fp8_tc_gemv");
  return DI_OK;
}

extern "C" int di_cuk_fp8_tc_ok(int K, const void *X, int ldx, di_cuk_fp8w w) {
  return K % 16 == 0 && ldx % 8 == 0 && w.ldq % 16 == 0 && w.block_cols % FT_PIECE == 0 && w.block_rows > 0 &&
         w.scale_cols >= (K + w.block_cols - 1) / w.block_cols && ((uintptr_t)X & 15) == 0 &&
         ((uintptr_t)w.q & 15) == 0;
}

static di_status ft_dense(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y, int ldy, int y_f32,
                          float beta, int glu, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  if (!di_cuk_fp8_tc_ok(K, X, ldx, w))
    return di_error_set(DI_ERR_INVALID_ARG,
                        "cuda: fp8 tc gemv K %d ldx %d block %d x %d (K %% 16, block_cols %% 128, aligned rows)", K,
                        ldx, w.block_rows, w.block_cols);
  const int bm = M < FT_MAX_MT * 8 ? M : FT_MAX_MT * 8;
  const dim3 grid((N + FT_ROWS - 1) / FT_ROWS, (M + bm - 1) / bm);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fp8 tc gemv of %d rows", M);
  return ft_launch(ft_tiles_per_pass(bm), grid, s, (const bf16 *)X, ldx, NULL, w, N, K, NULL, NULL, NULL, bm, M, Y,
                   ldy, y_f32, beta, glu);
}

extern "C" di_status di_cuk_fp8_tc_gemv(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y,
                                        int ldy, int y_f32, float beta, di_cu_stream s) {
  return ft_dense(M, N, K, X, ldx, w, Y, ldy, y_f32, beta, 0, s);
}

extern "C" di_status di_cuk_fp8_tc_gemv_glu(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w,
                                            uint16_t *act, int ld_act, di_cu_stream s) {
  return ft_dense(M, N, K, X, ldx, w, act, ld_act, 0, 0.f, 1, s);
}

extern "C" di_status di_cuk_fp8_tc_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w,
                                                int N, int K, const int32_t *expert_off, const int32_t *tiles,
                                                const int32_t *n_tiles, int max_tiles, int bm, int max_rows, void *C,
                                                int ldc, int c_f32, int glu, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!di_cuk_fp8_tc_ok(K, A, lda, w) || max_tiles > 65535)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 tc grouped gemv K %d lda %d block %d x %d tiles %d", K, lda,
                        w.block_rows, w.block_cols, max_tiles);
  const dim3 grid((N + FT_ROWS - 1) / FT_ROWS, max_tiles);
  return ft_launch(ft_tiles_per_pass(max_rows < bm ? max_rows : bm), grid, s, (const bf16 *)A, lda, a_rows,
                   w, N, K, expert_off, tiles, n_tiles, bm, 0, C, ldc, c_f32, 0.f, glu);
}
