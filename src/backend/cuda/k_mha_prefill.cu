/* MLA prefill attention in the non-absorbed (MHA) form (issue 19; DEEPINFER_CUDA_PREFILL_MHA, default
 * mode, prefill-sized steps). The absorbed form (k_mla_attn.cu) scores every query row against the
 * 576-wide latent and accumulates 512 latent columns: 2 x (576 + 512) flops per row and key. Here the
 * keys are up-projected first (the caller: K_nope and V per head = latent . kv_b^T, one GEMM over the
 * sequence's keys), and each head attends over DQK = dn + dr (192 for V2/V3) query/key dims and DV
 * (128) value dims: 2 x (192 + 128) flops, 3.4x fewer, which is what prefill is bound by; the output is
 * the per-head value vector (no W_UV product after it).
 * Form: FlashAttention-2 on mma.sync m16n8k16 (bf16 in, f32 accumulate). A CTA of 4 warps takes 64
 * query rows (tokens t0 .. t1 - 1 of one sequence's run) of one head (blockIdx.x; blockIdx.y: the item,
 * last first); each warp 16 rows,
 * its Q fragments in registers for the whole pass; 64-key tiles of K ([k_nope | k_pe]) and V stream
 * through two shared-memory buffers by cp.async (tile j + 1 loads while tile j is used); the online
 * softmax stays in registers (the 4 lanes of a row combine by shuffles).
 * Causal, and chunk-aware by construction: a row's keys are 0 .. its position, visited in 64-key tiles
 * from key 0 in order whatever the item or chunk; a tile past the row's position is an exact no-op of
 * the online softmax (scores -inf, weights 0, rescale 1), so a row gives the same bits in a chunk that
 * attends to earlier steps' keys as in one whole-prompt pass, given the same K / V values
 * (test_cuda_mha_prefill checks both against float64 and each other bit for bit). */
#include "cuda_common.cuh"
#include "k_mha_prefill.h"
#include "k_kv8.cuh"
#include "k_mla_tile.cuh"

#define MKT 64   /* keys per tile */
#define MROWS 64 /* query rows per CTA */

template <int DQK, int DV>
static __global__ void __launch_bounds__(128)
mha_prefill_kernel(const bf16 *q, int ldq, int q_hs, const bf16 *qa, const bf16 *kv, int ldkv, const bf16 *g,
                   const int32_t *positions, const di_cuk_mha_item *items, int H, int N, float scale_log2, bf16 *out,
                   int ldo) {
  constexpr int SQ = DQK + 8, SV = DV + 8; /* padded rows: ldmatrix rows land in distinct banks */
  constexpr int KS = DQK / 16;             /* k16 steps of Q . K^T */
  DI_PDL_ENTRY();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16 *sQ = (bf16 *)smem_raw;     /* [MROWS][SQ] */
  bf16 *sK = sQ + MROWS * SQ;      /* [2][MKT][SQ] */
  bf16 *sV = sK + 2 * MKT * SQ;    /* [2][MKT][SV] */
  /* the latest rows (the most keys) first, all heads of an item together: the causal tail is short */
  const di_cuk_mha_item it = items[gridDim.y - 1 - blockIdx.y];
  const int h = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nrows = it.t1 - it.t0;
  const bf16 *kvh = kv + (int64_t)h * (N + DV);

  /* Q rows: [q_nope (N) from q | rope'd q_pe (P) from the absorbed query's rope columns] */
  for (int c = tid; c < MROWS * (DQK / 8); c += 128) {
    const int r = c / (DQK / 8), d = (c % (DQK / 8)) * 8;
    const bool ok = r < nrows;
    const int t = it.t0 + (ok ? r : 0);
    const bf16 *src = d < N ? q + (int64_t)t * ldq + (int64_t)h * q_hs + d
                            : qa + ((int64_t)t * H + h) * DI_CUK_MLA_D + DI_CUK_MLA_R + (d - N);
    di_cp_async16(sQ + r * SQ + d, src, ok);
  }
  auto load_kv = [&](int buf, int kb) {
    bf16 *dk = sK + buf * MKT * SQ, *dv = sV + buf * MKT * SV;
    for (int c = tid; c < MKT * (DQK / 8); c += 128) {
      const int r = c / (DQK / 8), d = (c % (DQK / 8)) * 8;
      const int k = kb + r;
      const bool ok = k < it.nk;
      const int64_t ki = it.kbase + (ok ? k : 0);
      const bf16 *src = d < N ? kvh + ki * ldkv + d : g + ki * DI_CUK_MLA_D + DI_CUK_MLA_R + (d - N);
      di_cp_async16(dk + r * SQ + d, src, ok);
    }
    for (int c = tid; c < MKT * (DV / 8); c += 128) {
      const int r = c / (DV / 8), d = (c % (DV / 8)) * 8;
      const int k = kb + r;
      const bool ok = k < it.nk;
      const int64_t ki = it.kbase + (ok ? k : 0);
      di_cp_async16(dv + r * SV + d, kvh + ki * ldkv + N + d, ok);
    }
  };
  load_kv(0, 0);
  di_cp_commit();

  const int rl = warp * 16 + (lane >> 2); /* this thread's rows rl, rl + 8 of the CTA */
  const int p0 = rl < nrows ? positions[it.t0 + rl] : -1;
  const int p1 = rl + 8 < nrows ? positions[it.t0 + rl + 8] : -1;
  int pmax = 0;
  for (int r = 0; r < nrows; r++) pmax = max(pmax, positions[it.t0 + r]);
  const int kend = min(pmax + 1, it.nk);
  const int ntiles = (kend + MKT - 1) / MKT;

  float o[DV / 8][4];
#pragma unroll
  for (int i = 0; i < DV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  uint32_t qf[KS][4];

  for (int j = 0; j < ntiles; j++) {
    const int kb = j * MKT;
    di_cp_wait<0>();
    __syncthreads(); /* tile j (and, at j = 0, Q) landed; everyone is done with tile j - 1's buffers */
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < KS; kk++) di_ldsm_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * SQ + (lane >> 4) * 8 + kk * 16);
    }
    if (j + 1 < ntiles) load_kv((j + 1) & 1, kb + MKT);
    di_cp_commit();
    const bf16 *K = sK + (j & 1) * MKT * SQ, *V = sV + (j & 1) * MKT * SV;

    /* S[16 rows][64 keys] = Q . K^T: ldmatrix x4 gives two 8-key tiles' B fragments of one k16 step */
    float sc[MKT / 8][4];
#pragma unroll
    for (int nt = 0; nt < MKT / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
      for (int nt = 0; nt < MKT / 8; nt += 2) {
        uint32_t b[4];
        di_ldsm_x4(b, K + (nt * 8 + (lane & 7) + ((lane >> 4) & 1) * 8) * SQ + kk * 16 + ((lane >> 3) & 1) * 8);
        di_mma16816(sc[nt], qf[kk], b);
        di_mma16816(sc[nt + 1], qf[kk], b + 2);
      }
    /* masked, log2 units; s0[2nt + e] = row rl, key 8nt + 2(lane % 4) + e (s1: row rl + 8) */
    float s0[MKT / 4], s1[MKT / 4];
#pragma unroll
    for (int nt = 0; nt < MKT / 8; nt++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int k = kb + nt * 8 + (lane & 3) * 2 + e;
        s0[2 * nt + e] = k <= p0 && k < kend ? sc[nt][e] * scale_log2 : -INFINITY;
        s1[2 * nt + e] = k <= p1 && k < kend ? sc[nt][2 + e] * scale_log2 : -INFINITY;
      }
    float al0, al1;
    di_online_softmax2<MKT / 4>(s0, s1, m0, m1, l0, l1, al0, al1);
#pragma unroll
    for (int i = 0; i < DV / 8; i++) { o[i][0] *= al0; o[i][1] *= al0; o[i][2] *= al1; o[i][3] *= al1; }
    /* O[16][DV] += P . V, k16 step ks over keys 16ks .. 16ks + 15 */
#pragma unroll
    for (int ks = 0; ks < MKT / 16; ks++) {
      uint32_t pa[4];
      di_p_fragment(s0, s1, ks, pa);
      const int mi = lane >> 3;
      const bf16 *vrow = V + (ks * 16 + (mi & 1) * 8 + (lane & 7)) * SV + (mi >> 1) * 8;
#pragma unroll
      for (int nt = 0; nt < DV / 8; nt += 2) {
        uint32_t b[4];
        di_ldsm_x4_t(b, vrow + nt * 8);
        di_mma16816(o[nt], pa, b);
        di_mma16816(o[nt + 1], pa, b + 2);
      }
    }
  }
  di_cp_wait<0>();
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int nt = 0; nt < DV / 8; nt++) {
    const int col = h * DV + nt * 8 + (lane & 3) * 2;
    if (rl < nrows)
      *(__nv_bfloat162 *)(out + (int64_t)(it.t0 + rl) * ldo + col) = __floats2bfloat162_rn(o[nt][0] * inv0, o[nt][1] * inv0);
    if (rl + 8 < nrows)
      *(__nv_bfloat162 *)(out + (int64_t)(it.t0 + rl + 8) * ldo + col) =
          __floats2bfloat162_rn(o[nt][2] * inv1, o[nt][3] * inv1);
  }
}

template <int DQK, int DV>
static di_status launch_mha(const bf16 *q, int ldq, int q_hs, const bf16 *qa, const bf16 *kv, int ldkv, const bf16 *g,
                            const int32_t *positions, const di_cuk_mha_item *items, int n_items, int H, int N,
                            float sl2, bf16 *out, int ldo, cudaStream_t s) {
  const size_t sm = (size_t)(MROWS + 2 * MKT) * (DQK + 8) * 2 + (size_t)2 * MKT * (DV + 8) * 2;
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(mha_prefill_kernel<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  DI_CU(di_launch(mha_prefill_kernel<DQK, DV>, dim3(H, n_items), 128, sm, s, q, ldq, q_hs, qa, kv, ldkv, g, positions,
                  items, H, N, sl2, out, ldo));
  DI_CU_LAUNCH("mha_prefill");
  return DI_OK;
}

extern "C" int di_cuk_mha_prefill_ok(int N, int P, int DV) {
  return N % 8 == 0 && P % 8 == 0 && P <= DI_CUK_MLA_P && ((N + P == 192 && DV == 128) || (N + P == 48 && DV == 32));
}

extern "C" di_status di_cuk_mha_prefill(const uint16_t *q, int ldq, int q_hs, const uint16_t *qa, const uint16_t *kv,
                                        int ldkv, const uint16_t *g, const int32_t *positions,
                                        const di_cuk_mha_item *items, int n_items, int H, int N, int P, int DV,
                                        float scale, uint16_t *out, int ldo, di_cu_stream s) {
  if (n_items <= 0) return DI_OK;
  if (!di_cuk_mha_prefill_ok(N, P, DV))
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: mha_prefill head dims %d + %d / %d (192 / 128 or 48 / 32)", N, P, DV);
  const float sl2 = scale * 1.4426950408889634f;
  if (N + P == 192)
    return launch_mha<192, 128>((const bf16 *)q, ldq, q_hs, (const bf16 *)qa, (const bf16 *)kv, ldkv, (const bf16 *)g,
                                positions, items, n_items, H, N, sl2, (bf16 *)out, ldo, (cudaStream_t)s);
  return launch_mha<48, 32>((const bf16 *)q, ldq, q_hs, (const bf16 *)qa, (const bf16 *)kv, ldkv, (const bf16 *)g,
                            positions, items, n_items, H, N, sl2, (bf16 *)out, ldo, (cudaStream_t)s);
}

/* G[i] = cache[slots[i]]: the keys' latent entries gathered into bf16 rows for the up-projection GEMM
 * (from the FP8 pool dequantized, k_kv8.cuh: the stored values, as the absorbed kernels read them). */
template <int KV8>
static __global__ void mha_gather_kernel(const void *cache, const int32_t *slots, int n, int4 *G) {
  DI_PDL_ENTRY();
  const int per = DI_CUK_MLA_D * 2 / 16; /* 72 int4 a row */
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < (int64_t)n * per; c += (int64_t)gridDim.x * blockDim.x) {
    if (KV8) {
      const uint4 v = di_kv8_chunk16(di_kv_row(cache, 1, slots[c / per]), (int)(c % per) * 8);
      G[c] = make_int4((int)v.x, (int)v.y, (int)v.z, (int)v.w);
    } else {
      G[c] = ((const int4 *)cache)[(int64_t)slots[c / per] * per + c % per];
    }
  }
}

extern "C" di_status di_cuk_mha_gather(const void *cache, int kv_fp8, const int32_t *slots, int n, uint16_t *G,
                                       di_cu_stream s) {
  if (n <= 0) return DI_OK;
  const int blocks = (int)(((int64_t)n * 72 + 255) / 256 < 2048 ? ((int64_t)n * 72 + 255) / 256 : 2048);
  if (kv_fp8) DI_CU(di_launch(mha_gather_kernel<1>, blocks, 256, 0, (cudaStream_t)s, cache, slots, n, (int4 *)G));
  else DI_CU(di_launch(mha_gather_kernel<0>, blocks, 256, 0, (cudaStream_t)s, cache, slots, n, (int4 *)G));
  DI_CU_LAUNCH("mha_gather");
  return DI_OK;
}
