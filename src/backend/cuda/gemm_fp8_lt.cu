/* Dense block-FP8 GEMM through cuBLASLt's block-scaled FP8 matmul (CUDA 12.9+ on sm_90): E4M3
 * operands, one f32 scale per 128 K values of every row of each operand (CUBLASLT_MATMUL_MATRIX_SCALE_
 * VEC128_32F on A and B), fp32 accumulation with the scales applied per K block: DeepGEMM's scheme,
 * with a packaged library's wgmma kernels (the prefill-sized products; decode-sized ones take the
 * tensor-core GEMV, k_fp8_tc_gemv.cu). Row-major Y = X W^T is column-major Y^T = W X^T: A = W (K x N,
 * op T), B = Xq (K x M), C = D = Y^T (N x M), the TN form FP8 requires.
 *
 * Scale layouts: cuBLASLt reads a VEC128 scale tensor outer-dimension-major, s[kb * rows + row] (the
 * rows of the operand contiguous for each 128-wide K block; on the H200 the other three layouts gave
 * relative errors of 0.07-0.6, this one 1.3e-4), so the activation quantizer writes its
 * scales transposed (di_cuk_fp8_quant_act_t) and the weight's per-row (or per-block-row) scales are
 * transposed into the workspace by a small kernel on every call (N x K / 128 floats). The scale tensors
 * have no leading dimension of their own: rows are taken in multiples of 4 (16-byte aligned columns of
 * scales), N % 4 == 0 is required and the last M % 4 rows go through the tensor-core GEMV.
 * A shape cuBLASLt has no algorithm for is remembered and answered with DI_ERR_UNSUPPORTED, so the
 * caller falls back to the mma.sync GEMM. Not batch-invariant (cuBLASLt picks kernels per shape). */
#include "k_fp8_common.cuh"
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#define LT_WS_BYTES (32u << 20)
#define LT_MAX_PLANS 128

typedef struct lt_plan {
  int M, N, K, ldq, ldw, ldy, y_f32, has_beta;
  int ok; /* 1: algo holds cuBLASLt's choice; 0: no algorithm for this shape */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

struct di_cu_fp8lt {
  cublasLtHandle_t lt;
  void *ws;
  lt_plan plans[LT_MAX_PLANS];
  int n_plans;
};

#define LT(call)                                                                             \
  do {                                                                                       \
    cublasStatus_t st_ = (call);                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      return di_error_set(DI_ERR_BACKEND, "cublasLt fp8: %s failed: status %d", #call, (int)st_); \
  } while (0)

extern "C" di_status di_cu_fp8lt_create(di_cu_fp8lt **out) {
  di_cu_fp8lt *h = (di_cu_fp8lt *)calloc(1, sizeof *h);
  if (!h) return di_error_set(DI_ERR_OOM, "cublasLt fp8: out of host memory");
  *out = h;
  LT(cublasLtCreate(&h->lt));
  DI_CU(cudaMalloc(&h->ws, LT_WS_BYTES));
  return DI_OK;
}

static void lt_plan_free(lt_plan *p) {
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  if (p->a) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) cublasLtMatrixLayoutDestroy(p->b);
  if (p->c) cublasLtMatrixLayoutDestroy(p->c);
  memset(p, 0, sizeof *p);
}

extern "C" void di_cu_fp8lt_destroy(di_cu_fp8lt *h) {
  if (!h) return;
  for (int i = 0; i < h->n_plans; i++) lt_plan_free(&h->plans[i]);
  if (h->lt) cublasLtDestroy(h->lt);
  if (h->ws) cudaFree(h->ws);
  free(h);
}

extern "C" int di_cu_fp8lt_ok(int K, di_cuk_fp8w w) {
  return K % 16 == 0 && w.block_cols == 128 && w.block_rows > 0 && w.ldq % 16 == 0 &&
         w.scale_cols >= (K + 127) / 128 && ((uintptr_t)w.q & 15) == 0;
}

static size_t lt_align(size_t n) { return (n + 255) / 256 * 256; }

extern "C" size_t di_cu_fp8lt_ws_bytes(int M, int N, int K) {
  const size_t ldq = ((size_t)K + 15) / 16 * 16, kb = ((size_t)K + 127) / 128;
  return lt_align((size_t)M * ldq) + lt_align(kb * (size_t)M * 4) + lt_align(kb * (size_t)N * 4);
}

/* out[g * N + n] = the scale of row n, K block g. */
static __global__ void lt_wscale_kernel(const float *scale, int br, int sc, int N, int kb, float *out) {
  DI_PDL_ENTRY();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (int64_t)N * kb) return;
  const int n = (int)(i % N), g = (int)(i / N);
  const float v = scale[(int64_t)(n / br) * sc + g];
  out[(int64_t)g * N + n] = v;
}

static di_status lt_make_plan(di_cu_fp8lt *h, lt_plan *p, const void *sa, const void *sb) {
  LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, p->K, p->N, p->ldw));
  LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, p->K, p->M, p->ldq));
  LT(cublasLtMatrixLayoutCreate(&p->c, p->y_f32 ? CUDA_R_32F : CUDA_R_16BF, p->N, p->M, p->ldy));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = LT_WS_BYTES;
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t res;
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  p->ok = st == CUBLAS_STATUS_SUCCESS && n > 0;
  if (p->ok) p->algo = res.algo;
  return DI_OK;
}

extern "C" di_status di_cu_fp8lt_matmul(di_cu_fp8lt *h, int M, int N, int K, const uint16_t *X, int ldx,
                                        di_cuk_fp8w w, void *Y, int ldy, int y_f32, float beta, void *ws,
                                        size_t ws_bytes, di_cu_stream s) {
  if (M <= 0 || N <= 0) return DI_OK;
  const int M4 = M / 4 * 4;
  if (!h || !di_cu_fp8lt_ok(K, w) || N % 4 || M4 == 0 || ldx % 8 || ((uintptr_t)X & 15))
    return di_error_set(DI_ERR_UNSUPPORTED, "cublasLt fp8: M %d N %d K %d block %d x %d (128-wide, K %% 16, N %% 4)", M,
                        N, K, w.block_rows, w.block_cols);
  if (!ws || ws_bytes < di_cu_fp8lt_ws_bytes(M4, N, K))
    return di_error_set(DI_ERR_INVALID_ARG, "cublasLt fp8: %d x %d x %d needs %zu workspace bytes, have %zu", M, N, K,
                        di_cu_fp8lt_ws_bytes(M4, N, K), ws_bytes);
  const int ldq = (K + 15) / 16 * 16, kb = (K + 127) / 128, hb = beta != 0.f;
  uint8_t *xq = (uint8_t *)ws;
  float *sxt = (float *)((uint8_t *)ws + lt_align((size_t)M4 * ldq));
  float *swt = (float *)((uint8_t *)sxt + lt_align((size_t)kb * M4 * 4));
  lt_plan *p = NULL;
  for (int i = 0; i < h->n_plans; i++) {
    lt_plan *q = &h->plans[i];
    if (q->M == M4 && q->N == N && q->K == K && q->ldq == ldq && q->ldw == w.ldq && q->ldy == ldy &&
        q->y_f32 == y_f32 && q->has_beta == hb) { p = q; break; }
  }
  lt_plan tmp;
  if (!p) {
    memset(&tmp, 0, sizeof tmp);
    tmp.M = M4; tmp.N = N; tmp.K = K; tmp.ldq = ldq; tmp.ldw = w.ldq; tmp.ldy = ldy; tmp.y_f32 = y_f32; tmp.has_beta = hb;
    DI_TRY(lt_make_plan(h, &tmp, swt, sxt));
    if (h->n_plans < LT_MAX_PLANS) {
      h->plans[h->n_plans] = tmp;
      p = &h->plans[h->n_plans++];
    } else {
      p = &tmp;
    }
  }
  if (!p->ok) {
    if (p == &tmp) lt_plan_free(&tmp);
    return di_error_set(DI_ERR_UNSUPPORTED, "cublasLt fp8: no algorithm for %d x %d x %d", M4, N, K);
  }
  DI_TRY(di_cuk_fp8_quant_act_t(X, ldx, M4, K, xq, ldq, sxt, M4, s));
  const int64_t ns = (int64_t)N * kb;
  DI_CU(di_launch(lt_wscale_kernel, dim3((unsigned)((ns + 255) / 256)), 256, 0, s, w.scale, w.block_rows, w.scale_cols,
                  N, kb, swt));
  DI_CU_LAUNCH("fp8lt_wscale");
  const void *sa = swt, *sb = sxt;
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
  LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  const float alpha = 1.f;
  LT(cublasLtMatmul(h->lt, p->op, &alpha, w.q, p->a, xq, p->b, &beta, Y, p->c, Y, p->c, &p->algo, h->ws, LT_WS_BYTES,
                    s));
  if (p == &tmp) lt_plan_free(&tmp); /* not cached (the plan table is full) */
  if (M4 < M) {
    const size_t esz = y_f32 ? 4 : 2;
    return di_cuk_fp8_tc_gemv(M - M4, N, K, X + (size_t)M4 * ldx, ldx, w, (uint8_t *)Y + (size_t)M4 * ldy * esz, ldy,
                              y_f32, beta, s);
  }
  return DI_OK;
}
