/* MLA attention over the paged latent cache in the absorbed form (FlashMLA-style). Every head of a
 * token attends to the same cache entries [c_kv | k_pe] (576 bf16), so a CTA takes 16 or 64 query
 * rows (token x head, one sequence) and streams the keys once for all of them: the KV tile is loaded
 * into shared memory once and used by every row, which is what makes MLA decode cheap in bandwidth.
 * Tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate) do both products; a row group of 16 rows
 * is served by 4 warps, each owning 8 keys of the score tile and 128 of the 512 output columns, with
 * the online softmax (FlashAttention-2) kept in registers and the score tile exchanged through
 * shared memory. Long contexts are split over the key range into several work items (part >= 0)
 * whose partial results are merged by mla_combine. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_mla_tile32.cuh"

#define DR DI_CUK_MLA_R

template <int RG, int KV8>
static __global__ void __launch_bounds__(RG * 128)
mla_attn_kernel(const bf16 *Q, const void *cache, const int32_t *bt, int bt_stride,
                const int32_t *positions, int H, float scale_log2, const di_cuk_attn_item *items,
                const int32_t *n_items, bf16 *out, float *part_o, float *part_lse) {
  DI_PDL_ENTRY();
  if ((int)blockIdx.x >= *n_items) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int BM = RG * 16;
  const di_mla32_bufs sb = di_mla32_carve(smem_raw, BM);
  const di_cuk_attn_item it = items[blockIdx.x];
  const int nrows = it.row1 - it.row0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = warp >> 2, wq = warp & 3;       /* row group, quarter */
  const int32_t *btab = bt + (int64_t)it.seq * bt_stride;
  di_mla32_begin<KV8>(sb, BM, Q, positions, H, it.row0, nrows, cache, btab, it.k0, it.k1, tid, blockDim.x);

  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int rA = g * 16 + (lane >> 2); /* this thread's rows rA, rA + 8 in the tile */

  const int ntiles = (it.k1 - it.k0 + DI_MLA32_KT - 1) / DI_MLA32_KT;
  for (int j = 0; j < ntiles; j++)
    di_mla32_tile<KV8, RG * 128>(sb, cache, btab, j, ntiles, it.k0, it.k1, scale_log2, tid, blockDim.x, o, m0, m1, l0, l1);
  di_cp_wait<0>();

  /* epilogue */
  float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  int lr0 = rA, lr1 = rA + 8;
  if (it.part < 0) {
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      int col = wq * 128 + nt * 8 + (lane & 3) * 2;
      if (lr0 < nrows) {
        __nv_bfloat162 v = __floats2bfloat162_rn(o[nt][0] * inv0, o[nt][1] * inv0);
        *(__nv_bfloat162 *)(out + (int64_t)(it.row0 + lr0) * DR + col) = v;
      }
      if (lr1 < nrows) {
        __nv_bfloat162 v = __floats2bfloat162_rn(o[nt][2] * inv1, o[nt][3] * inv1);
        *(__nv_bfloat162 *)(out + (int64_t)(it.row0 + lr1) * DR + col) = v;
      }
    }
  } else {
    float *po = part_o + (int64_t)it.part * DI_CUK_ATTN_ROWS * DR;
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      int col = wq * 128 + nt * 8 + (lane & 3) * 2;
      *(float2 *)(po + lr0 * DR + col) = make_float2(o[nt][0] * inv0, o[nt][1] * inv0);
      *(float2 *)(po + lr1 * DR + col) = make_float2(o[nt][2] * inv1, o[nt][3] * inv1);
    }
    if (wq == 0 && (lane & 3) == 0) {
      float *pl = part_lse + (int64_t)it.part * DI_CUK_ATTN_ROWS;
      pl[lr0] = l0 > 0.f ? m0 + log2f(l0) : -INFINITY;
      pl[lr1] = l1 > 0.f ? m1 + log2f(l1) : -INFINITY;
    }
  }
}

template <int RG, int KV8>
static di_status launch_attn(int max_items, cudaStream_t s, const bf16 *Q, const void *cache, const int32_t *bt,
                             int bt_stride, const int32_t *positions, int H, float sl2, const di_cuk_attn_item *items,
                             const int32_t *n_items, bf16 *out, float *part_o, float *part_lse) {
  const size_t sm = di_mla32_smem(RG);
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(mla_attn_kernel<RG, KV8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  DI_CU(di_launch(mla_attn_kernel<RG, KV8>, max_items, RG * 128, sm, s, Q, cache, bt, bt_stride, positions, H, sl2,
                  items, n_items, out, part_o, part_lse));
  DI_CU_LAUNCH("mla_attn");
  return DI_OK;
}

extern "C" di_status di_cuk_mla_attn(const uint16_t *Q, const void *cache, int kv_fp8,
                                     const int32_t *block_tables, int bt_stride,
                                     const int32_t *positions, int H, float scale,
                                     const di_cuk_attn_item *items, const int32_t *n_items,
                                     int max_items, int rows_per_cta, uint16_t *out, float *part_o,
                                     float *part_lse, di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  const float sl2 = scale * 1.4426950408889634f;
  const bf16 *q = (const bf16 *)Q;
  cudaStream_t st = (cudaStream_t)s;
#define ATTN_CASE(rg, kv8)                                                                                        \
  if (rows_per_cta == 16 * rg && kv_fp8 == kv8)                                                                   \
    return launch_attn<rg, kv8>(max_items, st, q, cache, block_tables, bt_stride, positions, H, sl2, items, n_items, \
                                (bf16 *)out, part_o, part_lse);
  ATTN_CASE(4, 0) ATTN_CASE(1, 0) ATTN_CASE(4, 1) ATTN_CASE(1, 1)
#undef ATTN_CASE
  return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn rows_per_cta %d (16 or 64)", rows_per_cta);
}

/* Merges the split partial results of each row: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M).
 * One warp per row, each lane 16 of the 512 columns; a CTA takes CMB_ROWS rows of an item (grid.y:
 * row groups), so a decode step's 16 heads are merged by 4 CTAs rather than one SM reading every
 * split's partial output. */
#define CMB_ROWS 4
static __global__ void __launch_bounds__(CMB_ROWS * 32)
mla_combine_kernel(const di_cuk_combine_item *items, const int32_t *n_items, const float *part_o,
                   const float *part_lse, bf16 *out) {
  DI_PDL_ENTRY();
  if ((int)blockIdx.x >= *n_items) return;
  const di_cuk_combine_item it = items[blockIdx.x];
  const int lane = threadIdx.x & 31;
  {
    const int r = blockIdx.y * CMB_ROWS + (threadIdx.x >> 5);
    if (r >= it.row1 - it.row0) return;
    float M = -INFINITY;
    for (int sp = lane; sp < it.nsplit; sp += 32)
      M = fmaxf(M, part_lse[(int64_t)(it.part0 + sp) * DI_CUK_ATTN_ROWS + r]);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float acc[DR / 32 / 2][2];
#pragma unroll
    for (int i = 0; i < DR / 64; i++) acc[i][0] = acc[i][1] = 0.f;
    float wsum = 0.f;
    for (int sp = 0; sp < it.nsplit; sp++) {
      float lse = part_lse[(int64_t)(it.part0 + sp) * DI_CUK_ATTN_ROWS + r];
      float w = lse == -INFINITY ? 0.f : exp2f(lse - M);
      wsum += w;
      const float *po = part_o + ((int64_t)(it.part0 + sp) * DI_CUK_ATTN_ROWS + r) * DR;
#pragma unroll
      for (int i = 0; i < DR / 64; i++) {
        float2 v = *(const float2 *)(po + i * 64 + lane * 2);
        acc[i][0] += w * v.x;
        acc[i][1] += w * v.y;
      }
    }
    float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    bf16 *o = out + (int64_t)(it.row0 + r) * DR;
#pragma unroll
    for (int i = 0; i < DR / 64; i++)
      *(__nv_bfloat162 *)(o + i * 64 + lane * 2) = __floats2bfloat162_rn(acc[i][0] * inv, acc[i][1] * inv);
  }
}

extern "C" di_status di_cuk_mla_combine(const di_cuk_combine_item *items, const int32_t *n_items,
                                        int max_items, const float *part_o, const float *part_lse,
                                        uint16_t *out, di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  DI_CU(di_launch(mla_combine_kernel, dim3(max_items, DI_CUK_ATTN_ROWS / CMB_ROWS), CMB_ROWS * 32, 0, s, items, n_items,
                  part_o, part_lse, (bf16 *)out));
  DI_CU_LAUNCH("mla_combine");
  return DI_OK;
}
