/* MLA decode attention for steps of few sequences: the split-KV form of k_mla_attn.cu reorganized for
 * latency. A 16-row item (one token's 16 heads, or several tokens of one sequence) is served by a
 * thread-block cluster of CL CTAs (8, or 16 where the GPU allows non-portable clusters); each CTA
 * takes a balanced run of 64-key tiles, and the CTAs merge their partial results through distributed
 * shared memory (CTA `rank` merging rows rank*16/CL ..), so the split merge needs no second kernel and
 * no fp32 partials through L2. When one cluster covers the row group, the value up-projection W_UV is
 * applied in the same epilogue (each CTA to the rows it merged), which saves the layer another kernel.
 * Why it is shaped this way (Nsight Compute on the 4-warp, 32-key kernel at batch 1: one warp per
 * scheduler issuing every 7 cycles, ~1,200 instructions per warp per tile, 4-6 us per tile):
 * - 8 warps (two per scheduler) and 64-key tiles: warp w scores keys 8w .. 8w+7 of the tile and owns
 *   output columns 64w .. 64w+63, so the instructions per warp per tile stay about the same while a
 *   tile covers twice the keys and the schedulers have a second warp to switch to.
 * - each thread copies 18 fixed 16-byte chunks of one KV row per tile (one block-table lookup, then
 *   constant offsets), where the generic loader spent ~15 instructions of index arithmetic per chunk.
 * - the CTA's KV rows are prefetched into L2 before the kernel waits for its predecessor (the block
 *   table and the cache rows of earlier steps are not written by earlier kernels of the step; the new
 *   token's row is, but a prefetch only warms L2, where that write lands).
 * - from the FP8 pool (KV8 = 1, --kv-cache-dtype fp8) the same chunks are loaded (into registers ahead of
 *   the tile before, as cp.async would run ahead), dequantized to bf16 in
 *   registers and stored (k_kv8.cuh), so the tile loop below runs unchanged on the staged bf16 tile.
 * Tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate) do both products; the online softmax
 * (FlashAttention-2) runs in registers, the score tile goes through shared memory. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_mla_tile.cuh"
#include "k_kv8.cuh"
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define D DI_CUK_MLA_D
#define DR DI_CUK_MLA_R
#define DW 8                     /* warps per CTA */
#define DKT DI_CUK_DECODE_KTILE  /* keys per tile: 8 per warp */
#define DROWS 16                 /* query rows per item */
#define SROW (D + 8)             /* padded smem row (1168 B: ldmatrix rows land in distinct banks) */
#define SSTR (DKT + 4)           /* score tile row stride (floats) */
#define COLS (DR / DW)           /* output columns per warp in P.V */

static_assert(DKT == 8 * DW, "one 8-key score slice per warp");

static size_t decode_smem(void) {
  return (size_t)DROWS * SROW * 2 + 2 * (size_t)DKT * SROW * 2 + (size_t)DROWS * SSTR * 4 + DROWS * 4;
}

/* The value up-projection folded into the epilogue (uv.w != NULL): merged row r of head h becomes
 * v[h] = W_UV[h] . o_lat (W_UV[h]: dv rows of `ld` = kv_lora_rank weights at w + h * stride), written
 * as bf16 at v_out[token * ld_v + h * dv + d]; this saves the decode layer the W_UV kernel. */
typedef struct uv_fold {
  const bf16 *w;
  int64_t stride;
  int ld, dv, ld_v;
  bf16 *v_out;
} uv_fold;

static __device__ __forceinline__ void cluster_arrive(void) {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void cluster_wait(void) {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

template <int CL, int KV8>
static __global__ void __launch_bounds__(DW * 32)
mla_decode_kernel(const bf16 *Q, const void *cache, const int32_t *bt, int bt_stride, const int32_t *positions, int H,
                  float scale_log2, const di_cuk_attn_item *items, const int32_t *n_items, bf16 *out, float *part_o,
                  float *part_lse, uv_fold uv, int preload, int tstride) {
  constexpr int RPC = DROWS / CL; /* rows merged per CTA */
  /* tstride 1: this CTA's keys are the run [k0, k1); CL (batch-invariant form): tiles k0, k0 + CL
   * tiles, ... below k1, so that which keys a CTA sums, and in what order, depends only on the key
   * index, never on the item's length (see di_cuk_attn_cluster_items) */
  const int kstep = DKT * tstride;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const di_cuk_attn_item it = items[blockIdx.x]; /* host-written: readable before the wait */
  const int32_t *btab = bt + (int64_t)it.seq * bt_stride;
  if (uv.w) { /* the W_UV blocks of the rows this CTA will merge (dv x ld, contiguous per head) */
    const int rank0 = (int)cg::this_cluster().block_rank();
    for (int i = 0; i < RPC && rank0 * RPC + i < it.row1 - it.row0; i++) {
      const bf16 *wh = uv.w + (int64_t)((it.row0 + rank0 * RPC + i) % H) * uv.stride;
      for (int c = tid * 64; c < uv.dv * uv.ld; c += DW * 32 * 64) di_prefetch_l2(wh + c);
    }
  }
  for (int i = tid; it.k0 + (i / DKT) * kstep + i % DKT < it.k1; i += DW * 32) {
    const int k = it.k0 + (i / DKT) * kstep + i % DKT;
    const unsigned char *row = di_kv_row(cache, KV8, (int64_t)btab[k / 64] * 64 + (k % 64));
#pragma unroll
    for (int j = 0; j < (KV8 ? 6 : 9); j++) di_prefetch_l2(row + j * 128); /* the row's lines of 128 B */
    if (KV8) di_prefetch_l2(row + DI_CUK_KV8_ROW - 1); /* (656 B rows are not line-aligned: up to 7 lines) */
  }
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16 *sQ = (bf16 *)smem_raw;                   /* [DROWS][SROW] */
  bf16 *sK = sQ + DROWS * SROW;                  /* [2][DKT][SROW] */
  float *sS = (float *)(sK + 2 * DKT * SROW);    /* [DROWS][SSTR] */
  int *sPos = (int *)(sS + DROWS * SSTR);        /* [DROWS] */
  const int nrows = it.row1 - it.row0;
  /* n_items (host-written, like the items) is a multiple of CL: whole clusters leave together */
  const bool live = (int)blockIdx.x < *n_items;
  /* preload: the first KV tile's rows older than the sequence's first token in this step (written by
   * earlier steps, never by this one) are copied into shared memory before the wait; the rows this
   * step's MLA prep writes (keys >= it.kfresh, which for a later row group of a multi-token sequence
   * include positions below the group's own) only after it */
  const int minpos = preload && live ? it.kfresh : 0;
  /* thread -> KV row tid / 4 of the tile, chunks (tid % 4) + 4j, j < 18 (72 chunks of 16 B per row);
   * phase 0 every row, 1 the rows before minpos (before the wait), 2 the others (after it) */
  auto load_kv = [&](int buf, int kb, int phase) {
    const int r = tid >> 2, q = tid & 3, k = kb + r;
    const bool old = k < minpos && k < it.k1;
    if ((phase == 1 && !old) || (phase == 2 && old)) return;
    const bool ok = k < it.k1;
    const unsigned char *src = di_kv_row(cache, KV8, ok ? (int64_t)btab[k / 64] * 64 + (k % 64) : 0);
    bf16 *dst = sK + (buf * DKT + r) * SROW + q * 8;
#pragma unroll
    for (int j = 0; j < D / 32; j++) di_kv_stage16<KV8>(dst + j * 32, src, q * 8 + j * 32, ok);
  };
  /* KV8, tiles after the first: the next tile's codes, scales and rope chunks (this thread's 18 chunks of
   * its row) are loaded into registers before the current tile's arithmetic and stored, dequantized,
   * into their buffer after it, so the load overlaps the arithmetic as cp.async does for bf16 */
  uint2 r8[16];
  uint4 rpe[2];
  float rsc[4];
  bool r_ok = false;
  auto fetch8 = [&](int kb) {
    const int r = tid >> 2, q = tid & 3, k = kb + r;
    r_ok = k < it.k1;
    if (!r_ok) return;
    const unsigned char *src = di_kv_row(cache, 1, (int64_t)btab[k / 64] * 64 + (k % 64));
#pragma unroll
    for (int j = 0; j < 16; j++) r8[j] = __ldg((const uint2 *)(src + DI_CUK_KV8_LAT + q * 8 + j * 32));
#pragma unroll
    for (int g = 0; g < 4; g++) rsc[g] = __ldg((const float *)(src + DI_CUK_KV8_SCALES) + g);
#pragma unroll
    for (int j = 0; j < 2; j++) rpe[j] = __ldg((const uint4 *)(src + DI_CUK_KV8_PE + (q * 8 + j * 32) * 2));
  };
  auto put8 = [&](int buf) { /* chunk j < 16: latent columns q * 8 + 32j (group j / 4); 16, 17: rope */
    const int r = tid >> 2, q = tid & 3;
    bf16 *dst = sK + (buf * DKT + r) * SROW + q * 8;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < 16; j++) *(uint4 *)(dst + j * 32) = r_ok ? di_kv8_dequant8(r8[j], rsc[j / 4]) : z;
#pragma unroll
    for (int j = 0; j < 2; j++) *(uint4 *)(dst + DR + j * 32) = r_ok ? rpe[j] : z;
  };
  const int ntiles = it.k1 > it.k0 ? (it.k1 - it.k0 + kstep - 1) / kstep : 0;
  if (preload && live && ntiles > 0) {
    load_kv(0, it.k0, 1);
    di_cp_commit();
  }
  DI_PDL_ENTRY();
  if (!live) return;
  if (tid < DROWS) sPos[tid] = tid < nrows ? positions[(it.row0 + tid) / H] : -1;
  for (int c = tid; c < DROWS * (D / 8); c += DW * 32) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    const bool ok = r < nrows;
    di_cp_async16(sQ + r * SROW + col, Q + (int64_t)(ok ? it.row0 + r : it.row0) * D + col, ok);
  }
  if (ntiles > 0) load_kv(0, it.k0, preload ? 2 : 0);
  di_cp_commit();

  float o[COLS / 8][4];
#pragma unroll
  for (int i = 0; i < COLS / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int rA = lane >> 2; /* this thread's rows rA, rA + 8 */

  for (int j = 0; j < ntiles; j++) {
    const int kb = it.k0 + j * kstep;
    di_cp_wait<0>();
    __syncthreads(); /* tile j landed for everyone; everyone is done with tile j-1's buffer and scores */
    if (j + 1 < ntiles) {
      if (KV8) fetch8(kb + kstep);
      else load_kv((j + 1) & 1, kb + kstep, 0);
    }
    di_cp_commit();
    const bf16 *K = sK + (j & 1) * DKT * SROW;

    /* S[16 rows][8 keys of warp] = Q . K^T over 576 dims */
    float sacc[4];
    di_qk_slice(sQ + (lane & 15) * SROW + (lane >> 4) * 8, K + (warp * 8 + (lane & 7)) * SROW + (lane >> 3) * 8, sacc);
    {
      const int kc = warp * 8 + (lane & 3) * 2;
      const int p0 = sPos[rA], p1 = sPos[rA + 8];
      const int ka = kb + kc, kb1 = ka + 1;
      sS[rA * SSTR + kc] = (ka <= p0 && ka < it.k1) ? sacc[0] * scale_log2 : -INFINITY;
      sS[rA * SSTR + kc + 1] = (kb1 <= p0 && kb1 < it.k1) ? sacc[1] * scale_log2 : -INFINITY;
      sS[(rA + 8) * SSTR + kc] = (ka <= p1 && ka < it.k1) ? sacc[2] * scale_log2 : -INFINITY;
      sS[(rA + 8) * SSTR + kc + 1] = (kb1 <= p1 && kb1 < it.k1) ? sacc[3] * scale_log2 : -INFINITY;
    }
    __syncthreads();

    /* online softmax over this thread's slice of rows rA, rA + 8: keys 8q + (lane % 4) * 2 + {0, 1} */
    float s0[DKT / 4], s1[DKT / 4];
#pragma unroll
    for (int q = 0; q < DKT / 8; q++) {
      const int kc = q * 8 + (lane & 3) * 2;
      const float2 v0 = *(const float2 *)(sS + rA * SSTR + kc), v1 = *(const float2 *)(sS + (rA + 8) * SSTR + kc);
      s0[2 * q] = v0.x; s0[2 * q + 1] = v0.y;
      s1[2 * q] = v1.x; s1[2 * q + 1] = v1.y;
    }
    float al0, al1;
    di_online_softmax2<DKT / 4>(s0, s1, m0, m1, l0, l1, al0, al1);
#pragma unroll
    for (int i = 0; i < COLS / 8; i++) { o[i][0] *= al0; o[i][1] *= al0; o[i][2] *= al1; o[i][3] *= al1; }

    /* O[16 rows][64 columns of warp] += P . V, V = the tile's first 512 columns; k-step ks: keys 16ks .. */
#pragma unroll
    for (int ks = 0; ks < DKT / 16; ks++) {
      uint32_t pa[4];
      di_p_fragment(s0, s1, ks, pa);
      const int mi = lane >> 3;
      const bf16 *vrow = K + (ks * 16 + (mi & 1) * 8 + (lane & 7)) * SROW + warp * COLS + (mi >> 1) * 8;
#pragma unroll
      for (int nt = 0; nt < COLS / 8; nt += 2) {
        uint32_t b[4];
        di_ldsm_x4_t(b, vrow + nt * 8);
        di_mma16816(o[nt], pa, b);
        di_mma16816(o[nt + 1], pa, b + 2);
      }
    }
    if (KV8 && j + 1 < ntiles) put8((j + 1) & 1); /* (buffer (j+1)&1 was last read in tile j - 1) */
  }
  di_cp_wait<0>();

  /* merge across the cluster: every CTA leaves its normalized partial [16][512] f32 and log-sum-exp
   * [16] in its own shared memory (over the KV tiles, which every warp is past after the barrier);
   * CTA `rank` merges its rows from all CTAs in rank order (the same sum on every run) */
  cg::cluster_group cl = cg::this_cluster();
  float *sO = (float *)sK; /* 32 KB of the 146 KB of tile buffers */
  float *sL = sS;
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  __syncthreads();
#pragma unroll
  for (int nt = 0; nt < COLS / 8; nt++) {
    const int col = warp * COLS + nt * 8 + (lane & 3) * 2;
    *(float2 *)(sO + rA * DR + col) = make_float2(o[nt][0] * inv0, o[nt][1] * inv0);
    *(float2 *)(sO + (rA + 8) * DR + col) = make_float2(o[nt][2] * inv1, o[nt][3] * inv1);
  }
  if (warp == 0 && (lane & 3) == 0) {
    sL[rA] = l0 > 0.f ? m0 + log2f(l0) : -INFINITY;
    sL[rA + 8] = l1 > 0.f ? m1 + log2f(l1) : -INFINITY;
  }
  cl.sync();
  constexpr int PER_ROW = DW * 32 / RPC;       /* threads per merged row */
  constexpr int NC = DR / PER_ROW;             /* columns per thread: 4 (CL 8) or 2 (CL 16) */
  const int rank = (int)cl.block_rank();
  const int r = rank * RPC + tid / PER_ROW, c0 = (tid % PER_ROW) * NC;
  float lse[CL], M = -INFINITY;
#pragma unroll
  for (int p = 0; p < CL; p++) {
    lse[p] = *cl.map_shared_rank(sL + r, p);
    M = fmaxf(M, lse[p]);
  }
  float acc[NC];
#pragma unroll
  for (int i = 0; i < NC; i++) acc[i] = 0.f;
  float wsum = 0.f;
#pragma unroll
  for (int p = 0; p < CL; p++) {
    const float w = lse[p] == -INFINITY ? 0.f : exp2f(lse[p] - M);
    wsum += w;
    const float *src = cl.map_shared_rank(sO + r * DR + c0, p);
    if constexpr (NC == 4) {
      const float4 v = *(const float4 *)src;
      acc[0] += w * v.x; acc[1] += w * v.y; acc[2] += w * v.z; acc[3] += w * v.w;
    } else {
      const float2 v = *(const float2 *)src;
      acc[0] += w * v.x; acc[1] += w * v.y;
    }
  }
  const float winv = wsum > 0.f ? 1.f / wsum : 0.f;
  if (uv.w) { /* host: only when one cluster covers the row group (part < 0) and dv % 16 == 0 */
    float *sM = (float *)sQ; /* [RPC][DR]: the merged rows (Q is done with) */
#pragma unroll
    for (int i = 0; i < NC; i++) sM[(tid / PER_ROW) * DR + c0 + i] = acc[i] * winv;
    cluster_arrive(); /* done reading the other CTAs' shared memory */
    __syncthreads();
    for (int o0 = warp * 16; o0 < RPC * uv.dv; o0 += DW * 16) {
      const int rr = o0 / uv.dv, d0 = o0 % uv.dv, row = rank * RPC + rr;
      if (row >= nrows) continue; /* warp-uniform */
      const int head = (it.row0 + row) % H, tok = (it.row0 + row) / H;
      const bf16 *w = uv.w + (int64_t)head * uv.stride + (int64_t)d0 * uv.ld;
      float a16[16];
#pragma unroll
      for (int i = 0; i < 16; i++) a16[i] = 0.f;
      for (int c = lane * 8; c < uv.ld; c += 256) {
        uint4 wv[16];
#pragma unroll
        for (int i = 0; i < 16; i++) wv[i] = di_ld_stream16(w + (int64_t)i * uv.ld + c);
        const float4 x0 = *(const float4 *)(sM + rr * DR + c), x1 = *(const float4 *)(sM + rr * DR + c + 4);
        const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int i = 0; i < 16; i++) {
          const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&wv[i];
#pragma unroll
          for (int j = 0; j < 4; j++) {
            const float2 f = __bfloat1622float2(wp[j]);
            a16[i] = fmaf(x[2 * j], f.x, fmaf(x[2 * j + 1], f.y, a16[i]));
          }
        }
      }
      const float v = di_warp_sum16(a16, lane);
      if ((lane & 1) == 0) uv.v_out[(int64_t)tok * uv.ld_v + head * uv.dv + d0 + (lane >> 1)] = di_fb(v);
    }
    cluster_wait(); /* no CTA leaves while another may still read its shared memory */
    return;
  }
  if (r < nrows) {
    if (it.part < 0) {
      bf16 *dst = out + (int64_t)(it.row0 + r) * DR + c0;
#pragma unroll
      for (int i = 0; i < NC; i += 2)
        *(__nv_bfloat162 *)(dst + i) = __floats2bfloat162_rn(acc[i] * winv, acc[i + 1] * winv);
    } else { /* one of several clusters over this row group: its merged partial, for mla_combine */
      float *dst = part_o + ((int64_t)it.part * DI_CUK_ATTN_ROWS + r) * DR + c0;
#pragma unroll
      for (int i = 0; i < NC; i += 2) *(float2 *)(dst + i) = make_float2(acc[i] * winv, acc[i + 1] * winv);
      if (tid % PER_ROW == 0)
        part_lse[(int64_t)it.part * DI_CUK_ATTN_ROWS + r] = wsum > 0.f ? M + log2f(wsum) : -INFINITY;
    }
  }
  cl.sync(); /* no CTA leaves while another still reads its shared memory */
}

static int g_attn_preload = 1; /* di_cuk_attn_set_preload */
extern "C" void di_cuk_attn_set_preload(int on) { g_attn_preload = on; }

template <int CL, int KV8>
static di_status launch(int max_items, cudaStream_t s, const bf16 *Q, const void *cache, const int32_t *bt,
                        int bt_stride, const int32_t *positions, int H, float sl2, const di_cuk_attn_item *items,
                        const int32_t *n_items, bf16 *out, float *part_o, float *part_lse, uv_fold uv, int tstride) {
  static int attr_set;
  const size_t sm = decode_smem();
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(mla_decode_kernel<CL, KV8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    if (CL > 8) DI_CU(cudaFuncSetAttribute(mla_decode_kernel<CL, KV8>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    attr_set = 1;
  }
  DI_CU(di_launch_cluster(mla_decode_kernel<CL, KV8>, max_items, DW * 32, sm, s, CL, Q, cache, bt, bt_stride, positions, H,
                          sl2, items, n_items, out, part_o, part_lse, uv, g_attn_preload, tstride));
  DI_CU_LAUNCH("mla_decode");
  return DI_OK;
}

extern "C" di_status di_cuk_mla_attn_cluster(const uint16_t *Q, const void *cache, int kv_fp8, const int32_t *block_tables,
                                             int bt_stride, const int32_t *positions, int H, float scale,
                                             const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                                             int cluster, int strided, uint16_t *out, float *part_o,
                                             float *part_lse, const di_cuk_uv_fold *fold, di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  if ((cluster != 8 && cluster != 16) || max_items % cluster)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla decode attention: clusters of %d CTAs, %d items (8 or 16)",
                        cluster, max_items);
  uv_fold uv = {NULL, 0, 0, 0, 0, NULL};
  if (fold) {
    if (!di_cuk_uv_fold_ok(fold->dv, fold->ld) || ((uintptr_t)fold->w & 15) || fold->stride % 8)
      return di_error_set(DI_ERR_INVALID_ARG, "cuda: W_UV fold with dv %d, rank %d (dv %% 16, rank %% 8, <= %d)",
                          fold->dv, fold->ld, DR);
    uv = (uv_fold){(const bf16 *)fold->w, fold->stride, fold->ld, fold->dv, fold->ld_v, (bf16 *)fold->v_out};
  }
  const float sl2 = scale * 1.4426950408889634f;
  const bf16 *q = (const bf16 *)Q;
  const int tstride = strided ? cluster : 1; /* in key tiles: the CTAs of a cluster deal the tiles in turn */
#define DEC_CASE(cl, kv8)                                                                                         \
  if (cluster == cl && kv_fp8 == kv8)                                                                             \
    return launch<cl, kv8>(max_items, s, q, cache, block_tables, bt_stride, positions, H, sl2, items, n_items,     \
                           (bf16 *)out, part_o, part_lse, uv, tstride);
  DEC_CASE(8, 0) DEC_CASE(16, 0) DEC_CASE(8, 1) DEC_CASE(16, 1)
#undef DEC_CASE
  return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla decode attention: kv_fp8 %d", kv_fp8);
}

extern "C" int di_cuk_uv_fold_ok(int dv, int rank) { return dv > 0 && dv % 16 == 0 && rank > 0 && rank % 8 == 0 && rank <= DR; }

extern "C" int di_cuk_attn_cluster_ok(int cluster) {
  if (cluster == 8) return 1;
  if (cluster != 16) return 0;
  /* 16 CTAs of ~170 KB shared memory in one GPC: ask the occupancy calculator */
  return di_cu_cluster_fits((const void *)mla_decode_kernel<16, 0>, 16, DW * 32, decode_smem());
}

extern "C" int di_cuk_attn_cluster_items(int row0, int row1, int seq, int n_keys, int kfresh, int cluster,
                                         int n_clusters, int strided, int *part, di_cuk_attn_item *items,
                                         di_cuk_combine_item *citems, int *n_citems) {
  if (strided) { /* one cluster; CTA i: tiles i, i + cluster, ... (the kernel steps by the cluster) */
    for (int i = 0; i < cluster; i++) {
      const int k0 = i * DKT < n_keys ? i * DKT : 0, k1 = i * DKT < n_keys ? n_keys : 0;
      items[i] = (di_cuk_attn_item){row0, row1, seq, k0, k1, -1, kfresh};
    }
    return cluster;
  }
  const int n_cta = cluster * n_clusters, nkt = (n_keys + DKT - 1) / DKT;
  if (n_clusters > 1) citems[(*n_citems)++] = (di_cuk_combine_item){row0, row1, *part, n_clusters};
  for (int i = 0; i < n_cta; i++) { /* balanced: CTA i takes tiles [i*nkt/n_cta, (i+1)*nkt/n_cta) */
    const int t0 = (int)((int64_t)i * nkt / n_cta), t1 = (int)((int64_t)(i + 1) * nkt / n_cta);
    int k0 = t0 * DKT, k1 = t1 * DKT;
    if (k1 > n_keys) k1 = n_keys;
    if (k0 >= k1) k0 = k1 = 0; /* an empty split: log-sum-exp -inf, weight 0 in the merge */
    items[i] = (di_cuk_attn_item){row0, row1, seq, k0, k1, n_clusters > 1 ? *part + i / cluster : -1, kfresh};
  }
  if (n_clusters > 1) *part += n_clusters;
  return n_cta;
}
