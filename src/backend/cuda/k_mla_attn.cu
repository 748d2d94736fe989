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
#include "k_mla_tile.cuh"

#define D DI_CUK_MLA_D
#define DR DI_CUK_MLA_R
#define KT 32          /* keys per shared-memory tile */
#define SROW (D + 8)   /* padded row (1168 B = 73 x 16 B: ldmatrix rows land in distinct banks) */
#define SSTR (KT + 4)  /* score tile row stride (floats) */

template <int RG>
static __global__ void __launch_bounds__(RG * 128)
mla_attn_kernel(const bf16 *Q, const bf16 *cache, const int32_t *bt, int bt_stride,
                const int32_t *positions, int H, float scale_log2, const di_cuk_attn_item *items,
                const int32_t *n_items, bf16 *out, float *part_o, float *part_lse) {
  DI_PDL_ENTRY();
  if ((int)blockIdx.x >= *n_items) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int BM = RG * 16;
  bf16 *sQ = (bf16 *)smem_raw;                 /* [BM][SROW] */
  bf16 *sK = sQ + BM * SROW;                   /* [2][KT][SROW] */
  float *sS = (float *)(sK + 2 * KT * SROW);   /* [BM][SSTR] */
  int *sPos = (int *)(sS + BM * SSTR);         /* [BM] */

  const di_cuk_attn_item it = items[blockIdx.x];
  const int nrows = it.row1 - it.row0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = warp >> 2, wq = warp & 3;       /* row group, quarter */
  const int32_t *btab = bt + (int64_t)it.seq * bt_stride;

  for (int r = tid; r < BM; r += blockDim.x)
    sPos[r] = r < nrows ? positions[(it.row0 + r) / H] : -1;
  /* Q tile */
  for (int c = tid; c < BM * (D / 8); c += blockDim.x) {
    int r = c / (D / 8), col = (c % (D / 8)) * 8;
    bool ok = r < nrows;
    const bf16 *src = Q + (int64_t)(ok ? it.row0 + r : it.row0) * D + col;
    di_cp_async16(sQ + r * SROW + col, src, ok);
  }
  auto load_kv = [&](int buf, int kb) {
    bf16 *dst = sK + buf * KT * SROW;
    for (int c = tid; c < KT * (D / 8); c += blockDim.x) {
      int r = c / (D / 8), col = (c % (D / 8)) * 8;
      int k = kb + r;
      bool ok = k < it.k1;
      int64_t crow = ok ? (int64_t)btab[k / 64] * 64 + (k % 64) : 0;
      di_cp_async16(dst + r * SROW + col, cache + crow * D + col, ok);
    }
  };
  load_kv(0, it.k0);
  di_cp_commit();

  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int rA = g * 16 + (lane >> 2); /* this thread's rows rA, rA + 8 in the tile */

  const int ntiles = (it.k1 - it.k0 + KT - 1) / KT;
  for (int j = 0; j < ntiles; j++) {
    const int kb = it.k0 + j * KT;
    di_cp_wait<0>();
    __syncthreads(); /* tile j landed for everyone; everyone is done with tile j-1's buffer */
    if (j + 1 < ntiles) load_kv((j + 1) & 1, kb + KT);
    di_cp_commit();
    const bf16 *K = sK + (j & 1) * KT * SROW;

    /* S[16 rows of group g][8 keys of quarter wq] = Q . K^T over 576 dims */
    float sacc[4];
    di_qk_slice(sQ + (g * 16 + (lane & 15)) * SROW + (lane >> 4) * 8, K + (wq * 8 + (lane & 7)) * SROW + (lane >> 3) * 8,
                sacc);
    {
      int kc = wq * 8 + (lane & 3) * 2;
      int p0 = sPos[rA], p1 = sPos[rA + 8];
      int ka = kb + kc, kb1 = kb + kc + 1;
      sS[rA * SSTR + kc] = (ka <= p0 && ka < it.k1) ? sacc[0] * scale_log2 : -INFINITY;
      sS[rA * SSTR + kc + 1] = (kb1 <= p0 && kb1 < it.k1) ? sacc[1] * scale_log2 : -INFINITY;
      sS[(rA + 8) * SSTR + kc] = (ka <= p1 && ka < it.k1) ? sacc[2] * scale_log2 : -INFINITY;
      sS[(rA + 8) * SSTR + kc + 1] = (kb1 <= p1 && kb1 < it.k1) ? sacc[3] * scale_log2 : -INFINITY;
    }
    __syncthreads();

    /* online softmax on this thread's slice of rows rA, rA+8 (keys (lane%4)*2 + {0,1} + {0,8,16,24}) */
    float s0[8], s1[8];
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int kc = q * 8 + (lane & 3) * 2;
      s0[2 * q] = sS[rA * SSTR + kc]; s0[2 * q + 1] = sS[rA * SSTR + kc + 1];
      s1[2 * q] = sS[(rA + 8) * SSTR + kc]; s1[2 * q + 1] = sS[(rA + 8) * SSTR + kc + 1];
    }
    float al0, al1;
    di_online_softmax2<8>(s0, s1, m0, m1, l0, l1, al0, al1);
#pragma unroll
    for (int i = 0; i < 16; i++) { o[i][0] *= al0; o[i][1] *= al0; o[i][2] *= al1; o[i][3] *= al1; }
    /* P as A fragments: k-step ks covers keys ks*16 .. +15 */
    uint32_t pa[2][4];
#pragma unroll
    for (int ks = 0; ks < 2; ks++) di_p_fragment(s0, s1, ks, pa[ks]);
    /* O[16 rows][128 cols of quarter wq] += P . V, V = K tile's first 512 columns */
#pragma unroll
    for (int ks = 0; ks < 2; ks++) {
      const int mi = lane >> 3;
      const bf16 *vrow = K + (ks * 16 + (mi & 1) * 8 + (lane & 7)) * SROW + wq * 128 + (mi >> 1) * 8;
#pragma unroll
      for (int nt = 0; nt < 16; nt += 2) {
        uint32_t b[4];
        di_ldsm_x4_t(b, vrow + nt * 8);
        di_mma16816(o[nt], pa[ks], b);
        di_mma16816(o[nt + 1], pa[ks], b + 2);
      }
    }
  }
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

static size_t attn_smem(int rg) {
  return (size_t)rg * 16 * SROW * 2 + 2 * KT * SROW * 2 + (size_t)rg * 16 * SSTR * 4 + rg * 16 * 4;
}

extern "C" di_status di_cuk_mla_attn(const uint16_t *Q, const uint16_t *cache,
                                     const int32_t *block_tables, int bt_stride,
                                     const int32_t *positions, int H, float scale,
                                     const di_cuk_attn_item *items, const int32_t *n_items,
                                     int max_items, int rows_per_cta, uint16_t *out, float *part_o,
                                     float *part_lse, di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  const float sl2 = scale * 1.4426950408889634f;
  if (rows_per_cta == 64) {
    size_t sm = attn_smem(4);
    static int attr_set4;
    if (!attr_set4) {
      DI_CU(cudaFuncSetAttribute(mla_attn_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      attr_set4 = 1;
    }
    DI_CU(di_launch(mla_attn_kernel<4>, max_items, 512, sm, s, (const bf16 *)Q, (const bf16 *)cache, block_tables,
                    bt_stride, positions, H, sl2, items, n_items, (bf16 *)out, part_o, part_lse));
  } else if (rows_per_cta == 16) {
    size_t sm = attn_smem(1);
    static int attr_set1;
    if (!attr_set1) {
      DI_CU(cudaFuncSetAttribute(mla_attn_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      attr_set1 = 1;
    }
    DI_CU(di_launch(mla_attn_kernel<1>, max_items, 128, sm, s, (const bf16 *)Q, (const bf16 *)cache, block_tables,
                    bt_stride, positions, H, sl2, items, n_items, (bf16 *)out, part_o, part_lse));
  } else {
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn rows_per_cta %d (16 or 64)", rows_per_cta);
  }
  DI_CU_LAUNCH("mla_attn");
  return DI_OK;
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
