/* The grouped expert GEMM on the TMA wgmma core (DEEPINFER_CUDA_TC_CORE=tma; k_grouped_gemm.cu calls
 * it for every tile size when that core is chosen and the shape fits: N % 256, K % 64). The same
 * product as grouped_gemm_kernel: C rows of the assignments sorted by expert = A rows (gathered
 * through a_rows) . W_e^T, optionally gate/up interleaved by 8 columns and fused into silu(g) * u.
 *
 * Invariance: a row's output is one f32 chain of wgmma m64n128k16 steps over k in order (K is never
 * split), whatever the tile list's row grouping (bm 16 or 64: how many real rows a 64-row tile
 * holds) and however many rows its expert has (the other rows are other chains).
 *
 * Structure: persistent CTAs over units (tile of the device tile list, 256-column block) in a fixed
 * order; warpgroup 0 produces a STAGES-deep ring: its 128 threads gather the tile's A rows with
 * cp.async 16-byte copies straight into the 128-byte swizzle (16-byte chunk c of row r at
 * r * 128 + ((c ^ r % 8) * 16); absent rows zero-filled), each arriving on the stage's full barrier
 * when its copies land (cp.async.mbarrier.arrive.noinc), while thread 0 loads the W box by TMA (2-D
 * map over all experts' rows: e * N + n). Two consumer warpgroups take 128 columns each of the 64 x
 * 256 tile; they fence the generic-proxy copies into the async proxy before their wgmmas read them. The
 * tile walk (units, barriers, the A rows' swizzled copies) is k_tc_units.cuh, shared with k_fp8_tc_grouped.cu. */
#include "k_tc_units.cuh"
#include "k_tc_core.h"

#define TG_BM 64
#define TG_BN 256
#define TG_STAGES 5
#define TG_MAX_EXPERTS 1024 /* the W map's row extent (N x this); the device tile list names the expert */

static __global__ void __launch_bounds__(384, 1)
    tc_grouped_kernel(const __grid_constant__ CUtensorMap mw, const bf16 *A, int lda, const int32_t *a_rows, int N,
                      int K, const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, int bm, void *C, int ldc,
                      int c_f32, int glu) {
  constexpr int A_BYTES = TG_BM * 128, ST_BYTES = A_BYTES + TG_BN * 128;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (tt_smem(smem_raw) + 1023) & ~1023u;
  const uint32_t bars = base + TG_STAGES * ST_BYTES; /* full[STAGES], then empty[STAGES] */
  const int wg = threadIdx.x >> 7, nblk = N / TG_BN, nk = K / 64;
  tg_bars_init(bars, TG_STAGES);
  __syncthreads();
  DI_PDL_ENTRY();
  const int units = *n_tiles * nblk;
  if (wg == 0) { /* producer */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    const int t = threadIdx.x;
    int stage = 0, phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const tg_unit un = tg_unit_at(tiles, off, bm, u, nblk, TG_BN);
      const int e = un.e, n0 = un.n0;
      /* this thread's 4 chunks: rows t / 8 + 16 i, chunk t % 8 */
      const int cc = t & 7;
      int64_t src[4];
      tg_src_rows(src, t, un, bm, a_rows, lda);
      for (int kt = 0; kt < nk; kt++) {
        const uint32_t full = bars + 8 * stage, sa = base + stage * ST_BYTES;
        tt_bar_wait(bars + 8 * (TG_STAGES + stage), phase ^ 1);
        if (t == 0) {
          tt_bar_expect(full, TG_BN * 128);
          tt_tma3(sa + A_BYTES, &mw, kt * 64, e * N + n0, 0, full);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int r = (t >> 3) + 16 * i;
          tg_cp_row16(sa, r, cc, src[i] >= 0 ? A + src[i] + kt * 64 + cc * 8 : A, src[i] >= 0);
        }
        tg_cp_arrive(full);
        tg_next<TG_STAGES>(stage, phase);
      }
    }
  } else { /* consumer c: columns 128 c .. 128 c + 127 of the tile */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1, lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
    int stage = 0, phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const tg_unit un = tg_unit_at(tiles, off, bm, u, nblk, TG_BN);
      const int n0 = un.n0 + c * 128, m0 = un.m0, mend = un.mend;
      float acc[64];
#pragma unroll
      for (int q = 0; q < 64; q++) acc[q] = 0.f;
      int prev = -1;
      for (int kt = 0; kt < nk; kt++) {
        tt_bar_wait(bars + 8 * stage, phase);
        wg_proxy_fence(); /* the gathered rows came through the generic proxy */
        const uint32_t sa = base + stage * ST_BYTES, sb = sa + A_BYTES + c * 128 * 128;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) tt_mma64x128(acc, tt_desc(sa + kk * 32), tt_desc(sb + kk * 32));
        wg_commit();
        tt_wait1();
        if (prev >= 0 && lane == 0) tt_bar_arrive(bars + 8 * (TG_STAGES + prev));
        prev = stage;
        tg_next<TG_STAGES>(stage, phase);
      }
      wg_wait0();
      if (prev >= 0 && lane == 0) tt_bar_arrive(bars + 8 * (TG_STAGES + prev));
      /* register q: row 16 wq + lane / 4 + 8 ((q / 2) % 2), column 8 (q / 4) + 2 (lane % 4) + q % 2 */
#pragma unroll
      for (int q = 0; q < 64; q += 2) {
        const int m = m0 + wq * 16 + (lane >> 2) + ((q >> 1) & 1) * 8;
        if (m >= mend) continue;
        if (glu) { /* 8-column blocks 2p (gate) and 2p + 1 (up) make 8 output columns */
          if ((q >> 2) & 1) continue;
          const int col = n0 / 2 + (q >> 3) * 8 + (lane & 3) * 2;
          const float g0 = acc[q], g1 = acc[q + 1], u0 = acc[q + 4], u1 = acc[q + 5];
          const float v0 = g0 / (1.f + __expf(-g0)) * u0, v1 = g1 / (1.f + __expf(-g1)) * u1;
          *(__nv_bfloat162 *)((bf16 *)C + (int64_t)m * ldc + col) = __floats2bfloat162_rn(v0, v1);
        } else {
          const int col = n0 + (q >> 2) * 8 + (lane & 3) * 2;
          if (c_f32) *(float2 *)((float *)C + (int64_t)m * ldc + col) = make_float2(acc[q], acc[q + 1]);
          else *(__nv_bfloat162 *)((bf16 *)C + (int64_t)m * ldc + col) = __floats2bfloat162_rn(acc[q], acc[q + 1]);
        }
      }
    }
  }
}

extern "C" int di_cuk_tc_grouped_ok(int N, int K, int lda, const void *A) {
  return N % TG_BN == 0 && K % 64 == 0 && lda % 8 == 0 && ((uintptr_t)A & 15) == 0;
}

extern "C" di_status di_cuk_tc_grouped_gemm(const uint16_t *A, int lda, const int32_t *a_rows, const uint16_t *W, int N,
                                            int K, const int32_t *expert_off, const int32_t *tiles,
                                            const int32_t *n_tiles, int max_tiles, int bm, void *C, int ldc, int c_f32,
                                            int glu, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!di_cuk_tc_grouped_ok(N, K, lda, A) || bm < 1 || bm > TG_BM || ((uintptr_t)W & 15))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: tensor-core grouped GEMM N %d K %d bm %d (N %% 256, K %% 64)", N, K,
                        bm);
  const size_t sm = (size_t)TG_STAGES * (TG_BM + TG_BN) * 128 + 16 * TG_STAGES + 1024;
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(tc_grouped_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  CUtensorMap mw;
  int zrow;
  DI_TRY(tt_map(&mw, (const bf16 *)W, K, N * TG_MAX_EXPERTS, 1, K, 0, TG_BN, &zrow));
  const int64_t units = (int64_t)max_tiles * (N / TG_BN), cap = tt_sm_count();
  DI_CU(di_launch(tc_grouped_kernel, dim3((unsigned)(units < cap ? units : cap)), 384, sm, s, mw, (const bf16 *)A, lda,
                  a_rows, N, K, expert_off, tiles, n_tiles, bm, C, ldc, c_f32, glu));
  DI_CU_LAUNCH("tc_grouped_gemm");
  return DI_OK;
}
