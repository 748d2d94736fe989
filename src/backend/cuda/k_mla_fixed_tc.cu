/* The fixed-split MLA attention on wgmma (issue 19; DEEPINFER_CUDA_MLA_FIXED_TC): 64 query rows per
 * CTA, bf16 in, f32 accumulate, and the same bits as mla_fixed_kernel (k_mla_fixed.cu) row for row, so
 * the batch-invariant mode may run a prefill chunk here and a decode row there (docs/batch-invariance.md).
 * The arithmetic of a row is that kernel's, step for step:
 * - S = Q . K^T of a 32-key tile as two chains of k16 steps (even steps, odd steps, each from zero, in
 *   k order), added at the end: di_qk_slice's two accumulators. A wgmma k16 step gives the bits of an
 *   mma.sync m16n8k16 step (found on the H200 for the GEMMs, session 9; test_cuda_attn_fixed checks it
 *   here). Warpgroup 0 runs the even chain, warpgroup 1 the odd one, each over all 64 rows x 32 keys
 *   (m64n32k16), so Q and the keys are read from shared memory once per tile;
 * - both chains go through shared memory; every thread adds, scales and masks the same 8 keys of the
 *   same 2 rows as there, so di_online_softmax2 and di_p_fragment run on the same values in the same
 *   registers (the m64nNk16 accumulator and A-fragment layouts are mma.sync's per warp);
 * - O = O * alpha, then P . V as two k16 steps (keys 0-15, 16-31): m64n256k16, P from registers, V
 *   (the key tile's first 512 columns) N-major from shared memory; warpgroup w owns columns 256w ..;
 * - splits end where that kernel's do and merge with its functions (k_mla_fixed.cuh) in split order.
 * The merged state of 64 rows x 512 columns does not fit in registers beside O (64K floats: the whole
 * register file), so between splits it waits in a slot of global memory private to the CTA (128 KB, in
 * the L2): the CTA is persistent (one per SM, items from the longest down) and slot b is CTA b's.
 * Items with part >= 0 (one split) write their partial for di_cuk_mla_combine_fixed instead.
 * The order of the work is FlashAttention-3's inside a warpgroup (not its arithmetic, which stays the
 * CUDA-core kernel's): tile j + 1's S and tile j's P.V are issued together, tile j + 1's softmax runs on
 * the CUDA cores while P.V runs on the tensor cores, then O is rescaled for tile j + 1; each row still
 * sees the same operations on the same values in the same order. The S of an item's last tile is issued
 * and thrown away (ptxas serializes every wgmma of a kernel that branches around one).
 * Shared memory: Q [64][576] and three key tiles [32][576] (tile j for P.V, j + 1 for S, j + 2 loading)
 * in the 128-byte swizzle (64-column blocks of 1024-byte atoms; a key tile serves S K-major and P.V
 * N-major from the same bytes), the two chains' score tiles, the rows' positions. Loads are cp.async, a
 * key row per 8 threads. Not yet: TMA, a producer warp, ping-pong of two consumer groups. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_mla_fixed.cuh"
#include "k_mla_tile.cuh"
#include "k_tc_sm90.cuh"

#define DR DI_CUK_MLA_R
#define D DI_CUK_MLA_D
#define KT DI_CUK_ATTN_KTILE
#define BM 64
#define NTH 256
#define SSTR (KT + 8) /* score tile row stride: 64-bit accesses of 8 rows x 4 column pairs hit each bank pair twice (the minimum) */
#define NCB (D / 64) /* 64-column (128-byte) blocks of a row */
static_assert(KT == 32 && DR == 512 && D == 576, "the tile shapes below");
static_assert(DI_CUK_ATTN_ROWS == BM, "partial slots hold 64 rows");

#define NKB 3 /* key tile buffers: tile j (P.V), j + 1 (S), j + 2 (loading) */
/* + 1 KB to align the tiles to the 1024-byte swizzle atoms; the score tiles of the even and the odd chain */
static constexpr size_t MT_SMEM = 1024 + (size_t)BM * D * 2 + NKB * (size_t)KT * D * 2 + 2 * (size_t)BM * SSTR * 4 + BM * 4;
static_assert(MT_SMEM <= 227 * 1024, "shared memory per block");

/* The tile layout: 64-column blocks of [rows][128 bytes], the 16-byte chunks of a row XOR-permuted by
 * the row's index within its 8-row (1024-byte) atom, the 128-byte swizzle the tensor cores read: (row
 * r, chunk gc = column / 8) at element (gc / 8) rows 64 + r 64 + ((gc % 8) ^ (r % 8)) 8 */
/* a 128-byte-swizzle matrix descriptor: stride byte offset 1024 (the next 8 rows), leading byte offset
 * lbo (K-major: unused, 1; MN-major: the next 64-element block along N) */
static __device__ __forceinline__ uint64_t mt_desc(const bf16 *p, uint32_t lbo_field) {
  const uint32_t a = tt_smem(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)lbo_field << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* S[64 rows][32 keys] += Q . K^T for one k16 step: both operands K-major from shared memory (the
 * accumulator is always added to, as mma.sync adds to its C: the chains start from registers holding 0) */
static __device__ __forceinline__ void mt_mma_qk(float *d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(1));
}
/* O[64 rows][256 columns] += P . V for one k16 step (16 keys): P from registers (per warp the
 * m16n8k16 A fragment layout), V from shared memory N-major (imm-trans-b = 1) */
static __device__ __forceinline__ void mt_mma_pv(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* keys kb .. kb + 31 (zeros from k1 on) from the paged cache into a key tile: thread t copies row t / 8,
 * 16-byte chunk t % 8 of each of the 9 64-column blocks (8 threads: one row's 128 bytes of a block), so
 * the row's cache address is looked up once and the 9 copies step by constants (the address arithmetic
 * was a quarter of the kernel's instructions when each chunk was placed by a division) */
static __device__ __forceinline__ void mt_load_k(bf16 *dst, const bf16 *cache, const int32_t *btab, int kb, int k1,
                                                 int tid) {
  const int r = tid >> 3, cc = tid & 7, k = kb + r;
  const bool ok = k < k1;
  const int64_t crow = ok ? (int64_t)btab[k >> 6] * 64 + (k & 63) : 0;
  const bf16 *src = cache + crow * D + cc * 8;
  bf16 *d = dst + r * 64 + ((cc ^ (r & 7)) << 3); /* (r, chunk 8 i + cc) at d + i KT 64 */
#pragma unroll
  for (int i = 0; i < NCB; i++) di_cp_async16(d + i * KT * 64, src + i * 64, ok);
}
static_assert(KT * 8 == NTH, "one key row per 8 threads");
/* the item's 64 query rows (rows from nrows on: zeros), the same way (rows t / 8 and t / 8 + 32) */
static __device__ __forceinline__ void mt_load_q(bf16 *sQ, const bf16 *Q, int row0, int nrows, int tid) {
  const int cc = tid & 7;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = (tid >> 3) + 32 * h;
    const bool ok = r < nrows;
    const bf16 *src = Q + (int64_t)(ok ? row0 + r : row0) * D + cc * 8;
    bf16 *d = sQ + r * 64 + ((cc ^ (r & 7)) << 3);
#pragma unroll
    for (int i = 0; i < NCB; i++) di_cp_async16(d + i * BM * 64, src + i * 64, ok);
  }
}

/* registers the compiler must treat as read and written here, so that no access to a wgmma accumulator
 * moves across the wait for it (CUTLASS's warpgroup_fence_operand) */
template <int N> static __device__ __forceinline__ void mt_fence_regs(float *r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* S = Q . K^T of one 32-key tile as di_qk_slice's two chains: warpgroup 0 the even k16 steps, warpgroup
 * 1 the odd ones, each for all 64 rows x 32 keys (Q and K read from shared memory once); issued, not
 * waited for. dq: Q's descriptor + 2 wg (this warpgroup's first step); dk: the key tile's, the same */
static __device__ __forceinline__ void mt_issue_s(float *sacc, uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int q = 0; q < 16; q++) sacc[q] = 0.f;
  mt_fence_regs<16>(sacc);
  wg_fence();
#pragma unroll
  for (int i = 0; i < D / 32; i++) {
    /* k16 step 2i + wg: 64-column block (2i) / 4, 32 bytes further per step inside it (descriptor
     * addresses in 16-byte units: a Q block is BM rows x 128 bytes, a key block KT rows x 128 bytes) */
    const int kk = 2 * i;
    mt_mma_qk(sacc, dq + (uint64_t)((kk >> 2) * (BM * 8) + (kk & 3) * 2), dk + (uint64_t)((kk >> 2) * (KT * 8) + (kk & 3) * 2));
  }
  wg_commit();
}
/* the chain of this warpgroup into its score tile sX [64][SSTR] (accumulator register q: row rA + 8
 * ((q / 2) % 2), key 8 (q / 4) + 2 (lane % 4) + q % 2) */
static __device__ __forceinline__ void mt_store_s(float *sX, const float *sacc, int rA, int lane) {
#pragma unroll
  for (int q = 0; q < 16; q++) sX[(rA + ((q >> 1) & 1) * 8) * SSTR + 8 * (q >> 2) + 2 * (lane & 3) + (q & 1)] = sacc[q];
}

/* the softmax step of the 32-key tile from key kb: rows rA, rA + 8, keys (lane % 4) * 2 + {0, 1} + {0, 8,
 * 16, 24}, as di_mla32_tile reads them; the even chain plus the odd one, scaled and masked as there */
static __device__ __forceinline__ void mt_softmax(const float *sS, int kb, int k1, const int *sPos, int rA, int lane,
                                                  float scale_log2, float *s0, float *s1, float &m0, float &m1,
                                                  float &l0, float &l1, float &al0, float &al1) {
  const float *sE = sS, *sO = sS + BM * SSTR;
  const int p0 = sPos[rA], p1 = sPos[rA + 8];
#pragma unroll
  for (int q = 0; q < 8; q++) {
    const int kc = (q >> 1) * 8 + (lane & 3) * 2 + (q & 1), k = kb + kc;
    float e0 = sE[rA * SSTR + kc], e1 = sE[(rA + 8) * SSTR + kc];
    e0 += sO[rA * SSTR + kc];
    e1 += sO[(rA + 8) * SSTR + kc];
    s0[q] = (k <= p0 && k < k1) ? e0 * scale_log2 : -INFINITY;
    s1[q] = (k <= p1 && k < k1) ? e1 * scale_log2 : -INFINITY;
  }
  di_online_softmax2<8>(s0, s1, m0, m1, l0, l1, al0, al1);
}

static __global__ void __launch_bounds__(NTH, 1)
mla_fixed_tc_kernel(const bf16 *Q, const bf16 *cache, const int32_t *bt, int bt_stride, const int32_t *positions,
                    int H, float scale_log2, int tps, const di_cuk_attn_item *items, const int32_t *n_items, bf16 *out,
                    float *part_o, float *part_lse, float4 *slots) {
  DI_PDL_ENTRY();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  bf16 *sQ = (bf16 *)(smem_raw + ((1024 - (tt_smem(smem_raw) & 1023)) & 1023)), *sK = sQ + BM * D;
  float *sS = (float *)(sK + NKB * KT * D); /* [chain][64][SSTR] */
  int *sPos = (int *)(sS + 2 * BM * SSTR);
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
  const int rA = wq * 16 + (lane >> 2); /* this thread's rows rA, rA + 8 */
  float4 *slot = slots + (size_t)blockIdx.x * (BM * DR / 4);
  /* descriptors: Q's and key buffer b's (K-major, for S; + 2 wg: this warpgroup's first k16 step), and
   * key buffer b's as V (N-major; columns 256 wg .. : 4 wg 64-column blocks of KT x 128 bytes further) */
  const uint64_t dq = mt_desc(sQ, 1) + 2 * wg, dk0 = mt_desc(sK, 1) + 2 * wg;
  const uint64_t dv0 = mt_desc(sK, KT * 128 >> 4) + (uint64_t)(4 * wg * KT * 8);
  const int n = *n_items;
  for (int idx = n - 1 - (int)blockIdx.x; idx >= 0; idx -= (int)gridDim.x) {
    const di_cuk_attn_item it = items[idx];
    const int nrows = it.row1 - it.row0;
    const int32_t *btab = bt + (int64_t)it.seq * bt_stride;
    const int ntiles = (it.k1 - it.k0 + KT - 1) / KT;
    __syncthreads(); /* the previous item is done with every buffer */
    for (int r = tid; r < BM; r += NTH) sPos[r] = r < nrows ? positions[(it.row0 + r) / H] : -1;
    mt_load_q(sQ, Q, it.row0, nrows, tid);
    mt_load_k(sK, cache, btab, it.k0, it.k1, tid);
    di_cp_commit();
    if (ntiles > 1) mt_load_k(sK + KT * D, cache, btab, it.k0 + KT, it.k1, tid);
    di_cp_commit();
    di_cp_wait<1>(); /* Q and tile 0 */
    wg_proxy_fence();
    __syncthreads();
    /* FA3's intra-warpgroup order: tile j + 1's S, then tile j's P.V are issued; tile j + 1's softmax
     * runs on the CUDA cores while P.V runs on the tensor cores; then O is rescaled for tile j + 1. The
     * arithmetic of each row is that of the sequential loop (independent work reordered only) */
    float sacc[16], s0[8], s1[8];
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f, al0, al1;
    float ms0, ms1, ls0, ls1; /* a split's softmax state, kept for its end after the next tile's softmax */
    mt_issue_s(sacc, dq, dk0);
    wg_wait0();
    mt_fence_regs<16>(sacc);
    mt_store_s(sS + wg * BM * SSTR, sacc, rA, lane);
    __syncthreads();
    mt_softmax(sS, it.k0, it.k1, sPos, rA, lane, scale_log2, s0, s1, m0, m1, l0, l1, al0, al1);
    uint32_t pa[2][4];
#pragma unroll
    for (int ks = 0; ks < 2; ks++) di_p_fragment(s0, s1, ks, pa[ks]);

    float o[128];
#pragma unroll
    for (int q = 0; q < 128; q++) o[q] = 0.f; /* (o * al of the first tile: 0 either way) */
    float M0 = -INFINITY, M1 = -INFINITY, W0 = 0.f, W1 = 0.f;
    int b0 = 0; /* key buffer of tile j (tile j + 1 in b0 + 1, j + 2 in b0 + 2, mod NKB) */
    for (int j = 0; j < ntiles; j++) {
      const int b1 = b0 + 1 == NKB ? 0 : b0 + 1, b2 = b1 + 1 == NKB ? 0 : b1 + 1;
      const bool more = j + 1 < ntiles, send = (j + 1) % tps == 0 || !more;
      di_cp_wait<0>();
      wg_proxy_fence();
      /* tile j + 1 landed; everyone is done with tile j - 1 (key buffer b2) and with the score tiles */
      __syncthreads();
      mt_fence_regs<128>(o);
      /* (issued on the last tile too, from tile j's own buffer, and not used: a branch around a wgmma
       * makes ptxas serialize every wgmma of the kernel) */
      mt_issue_s(sacc, dq, dk0 + (uint64_t)((more ? b1 : b0) * (KT * D * 2 / 16)));
      wg_fence();
      /* V N-major: keys 16ks .. (rows of the 1024-byte atoms, stride 1024), columns 256wg .. (blocks 4wg ..,
       * the leading byte offset the next 64-column block, KT rows x 128 bytes) */
#pragma unroll
      for (int ks = 0; ks < 2; ks++) mt_mma_pv(o, pa[ks], dv0 + (uint64_t)(b0 * (KT * D * 2 / 16) + ks * 16 * 8));
      wg_commit();
      if (j + 2 < ntiles) mt_load_k(sK + b2 * KT * D, cache, btab, it.k0 + (j + 2) * KT, it.k1, tid);
      di_cp_commit();
      if (send) { /* tile j ends a split: its state for the end below, a fresh pass from tile j + 1 */
        ms0 = m0; ms1 = m1; ls0 = l0; ls1 = l1;
        m0 = m1 = -INFINITY;
        l0 = l1 = 0.f;
      }
      tt_wait1();
      mt_fence_regs<16>(sacc);
      if (more) { /* tile j + 1's S (the older group), then its softmax, while P.V runs */
        mt_store_s(sS + wg * BM * SSTR, sacc, rA, lane);
        __syncthreads();
        mt_softmax(sS, it.k0 + (j + 1) * KT, it.k1, sPos, rA, lane, scale_log2, s0, s1, m0, m1, l0, l1, al0, al1);
      }
      wg_wait0();
      mt_fence_regs<128>(o);
      b0 = b1;

      if (send) { /* the end of a split: its partial, then a fresh pass */
        const float inv0 = fixed_inv(ls0), inv1 = fixed_inv(ls1);
        const float lse0 = fixed_lse(ms0, ls0), lse1 = fixed_lse(ms1, ls1);
        if (it.part >= 0) { /* an item of one split: the partial goes to the combine kernel */
          float *po = part_o + (int64_t)it.part * DI_CUK_ATTN_ROWS * DR;
#pragma unroll
          for (int i = 0; i < 32; i++) {
            const int col = 256 * wg + 8 * i + (lane & 3) * 2;
            *(float2 *)(po + rA * DR + col) = make_float2(__fmul_rn(o[4 * i], inv0), __fmul_rn(o[4 * i + 1], inv0));
            *(float2 *)(po + (rA + 8) * DR + col) =
                make_float2(__fmul_rn(o[4 * i + 2], inv1), __fmul_rn(o[4 * i + 3], inv1));
          }
          if (wg == 0 && (lane & 3) == 0) {
            float *pl = part_lse + (int64_t)it.part * DI_CUK_ATTN_ROWS;
            pl[rA] = lse0;
            pl[rA + 8] = lse1;
          }
        } else { /* merged into the running state: registers (M, W) and the CTA's slot (A) */
          const bool had0 = M0 != -INFINITY, had1 = M1 != -INFINITY;
          const bool u0 = lse0 != -INFINITY, u1 = lse1 != -INFINITY, last = j + 1 == ntiles;
          float a0 = 0.f, c0 = 0.f, a1 = 0.f, c1 = 0.f;
          if (u0) fixed_merge(M0, W0, lse0, a0, c0);
          if (u1) fixed_merge(M1, W1, lse1, a1, c1);
          const float iw0 = fixed_inv(W0), iw1 = fixed_inv(W1);
#pragma unroll
          for (int i = 0; i < 32; i++) {
            const float4 p = had0 || had1 ? slot[i * NTH + tid] : make_float4(0.f, 0.f, 0.f, 0.f);
            float v0 = had0 ? p.x : 0.f, v1 = had0 ? p.y : 0.f, v2 = had1 ? p.z : 0.f, v3 = had1 ? p.w : 0.f;
            if (u0) {
              v0 = fixed_acc(v0, a0, c0, __fmul_rn(o[4 * i], inv0));
              v1 = fixed_acc(v1, a0, c0, __fmul_rn(o[4 * i + 1], inv0));
            }
            if (u1) {
              v2 = fixed_acc(v2, a1, c1, __fmul_rn(o[4 * i + 2], inv1));
              v3 = fixed_acc(v3, a1, c1, __fmul_rn(o[4 * i + 3], inv1));
            }
            if (last) {
              const int col = 256 * wg + 8 * i + (lane & 3) * 2;
              if (rA < nrows)
                *(__nv_bfloat162 *)(out + (int64_t)(it.row0 + rA) * DR + col) =
                    __floats2bfloat162_rn(__fmul_rn(v0, iw0), __fmul_rn(v1, iw0));
              if (rA + 8 < nrows)
                *(__nv_bfloat162 *)(out + (int64_t)(it.row0 + rA + 8) * DR + col) =
                    __floats2bfloat162_rn(__fmul_rn(v2, iw1), __fmul_rn(v3, iw1));
            } else if (u0 || u1) {
              slot[i * NTH + tid] = make_float4(v0, v1, v2, v3);
            }
          }
        }
#pragma unroll
        for (int q = 0; q < 128; q++) o[q] = 0.f;
      }
      if (more) { /* O for tile j + 1 (x * 1 == x exactly: a factor of 1 is skipped, same bits) */
        if (al0 != 1.f)
#pragma unroll
          for (int i = 0; i < 32; i++) {
            o[4 * i] *= al0;
            o[4 * i + 1] *= al0;
          }
        if (al1 != 1.f)
#pragma unroll
          for (int i = 0; i < 32; i++) {
            o[4 * i + 2] *= al1;
            o[4 * i + 3] *= al1;
          }
#pragma unroll
        for (int ks = 0; ks < 2; ks++) di_p_fragment(s0, s1, ks, pa[ks]);
      }
    }
    di_cp_wait<0>();
  }
}

extern "C" size_t di_cuk_mla_fixed_tc_slot_bytes(void) { return (size_t)tt_sm_count() * BM * DR * sizeof(float); }

extern "C" di_status di_cuk_mla_attn_fixed_tc(const uint16_t *Q, const uint16_t *cache, const int32_t *block_tables,
                                              int bt_stride, const int32_t *positions, int H, float scale, int split,
                                              const di_cuk_attn_item *items, const int32_t *n_items, int max_items,
                                              uint16_t *out, float *part_o, float *part_lse, float *slots,
                                              di_cu_stream s) {
  if (max_items <= 0) return DI_OK;
  if (split < KT || split % KT)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn_fixed_tc split %d (a multiple of %d)", split, KT);
  if (!slots) return di_error_set(DI_ERR_INVALID_ARG, "cuda: mla_attn_fixed_tc without slots");
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(mla_fixed_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MT_SMEM));
    attr_set = 1;
  }
  const int grid = max_items < tt_sm_count() ? max_items : tt_sm_count();
  DI_CU(di_launch(mla_fixed_tc_kernel, grid, NTH, MT_SMEM, (cudaStream_t)s, (const bf16 *)Q, (const bf16 *)cache,
                  block_tables, bt_stride, positions, H, scale * 1.4426950408889634f, split / KT, items, n_items,
                  (bf16 *)out, part_o, part_lse, (float4 *)slots));
  DI_CU_LAUNCH("mla_attn_fixed_tc");
  return DI_OK;
}
