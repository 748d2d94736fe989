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

/* 16 activations of row x at column k as floats: bf16 X, or (NORM) the f32 residual row normed on the
 * way in, bf16(h * inv * w) as di_cuk_rmsnorm rounds it, or (F32X) an f32 row rounded to bf16 on the way in
 * (the values a bf16 copy of it would hold: no rounding launch before the product). */
template <bool NORM, bool F32X = false>
static __device__ __forceinline__ void fg_x16(const void *x, const float *nw, float inv, int k, float *xf) {
  if constexpr (F32X) {
    const float4 *h = (const float4 *)((const float *)x + k);
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const float4 hv = __ldg(h + q);
      xf[4 * q] = di_bf(di_fb(hv.x)); xf[4 * q + 1] = di_bf(di_fb(hv.y));
      xf[4 * q + 2] = di_bf(di_fb(hv.z)); xf[4 * q + 3] = di_bf(di_fb(hv.w));
    }
  } else if constexpr (NORM) {
    const float4 *h = (const float4 *)((const float *)x + k), *g = (const float4 *)(nw + k);
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const float4 hv = __ldg(h + q), gv = __ldg(g + q);
      xf[4 * q] = di_bf(di_fb(hv.x * inv * gv.x)); xf[4 * q + 1] = di_bf(di_fb(hv.y * inv * gv.y));
      xf[4 * q + 2] = di_bf(di_fb(hv.z * inv * gv.z)); xf[4 * q + 3] = di_bf(di_fb(hv.w * inv * gv.w));
    }
  } else {
    bf16x16_to_f32((const bf16 *)x + k, xf);
  }
}

template <int MR, int NR, int U, bool NORM, bool F32X = false>
static __device__ __forceinline__ void fg_fma(float (*acc)[MR], const uint4 (*w)[U], const void *const *xr,
                                              const float *const *sr, int bc, int K, int k0, int lane,
                                              const float *nw, const float *inv) {
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
      fg_x16<NORM, F32X>(xr[m], nw, NORM ? inv[m] : 0.f, k, xf);
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

/* The chunked, software-pipelined product of NR weight rows wr with MR activation rows xr over K
 * (chunk c + 1's loads issued before chunk c's FMAs), into acc (zeroed here): one lane's share. */
template <int MR, int NR, int U, bool NORM, bool F32X = false>
static __device__ __forceinline__ void fg_rows(float (*acc)[MR], const uint8_t *const *wr, const float *const *sr,
                                               const void *const *xr, int bc, int K, int lane, const float *nw,
                                               const float *inv) {
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int m = 0; m < MR; m++) acc[r][m] = 0.f;
  constexpr int CHUNK = U * FG_STEP;
  uint4 cur[NR][U], nxt[NR][U];
  fg_load<NR, U>(cur, wr, K, 0, lane);
  for (int k0 = 0; k0 < K; k0 += CHUNK) {
    const bool more = k0 + CHUNK < K;
    if (more) fg_load<NR, U>(nxt, wr, K, k0 + CHUNK, lane);
    fg_fma<MR, NR, U, NORM, F32X>(acc, cur, xr, sr, bc, K, k0, lane, nw, inv);
    if (more) {
#pragma unroll
      for (int r = 0; r < NR; r++)
#pragma unroll
        for (int u = 0; u < U; u++) cur[r][u] = nxt[r][u];
    }
  }
}

/* NORM: the 1 / rms of each of the MR rows of the f32 residual X (K columns), reduced by the CTA's warps
 * over quarters of the row in warp order (the same value in every CTA). All threads of the CTA. */
template <int MR>
static __device__ __forceinline__ void fg_row_inv(const float *X, int ldx, int mb, int nm, int K, float eps,
                                                  float *inv) {
  __shared__ float part[FG_WARPS][MR];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = K / 4 / FG_WARPS, i0 = warp * q, i1 = warp == FG_WARPS - 1 ? K / 4 : i0 + q;
#pragma unroll
  for (int m = 0; m < MR; m++) {
    const float4 *xr = (const float4 *)(X + (int64_t)(mb + (m < nm ? m : 0)) * ldx);
    float ss = 0.f;
    for (int i = i0 + lane; i < i1; i += 32) {
      const float4 v = __ldg(xr + i);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) part[warp][m] = ss;
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < MR; m++) {
    float ss = 0.f;
#pragma unroll
    for (int w = 0; w < FG_WARPS; w++) ss += part[w][m];
    inv[m] = rsqrtf(ss / K + eps);
  }
  __syncthreads(); /* part is reused by the next pass */
}

/* grid (N / (FG_WARPS * FG_NR), tiles); rows of a tile in passes of MR. Dense: tiles == NULL, tile y
 * is rows [y * bm, +bm) of M. NORM (dense only): A is the f32 residual stream, normed on the way in
 * with weights nw (the decode layer's attention norm inside its q/kv product). GLU: W is [gate; up]
 * (N = 2 I rows), a warp's two rows are gate row j and up row j, and it stores silu(gate) * up as bf16
 * at column j of C (I columns; the grid covers I / FG_WARPS): no silu_mul kernel, no [T][2I] round trip. */
template <int MR, bool NORM, bool GLU, int NRT = FG_NR, int UT = (MR <= 4 ? 4 : 2), bool F32X = false>
static __global__ void __launch_bounds__(FG_WARPS * 32)
fp8_gemv_kernel(const void *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K, const int32_t *off,
                const int32_t *tiles, const int32_t *n_tiles, int bm, int M, void *C, int ldc, int c_f32, float beta,
                const float *nw, float eps) {
  constexpr int NR = NRT, U = UT;
  static_assert(!GLU || NR == 2, "fp8 gemv: the GLU form takes a gate and an up row a warp");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = N / 2;
  const int n0 = GLU ? blockIdx.x * FG_WARPS + warp : (blockIdx.x * FG_WARPS + warp) * NR;
  const bool live = GLU ? n0 < half : n0 < N;
  if (!tiles && live) /* dense: this warp's weight rows into L2 while the previous kernel finishes */
    for (int r = 0; r < NR && (GLU || n0 + r < N); r++)
      for (int k = lane * 128; k < K; k += 32 * 128)
        di_prefetch_l2(w.q + (int64_t)(GLU ? n0 + r * half : n0 + r) * w.ldq + k);
  DI_PDL_ENTRY();
  if (tiles && (int)blockIdx.y >= *n_tiles) return;
  if (!NORM && !live) return; /* NORM: every warp takes part in the row norms */
  const fp8_rows t = fp8_tile_rows(off, tiles, bm, M);
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  const uint8_t *wq = w.q + (int64_t)t.e * N * w.ldq;
  const float *ws = w.scale + (int64_t)t.e * sblocks * w.scale_cols;
  const uint8_t *wr[NR];
  const float *sr[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) {
    const int n = GLU ? (live ? n0 : 0) + r * half : n0 + r < N ? n0 + r : n0; /* past N: a copy, not stored */
    wr[r] = wq + (int64_t)n * w.ldq;
    sr[r] = ws + (int64_t)(n / w.block_rows) * w.scale_cols;
  }
  for (int mb = t.m0; mb < t.mend; mb += MR) {
    const int nm = min(MR, t.mend - mb);
    const void *xr[MR];
    float inv[MR];
    if constexpr (NORM) {
      fg_row_inv<MR>((const float *)A, lda, mb, nm, K, eps, inv);
#pragma unroll
      for (int m = 0; m < MR; m++) xr[m] = (const float *)A + (int64_t)(mb + (m < nm ? m : 0)) * lda;
      if (!live) continue;
    } else if constexpr (F32X) {
      gv_act_rows<MR>((const float **)xr, (const float *)A, lda, a_rows, mb, nm);
    } else {
      gv_act_rows<MR>((const bf16 **)xr, (const bf16 *)A, lda, a_rows, mb, nm);
    }
    float acc[NR][MR];
    fg_rows<MR, NR, U, NORM, F32X>(acc, wr, sr, xr, w.block_cols, K, lane, nw, inv);
    if constexpr (GLU) {
#pragma unroll
      for (int r = 0; r < NR; r++)
#pragma unroll
        for (int m = 0; m < MR; m++) {
          float v = acc[r][m];
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          acc[r][m] = v;
        }
      float g = 0.f, u = 0.f;
#pragma unroll
      for (int m = 0; m < MR; m++)
        if (m == lane) { g = acc[0][m]; u = acc[1][m]; }
      if (lane < nm) ((bf16 *)C)[(int64_t)(mb + lane) * ldc + n0] = di_fb(g / (1.f + __expf(-g)) * u);
    } else {
      gv_reduce_store<NR, MR>(acc, lane, n0, N, mb, nm, C, ldc, c_f32, beta);
    }
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

extern "C" int di_cuk_fp8_gemv_vec_ok(int K, const void *X, int ldx, di_cuk_fp8w w) {
  return fg_vector_ok(K, X, ldx, w) && w.block_rows > 0;
}

enum { FG_PLAIN, FG_NORM, FG_GLU };

static di_status fg_launch(int mode, int mr, dim3 grid, cudaStream_t s, const void *A, int lda, const int32_t *a_rows,
                           di_cuk_fp8w w, int N, int K, const int32_t *off, const int32_t *tiles, const int32_t *n_tiles,
                           int bm, int M, void *C, int ldc, int c_f32, float beta, const float *nw = NULL,
                           float eps = 0.f) {
  switch (mode * 32 + mr) {
#define FG_CASE(md, m, nrm, glu) \
  case md * 32 + m: DI_CU(di_launch(fp8_gemv_kernel<m, nrm, glu>, grid, FG_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off, tiles, n_tiles, bm, M, C, ldc, c_f32, beta, nw, eps)); break;
    FG_CASE(FG_PLAIN, 1, false, false) FG_CASE(FG_PLAIN, 2, false, false) FG_CASE(FG_PLAIN, 4, false, false)
    FG_CASE(FG_PLAIN, 8, false, false) FG_CASE(FG_PLAIN, 16, false, false)
    FG_CASE(FG_NORM, 1, true, false) FG_CASE(FG_NORM, 2, true, false) FG_CASE(FG_NORM, 4, true, false)
    FG_CASE(FG_GLU, 1, false, true) FG_CASE(FG_GLU, 2, false, true) FG_CASE(FG_GLU, 4, false, true)
    FG_CASE(FG_GLU, 8, false, true) FG_CASE(FG_GLU, 16, false, true)
#undef FG_CASE
    default: return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gemv (form %d) with %d rows per pass", mode, mr);
  }
  DI_CU_LAUNCH("fp8_gemv");
  return DI_OK;
}

static int fg_rows_per_pass(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }

static di_status fg_check_blocks(int K, di_cuk_fp8w w) {
  if (w.block_rows <= 0 || w.block_cols <= 0 || w.scale_cols < (K + w.block_cols - 1) / w.block_cols)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gemv: block %d x %d with %d scale columns for K %d",
                        w.block_rows, w.block_cols, w.scale_cols, K);
  return DI_OK;
}

/* One activation row (the plain and grouped forms at one row per pass), di_cuk_fp8_gemv1_form 1 / 2: the weight
 * rows a warp and the chunk of columns a lane step group covers follow K (every row's sum is the same whatever
 * they are: a lane's 16-column steps in order, then the same warp tree), so that a warp has more bytes in flight
 * at K <= 1,024 (4 rows of one chunk: wq_b's 1,024 columns were 2 KB a warp in 4,096 CTAs) and more warps share
 * a wide K (1 or 2 rows in 1 KB chunks: wo_b's 8,192 columns ran 1.3 waves of CTAs). 0: FG_NR rows, 4 steps. */
#define FG1_FORM_DEFAULT 1
static int g_fg1_form = FG1_FORM_DEFAULT; /* 1, 2: verified (the same bits) in session 14's request 1; 1 the default */
extern "C" void di_cuk_fp8_gemv1_form(int form) { g_fg1_form = form < 0 ? FG1_FORM_DEFAULT : form; }
static int fg1_rows(int K) { return K <= 1024 ? 4 : g_fg1_form == 2 ? 2 : 1; }
/* nr rows a warp (4, 2, 1: 2-step chunks; 0: FG_NR rows in 4-step chunks, form 0's shape); f32x: A is f32 */
template <bool F32X>
static di_status fg1_go(int nr, dim3 grid, cudaStream_t s, const void *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N,
                        int K, const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, int bm, int M, void *C, int ldc,
                        int c_f32, float beta) {
  const float *nw = NULL;
  if (nr == 4)
    DI_CU(di_launch(fp8_gemv_kernel<1, false, false, 4, 2, F32X>, grid, FG_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off, tiles,
                    n_tiles, bm, M, C, ldc, c_f32, beta, nw, 0.f));
  else if (nr == 2)
    DI_CU(di_launch(fp8_gemv_kernel<1, false, false, 2, 2, F32X>, grid, FG_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off, tiles,
                    n_tiles, bm, M, C, ldc, c_f32, beta, nw, 0.f));
  else if (nr == 1)
    DI_CU(di_launch(fp8_gemv_kernel<1, false, false, 1, 2, F32X>, grid, FG_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off, tiles,
                    n_tiles, bm, M, C, ldc, c_f32, beta, nw, 0.f));
  else
    DI_CU(di_launch(fp8_gemv_kernel<1, false, false, FG_NR, 4, F32X>, grid, FG_WARPS * 32, 0, s, A, lda, a_rows, w, N, K, off,
                    tiles, n_tiles, bm, M, C, ldc, c_f32, beta, nw, 0.f));
  return DI_OK;
}
static di_status fg1_launch(int nr, unsigned gy, cudaStream_t s, const void *A, int lda, const int32_t *a_rows, di_cuk_fp8w w,
                            int N, int K, const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, int bm, int M,
                            void *C, int ldc, int c_f32, float beta, bool f32x = false) {
  const int rows = nr ? nr : FG_NR;
  const dim3 grid((N + FG_WARPS * rows - 1) / (FG_WARPS * rows), gy);
  if (f32x) DI_TRY(fg1_go<true>(nr, grid, s, A, lda, a_rows, w, N, K, off, tiles, n_tiles, bm, M, C, ldc, c_f32, beta));
  else DI_TRY(fg1_go<false>(nr, grid, s, A, lda, a_rows, w, N, K, off, tiles, n_tiles, bm, M, C, ldc, c_f32, beta));
  DI_CU_LAUNCH("fp8_gemv1");
  return DI_OK;
}

/* One f32 activation row rounded to bf16 inside the product (the same bits as di_cuk_fp8_gemv / the grouped GEMV
 * over a bf16 copy of it, one rounding launch fewer): di_cuk_fp8_gemv1_f32x / di_cuk_fp8_grouped_gemv1_f32x. */
#define F32X_DEFAULT 0
static int g_f32x = F32X_DEFAULT; /* 1 not yet run on the device: off by default */
extern "C" void di_cuk_fp8_f32x(int on) { g_f32x = on < 0 ? F32X_DEFAULT : on; }
extern "C" int di_cuk_fp8_f32x_on(void) { return g_f32x; }
static int fg1_f32x_ok(int K, const float *x, di_cuk_fp8w w) {
  return K % 16 == 0 && w.ldq % 16 == 0 && w.block_cols % 16 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w.q & 15) == 0 &&
         w.block_rows > 0;
}
extern "C" int di_cuk_fp8_gemv1_f32x_ok(int K, const float *x, di_cuk_fp8w w) { return fg1_f32x_ok(K, x, w); }
extern "C" di_status di_cuk_fp8_gemv1_f32x(int N, int K, const float *x, di_cuk_fp8w w, float *y, di_cu_stream s) {
  if (N <= 0) return DI_OK;
  DI_TRY(fg_check_blocks(K, w));
  if (!fg1_f32x_ok(K, x, w)) return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gemv of an f32 row: K %d (K %% 16, aligned)", K);
  return fg1_launch(g_fg1_form ? fg1_rows(K) : 0, 1, s, x, K, NULL, w, N, K, NULL, NULL, NULL, 1, 1, y, N, 1, 0.f, true);
}


extern "C" di_status di_cuk_fp8_gemv(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y, int ldy,
                                     int y_f32, float beta, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  DI_TRY(fg_check_blocks(K, w));
  if (!fg_vector_ok(K, X, ldx, w)) {
    if (M > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fp8 gemv of %d rows", M);
    DI_CU(di_launch(fp8_gemv_any_kernel, dim3((N + 7) / 8, M), 256, 0, s, (const bf16 *)X, ldx, w, N, K, Y, ldy,
                    y_f32, beta));
    DI_CU_LAUNCH("fp8_gemv_any");
    return DI_OK;
  }
  const int bm = M < 16 ? M : 16;
  if (M == 1 && g_fg1_form) return fg1_launch(fg1_rows(K), 1, s, X, ldx, NULL, w, N, K, NULL, NULL, NULL, 1, 1, Y, ldy, y_f32, beta);
  const dim3 grid((N + FG_WARPS * FG_NR - 1) / (FG_WARPS * FG_NR), (M + bm - 1) / bm);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fp8 gemv of %d rows", M);
  return fg_launch(FG_PLAIN, fg_rows_per_pass(bm), grid, s, X, ldx, NULL, w, N, K, NULL, NULL, NULL, bm, M, Y, ldy,
                   y_f32, beta);
}

extern "C" int di_cuk_fp8_gemv_normed_ok(int K, const void *H, int ldh, const float *nw, di_cuk_fp8w w) {
  return K % 16 == 0 && ldh % 4 == 0 && w.ldq % 16 == 0 && w.block_cols % 16 == 0 && ((uintptr_t)H & 15) == 0 &&
         ((uintptr_t)nw & 15) == 0 && ((uintptr_t)w.q & 15) == 0 && w.block_rows > 0;
}

extern "C" di_status di_cuk_fp8_gemv_normed(int M, int N, int K, const float *H, int ldh, const float *nw, float eps,
                                            di_cuk_fp8w w, uint16_t *Y, int ldy, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  DI_TRY(fg_check_blocks(K, w));
  if (!di_cuk_fp8_gemv_normed_ok(K, H, ldh, nw, w))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: normed fp8 gemv K %d ldh %d block_cols %d (K %% 16, aligned)", K,
                        ldh, w.block_cols);
  const int bm = M < 4 ? M : 4; /* the norms are recomputed per pass: passes of up to 4 rows */
  const dim3 grid((N + FG_WARPS * FG_NR - 1) / (FG_WARPS * FG_NR), (M + bm - 1) / bm);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: normed fp8 gemv of %d rows", M);
  return fg_launch(FG_NORM, fg_rows_per_pass(bm), grid, s, H, ldh, NULL, w, N, K, NULL, NULL, NULL, bm, M, Y, ldy, 0,
                   0.f, nw, eps);
}

extern "C" di_status di_cuk_fp8_gemv_glu(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w,
                                         uint16_t *act, int ld_act, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  DI_TRY(fg_check_blocks(K, w));
  if (!fg_vector_ok(K, X, ldx, w) || N % 2)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gemv + SiLU N %d K %d (N even, K %% 16, aligned)", N, K);
  const int bm = M < 16 ? M : 16;
  const dim3 grid((N / 2 + FG_WARPS - 1) / FG_WARPS, (M + bm - 1) / bm);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fp8 gemv of %d rows", M);
  return fg_launch(FG_GLU, fg_rows_per_pass(bm), grid, s, X, ldx, NULL, w, N, K, NULL, NULL, NULL, bm, M, act, ld_act,
                   0, 0.f);
}

extern "C" di_status di_cuk_fp8_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N,
                                             int K, const int32_t *expert_off, const int32_t *tiles,
                                             const int32_t *n_tiles, int max_tiles, int bm, int max_rows, void *C,
                                             int ldc, int c_f32, di_cu_stream s) {
  return di_cuk_fp8_grouped_gemv_form(A, lda, a_rows, w, N, K, expert_off, tiles, n_tiles, max_tiles, bm, max_rows, C,
                                      ldc, c_f32, 0, s);
}

extern "C" di_status di_cuk_fp8_grouped_gemv_form(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w,
                                                  int N, int K, const int32_t *expert_off, const int32_t *tiles,
                                                  const int32_t *n_tiles, int max_tiles, int bm, int max_rows, void *C,
                                                  int ldc, int c_f32, int glu, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!fg_vector_ok(K, A, lda, w) || max_tiles > 65535 || w.block_rows <= 0 || (glu && (N % 2 || c_f32)))
    return di_error_set(DI_ERR_INVALID_ARG,
                        "cuda: fp8 grouped gemv K %d lda %d block %d x %d tiles %d (K %% 16, block_cols %% 16, aligned)",
                        K, lda, w.block_rows, w.block_cols, max_tiles);
  if (!glu && g_fg1_form && fg_rows_per_pass(max_rows < bm ? max_rows : bm) == 1)
    return fg1_launch(fg1_rows(K), max_tiles, s, A, lda, a_rows, w, N, K, expert_off, tiles, n_tiles, bm, 0, C, ldc, c_f32, 0.f);
  const dim3 grid(glu ? (N / 2 + FG_WARPS - 1) / FG_WARPS : (N + FG_WARPS * FG_NR - 1) / (FG_WARPS * FG_NR), max_tiles);
  return fg_launch(glu ? FG_GLU : FG_PLAIN, fg_rows_per_pass(max_rows < bm ? max_rows : bm), grid, s, A, lda, a_rows,
                   w, N, K, expert_off, tiles, n_tiles, bm, 0, C, ldc, c_f32, 0.f);
}

extern "C" di_status di_cuk_fp8_grouped_gemv1_f32x(const float *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K,
                                                   const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                                                   int max_tiles, int bm, float *C, int ldc, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!fg1_f32x_ok(K, A, w) || lda % 4 || max_tiles > 65535)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 grouped gemv of f32 rows: K %d lda %d tiles %d (K %% 16, aligned)", K, lda,
                        max_tiles);
  return fg1_launch(g_fg1_form ? fg1_rows(K) : 0, max_tiles, s, A, lda, a_rows, w, N, K, expert_off, tiles, n_tiles, bm, 0, C,
                    ldc, 1, 0.f, true);
}

/* The MoE down projection of a one-token step fused with the weighted combine into the residual row
 * (the FP8 form of k_grouped_gemm.cu's moe_down_combine): CTA c owns output rows DCF_ROWS c .. +DCF_ROWS,
 * and its warp j streams those rows of the FP8 down matrix of the token's expert slots j, j + DCF_WARPS,
 * ..., FG_NR rows at a time (the pipelined step above), scales each row's sum by the slot's routing weight,
 * and the warps' sums are added in warp order in shared memory (the same sum on every run) and onto h.
 * No fp32 expert outputs, no combine kernel; the next layer norms inside its q/kv product. */
#define DCF_WARPS 8
#define DCF_ROWS 8
static __global__ void __launch_bounds__(DCF_WARPS * 32)
fp8_down_combine_kernel(const bf16 *act, int ld_act, di_cuk_fp8w w, int N, int K, const int32_t *ids,
                        const float *wts, const int32_t *inv, int kt, float *h, int n) {
  constexpr int NR = FG_NR, U = 4;
  __shared__ float part[DCF_WARPS][DCF_ROWS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n0 = blockIdx.x * DCF_ROWS;
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  DI_PDL_ENTRY();
  float tot = 0.f; /* lane r < DCF_ROWS: row n0 + r */
  for (int j = warp; j < kt; j += DCF_WARPS) {
    const int e = ids[j];
    const float wj = wts[j];
    const void *xr[1] = {act + (int64_t)inv[j] * ld_act};
#pragma unroll
    for (int r0 = 0; r0 < DCF_ROWS; r0 += NR) {
      const uint8_t *wr[NR];
      const float *sr[NR];
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const int nn = min(n0 + r0 + r, N - 1);
        wr[r] = w.q + ((int64_t)e * N + nn) * w.ldq;
        sr[r] = w.scale + ((int64_t)e * sblocks + nn / w.block_rows) * w.scale_cols;
      }
      float acc[NR][1];
      fg_rows<1, NR, U, false>(acc, wr, sr, xr, w.block_cols, K, lane, NULL, NULL);
#pragma unroll
      for (int r = 0; r < NR; r++) {
        float v = acc[r][0];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == r0 + r) tot += wj * v;
      }
    }
  }
  if (lane < DCF_ROWS) part[warp][lane] = tot;
  __syncthreads();
  if (threadIdx.x < DCF_ROWS && n0 + (int)threadIdx.x < n) {
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < DCF_WARPS; q++) sum += part[q][threadIdx.x];
    h[n0 + threadIdx.x] += sum;
  }
}

extern "C" di_status di_cuk_fp8_down_combine(const uint16_t *act, int ld_act, di_cuk_fp8w w, int N, int K,
                                             const int32_t *ids, const float *wts, const int32_t *inv, int kt, float *h,
                                             int n, di_cu_stream s) {
  DI_TRY(fg_check_blocks(K, w));
  if (!fg_vector_ok(K, act, ld_act, w) || n > N || kt < 1)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 down + combine N %d K %d ld %d n %d k %d (K %% 16, aligned)",
                        N, K, ld_act, n, kt);
  DI_CU(di_launch(fp8_down_combine_kernel, (n + DCF_ROWS - 1) / DCF_ROWS, DCF_WARPS * 32, 0, s, (const bf16 *)act,
                  ld_act, w, N, K, ids, wts, inv, kt, h, n));
  DI_CU_LAUNCH("fp8_down_combine");
  return DI_OK;
}
