/* The FP8 expert products of prefill-sized steps on the TMA wgmma core (DEEPINFER_CUDA_FP8_TCG): DeepGEMM's
 * scheme on Hopper's FP8 tensor cores. k_tc_grouped.cu's structure (persistent CTAs over (tile, column
 * block) units, warpgroup 0 producing a ring of stages, two consumer warpgroups of 128 columns each of a
 * 64 x 256 tile) with E4M3 operands: the activations quantized per row per 128 columns
 * (di_cuk_fp8_quant_ws), one stage = one 128-wide K block (128 bytes a row, the 128-byte swizzle), four
 * wgmma m64n128k32 e4m3 steps into a fresh fp32 fragment, then that block's promotion into the fp32
 * accumulator times (activation scale of the row x weight scale of the column), as k_fp8_gemm.cu and
 * k_fp8_grouped_mma.cu do with mma.sync.
 *   - A rows are gathered by the producer's cp.async into the swizzle (as k_tc_grouped.cu), the W rows
 *     come by TMA from a 2-D byte map over every expert's rows (e * N + n) in four 64-row boxes;
 *   - the stage's scales travel with it: the producer copies the 64 rows' activation scales and the 256
 *     weight rows' scales of the K block into the stage's scale area (4-byte cp.async, counted by the
 *     same full barrier), so the consumers read them from shared memory;
 *   - glu: the FP8 experts' gate/up rows are not interleaved ([gate; up], N = 2 I), so the four boxes
 *     are gate rows c0 .. c0+63, their up rows, gate rows c0+64 .., their up rows: consumer c holds 64
 *     gate and the matching 64 up columns and writes silu(gate) * up (bf16) for 64 output columns.
 * Shapes: K % 16 (a partial last K block is zero-filled by the copies and the TMA), 128-wide scale
 * blocks; N % 256 (or I % 128 with glu), since a box past an expert's rows would read the next expert's.
 * Not batch-invariant (the invariant mode never takes it). The tile walk shared with k_tc_grouped.cu (units,
 * barriers, the A rows' swizzled copies) is k_tc_units.cuh. */
#include "k_fp8_common.cuh"
#include "k_tc_units.cuh"
#include "util/switches.h"

#define FG_BM 64
#define FG_BN 256
#define FG_STAGES 5
#define FG_MAX_EXPERTS 1024 /* the W map's row extent (N x this); the tile list names the expert */
#define FG_ST_BYTES (FG_BM * 128 + FG_BN * 128)
#define FG_SC_FLOATS (FG_BN + FG_BM) /* a stage's scales: 256 weight rows, then 64 activation rows */

static __device__ __forceinline__ void fg_cp4(uint32_t dst, const void *src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0) : "memory");
}

/* d (+)= A[64 x 32] . B[128 x 32]^T, E4M3 operands from 128-byte-swizzled K-major shared memory */
static __device__ __forceinline__ void fg_mma(float *d, uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

/* the weight row (within the expert) of B shared row j of a unit: glu boxes alternate gate / up */
static __device__ __forceinline__ int fg_wrow(int j, int n0, int I, int glu) {
  const int box = j >> 6, i = j & 63;
  return glu ? (box & 1 ? I : 0) + n0 + 64 * (box >> 1) + i : n0 + j;
}

static __global__ void __launch_bounds__(384, 1)
    fp8_tcg_kernel(const __grid_constant__ CUtensorMap mw, const uint8_t *Aq, int ldq, const float *sa, int lds,
                   const int32_t *a_rows, di_cuk_fp8w w, int N, int K, const int32_t *off, const int32_t *tiles,
                   const int32_t *n_tiles, int bm, void *C, int ldc, int c_f32, int glu) {
  constexpr int A_BYTES = FG_BM * 128;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (tt_smem(smem_raw) + 1023) & ~1023u;
  const uint32_t scb = base + FG_STAGES * FG_ST_BYTES;           /* the stages' scales */
  const uint32_t bars = scb + FG_STAGES * FG_SC_FLOATS * 4;        /* full[STAGES], then empty[STAGES] */
  const float *scales = (const float *)(smem_raw + (scb - tt_smem(smem_raw)));
  const int wg = threadIdx.x >> 7, I = N / 2, nblk = glu ? I / 128 : N / FG_BN, nk = (K + 127) / 128;
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  tg_bars_init(bars, FG_STAGES);
  __syncthreads();
  DI_PDL_ENTRY();
  const int units = *n_tiles * nblk;
  if (wg == 0) { /* producer */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n"); /* 128 x 56 + 256 x 224 = 384 x 168 */
    const int t = threadIdx.x, cc = t & 7;
    int stage = 0, phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const tg_unit un = tg_unit_at(tiles, off, bm, u, nblk, glu ? 128 : FG_BN);
      const int e = un.e, n0 = un.n0;
      int64_t src[4]; /* this thread's 4 A rows t / 8 + 16 i (chunk t % 8): their activation row, -1 absent */
      tg_src_rows(src, t, un, bm, a_rows, 1);
      const float *Se = w.scale + (int64_t)e * sblocks * w.scale_cols;
      const int sw0 = (fg_wrow(t, n0, I, glu) / w.block_rows) * w.scale_cols,
                sw1 = (fg_wrow(t + 128, n0, I, glu) / w.block_rows) * w.scale_cols;
      for (int kt = 0; kt < nk; kt++) {
        const uint32_t full = bars + 8 * stage, st = base + stage * FG_ST_BYTES, sc = scb + stage * FG_SC_FLOATS * 4;
        tt_bar_wait(bars + 8 * (FG_STAGES + stage), phase ^ 1);
        if (t == 0) {
          tt_bar_expect(full, FG_BN * 128);
#pragma unroll
          for (int b = 0; b < 4; b++) tt_tma3(st + A_BYTES + b * 64 * 128, &mw, kt * 128, e * N + fg_wrow(64 * b, n0, I, glu), 0, full);
        }
        const int k = kt * 128 + cc * 16;
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int r = (t >> 3) + 16 * i;
          const bool p = src[i] >= 0 && k < K;
          tg_cp_row16(st, r, cc, p ? Aq + src[i] * ldq + k : Aq, p);
          if (cc == 0) fg_cp4(sc + (FG_BN + r) * 4, src[i] >= 0 ? sa + src[i] * lds + kt : sa, src[i] >= 0);
        }
        fg_cp4(sc + t * 4, Se + sw0 + kt, true);
        fg_cp4(sc + (t + 128) * 4, Se + sw1 + kt, true);
        tg_cp_arrive(full);
        tg_next<FG_STAGES>(stage, phase);
      }
    }
  } else { /* consumer c: B rows 128 c .. 128 c + 127 of the stage */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    const int c = wg - 1, lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
    const int r0 = wq * 16 + (lane >> 2); /* this thread's tile rows r0 and r0 + 8 */
    int stage = 0, phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const tg_unit un = tg_unit_at(tiles, off, bm, u, nblk, glu ? 128 : FG_BN);
      const int n0 = un.n0, m0 = un.m0, mend = un.mend;
      float acc[64], tmp[64];
#pragma unroll
      for (int q = 0; q < 64; q++) acc[q] = tmp[q] = 0.f;
      for (int kt = 0; kt < nk; kt++) {
        tt_bar_wait(bars + 8 * stage, phase);
        wg_proxy_fence(); /* the gathered rows came through the generic proxy */
        const uint32_t st = base + stage * FG_ST_BYTES, sb = st + A_BYTES + c * 128 * 128;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) fg_mma(tmp, tt_desc(st + kk * 32), tt_desc(sb + kk * 32), kk > 0);
        wg_commit();
        wg_wait0();
        /* promotion: register q is row r0 + 8 ((q / 2) % 2), column 8 (q / 4) + 2 (lane % 4) + q % 2 */
        const float *ssc = scales + stage * FG_SC_FLOATS;
        const float a0 = ssc[FG_BN + r0], a1 = ssc[FG_BN + r0 + 8];
#pragma unroll
        for (int q = 0; q < 64; q += 4) {
          const float2 sw = *(const float2 *)(ssc + c * 128 + (q >> 2) * 8 + (lane & 3) * 2);
          acc[q] = fmaf(tmp[q], a0 * sw.x, acc[q]);
          acc[q + 1] = fmaf(tmp[q + 1], a0 * sw.y, acc[q + 1]);
          acc[q + 2] = fmaf(tmp[q + 2], a1 * sw.x, acc[q + 2]);
          acc[q + 3] = fmaf(tmp[q + 3], a1 * sw.y, acc[q + 3]);
        }
        __syncwarp();
        if (lane == 0) tt_bar_arrive(bars + 8 * (FG_STAGES + stage));
        tg_next<FG_STAGES>(stage, phase);
      }
#pragma unroll
      for (int q = 0; q < 64; q += 2) {
        const int m = m0 + r0 + ((q >> 1) & 1) * 8;
        if (m >= mend) continue;
        if (glu) { /* columns 0-63 of this consumer are gate, 64-127 the same columns' up */
          if (q >= 32) continue;
          const int col = n0 + c * 64 + (q >> 2) * 8 + (lane & 3) * 2;
          const float g0 = acc[q], g1 = acc[q + 1], u0 = acc[q + 32], u1 = acc[q + 33];
          const float v0 = g0 / (1.f + __expf(-g0)) * u0, v1 = g1 / (1.f + __expf(-g1)) * u1;
          *(__nv_bfloat162 *)((bf16 *)C + (int64_t)m * ldc + col) = __floats2bfloat162_rn(v0, v1);
        } else {
          const int col = n0 + c * 128 + (q >> 2) * 8 + (lane & 3) * 2;
          if (c_f32) *(float2 *)((float *)C + (int64_t)m * ldc + col) = make_float2(acc[q], acc[q + 1]);
          else *(__nv_bfloat162 *)((bf16 *)C + (int64_t)m * ldc + col) = __floats2bfloat162_rn(acc[q], acc[q + 1]);
        }
      }
    }
  }
}

/* the 2-D byte map of every expert's rows [E x N][K] (row stride ldq), boxes of 128 bytes x 64 rows */
static di_status fg_map(CUtensorMap *map, const uint8_t *base, int K, int64_t rows, int ldq) {
  const tt_encode_fn enc = tt_encoder();
  if (!enc) return di_error_set(DI_ERR_BACKEND, "cuda: cuTensorMapEncodeTiled not available from the driver");
  const cuuint64_t dims[3] = {(cuuint64_t)K, (cuuint64_t)rows, 1};
  const cuuint64_t strides[2] = {(cuuint64_t)ldq, (cuuint64_t)ldq * (cuuint64_t)rows};
  const cuuint32_t box[3] = {128, 64, 1}, estr[3] = {1, 1, 1};
  const CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, (void *)base, dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return di_error_set(DI_ERR_BACKEND, "cuda: fp8 cuTensorMapEncodeTiled (%lld x %d, ld %d) failed: %d", (long long)rows,
                        K, ldq, (int)r);
  return DI_OK;
}

extern "C" int di_cuk_fp8_tcg_ok(int N, int K, int glu, di_cuk_fp8w w) {
  return w.block_rows > 0 && w.block_cols == 128 && K % 16 == 0 && w.ldq % 16 == 0 && ((uintptr_t)w.q & 15) == 0 &&
         w.scale_cols >= (K + 127) / 128 && (glu ? N % 256 == 0 : N % FG_BN == 0);
}

extern "C" di_status di_cuk_fp8_tcg_grouped(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows,
                                            di_cuk_fp8w w, int N, int K, const int32_t *expert_off,
                                            const int32_t *tiles, const int32_t *n_tiles, int max_tiles, int bm,
                                            void *C, int ldc, int c_f32, int glu, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!di_cuk_fp8_tcg_ok(N, K, glu, w) || ldq % 16 || ((uintptr_t)Aq & 15) || bm < 1 || bm > FG_BM ||
      (glu && c_f32))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fp8 tensor-core grouped GEMM N %d K %d bm %d glu %d (N %% 256, K %% 16, "
                        "128-wide blocks)", N, K, bm, glu);
  const size_t sm = (size_t)FG_STAGES * (FG_ST_BYTES + FG_SC_FLOATS * 4) + 16 * FG_STAGES + 1024;
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(fp8_tcg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  CUtensorMap mw;
  DI_TRY(fg_map(&mw, w.q, K, (int64_t)N * FG_MAX_EXPERTS, w.ldq));
  const int64_t units = (int64_t)max_tiles * (glu ? N / 2 / 128 : N / FG_BN), cap = tt_sm_count();
  DI_CU(di_launch(fp8_tcg_kernel, dim3((unsigned)(units < cap ? units : cap)), 384, sm, s, mw, Aq, ldq, sa, lds, a_rows,
                  w, N, K, expert_off, tiles, n_tiles, bm, C, ldc, c_f32, glu));
  DI_CU_LAUNCH("fp8_tcg");
  return DI_OK;
}
