/* The wgmma core of the invariant tensor-core GEMM (included by k_tc_gemm.cu, which owns tc_args, the
 * splits, the epilogue and the reduce kernel; DEEPINFER_CUDA_TC_CORE=wgmma selects it, W [N][K] only).
 * Each warpgroup (4 warps) owns 64 rows of the tile and issues wgmma.mma_async m64n64k16 (bf16 in,
 * f32 accumulate) for each 64-column block, operands straight from shared memory through matrix
 * descriptors. An element's arithmetic is again one chain of k16 steps in k order per split, so the
 * tile size (picked from M) never changes a row (and on the H200 the bits equal the mma.sync core's).
 * Shared memory holds the tiles in the no-swizzle
 * K-major layout of core matrices (8 rows x 16 bytes, 128 contiguous bytes): byte offset of (row r,
 * 16-byte chunk c of the 64-wide k tile) = ((r / 8) * 8 + c) * 128 + (r % 8) * 16, so the
 * descriptor's leading offset (next chunk in K) is 128 B and its stride offset (next 8 rows) 1024 B.
 * Loads are cp.async (4 stages) as in the mma.sync core, made visible to the tensor cores' async proxy
 * by fence.proxy.async before the barrier. Not yet TMA or producer/consumer warp specialization. */
#ifndef DI_K_TC_WGMMA_CUH
#define DI_K_TC_WGMMA_CUH
#include "k_tc_sm90.cuh"

static __device__ __forceinline__ uint64_t wg_desc(const void *smem) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
  return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 | (uint64_t)(1024 >> 4) << 32;
}
static __device__ __forceinline__ void wg_mma64x64(float *d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(1));
}

/* core-matrix offset (in bf16 elements) of row r, element k of a [rows][64] tile */
static __device__ __forceinline__ int wg_off(int r, int k) { return (((r >> 3) << 3) + (k >> 3)) * 64 + (r & 7) * 8 + (k & 7); }

/* BM x BN tile, BM / 64 warpgroups; TOT as tc_gemm_kernel. */
template <int BM, int BN, int TOT>
static __global__ void __launch_bounds__(BM * 2, 1) tc_wgmma_kernel(const tc_args a) {
  constexpr int NTH = BM * 2, NB = BN / 64;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16 *sA = (bf16 *)smem_raw;                /* [STAGES][BM * 64] */
  bf16 *sB = sA + TC_STAGES * BM * TC_BK;     /* [STAGES][BN * 64] */
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
  int tm, tn;
  tc_tile_of_cta(&tm, &tn);
  const int n0 = tn * BN, m0 = tm * BM;
  const int cross = a.part != nullptr;
  const int M = a.M, N = a.N, K = a.K, nk = (K + TC_BK - 1) / TC_BK;
  const tc_work w = tc_work_of(a, blockIdx.z, nk);
  const int z = w.z, split = w.split, kt0 = w.kt0, kt1 = w.kt1;
  const bf16 *X = a.X + a.sx * z, *W = a.W + a.sw * z;
  DI_PDL_ENTRY();

  auto load = [&](int stage, int kt) {
    const int k0 = kt * TC_BK;
    bf16 *sa = sA + stage * BM * TC_BK, *sb = sB + stage * BN * TC_BK;
    /* c -> row (c & 7) + 8 * (c >> 6), chunk (c >> 3) & 7: 8 consecutive threads fill one core matrix */
    for (int c = tid; c < BM * 8; c += NTH) {
      const int r = (c & 7) + ((c >> 6) << 3), col = ((c >> 3) & 7) * 8;
      const bool ok = m0 + r < M && k0 + col < K;
      di_cp_async16(sa + wg_off(r, col), ok ? X + (int64_t)(m0 + r) * a.ldx + k0 + col : X, ok);
    }
    for (int c = tid; c < BN * 8; c += NTH) {
      const int r = (c & 7) + ((c >> 6) << 3), col = ((c >> 3) & 7) * 8;
      const bool ok = n0 + r < N && k0 + col < K;
      di_cp_async16(sb + wg_off(r, col), ok ? W + (int64_t)(n0 + r) * a.ldw + k0 + col : W, ok);
    }
  };

#pragma unroll
  for (int st = 0; st < TC_STAGES - 1; st++) {
    if (kt0 + st < kt1) load(st, kt0 + st);
    di_cp_commit();
  }
  float acc[NB][32], tot[TOT ? NB : 1][32];
#pragma unroll
  for (int j = 0; j < NB; j++)
#pragma unroll
    for (int q = 0; q < 32; q++) {
      acc[j][q] = 0.f;
      if constexpr (TOT) tot[j][q] = 0.f;
    }
  int next_split = 1, split_end = TOT ? tc_split_begin(1, a.S, nk) : nk;
  for (int kt = kt0; kt < kt1; kt++) {
    const int i = kt - kt0;
    di_cp_wait<TC_STAGES - 2>();
    wg_proxy_fence();
    __syncthreads();
    {
      const int nxt = kt + TC_STAGES - 1;
      if (nxt < kt1) load((i + TC_STAGES - 1) % TC_STAGES, nxt);
      di_cp_commit();
    }
    const bf16 *sa = sA + (i % TC_STAGES) * BM * TC_BK + wg * 64 * TC_BK, *sb = sB + (i % TC_STAGES) * BN * TC_BK;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < TC_BK / 16; kk++) {
      const uint64_t da = wg_desc(sa + kk * 2 * 64);
#pragma unroll
      for (int j = 0; j < NB; j++) wg_mma64x64(acc[j], da, wg_desc(sb + j * 64 * TC_BK + kk * 2 * 64));
    }
    wg_commit();
    wg_wait0();
    if constexpr (TOT) {
      if (kt + 1 == split_end) {
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
          for (int q = 0; q < 32; q++) {
            tot[j][q] = __fadd_rn(tot[j][q], acc[j][q]);
            acc[j][q] = 0.f;
          }
        next_split++;
        split_end = tc_split_begin(next_split, a.S, nk);
      }
    }
  }
  di_cp_wait<0>();
  /* accumulator of m64nNk16: register q of a thread is row 16 * warp + lane / 4 + 8 * ((q / 2) % 2),
   * column 8 * (q / 4) + 2 * (lane % 4) + q % 2 */
#pragma unroll
  for (int j = 0; j < NB; j++)
#pragma unroll
    for (int q = 0; q < 32; q++) {
      const int m = m0 + wg * 64 + wq * 16 + (lane >> 2) + ((q >> 1) & 1) * 8;
      const int n = n0 + j * 64 + (q >> 2) * 8 + (lane & 3) * 2 + (q & 1);
      if constexpr (TOT) tc_emit(a, z, split, m, n, tot[j][q]);
      else tc_emit(a, z, split, m, n, acc[j][q]);
    }
  if (cross && a.counters) tc_cross_finish<BM, BN, NTH>(a, z, m0, n0);
}

template <int BM, int BN, int TOT>
static di_status wg_launch(const tc_args &a, int zdim, cudaStream_t s) {
  const size_t sm = (size_t)TC_STAGES * (BM + BN) * TC_BK * 2;
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(tc_wgmma_kernel<BM, BN, TOT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  const dim3 grid((a.N + BN - 1) / BN, (a.M + BM - 1) / BM, zdim);
  DI_CU(di_launch(tc_wgmma_kernel<BM, BN, TOT>, grid, BM * 2, sm, s, a));
  return DI_OK;
}

/* The M bucket of the wgmma core (rows grouping only); the tile widths tc_bm / tc_bn size the
 * cross-CTA decision for both cores alike (64-wide at M <= 16, else 128). */
template <int TOT>
static di_status wg_dispatch(const tc_args &a, int zdim, cudaStream_t s) {
  if (a.M <= 16) return wg_launch<64, 64, TOT>(a, zdim, s);
  if (a.M <= 128) return wg_launch<64, 128, TOT>(a, zdim, s);
  return wg_launch<128, 128, TOT>(a, zdim, s);
}
#endif
