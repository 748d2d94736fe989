/* Dense GEMMs of the forward pass through cuBLASLt (bf16 operands, f32 accumulate; output bf16 or
 * f32, with beta = 1 fusing the residual add), and the per-head batched GEMMs of MLA's weight
 * absorption through cuBLAS. Row-major Y = X W^T is column-major Y^T = W X^T, which is how the
 * calls below are laid out. Heuristic results are cached per shape so a step does no planning. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
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

struct di_cu_blas {
  cublasLtHandle_t lt;
  cublasHandle_t h;
  void *ws;
  plan plans[MAX_PLANS];
  int n_plans;
};

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
  return DI_OK;
}

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

extern "C" di_status di_cu_gemm(di_cu_blas *b, int M, int N, int K, const uint16_t *X, int ldx,
                                const uint16_t *W, int ldw, void *Y, int ldy, int y_f32, float beta,
                                di_cu_stream s) {
  if (M <= 0) return DI_OK;
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

extern "C" di_status di_cu_gemm_batched(di_cu_blas *b, int batch, int M, int N, int K, const uint16_t *X,
                                        int ldx, int64_t sx, const uint16_t *W, int ldw, int64_t sw,
                                        int w_kn, uint16_t *Y, int ldy, int64_t sy, di_cu_stream s) {
  if (M <= 0 || batch <= 0) return DI_OK;
  LT(cublasSetStream(b->h, s));
  float alpha = 1.f, beta = 0.f;
  /* column-major Y_h^T [N x M] = op(W_h)^T-as-colmajor [N x K] . X_h^T [K x M] */
  cublasOperation_t ta = w_kn ? CUBLAS_OP_N : CUBLAS_OP_T;
  LT(cublasGemmStridedBatchedEx(b->h, ta, CUBLAS_OP_N, N, M, K, &alpha, W, CUDA_R_16BF, ldw, sw, X,
                                CUDA_R_16BF, ldx, sx, &beta, Y, CUDA_R_16BF, ldy, sy, batch,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return DI_OK;
}
