/* Tensor-core dense GEMM whose per-row arithmetic does not depend on M (the batch-invariant mode's
 * GEMM core): Y[M][N] = X[M][K] . op(W), op(W) = W^T for W [N][K] or W for W [K][N] (w_kn), batched
 * over heads by strides, bf16 in, f32 accumulate, bf16 or f32 out (f32: + beta * Y).
 *
 * Why a row's bits never depend on M or on the row's place in the batch: an output element is the
 * f32 chain of mma.sync m16n8k16 steps over k = 0, 16, 32, ... in that order (each mma adds one
 * 16-wide slice of the dot product into the accumulator), and nothing else. Tile sizes (BM x BN,
 * picked from M) only decide which CTA and warp run an element's chain, never its steps. K is cut
 * into S splits, S fixed per weight shape by tc_splits(N, K) and never by M: each split's chain
 * starts from zero, and the splits are added in split order onto a zero total. With few CTAs (decode)
 * the splits run in separate CTAs that write f32 partials and a reduce kernel adds them (or, with
 * di_cuk_tc_gemm_set_fused_reduce, the CTA that finishes a tile's last split); with enough
 * CTAs one CTA runs all splits of its tile and adds them in registers: the same additions in the
 * same order, so both forms give the same bits (the test checks every row of M = 1..4096 against the
 * row computed alone). The epilogue (f32 total -> optional beta * Y -> bf16 or f32) is one function
 * used by both forms. The mma's own arithmetic does not depend on the row's position in the
 * 16-row fragment (checked by the same test: rows land at every position).
 *
 * Pipeline: 4 stages of cp.async 16-byte copies (zero-filled past M, N and K), ldmatrix fragments
 * (.trans for W [K][N]); padded shared-memory rows make ldmatrix conflict-free. This is the mma.sync
 * first step of issue 19. k_tc_wgmma.cuh (wgmma, cp.async) and k_tc_tma.cuh (wgmma, TMA, warp-specialized,
 * persistent) are the same product on other cores (di_cuk_tc_gemm_set_core): the same splits, tile
 * order and epilogue (tc_tile_of, tc_work_of, tc_emit below). On the H200 all of them give the same
 * bits for the same chains (test_cuda_tc_gemm's cores-against-each-other check), which is what the
 * hybrid and gemv cores (small M here or in k_tc_gemv.cuh, TMA above) rest on; their invariance tests
 * would catch a device where it fails. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_tc_core.h"
#include "k_inv_fusions.h"

#define TC_BK 64
#define TC_STAGES 4
#define TC_KROW (TC_BK + 8) /* padded row of a [rows][BK] tile: 144 B, conflict-free ldmatrix */
#define TC_MAX_SPLIT 8
#define TC_CTA_TARGET 264 /* 2 x 132 SMs: the CTAs a decode-sized product should spread over (fixed, not the device's) */
#define TC_DEC_BN 64      /* the decode tile's width, which sizes the split (tc_splits) */
#define TC_HYBRID_MMA_M 8 /* hybrid core: products of up to this many rows on mma.sync (faster there on the H200) */

typedef struct tc_args {
  const bf16 *X;
  const bf16 *W;
  void *Y;
  float *part; /* cross-CTA split partials [batch][S][M][N], or NULL: splits added inside the CTA */
  int *counters; /* fused reduce: per-tile count of finished splits (left at zero), or NULL: tc_reduce_kernel */
  int64_t sx, sw, sy;
  int ldx, ldw, ldy;
  int M, N, K, S, y_f32;
  int pair; /* tc_emit2 may store (n, n + 1) as one vector: N, ldy, sy even, Y 8-byte aligned */
  float beta;
} tc_args;

/* The K split of a weight shape: enough splits that a decode-sized product (one 16-row tile, 64-wide
 * column tiles) has about TC_CTA_TARGET CTAs, each split at least 4 k-tiles, at most TC_MAX_SPLIT. */
static int tc_splits(int N, int K) {
  const int nk = (K + TC_BK - 1) / TC_BK, nt = (N + TC_DEC_BN - 1) / TC_DEC_BN;
  int S = (TC_CTA_TARGET + nt - 1) / nt;
  if (S > TC_MAX_SPLIT) S = TC_MAX_SPLIT;
  if (S > nk / 4) S = nk / 4;
  return S < 1 ? 1 : S;
}

/* k-tile where split s begins (s = S: the end) */
static __host__ __device__ __forceinline__ int tc_split_begin(int s, int S, int nk) { return (int)((int64_t)s * nk / S); }

/* The setup every core shares (k_tc_gemm.cu's mma.sync kernel, k_tc_wgmma.cuh, k_tc_tma.cuh).
 * Tile lin of an nm x nn grid in grouped raster order: TC_GROUP_M m-tiles side by side, so a wave of
 * CTAs shares its W tiles across several row tiles in L2 instead of streaming all of W once per row
 * tile (which CTA computes a tile never changes its arithmetic). */
#define TC_GROUP_M 8
static __device__ __forceinline__ void tc_tile_of(int lin, int nm, int nn, int *tm, int *tn) {
  const int first = lin / (TC_GROUP_M * nn) * TC_GROUP_M, gs = min(nm - first, TC_GROUP_M), r = lin % (TC_GROUP_M * nn);
  *tm = first + r % gs;
  *tn = r / gs;
}
static __device__ __forceinline__ void tc_tile_of_cta(int *tm, int *tn) {
  tc_tile_of(blockIdx.y * gridDim.x + blockIdx.x, gridDim.y, gridDim.x, tm, tn);
}

/* What slab zs of the grid (blockIdx.z of the tile kernels) computes: head z, and in the cross-CTA
 * form (a.part set) split `split` of it, k tiles [kt0, kt1); else all of K (the splits, if any, in
 * the kernel's registers). */
typedef struct tc_work {
  int z, split, kt0, kt1;
} tc_work;
static __device__ __forceinline__ tc_work tc_work_of(const tc_args &a, int zs, int nk) {
  tc_work w;
  const int cross = a.part != nullptr;
  w.z = cross ? zs / a.S : zs;
  w.split = cross ? zs % a.S : 0;
  w.kt0 = cross ? tc_split_begin(w.split, a.S, nk) : 0;
  w.kt1 = cross ? tc_split_begin(w.split + 1, a.S, nk) : nk;
  return w;
}

/* The one epilogue of both forms: total v of element (m, n) of head z into Y. */
static __device__ __forceinline__ void tc_store(const tc_args &a, int z, int m, int n, float v) {
  if (a.y_f32) {
    float *y = (float *)a.Y + a.sy * z + (int64_t)m * a.ldy + n;
    *y = a.beta != 0.f ? __fmaf_rn(a.beta, *y, v) : v;
  } else {
    ((bf16 *)a.Y)[a.sy * z + (int64_t)m * a.ldy + n] = __float2bfloat16_rn(v);
  }
}

/* A finished chain's value v of element (m, n) of head z: its split's partial in the cross-CTA form,
 * else through the epilogue. tc_emit2: the pair (n, n + 1) (n even), one vector store where a.pair. */
static __device__ __forceinline__ void tc_emit(const tc_args &a, int z, int split, int m, int n, float v) {
  if (m >= a.M || n >= a.N) return;
  if (a.part) a.part[(((int64_t)z * a.S + split) * a.M + m) * a.N + n] = v;
  else tc_store(a, z, m, n, v);
}
static __device__ __forceinline__ void tc_emit2(const tc_args &a, int z, int split, int m, int n, float v0, float v1) {
  if (m >= a.M || n >= a.N) return;
  if (!a.pair || n + 1 >= a.N) {
    tc_emit(a, z, split, m, n, v0);
    tc_emit(a, z, split, m, n + 1, v1);
  } else if (a.part) {
    *(float2 *)(a.part + (((int64_t)z * a.S + split) * a.M + m) * a.N + n) = make_float2(v0, v1);
  } else if (a.y_f32) {
    float2 *y = (float2 *)((float *)a.Y + a.sy * z + (int64_t)m * a.ldy + n);
    if (a.beta != 0.f) {
      const float2 o = *y;
      v0 = __fmaf_rn(a.beta, o.x, v0);
      v1 = __fmaf_rn(a.beta, o.y, v1);
    }
    *y = make_float2(v0, v1);
  } else {
    *(__nv_bfloat162 *)((bf16 *)a.Y + a.sy * z + (int64_t)m * a.ldy + n) =
        __halves2bfloat162(__float2bfloat16_rn(v0), __float2bfloat16_rn(v1));
  }
}

/* The cross-CTA form's reduction fused into the GEMM: the CTA that finishes a tile's last split
 * (a per-tile counter, reset by that CTA) adds the tile's S partials itself, in split order: the
 * same additions as tc_reduce_kernel, one launch fewer per product. */
template <int BM, int BN, int NTH>
static __device__ __forceinline__ void tc_cross_finish(const tc_args &a, int z, int m0, int n0) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int *cnt = a.counters + ((int64_t)z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    last = atomicAdd(cnt, 1) == a.S - 1;
    if (last) *cnt = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t MN = (int64_t)a.M * a.N;
  for (int e = threadIdx.x; e < BM * BN; e += NTH) {
    const int m = m0 + e / BN, n = n0 + e % BN;
    if (m >= a.M || n >= a.N) continue;
    const float *p = a.part + (int64_t)z * a.S * MN + (int64_t)m * a.N + n;
    float v = 0.f;
    for (int sp = 0; sp < a.S; sp++) v = __fadd_rn(v, __ldcg(p + sp * MN));
    tc_store(a, z, m, n, v);
  }
}

/* BM x BN tile, WM x 4 warps (each (BM/WM) x (BN/4)); WKN: W stored [K][N]; TOT: S > 1 with all
 * splits in this CTA (a second set of accumulators holds the running total). */
template <int BM, int BN, int WM, int WKN, int TOT>
static __device__ __forceinline__ void tc_gemm_body(const tc_args &a) {
  constexpr int TM = BM / WM, TN = BN / 4, MT = TM / 16, NT = TN / 8;
  constexpr int BROW = WKN ? BN + 8 : TC_KROW;     /* B tile: [BK][BN+8] or [BN][KROW] */
  constexpr int BTILE = WKN ? TC_BK * BROW : BN * TC_KROW;
  constexpr int NTH = WM * 128;
  static_assert(NT % 2 == 0 && TM % 16 == 0, "warp tile");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16 *sA = (bf16 *)smem_raw;                 /* [STAGES][BM][KROW] */
  bf16 *sB = sA + TC_STAGES * BM * TC_KROW;    /* [STAGES][BTILE] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp / 4, wn = warp % 4;
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
    bf16 *sa = sA + stage * BM * TC_KROW, *sb = sB + stage * BTILE;
    for (int c = tid; c < BM * (TC_BK / 8); c += NTH) {
      const int r = c / (TC_BK / 8), col = (c % (TC_BK / 8)) * 8;
      const bool ok = m0 + r < M && k0 + col < K;
      di_cp_async16(sa + r * TC_KROW + col, ok ? X + (int64_t)(m0 + r) * a.ldx + k0 + col : X, ok);
    }
    if (WKN) {
      for (int c = tid; c < TC_BK * (BN / 8); c += NTH) {
        const int r = c / (BN / 8), col = (c % (BN / 8)) * 8;
        const bool ok = k0 + r < K && n0 + col < N;
        di_cp_async16(sb + r * BROW + col, ok ? W + (int64_t)(k0 + r) * a.ldw + n0 + col : W, ok);
      }
    } else {
      for (int c = tid; c < BN * (TC_BK / 8); c += NTH) {
        const int r = c / (TC_BK / 8), col = (c % (TC_BK / 8)) * 8;
        const bool ok = n0 + r < N && k0 + col < K;
        di_cp_async16(sb + r * TC_KROW + col, ok ? W + (int64_t)(n0 + r) * a.ldw + k0 + col : W, ok);
      }
    }
  };

#pragma unroll
  for (int st = 0; st < TC_STAGES - 1; st++) {
    if (kt0 + st < kt1) load(st, kt0 + st);
    di_cp_commit();
  }
  float acc[MT][NT][4], tot[TOT ? MT : 1][TOT ? NT : 1][4];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;
  if constexpr (TOT) {
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) tot[i][j][q] = 0.f;
  }
  int next_split = 1, split_end = TOT ? tc_split_begin(1, a.S, nk) : nk;

  for (int kt = kt0; kt < kt1; kt++) {
    const int i = kt - kt0;
    di_cp_wait<TC_STAGES - 2>();
    __syncthreads();
    {
      const int nxt = kt + TC_STAGES - 1;
      if (nxt < kt1) load((i + TC_STAGES - 1) % TC_STAGES, nxt);
      di_cp_commit();
    }
    const bf16 *sa = sA + (i % TC_STAGES) * BM * TC_KROW, *sb = sB + (i % TC_STAGES) * BTILE;
#pragma unroll
    for (int kk = 0; kk < TC_BK; kk += 16) {
      uint32_t bfr[NT / 2][4];
#pragma unroll
      for (int h = 0; h < NT / 2; h++) {
        if (WKN) {
          const bf16 *p = sb + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * BROW + wn * TN + h * 16 + (lane >> 4) * 8;
          di_ldsm_x4_t(bfr[h], p);
        } else {
          const bf16 *p = sb + (wn * TN + h * 16 + (lane & 7) + ((lane >> 4) << 3)) * TC_KROW + kk + ((lane >> 3) & 1) * 8;
          di_ldsm_x4(bfr[h], p);
        }
      }
#pragma unroll
      for (int mi = 0; mi < MT; mi++) {
        uint32_t af[4];
        di_ldsm_x4(af, sa + (wm * TM + mi * 16 + (lane & 15)) * TC_KROW + kk + (lane >> 4) * 8);
#pragma unroll
        for (int h = 0; h < NT / 2; h++) {
          di_mma16816(acc[mi][2 * h], af, &bfr[h][0]);
          di_mma16816(acc[mi][2 * h + 1], af, &bfr[h][2]);
        }
      }
    }
    if constexpr (TOT) {
      if (kt + 1 == split_end) { /* a split's chain is done: onto the total, and the next chain from zero */
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
          for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
              tot[mi][j][q] = __fadd_rn(tot[mi][j][q], acc[mi][j][q]);
              acc[mi][j][q] = 0.f;
            }
        next_split++;
        split_end = tc_split_begin(next_split, a.S, nk);
      }
    }
  }
  di_cp_wait<0>();

#pragma unroll
  for (int mi = 0; mi < MT; mi++)
#pragma unroll
    for (int nj = 0; nj < NT; nj++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const int m = m0 + wm * TM + mi * 16 + (lane >> 2) + (q >> 1) * 8;
        const int n = n0 + wn * TN + nj * 8 + (lane & 3) * 2 + (q & 1);
        if constexpr (TOT) tc_emit(a, z, split, m, n, tot[mi][nj][q]);
        else tc_emit(a, z, split, m, n, acc[mi][nj][q]);
      }
  if (cross && a.counters) tc_cross_finish<BM, BN, NTH>(a, z, m0, n0);
}

template <int BM, int BN, int WM, int WKN, int TOT>
static __global__ void __launch_bounds__(WM * 128, 1) tc_gemm_kernel(const tc_args a) {
  tc_gemm_body<BM, BN, WM, WKN, TOT>(a);
}

/* The invariant mode's decode query absorption with the MLA preparation in the same launch
 * (di_cuk_tc_gemm_prep): the absorption's 16 x 64 mma.sync tiles as tc_gemm_kernel runs them (slabs z <
 * batch), and one more slab whose CTA x prepares tokens x, x + gridDim.x, ... with mla_prep_kernel's
 * arithmetic (mla_prep_token<256>: its 256-thread sum of squares on these 128 threads). The two are
 * independent (different columns of Qa; the cache), as in the default mode's mla_prep_absorb_kernel. */
struct tc_prep {
  const bf16 *kva, *q;
  int ldk, ldq;
  const int32_t *positions, *slots;
  int T, H, N, P, R;
  const float *kv_norm;
  float eps;
  di_cuk_rope rope;
  bf16 *Qa;
  void *cache;
  int kv_fp8;
};
#include "k_mla_prep.cuh"
template <int WKN>
static __global__ void __launch_bounds__(128, 1) tc_gemm_prep_kernel(const tc_args a, const tc_prep p) {
  if ((int)blockIdx.z == (int)gridDim.z - 1) {
    DI_PDL_ENTRY();
    if (blockIdx.y != 0) return;
    for (int t = blockIdx.x; t < p.T; t += gridDim.x) {
      mla_prep_token<256>(t, p.kva, p.ldk, p.q, p.ldq, p.positions, p.slots, p.H, p.N, p.P, p.R, p.kv_norm, p.eps,
                          p.rope, p.Qa, p.cache, p.kv_fp8);
      __syncthreads(); /* its shared tables, before the next token's */
    }
    return;
  }
  tc_gemm_body<16, 64, 1, WKN, 0>(a);
}

/* The cross-CTA form's reduction: total = ((0 + p0) + p1) + ..., as the in-CTA form adds them. */
static __global__ void __launch_bounds__(256) tc_reduce_kernel(const tc_args a, int batch) {
  DI_PDL_ENTRY();
  const int64_t MN = (int64_t)a.M * a.N;
  for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < MN * batch; i += (int64_t)gridDim.x * 256) {
    const int z = (int)(i / MN);
    const int64_t r = i % MN;
    const float *p = a.part + (int64_t)z * a.S * MN + r;
    float v = 0.f;
    for (int s = 0; s < a.S; s++) v = __fadd_rn(v, p[(int64_t)s * MN]);
    tc_store(a, z, (int)(r / a.N), (int)(r % a.N), v);
  }
}

#include "k_tc_wgmma.cuh"
#include "k_tc_tma.cuh"
#include "k_tc_gemv.cuh"
static int g_core; /* di_cuk_tc_gemm_set_core: 0 mma.sync, 1 wgmma (cp.async), 2 wgmma (TMA), 3 hybrid, 4 gemv */
static int g_fused_reduce; /* di_cuk_tc_gemm_set_fused_reduce */
#define TC_COUNTER_BYTES 16384 /* ws: tile counters first (4,096 > the cross form's tiles), then partials */

template <int BM, int BN, int WM, int WKN, int TOT>
static di_status tc_launch(const tc_args &a, int batch, int zdim, cudaStream_t s) {
  constexpr int BTILE = WKN ? TC_BK * (BN + 8) : BN * TC_KROW;
  const size_t sm = (size_t)TC_STAGES * (BM * TC_KROW + BTILE) * 2;
  static int attr_set; /* per instantiation; a benign race sets the same value */
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(tc_gemm_kernel<BM, BN, WM, WKN, TOT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)sm));
    attr_set = 1;
  }
  const dim3 grid((a.N + BN - 1) / BN, (a.M + BM - 1) / BM, zdim);
  (void)batch;
  DI_CU(di_launch(tc_gemm_kernel<BM, BN, WM, WKN, TOT>, grid, WM * 128, sm, s, a));
  return DI_OK;
}

/* The M bucket: how rows are grouped into tiles (never the arithmetic). */
template <int WKN, int TOT>
static di_status tc_dispatch(const tc_args &a, int batch, int zdim, cudaStream_t s) {
  /* hybrid (3): up to TC_HYBRID_MMA_M rows on the mma.sync 16-row tiles, more on the TMA core; invariant
   * only because the two give the same bits for the same split chains (measured on the H200: 100% of
   * elements equal; test_cuda_tc_gemm --core hybrid holds every M to it) */
  if (!WKN && (g_core == 2 || (g_core >= 3 && a.M > TC_HYBRID_MMA_M))) return tt_dispatch<TOT>(a, batch, zdim, s);
  if (!WKN && g_core == 1) return wg_dispatch<TOT>(a, zdim, s);
  if (a.M <= 16) return tc_launch<16, 64, 1, WKN, TOT>(a, batch, zdim, s);
  if (a.M <= 128) return tc_launch<64, 128, 1, WKN, TOT>(a, batch, zdim, s);
  /* unsplit products: 128 x 256 (64 x 64 per warp: more reuse of each shared-memory byte; the split
   * form's second set of accumulators would not fit beside it) */
  if (!TOT && a.S == 1) return tc_launch<128, 256, 2, WKN, 0>(a, batch, zdim, s);
  return tc_launch<128, 128, 2, WKN, TOT>(a, batch, zdim, s);
}

static int tc_bm(int M) { return M <= 16 ? 16 : M <= 128 ? 64 : 128; }
static int tc_bn(int M) { return M <= 16 ? 64 : 128; }

extern "C" int di_cuk_tc_gemm_ok(int N, int K, int ldx, int ldw, int w_kn, const void *X, const void *W) {
  return N >= 1 && K >= 8 && K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && (!w_kn || N % 8 == 0) &&
         ((uintptr_t)X & 15) == 0 && ((uintptr_t)W & 15) == 0;
}

extern "C" int di_cuk_tc_gemm_splits(int N, int K) { return tc_splits(N, K); }
extern "C" void di_cuk_tc_gemm_set_core(int core) { g_core = core >= 0 && core <= 4 ? core : 0; }
extern "C" int di_cuk_tc_gemm_core(void) { return g_core; }
extern "C" void di_cuk_tc_gemm_set_fused_reduce(int on) { g_fused_reduce = on != 0; }

extern "C" size_t di_cuk_tc_gemm_ws_bytes(int batch, int M, int N, int K) {
  const int S = tc_splits(N, K);
  if (S <= 1) return 0;
  const int64_t ctas = (int64_t)((N + tc_bn(M) - 1) / tc_bn(M)) * ((M + tc_bm(M) - 1) / tc_bm(M)) * batch;
  if (ctas >= TC_CTA_TARGET) return 0; /* enough CTAs: the splits stay inside each CTA */
  return TC_COUNTER_BYTES + (size_t)batch * S * M * N * sizeof(float);
}

/* Whether di_cuk_tc_gemm_prep takes the product: di_cuk_tc_gemm would run it unsplit on the mma.sync 16 x 64
 * tiles (one 16-row tile; the core chosen now). */
extern "C" int di_cuk_tc_gemm_prep_ok(int M, int N, int K, int ldx, int ldw, int w_kn, const void *X, const void *W,
                                      int batch) {
  if (M < 1 || M > 16 || batch < 1 || batch + 1 > 65535 || !di_cuk_tc_gemm_ok(N, K, ldx, ldw, w_kn, X, W)) return 0;
  if (tc_splits(N, K) != 1) return 0;
  return w_kn || g_core == 0 || (g_core == 3 && M <= TC_HYBRID_MMA_M);
}

extern "C" di_status di_cuk_tc_gemm_prep(int batch, int M, int N, int K, const uint16_t *X, int ldx, int64_t sx,
                                         const uint16_t *W, int ldw, int64_t sw, int w_kn, uint16_t *Y, int ldy,
                                         int64_t sy, const uint16_t *kva, int ldk, const uint16_t *q, int ldq,
                                         const int32_t *positions, const int32_t *slots, int T, int H, int Nn, int P,
                                         int R, const float *kv_norm, float eps, di_cuk_rope rope, uint16_t *Qa,
                                         void *cache, int kv_fp8, di_cu_stream s) {
  if (M <= 0 || batch <= 0) return DI_OK;
  if (!di_cuk_tc_gemm_prep_ok(M, N, K, ldx, ldw, w_kn, X, W, batch) || sx % 8 || sw % 8 || T < 1 ||
      P > DI_CUK_MLA_P || P % 2 || R > DI_CUK_MLA_R)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: tensor-core GEMM + MLA prep %d x %dx%dx%d, T %d", batch, M, N, K, T);
  tc_args a;
  a.X = (const bf16 *)X; a.W = (const bf16 *)W; a.Y = Y; a.part = NULL; a.counters = NULL;
  a.sx = sx; a.sw = sw; a.sy = sy; a.ldx = ldx; a.ldw = ldw; a.ldy = ldy;
  a.M = M; a.N = N; a.K = K; a.S = 1; a.y_f32 = 0; a.beta = 0.f;
  a.pair = N % 2 == 0 && ldy % 2 == 0 && sy % 2 == 0 && ((uintptr_t)Y & 7) == 0;
  const tc_prep p = {(const bf16 *)kva, (const bf16 *)q, ldk, ldq, positions, slots, T, H, Nn, P, R, kv_norm, eps,
                     rope, (bf16 *)Qa, cache, kv_fp8};
  const size_t sm = (size_t)TC_STAGES * (16 * TC_KROW + (w_kn ? TC_BK * (64 + 8) : 64 * TC_KROW)) * 2;
  const dim3 grid((N + 63) / 64, 1, batch + 1);
  static int attr_set[2];
  if (w_kn) {
    if (!attr_set[1]) {
      DI_CU(cudaFuncSetAttribute(tc_gemm_prep_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      attr_set[1] = 1;
    }
    DI_CU(di_launch(tc_gemm_prep_kernel<1>, grid, 128, sm, s, a, p));
  } else {
    if (!attr_set[0]) {
      DI_CU(cudaFuncSetAttribute(tc_gemm_prep_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      attr_set[0] = 1;
    }
    DI_CU(di_launch(tc_gemm_prep_kernel<0>, grid, 128, sm, s, a, p));
  }
  DI_CU_LAUNCH("tc_gemm_prep");
  return DI_OK;
}

extern "C" di_status di_cuk_tc_gemm(int batch, int M, int N, int K, const uint16_t *X, int ldx, int64_t sx,
                                    const uint16_t *W, int ldw, int64_t sw, int w_kn, void *Y, int ldy, int64_t sy,
                                    int y_f32, float beta, float *ws, size_t ws_bytes, di_cu_stream s) {
  if (M <= 0 || batch <= 0) return DI_OK;
  if (!di_cuk_tc_gemm_ok(N, K, ldx, ldw, w_kn, X, W) || sx % 8 || sw % 8 || batch > 65535 / TC_MAX_SPLIT ||
      (M + 15) / 16 > 65535)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "cuda: tensor-core GEMM %d x %dx%dx%d (K %% 8, leading dims %% 8, 16-byte aligned)", batch, M, N,
                        K);
  tc_args a;
  a.X = (const bf16 *)X; a.W = (const bf16 *)W; a.Y = Y; a.part = NULL; a.counters = NULL;
  a.sx = sx; a.sw = sw; a.sy = sy; a.ldx = ldx; a.ldw = ldw; a.ldy = ldy;
  a.M = M; a.N = N; a.K = K; a.S = tc_splits(N, K); a.y_f32 = y_f32; a.beta = y_f32 ? beta : 0.f;
  a.pair = N % 2 == 0 && ldy % 2 == 0 && sy % 2 == 0 && ((uintptr_t)Y & 7) == 0;
  if (g_core == 4 && !w_kn && M <= TC_HYBRID_MMA_M) { /* gemv core: the split chains without tiles */
    DI_TRY(tcv_launch(a, batch, s));
    DI_CU_LAUNCH("tc_gemv");
    return DI_OK;
  }
  const size_t need = di_cuk_tc_gemm_ws_bytes(batch, M, N, K);
  if (need > 0 && ws && need <= ws_bytes) { /* few CTAs: the splits in CTAs of their own, then the reduce */
    a.part = ws + TC_COUNTER_BYTES / sizeof(float);
    /* the fused reduce is the mma.sync and cp.async wgmma kernels' (tc_cross_finish); TMA: the reduce kernel */
    const int fused = g_fused_reduce && (w_kn || g_core == 0 || g_core == 1 || (g_core == 3 && M <= TC_HYBRID_MMA_M));
    if (fused) a.counters = (int *)ws;
    DI_TRY((w_kn ? tc_dispatch<1, 0>(a, batch, batch * a.S, s) : tc_dispatch<0, 0>(a, batch, batch * a.S, s)));
    const int64_t n = (int64_t)batch * M * N;
    const int blocks = (int)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
    if (!fused) DI_CU(di_launch(tc_reduce_kernel, dim3(blocks), 256, 0, s, a, batch));
  } else if (a.S > 1) {
    DI_TRY((w_kn ? tc_dispatch<1, 1>(a, batch, batch, s) : tc_dispatch<0, 1>(a, batch, batch, s)));
  } else {
    DI_TRY((w_kn ? tc_dispatch<1, 0>(a, batch, batch, s) : tc_dispatch<0, 0>(a, batch, batch, s)));
  }
  DI_CU_LAUNCH("tc_gemm");
  return DI_OK;
}
