/* Block-FP8 tensor-core GEMM (W8A8, DeepGEMM's scheme) and the activation quantizer it reads, plus
 * the dense dispatch between it and the decode GEMV (k_fp8_gemv.cu).
 *
 * Scheme: the activations are quantized per row per 128 columns to E4M3 (scale amax / 448); each CTA
 * computes a BM x 128 tile of C over K in blocks of 128 (= one weight scale block column, and one
 * activation scale per row per K block; the weight scale is looked up per output column, so any block
 * height works: DeepSeek's 128, or the CUDA backend's per-row scales). The 4 mma.sync m16n8k32 e4m3
 * steps of a K block accumulate into a fresh fp32 fragment, which is then added to the running fp32
 * accumulator times (activation scale x weight scale): the "promotion" that keeps the tensor cores'
 * limited-precision accumulation to 128 products. mma.sync rather than wgmma: it is what could be
 * made correct in the time (wgmma's descriptor layouts are left for the bf16 wgmma core of issue 19).
 *
 * Tiles: 256 threads = 8 warps as 2 (M) x 4 (N), each warp (BM/2) x 32; a 3-stage cp.async pipeline
 * of [BM][128] A bytes and [128][128] W bytes, rows padded to 144 bytes (the 32-bit fragment loads of
 * a warp, rows g = lane/4 at byte 4*(lane%4), fall in 32 distinct banks). Edges: rows past M / N and
 * columns past K load as zeros (cp.async src-size 0), so partial blocks need no special case; K % 16
 * keeps every 16-byte copy either wholly inside or wholly past K. Fragment layouts are the PTX ISA's
 * for m16n8k32 with 8-bit operands: A reg j holds row g (+8 for j odd), bytes 4t..4t+3 (+16 for
 * j >= 2); B reg j holds column g, bytes 4t.. (+16 for j = 1); C as for m16n8k16. The skeleton it shares
 * with k_fp8_grouped_mma.cu (stage ring, promotion, tile rows) is k_fp8_mma.cuh. */
#include "k_fp8_mma.cuh"
#include "util/switches.h"

#define FM_BN 128
#define FM_BK 128
#define FM_SROW 144
#define FM_STAGES 3
#define FM_THREADS 256

static size_t fm_smem(int bm) { return (size_t)FM_STAGES * (bm + FM_BN) * FM_SROW; }

template <int BM>
static __global__ void __launch_bounds__(FM_THREADS)
fp8_mma_kernel(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows, di_cuk_fp8w w, int N,
               int K, const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, int M, void *C, int ldc,
               int c_f32, float beta) {
  constexpr int WM = BM / 2, MT = WM / 16, NT = 4;
  DI_PDL_ENTRY();
  if (tiles && (int)blockIdx.y >= *n_tiles) return;
  extern __shared__ __align__(16) uint8_t fm_raw[];
  uint8_t *sA = fm_raw, *sB = fm_raw + FM_STAGES * BM * FM_SROW;
  __shared__ int srow[BM];
  const fp8_rows t = fp8_tile_rows(off, tiles, BM, M);
  const int n0 = blockIdx.x * FM_BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;
  fp8_tile_srow(srow, BM, t, a_rows, tid, FM_THREADS);
  __syncthreads();
  const uint8_t *We;
  const float *Se;
  fp8_expert_w(w, N, t.e, &We, &Se);
  /* the weight scale rows of this thread's accumulator columns (any block height: 128-row blocks give
   * one row per CTA, the backend's per-row scales one per column) */
  int srw[NT][2];
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int v = 0; v < 2; v++) {
      const int n = min(n0 + wn * 32 + j * 8 + 2 * tq + v, N - 1);
      srw[j][v] = (n / w.block_rows) * w.scale_cols;
    }

  auto load = [&](int stage, int kb) {
    const int k0 = kb * FM_BK;
    uint8_t *a = sA + stage * BM * FM_SROW, *b = sB + stage * FM_BN * FM_SROW;
    for (int c = tid; c < BM * (FM_BK / 16); c += FM_THREADS) {
      const int r = c >> 3, col = (c & 7) * 16, ar = srow[r];
      const bool p = ar >= 0 && k0 + col < K;
      di_cp_async16(a + r * FM_SROW + col, Aq + (int64_t)(p ? ar : 0) * ldq + (p ? k0 + col : 0), p);
    }
    for (int c = tid; c < FM_BN * (FM_BK / 16); c += FM_THREADS) {
      const int r = c >> 3, col = (c & 7) * 16, n = n0 + r;
      const bool p = n < N && k0 + col < K;
      di_cp_async16(b + r * FM_SROW + col, We + (int64_t)(p ? n : 0) * w.ldq + (p ? k0 + col : 0), p);
    }
  };

  const int nk = (K + FM_BK - 1) / FM_BK;
  fp8_ring_start<FM_STAGES>(load, nk);
  float acc[MT][NT][4];
  fp8_frag_zero(acc);
  int arow[MT][2]; /* the activation rows of this thread's accumulator fragments (-1: past the tile) */
  fp8_frag_rows(arow, srow, wm * WM, g);

  for (int kb = 0; kb < nk; kb++) {
    fp8_ring_step<FM_STAGES>(load, kb, nk);
    const uint8_t *a = sA + (kb % FM_STAGES) * BM * FM_SROW, *b = sB + (kb % FM_STAGES) * FM_BN * FM_SROW;
    float tmp[MT][NT][4];
    fp8_frag_zero(tmp);
#pragma unroll
    for (int kk = 0; kk < FM_BK / 32; kk++) {
      uint32_t af[MT][4], bfr[NT][2];
#pragma unroll
      for (int i = 0; i < MT; i++) {
        const uint8_t *p = a + (wm * WM + i * 16 + g) * FM_SROW + kk * 32 + tq * 4;
        af[i][0] = *(const uint32_t *)p;
        af[i][1] = *(const uint32_t *)(p + 8 * FM_SROW);
        af[i][2] = *(const uint32_t *)(p + 16);
        af[i][3] = *(const uint32_t *)(p + 8 * FM_SROW + 16);
      }
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const uint8_t *p = b + (wn * 32 + j * 8 + g) * FM_SROW + kk * 32 + tq * 4;
        bfr[j][0] = *(const uint32_t *)p;
        bfr[j][1] = *(const uint32_t *)(p + 16);
      }
#pragma unroll
      for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) fp8_mma16832(tmp[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bfr[j][0], bfr[j][1]);
    }
    /* promotion: this K block's partial sums, scaled, into the fp32 accumulator */
    float swc[NT][2], s_a[MT][2];
    fp8_block_scales(swc, s_a, Se, srw, sa, lds, arow, kb);
    fp8_promote(acc, tmp, s_a, swc);
  }
  di_cp_wait<0>();
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int m = t.m0 + wm * WM + i * 16 + g + 8 * h;
      if (m >= t.mend) continue;
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int v = 0; v < 2; v++) {
          const int n = n0 + wn * 32 + j * 8 + 2 * tq + v;
          if (n >= N) continue;
          const float x = acc[i][j][2 * h + v];
          if (c_f32) {
            float *y = (float *)C + (int64_t)m * ldc + n;
            *y = beta != 0.f ? x + beta * *y : x;
          } else {
            ((bf16 *)C)[(int64_t)m * ldc + n] = di_fb(x);
          }
        }
    }
}

/* One warp per (row, 128-column group), 8 groups per 256-thread CTA; each lane 4 values. */
static __global__ void __launch_bounds__(256)
fp8_quant_act_kernel(const bf16 *X, int ldx, int M, int K, uint8_t *Xq, int ldq, float *sx, int s_m, int s_g) {
  DI_PDL_ENTRY();
  const int lane = threadIdx.x & 31, grp = blockIdx.x * 8 + (threadIdx.x >> 5), m = blockIdx.y;
  const int k = grp * 128 + lane * 4;
  if (grp * 128 >= K) return;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (k < K) { /* K % 16 == 0: a lane's 4 values are all inside K or all past it */
    const uint2 raw = *(const uint2 *)(X + (int64_t)m * ldx + k);
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.y);
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
  if (lane == 0) sx[(int64_t)m * s_m + (int64_t)grp * s_g] = s;
  if (k >= K) return;
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(__fdiv_rn(v[j], s), __NV_SATFINITE, __NV_E4M3);
    packed |= (uint32_t)q << (8 * j);
  }
  *(uint32_t *)(Xq + (int64_t)m * ldq + k) = packed;
}

extern "C" di_status di_cuk_fp8_quant_act(const uint16_t *X, int ldx, int M, int K, uint8_t *Xq, int ldq, float *sx,
                                          int lds, di_cu_stream s) {
  if (M <= 0) return DI_OK;
  if (K % 16 || ldx % 4 || ldq % 4 || ldq < K || lds < (K + 127) / 128 || M > 65535 || ((uintptr_t)X & 7))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 activation quantization M %d K %d ldx %d ldq %d (K %% 16)", M, K,
                        ldx, ldq);
  const int groups = (K + 127) / 128;
  DI_CU(di_launch(fp8_quant_act_kernel, dim3((groups + 7) / 8, M), 256, 0, s, (const bf16 *)X, ldx, M, K, Xq, ldq, sx,
                  lds, 1));
  DI_CU_LAUNCH("fp8_quant_act");
  return DI_OK;
}

extern "C" di_status di_cuk_fp8_quant_act_t(const uint16_t *X, int ldx, int M, int K, uint8_t *Xq, int ldq, float *sxt,
                                           int ldm, di_cu_stream s) {
  if (M <= 0) return DI_OK;
  if (K % 16 || ldx % 4 || ldq < K || ldq % 4 || ldm < M || M > 65535 || ((uintptr_t)X & 7))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 activation quantization M %d K %d ldx %d ldq %d ldm %d (K %% 16)",
                        M, K, ldx, ldq, ldm);
  const int groups = (K + 127) / 128;
  DI_CU(di_launch(fp8_quant_act_kernel, dim3((groups + 7) / 8, M), 256, 0, s, (const bf16 *)X, ldx, M, K, Xq, ldq, sxt,
                  1, ldm));
  DI_CU_LAUNCH("fp8_quant_act_t");
  return DI_OK;
}

extern "C" int di_cuk_fp8_gemm_ok(int K, di_cuk_fp8w w) {
  return w.block_rows > 0 && w.block_cols == FM_BK && K % 16 == 0 && w.ldq % 16 == 0 &&
         ((uintptr_t)w.q & 15) == 0 && w.scale_cols >= (K + FM_BK - 1) / FM_BK;
}

template <int BM>
static di_status fm_launch(dim3 grid, cudaStream_t s, const uint8_t *Aq, int ldq, const float *sa, int lds,
                           const int32_t *a_rows, di_cuk_fp8w w, int N, int K, const int32_t *off,
                           const int32_t *tiles, const int32_t *n_tiles, int M, void *C, int ldc, int c_f32,
                           float beta) {
  static bool attr_set = false; /* one-time, per instantiation (host state only) */
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(fp8_mma_kernel<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fm_smem(BM)));
    attr_set = true;
  }
  DI_CU(di_launch(fp8_mma_kernel<BM>, grid, FM_THREADS, fm_smem(BM), s, Aq, ldq, sa, lds, a_rows, w, N, K, off, tiles,
                  n_tiles, M, C, ldc, c_f32, beta));
  DI_CU_LAUNCH("fp8_mma_gemm");
  return DI_OK;
}

static bool fm_args_ok(int K, int ldq, const void *Aq, di_cuk_fp8w w) {
  return di_cuk_fp8_gemm_ok(K, w) && ldq % 16 == 0 && ((uintptr_t)Aq & 15) == 0;
}

extern "C" di_status di_cuk_fp8_gemm(int M, int N, int K, const uint8_t *Xq, int ldq, const float *sx, int lds,
                                     di_cuk_fp8w w, void *Y, int ldy, int y_f32, float beta, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  if (!fm_args_ok(K, ldq, Xq, w))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gemm K %d ldq %d block %d x %d (128-wide blocks, K %% 16, aligned)",
                        K, ldq, w.block_rows, w.block_cols);
  /* 64-row tiles unless the grid of 128-row tiles already fills the GPU about twice */
  const int nb = (N + FM_BN - 1) / FM_BN;
  if ((int64_t)nb * ((M + 127) / 128) >= 264 && (M + 127) / 128 <= 65535)
    return fm_launch<128>(dim3(nb, (M + 127) / 128), s, Xq, ldq, sx, lds, NULL, w, N, K, NULL, NULL, NULL, M, Y, ldy,
                          y_f32, beta);
  if ((M + 63) / 64 > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fp8 gemm of %d rows", M);
  return fm_launch<64>(dim3(nb, (M + 63) / 64), s, Xq, ldq, sx, lds, NULL, w, N, K, NULL, NULL, NULL, M, Y, ldy, y_f32,
                       beta);
}

extern "C" di_status di_cuk_fp8_grouped_gemm(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows,
                                             di_cuk_fp8w w, int N, int K, const int32_t *expert_off,
                                             const int32_t *tiles, const int32_t *n_tiles, int max_tiles, int bm,
                                             void *C, int ldc, int c_f32, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!fm_args_ok(K, ldq, Aq, w) || max_tiles > 65535)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 grouped gemm K %d ldq %d block %d x %d tiles %d", K, ldq,
                        w.block_rows, w.block_cols, max_tiles);
  const dim3 grid((N + FM_BN - 1) / FM_BN, max_tiles);
  if (bm == 64)
    return fm_launch<64>(grid, s, Aq, ldq, sa, lds, a_rows, w, N, K, expert_off, tiles, n_tiles, 0, C, ldc, c_f32, 0.f);
  if (bm == 128)
    return fm_launch<128>(grid, s, Aq, ldq, sa, lds, a_rows, w, N, K, expert_off, tiles, n_tiles, 0, C, ldc, c_f32, 0.f);
  return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 grouped gemm bm %d (64 or 128)", bm);
}

/* ---- the dense dispatch ---------------------------------------------------------------------------- */

extern "C" int di_cuk_fp8_tc_enabled(void) { return di_switch_bool(DI_SW_CUDA_FP8_TC, 1); }

extern "C" int di_cuk_fp8_tc_use(int M, int invariant) {
  return di_cuk_fp8_tc_enabled() && (invariant || M > DI_CUK_FP8_CC_ROWS);
}

extern "C" int di_cuk_fp8_gemv_max_rows(void) {
  /* with cuBLASLt's FP8 matmul from 4 rows (faster than the tensor-core GEMV from there: PERFORMANCE.md
   * "Session 9, issue 18"), else the GEMVs up to 16 rows */
  const int dflt = di_switch_bool(DI_SW_CUDA_FP8_LT, 1) ? 3 : 16, v = di_switch_int(DI_SW_CUDA_FP8_GEMV_ROWS, dflt);
  return v < 0 ? dflt : v;
}

extern "C" size_t di_cuk_fp8_ws_bytes(int M, int K) {
  const size_t ldq = ((size_t)K + 15) / 16 * 16, lds = ((size_t)K + 127) / 128;
  return (size_t)M * ldq + 256 + (size_t)M * lds * sizeof(float);
}

extern "C" di_status di_cuk_fp8_quant_ws(const uint16_t *X, int ldx, int M, int K, void *ws, size_t ws_bytes,
                                        uint8_t **xq, int *ldq, float **sx, int *lds, di_cu_stream s) {
  if (!ws || ws_bytes < di_cuk_fp8_ws_bytes(M, K))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 activations of %d x %d need %zu workspace bytes, have %zu", M, K,
                        di_cuk_fp8_ws_bytes(M, K), ws_bytes);
  *ldq = (K + 15) / 16 * 16;
  *lds = (K + 127) / 128;
  *xq = (uint8_t *)ws;
  *sx = (float *)((uint8_t *)ws + ((size_t)M * *ldq + 255) / 256 * 256);
  return di_cuk_fp8_quant_act(X, ldx, M, K, *xq, *ldq, *sx, *lds, s);
}

extern "C" di_status di_cuk_fp8_matmul(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y,
                                       int ldy, int y_f32, float beta, int invariant, void *ws, size_t ws_bytes,
                                       di_cu_stream s) {
  if (M <= 0) return DI_OK;
  if (invariant || M <= di_cuk_fp8_gemv_max_rows() || !di_cuk_fp8_gemm_ok(K, w)) {
    if (di_cuk_fp8_tc_use(M, invariant) && di_cuk_fp8_tc_ok(K, X, ldx, w))
      return di_cuk_fp8_tc_gemv(M, N, K, X, ldx, w, Y, ldy, y_f32, beta, s);
    return di_cuk_fp8_gemv(M, N, K, X, ldx, w, Y, ldy, y_f32, beta, s);
  }
  uint8_t *xq;
  float *sx;
  int ldq, lds;
  DI_TRY(di_cuk_fp8_quant_ws(X, ldx, M, K, ws, ws_bytes, &xq, &ldq, &sx, &lds, s));
  return di_cuk_fp8_gemm(M, N, K, xq, ldq, sx, lds, w, Y, ldy, y_f32, beta, s);
}
