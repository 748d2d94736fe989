/* The TMA + warp-specialized wgmma core of the invariant tensor-core GEMM (included by k_tc_gemm.cu,
 * which owns tc_args, the splits, the epilogue and the reduce kernel; DEEPINFER_CUDA_TC_CORE=tma
 * selects it; W [N][K] only, W [K][N] stays on mma.sync in every core).
 *
 * Arithmetic (what makes a row's bits independent of M): every output element is one f32 chain of
 * wgmma m64n128k16 steps (bf16 in) over k = 0, 16, 32, ... per split, in that order; the same
 * instruction whatever the tile, so the M bucket (64- or 128-row tiles, 128- or 256-wide) only decides
 * which warpgroup runs the chain and how many n128 blocks it issues per k step. Splits are
 * tc_splits(N, K), fixed per weight shape, added in split order onto a zero total (in registers, or
 * through f32 partials and tc_reduce_kernel when the product has few tiles): the rules of
 * k_tc_gemm.cu. Measured on the H200: bit-equal to the mma.sync and the cp.async wgmma cores for the
 * same chains (the tensor cores' k16 step is the same whichever instruction issues it).
 *
 * Structure (after the sm90 warp-specialized persistent GEMMs of CUTLASS and DeepGEMM):
 * - warpgroup 0 is the producer: one thread issues TMA tile loads (cp.async.bulk.tensor, 128-byte
 *   swizzle, 64-wide k tiles = one swizzle row of 128 bytes) into a ring of STAGES shared-memory
 *   stages; each stage has a "full" mbarrier (the TMA's transaction bytes) and an "empty" one (one
 *   arrival per consumer warp once its wgmmas of that stage are done). Rows past M, columns past N
 *   and k past K are zero-filled by the TMA itself (the box bytes still count as transactions).
 * - warpgroups 1..NC are consumers, 64 rows each; per k tile they issue 4 k16 steps x BN/128 wgmmas
 *   straight from shared memory (128B-swizzle K-major descriptors: stride offset 1024 B = 8 rows of
 *   128 B; the k16 step advances the start address by 32 B inside the swizzle atom), keep one
 *   wgmma group in flight (wait_group 1) and release the previous stage.
 * - persistent: grid = min(units, SMs x CTAs per SM); CTA b runs units b, b + grid, ... where a unit
 *   is (head, split of the cross form, tile) in a fixed order (grouped raster, tc_tile_of): the
 *   producer runs ahead into the next unit while the consumers store the last one.
 * - tensor maps are encoded per call on the host (cuTensorMapEncodeTiled through
 *   cudaGetDriverEntryPointByVersion: nothing new to link) as 3-D maps (k, row, head) or (k, head,
 *   row), whichever keeps the strides increasing (the per-head layouts of the MLA products), and passed
 *   by value as __grid_constant__ parameters. */
#ifndef DI_K_TC_TMA_CUH
#define DI_K_TC_TMA_CUH
#include "k_tc_sm90.cuh"

/* NC consumer warpgroups (BM = 64 NC rows), BN = 128 or 256 columns, STAGES-deep ring; TOT as
 * tc_gemm_kernel (S > 1, all splits of a tile in this CTA). x_zrow / w_zrow: the map's coordinates are
 * (k, head, row) instead of (k, row, head). */
template <int NC, int BN, int STAGES, int TOT>
static __global__ void __launch_bounds__((NC + 1) * 128, 1)
    tc_tma_kernel(const __grid_constant__ CUtensorMap mx, const __grid_constant__ CUtensorMap mw, const tc_args a,
                  int nm, int nn, int units, int x_zrow, int w_zrow) {
  constexpr int BM = NC * 64, NB = BN / 128;
  constexpr int A_BYTES = BM * TC_BK * 2, ST_BYTES = A_BYTES + BN * TC_BK * 2;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (tt_smem(smem_raw) + 1023) & ~1023u; /* the swizzle atoms need 1024-byte alignment */
  const uint32_t bars = base + STAGES * ST_BYTES;            /* full[STAGES], then empty[STAGES] */
  const int wg = threadIdx.x >> 7, nk = (a.K + TC_BK - 1) / TC_BK, per_z = nm * nn;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; s++) {
      tt_bar_init(bars + 8 * s, 1);
      tt_bar_init(bars + 8 * (STAGES + s), NC * 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  DI_PDL_ENTRY();
  if (wg == 0) { /* producer */
    if constexpr (NC == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      int stage = 0, phase = 0;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        int tm, tn;
        tc_tile_of(u % per_z, nm, nn, &tm, &tn);
        const tc_work w = tc_work_of(a, u / per_z, nk);
        for (int kt = w.kt0; kt < w.kt1; kt++) {
          const uint32_t full = bars + 8 * stage, sa = base + stage * ST_BYTES;
          tt_bar_wait(bars + 8 * (STAGES + stage), phase ^ 1);
          tt_bar_expect(full, ST_BYTES);
          const int k0 = kt * TC_BK;
          if (x_zrow) tt_tma3(sa, &mx, k0, w.z, tm * BM, full);
          else tt_tma3(sa, &mx, k0, tm * BM, w.z, full);
          if (w_zrow) tt_tma3(sa + A_BYTES, &mw, k0, w.z, tn * BN, full);
          else tt_tma3(sa + A_BYTES, &mw, k0, tn * BN, w.z, full);
          if (++stage == STAGES) stage = 0, phase ^= 1;
        }
      }
    }
  } else { /* consumers: warpgroup c owns rows 64 c .. 64 c + 63 of the tile */
    if constexpr (NC == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1, lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
    int stage = 0, phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      int tm, tn;
      tc_tile_of(u % per_z, nm, nn, &tm, &tn);
      const tc_work w = tc_work_of(a, u / per_z, nk);
      float acc[NB][64], tot[TOT ? NB : 1][TOT ? 64 : 1];
#pragma unroll
      for (int j = 0; j < NB; j++)
#pragma unroll
        for (int q = 0; q < 64; q++) {
          acc[j][q] = 0.f;
          if constexpr (TOT) tot[j][q] = 0.f;
        }
      int next_split = 1, split_end = TOT ? tc_split_begin(1, a.S, nk) : w.kt1, prev = -1;
      for (int kt = w.kt0; kt < w.kt1; kt++) {
        tt_bar_wait(bars + 8 * stage, phase);
        const uint32_t sa = base + stage * ST_BYTES + c * 64 * 128, sb = base + stage * ST_BYTES + A_BYTES;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < TC_BK / 16; kk++)
#pragma unroll
          for (int j = 0; j < NB; j++) tt_mma64x128(acc[j], tt_desc(sa + kk * 32), tt_desc(sb + j * 128 * 128 + kk * 32));
        wg_commit();
        bool split_done = false;
        if constexpr (TOT) split_done = kt + 1 == split_end;
        if (split_done) { /* a split's chain is done: onto the total, and the next chain from zero */
          wg_wait0();
#pragma unroll
          for (int j = 0; j < NB; j++)
#pragma unroll
            for (int q = 0; q < 64; q++) {
              if constexpr (TOT) tot[j][q] = __fadd_rn(tot[j][q], acc[j][q]);
              acc[j][q] = 0.f;
            }
          next_split++;
          split_end = tc_split_begin(next_split, a.S, nk);
        } else {
          tt_wait1(); /* every group but this k tile's is done: the previous stage is free */
        }
        if (prev >= 0 && lane == 0) tt_bar_arrive(bars + 8 * (STAGES + prev));
        prev = stage;
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
      wg_wait0();
      if (prev >= 0 && lane == 0) tt_bar_arrive(bars + 8 * (STAGES + prev));
      /* accumulator register q of m64nNk16: row 16 * warp + lane / 4 + 8 * ((q / 2) % 2), column
       * 8 * (q / 4) + 2 * (lane % 4) + q % 2 */
      const int mrow = tm * BM + c * 64 + wq * 16 + (lane >> 2);
#pragma unroll
      for (int j = 0; j < NB; j++)
#pragma unroll
        for (int q = 0; q < 64; q += 2) {
          const int m = mrow + ((q >> 1) & 1) * 8, n = tn * BN + j * 128 + (q >> 2) * 8 + (lane & 3) * 2;
          if constexpr (TOT) tc_emit2(a, w.z, w.split, m, n, tot[j][q], tot[j][q + 1]);
          else tc_emit2(a, w.z, w.split, m, n, acc[j][q], acc[j][q + 1]);
        }
    }
  }
}

template <int NC, int BN, int STAGES, int TOT>
static di_status tt_launch(const tc_args &a, int batch, int zdim, cudaStream_t s) {
  constexpr int BM = NC * 64, NTH = (NC + 1) * 128;
  const size_t sm = (size_t)STAGES * (BM + BN) * TC_BK * 2 + 16 * STAGES + 1024;
  static int per_sm; /* CTAs per SM, once per instantiation (a benign race sets the same value) */
  if (!per_sm) {
    DI_CU(cudaFuncSetAttribute(tc_tma_kernel<NC, BN, STAGES, TOT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    int occ = 0;
    DI_CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, tc_tma_kernel<NC, BN, STAGES, TOT>, NTH, sm));
    per_sm = occ > 0 ? occ : 1;
  }
  CUtensorMap mx, mw;
  int xz, wz;
  DI_TRY(tt_map(&mx, a.X, a.K, a.M, batch, a.ldx, a.sx, BM, &xz));
  DI_TRY(tt_map(&mw, a.W, a.K, a.N, batch, a.ldw, a.sw, BN, &wz));
  const int nm = (a.M + BM - 1) / BM, nn = (a.N + BN - 1) / BN;
  const int64_t units = (int64_t)zdim * nm * nn, cap = (int64_t)tt_sm_count() * per_sm;
  if (units > INT32_MAX) return di_error_set(DI_ERR_INVALID_ARG, "cuda: tensor-core GEMM of %lld tiles", (long long)units);
  DI_CU(di_launch(tc_tma_kernel<NC, BN, STAGES, TOT>, dim3((unsigned)(units < cap ? units : cap)), NTH, sm, s, mx, mw, a,
                  nm, nn, (int)units, xz, wz));
  return DI_OK;
}

/* The M bucket of the TMA core (rows grouping only): 64-row tiles up to 64 rows (two CTAs per SM),
 * then 128 rows; 256 wide when K is not split (the split form's running total needs the registers). */
template <int TOT>
static di_status tt_dispatch(const tc_args &a, int batch, int zdim, cudaStream_t s) {
  if (a.M <= 64) return tt_launch<1, 128, 4, TOT>(a, batch, zdim, s);
  if (TOT || a.S > 1) return tt_launch<2, 128, 6, TOT>(a, batch, zdim, s);
  return tt_launch<2, 256, 4, 0>(a, batch, zdim, s);
}
#endif
