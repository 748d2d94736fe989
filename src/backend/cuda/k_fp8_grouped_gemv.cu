/* The decode-sized FP8 expert products with 16 weight rows per warp (DEEPINFER_CUDA_FP8_GV16): the grouped
 * GEMV (plain, or the gate/up + SiLU form) and one token's down projection + weighted combine. k_fp8_gemv.cu's
 * CUDA-core GEMV gives a warp 2 rows, so at one token a V2-Lite expert layer is thousands of short warps
 * (~4 KB each) and streams at ~1.6 TB/s; here a warp owns 16 rows (glu: 8 gate rows and the 8 matching up
 * rows), each lane issues 16 loads of 16 bytes per step of 512 columns (all in flight together; in the
 * pipelined form the next step's 16 as well, before this step's FMAs), the block scales and activations of
 * a step loaded with its weights. The arithmetic is k_fp8_gemv.cu's, in its order: a lane's 16 values of a
 * row share one block scale (block_cols % 16 == 0), their products with the bf16 activations are summed
 * in fp32 and then scaled, acc = fma(sum, scale, acc), steps in k order; the warp sum is gv_warp_reduce
 * (the butterfly tree of gv_reduce_store). So each output is bit-equal to di_cuk_fp8_grouped_gemv_form's
 * and di_cuk_fp8_down_combine's, and a row's result does not depend on the rows beside it
 * (batch-invariant). One-warp CTAs (as k_grouped_gemm.cu's one-row GEMV: no SM left with a partial CTA).
 * At one token the shared experts (the last tiles, known before routing) are prefetched into L2 before
 * the kernel waits for the router (pf_tile0 / pf_expert0, as di_cuk_grouped_gemv). */
#include "k_fp8_common.cuh"
#include <type_traits>

#define G16_ROWS 16
#define G16_STEP 512 /* columns per warp step: 32 lanes x 16 bytes */
#define G16_DC_WARPS 8

/* The warp's 16 weight rows of an expert (offsets in bytes, 32 bits: an expert is < 4 GB, from the expert's
 * first row; rows past the matrix clamped to its last row: computed, never stored) and their scale rows.
 * GLU: W is [gate; up] (N = 2 I rows), rows 0-7 are gate rows c0 .. c0 + 7 and rows 8-15 the up rows
 * I + c0 ..; else rows c0 .. c0 + 15. g16_rows_calc computes them where they are used (the pipelined form:
 * no registers for a table), g16_rows_tab holds them in a table. */
struct g16_rows_calc {
  int c0, lim, glu, ldq, block_rows, scale_cols;
  __device__ __forceinline__ g16_rows_calc(di_cuk_fp8w w, int N, int c0_, bool glu_)
      : c0(c0_), lim(glu_ ? N / 2 : N), glu(glu_), ldq(w.ldq), block_rows(w.block_rows), scale_cols(w.scale_cols) {}
  __device__ __forceinline__ int row(int r) const {
    const int c = min(c0 + (glu ? (r & 7) : r), lim - 1);
    return glu && r >= 8 ? lim + c : c;
  }
  __device__ __forceinline__ uint32_t rq(int r) const { return (uint32_t)row(r) * (uint32_t)ldq; }
  __device__ __forceinline__ int sq(int r) const { return (row(r) / block_rows) * scale_cols; }
};
struct g16_rows_tab {
  uint32_t q[G16_ROWS];
  int s[G16_ROWS];
  __device__ __forceinline__ g16_rows_tab(di_cuk_fp8w w, int N, int c0, bool glu) {
    const g16_rows_calc c(w, N, c0, glu);
#pragma unroll
    for (int r = 0; r < G16_ROWS; r++) { q[r] = c.rq(r); s[r] = c.sq(r); }
  }
  __device__ __forceinline__ uint32_t rq(int r) const { return q[r]; }
  __device__ __forceinline__ int sq(int r) const { return s[r]; }
};

/* The weights, scales and activations of one step (columns k0 + lane * 16 .. +16) of the warp's 16 rows:
 * row r at wq + rt.rq(r), its scale row at ws + rt.sq(r). Zero past K. SC: the scales loaded with the weights
 * (else by g16_fma, from L1: the pipelined form has no registers for two sets of them). */
template <int MR>
struct g16_step {
  uint4 w[G16_ROWS];
  float sc[G16_ROWS];
  uint4 x[MR][2];
};

template <int MR, bool SC, class RT>
static __device__ __forceinline__ void g16_load(g16_step<MR> &st, const uint8_t *wq, const RT &rt,
                                                const float *ws, const bf16 *const *xr, int bc, int K,
                                                int k0, int lane) {
  const int k = k0 + lane * 16;
  if (k < K) {
    const int blk = k / bc;
#pragma unroll
    for (int r = 0; r < G16_ROWS; r++) st.w[r] = di_ld_stream16(wq + rt.rq(r) + k);
    if constexpr (SC) {
#pragma unroll
      for (int r = 0; r < G16_ROWS; r++) st.sc[r] = __ldg(ws + rt.sq(r) + blk);
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
      st.x[m][0] = __ldg((const uint4 *)(xr[m] + k));
      st.x[m][1] = __ldg((const uint4 *)(xr[m] + k) + 1);
    }
  } else {
#pragma unroll
    for (int r = 0; r < G16_ROWS; r++) { st.w[r] = make_uint4(0, 0, 0, 0); st.sc[r] = 0.f; }
#pragma unroll
    for (int m = 0; m < MR; m++) st.x[m][0] = st.x[m][1] = make_uint4(0, 0, 0, 0);
  }
}

/* acc[r][m] += scale_r * (x_m . w_r) over the step's 16 columns (k_fp8_gemv.cu's fg_fma, in its order) */
template <int MR, bool SC, class RT>
static __device__ __forceinline__ void g16_fma(float (*acc)[MR], const g16_step<MR> &st, const float *ws,
                                               const RT &rt, int bc, int K, int k0, int lane) {
  if (k0 + lane * 16 >= K) return;
  const int blk = (k0 + lane * 16) / bc;
  float xf[MR][16];
#pragma unroll
  for (int m = 0; m < MR; m++) {
    const __nv_bfloat162 *p0 = (const __nv_bfloat162 *)&st.x[m][0], *p1 = (const __nv_bfloat162 *)&st.x[m][1];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float2 a = __bfloat1622float2(p0[j]), b = __bfloat1622float2(p1[j]);
      xf[m][2 * j] = a.x; xf[m][2 * j + 1] = a.y; xf[m][8 + 2 * j] = b.x; xf[m][8 + 2 * j + 1] = b.y;
    }
  }
#pragma unroll
  for (int r = 0; r < G16_ROWS; r++) {
    float wf[16];
    fp8x4_to_f32(st.w[r].x, wf);
    fp8x4_to_f32(st.w[r].y, wf + 4);
    fp8x4_to_f32(st.w[r].z, wf + 8);
    fp8x4_to_f32(st.w[r].w, wf + 12);
#pragma unroll
    for (int m = 0; m < MR; m++) {
      float p = 0.f;
#pragma unroll
      for (int j = 0; j < 16; j++) p = fmaf(xf[m][j], wf[j], p);
      acc[r][m] = fmaf(p, SC ? st.sc[r] : __ldg(ws + rt.sq(r) + blk), acc[r][m]);
    }
  }
}

/* One lane's share of the 16 rows' products with the MR activation rows over K, into acc (zeroed here).
 * PIPE: step s + 1's loads issued before step s's FMAs. */
template <int MR, bool PIPE, class RT>
static __device__ __forceinline__ void g16_rows(float (*acc)[MR], const uint8_t *wq, const RT &rt,
                                                const float *ws, const bf16 *const *xr, int bc, int K,
                                                int lane) {
#pragma unroll
  for (int r = 0; r < G16_ROWS; r++)
#pragma unroll
    for (int m = 0; m < MR; m++) acc[r][m] = 0.f;
  if constexpr (PIPE) {
    g16_step<MR> cur;
    g16_load<MR, false>(cur, wq, rt, ws, xr, bc, K, 0, lane);
    for (int k0 = 0; k0 < K; k0 += G16_STEP) {
      const bool more = k0 + G16_STEP < K;
      g16_step<MR> nxt;
      if (more) g16_load<MR, false>(nxt, wq, rt, ws, xr, bc, K, k0 + G16_STEP, lane);
      g16_fma<MR, false>(acc, cur, ws, rt, bc, K, k0, lane);
      if (more) cur = nxt;
    }
  } else {
    for (int k0 = 0; k0 < K; k0 += G16_STEP) {
      g16_step<MR> cur;
      g16_load<MR, true>(cur, wq, rt, ws, xr, bc, K, k0, lane);
      g16_fma<MR, true>(acc, cur, ws, rt, bc, K, k0, lane);
    }
  }
}

/* grid (ceil(N / 16) (glu: ceil(I / 8)), tiles), one warp per CTA; the tile's rows in passes of MR. The
 * warp's sums go through shared memory (value r * MR + m) to the lanes that store them. */
template <int MR, bool GLU, bool PIPE>
static __global__ void __launch_bounds__(32, PIPE || MR > 1 ? 8 : 16) /* MR 1 plain: 128 registers */
fp8_gv16_kernel(const bf16 *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N, int K, const int32_t *off,
                const int32_t *tiles, const int32_t *n_tiles, int bm, void *C, int ldc, int c_f32, int pf_tile0,
                int pf_expert0) {
  __shared__ float red[G16_ROWS * MR];
  const int lane = threadIdx.x;
  const int c0 = blockIdx.x * (GLU ? G16_ROWS / 2 : G16_ROWS);
  using RT = typename std::conditional<PIPE, g16_rows_calc, g16_rows_tab>::type;
  const RT rt(w, N, c0, GLU);
  if (pf_tile0 >= 0 && (int)blockIdx.y >= pf_tile0) { /* a shared expert's rows, known before routing */
    const uint8_t *wp = w.q + (int64_t)(pf_expert0 + (int)blockIdx.y - pf_tile0) * N * w.ldq;
#pragma unroll
    for (int r = 0; r < G16_ROWS; r++)
      for (int k = lane * 128; k < K; k += 32 * 128) di_prefetch_l2(wp + rt.rq(r) + k);
  }
  DI_PDL_ENTRY();
  if ((int)blockIdx.y >= *n_tiles) return;
  const fp8_rows t = fp8_tile_rows(off, tiles, bm, 0);
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  const uint8_t *wq = w.q + (int64_t)t.e * N * w.ldq;
  const float *ws = w.scale + (int64_t)t.e * sblocks * w.scale_cols;
  for (int mb = t.m0; mb < t.mend; mb += MR) {
    const int nm = min(MR, t.mend - mb);
    const bf16 *xr[MR];
    gv_act_rows<MR>(xr, A, lda, a_rows, mb, nm);
    float acc[G16_ROWS][MR];
    g16_rows<MR, PIPE>(acc, wq, rt, ws, xr, w.block_cols, K, lane);
    gv_warp_reduce<G16_ROWS, MR>(acc, lane);
    constexpr int V = G16_ROWS * MR;
    if constexpr (V <= 32) {
      if ((lane & (32 / V - 1)) == 0) red[lane / (32 / V)] = acc[0][0];
    } else {
#pragma unroll
      for (int i = 0; i < V / 32; i++) red[i + (V / 32) * lane] = acc[0][i];
    }
    __syncwarp();
    if constexpr (GLU) {
      for (int q = lane; q < (G16_ROWS / 2) * MR; q += 32) {
        const int r = q / MR, m = q % MR, c = c0 + r;
        const float g = red[r * MR + m], u = red[(r + 8) * MR + m];
        if (c < N / 2 && m < nm) ((bf16 *)C)[(int64_t)(mb + m) * ldc + c] = di_fb(g / (1.f + __expf(-g)) * u);
      }
    } else {
      for (int q = lane; q < V; q += 32) {
        const int r = q / MR, m = q % MR, c = c0 + r;
        if (c >= N || m >= nm) continue;
        if (c_f32) ((float *)C)[(int64_t)(mb + m) * ldc + c] = red[q];
        else ((bf16 *)C)[(int64_t)(mb + m) * ldc + c] = di_fb(red[q]);
      }
    }
    __syncwarp(); /* red is reused by the next pass */
  }
}

/* One token's down projection + weighted combine (k_fp8_gemv.cu's fp8_down_combine_kernel with 16 rows a
 * warp): CTA c owns output rows 16 c .. +16, its warp j streams those rows of the down matrices of slots j,
 * j + 8, ..., adds wts[j] x the row's sum, and the warps' totals are added in warp order onto h. The shared
 * experts' rows (pf_expert0 .., n_pf of them) are prefetched into L2 before the wait. */
template <bool PIPE>
static __global__ void __launch_bounds__(G16_DC_WARPS * 32)
fp8_gv16_down_combine_kernel(const bf16 *act, int ld_act, di_cuk_fp8w w, int N, int K, const int32_t *ids,
                             const float *wts, const int32_t *inv, int kt, float *h, int n, int pf_expert0, int n_pf) {
  __shared__ float part[G16_DC_WARPS][G16_ROWS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n0 = blockIdx.x * G16_ROWS;
  const int sblocks = (N + w.block_rows - 1) / w.block_rows;
  using RT = typename std::conditional<PIPE, g16_rows_calc, g16_rows_tab>::type;
  const RT rt(w, N, n0, false);
  for (int e = warp; e < n_pf; e += G16_DC_WARPS) {
    const uint8_t *wp = w.q + (int64_t)(pf_expert0 + e) * N * w.ldq;
#pragma unroll
    for (int r = 0; r < G16_ROWS; r++)
      for (int k = lane * 128; k < K; k += 32 * 128) di_prefetch_l2(wp + rt.rq(r) + k);
  }
  DI_PDL_ENTRY();
  float totl = 0.f; /* after each reduction (gv_warp_reduce's layout) lane l holds row n0 + (l >> 1) */
  for (int j = warp; j < kt; j += G16_DC_WARPS) {
    const int e = ids[j];
    const float wj = wts[j];
    const bf16 *xr[1] = {act + (int64_t)inv[j] * ld_act};
    float acc[G16_ROWS][1];
    g16_rows<1, PIPE>(acc, w.q + (int64_t)e * N * w.ldq, rt, w.scale + (int64_t)e * sblocks * w.scale_cols, xr,
                      w.block_cols, K, lane);
    gv_warp_reduce<G16_ROWS, 1>(acc, lane);
    totl += wj * acc[0][0];
  }
  if ((lane & 1) == 0) part[warp][lane >> 1] = totl;
  __syncthreads();
  if (threadIdx.x < G16_ROWS && n0 + (int)threadIdx.x < n) {
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < G16_DC_WARPS; q++) sum += part[q][threadIdx.x];
    h[n0 + threadIdx.x] += sum;
  }
}

extern "C" int di_cuk_fp8_gv16_ok(int K, const void *A, int lda, di_cuk_fp8w w) {
  return K % 16 == 0 && lda % 8 == 0 && w.ldq % 16 == 0 && w.block_cols % 16 == 0 && w.block_rows > 0 &&
         w.scale_cols >= (K + w.block_cols - 1) / w.block_cols && ((uintptr_t)A & 15) == 0 &&
         ((uintptr_t)w.q & 15) == 0;
}

extern "C" di_status di_cuk_fp8_gv16_grouped(const uint16_t *A, int lda, const int32_t *a_rows, di_cuk_fp8w w, int N,
                                             int K, const int32_t *expert_off, const int32_t *tiles,
                                             const int32_t *n_tiles, int max_tiles, int bm, int max_rows, void *C,
                                             int ldc, int c_f32, int glu, int pipe, int pf_tile0, int pf_expert0,
                                             di_cu_stream s) {
  if (max_tiles <= 0) return DI_OK;
  if (!di_cuk_fp8_gv16_ok(K, A, lda, w) || max_tiles > 65535 || N <= 0 || (glu && (N % 2 || c_f32)))
    return di_error_set(DI_ERR_INVALID_ARG,
                        "cuda: fp8 16-row grouped gemv N %d K %d lda %d block %d x %d tiles %d glu %d (K %% 16, "
                        "block_cols %% 16, aligned rows, glu: N even, bf16 out)",
                        N, K, lda, w.block_rows, w.block_cols, max_tiles, glu);
  const int mr = max_rows <= 1 ? 1 : max_rows <= 2 ? 2 : 4;
  if (mr > 1) pipe = 0; /* two sets of 16 loads and 2-4 rows of activations spill */
  const dim3 grid(glu ? (N / 2 + G16_ROWS / 2 - 1) / (G16_ROWS / 2) : (N + G16_ROWS - 1) / G16_ROWS, max_tiles);
  const bf16 *a = (const bf16 *)A;
#define G16_LAUNCH(m, g, p)                                                                                      \
  DI_CU(di_launch(fp8_gv16_kernel<m, g, p>, grid, 32, 0, s, a, lda, a_rows, w, N, K, expert_off, tiles, n_tiles, bm, \
                  C, ldc, c_f32, pf_tile0, pf_expert0))
#define G16_CASE(m, p) \
  if (mr == m && pipe == p) { if (glu) G16_LAUNCH(m, true, p); else G16_LAUNCH(m, false, p); }
  G16_CASE(1, true) else G16_CASE(1, false) else G16_CASE(2, false) else {
    if (glu) G16_LAUNCH(4, true, false);
    else G16_LAUNCH(4, false, false);
  }
#undef G16_CASE
#undef G16_LAUNCH
  DI_CU_LAUNCH("fp8_gv16");
  return DI_OK;
}

extern "C" di_status di_cuk_fp8_gv16_down_combine(const uint16_t *act, int ld_act, di_cuk_fp8w w, int N, int K,
                                                  const int32_t *ids, const float *wts, const int32_t *inv, int kt,
                                                  float *h, int n, int pipe, int pf_expert0, int n_pf,
                                                  di_cu_stream s) {
  if (!di_cuk_fp8_gv16_ok(K, act, ld_act, w) || n > N || n <= 0 || kt < 1)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "cuda: fp8 16-row down + combine N %d K %d ld %d n %d k %d (K %% 16, block_cols %% 16, aligned)",
                        N, K, ld_act, n, kt);
  const int grid = (n + G16_ROWS - 1) / G16_ROWS;
  if (pipe)
    DI_CU(di_launch(fp8_gv16_down_combine_kernel<true>, grid, G16_DC_WARPS * 32, 0, s, (const bf16 *)act, ld_act, w,
                    N, K, ids, wts, inv, kt, h, n, pf_expert0, n_pf));
  else
    DI_CU(di_launch(fp8_gv16_down_combine_kernel<false>, grid, G16_DC_WARPS * 32, 0, s, (const bf16 *)act, ld_act, w,
                    N, K, ids, wts, inv, kt, h, n, pf_expert0, n_pf));
  DI_CU_LAUNCH("fp8_gv16_down_combine");
  return DI_OK;
}
