/* The 32-key tile loop of the MLA attention kernels that keep 16-row groups of 4 warps (FlashMLA-style,
 * mma.sync m16n8k16): k_mla_attn.cu (prefill and split decode items) and k_mla_fixed.cu (the
 * batch-invariant fixed key split). Both run a tile through di_mla32_tile, so their per-tile arithmetic
 * is one piece of code: the fixed-split kernel only adds where a split ends and how partials merge.
 * Layout: a row group g of 16 query rows is served by warps 4g .. 4g + 3; warp quarter wq owns keys
 * 8wq .. 8wq + 7 of the score tile and output columns 128wq .. 128wq + 127; a thread holds rows rA and
 * rA + 8 of its group (rA = 16g + lane / 4). The score tile goes through shared memory because the
 * softmax of a row needs all 32 keys while each warp computed only 8 of them. Keys come from the paged
 * cache (64-token blocks, block table btab) by cp.async into two alternating buffers: tile j + 1 is
 * loaded while tile j is used (from the FP8 pool, KV8 = 1, the chunks are dequantized to bf16 as they are
 * staged, k_kv8.cuh: with 128 or 256 threads loaded into registers before tile j's arithmetic and stored
 * after it, di_mla32_kv8_stage; with 512, and the first tile, a plain load and store). A key past the
 * row's position or past the item's end k1 scores -inf, so a tile past a row's position is an exact no-op
 * of the online softmax. */
#ifndef DI_K_MLA_TILE32_CUH
#define DI_K_MLA_TILE32_CUH
#include "k_mla_tile.cuh"
#include "k_kv8.cuh"

#define DI_MLA32_KT DI_CUK_ATTN_KTILE    /* keys per shared-memory tile (32) */
#define DI_MLA32_SROW (DI_CUK_MLA_D + 8) /* padded row (1168 B = 73 x 16 B: ldmatrix rows in distinct banks) */
#define DI_MLA32_SSTR (DI_MLA32_KT + 4)  /* score tile row stride (floats) */
static_assert(DI_MLA32_KT == 32, "di_mla32_tile's fragments assume 32-key tiles");

/* Shared memory of a CTA of rg row groups: Q tile [16rg][SROW], two key tiles [2][KT][SROW], the score
 * tile [16rg][SSTR] (f32) and the rows' positions [16rg]. */
static inline size_t di_mla32_smem(int rg) {
  return (size_t)rg * 16 * DI_MLA32_SROW * 2 + 2 * DI_MLA32_KT * DI_MLA32_SROW * 2 +
         (size_t)rg * 16 * DI_MLA32_SSTR * 4 + rg * 16 * 4;
}

struct di_mla32_bufs {
  bf16 *sQ, *sK;
  float *sS;
  int *sPos;
};
static __device__ __forceinline__ di_mla32_bufs di_mla32_carve(unsigned char *raw, int BM) {
  di_mla32_bufs b;
  b.sQ = (bf16 *)raw;
  b.sK = b.sQ + BM * DI_MLA32_SROW;
  b.sS = (float *)(b.sK + 2 * DI_MLA32_KT * DI_MLA32_SROW);
  b.sPos = (int *)(b.sS + BM * DI_MLA32_SSTR);
  return b;
}

/* Keys kb .. kb + KT - 1 (zero-filled from k1 on) into key buffer dst, by all nthreads threads. From the
 * bf16 pool with NT = 128 or 256 threads (the caller fixes them): thread t copies row t / (NT / 32), its
 * 16-byte chunks t % (NT / 32) + (NT / 32) i, so the row's cache address is looked up once and the copies
 * step by constants (a division and a block-table lookup per chunk were ~45% of the decode kernel's
 * instructions in ncu, session 13); the same bytes land in the same places either way. */
template <int KV8, int NT = 0>
static __device__ __forceinline__ void di_mla32_load_kv(bf16 *dst, const void *cache, const int32_t *btab, int kb,
                                                        int k1, int tid, int nthreads) {
  const int D = DI_CUK_MLA_D;
  if constexpr (!KV8 && (NT == 128 || NT == 256)) {
    constexpr int TPR = NT == 256 ? 8 : 4, NCH = (DI_CUK_MLA_D / 8) / TPR;
    static_assert(DI_MLA32_KT * TPR == NT && NCH * TPR == DI_CUK_MLA_D / 8, "a key row per TPR threads");
    const int r = tid / TPR, cc = tid % TPR, k = kb + r;
    const bool ok = k < k1;
    const int64_t crow = ok ? (int64_t)btab[k >> 6] * 64 + (k & 63) : 0;
    const bf16 *src = (const bf16 *)cache + crow * D + cc * 8;
    bf16 *d = dst + r * DI_MLA32_SROW + cc * 8;
#pragma unroll
    for (int i = 0; i < NCH; i++) di_cp_async16(d + i * TPR * 8, src + i * TPR * 8, ok);
  } else {
    for (int c = tid; c < DI_MLA32_KT * (D / 8); c += nthreads) {
      int r = c / (D / 8), col = (c % (D / 8)) * 8;
      int k = kb + r;
      bool ok = k < k1;
      int64_t crow = ok ? (int64_t)btab[k / 64] * 64 + (k % 64) : 0;
      di_kv_stage16<KV8>(dst + r * DI_MLA32_SROW + col, di_kv_row(cache, KV8, crow), col, ok);
    }
  }
}

/* KV8 with NT = 128 or 256 threads: the next key tile held in registers across the current tile's arithmetic
 * (loaded before it, stored dequantized after it, as cp.async runs ahead for bf16). Thread -> row tid / TPR
 * of the tile, chunks q + TPR i (q = tid % TPR): latent chunks i < NL (group i / (16 / TPR)), rope after. */
template <int NT>
struct di_mla32_kv8_stage {
  static constexpr int TPR = NT / 32, NL = 64 / TPR, NP = 8 / TPR;
  uint2 q[NL];
  uint4 pe[NP];
  float s[4];
  bool ok;
  __device__ __forceinline__ void fetch(const void *cache, const int32_t *btab, int kb, int k1, int tid) {
    const int r = tid / TPR, qq = tid % TPR, k = kb + r;
    ok = k < k1;
    if (!ok) return;
    const unsigned char *row = di_kv_row(cache, 1, (int64_t)btab[k / 64] * 64 + (k % 64));
#pragma unroll
    for (int i = 0; i < NL; i++) q[i] = __ldg((const uint2 *)(row + DI_CUK_KV8_LAT + (qq + TPR * i) * 8));
#pragma unroll
    for (int g = 0; g < 4; g++) s[g] = __ldg((const float *)(row + DI_CUK_KV8_SCALES) + g);
#pragma unroll
    for (int i = 0; i < NP; i++) pe[i] = __ldg((const uint4 *)(row + DI_CUK_KV8_PE + (qq + TPR * i) * 16));
  }
  __device__ __forceinline__ void put(bf16 *buf, int tid) const {
    const int r = tid / TPR, qq = tid % TPR;
    bf16 *dst = buf + r * DI_MLA32_SROW + qq * 8;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < NL; i++) *(uint4 *)(dst + TPR * i * 8) = ok ? di_kv8_dequant8(q[i], s[i / (16 / TPR)]) : z;
#pragma unroll
    for (int i = 0; i < NP; i++) *(uint4 *)(dst + DI_CUK_MLA_R + TPR * i * 8) = ok ? pe[i] : z;
  }
};

/* The item's rows row0 .. row0 + nrows - 1 (token x head; a token's position at row / H): positions
 * into sPos (-1 past nrows), the Q rows into sQ (zeros past nrows), then the first key tile at k0; one
 * cp.async group, which the first di_mla32_tile waits for. */
template <int KV8>
static __device__ __forceinline__ void di_mla32_begin(const di_mla32_bufs &sb, int BM, const bf16 *Q,
                                                      const int32_t *positions, int H, int row0, int nrows,
                                                      const void *cache, const int32_t *btab, int k0, int k1,
                                                      int tid, int nthreads) {
  const int D = DI_CUK_MLA_D;
  for (int r = tid; r < BM; r += nthreads) sb.sPos[r] = r < nrows ? positions[(row0 + r) / H] : -1;
  for (int c = tid; c < BM * (D / 8); c += nthreads) {
    int r = c / (D / 8), col = (c % (D / 8)) * 8;
    bool ok = r < nrows;
    di_cp_async16(sb.sQ + r * DI_MLA32_SROW + col, Q + (int64_t)(ok ? row0 + r : row0) * D + col, ok);
  }
  di_mla32_load_kv<KV8>(sb.sK, cache, btab, k0, k1, tid, nthreads);
  di_cp_commit();
}

/* The masked scores of a warp's S[16 rows][8 keys of quarter wq] slice (sacc, its accumulator fragment:
 * rows rA, rA + 8) into the score tile sS, in log2 units; a key past the row's position or past the
 * item's end k1 scores -inf. */
static __device__ __forceinline__ void di_mla32_put_scores(float *sS, const int *sPos, const float (&sacc)[4], int rA,
                                                           int wq, int lane, int kb, int k1, float scale_log2) {
  const int SSTR = DI_MLA32_SSTR;
  int kc = wq * 8 + (lane & 3) * 2;
  int p0 = sPos[rA], p1 = sPos[rA + 8];
  int ka = kb + kc, kb1 = kb + kc + 1;
  sS[rA * SSTR + kc] = (ka <= p0 && ka < k1) ? sacc[0] * scale_log2 : -INFINITY;
  sS[rA * SSTR + kc + 1] = (kb1 <= p0 && kb1 < k1) ? sacc[1] * scale_log2 : -INFINITY;
  sS[(rA + 8) * SSTR + kc] = (ka <= p1 && ka < k1) ? sacc[2] * scale_log2 : -INFINITY;
  sS[(rA + 8) * SSTR + kc + 1] = (kb1 <= p1 && kb1 < k1) ? sacc[3] * scale_log2 : -INFINITY;
}

/* The rest of a tile once its score tile sS is complete: the online-softmax step on rows rA, rA + 8 and
 * O[rows][128 columns of quarter wq] += P . V with V = the key tile K's first 512 columns. */
static __device__ __forceinline__ void di_mla32_pv(const bf16 *K, const float *sS, int rA, int wq, int lane,
                                                   float (&o)[16][4], float &m0, float &m1, float &l0, float &l1) {
  const int SROW = DI_MLA32_SROW, SSTR = DI_MLA32_SSTR;
  /* the thread's slice of rows rA, rA + 8: keys (lane % 4) * 2 + {0, 1} + {0, 8, 16, 24} */
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
  /* P as A fragments: k-step ks covers keys 16ks .. 16ks + 15 */
  uint32_t pa[2][4];
#pragma unroll
  for (int ks = 0; ks < 2; ks++) di_p_fragment(s0, s1, ks, pa[ks]);
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

/* Key tile j (keys kb = k0 + 32j ..) of the item: waits for it, starts loading tile j + 1, then this
 * thread's part of S = Q . K^T over 576 dims (masked), the online-softmax step on rows rA, rA + 8 and
 * O[rows][128 columns of quarter wq] += P . V with V = the key tile's first 512 columns. o, m, l: the
 * running state (o unnormalized). Every thread of the CTA calls it (it holds two __syncthreads). */
template <int KV8, int NT = 0>
static __device__ __forceinline__ void di_mla32_tile(const di_mla32_bufs &sb, const void *cache, const int32_t *btab,
                                                     int j, int ntiles, int k0, int k1, float scale_log2, int tid,
                                                     int nthreads, float (&o)[16][4], float &m0, float &m1,
                                                     float &l0, float &l1) {
  const int SROW = DI_MLA32_SROW, KT = DI_MLA32_KT;
  const int lane = tid & 31, warp = tid >> 5;
  const int g = warp >> 2, wq = warp & 3;
  const int rA = g * 16 + (lane >> 2);
  const int kb = k0 + j * KT;
  di_cp_wait<0>();
  __syncthreads(); /* tile j landed for everyone; everyone is done with tile j-1's buffer */
  constexpr bool staged = KV8 && (NT == 128 || NT == 256); /* (NT: the CTA's threads, when the caller fixes them) */
  di_mla32_kv8_stage<staged ? NT : 128> st;
  if (j + 1 < ntiles) {
    if (staged) st.fetch(cache, btab, kb + KT, k1, tid);
    else di_mla32_load_kv<KV8, NT>(sb.sK + ((j + 1) & 1) * KT * SROW, cache, btab, kb + KT, k1, tid, nthreads);
  }
  di_cp_commit();
  const bf16 *K = sb.sK + (j & 1) * KT * SROW;
  float *sS = sb.sS;

  float sacc[4];
  di_qk_slice(sb.sQ + (g * 16 + (lane & 15)) * SROW + (lane >> 4) * 8,
              K + (wq * 8 + (lane & 7)) * SROW + (lane >> 3) * 8, sacc);
  di_mla32_put_scores(sS, sb.sPos, sacc, rA, wq, lane, kb, k1, scale_log2);
  __syncthreads();
  di_mla32_pv(K, sS, rA, wq, lane, o, m0, m1, l0, l1);
  if (staged && j + 1 < ntiles) st.put(sb.sK + ((j + 1) & 1) * KT * SROW, tid); /* (read last in tile j - 1) */
}
#endif
