/* Grouped expert GEMM: for the assignments sorted by expert (k_moe.cu), each CTA takes one m-tile of
 * one expert's rows (16 or 64) and 128 output columns (64 when the grid would be too small to keep
 * every SM streaming: at decode 8 experts x 2816 columns make only 176 CTAs of 128 for 132 SMs), and computes C = A_rows . W_e^T with
 * mma.sync m16n8k16 (bf16 in, f32 accumulate). The A rows are gathered through an index list so the
 * permuted activations never need to be materialized. The tile list lives on the device, so the
 * grid is launched at its upper bound (blocks past *n_tiles exit at once) and a decode step needs no
 * host round trip. A 4-stage cp.async pipeline keeps weight tiles streaming: at decode batch sizes
 * the kernel is bound by reading the experts' weights, which is why bm=16 exists (less wasted MMA
 * and shared memory, two CTAs per SM). */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_tc_core.h"
#include "k_inv_fusions.h"
#include "k_skinny_kn.cuh"

#define BK 64
#define STAGES 4
#define KROW (BK + 8) /* padded smem row: 144 B = 9 x 16 B, conflict-free ldmatrix */

/* The MoE combine handed to the down projection's last CTAs (di_cuk_grouped_gemm_combine, below). */
struct gg_combine {
  const int32_t *inv; /* [T][k]: the row of y holding token t's slot j */
  const float *w;     /* [T][k] routing weights */
  int T, k, n;        /* tokens, slots a token, h's width (<= N) */
  float *h;           /* [T][n], += the weighted sum */
  const float *norm_w; /* the next layer's attention norm (NULL: none) */
  float eps;
  bf16 *xn; /* [T][ldo] the normed rows */
  int ldo;
  int32_t *cnt; /* gridDim.x + 1 counters, zero before and after each launch */
};
template <int BN>
static __device__ void gg_combine_tail(const gg_combine &cb, const float *y, int ldy, int n0, int nt);

template <int BM, int BN, bool CMB>
static __device__ __forceinline__ void
grouped_gemm_body(const bf16 *A, int lda, const int32_t *a_rows, const bf16 *W, int N, int K,
                  const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, void *C, int ldc,
                  int c_f32, int glu, const gg_combine &cb) {
  constexpr int WN = BN / 4, NT = WN / 8; /* columns and n8 tiles per warp */
  DI_PDL_ENTRY();
  if ((int)blockIdx.y >= *n_tiles) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16 *sA = (bf16 *)smem_raw;              /* [STAGES][BM][KROW] */
  bf16 *sB = sA + STAGES * BM * KROW;       /* [STAGES][BN][KROW] */
  __shared__ int srow[BM];

  const int tile = tiles[blockIdx.y];
  const int e = tile >> 16, ti = tile & 0xffff;
  const int m0 = off[e] + ti * BM, mend = min(off[e + 1], m0 + BM);
  const int n0 = blockIdx.x * BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int r = tid; r < BM; r += 128) {
    int m = m0 + r;
    srow[r] = m < mend ? (a_rows ? a_rows[m] : m) : -1;
  }
  __syncthreads();
  const bf16 *We = W + (int64_t)e * N * K;

  auto load = [&](int stage, int k0) {
    bf16 *a = sA + stage * BM * KROW, *b = sB + stage * BN * KROW;
    for (int c = tid; c < BM * (BK / 8); c += 128) {
      int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
      int ar = srow[r];
      di_cp_async16(a + r * KROW + col, A + (int64_t)(ar < 0 ? 0 : ar) * lda + k0 + col, ar >= 0);
    }
    for (int c = tid; c < BN * (BK / 8); c += 128) {
      int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
      di_cp_async16(b + r * KROW + col, We + (int64_t)(n0 + r) * K + k0 + col, true);
    }
  };

  const int nk = K / BK;
#pragma unroll
  for (int st = 0; st < STAGES - 1; st++) {
    if (st < nk) load(st, st * BK);
    di_cp_commit();
  }
  float acc[BM / 16][NT][4];
#pragma unroll
  for (int i = 0; i < BM / 16; i++)
#pragma unroll
    for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  for (int kt = 0; kt < nk; kt++) {
    di_cp_wait<STAGES - 2>();
    __syncthreads();
    {
      int nxt = kt + STAGES - 1;
      if (nxt < nk) load(nxt % STAGES, nxt * BK);
      di_cp_commit();
    }
    const bf16 *a = sA + (kt % STAGES) * BM * KROW, *b = sB + (kt % STAGES) * BN * KROW;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t bf[NT / 2][4];
      /* NT n8 tiles of this warp (cols warp*WN ..): x4 loads, each = 2 n-tiles x (k0-7, k8-15) */
#pragma unroll
      for (int h = 0; h < NT / 2; h++) {
        const bf16 *p = b + (warp * WN + h * 16 + (lane & 7) + ((lane >> 4) << 3)) * KROW + kk +
                        ((lane >> 3) & 1) * 8;
        di_ldsm_x4(bf[h], p);
      }
#pragma unroll
      for (int mi = 0; mi < BM / 16; mi++) {
        uint32_t af[4];
        di_ldsm_x4(af, a + (mi * 16 + (lane & 15)) * KROW + kk + (lane >> 4) * 8);
#pragma unroll
        for (int h = 0; h < NT / 2; h++) {
          di_mma16816(acc[mi][2 * h], af, &bf[h][0]);
          di_mma16816(acc[mi][2 * h + 1], af, &bf[h][2]);
        }
      }
    }
  }
  di_cp_wait<0>();

  if (glu) { /* n-tiles (0,1) and (2,3) are (gate, up) of the same 8 intermediate columns */
#pragma unroll
    for (int mi = 0; mi < BM / 16; mi++) {
#pragma unroll
      for (int pr = 0; pr < NT / 2; pr++) {
        int col = (n0 + warp * WN + pr * 16) / 2 + (lane & 3) * 2;
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          int m = m0 + mi * 16 + (lane >> 2) + hh * 8;
          if (m >= mend) continue;
          float g0 = acc[mi][2 * pr][2 * hh], g1 = acc[mi][2 * pr][2 * hh + 1];
          float u0 = acc[mi][2 * pr + 1][2 * hh], u1 = acc[mi][2 * pr + 1][2 * hh + 1];
          float v0 = g0 / (1.f + __expf(-g0)) * u0, v1 = g1 / (1.f + __expf(-g1)) * u1;
          *(__nv_bfloat162 *)((bf16 *)C + (int64_t)m * ldc + col) = __floats2bfloat162_rn(v0, v1);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int mi = 0; mi < BM / 16; mi++) {
#pragma unroll
    for (int nj = 0; nj < NT; nj++) {
      int col = n0 + warp * WN + nj * 8 + (lane & 3) * 2;
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        int m = m0 + mi * 16 + (lane >> 2) + hh * 8;
        if (m >= mend) continue;
        float v0 = acc[mi][nj][2 * hh], v1 = acc[mi][nj][2 * hh + 1];
        if (c_f32)
          *(float2 *)((float *)C + (int64_t)m * ldc + col) = make_float2(v0, v1);
        else
          *(__nv_bfloat162 *)((bf16 *)C + (int64_t)m * ldc + col) = __floats2bfloat162_rn(v0, v1);
      }
    }
  }
  if (CMB) gg_combine_tail<BN>(cb, (const float *)C, ldc, n0, *n_tiles);
}

template <int BM, int BN>
static __global__ void __launch_bounds__(128)
grouped_gemm_kernel(const bf16 *A, int lda, const int32_t *a_rows, const bf16 *W, int N, int K,
                    const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, void *C, int ldc,
                    int c_f32, int glu) {
  grouped_gemm_body<BM, BN, false>(A, lda, a_rows, W, N, K, off, tiles, n_tiles, C, ldc, c_f32, glu, gg_combine());
}

/* the same with the combine in its last CTAs (di_cuk_grouped_gemm_combine) */
template <int BM, int BN>
static __global__ void __launch_bounds__(128)
grouped_gemm_cmb_kernel(const bf16 *A, int lda, const bf16 *W, int N, int K, const int32_t *off,
                        const int32_t *tiles, const int32_t *n_tiles, float *y, int ldy, gg_combine cb) {
  grouped_gemm_body<BM, BN, true>(A, lda, NULL, W, N, K, off, tiles, n_tiles, y, ldy, 1, 0, cb);
}

/* The combine in the down projection (CMB): the last of a column block's CTAs (a counter a block; the
 * y rows of every tile of those columns are then written) adds the weighted rows to h over those
 * columns with combine_kernel's arithmetic (k_moe.cu: acc = 0, acc += w_j y_j in slot order, h + acc);
 * the last column block to finish (one more counter) writes the normed rows with combine_norm_kernel's:
 * the sum of squares of each of its 8 cluster CTAs' column ranges as that CTA's 256 threads leave it
 * (each thread's columns in order, then di_block_sum's tree: a warp's xor butterfly, then one over its 8
 * warp sums; here each of the 4 warps forms 16 of the 64 warp sums and two of the 8 CTA sums), the 8
 * added in rank order, rsqrtf(tot / n + eps), v * inv_rms * norm_w. Both counters
 * are reset by the CTA that saw them complete (graph replays find them at zero). */
#define GGC_CLUSTER 8   /* combine_norm_kernel's CMB_CLUSTER */
#define GGC_COLS 256    /* its CMB_COLS */
#define GGC_PER_THREAD 4 /* its CMB_MAX_PER_THREAD */
static __device__ __forceinline__ float ggc_xor_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int BN>
static __device__ void gg_combine_tail(const gg_combine &cb, const float *y, int ldy, int n0, int nt) {
  __shared__ int s_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __threadfence(); /* this CTA's y rows, before its count */
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&cb.cnt[blockIdx.x], 1) == nt - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int i = tid; i < cb.T * BN; i += 128) {
    const int t = i / BN, c = n0 + i % BN;
    if (c >= cb.n) continue;
    float acc = 0.f;
    for (int j = 0; j < cb.k; j++) acc += cb.w[t * cb.k + j] * __ldcg(y + (int64_t)cb.inv[t * cb.k + j] * ldy + c);
    float *hp = cb.h + (int64_t)t * cb.n + c;
    *hp = *hp + acc;
  }
  if (!cb.norm_w) {
    if (tid == 0) cb.cnt[blockIdx.x] = 0;
    return;
  }
  __threadfence(); /* this block's h columns, before the second count */
  __syncthreads();
  if (tid == 0) {
    cb.cnt[blockIdx.x] = 0;
    s_last = atomicAdd(&cb.cnt[gridDim.x], 1) == (int)gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int n = cb.n, per = ((n + GGC_CLUSTER - 1) / GGC_CLUSTER + 7) & ~7;
  __shared__ float wsum[GGC_CLUSTER][GGC_COLS / 32], csum[GGC_CLUSTER];
  for (int t = 0; t < cb.T; t++) {
    const float *ht = cb.h + (int64_t)t * n;
    /* the 64 warp sums (cluster CTA p, its warp vw), 16 a warp here: lane l is thread 32 vw + l of CTA p */
    for (int i = warp; i < GGC_CLUSTER * (GGC_COLS / 32); i += 4) {
      const int p = i / (GGC_COLS / 32), vw = i % (GGC_COLS / 32), c0 = p * per, c1 = min(n, c0 + per);
      float ss = 0.f;
#pragma unroll
      for (int q = 0; q < GGC_PER_THREAD; q++) {
        const int c = c0 + 32 * vw + lane + q * GGC_COLS;
        if (c < c1) {
          const float v = __ldcg(ht + c);
          ss += v * v;
        }
      }
      ss = ggc_xor_sum(ss);
      if (lane == 0) wsum[p][vw] = ss;
    }
    __syncthreads();
    for (int p = warp; p < GGC_CLUSTER; p += 4) { /* CTA p's di_block_sum: lanes 0..7 its warp sums */
      const float v = ggc_xor_sum(lane < GGC_COLS / 32 ? wsum[p][lane] : 0.f);
      if (lane == 0) csum[p] = v;
    }
    __syncthreads();
    float tot = 0.f;
    for (int p = 0; p < GGC_CLUSTER; p++) tot += csum[p];
    const float inv_rms = rsqrtf(tot / n + cb.eps);
    for (int c = tid; c < n; c += 128) cb.xn[(int64_t)t * cb.ldo + c] = di_fb(__ldcg(ht + c) * inv_rms * cb.norm_w[c]);
    __syncthreads(); /* wsum / csum free for the next token */
  }
  if (tid == 0) cb.cnt[gridDim.x] = 0;
}

template <int BM, int BN>
static di_status launch(const bf16 *A, int lda, const int32_t *a_rows, const bf16 *W, int N, int K,
                        const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
                        void *C, int ldc, int c_f32, int glu, cudaStream_t s) {
  size_t sm = (size_t)STAGES * (BM + BN) * KROW * 2;
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(grouped_gemm_kernel<BM, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  dim3 grid(N / BN, max_tiles);
  DI_CU(di_launch(grouped_gemm_kernel<BM, BN>, grid, 128, sm, s, A, lda, a_rows, W, N, K, off, tiles, n_tiles, C,
                  ldc, c_f32, glu));
  return DI_OK;
}

template <int BN>
static di_status launch_cmb(const bf16 *A, int lda, const bf16 *W, int N, int K, const int32_t *off,
                            const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *y, int ldy,
                            const gg_combine &cb, cudaStream_t s) {
  size_t sm = (size_t)STAGES * (16 + BN) * KROW * 2;
  static int attr_set;
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(grouped_gemm_cmb_kernel<16, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr_set = 1;
  }
  DI_CU(di_launch(grouped_gemm_cmb_kernel<16, BN>, dim3(N / BN, max_tiles), 128, sm, s, A, lda, W, N, K, off, tiles,
                  n_tiles, y, ldy, cb));
  return DI_OK;
}

static int sm_count(void) {
  static int n; /* the device does not change under a process; a benign race writes the same value */
  if (!n) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
      n = v > 0 ? v : 132;
    else
      n = 132;
  }
  return n;
}

extern "C" di_status di_cuk_grouped_gemm(const uint16_t *A, int lda, const int32_t *a_rows,
                                         const uint16_t *W, int N, int K, const int32_t *expert_off,
                                         const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
                                         int bm, void *C, int ldc, int c_f32, int glu, di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (N % 128 || K % BK || max_tiles > 65535)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: grouped_gemm N %d K %d tiles %d (N%%128, K%%64)", N,
                        K, max_tiles);
  const int core = di_cuk_tc_gemm_core(); /* hybrid: 16-row tiles here, 64-row ones on the TMA core (same bits) */
  if ((core == 2 || (core >= 3 && bm > 16)) && di_cuk_tc_grouped_ok(N, K, lda, A)) /* by shape and core, never M */
    return di_cuk_tc_grouped_gemm(A, lda, a_rows, W, N, K, expert_off, tiles, n_tiles, max_tiles, bm, C, ldc, c_f32,
                                  glu, s);
  const int narrow = max_tiles * (N / 128) < 2 * sm_count(); /* too few 128-wide CTAs to fill the GPU */
#define GG_LAUNCH(bm_, bn_)                                                                              \
  return launch<bm_, bn_>((const bf16 *)A, lda, a_rows, (const bf16 *)W, N, K, expert_off, tiles, n_tiles, \
                          max_tiles, C, ldc, c_f32, glu, s)
  if (bm == 16) {
    if (narrow) GG_LAUNCH(16, 64);
    GG_LAUNCH(16, 128);
  }
  if (bm == 64) {
    if (narrow) GG_LAUNCH(64, 64);
    GG_LAUNCH(64, 128);
  }
#undef GG_LAUNCH
  return di_error_set(DI_ERR_INVALID_ARG, "cuda: grouped_gemm bm %d (16 or 64)", bm);
}

/* Whether di_cuk_grouped_gemm_combine takes this down projection: the shape di_cuk_grouped_gemm runs on its
 * mma.sync kernel (16-row tiles on the mma.sync or hybrid core), and the combine's limits. */
extern "C" int di_cuk_grouped_gemm_combine_ok(int N, int K, int lda, const void *A, int bm, int n, int k, int T) {
  const int core = di_cuk_tc_gemm_core();
  if (bm != 16 || N % 128 || K % BK || n > N || k < 1 || k > 16 || T < 1 || T > 65535) return 0;
  if (n > DI_CUK_GG_COMBINE_MAX_N) return 0;
  return !(core == 2 && di_cuk_tc_grouped_ok(N, K, lda, A)); /* (the TMA core at bm 16 only when core == 2) */
}

extern "C" di_status di_cuk_grouped_gemm_combine(const uint16_t *A, int lda, const uint16_t *W, int N, int K,
                                                 const int32_t *expert_off, const int32_t *tiles,
                                                 const int32_t *n_tiles, int max_tiles, int bm, float *y, int ldy,
                                                 const int32_t *inv, const float *w, int T, int k, int n, float *h,
                                                 const float *norm_w, float eps, uint16_t *xn, int ldo, int32_t *cnt,
                                                 di_cu_stream s) {
  if (max_tiles <= 0 || T <= 0) return DI_OK;
  if (!di_cuk_grouped_gemm_combine_ok(N, K, lda, A, bm, n, k, T) || max_tiles > 65535 || !cnt)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: grouped_gemm_combine N %d K %d bm %d n %d k %d T %d", N, K, bm, n,
                        k, T);
  const gg_combine cb = {inv, w, T, k, n, h, norm_w, eps, (bf16 *)xn, ldo, cnt};
  /* the tile width di_cuk_grouped_gemm picks (not the bits: a column's chain is the same in either) */
  if (max_tiles * (N / 128) < 2 * sm_count())
    return launch_cmb<64>((const bf16 *)A, lda, (const bf16 *)W, N, K, expert_off, tiles, n_tiles, max_tiles, y, ldy,
                          cb, s);
  return launch_cmb<128>((const bf16 *)A, lda, (const bf16 *)W, N, K, expert_off, tiles, n_tiles, max_tiles, y, ldy,
                         cb, s);
}

/* ---- decode-sized steps: the same grouped product as a GEMV ----------------------------------------
 * When no expert has more than a few rows (a step of <= 4 tokens: each token gives an expert at most
 * one row), tensor-core tiles waste most of their work and the shared-memory pipeline only adds
 * latency. Here each warp streams GV_ROWS consecutive weight rows straight into registers (one 16-byte
 * load per row per lane per step: 16 loads in flight) and keeps up to MR activation rows; the 16 dot
 * products are reduced across the warp by halving exchanges (15 shuffles, after which lane 2r holds
 * row r). glu: rows 0-7 of a warp are gate rows, 8-15 the matching up rows (the interleaving above).
 * At T == 1 the shared experts are the last tiles (sorted by expert id, one tile each), so their
 * weights are prefetched into L2 before the kernel waits for the router (pf_tile0 / pf_expert0). */
#define GV_WARPS 4
#define GV_ROWS 16
static int g_gv_one_warp = 1; /* di_cuk_grouped_gemv_set_one_warp */

template <int MR>
static __device__ __forceinline__ void gv_load(uint4 *av, uint4 *wv, const bf16 *const *arow, const bf16 *We, int K,
                                               int k) {
#pragma unroll
  for (int m = 0; m < MR; m++) av[m] = *(const uint4 *)(arow[m] + k);
#pragma unroll
  for (int r = 0; r < GV_ROWS; r++) wv[r] = di_ld_stream16(We + (int64_t)r * K + k);
}

template <int MR>
static __device__ __forceinline__ void gv_fma(float (*acc)[GV_ROWS], const uint4 *av, const uint4 *wv) {
#pragma unroll
  for (int m = 0; m < MR; m++) {
    const __nv_bfloat162 *ap = (const __nv_bfloat162 *)&av[m];
    float2 a[4];
#pragma unroll
    for (int j = 0; j < 4; j++) a[j] = __bfloat1622float2(ap[j]);
#pragma unroll
    for (int r = 0; r < GV_ROWS; r++) {
      const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&wv[r];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float2 c = __bfloat1622float2(wp[j]);
        acc[m][r] = fmaf(a[j].x, c.x, fmaf(a[j].y, c.y, acc[m][r]));
      }
    }
  }
}

/* One row: pinned to 12 warps per SM (168 registers), so that V2-Lite's one-token work fits in one
 * wave; a version of this kernel the compiler gave 189 registers (8 warps per SM) ran batch 1 at 419
 * tok/s instead of 445. WARPS per CTA: at one row 1 (DEEPINFER_CUDA_GV_WARPS=4: 4): V2-Lite's 1,408
 * warps of work in 4-warp CTAs land 3 CTAs on 88 SMs and 2 on 44, and the SMs with 2 idle for the
 * last third of the kernel (Nsight Compute: SM active 83% of the time, DRAM at 68% of peak); one-warp
 * CTAs spread 11 or 10 warps per SM. */
template <int MR, int GLU, int WARPS>
static __global__ void __launch_bounds__(WARPS * 32, MR == 1 ? 12 / WARPS : 1)
grouped_gemv_kernel(const bf16 *A, int lda, const int32_t *a_rows, const bf16 *W, int N, int K,
                    const int32_t *off, const int32_t *tiles, const int32_t *n_tiles, int bm, void *C, int ldc,
                    int c_f32, int pf_tile0, int pf_expert0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * WARPS + warp) * GV_ROWS;
  if (pf_tile0 >= 0 && (int)blockIdx.y >= pf_tile0) {
    const bf16 *wp = W + ((int64_t)(pf_expert0 + (int)blockIdx.y - pf_tile0) * N + n0) * K;
    for (int r = 0; r < GV_ROWS; r++)
      for (int k = lane * 64; k < K; k += 32 * 64) di_prefetch_l2(wp + (int64_t)r * K + k);
  }
  DI_PDL_ENTRY();
  if ((int)blockIdx.y >= *n_tiles) return;
  const int tile = tiles[blockIdx.y];
  const int e = tile >> 16, ti = tile & 0xffff;
  const int m0 = off[e] + ti * bm, mend = min(off[e + 1], m0 + bm);
  const bf16 *We = W + ((int64_t)e * N + n0) * K;
  for (int mb = m0; mb < mend; mb += MR) {
    const int nm = min(MR, mend - mb);
    const bf16 *arow[MR];
    gv_act_rows<MR>(arow, A, lda, a_rows, mb, nm);
    float acc[MR][GV_ROWS];
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
      for (int r = 0; r < GV_ROWS; r++) acc[m][r] = 0.f;
    uint4 av[MR], wv[GV_ROWS];
    if constexpr (MR <= 2) {
      /* software-pipelined: the 16 weight loads of step k+256 are issued before the FMAs of step k, so
       * they stay in flight together (written plainly, the compiler interleaves loads and FMAs and
       * keeps only ~4 of them outstanding). Wider MR would spill with two sets of registers. */
      int k = lane * 8;
      if (k < K) gv_load<MR>(av, wv, arow, We, K, k);
      for (; k < K; k += 256) {
        const int kn = k + 256;
        uint4 an[MR], wn[GV_ROWS];
        if (kn < K) gv_load<MR>(an, wn, arow, We, K, kn);
        gv_fma<MR>(acc, av, wv);
        if (kn < K) {
#pragma unroll
          for (int m = 0; m < MR; m++) av[m] = an[m];
#pragma unroll
          for (int r = 0; r < GV_ROWS; r++) wv[r] = wn[r];
        }
      }
    } else {
      for (int k = lane * 8; k < K; k += 256) {
        gv_load<MR>(av, wv, arow, We, K, k);
        gv_fma<MR>(acc, av, wv);
      }
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
      float v = di_warp_sum16(acc[m], lane); /* lane l: row l >> 1 of this warp */
      if (GLU) {
        float u = __shfl_down_sync(0xffffffffu, v, 16); /* up row r + 8 sits in lane 2r + 16 */
        if (m < nm && lane < 16 && (lane & 1) == 0) {
          int col = n0 / 2 + (lane >> 1);
          ((bf16 *)C)[(int64_t)(mb + m) * ldc + col] = di_fb(v / (1.f + __expf(-v)) * u);
        }
      } else if (m < nm && (lane & 1) == 0) {
        int col = n0 + (lane >> 1);
        if (c_f32) ((float *)C)[(int64_t)(mb + m) * ldc + col] = v;
        else ((bf16 *)C)[(int64_t)(mb + m) * ldc + col] = di_fb(v);
      }
    }
  }
}

extern "C" di_status di_cuk_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, const uint16_t *W,
                                         int N, int K, const int32_t *expert_off, const int32_t *tiles,
                                         const int32_t *n_tiles, int max_tiles, int bm, int max_rows, void *C,
                                         int ldc, int c_f32, int glu, int pf_tile0, int pf_expert0,
                                         di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (N % (GV_WARPS * GV_ROWS) || K % 8 || lda % 8 || max_tiles > 65535 || ((uintptr_t)A & 15) || ((uintptr_t)W & 15))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: grouped_gemv N %d K %d lda %d tiles %d (N%%64, K%%8, aligned)", N,
                        K, lda, max_tiles);
  const int one_warp = max_rows == 1 && g_gv_one_warp;
  const dim3 grid(N / ((one_warp ? 1 : GV_WARPS) * GV_ROWS), max_tiles);
  const bf16 *a = (const bf16 *)A, *w = (const bf16 *)W;
#define GV_LAUNCH(mr, glu, warps)                                                                            \
  DI_CU(di_launch(grouped_gemv_kernel<mr, glu, warps>, grid, (warps) * 32, 0, s, a, lda, a_rows, w, N, K,       \
                  expert_off, tiles, n_tiles, bm, C, ldc, c_f32, pf_tile0, pf_expert0))
#define GV_CASE(mr)                                                                                          \
  case mr:                                                                                                   \
    if (glu) GV_LAUNCH(mr, 1, GV_WARPS);                                                                     \
    else GV_LAUNCH(mr, 0, GV_WARPS);                                                                         \
    break;
  if (one_warp) {
    if (glu) GV_LAUNCH(1, 1, 1);
    else GV_LAUNCH(1, 0, 1);
    return DI_OK;
  }
  switch (max_rows) {
    GV_CASE(1) GV_CASE(2) GV_CASE(3) GV_CASE(4)
    default: return di_error_set(DI_ERR_INVALID_ARG, "cuda: grouped_gemv with %d rows per expert (1..4)", max_rows);
  }
#undef GV_CASE
#undef GV_LAUNCH
  return DI_OK;
}

extern "C" void di_cuk_grouped_gemv_set_one_warp(int on) { g_gv_one_warp = on; }

/* The MoE down projection of a one-token step fused with the weighted combine into the residual row:
 * CTA c owns output rows 16c .. 16c+15, and its warp j streams those rows of the down matrix of the
 * token's expert slots j, j + DC_WARPS, ... (the same pipelined GEMV step as above), scales each dot
 * product by the slot's routing weight, and the warps' sums are added in warp order in shared memory
 * (the same sum on every run) and onto h. No fp32 expert outputs go through L2 and no combine kernel
 * follows; the next layer's norm is done by its q/kv GEMM (di_cu_gemm_normed). The shared experts'
 * rows (known before routing) are prefetched into L2 before the kernel waits for its predecessor. */
#define DC_WARPS 8
static __global__ void __launch_bounds__(DC_WARPS * 32)
moe_down_combine_kernel(const bf16 *act, int ld_act, const bf16 *W, int N, int K, const int32_t *ids,
                        const float *wts, const int32_t *inv, int kt, float *h, int n, int pf_expert0, int n_pf) {
  __shared__ float part[DC_WARPS][GV_ROWS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = blockIdx.x * GV_ROWS;
  for (int e = warp; e < n_pf; e += DC_WARPS) {
    const bf16 *wp = W + ((int64_t)(pf_expert0 + e) * N + n0) * K;
    for (int r = 0; r < GV_ROWS; r++)
      for (int k = lane * 64; k < K; k += 32 * 64) di_prefetch_l2(wp + (int64_t)r * K + k);
  }
  DI_PDL_ENTRY();
  float tot = 0.f; /* lane 2r: row r of this CTA */
  for (int j = warp; j < kt; j += DC_WARPS) {
    const int e = ids[j];
    const float wj = wts[j];
    const bf16 *arow[1] = {act + (int64_t)inv[j] * ld_act};
    const bf16 *We = W + ((int64_t)e * N + n0) * K;
    float acc[1][GV_ROWS];
#pragma unroll
    for (int r = 0; r < GV_ROWS; r++) acc[0][r] = 0.f;
    uint4 av[1], wv[GV_ROWS];
    int k = lane * 8;
    if (k < K) gv_load<1>(av, wv, arow, We, K, k);
    for (; k < K; k += 256) {
      const int kn = k + 256;
      uint4 an[1], wn[GV_ROWS];
      if (kn < K) gv_load<1>(an, wn, arow, We, K, kn);
      gv_fma<1>(acc, av, wv);
      if (kn < K) {
        av[0] = an[0];
#pragma unroll
        for (int r = 0; r < GV_ROWS; r++) wv[r] = wn[r];
      }
    }
    tot += wj * di_warp_sum16(acc[0], lane);
  }
  if ((lane & 1) == 0) part[warp][lane >> 1] = tot;
  __syncthreads();
  if (threadIdx.x < GV_ROWS && n0 + (int)threadIdx.x < n) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < DC_WARPS; w++) sum += part[w][threadIdx.x];
    h[n0 + threadIdx.x] += sum;
  }
}

extern "C" di_status di_cuk_moe_down_combine(const uint16_t *act, int ld_act, const uint16_t *W, int N, int K,
                                             const int32_t *ids, const float *w, const int32_t *inv, int kt,
                                             float *h, int n, int pf_expert0, int n_pf, di_cu_stream s) {
  if (N % GV_ROWS || K % 8 || ld_act % 8 || n > N || kt < 1 || ((uintptr_t)act & 15) || ((uintptr_t)W & 15))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: moe_down_combine N %d K %d ld %d n %d k %d (N%%16, K%%8, aligned)",
                        N, K, ld_act, n, kt);
  DI_CU(di_launch(moe_down_combine_kernel, N / GV_ROWS, DC_WARPS * 32, 0, s, (const bf16 *)act, ld_act,
                  (const bf16 *)W, N, K, ids, w, inv, kt, h, n, pf_expert0, n_pf));
  return DI_OK;
}

/* dst row r of matrix i: group q = r / 16, j = r % 16 -> src row (j < 8 ? 8q + j : I + 8q + j - 8) */
static __global__ void interleave_kernel(const bf16 *src, bf16 *dst, int I, int cols) {
  const int r = blockIdx.x, i = blockIdx.y;
  const int q = r / 16, j = r % 16, sr = j < 8 ? 8 * q + j : I + 8 * q + (j - 8);
  const bf16 *a = src + ((int64_t)i * 2 * I + sr) * cols;
  bf16 *b = dst + ((int64_t)i * 2 * I + r) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) b[c] = a[c];
}

extern "C" di_status di_cuk_glu_interleave(const uint16_t *src, uint16_t *dst, int n_mat, int I, int cols,
                                           di_cu_stream s) {
  if (I % 8 || n_mat <= 0 || n_mat > 65535)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: glu_interleave of %d x %d rows", n_mat, I);
  interleave_kernel<<<dim3(2 * I, n_mat), 256, 0, s>>>((const bf16 *)src, (bf16 *)dst, I, cols);
  DI_CU_LAUNCH("glu_interleave");
  return DI_OK;
}
