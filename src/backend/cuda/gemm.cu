/* Dense GEMMs of the forward pass through cuBLASLt (bf16 operands, f32 accumulate; output bf16 or
 * f32, with beta = 1 fusing the residual add), a skinny kernel of our own for decode-sized M, and
 * the per-head batched GEMMs of MLA's weight absorption (ours at decode-sized M, else cuBLAS). Row-major Y = X W^T is column-major Y^T = W X^T, which is how the
 * calls below are laid out. Heuristic results are cached per shape so a step does no planning. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "k_skinny_kn.cuh"
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#define WS_BYTES (32u << 20)
#define MAX_PLANS 256

typedef struct plan {
  int M, N, K, ldx, ldw, ldy, y_f32, has_beta;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
} plan;

#define SK_MAXM_ 8 /* = SK_MAXM (below) */
struct di_cu_blas {
  cublasLtHandle_t lt;
  cublasHandle_t h;
  void *ws;
  plan plans[MAX_PLANS];
  int n_plans;
  int no_skinny; /* tests: force the cuBLASLt path */
  int invariant; /* batch-invariant mode (di_cu_blas_set_invariant) */
  int tc;        /* invariant GEMMs on the tensor-core kernel (di_cu_blas_set_tc) */
  float *tc_ws;  /* its split partials at decode-sized M (TC_WS_BYTES) */
  int tc_default_minm; /* default mode: GEMMs of this <= M <= SK_MAXM on the tensor-core kernel (di_cu_blas_set_tc_default) */
  int rows_min_n;      /* DEEPINFER_CUDA_SKINNY_ROWS: default-mode skinny GEMMs of >= this many outputs on skinny_rows_kernel */
  int rows_grid[SK_MAXM_ + 1]; /* its persistent grid per M (0: not yet asked) */
};
#define TC_WS_BYTES (16u << 20)

#define LT(call)                                                                               \
  do {                                                                                         \
    cublasStatus_t st_ = (call);                                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
      return di_error_set(DI_ERR_BACKEND, "cublas: %s failed: status %d", #call, (int)st_);   \
  } while (0)

extern "C" di_status di_cu_blas_create(di_cu_blas **out) {
  di_cu_blas *b = (di_cu_blas *)calloc(1, sizeof *b);
  if (!b) return di_error_set(DI_ERR_OOM, "cublas: out of host memory");
  *out = b;
  LT(cublasLtCreate(&b->lt));
  LT(cublasCreate(&b->h));
  DI_CU(cudaMalloc(&b->ws, WS_BYTES));
  LT(cublasSetWorkspace(b->h, b->ws, WS_BYTES));
  LT(cublasSetMathMode(b->h, CUBLAS_DEFAULT_MATH));
  DI_CU(cudaMalloc(&b->tc_ws, TC_WS_BYTES));
  DI_CU(cudaMemset(b->tc_ws, 0, TC_WS_BYTES)); /* di_cuk_tc_gemm's tile counters start at zero */
  return DI_OK;
}

extern "C" void di_cu_blas_set_skinny(di_cu_blas *b, int on) { b->no_skinny = !on; }
extern "C" void di_cu_blas_set_invariant(di_cu_blas *b, int on) { b->invariant = on; }
extern "C" void di_cu_blas_set_tc(di_cu_blas *b, int on) { b->tc = on; }
extern "C" int di_cu_blas_tc_invariant(const di_cu_blas *b) { return b->invariant && b->tc; }
extern "C" void di_cu_blas_set_tc_default(di_cu_blas *b, int min_m) { b->tc_default_minm = min_m; }
extern "C" void di_cu_blas_set_skinny_rows(di_cu_blas *b, int min_n) { b->rows_min_n = min_n; }

extern "C" void di_cu_blas_destroy(di_cu_blas *b) {
  if (!b) return;
  for (int i = 0; i < b->n_plans; i++) {
    cublasLtMatmulDescDestroy(b->plans[i].op);
    cublasLtMatrixLayoutDestroy(b->plans[i].a);
    cublasLtMatrixLayoutDestroy(b->plans[i].b);
    cublasLtMatrixLayoutDestroy(b->plans[i].c);
  }
  if (b->h) cublasDestroy(b->h);
  if (b->lt) cublasLtDestroy(b->lt);
  if (b->ws) cudaFree(b->ws);
  if (b->tc_ws) cudaFree(b->tc_ws);
  free(b);
}

static di_status make_plan(di_cu_blas *b, plan *p) {
  LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  /* column-major: A = W as [K x N] (ld ldw), op T; B = X as [K x M] (ld ldx); C = Y^T [N x M] */
  LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, p->K, p->N, p->ldw));
  LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, p->K, p->M, p->ldx));
  LT(cublasLtMatrixLayoutCreate(&p->c, p->y_f32 ? CUDA_R_32F : CUDA_R_16BF, p->N, p->M, p->ldy));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = WS_BYTES;
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t res;
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(b->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n == 0)
    return di_error_set(DI_ERR_BACKEND, "cublasLt: no algorithm for %dx%dx%d (status %d)", p->M, p->N,
                        p->K, (int)st);
  p->algo = res.algo;
  return DI_OK;
}

/* Skinny GEMM for decode-sized M (<= SK_MAXM): Y = X W^T streams W once at close to memory bandwidth,
 * where a tiled library GEMM would launch too few CTAs (one per 128 output columns) or add a split-K
 * reduction. One warp per SK_NR output columns; each lane reads 16 bytes of each W row per step of
 * 256 columns and the matching X values (X is tiny and stays in L1); the dot products are reduced
 * across the warp. The W loads go in chunks of SK_U steps, software-pipelined (chunk c+1 is issued
 * before chunk c is used): written as a plain loop the compiler interleaved loads and FMAs and kept
 * ~2 loads per lane in flight, about 1 TB/s on the H200. The warp's rows are prefetched into L2
 * before the kernel waits for its predecessor (PDL), so the streaming overlaps the previous kernel. */
#define SK_MAXM 8
#define SK_WARPS 4

/* Default mode: whether M rows go to the tensor-core kernel instead of the skinny one (at 8 rows it
 * measured 1.16-1.84x the skinny kernel at V2-Lite's shapes; at one row mostly slower). */
static int tc_default(const di_cu_blas *b, int M) {
  return !b->invariant && b->tc_default_minm > 0 && M >= b->tc_default_minm && M <= SK_MAXM;
}

template <int NR, int U>
static __device__ __forceinline__ void sk_load(uint4 (*w)[U], const bf16 *const *wr, int K, int k0, int lane) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int k = k0 + u * 256 + lane * 8;
#pragma unroll
    for (int r = 0; r < NR; r++) w[r][u] = k < K ? di_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
  }
}

/* The activations of step k of row m as 8 floats: bf16 X as stored, or (NORM) the RMSNorm of the f32
 * residual row computed on the fly, rounded to bf16 as rmsnorm_kernel writes it. */
template <int NORM>
static __device__ __forceinline__ void sk_x8(float *a, const void *X, int64_t off, const float *nw, int k, float inv) {
  if constexpr (NORM) {
    const float4 h0 = __ldg((const float4 *)((const float *)X + off)), h1 = __ldg((const float4 *)((const float *)X + off) + 1);
    const float4 w0 = __ldg((const float4 *)(nw + k)), w1 = __ldg((const float4 *)(nw + k) + 1);
    a[0] = di_bf(di_fb(h0.x * inv * w0.x)); a[1] = di_bf(di_fb(h0.y * inv * w0.y));
    a[2] = di_bf(di_fb(h0.z * inv * w0.z)); a[3] = di_bf(di_fb(h0.w * inv * w0.w));
    a[4] = di_bf(di_fb(h1.x * inv * w1.x)); a[5] = di_bf(di_fb(h1.y * inv * w1.y));
    a[6] = di_bf(di_fb(h1.z * inv * w1.z)); a[7] = di_bf(di_fb(h1.w * inv * w1.w));
  } else {
    uint4 xv = __ldg((const uint4 *)((const bf16 *)X + off));
    const __nv_bfloat162 *xp = (const __nv_bfloat162 *)&xv;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float2 f = __bfloat1622float2(xp[j]);
      a[2 * j] = f.x;
      a[2 * j + 1] = f.y;
    }
  }
}

template <int M, int NORM, int NR, int U>
static __device__ __forceinline__ void sk_fma(float (*acc)[M], const uint4 (*w)[U], const void *X, int ldx, int K,
                                              int k0, int lane, const float *nw, const float *inv) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int k = k0 + u * 256 + lane * 8;
    if (k >= K) break;
#pragma unroll
    for (int m = 0; m < M; m++) {
      float a[8];
      sk_x8<NORM>(a, X, (int64_t)m * ldx + k, nw, k, NORM ? inv[m] : 0.f);
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&w[r][u];
#pragma unroll
        for (int j = 0; j < 4; j++) {
          float2 c = __bfloat1622float2(wp[j]);
          acc[r][m] = fmaf(a[2 * j], c.x, fmaf(a[2 * j + 1], c.y, acc[r][m]));
        }
      }
    }
  }
}

/* NORM: X is the f32 residual stream and the kernel applies RMSNorm (weights nw, eps) to it on the
 * way in, which saves the decode layer a norm kernel. The sum of squares of each of the M rows is
 * reduced by the CTA's 4 warps over quarters of the row, through shared memory, in warp order (the
 * same value in every CTA), while the first weight chunk is in flight.
 * NR x U: each warp owns NR output columns and keeps U steps of 256 columns of each in flight
 * (chunked, software-pipelined). 2 x 4 is used: at one row, 1 x 8 measured 423 and 4 x 2 432 vs 438
 * tok/s (V2-Lite shape, batch 1, same call). */
template <int M, int NORM, int NR, int U>
static __global__ void __launch_bounds__(SK_WARPS * 32)
skinny_kernel(const void *X, int ldx, const bf16 *W, int ldw, int N, int K, void *Y, int ldy, int y_f32,
              float beta, int64_t sx, int64_t sw, int64_t sy, const float *nw, float eps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  X = NORM ? (const void *)((const float *)X + sx * blockIdx.y) : (const void *)((const bf16 *)X + sx * blockIdx.y);
  W += sw * blockIdx.y;
  Y = y_f32 ? (void *)((float *)Y + sy * blockIdx.y) : (void *)((bf16 *)Y + sy * blockIdx.y);
  const int n0 = (blockIdx.x * SK_WARPS + warp) * NR;
  /* this warp's weight rows into L2 while the previous kernel finishes (weights are never written) */
  if (n0 < N)
    for (int r = 0; r < NR && n0 + r < N; r++)
      for (int k = lane * 64; k < K; k += 32 * 64) di_prefetch_l2(W + (int64_t)(n0 + r) * ldw + k);
  DI_PDL_ENTRY();
  if (!NORM && n0 >= N) return;
  float acc[NR][M];
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int m = 0; m < M; m++) acc[r][m] = 0.f;
  const bf16 *wr[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) wr[r] = W + (int64_t)(n0 + r < N ? n0 + r : (n0 < N ? n0 : 0)) * ldw; /* past N: a copy */
  uint4 cur[NR][U], nxt[NR][U];
  const int chunk = U * 256;
  if (n0 < N) sk_load<NR, U>(cur, wr, K, 0, lane);
  float inv[M];
  if constexpr (NORM) {
    __shared__ float part[SK_WARPS][M];
    const int q = K / 4 / SK_WARPS; /* float4s per warp's quarter (K % 8 == 0 is checked; a tail goes to the last warp) */
    const int i0 = warp * q, i1 = warp == SK_WARPS - 1 ? K / 4 : i0 + q;
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float4 *xr = (const float4 *)((const float *)X + (int64_t)m * ldx);
      float ss = 0.f;
#pragma unroll 4
      for (int i = i0 + lane; i < i1; i += 32) {
        float4 v = __ldg(xr + i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) part[warp][m] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; m++) {
      float ss = 0.f;
#pragma unroll
      for (int w = 0; w < SK_WARPS; w++) ss += part[w][m];
      inv[m] = rsqrtf(ss / K + eps);
    }
    if (n0 >= N) return;
  }
  for (int k0 = 0; k0 < K; k0 += chunk) {
    const bool more = k0 + chunk < K;
    if (more) sk_load<NR, U>(nxt, wr, K, k0 + chunk, lane);
    sk_fma<M, NORM, NR, U>(acc, cur, X, ldx, K, k0, lane, nw, inv);
    if (more) {
#pragma unroll
      for (int r = 0; r < NR; r++)
#pragma unroll
        for (int u = 0; u < U; u++) cur[r][u] = nxt[r][u];
    }
  }
  gv_reduce_store<NR, M>(acc, lane, n0, N, 0, M, Y, ldy, y_f32, beta);
}

/* skinny_kernel's product (no norm, one matrix) with each warp walking row pairs n0, n0 + step, ... (a grid of as
 * many CTAs as fit the SMs at once) instead of one pair a warp: a row pair's first chunk is loaded while the
 * previous pair's last chunk is multiplied, so a warp keeps its loads in flight across its rows, and the grid has
 * no CTA turnover (one-row V2-Lite lm_head: 51,200 warps of 8 KB each otherwise). Each row's arithmetic is
 * skinny_kernel's (the same loads into the same sk_fma chain and gv_reduce_store): the same bits. */
template <int M, int NR, int U>
static __global__ void __launch_bounds__(SK_WARPS * 32)
skinny_rows_kernel(const bf16 *X, int ldx, const bf16 *W, int ldw, int N, int K, void *Y, int ldy, int y_f32,
                   float beta) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, step = gridDim.x * SK_WARPS * NR;
  int n0 = (blockIdx.x * SK_WARPS + warp) * NR;
  if (n0 < N) /* the first pair's rows into L2 before the wait (weights are never written) */
    for (int r = 0; r < NR && n0 + r < N; r++)
      for (int k = lane * 64; k < K; k += 32 * 64) di_prefetch_l2(W + (int64_t)(n0 + r) * ldw + k);
  DI_PDL_ENTRY();
  if (n0 >= N) return;
  const bf16 *wr[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) wr[r] = W + (int64_t)(n0 + r < N ? n0 + r : n0) * ldw; /* past N: a copy */
  uint4 cur[NR][U], nxt[NR][U];
  const int chunk = U * 256;
  sk_load<NR, U>(cur, wr, K, 0, lane);
  for (; n0 < N; n0 += step) {
    float acc[NR][M];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
      for (int m = 0; m < M; m++) acc[r][m] = 0.f;
    const int n1 = n0 + step;
    for (int k0 = 0; k0 < K; k0 += chunk) {
      const bool more = k0 + chunk < K, next = !more && n1 < N;
      if (more) sk_load<NR, U>(nxt, wr, K, k0 + chunk, lane);
      else if (next) { /* the next pair's first chunk */
#pragma unroll
        for (int r = 0; r < NR; r++) wr[r] = W + (int64_t)(n1 + r < N ? n1 + r : n1) * ldw;
        sk_load<NR, U>(nxt, wr, K, 0, lane);
      }
      sk_fma<M, 0, NR, U>(acc, cur, X, ldx, K, k0, lane, NULL, NULL);
      if (more || next) {
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
          for (int u = 0; u < U; u++) cur[r][u] = nxt[r][u];
      }
    }
    gv_reduce_store<NR, M>(acc, lane, n0, N, 0, M, Y, ldy, y_f32, beta);
  }
}

static di_status skinny_rows(di_cu_blas *b, int M, int N, int K, const void *X, int ldx, const uint16_t *W, int ldw,
                             void *Y, int ldy, int y_f32, float beta, cudaStream_t s) {
  int &grid = b->rows_grid[M];
  if (grid == 0) { /* as many CTAs as are resident at once (asked once per M) */
    int dev = 0, sms = 0, per = 0;
    DI_CU(cudaGetDevice(&dev));
    DI_CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    switch (M) {
#define SR_OCC(m) \
  case m: DI_CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, skinny_rows_kernel<m, 2, 4>, SK_WARPS * 32, 0)); break;
      SR_OCC(1) SR_OCC(2) SR_OCC(3) SR_OCC(4) SR_OCC(5) SR_OCC(6) SR_OCC(7) SR_OCC(8)
#undef SR_OCC
    }
    grid = sms * (per > 0 ? per : 1);
  }
  const int need = (N + SK_WARPS * 2 - 1) / (SK_WARPS * 2), blocks = need < grid ? need : grid;
  const bf16 *w = (const bf16 *)W, *x = (const bf16 *)X;
  switch (M) {
#define SR_CASE(m) \
  case m: DI_CU(di_launch(skinny_rows_kernel<m, 2, 4>, blocks, SK_WARPS * 32, 0, s, x, ldx, w, ldw, N, K, Y, ldy, y_f32, beta)); break;
    SR_CASE(1) SR_CASE(2) SR_CASE(3) SR_CASE(4) SR_CASE(5) SR_CASE(6) SR_CASE(7) SR_CASE(8)
#undef SR_CASE
  }
  DI_CU_LAUNCH("skinny_rows");
  return DI_OK;
}

static bool skinny_ok(int M, int K, const void *X, int ldx, const void *W, int ldw) {
  return M >= 1 && M <= SK_MAXM && K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && ((uintptr_t)X & 15) == 0 &&
         ((uintptr_t)W & 15) == 0;
}

static di_status skinny(int M, int N, int K, const void *X, int ldx, const uint16_t *W, int ldw, void *Y, int ldy,
                        int y_f32, float beta, cudaStream_t s, int batch = 1, int64_t sx = 0, int64_t sw = 0,
                        int64_t sy = 0, const float *nw = NULL, float eps = 0.f) {
  const bf16 *w = (const bf16 *)W;
  const dim3 blocks((N + SK_WARPS * 2 - 1) / (SK_WARPS * 2), batch);
  switch (M * 2 + (nw != NULL)) {
#define SK_CASE(m, nm) \
  case m * 2 + nm: \
    DI_CU(di_launch(skinny_kernel<m, nm, 2, 4>, blocks, SK_WARPS * 32, 0, s, X, ldx, w, ldw, N, K, Y, ldy, y_f32, beta, sx, sw, sy, nw, eps)); \
    break;
#define SK_CASE2(m) SK_CASE(m, 0) SK_CASE(m, 1)
    SK_CASE2(1) SK_CASE2(2) SK_CASE2(3) SK_CASE2(4) SK_CASE2(5) SK_CASE2(6) SK_CASE2(7) SK_CASE2(8)
#undef SK_CASE2
#undef SK_CASE
  }
  DI_CU_LAUNCH("skinny_gemm");
  return DI_OK;
}

/* Row m0 of a product's Y, as a pointer (bf16 or f32 Y) */
static void *y_row(void *Y, int ldy, int y_f32, int m0) {
  return y_f32 ? (void *)((float *)Y + (int64_t)m0 * ldy) : (void *)((uint16_t *)Y + (int64_t)m0 * ldy);
}

extern "C" int di_cu_gemm_normed_ok(di_cu_blas *b, int M, int K, int ldx) {
  if (di_cu_blas_tc_invariant(b) || tc_default(b, M)) return 0; /* the tensor-core kernel (its own arithmetic) */
  return !b->no_skinny && M >= 1 && (M <= SK_MAXM || b->invariant) && K % 8 == 0 && ldx % 4 == 0;
}

extern "C" di_status di_cu_gemm_normed(di_cu_blas *b, int M, int N, int K, const float *H, int ldh,
                                       const float *norm_w, float eps, const uint16_t *W, int ldw, void *Y, int ldy,
                                       int y_f32, di_cu_stream s) {
  if (M <= 0) return DI_OK;
  if (!di_cu_gemm_normed_ok(b, M, K, ldh) || ((uintptr_t)H & 15) || ((uintptr_t)norm_w & 15) ||
      ((uintptr_t)W & 15) || ldw % 8)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: normed skinny GEMM %dx%dx%d (M <= %d, K %% 8, aligned)", M, N, K,
                        SK_MAXM);
  for (int m0 = 0; m0 < M; m0 += SK_MAXM) /* more than SK_MAXM rows: batch-invariant mode, in chunks */
    DI_TRY(skinny(M - m0 < SK_MAXM ? M - m0 : SK_MAXM, N, K, H + (int64_t)m0 * ldh, ldh, W, ldw,
                  y_row(Y, ldy, y_f32, m0), ldy, y_f32, 0.f, s, 1, 0, 0, 0, norm_w, eps));
  return DI_OK;
}

/* The [K][N] skinny GEMM batched over heads (grid.y); the tile itself is in k_skinny_kn.cuh. */
template <int M>
static __global__ void __launch_bounds__(KN_THREADS)
skinny_kn_kernel(const bf16 *X, int ldx, int64_t sx, const bf16 *W, int ldw, int64_t sw, int N, int K,
                 bf16 *Y, int ldy, int64_t sy) {
  X += sx * blockIdx.y;
  W += sw * blockIdx.y;
  Y += sy * blockIdx.y;
  kn_prefetch(W, ldw, N, K, blockIdx.x);
  DI_PDL_ENTRY();
  kn_tile<M>(X, ldx, W, ldw, N, K, Y, ldy, blockIdx.x);
}

static di_status skinny_kn(int M, int N, int K, const uint16_t *X, int ldx, int64_t sx, const uint16_t *W, int ldw,
                           int64_t sw, uint16_t *Y, int ldy, int64_t sy, int batch, cudaStream_t s) {
  const dim3 blocks((N + KN_COLS - 1) / KN_COLS, batch);
  const bf16 *x = (const bf16 *)X, *w = (const bf16 *)W;
  bf16 *y = (bf16 *)Y;
  switch (M) {
#define KN_CASE(m) \
  case m: DI_CU(di_launch(skinny_kn_kernel<m>, blocks, KN_THREADS, 0, s, x, ldx, sx, w, ldw, sw, N, K, y, ldy, sy)); break;
    KN_CASE(1) KN_CASE(2) KN_CASE(3) KN_CASE(4) KN_CASE(5) KN_CASE(6) KN_CASE(7) KN_CASE(8)
#undef KN_CASE
  }
  return DI_OK;
}

static di_status lt_gemm(di_cu_blas *b, int M, int N, int K, const uint16_t *X, int ldx, const uint16_t *W, int ldw,
                         void *Y, int ldy, int y_f32, float beta, cudaStream_t s);

/* The batch-invariant fallback for shapes the skinny kernels do not take (K or a leading dimension not
 * a multiple of 8, unaligned rows: only odd test fixtures): one warp per output element, lanes strided
 * over K, a fixed reduction; any alignment. grid (N / 8, M, batch); w_kn: W stored [K][N]. */
static __global__ void __launch_bounds__(256)
rowdot_kernel(const bf16 *X, int ldx, int64_t sx, const bf16 *W, int ldw, int64_t sw, int w_kn, int N, int K, void *Y,
              int ldy, int64_t sy, int y_f32, float beta) {
  DI_PDL_ENTRY();
  const int lane = threadIdx.x & 31, n = blockIdx.x * 8 + (threadIdx.x >> 5), m = blockIdx.y, z = blockIdx.z;
  if (n >= N) return;
  const bf16 *x = X + sx * z + (int64_t)m * ldx, *w = W + sw * z;
  float acc = 0.f;
  for (int k = lane; k < K; k += 32)
    acc = fmaf(di_bf(x[k]), di_bf(w_kn ? w[(int64_t)k * ldw + n] : w[(int64_t)n * ldw + k]), acc);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane) return;
  if (y_f32) {
    float *y = (float *)Y + sy * z + (int64_t)m * ldy + n;
    *y = beta != 0.f ? acc + beta * *y : acc;
  } else {
    ((bf16 *)Y)[sy * z + (int64_t)m * ldy + n] = di_fb(acc);
  }
}

static di_status rowdot(int batch, int M, int N, int K, const uint16_t *X, int ldx, int64_t sx, const uint16_t *W,
                        int ldw, int64_t sw, int w_kn, void *Y, int ldy, int64_t sy, int y_f32, float beta,
                        cudaStream_t s) {
  if (batch > 65535 || M > 65535)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: batch-invariant GEMM of %d x %d rows", batch, M);
  DI_CU(di_launch(rowdot_kernel, dim3((N + 7) / 8, M, batch), 256, 0, s, (const bf16 *)X, ldx, sx, (const bf16 *)W,
                  ldw, sw, w_kn, N, K, Y, ldy, sy, y_f32, beta));
  return DI_OK;
}

/* Batch-invariant mode (di_cu_blas_set_invariant): each row of a product gets the same arithmetic
 * whatever M is and wherever the row sits. The skinny kernels' per-row chain of FMAs and warp
 * reduction does not depend on M, so they run in chunks of at most SK_MAXM rows; shapes they do not
 * take go to rowdot_kernel; with di_cu_blas_set_tc, every shape k_tc_gemm.cu takes goes there instead
 * (tensor cores, the same bits at every M). (Not cuBLAS row by row: its choice of kernel may follow a row's address
 * alignment, i.e. the row's place in the batch.) */
extern "C" di_status di_cu_gemm(di_cu_blas *b, int M, int N, int K, const uint16_t *X, int ldx,
                                const uint16_t *W, int ldw, void *Y, int ldy, int y_f32, float beta,
                                di_cu_stream s) {
  if (M <= 0) return DI_OK;
  if (b->invariant && b->tc && di_cuk_tc_gemm_ok(N, K, ldx, ldw, 0, X, W))
    return di_cuk_tc_gemm(1, M, N, K, X, ldx, 0, W, ldw, 0, 0, Y, ldy, 0, y_f32, beta, b->tc_ws, TC_WS_BYTES, s);
  if (b->invariant) {
    if (!skinny_ok(1, K, X, ldx, W, ldw)) return rowdot(1, M, N, K, X, ldx, 0, W, ldw, 0, 0, Y, ldy, 0, y_f32, beta, s);
    for (int m0 = 0; m0 < M; m0 += SK_MAXM)
      DI_TRY(skinny(M - m0 < SK_MAXM ? M - m0 : SK_MAXM, N, K, X + (int64_t)m0 * ldx, ldx, W, ldw,
                    y_row(Y, ldy, y_f32, m0), ldy, y_f32, beta, s));
    return DI_OK;
  }
  if (tc_default(b, M) && di_cuk_tc_gemm_ok(N, K, ldx, ldw, 0, X, W))
    return di_cuk_tc_gemm(1, M, N, K, X, ldx, 0, W, ldw, 0, 0, Y, ldy, 0, y_f32, beta, b->tc_ws, TC_WS_BYTES, s);
  if (skinny_ok(M, K, X, ldx, W, ldw) && !b->no_skinny && b->rows_min_n > 0 && N >= b->rows_min_n)
    return skinny_rows(b, M, N, K, X, ldx, W, ldw, Y, ldy, y_f32, beta, s); /* DEEPINFER_CUDA_SKINNY_ROWS */
  if (skinny_ok(M, K, X, ldx, W, ldw) && !b->no_skinny) return skinny(M, N, K, X, ldx, W, ldw, Y, ldy, y_f32, beta, s);
  return lt_gemm(b, M, N, K, X, ldx, W, ldw, Y, ldy, y_f32, beta, s);
}

static di_status lt_gemm(di_cu_blas *b, int M, int N, int K, const uint16_t *X, int ldx, const uint16_t *W, int ldw,
                         void *Y, int ldy, int y_f32, float beta, cudaStream_t s) {
  int hb = beta != 0.f;
  plan *p = NULL;
  for (int i = 0; i < b->n_plans; i++) {
    plan *q = &b->plans[i];
    if (q->M == M && q->N == N && q->K == K && q->ldx == ldx && q->ldw == ldw && q->ldy == ldy &&
        q->y_f32 == y_f32 && q->has_beta == hb) { p = q; break; }
  }
  plan tmp;
  if (!p) {
    memset(&tmp, 0, sizeof tmp);
    tmp.M = M; tmp.N = N; tmp.K = K; tmp.ldx = ldx; tmp.ldw = ldw; tmp.ldy = ldy;
    tmp.y_f32 = y_f32; tmp.has_beta = hb;
    DI_TRY(make_plan(b, &tmp));
    if (b->n_plans < MAX_PLANS) {
      b->plans[b->n_plans] = tmp;
      p = &b->plans[b->n_plans++];
    } else {
      p = &tmp; /* not cached: leaked descriptors are bounded by the shapes in use */
    }
  }
  float alpha = 1.f;
  LT(cublasLtMatmul(b->lt, p->op, &alpha, W, p->a, X, p->b, &beta, Y, p->c, Y, p->c, &p->algo, b->ws,
                    WS_BYTES, s));
  return DI_OK;
}

static di_status batched(di_cu_blas *b, int batch, int M, int N, int K, const uint16_t *X, int ldx, int64_t sx,
                         const uint16_t *W, int ldw, int64_t sw, int w_kn, uint16_t *Y, int ldy, int64_t sy,
                         cudaStream_t s) {
  if (!w_kn && !b->no_skinny && skinny_ok(M, K, X, ldx, W, ldw) && sx % 8 == 0 && sw % 8 == 0)
    return skinny(M, N, K, X, ldx, W, ldw, Y, ldy, 0, 0.f, s, batch, sx, sw, sy);
  if (w_kn && !b->no_skinny && kn_ok(M, N, ldw, sw, W) && batch <= 65535)
    return skinny_kn(M, N, K, X, ldx, sx, W, ldw, sw, Y, ldy, sy, batch, s);
  LT(cublasSetStream(b->h, s));
  float alpha = 1.f, beta = 0.f;
  /* column-major Y_h^T [N x M] = op(W_h)^T-as-colmajor [N x K] . X_h^T [K x M] */
  cublasOperation_t ta = w_kn ? CUBLAS_OP_N : CUBLAS_OP_T;
  LT(cublasGemmStridedBatchedEx(b->h, ta, CUBLAS_OP_N, N, M, K, &alpha, W, CUDA_R_16BF, ldw, sw, X,
                                CUDA_R_16BF, ldx, sx, &beta, Y, CUDA_R_16BF, ldy, sy, batch,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return DI_OK;
}

extern "C" di_status di_cu_gemm_batched(di_cu_blas *b, int batch, int M, int N, int K, const uint16_t *X,
                                        int ldx, int64_t sx, const uint16_t *W, int ldw, int64_t sw,
                                        int w_kn, uint16_t *Y, int ldy, int64_t sy, di_cu_stream s) {
  if (M <= 0 || batch <= 0) return DI_OK;
  if (!b->invariant) return batched(b, batch, M, N, K, X, ldx, sx, W, ldw, sw, w_kn, Y, ldy, sy, s);
  if (b->tc && di_cuk_tc_gemm_ok(N, K, ldx, ldw, w_kn, X, W) && sx % 8 == 0 && sw % 8 == 0)
    return di_cuk_tc_gemm(batch, M, N, K, X, ldx, sx, W, ldw, sw, w_kn, Y, ldy, sy, 0, 0.f, b->tc_ws, TC_WS_BYTES, s);
  /* batch-invariant mode (see di_cu_gemm): the skinny kernels in chunks of SK_MAXM rows, else rowdot */
  const int sk = w_kn ? kn_ok(1, N, ldw, sw, W) && batch <= 65535
                      : skinny_ok(1, K, X, ldx, W, ldw) && sx % 8 == 0 && sw % 8 == 0;
  if (!sk) return rowdot(batch, M, N, K, X, ldx, sx, W, ldw, sw, w_kn, Y, ldy, sy, 0, 0.f, s);
  for (int m0 = 0; m0 < M; m0 += SK_MAXM)
    DI_TRY(batched(b, batch, M - m0 < SK_MAXM ? M - m0 : SK_MAXM, N, K, X + (int64_t)m0 * ldx, ldx, sx, W, ldw, sw,
                   w_kn, Y + (int64_t)m0 * ldy, ldy, sy, s));
  return DI_OK;
}
