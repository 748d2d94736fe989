/* The FP8 expert products of steps of more than 16 tokens (decode batches and prefill,
 * DEEPINFER_CUDA_FP8_GMMA): a grouped W8A8 GEMM on mma.sync m16n8k32 e4m3 in DeepGEMM's scheme, the
 * activations quantized per row per 128 columns (di_cuk_fp8_quant_ws, the same rule as everywhere),
 * fp32 partial sums of one 128-wide K block promoted into the fp32 accumulator times (activation scale
 * x weight scale), as k_fp8_gemm.cu's kernel does; what differs is how the operands reach the tensor
 * cores, which is why that kernel ran at ~170-200 TFLOP/s and only with 64-row tiles:
 *   - one 128-byte shared-memory row per operand row and K block, its 16-byte chunks XOR-swizzled by
 *     the row's parity (chunk c at c ^ 4 in odd rows), so that each thread reads its fragments with
 *     16-byte loads that a quarter-warp spreads over all 32 banks (k_fp8_gemm.cu: 32-bit loads);
 *   - the K positions inside a K block are permuted alike for both operands: the mma's fragment of
 *     lane (g, t) holds bytes 4t..4t+3 and 16+4t..16+4t+3 of a 32-byte step, and here those are the
 *     lane's 8 contiguous bytes 8t..8t+7 (two steps per 16-byte load). A dot product is a sum over K,
 *     so any permutation applied to both operands gives the same sum (up to the tensor core's order);
 *   - 16-row tiles (the MoE tile lists of decode steps of up to ~260 tokens, k_moe.cu's bm 16) as well
 *     as 64-row ones: 4 warps side by side over 128 weight rows (16 rows), or 2 x 4 warps (64 rows);
 *   - the experts' gate/up product writes silu(gate) * up itself (glu): the 128 weight rows of a CTA
 *     are 64 gate rows and the 64 up rows of the same columns, each warp's n8 tiles 0-1 gate and 2-3 up,
 *     so a thread holds both halves of its outputs (no [rows][2I] round trip, no silu_mul kernel).
 * The weights are the backend's device form (E4M3 rows, one f32 scale per row per 128 columns, or any
 * block height: the scale is looked up per output row), 4 stages of cp.async in flight (72 KB of
 * shared memory at 16 rows: 3 CTAs an SM). Edges: weight rows past N and columns past K load zeros;
 * K % 16 == 0. Not batch-invariant (the invariant mode never takes it). The skeleton shared with
 * k_fp8_gemm.cu (stage ring, per-K-block scales and promotion, tile rows) is k_fp8_mma.cuh. */
#include "k_fp8_mma.cuh"
#include "util/switches.h"

#define GM_BK 128  /* K per stage: one scale block */
#define GM_BN 128  /* weight rows per CTA */
#define GM_STAGES 4

/* byte offset of 16-byte chunk c of shared row r */
static __device__ __forceinline__ int gm_at(int r, int c) { return r * 128 + ((c ^ ((r & 1) << 2)) << 4); }

static size_t gm_smem(int bm) { return (size_t)GM_STAGES * (bm + GM_BN) * 128; }

/* BM = 16 * MT * WMW token rows, WMW warp rows of 4 warps each (4 n8 tiles of 8 weight rows a warp) */
template <int MT, int WMW>
static __global__ void __launch_bounds__(128 * WMW)
fp8_gmma_kernel(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows, di_cuk_fp8w w, int N,
                int K, const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, void *C, int ldc, int c_f32,
                int glu) {
  constexpr int NTH = 128 * WMW, WM = 16 * MT, BM = WM * WMW, NT = 4;
  DI_PDL_ENTRY();
  if ((int)blockIdx.y >= *n_tiles) return;
  extern __shared__ __align__(128) uint8_t gm_raw[];
  uint8_t *sA = gm_raw, *sB = gm_raw + GM_STAGES * BM * 128;
  __shared__ int srow[BM], brow[GM_BN];
  const fp8_rows t = fp8_tile_rows(off, tiles, BM, 0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int wm = warp >> 2, wn = warp & 3, I = N / 2;
  fp8_tile_srow(srow, BM, t, a_rows, tid, NTH);
  for (int r = tid; r < GM_BN; r += NTH) { /* the weight row of shared row r (-1: past the matrix) */
    int n;
    if (glu) { /* warp wn's rows wn*32 ..: n8 tiles 0-1 gate columns c0 + wn*16 + 0..15, tiles 2-3 their up rows */
      const int j = (r >> 3) & 3, c = (int)blockIdx.x * 64 + (r >> 5) * 16 + (j & 1) * 8 + (r & 7);
      n = c < I ? (j < 2 ? c : I + c) : -1;
    } else {
      n = (int)blockIdx.x * GM_BN + r;
      if (n >= N) n = -1;
    }
    brow[r] = n;
  }
  __syncthreads();
  const uint8_t *We;
  const float *Se;
  fp8_expert_w(w, N, t.e, &We, &Se);
  int srw[NT][2]; /* the scale rows of this thread's accumulator columns (-1: past N) */
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int v = 0; v < 2; v++) {
      const int n = brow[wn * 32 + j * 8 + 2 * tq + v];
      srw[j][v] = n < 0 ? -1 : (n / w.block_rows) * w.scale_cols;
    }
  int arow[MT][2];
  fp8_frag_rows(arow, srow, wm * WM, g);

  auto load = [&](int stage, int kb) {
    const int k0 = kb * GM_BK;
    uint8_t *a = sA + stage * BM * 128, *b = sB + stage * GM_BN * 128;
    for (int c = tid; c < BM * 8; c += NTH) {
      const int r = c >> 3, col = (c & 7) * 16, ar = srow[r];
      const bool p = ar >= 0 && k0 + col < K;
      di_cp_async16(a + gm_at(r, c & 7), Aq + (int64_t)(p ? ar : 0) * ldq + (p ? k0 + col : 0), p);
    }
#pragma unroll 4
    for (int c = tid; c < GM_BN * 8; c += NTH) {
      const int r = c >> 3, col = (c & 7) * 16, n = brow[r];
      const bool p = n >= 0 && k0 + col < K;
      di_cp_async16(b + gm_at(r, c & 7), We + (int64_t)(p ? n : 0) * w.ldq + (p ? k0 + col : 0), p);
    }
  };

  const int nk = (K + GM_BK - 1) / GM_BK;
  fp8_ring_start<GM_STAGES>(load, nk);
  float acc[MT][NT][4];
  fp8_frag_zero(acc);

  for (int kb = 0; kb < nk; kb++) {
    /* this K block's scales, loaded before its products so their latency hides behind them */
    float swc[NT][2], s_a[MT][2];
    fp8_block_scales(swc, s_a, Se, srw, sa, lds, arow, kb);
    fp8_ring_step<GM_STAGES>(load, kb, nk);
    const uint8_t *a = sA + (kb % GM_STAGES) * BM * 128, *b = sB + (kb % GM_STAGES) * GM_BN * 128;
    float tmp[MT][NT][4];
    fp8_frag_zero(tmp);
#pragma unroll
    for (int h = 0; h < 2; h++) { /* 64 K positions: the lane's chunk 4h + t of each row, two mma steps */
      uint4 af[MT][2], bf[NT];
#pragma unroll
      for (int i = 0; i < MT; i++) {
        af[i][0] = *(const uint4 *)(a + gm_at(wm * WM + i * 16 + g, 4 * h + tq));
        af[i][1] = *(const uint4 *)(a + gm_at(wm * WM + i * 16 + g + 8, 4 * h + tq));
      }
#pragma unroll
      for (int j = 0; j < NT; j++) bf[j] = *(const uint4 *)(b + gm_at(wn * 32 + j * 8 + g, 4 * h + tq));
#pragma unroll
      for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) {
          fp8_mma16832(tmp[i][j], af[i][0].x, af[i][1].x, af[i][0].y, af[i][1].y, bf[j].x, bf[j].y);
          fp8_mma16832(tmp[i][j], af[i][0].z, af[i][1].z, af[i][0].w, af[i][1].w, bf[j].z, bf[j].w);
        }
    }
    fp8_promote(acc, tmp, s_a, swc);
  }
  di_cp_wait<0>();
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int m = t.m0 + wm * WM + i * 16 + g + 8 * hh;
      if (m >= t.mend) continue;
      if (glu) {
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
          for (int v = 0; v < 2; v++) {
            const int c = (int)blockIdx.x * 64 + wn * 16 + j * 8 + 2 * tq + v;
            if (c >= I) continue;
            const float gt = acc[i][j][2 * hh + v], u = acc[i][j + 2][2 * hh + v];
            ((bf16 *)C)[(int64_t)m * ldc + c] = di_fb(gt / (1.f + __expf(-gt)) * u);
          }
        continue;
      }
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int v = 0; v < 2; v++) {
          const int n = brow[wn * 32 + j * 8 + 2 * tq + v];
          if (n < 0) continue;
          const float x = acc[i][j][2 * hh + v];
          if (c_f32) ((float *)C)[(int64_t)m * ldc + n] = x;
          else ((bf16 *)C)[(int64_t)m * ldc + n] = di_fb(x);
        }
    }
}

template <int MT, int WMW>
static di_status gm_launch(dim3 grid, cudaStream_t s, const uint8_t *Aq, int ldq, const float *sa, int lds,
                           const int32_t *a_rows, di_cuk_fp8w w, int N, int K, const int32_t *off,
                           const int32_t *tiles, const int32_t *n_tiles, void *C, int ldc, int c_f32, int glu) {
  static bool attr_set = false; /* one-time, per instantiation (host state only) */
  const int bm = 16 * MT * WMW;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(fp8_gmma_kernel<MT, WMW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gm_smem(bm)));
    attr_set = true;
  }
  DI_CU(di_launch(fp8_gmma_kernel<MT, WMW>, grid, 128 * WMW, gm_smem(bm), s, Aq, ldq, sa, lds, a_rows, w, N, K, off,
                  tiles, n_tiles, C, ldc, c_f32, glu));
  DI_CU_LAUNCH("fp8_gmma");
  return DI_OK;
}

extern "C" int di_cuk_fp8_gmma_ok(int K, di_cuk_fp8w w) {
  return w.block_rows > 0 && w.block_cols == GM_BK && K % 16 == 0 && w.ldq % 16 == 0 && ((uintptr_t)w.q & 15) == 0 &&
         w.scale_cols >= (K + GM_BK - 1) / GM_BK;
}

extern "C" di_status di_cuk_fp8_gmma_grouped(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows,
                                             di_cuk_fp8w w, int N, int K, const int32_t *expert_off,
                                             const int32_t *tiles, const int32_t *n_tiles, int max_tiles, int bm,
                                             void *C, int ldc, int c_f32, int glu, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!di_cuk_fp8_gmma_ok(K, w) || ldq % 16 || ((uintptr_t)Aq & 15) || max_tiles > 65535 || (glu && (c_f32 || N % 2)))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gmma K %d ldq %d block %d x %d tiles %d glu %d", K, ldq,
                        w.block_rows, w.block_cols, max_tiles, glu);
  const dim3 grid(glu ? (N / 2 + 63) / 64 : (N + GM_BN - 1) / GM_BN, max_tiles);
  if (bm == 16)
    return gm_launch<1, 1>(grid, s, Aq, ldq, sa, lds, a_rows, w, N, K, expert_off, tiles, n_tiles, C, ldc, c_f32, glu);
  if (bm == 64 && di_switch_int(DI_SW_CUDA_FP8_GMMA, 1) == 2) /* A/B: one warp row of 64 (4 warps, 2 CTAs an SM) */
    return gm_launch<4, 1>(grid, s, Aq, ldq, sa, lds, a_rows, w, N, K, expert_off, tiles, n_tiles, C, ldc, c_f32, glu);
  if (bm == 64)
    return gm_launch<2, 2>(grid, s, Aq, ldq, sa, lds, a_rows, w, N, K, expert_off, tiles, n_tiles, C, ldc, c_f32, glu);
  return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 gmma bm %d (16 or 64)", bm);
}
