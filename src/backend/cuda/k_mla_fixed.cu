/* MLA attention with a fixed key split (issue 19): the batch-invariant attention. A row's keys 0..pos
 * are cut at multiples of a split size fixed for the process (DI_CUK_ATTN_FIXED_SPLIT = 256 keys unless
 * DEEPINFER_CUDA_ATTN_FIXED names another multiple of 32: never the batch, the chunk or the number of
 * CTAs); each split is one online-softmax pass over 32-key tiles from its start, giving a
 * normalized partial (o_s, lse_s); the partials are merged in split order by one running merge
 * (fixed_merge, k_mla_fixed.cuh). Whether the splits of a row group run in one CTA (merged in registers: prefill
 * chunks, many row groups) or in CTAs of their own (partials through memory, merged by
 * di_cuk_mla_combine_fixed: decode, verify blocks, few row groups), a row gets the same operations on
 * the same values in the same order, so the same bits; which rows share a CTA (16 or 32 rows, tokens of
 * one sequence) never changes a row's arithmetic either (a row's mma results depend on its own row
 * only). Tiles past a row's own position are exact no-ops of the online softmax (scores -inf, weights
 * 0), a split entirely past it has lse = -inf and is skipped by the merge, so a decode row, the same
 * row in a verify block and in a prefill chunk (whose item reaches the chunk's last position) agree.
 * The merge is written with __fmul_rn / __fadd_rn so that the compiler cannot contract it into FMAs
 * differently in the two kernels.
 * The tile loop is k_mla_attn.cu's, one function for both (di_mla32_tile in k_mla_tile32.cuh: mma.sync
 * m16n8k16, a 16-row group per 4 warps, each warp 8 keys of the score tile and 128 of the 512 output
 * columns); a row group of 32 rows keeps a second accumulator (the merged state) in registers, which is why items here hold at most 32 rows.
 * Two kernels here run that loop: mla_fixed_kernel (4 warps a 16-row group) and its decode form
 * mla_fixed_dec_kernel (one 16-row group in 8 warps of two roles, below), which give the same bits; the
 * combine kernel and the decode form's optional own merge share fixed_combine_row.
 * Not the FlashAttention-3 form (wgmma, warp-specialized; that is k_mla_fixed_tc.cu): see docs/NOTES.md, issue 19. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_mla_fixed.cuh"
#include "k_mla_tile32.cuh"

#define DR DI_CUK_MLA_R
#define KT DI_MLA32_KT

static_assert(DI_CUK_ATTN_FIXED_SPLIT % KT == 0, "a split is whole key tiles");

/* The end of a split for a thread of rows rA, rA + 8 and output columns of quarter wq (o, m, l: the
 * split's pass): an item of one split (part >= 0) writes its normalized partial and lse for the combine
 * kernel, else the partial is merged into the running state (A, M, W) in split order; then a fresh pass. */
static __device__ __forceinline__ void fixed_split_end(const di_cuk_attn_item &it, int rA, int wq, int lane,
                                                       float (&o)[16][4], float &m0, float &m1, float &l0, float &l1,
                                                       float (&A)[16][4], float &M0, float &M1, float &W0, float &W1,
                                                       float *part_o, float *part_lse) {
  const float inv0 = fixed_inv(l0), inv1 = fixed_inv(l1);
  const float lse0 = fixed_lse(m0, l0), lse1 = fixed_lse(m1, l1);
  if (it.part >= 0) { /* an item of one split: the partial goes to the combine kernel */
    float *po = part_o + (int64_t)it.part * DI_CUK_ATTN_ROWS * DR;
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      int col = wq * 128 + nt * 8 + (lane & 3) * 2;
      *(float2 *)(po + rA * DR + col) = make_float2(__fmul_rn(o[nt][0], inv0), __fmul_rn(o[nt][1], inv0));
      *(float2 *)(po + (rA + 8) * DR + col) = make_float2(__fmul_rn(o[nt][2], inv1), __fmul_rn(o[nt][3], inv1));
    }
    if (wq == 0 && (lane & 3) == 0) {
      float *pl = part_lse + (int64_t)it.part * DI_CUK_ATTN_ROWS;
      pl[rA] = lse0;
      pl[rA + 8] = lse1;
    }
  } else {
    float a0 = 0.f, c0 = 0.f, a1 = 0.f, c1 = 0.f;
    const bool u0 = lse0 != -INFINITY, u1 = lse1 != -INFINITY;
    if (u0) fixed_merge(M0, W0, lse0, a0, c0);
    if (u1) fixed_merge(M1, W1, lse1, a1, c1);
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      if (u0) {
        A[nt][0] = fixed_acc(A[nt][0], a0, c0, __fmul_rn(o[nt][0], inv0));
        A[nt][1] = fixed_acc(A[nt][1], a0, c0, __fmul_rn(o[nt][1], inv0));
      }
      if (u1) {
        A[nt][2] = fixed_acc(A[nt][2], a1, c1, __fmul_rn(o[nt][2], inv1));
        A[nt][3] = fixed_acc(A[nt][3], a1, c1, __fmul_rn(o[nt][3], inv1));
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  m0 = m1 = -INFINITY;
  l0 = l1 = 0.f;
}

/* The merged state of rows rA, rA + 8 (those below nrows) normalized into the bf16 output. */
static __device__ __forceinline__ void fixed_store_out(const di_cuk_attn_item &it, int nrows, int rA, int wq, int lane,
                                                       const float (&A)[16][4], float W0, float W1, bf16 *out) {
  const float iw0 = fixed_inv(W0), iw1 = fixed_inv(W1);
#pragma unroll
  for (int nt = 0; nt < 16; nt++) {
    int col = wq * 128 + nt * 8 + (lane & 3) * 2;
    if (rA < nrows)
      *(__nv_bfloat162 *)(out + (int64_t)(it.row0 + rA) * DR + col) =
          __floats2bfloat162_rn(__fmul_rn(A[nt][0], iw0), __fmul_rn(A[nt][1], iw0));
    if (rA + 8 < nrows)
      *(__nv_bfloat162 *)(out + (int64_t)(it.row0 + rA + 8) * DR + col) =
          __floats2bfloat162_rn(__fmul_rn(A[nt][2], iw1), __fmul_rn(A[nt][3], iw1));
  }
}

template <int RG, int KV8>
static __global__ void __launch_bounds__(RG * 128)
mla_fixed_kernel(const bf16 *Q, const void *cache, const int32_t *bt, int bt_stride, const int32_t *positions, int H,
                 float scale_log2, int tps, const di_cuk_attn_item *items, const int32_t *n_items, bf16 *out, float *part_o,
                 float *part_lse) {
  DI_PDL_ENTRY();
  if ((int)blockIdx.x >= *n_items) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int BM = RG * 16;
  const di_mla32_bufs sb = di_mla32_carve(smem_raw, BM);
  const di_cuk_attn_item it = items[blockIdx.x];
  const int nrows = it.row1 - it.row0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = warp >> 2, wq = warp & 3; /* row group, quarter */
  const int32_t *btab = bt + (int64_t)it.seq * bt_stride;
  di_mla32_begin<KV8>(sb, BM, Q, positions, H, it.row0, nrows, cache, btab, it.k0, it.k1, tid, blockDim.x);

  float o[16][4], A[16][4];
#pragma unroll
  for (int i = 0; i < 16; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[i][e] = A[i][e] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float M0 = -INFINITY, M1 = -INFINITY, W0 = 0.f, W1 = 0.f;
  const int rA = g * 16 + (lane >> 2); /* this thread's rows rA, rA + 8 in the tile */

  const int ntiles = (it.k1 - it.k0 + KT - 1) / KT;
  for (int j = 0; j < ntiles; j++) {
    di_mla32_tile<KV8, RG * 128>(sb, cache, btab, j, ntiles, it.k0, it.k1, scale_log2, tid, blockDim.x, o, m0, m1, l0, l1);
    if ((j + 1) % tps == 0 || j + 1 == ntiles) /* the end of a split: its partial, then a fresh pass */
      fixed_split_end(it, rA, wq, lane, o, m0, m1, l0, l1, A, M0, M1, W0, W1, part_o, part_lse);
  }
  di_cp_wait<0>();
  if (it.part >= 0) return;
  fixed_store_out(it, nrows, rA, wq, lane, A, W0, W1, out);
}

template <int RG, int KV8>
static di_status launch_fixed(const bf16 *Q, const void *cache, const int32_t *bt, int bt_stride, const int32_t *pos,
                              int H, float sl2, int tps, const di_cuk_attn_item *items, const int32_t *n_items,
                              int max_items, bf16 *out, float *part_o, float *part_lse, cudaStream_t s) {
  const size_t sm = di_mla32_smem(RG);
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(mla_fixed_kernel<RG, KV8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  DI_CU(di_launch(mla_fixed_kernel<RG, KV8>, max_items, RG * 128, sm, s, Q, cache, bt, bt_stride, pos, H, sl2, tps, items,
                  n_items, out, part_o, part_lse));
  DI_CU_LAUNCH("mla_attn_fixed");
  return DI_OK;
}

extern "C" di_status di_cuk_mla_attn_fixed(const uint16_t *Q, const void *cache, int kv_fp8, const int32_t *block_tables,
                                           int bt_stride, const int32_t *positions, int H, float scale, int split,
                                           const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                                           int rows_per_cta, uint16_t *out, float *part_o, float *part_lse,
                                           di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  if (split < KT || split % KT)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn_fixed split %d (a multiple of %d)", split, KT);
  const int tps = split / KT;
  const float sl2 = scale * 1.4426950408889634f;
#define FIXED_CASE(rg, kv8)                                                                                      \
  if (rows_per_cta == 16 * rg && kv_fp8 == kv8)                                                                    \
    return launch_fixed<rg, kv8>((const bf16 *)Q, cache, block_tables, bt_stride, positions, H, sl2, tps, items,   \
                                 n_items, max_items, (bf16 *)out, part_o, part_lse, (cudaStream_t)s);
  FIXED_CASE(2, 0) FIXED_CASE(1, 0) FIXED_CASE(2, 1) FIXED_CASE(1, 1)
#undef FIXED_CASE
  return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn_fixed rows_per_cta %d (16 or 32)", rows_per_cta);
}

/* Row r of a row group: its partials in slots part0 .. part0 + nsplit - 1 merged in split order (fixed_merge)
 * into out_row (bf16); this thread owns the NC column pairs col0 + cstep i, + 1. One function for the combine
 * kernel and the decode form's own merge, so the two give the same bits. The partials are read through the L2
 * (__ldcg: in the decode form's merge other CTAs of the same kernel wrote them). */
template <int NC>
static __device__ __forceinline__ void fixed_combine_row(const float *part_o, const float *part_lse, int part0,
                                                         int nsplit, int r, int col0, int cstep, bf16 *out_row) {
  float acc[NC][2];
#pragma unroll
  for (int i = 0; i < NC; i++) acc[i][0] = acc[i][1] = 0.f;
  float M = -INFINITY, W = 0.f;
  for (int sp = 0; sp < nsplit; sp++) {
    const float lse = __ldcg(part_lse + (int64_t)(part0 + sp) * DI_CUK_ATTN_ROWS + r);
    if (lse == -INFINITY) continue;
    float a, c;
    fixed_merge(M, W, lse, a, c);
    const float *po = part_o + ((int64_t)(part0 + sp) * DI_CUK_ATTN_ROWS + r) * DR;
#pragma unroll
    for (int i = 0; i < NC; i++) {
      const float2 v = __ldcg((const float2 *)(po + col0 + i * cstep));
      acc[i][0] = fixed_acc(acc[i][0], a, c, v.x);
      acc[i][1] = fixed_acc(acc[i][1], a, c, v.y);
    }
  }
  const float inv = fixed_inv(W);
#pragma unroll
  for (int i = 0; i < NC; i++)
    *(__nv_bfloat162 *)(out_row + col0 + i * cstep) =
        __floats2bfloat162_rn(__fmul_rn(acc[i][0], inv), __fmul_rn(acc[i][1], inv));
}

/* The decode form (di_cuk_mla_attn_fixed_dec): one 16-row group per CTA of 8 warps in two roles, so that
 * a tile's score chain and the previous tile's softmax and P.V run at once instead of one after the
 * other (at decode a split's 8 tiles are a serial chain in a CTA of its own, most SMs idle). Warps 4..7
 * (scorers, quarter wq = warp - 4) hold their Q fragments in registers (di_qk_slice_qreg: di_qk_slice's
 * chains on the same values) and write the masked scores of tile t into score buffer t % 2; warps 0..3
 * (quarter wq = warp) run di_mla32_pv on tile t - 1 and the split ends, exactly as mla_fixed_kernel's warps
 * of row group 0 do (the same o / m / l / A registers, the same order), so every row gets that kernel's
 * bits. Key tiles rotate through AH + 2 buffers (tiles t + 1 .. t + AH loading while the scorers read t and
 * the others t - 1; AH = 1 or 2, the caller's `ahead`); all 256 threads load, and one named barrier a step orders the roles (the two roles pass it from
 * different places in the code, which bar.sync allows and __syncthreads does not promise). */
#define DEC_THREADS 256
/* AH: key tiles loaded ahead (1 or 2), in AH + 2 rotating buffers */
static size_t dec_smem(int ah) {
  return (size_t)16 * DI_MLA32_SROW * 2 + (size_t)(ah + 2) * KT * DI_MLA32_SROW * 2 + 2 * 16 * DI_MLA32_SSTR * 4 + 16 * 4;
}
static __device__ __forceinline__ void dec_bar(void) { asm volatile("bar.sync 1, %0;\n" ::"n"(DEC_THREADS) : "memory"); }

/* the step's wait: this thread's loads of tile t landed (those of t + 1 may still run), then the barrier;
 * then the load of tile t + AH */
template <int AH>
static __device__ __forceinline__ void dec_step(bf16 *sK, const void *cache, const int32_t *btab, int t, int ntiles,
                                                int k0, int k1, int tid) {
  di_cp_wait<AH - 1>();
  dec_bar();
  if (t + AH < ntiles)
    di_mla32_load_kv<0, DEC_THREADS>(sK + ((t + AH) % (AH + 2)) * KT * DI_MLA32_SROW, cache, btab, k0 + (t + AH) * KT,
                                     k1, tid, DEC_THREADS);
  di_cp_commit();
}

template <int AH>
static __global__ void __launch_bounds__(DEC_THREADS, 1)
mla_fixed_dec_kernel(const bf16 *Q, const void *cache, const int32_t *bt, int bt_stride, const int32_t *positions,
                     int H, float scale_log2, int tps, const di_cuk_attn_item *items, const int32_t *n_items, bf16 *out,
                     float *part_o, float *part_lse, int32_t *counters) {
  DI_PDL_ENTRY();
  if ((int)blockIdx.x >= *n_items) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  di_mla32_bufs sb;
  sb.sQ = (bf16 *)smem_raw;
  sb.sK = sb.sQ + 16 * DI_MLA32_SROW;
  constexpr int NB = AH + 2;
  sb.sS = (float *)(sb.sK + NB * KT * DI_MLA32_SROW); /* [2][16][SSTR] */
  sb.sPos = (int *)(sb.sS + 2 * 16 * DI_MLA32_SSTR);
  const di_cuk_attn_item it = items[blockIdx.x];
  const int nrows = it.row1 - it.row0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wq = warp & 3;
  const int rA = lane >> 2; /* this thread's rows rA, rA + 8 */
  const int32_t *btab = bt + (int64_t)it.seq * bt_stride;
  di_mla32_begin<0>(sb, 16, Q, positions, H, it.row0, nrows, cache, btab, it.k0, it.k1, tid, DEC_THREADS);
  const int ntiles = (it.k1 - it.k0 + KT - 1) / KT;
  if (AH == 2) { /* tile 1 in flight too before the first step */
    if (1 < ntiles) di_mla32_load_kv<0, DEC_THREADS>(sb.sK + KT * DI_MLA32_SROW, cache, btab, it.k0 + KT, it.k1, tid, DEC_THREADS);
    di_cp_commit();
  }
  const int SROW = DI_MLA32_SROW, SBUF = 16 * DI_MLA32_SSTR;

  if (warp >= 4) { /* scorers: tile t at step t */
    uint32_t qa[DI_CUK_MLA_D / 16][4];
    for (int t = 0; t <= ntiles; t++) {
      dec_step<AH>(sb.sK, cache, btab, t, ntiles, it.k0, it.k1, tid);
      if (t == ntiles) break;
      if (t == 0) {
        const bf16 *qrow = sb.sQ + (lane & 15) * SROW + (lane >> 4) * 8;
#pragma unroll
        for (int i = 0; i < DI_CUK_MLA_D / 16; i++) di_ldsm_x4(qa[i], qrow + i * 16);
      }
      const bf16 *K = sb.sK + (t % NB) * KT * SROW;
      float sacc[4];
      di_qk_slice_qreg(qa, K + (wq * 8 + (lane & 7)) * SROW + (lane >> 3) * 8, sacc);
      di_mla32_put_scores(sb.sS + (t & 1) * SBUF, sb.sPos, sacc, rA, wq, lane, it.k0 + t * KT, it.k1, scale_log2);
    }
  } else { /* the others: tile j = t - 1 at step t */
    float o[16][4], A[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) o[i][e] = A[i][e] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float M0 = -INFINITY, M1 = -INFINITY, W0 = 0.f, W1 = 0.f;
    for (int t = 0; t <= ntiles; t++) {
      dec_step<AH>(sb.sK, cache, btab, t, ntiles, it.k0, it.k1, tid);
      if (t == 0) continue;
      const int j = t - 1;
      di_mla32_pv(sb.sK + (j % NB) * KT * SROW, sb.sS + (j & 1) * SBUF, rA, wq, lane, o, m0, m1, l0, l1);
      if ((j + 1) % tps == 0 || j + 1 == ntiles)
        fixed_split_end(it, rA, wq, lane, o, m0, m1, l0, l1, A, M0, M1, W0, W1, part_o, part_lse);
    }
    if (it.part < 0) fixed_store_out(it, nrows, rA, wq, lane, A, W0, W1, out);
  }
  di_cp_wait<0>();
  if (it.part < 0 || !counters) return;
  /* the merge here (counters set; items of one split): the CTA that counts its row group's last split merges
   * all of the group's partials with the combine kernel's arithmetic (16 threads a row), and zeroes the count
   * for the next launch */
  __shared__ int s_last;
  __threadfence(); /* this CTA's partial, visible to the CTA that merges */
  dec_bar();
  const int split = tps * KT, part0 = it.part - it.k0 / split;
  int maxpos = 0; /* the row group's largest position, as di_cuk_attn_fixed_items counted its splits */
  for (int r = 0; r < nrows; r++) maxpos = sb.sPos[r] > maxpos ? sb.sPos[r] : maxpos;
  const int nsplit = maxpos / split + 1;
  if (tid == 0) {
    const int last = atomicAdd(counters + part0, 1) == nsplit - 1;
    if (last) counters[part0] = 0;
    s_last = last;
  }
  dec_bar();
  if (!s_last) return;
  __threadfence(); /* the other splits' partials, read after their count */
  const int r = tid >> 4;
  if (r < nrows)
    fixed_combine_row<16>(part_o, part_lse, part0, nsplit, r, (tid & 15) * 2, 32, out + (int64_t)(it.row0 + r) * DR);
}

template <int AH>
static di_status launch_dec(const bf16 *Q, const void *cache, const int32_t *bt, int bt_stride, const int32_t *pos, int H,
                            float sl2, int tps, const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                            bf16 *out, float *part_o, float *part_lse, int32_t *counters, cudaStream_t s) {
  const size_t sm = dec_smem(AH);
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(mla_fixed_dec_kernel<AH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  DI_CU(di_launch(mla_fixed_dec_kernel<AH>, max_items, DEC_THREADS, sm, s, Q, cache, bt, bt_stride, pos, H, sl2, tps,
                  items, n_items, out, part_o, part_lse, counters));
  DI_CU_LAUNCH("mla_attn_fixed_dec");
  return DI_OK;
}

extern "C" di_status di_cuk_mla_attn_fixed_dec(const uint16_t *Q, const uint16_t *cache, const int32_t *block_tables,
                                               int bt_stride, const int32_t *positions, int H, float scale, int split,
                                               const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                                               int ahead, uint16_t *out, float *part_o, float *part_lse,
                                               int32_t *counters, di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  if (split < KT || split % KT)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn_fixed_dec split %d (a multiple of %d)", split, KT);
  if (ahead != 1 && ahead != 2) return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn_fixed_dec ahead %d (1 or 2)", ahead);
  const float sl2 = scale * 1.4426950408889634f;
  return ahead == 1 ? launch_dec<1>((const bf16 *)Q, cache, block_tables, bt_stride, positions, H, sl2, split / KT, items,
                                    n_items, max_items, (bf16 *)out, part_o, part_lse, counters, (cudaStream_t)s)
                    : launch_dec<2>((const bf16 *)Q, cache, block_tables, bt_stride, positions, H, sl2, split / KT, items,
                                    n_items, max_items, (bf16 *)out, part_o, part_lse, counters, (cudaStream_t)s);
}

/* The partials of a row group's splits merged in split order with fixed_merge: one warp per row, each
 * lane 16 of the 512 columns (the same columns' values the attention kernel would merge in registers). */
#define CMB_ROWS 4
static __global__ void __launch_bounds__(CMB_ROWS * 32)
mla_combine_fixed_kernel(const di_cuk_combine_item *items, const int32_t *n_items, const float *part_o,
                         const float *part_lse, bf16 *out) {
  DI_PDL_ENTRY();
  if ((int)blockIdx.x >= *n_items) return;
  const di_cuk_combine_item it = items[blockIdx.x];
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y * CMB_ROWS + (threadIdx.x >> 5);
  if (r >= it.row1 - it.row0) return;
  fixed_combine_row<DR / 64>(part_o, part_lse, it.part0, it.nsplit, r, lane * 2, 64, out + (int64_t)(it.row0 + r) * DR);
}

extern "C" di_status di_cuk_mla_combine_fixed(const di_cuk_combine_item *items, const int32_t *n_items, int max_items,
                                              const float *part_o, const float *part_lse, uint16_t *out,
                                              di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  DI_CU(di_launch(mla_combine_fixed_kernel, dim3(max_items, DI_CUK_ATTN_ROWS / CMB_ROWS), CMB_ROWS * 32, 0,
                  (cudaStream_t)s, items, n_items, part_o, part_lse, (bf16 *)out));
  DI_CU_LAUNCH("mla_combine_fixed");
  return DI_OK;
}

extern "C" int di_cuk_attn_fixed_items(int r0, int r1, int seq, int maxpos, int kfresh, int split, int separate,
                                       int *part, di_cuk_attn_item *items, di_cuk_combine_item *citems,
                                       int *n_citems) {
  const int nsplit = maxpos / split + 1;
  if (!separate || nsplit == 1) {
    items[0] = (di_cuk_attn_item){r0, r1, seq, 0, maxpos + 1, -1, kfresh};
    return 1;
  }
  citems[(*n_citems)++] = (di_cuk_combine_item){r0, r1, *part, nsplit};
  for (int sp = 0; sp < nsplit; sp++) {
    const int k1 = (sp + 1) * split < maxpos + 1 ? (sp + 1) * split : maxpos + 1;
    items[sp] = (di_cuk_attn_item){r0, r1, seq, sp * split, k1, (*part)++, kfresh};
  }
  return nsplit;
}
