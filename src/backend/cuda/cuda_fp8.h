/* C entry points of the CUDA backend's block-FP8 kernels (k_fp8_gemv.cu, k_fp8_gemm.cu): weights kept
 * on the device as stored in DeepSeek's checkpoints, FP8 E4M3 [N][K] with F32 block scales
 * [ceil(N / block_rows)][scale_cols] (UE8M0 scales are widened to F32 at upload: exact). Device
 * pointers in, launched on `stream`, no sync; bf16 data as uint16_t (raw bits).
 *
 * Two kinds of product, which round differently:
 *   - the decode GEMV (W8A16): bf16 activations times the weights dequantized in registers,
 *     fp32 accumulation; any block shape, partial blocks at every edge; bandwidth-bound (each FP8
 *     weight byte read once per call). Rows do not interact: a row's result is the same whatever M
 *     is (batch-invariant).
 *   - the tensor-core GEMM (W8A8, DeepGEMM's scheme): activations quantized on the fly to E4M3 with
 *     one f32 scale per row per 128 columns (di_cuk_fp8_quant_act), mma.sync m16n8k32 e4m3 with
 *     fp32 accumulation, the partial sums of each 128-wide K block promoted into the fp32
 *     accumulator with (activation scale x weight scale). Needs 128-wide weight blocks (any height).
 * The grouped (MoE expert) forms take the same tile lists as di_cuk_grouped_gemm (cuda_kernels.h):
 * W is [E][N][K] with scales [E][ceil(N / block_rows)][scale_cols] back to back. */
#ifndef DI_CUDA_FP8_H
#define DI_CUDA_FP8_H
#include <stdint.h>
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif
typedef struct CUstream_st *di_cu_stream;

typedef struct di_cuk_fp8w {
  const uint8_t *q;      /* E4M3 [N][K] (or [E][N][K]), rows ldq bytes apart */
  const float *scale;    /* [ceil(N / block_rows)][scale_cols] (per expert, back to back) */
  int ldq;               /* bytes between rows (K for a packed matrix) */
  int block_rows, block_cols, scale_cols;
} di_cuk_fp8w;

/* One activation row's forms of di_cuk_fp8_gemv and the grouped GEMV (not GLU): 0 (the default) FG_NR rows a warp in
 * 4-step chunks; 1 / 2 rows a warp and chunks chosen by K (the same bits); negative: the default. For A/B benchmarks;
 * not thread-safe. */
void di_cuk_fp8_gemv1_form(int form);
/* One f32 activation row x (16-byte aligned) through di_cuk_fp8_gemv's one-row product, rounded to bf16 as it is loaded:
 * y[n] (f32) bit-equal to di_cuk_fp8_gemv over a bf16 copy of x (the same form: di_cuk_fp8_gemv1_form), without
 * the rounding launch. The grouped form: di_cuk_fp8_grouped_gemv's one-row pass with f32 rows of A (lda floats apart)
 * and f32 out. di_cuk_fp8_f32x(1) lets callers choose them (the V4 backend's one-token products; default 0 until
 * run on the device; negative: the default). */
void di_cuk_fp8_f32x(int on);
int di_cuk_fp8_f32x_on(void);
int di_cuk_fp8_gemv1_f32x_ok(int K, const float *x, di_cuk_fp8w w);
di_status di_cuk_fp8_gemv1_f32x(int N, int K, const float *x, di_cuk_fp8w w, float *y, di_cu_stream s);
di_status di_cuk_fp8_grouped_gemv1_f32x(const float *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K,
                                        const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
                                        int bm, float *C, int ldc, di_cu_stream s);
/* Y[M][N] = X[M][K] . dequant(W)^T + beta * Y  (X bf16, row stride ldx; Y bf16, or f32 with y_f32 and
 * the beta = 1 residual form). Any M (in passes of at most 16 rows), any block shape. */
di_status di_cuk_fp8_gemv(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y, int ldy,
                          int y_f32, float beta, di_cu_stream s);
/* Grouped GEMV (decode-sized MoE): for each tile (expert e, m-tile i) of the tile list, rows m in
 * [off[e] + i*bm, min(off[e+1], ..+bm)): C[m][n] = A[arow(m)] . dequant(W_e)[n], arow(m) = a_rows ?
 * a_rows[m] : m. C bf16 or f32 (c_f32), row stride ldc. max_rows (the most rows an expert may have,
 * 1..16 sets the rows per pass; more are correct, only slower). */
di_status di_cuk_fp8_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K,
                                  const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                                  int max_tiles, int bm, int max_rows, void *C, int ldc, int c_f32, di_cu_stream s);

/* The CUDA-core GEMV's one-token fusions (the bf16 path's, for FP8 weights):
 *   _normed: Y (bf16) = rmsnorm(H) . dequant(W)^T, H the f32 residual rows (row stride ldh), nw the norm
 *     weights: the attention norm inside the q/kv product (x rounded to bf16 as di_cuk_rmsnorm does;
 *     the row's sum of squares reduced in another order, so not bit-equal to norm-then-GEMV);
 *   _glu: W is [gate; up] (N = 2 I rows) and act[m][j] = silu(gate_j) * up_j (bf16, I columns);
 *   grouped _form with glu = 1: the same for the experts (C is act, I columns);
 *   down_combine: one token's MoE down projection and weighted combine, h[n] += sum_j wts[j] *
 *     act[inv[j]] . dequant(W_{ids[j]})[n] for the kt slots (W [E][N][K]), rows n < n. */
/* whether the vector GEMV (and so _glu, the grouped glu form and down_combine) takes X / W: K % 16,
 * block_cols % 16, 16-byte aligned rows */
int di_cuk_fp8_gemv_vec_ok(int K, const void *X, int ldx, di_cuk_fp8w w);
int di_cuk_fp8_gemv_normed_ok(int K, const void *H, int ldh, const float *nw, di_cuk_fp8w w);
di_status di_cuk_fp8_gemv_normed(int M, int N, int K, const float *H, int ldh, const float *nw, float eps,
                                 di_cuk_fp8w w, uint16_t *Y, int ldy, di_cu_stream s);
di_status di_cuk_fp8_gemv_glu(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, uint16_t *act,
                              int ld_act, di_cu_stream s);
di_status di_cuk_fp8_grouped_gemv_form(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K,
                                       const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                                       int max_tiles, int bm, int max_rows, void *C, int ldc, int c_f32, int glu,
                                       di_cu_stream s);
di_status di_cuk_fp8_down_combine(const uint16_t *act, int ld_act, di_cuk_fp8w w, int N, int K, const int32_t *ids,
                                  const float *wts, const int32_t *inv, int kt, float *h, int n, di_cu_stream s);

/* MLA's W_UV and an FP8 o_proj of a one-token step in one kernel (k_mla_vo.cu; di_cuk_mla_vo's form with
 * W_o block-FP8, H rows of NH * dv; needs block_cols % dv == 0): h[n] += sum_h W_o[n][h] . bf16(W_UV[h] . olat[h]). */
int di_cuk_mla_vo_fp8_ok(int T, int NH, int H, int R, int dv, const di_cuk_fp8w *wo);
di_status di_cuk_mla_vo_fp8(const uint16_t *olat, int ld_olat, const uint16_t *wuv, int64_t wuv_stride, int R, int dv,
                            const di_cuk_fp8w *wo, int NH, int H, float *h, di_cu_stream s);

/* The decode-sized expert products with 16 weight rows per warp (k_fp8_grouped_gemv.cu; the model takes
 * them with DEEPINFER_CUDA_FP8_GV16): the grouped GEMV (glu = 1: W [gate; up], C = silu(gate) * up in bf16,
 * I = N / 2 columns) and one token's down + combine, bit-equal to di_cuk_fp8_grouped_gemv_form and
 * di_cuk_fp8_down_combine (the same arithmetic in the same order), streaming more bytes per warp. Rows of
 * a tile in passes of 1, 2 or 4 (by max_rows). pipe: the next step's loads issued before this step's FMAs.
 * pf_tile0 >= 0: tiles from pf_tile0 on are the experts pf_expert0, pf_expert0 + 1, ... (the shared ones
 * at one token), prefetched into L2 before the wait for the previous kernel; down_combine prefetches the
 * n_pf experts from pf_expert0. Needs K % 16, block_cols % 16 and 16-byte aligned rows (di_cuk_fp8_gv16_ok). */
int di_cuk_fp8_gv16_ok(int K, const void *A, int lda, di_cuk_fp8w w);
di_status di_cuk_fp8_gv16_grouped(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K,
                                  const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                                  int max_tiles, int bm, int max_rows, void *C, int ldc, int c_f32, int glu, int pipe,
                                  int pf_tile0, int pf_expert0, di_cu_stream s);
di_status di_cuk_fp8_gv16_down_combine(const uint16_t *act, int ld_act, di_cuk_fp8w w, int N, int K,
                                       const int32_t *ids, const float *wts, const int32_t *inv, int kt, float *h,
                                       int n, int pipe, int pf_expert0, int n_pf, di_cu_stream s);

/* The same products on the tensor cores (k_fp8_tc_gemv.cu: FP8 widened to bf16 in registers,
 * mma.sync bf16, fp32 promotion per 128-wide K block; batch-invariant; up to 64 rows a pass). Needs
 * block_cols % 128 == 0, K % 16 == 0 and 16-byte aligned rows (di_cuk_fp8_tc_ok). The model's dispatch
 * (di_cuk_fp8_matmul, the expert and dense-MLP paths) takes it where di_cuk_fp8_tc_use says so: in the
 * batch-invariant mode at every M (one kernel at every M keeps a row's bits independent of M), else above
 * DI_CUK_FP8_CC_ROWS rows (at 1-2 rows the CUDA-core GEMV streams faster: docs/PERFORMANCE.md); never
 * with DEEPINFER_CUDA_FP8_TC=0. */
#define DI_CUK_FP8_CC_ROWS 2
int di_cuk_fp8_tc_ok(int K, const void *X, int ldx, di_cuk_fp8w w);
int di_cuk_fp8_tc_enabled(void);
int di_cuk_fp8_tc_use(int M, int invariant);
di_status di_cuk_fp8_tc_gemv(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y, int ldy,
                             int y_f32, float beta, di_cu_stream s);
/* glu: W is [gate; up] (N = 2 I rows) and act[m][j] = silu(gate_j) * up_j (bf16, I columns, row stride
 * ld_act / ldc): the product and silu_mul in one kernel. */
di_status di_cuk_fp8_tc_gemv_glu(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, uint16_t *act,
                                 int ld_act, di_cu_stream s);
di_status di_cuk_fp8_tc_grouped_gemv(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K,
                                     const int32_t *expert_off, const int32_t *tiles, const int32_t *n_tiles,
                                     int max_tiles, int bm, int max_rows, void *C, int ldc, int c_f32, int glu,
                                     di_cu_stream s);

/* Activations to E4M3 per 1 x 128 group: for row m and group g (columns [128g, 128g+128) of K),
 * s = amax / 448 (1 where the group is all zero), Xq[m][k] = e4m3(x / s) (round to nearest even,
 * saturated), sx[m * lds + g] = s. Xq row stride ldq bytes (>= K), lds >= ceil(K / 128). K % 16 == 0. */
di_status di_cuk_fp8_quant_act(const uint16_t *X, int ldx, int M, int K, uint8_t *Xq, int ldq, float *sx, int lds,
                               di_cu_stream s);
/* The same with the scales transposed, as cuBLASLt's VEC128 mode reads them: sxt[g * ldm + m]. */
di_status di_cuk_fp8_quant_act_t(const uint16_t *X, int ldx, int M, int K, uint8_t *Xq, int ldq, float *sxt, int ldm,
                                 di_cu_stream s);
/* Y[M][N] = Xq . W^T with the promotion above (+ beta * Y for f32 Y). W: 128-wide blocks, K % 16 == 0,
 * ldq and w.ldq multiples of 16. */
di_status di_cuk_fp8_gemm(int M, int N, int K, const uint8_t *Xq, int ldq, const float *sx, int lds, di_cuk_fp8w w,
                          void *Y, int ldy, int y_f32, float beta, di_cu_stream s);
/* The grouped form of di_cuk_fp8_gemm (rows as in di_cuk_fp8_grouped_gemv; the activation rows and
 * their scales are gathered through a_rows). bm is 64 or 128. */
di_status di_cuk_fp8_grouped_gemm(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows,
                                  di_cuk_fp8w w, int N, int K, const int32_t *expert_off, const int32_t *tiles,
                                  const int32_t *n_tiles, int max_tiles, int bm, void *C, int ldc, int c_f32,
                                  di_cu_stream s);
/* Whether di_cuk_fp8_gemm takes this weight (128-wide blocks, aligned rows). */
int di_cuk_fp8_gemm_ok(int K, di_cuk_fp8w w);
/* The grouped W8A8 GEMM of k_fp8_grouped_mma.cu (DEEPINFER_CUDA_FP8_GMMA: the experts of steps of more
 * than 16 tokens): the arguments of di_cuk_fp8_grouped_gemm, bm 16 or 64, and glu: W is each expert's
 * [gate; up] (N = 2 I rows, not interleaved) and C (bf16, I columns) gets silu(gate) * up. Takes the
 * weights di_cuk_fp8_gmma_ok accepts (128-wide blocks, aligned rows, K % 16 == 0). */
int di_cuk_fp8_gmma_ok(int K, di_cuk_fp8w w);
/* The same product on the TMA wgmma core (k_fp8_tc_grouped.cu, DEEPINFER_CUDA_FP8_TCG): bm 1..64 (the tile
 * list's rows; the CTA tile is 64 rows), N % 256 == 0 (glu: I % 128), K % 16, 128-wide scale blocks. */
int di_cuk_fp8_tcg_ok(int N, int K, int glu, di_cuk_fp8w w);
di_status di_cuk_fp8_tcg_grouped(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows,
                                 di_cuk_fp8w w, int N, int K, const int32_t *expert_off, const int32_t *tiles,
                                 const int32_t *n_tiles, int max_tiles, int bm, void *C, int ldc, int c_f32, int glu,
                                 di_cu_stream s);
di_status di_cuk_fp8_gmma_grouped(const uint8_t *Aq, int ldq, const float *sa, int lds, const int32_t *a_rows,
                                  di_cuk_fp8w w, int N, int K, const int32_t *expert_off, const int32_t *tiles,
                                  const int32_t *n_tiles, int max_tiles, int bm, void *C, int ldc, int c_f32, int glu,
                                  di_cu_stream s);

/* The dense dispatch the model calls: the GEMV for M <= di_cuk_fp8_gemv_max_rows() (and at every M
 * in the batch-invariant mode; the tensor-core one where di_cuk_fp8_tc_use), else quantize the activations into `ws` and run
 * the tensor-core GEMM (GEMV when the weight's blocks are not 128 wide). ws: di_cuk_fp8_ws_bytes(M, K)
 * bytes of device memory (may be NULL when M <= the GEMV bound). */
size_t di_cuk_fp8_ws_bytes(int M, int K);
/* The activation quantization into ws as di_cuk_fp8_matmul lays it out: *xq rows *ldq bytes apart,
 * scales *sx with *lds per row (for the grouped GEMM). */
di_status di_cuk_fp8_quant_ws(const uint16_t *X, int ldx, int M, int K, void *ws, size_t ws_bytes, uint8_t **xq,
                              int *ldq, float **sx, int *lds, di_cu_stream s);
int di_cuk_fp8_gemv_max_rows(void);
di_status di_cuk_fp8_matmul(int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y, int ldy,
                            int y_f32, float beta, int invariant, void *ws, size_t ws_bytes, di_cu_stream s);

/* Dense block-FP8 GEMM through cuBLASLt (gemm_fp8_lt.cu): cuBLASLt's block-scaled FP8 matmul (CUDA
 * 12.9+, sm_90: E4M3 x E4M3, one f32 scale per 128 K values of every row of both operands (VEC128),
 * fp32 accumulation promoted per block: DeepGEMM's scheme in the library). The activations are
 * quantized per 1 x 128 (di_cuk_fp8_quant_act_t) and the weight's per-row scales transposed into ws on
 * every call. Y as di_cuk_fp8_gemm (bf16, or f32 with beta = 1). Needs 128-wide blocks, K % 16 == 0;
 * rows past the last multiple of 4 go through di_cuk_fp8_tc_gemv. A shape cuBLASLt has no algorithm
 * for returns DI_ERR_UNSUPPORTED (remembered per shape) and the caller takes another kernel. */
typedef struct di_cu_fp8lt di_cu_fp8lt;
di_status di_cu_fp8lt_create(di_cu_fp8lt **out);
void di_cu_fp8lt_destroy(di_cu_fp8lt *h);
size_t di_cu_fp8lt_ws_bytes(int M, int N, int K);
int di_cu_fp8lt_ok(int K, di_cuk_fp8w w);
di_status di_cu_fp8lt_matmul(di_cu_fp8lt *h, int M, int N, int K, const uint16_t *X, int ldx, di_cuk_fp8w w, void *Y,
                             int ldy, int y_f32, float beta, void *ws, size_t ws_bytes, di_cu_stream s);

#ifdef __cplusplus
}
#endif
#endif
