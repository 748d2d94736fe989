/* Row-wise kernels of the forward pass: token embedding gather, RMSNorm (fp32 residual stream in,
 * bf16 GEMM operand out), SiLU-and-multiply of the fused gate|up GEMM output, and row gathers (the
 * router logits live with the rest of the MoE gate in k_moe.cu).
 * The residual adds themselves are fused into the GEMM epilogues (beta = 1) and the MoE combine. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

/* tokens[t] < 0: the token sampled for output row -1 - tokens[t] of the previous step, in `sampled`
 * (device token feedback; the backend checked the row is in range) */
static __global__ void embed_kernel(const bf16 *table, const int32_t *tokens, const int32_t *sampled, int hidden,
                                    float *h) {
  DI_PDL_ENTRY();
  int t = blockIdx.x;
  int id = tokens[t];
  if (id < 0) id = sampled[-1 - id];
  const bf16 *row = table + (int64_t)id * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) h[(int64_t)t * hidden + i] = di_bf(row[i]);
}

extern "C" di_status di_cuk_embed(const uint16_t *table, const int32_t *tokens, const int32_t *sampled, int T,
                                  int hidden, float *h, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  DI_CU(di_launch(embed_kernel, T, 256, 0, s, (const bf16 *)table, tokens, sampled, hidden, h));
  DI_CU_LAUNCH("embed");
  return DI_OK;
}

/* One block per row; the row is read twice (sum of squares, then scale), the second time from L1/L2. */
/* rows (may be NULL): output row i normalizes input row rows[i] (the step's output rows before the
 * final norm, gathered on the way in) */
template <typename TI>
static __global__ void rmsnorm_kernel(const TI *x, int ldx, const float *w, int n, float eps, bf16 *out,
                                      int ldo, float *of, const int32_t *rows = NULL) {
  __shared__ float red[32];
  DI_PDL_ENTRY();
  const TI *xr = x + (int64_t)(rows ? rows[blockIdx.x] : blockIdx.x) * ldx;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = (float)xr[i];
    ss += v * v;
  }
  ss = di_block_sum(ss, red);
  float inv = rsqrtf(ss / n + eps);
  bf16 *o = out + (int64_t)blockIdx.x * ldo;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = (float)xr[i] * inv * w[i];
    o[i] = di_fb(v);
    if (of) of[(int64_t)blockIdx.x * n + i] = v;
  }
}

extern "C" di_status di_cuk_rmsnorm(const float *x, int ldx, const float *w, int T, int n, float eps,
                                    uint16_t *out, int ldo, float *out_f32, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  DI_CU(di_launch(rmsnorm_kernel<float>, T, 256, 0, s, x, ldx, w, n, eps, (bf16 *)out, ldo, out_f32, (const int32_t *)NULL));
  DI_CU_LAUNCH("rmsnorm");
  return DI_OK;
}

extern "C" di_status di_cuk_rmsnorm_rows(const float *x, int ldx, const int32_t *rows, const float *w, int T, int n,
                                         float eps, uint16_t *out, int ldo, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  DI_CU(di_launch(rmsnorm_kernel<float>, T, 256, 0, s, x, ldx, w, n, eps, (bf16 *)out, ldo, (float *)NULL, rows));
  DI_CU_LAUNCH("rmsnorm_rows");
  return DI_OK;
}

extern "C" di_status di_cuk_rmsnorm_bf16(const uint16_t *x, int ldx, const float *w, int T, int n, float eps,
                                         uint16_t *out, int ldo, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  DI_CU(di_launch(rmsnorm_kernel<bf16>, T, 256, 0, s, (const bf16 *)x, ldx, w, n, eps, (bf16 *)out, ldo, (float *)NULL,
                  (const int32_t *)NULL));
  DI_CU_LAUNCH("rmsnorm_bf16");
  return DI_OK;
}

static __global__ void silu_mul_kernel(const bf16 *gu, int64_t total, int I, bf16 *out) {
  DI_PDL_ENTRY();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = i / I;
    int c = (int)(i - t * I);
    float g = di_bf(gu[t * 2 * I + c]), u = di_bf(gu[t * 2 * I + I + c]);
    out[i] = di_fb(g / (1.f + __expf(-g)) * u);
  }
}

extern "C" di_status di_cuk_silu_mul(const uint16_t *gu, int T, int I, uint16_t *out, di_cu_stream s) {
  int64_t total = (int64_t)T * I;
  if (total <= 0) return DI_OK;
  int64_t blocks = (total + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  DI_CU(di_launch(silu_mul_kernel, (int)blocks, 256, 0, s, (const bf16 *)gu, total, I, (bf16 *)out));
  DI_CU_LAUNCH("silu_mul");
  return DI_OK;
}

static __global__ void gather_kernel(const float *in, const int32_t *rows, int cols, float *out) {
  DI_PDL_ENTRY();
  const float *src = in + (int64_t)rows[blockIdx.x] * cols;
  float *dst = out + (int64_t)blockIdx.x * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

extern "C" di_status di_cuk_gather_f32(const float *in, const int32_t *rows, int n, int cols,
                                       float *out, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  DI_CU(di_launch(gather_kernel, n, 256, 0, s, in, rows, cols, out));
  DI_CU_LAUNCH("gather");
  return DI_OK;
}
