/* The skeleton the mma.sync block-FP8 GEMMs share (k_fp8_gemm.cu: 32-bit fragment loads, padded rows;
 * k_fp8_grouped_mma.cu: 16-byte loads, swizzled rows, permuted K): the e4m3 mma, a tile's activation rows,
 * the expert's weights, the fragments' rows, the cp.async stage ring, and DeepGEMM's per-K-block promotion
 * (this block's fp32 partial sums times activation scale x weight scale into the fp32 accumulator). What
 * differs between the two kernels (shared-memory layout, fragment loads, epilogue) stays in them. */
#ifndef DI_K_FP8_MMA_CUH
#define DI_K_FP8_MMA_CUH
#include "k_fp8_common.cuh"

/* c += a . b, mma.sync m16n8k32 e4m3 x e4m3 -> f32 (fragments as the PTX ISA lays them out) */
static __device__ __forceinline__ void fp8_mma16832(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int MT, int NT> static __device__ __forceinline__ void fp8_frag_zero(float (&f)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int v = 0; v < 4; v++) f[i][j][v] = 0.f;
}

/* srow[r] = the activation row of tile row r (through a_rows when gathered), -1 past the tile; threads tid of nth */
static __device__ __forceinline__ void fp8_tile_srow(int *srow, int bm, const fp8_rows &t, const int32_t *a_rows, int tid,
                                                     int nth) {
  for (int r = tid; r < bm; r += nth) {
    const int m = t.m0 + r;
    srow[r] = m < t.mend ? (a_rows ? a_rows[m] : m) : -1;
  }
}

/* expert e's weight rows and its scale rows (block_rows-high blocks of N rows) */
static __device__ __forceinline__ void fp8_expert_w(const di_cuk_fp8w &w, int N, int e, const uint8_t **We, const float **Se) {
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  *We = w.q + (int64_t)e * N * w.ldq;
  *Se = w.scale + (int64_t)e * sblocks * w.scale_cols;
}

/* the activation rows of this thread's MT accumulator fragments (rows row0 + 16 i + g and + 8; -1: past the tile) */
template <int MT> static __device__ __forceinline__ void fp8_frag_rows(int (&arow)[MT][2], const int *srow, int row0, int g) {
#pragma unroll
  for (int i = 0; i < MT; i++) {
    arow[i][0] = srow[row0 + i * 16 + g];
    arow[i][1] = srow[row0 + i * 16 + g + 8];
  }
}

/* K block kb's scales: of the thread's accumulator columns (scale row offsets srw, -1: none, 0) and rows (arow) */
template <int MT, int NT>
static __device__ __forceinline__ void fp8_block_scales(float (&swc)[NT][2], float (&s_a)[MT][2], const float *Se,
                                                        const int (&srw)[NT][2], const float *sa, int lds,
                                                        const int (&arow)[MT][2], int kb) {
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int v = 0; v < 2; v++) swc[j][v] = srw[j][v] >= 0 ? __ldg(Se + srw[j][v] + kb) : 0.f;
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) s_a[i][h] = arow[i][h] >= 0 ? __ldg(sa + (int64_t)arow[i][h] * lds + kb) : 0.f;
}

/* promotion: acc += tmp x (activation scale of the row x weight scale of the column) */
template <int MT, int NT>
static __device__ __forceinline__ void fp8_promote(float (&acc)[MT][NT][4], const float (&tmp)[MT][NT][4],
                                                   const float (&s_a)[MT][2], const float (&swc)[NT][2]) {
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < NT; j++) {
      acc[i][j][0] = fmaf(tmp[i][j][0], s_a[i][0] * swc[j][0], acc[i][j][0]);
      acc[i][j][1] = fmaf(tmp[i][j][1], s_a[i][0] * swc[j][1], acc[i][j][1]);
      acc[i][j][2] = fmaf(tmp[i][j][2], s_a[i][1] * swc[j][0], acc[i][j][2]);
      acc[i][j][3] = fmaf(tmp[i][j][3], s_a[i][1] * swc[j][1], acc[i][j][3]);
    }
}

/* The cp.async ring of STAGES stages over nk K blocks: load(stage, kb) issues block kb's copies. start() fills
 * the first STAGES - 1; step(kb), at the top of block kb, waits for it (and every thread's reads of the stage
 * about to be refilled), then issues block kb + STAGES - 1. One commit group per block, empty past nk. */
template <int STAGES, typename L> static __device__ __forceinline__ void fp8_ring_start(L &load, int nk) {
#pragma unroll
  for (int st = 0; st < STAGES - 1; st++) {
    if (st < nk) load(st, st);
    di_cp_commit();
  }
}
template <int STAGES, typename L> static __device__ __forceinline__ void fp8_ring_step(L &load, int kb, int nk) {
  di_cp_wait<STAGES - 2>();
  __syncthreads();
  if (kb + STAGES - 1 < nk) load((kb + STAGES - 1) % STAGES, kb + STAGES - 1);
  di_cp_commit();
}

#endif
