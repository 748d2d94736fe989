/* DeepSeek-V4 row-wise kernels on CUDA (cuda_v4_kernels.h): linear layers over bf16 or f32 weights,
 * RMSNorm, RoPE, the embedding, the manifold hyper-connections (mHC: mixes, Sinkhorn, collapse, stream
 * update), the head's collapse, the compressor's position bias, and the MoE (routing, expert GEMVs,
 * combine). Each mirrors one CPU op of backend/cpu/cpu_deepseek_v4_ops.c: reductions the CPU does in
 * double are done in double here (mHC, norms, softmax-like steps), dot products of linear layers in
 * float (the only arithmetic difference from the CPU besides the bf16 weights). A warp per output row,
 * up to 8 tokens per CTA, 16-byte pipelined loads where rows allow (tensor cores: the backend's
 * DEEPINFER_CUDA_V4_TC mode, through k_tc_gemm.cu). The expert kernels also read MXFP4 rows (the native
 * weights mode: E2M1 codes decoded to floats in registers, each 32-value block's products summed, then
 * scaled by its E8M0 power of two, which is exact: the CPU's dequantize-then-dot up to the sum order). */
#include "k_v4_common.cuh"
#include "k_skinny_kn.cuh"
#include "cuda_v4_kernels.h"
#include "backend/v4_torch_select.h"
#include <math.h>
#include <type_traits>

static __device__ __forceinline__ float wload(const float *w, size_t i) { return w[i]; }
static __device__ __forceinline__ float wload(const bf16 *w, size_t i) { return __bfloat162float(w[i]); }

/* ---- linear ---------------------------------------------------------------------------------------- */

#define LIN_ROWS 8 /* output rows per CTA (a warp each) */
#define LIN_TOK 8  /* tokens per CTA */

/* 8 consecutive weights from 16-byte aligned storage (one bf16 uint4, or two float4). */
static __device__ __forceinline__ void unpack8(uint4 u, float *o) {
  const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    o[2 * k] = __uint_as_float(v[k] << 16);
    o[2 * k + 1] = __uint_as_float(v[k] & 0xffff0000u);
  }
}
static __device__ __forceinline__ void wload8(const bf16 *w, size_t i, float *o) { unpack8(*(const uint4 *)(w + i), o); }
static __device__ __forceinline__ void wload8(const float *w, size_t i, float *o) {
  const float4 a = *(const float4 *)(w + i), b = *(const float4 *)(w + i + 4);
  o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

/* acc[i] += the 8 weights w . xr[i][c..c+8) for i < nt (one lane's step). */
static __device__ __forceinline__ void dot8(const float *w, const float *const *xr, int nt, int c, float *acc) {
#pragma unroll
  for (int i = 0; i < LIN_TOK; i++)
    if (i < nt) {
      const float4 a = *(const float4 *)(xr[i] + c), b = *(const float4 *)(xr[i] + c + 4);
      acc[i] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
}
#define XCH 1024 /* columns of the CTA's token rows staged in shared memory at a time (XCH / 256 steps per lane) */
#define XU (XCH / 256)
#define VEC_STAGED 9 /* the kernels' VEC for bf16 rows through rows_dot_staged (launched at one token) */

/* XU 16-byte weight loads of one lane for the chunk at column c0 (zeros past C or when not active). */
static __device__ __forceinline__ void wchunk(uint4 *d, const bf16 *w, int c0, int C, int lane, int active) {
#pragma unroll
  for (int u = 0; u < XU; u++) {
    const int k = c0 + lane * 8 + u * 256;
    d[u] = active && w && k < C ? di_ld_stream16(w + k) : make_uint4(0, 0, 0, 0);
  }
}
/* acc[i] += W row . xr[i] over C columns for i < nt, per lane (the warp sums the lanes afterwards). VEC: 8
 * columns per lane and iteration with 16-byte loads (C % 8 == 0 and aligned rows), else one. Each row's
 * sum runs in the same order whatever the other rows are, so results do not depend on the grouping.
 * bf16 rows stream in software-pipelined chunks of XU 16-byte loads per lane (a plain loop keeps ~2 loads
 * in flight); the arithmetic and its order are the plain loop's. rows_dot_staged below computes the same
 * sums with the token rows in shared memory (VEC_STAGED: faster at one token, slower at many). */
template <typename WT, int VEC>
static __device__ __forceinline__ void row_dot(const WT *wr, const float *const *xr, int nt, int C, int lane, float *acc) {
  if constexpr (VEC >= 8 && sizeof(WT) == 2) { /* chunks of XU loads per lane, the next in flight */
    const bf16 *w = (const bf16 *)(const void *)wr;
    uint4 cur[XU], nxt[XU];
    wchunk(cur, w, 0, C, lane, 1);
    for (int c0 = 0; c0 < C; c0 += XCH) {
      wchunk(nxt, w, c0 + XCH, C, lane, 1);
#pragma unroll
      for (int u = 0; u < XU; u++) {
        const int k = c0 + lane * 8 + u * 256;
        if (k < C) {
          float f[8];
          unpack8(cur[u], f);
          dot8(f, xr, nt, k, acc);
        }
      }
#pragma unroll
      for (int u = 0; u < XU; u++) cur[u] = nxt[u];
    }
  } else if (VEC >= 8) { /* (unrolled: several iterations' loads in flight; the router's 4,096-column f32 rows) */
#pragma unroll 4
    for (int c = lane * 8; c < C; c += 32 * 8) {
      float w[8];
      wload8(wr, c, w);
      dot8(w, xr, nt, c, acc);
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float w = wload(wr, c);
#pragma unroll
      for (int i = 0; i < LIN_TOK; i++)
        if (i < nt) acc[i] += w * xr[i][c];
    }
  }
}

/* ---- MXFP4 rows (native experts) ---- */
/* One row of an MXFP4 matrix: C/2 code bytes (16-byte aligned) and C/32 E8M0 scale bytes. */
typedef struct mx4row { const uint8_t *q, *s; } mx4row;
/* An [E][N][ldq] MXFP4 stack as the expert kernels index it (wrow below). */
typedef struct mx4mat { di_cuk_mxfp4w w; } mx4mat;
static __device__ __forceinline__ mx4row wrow(mx4mat m, size_t row, int C) {
  (void)C;
  return mx4row{m.w.q + row * m.w.ldq, m.w.scale + row * m.w.lds};
}
template <typename WT>
static __device__ __forceinline__ const WT *wrow(const WT *w, size_t row, int C) { return w + row * C; }
/* E2M1 code (low 4 bits) as a float, built from its bits: s.ee.m is 0 / 0.5 (ee = 0) or (1 + m/2) 2^(ee-1). */
static __device__ __forceinline__ float e2m1_f32(uint32_t c) {
  const uint32_t e = (c >> 1) & 3, m = c & 1;
  const uint32_t mag = e ? (e + 126) << 23 | m << 22 : (m ? 0x3f000000u : 0u);
  return __uint_as_float((c & 8) << 28 | mag);
}
/* 2^(e-127); 255 is NaN and 0 the smallest normal's half, as di_weight_get reads E8M0 */
static __device__ __forceinline__ float e8m0_scale(uint32_t e) {
  return e == 255 ? __uint_as_float(0x7fc00000u) : e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(e << 23);
}
/* acc[i] += row . xr[i] over C columns for i < nt, per lane (summed over the warp afterwards): a lane takes
 * 32 columns (16 code bytes, one scale) per step of 1,024; VEC >= 8 needs C % 32 == 0 and x rows 16-byte
 * aligned, else a column a lane at a time. */
template <int VEC>
static __device__ __forceinline__ void mx_row_dot(mx4row wr, const float *const *xr, int nt, int C, int lane, float *acc) {
  if (VEC >= 8) { /* the next step's 16 bytes and scale in flight while a step is summed */
    int c = lane * 32;
    uint4 v = c < C ? di_ld_stream16(wr.q + c / 2) : make_uint4(0, 0, 0, 0);
    uint32_t ev = c < C ? __ldg(wr.s + c / 32) : 127u;
    for (; c < C; c += 32 * 32) {
      const int cn = c + 32 * 32;
      const uint4 vn = cn < C ? di_ld_stream16(wr.q + cn / 2) : make_uint4(0, 0, 0, 0);
      const uint32_t en = cn < C ? __ldg(wr.s + cn / 32) : 127u;
      const float sc = e8m0_scale(ev);
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
      float w[32];
#pragma unroll
      for (int j = 0; j < 32; j++) w[j] = e2m1_f32(u[j / 8] >> (4 * (j % 8)));
#pragma unroll
      for (int i = 0; i < LIN_TOK; i++)
        if (i < nt) {
          float part = 0;
#pragma unroll
          for (int j = 0; j < 32; j += 4) {
            const float4 a = *(const float4 *)(xr[i] + c + j);
            part += w[j] * a.x + w[j + 1] * a.y + w[j + 2] * a.z + w[j + 3] * a.w;
          }
          acc[i] += part * sc;
        }
      v = vn;
      ev = en;
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float w = e2m1_f32(wr.q[c / 2] >> (4 * (c & 1))) * e8m0_scale(wr.s[c / 32]);
#pragma unroll
      for (int i = 0; i < LIN_TOK; i++)
        if (i < nt) acc[i] += w * xr[i][c];
    }
  }
}
/* the expert kernels' row product: row_dot for bf16 / f32 rows, mx_row_dot for MXFP4 ones */
template <int VEC, typename WT>
static __device__ __forceinline__ void dot_row(const WT *wr, const float *const *xr, int nt, int C, int lane, float *acc) {
  row_dot<WT, VEC>(wr, xr, nt, C, lane, acc);
}
template <int VEC>
static __device__ __forceinline__ void dot_row(mx4row wr, const float *const *xr, int nt, int C, int lane, float *acc) {
  mx_row_dot<VEC>(wr, xr, nt, C, lane, acc);
}

/* acc[i] += the 8 weights w . xs[i][k..k+8) for i < nt: dot8 on the staged rows. */
static __device__ __forceinline__ void dot8s(const float *w, const float (*xs)[XCH], int nt, int k, float *acc) {
#pragma unroll
  for (int i = 0; i < LIN_TOK; i++)
    if (i < nt) {
      const float4 a = *(const float4 *)(&xs[i][k]), b = *(const float4 *)(&xs[i][k + 4]);
      acc[i] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
}

/* row_dot's bf16 16-byte form for a whole CTA: the nt token rows xr are staged in shared memory XCH columns
 * at a time, so each is read from memory once per CTA instead of once per warp (at many tokens the
 * re-reads of the activations, not the weights, bound the plain form), and each warp dots its weight
 * row wa (and wb, when not NULL: expert_up's gate and up) with them. The next chunk's weights are in
 * flight while a chunk is used. A warp whose row is past the end (active 0) still takes part in the
 * staging: every thread of the CTA must call this. Per lane the same columns in the same order as
 * row_dot, so the sums are bit-identical to it. Needs C % 8 == 0 and 16-byte aligned rows. */
static __device__ void rows_dot_staged(const bf16 *wa, const bf16 *wb, const float *const *xr, int nt, int C, int active,
                                       float *acc_a, float *acc_b) {
  __shared__ __align__(16) float xs[LIN_TOK][XCH];
  const int lane = threadIdx.x & 31;
  uint4 ca[XU], cb[XU], na[XU], nb[XU];
  wchunk(ca, wa, 0, C, lane, active);
  wchunk(cb, wb, 0, C, lane, active);
  for (int c0 = 0; c0 < C; c0 += XCH) {
    const int q = (C - c0 < XCH ? C - c0 : XCH) / 4; /* float4s per row in this chunk */
    __syncthreads();                                /* the previous chunk's reads of xs are done */
    for (int idx = threadIdx.x; idx < nt * q; idx += blockDim.x) {
      const int i = idx / q, j = (idx % q) * 4;
      *(float4 *)(&xs[i][j]) = *(const float4 *)(xr[i] + c0 + j);
    }
    __syncthreads();
    wchunk(na, wa, c0 + XCH, C, lane, active);
    wchunk(nb, wb, c0 + XCH, C, lane, active);
    if (active) {
#pragma unroll
      for (int u = 0; u < XU; u++) {
        const int k = lane * 8 + u * 256;
        if (c0 + k < C) {
          float w[8];
          unpack8(ca[u], w);
          dot8s(w, xs, nt, k, acc_a);
          if (wb) {
            unpack8(cb[u], w);
            dot8s(w, xs, nt, k, acc_b);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < XU; u++) ca[u] = na[u], cb[u] = nb[u];
  }
}

/* grid.z: G independent products (the grouped wo_a); group g's x, W and y start gx, gw, gy elements on. */
template <typename WT, int VEC>
__global__ void linear_k(const float *x, int ldx, const WT *W, int T, int R, int C, float *y, int ldy, int64_t gx, int64_t gw,
                         int64_t gy) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = blockIdx.x * LIN_ROWS + warp, t0 = blockIdx.y * LIN_TOK;
  constexpr int staged = VEC == VEC_STAGED && sizeof(WT) == 2;
  if (r >= R && !staged) return;
  x += gx * blockIdx.z;
  W += gw * blockIdx.z;
  y += gy * blockIdx.z;
  const int nt = T - t0 < LIN_TOK ? T - t0 : LIN_TOK;
  float acc[LIN_TOK];
#pragma unroll
  for (int i = 0; i < LIN_TOK; i++) acc[i] = 0;
  const float *xr[LIN_TOK];
  gv_act_rows<LIN_TOK>(xr, x, ldx, NULL, t0, nt);
  if constexpr (staged)
    rows_dot_staged(W + (size_t)(r < R ? r : 0) * C, NULL, xr, nt, C, r < R, acc, NULL);
  else
    row_dot<WT, VEC>(W + (size_t)r * C, xr, nt, C, lane, acc);
  if (r >= R) return;
#pragma unroll
  for (int i = 0; i < LIN_TOK; i++) {
    const float v = warp_sum_f(acc[i]);
    if (lane == 0 && i < nt) y[(size_t)(t0 + i) * ldy + r] = v;
  }
}

/* One token's bf16 GEMV (di_v4k_lin_form 1): the staged form's CTA of 8 rows (a row a warp) stages the activation
 * row 1,024 columns at a time with two barriers per chunk and keeps one chunk of one row in flight per warp:
 * short-lived CTAs at 1.6-3 TB/s (wq_b, wo_a, wo_b, the head). Here a warp takes NRW rows, reads the
 * activations straight from L1 (a lane's 8 columns and the warp's 256 are contiguous: coalesced float4 loads),
 * with no shared memory and no barrier, every row's next chunk in flight while a chunk is summed. Per row and
 * lane the same columns in the same order through the same dot8: the same bits as row_dot / rows_dot_staged,
 * so as the step's other token counts. grid.z: the groups as in linear_k. */
#define G1_WARPS 4
template <int NRW>
__global__ void __launch_bounds__(G1_WARPS * 32) gemv1_k(const float *x, const bf16 *W, int R, int C, float *y, int64_t gx,
                                                         int64_t gw, int64_t gy) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = (blockIdx.x * G1_WARPS + warp) * NRW;
  if (r0 >= R) return;
  x += gx * blockIdx.z;
  W += gw * blockIdx.z;
  y += gy * blockIdx.z;
  const float *xr[1] = {x};
  const bf16 *wr[NRW];
  float acc[NRW][LIN_TOK];
#pragma unroll
  for (int r = 0; r < NRW; r++) {
    wr[r] = W + (size_t)(r0 + r < R ? r0 + r : r0) * C; /* past R: a copy, not stored */
#pragma unroll
    for (int i = 0; i < LIN_TOK; i++) acc[r][i] = 0;
  }
  uint4 cur[NRW][XU], nxt[NRW][XU];
#pragma unroll
  for (int r = 0; r < NRW; r++) wchunk(cur[r], wr[r], 0, C, lane, 1);
  for (int c0 = 0; c0 < C; c0 += XCH) {
#pragma unroll
    for (int r = 0; r < NRW; r++) wchunk(nxt[r], wr[r], c0 + XCH, C, lane, 1);
#pragma unroll
    for (int u = 0; u < XU; u++) {
      const int k = c0 + lane * 8 + u * 256;
      if (k < C) {
#pragma unroll
        for (int r = 0; r < NRW; r++) {
          float f[8];
          unpack8(cur[r][u], f);
          dot8(f, xr, 1, k, acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < NRW; r++)
#pragma unroll
      for (int u = 0; u < XU; u++) cur[r][u] = nxt[r][u];
  }
#pragma unroll
  for (int r = 0; r < NRW; r++) {
    const float v = warp_sum_f(acc[r][0]);
    if (lane == 0 && r0 + r < R) y[r0 + r] = v;
  }
}
/* f32 rows (the router's 4,096-column rows) at one token: a row a warp, G1_WARPS warps a CTA (linear_k's 8 rows a
 * CTA left most SMs idle: 4 CTAs for 32 experts) and 8 iterations' loads in flight (linear_k: 4); each lane's
 * iterations in row_dot's order through the same dot8: the same bits. */
__global__ void __launch_bounds__(G1_WARPS * 32) gemv1_f32_k(const float *x, const float *W, int R, int C, float *y, int64_t gx,
                                                             int64_t gw, int64_t gy) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = blockIdx.x * G1_WARPS + warp;
  if (r >= R) return;
  x += gx * blockIdx.z;
  W += gw * blockIdx.z;
  y += gy * blockIdx.z;
  const float *xr[1] = {x}, *wr = W + (size_t)r * C;
  float acc[LIN_TOK];
#pragma unroll
  for (int i = 0; i < LIN_TOK; i++) acc[i] = 0;
#pragma unroll 8
  for (int c = lane * 8; c < C; c += 32 * 8) {
    float w[8];
    wload8(wr, c, w);
    dot8(w, xr, 1, c, acc);
  }
  const float v = warp_sum_f(acc[0]);
  if (lane == 0) y[r] = v;
}
#define LIN_FORM_DEFAULT 1
static int g_lin_form = LIN_FORM_DEFAULT; /* 1 (gemv1_k at one token; verified on the H200, session 14 request 1); 2: 4 rows a warp from 8,192 rows, not yet run */
extern "C" void di_v4k_lin_form(int form) { g_lin_form = form < 0 ? LIN_FORM_DEFAULT : form; }

/* whether rows of C columns at x (stride ldx) and w take the 16-byte path */
static int vec8_ok(const void *x, int ldx, const void *w, int C) {
  return C % 8 == 0 && ldx % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0;
}

di_status di_v4k_linear_groups(const float *x, int ldx, const void *W, int wf32, int T, int R, int C, float *y, int ldy,
                               int G, int64_t gx, int64_t gw, int64_t gy, di_cu_stream s) {
  if (T <= 0 || R <= 0 || G <= 0) return DI_OK;
  dim3 grid((R + LIN_ROWS - 1) / LIN_ROWS, (T + LIN_TOK - 1) / LIN_TOK, G);
  if (grid.y > 65535 || G > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: linear over %d tokens x %d groups at once", T, G);
  /* every group's rows keep the alignment of the first when the offsets are multiples of 8 elements */
  const int v8 = vec8_ok(x, ldx, W, C) && (G == 1 || (gx % 8 == 0 && gw % 8 == 0));
  if (wf32 && v8 && T == 1 && g_lin_form >= 1)
    gemv1_f32_k<<<dim3((R + G1_WARPS - 1) / G1_WARPS, 1, G), 32 * G1_WARPS, 0, s>>>(x, (const float *)W, R, C, y, gx, gw, gy);
  else if (wf32 && v8) linear_k<float, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ldx, (const float *)W, T, R, C, y, ldy, gx, gw, gy);
  else if (wf32) linear_k<float, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ldx, (const float *)W, T, R, C, y, ldy, gx, gw, gy);
  else if (v8 && T == 1 && g_lin_form == 2 && R >= 8192)
    gemv1_k<4><<<dim3((R + 4 * G1_WARPS - 1) / (4 * G1_WARPS), 1, G), 32 * G1_WARPS, 0, s>>>(x, (const bf16 *)W, R, C, y, gx, gw, gy);
  else if (v8 && T == 1 && g_lin_form >= 1 && R >= 8192)
    gemv1_k<2><<<dim3((R + 2 * G1_WARPS - 1) / (2 * G1_WARPS), 1, G), 32 * G1_WARPS, 0, s>>>(x, (const bf16 *)W, R, C, y, gx, gw, gy);
  else if (v8 && T == 1 && g_lin_form >= 1)
    gemv1_k<1><<<dim3((R + G1_WARPS - 1) / G1_WARPS, 1, G), 32 * G1_WARPS, 0, s>>>(x, (const bf16 *)W, R, C, y, gx, gw, gy);
  else if (v8 && T == 1) linear_k<bf16, VEC_STAGED><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ldx, (const bf16 *)W, T, R, C, y, ldy, gx, gw, gy);
  else if (v8) linear_k<bf16, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ldx, (const bf16 *)W, T, R, C, y, ldy, gx, gw, gy);
  else linear_k<bf16, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ldx, (const bf16 *)W, T, R, C, y, ldy, gx, gw, gy);
  V4_LAUNCH("linear");
  return DI_OK;
}

di_status di_v4k_linear(const float *x, int ldx, const void *W, int wf32, int T, int R, int C, float *y, int ldy,
                        di_cu_stream s) {
  return di_v4k_linear_groups(x, ldx, W, wf32, T, R, C, y, ldy, 1, 0, 0, 0, s);
}

/* ---- norms, rope, embedding ------------------------------------------------------------------------ */

/* In-place RMSNorm of the CTA's row r (di_v4_rmsnorm: the sum of squares in double); every thread of the CTA. */
static __device__ __forceinline__ void rmsnorm_row(float *r, int n, const float *w, float eps) {
  double ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)r[i] * r[i];
  ss = block_sum_d(ss);
  const float k = (float)(1.0 / sqrt(ss / n + (double)eps));
  for (int i = threadIdx.x; i < n; i += blockDim.x) r[i] = w ? w[i] * (r[i] * k) : r[i] * k;
}
__global__ void rmsnorm_k(float *x, int ld, int n, const float *w, float eps) { rmsnorm_row(x + (size_t)blockIdx.x * ld, n, w, eps); }

di_status di_v4k_rmsnorm(float *x, int ld, int n_rows, int n, const float *weight, float eps, di_cu_stream s) {
  if (n_rows <= 0) return DI_OK;
  rmsnorm_k<<<n_rows, 256, 0, s>>>(x, ld, n, weight, eps);
  V4_LAUNCH("rmsnorm");
  return DI_OK;
}

__global__ void rope_k(float *x, int ld, int n_rows, int n, int rpt, const int32_t *pos, const float *inv_freq, int d,
                       float af, int sign) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x, half = d / 2;
  if (idx >= n_rows * half) return;
  const int row = idx / half, i = idx % half;
  rope_pair(x + (size_t)row * ld + (n - d), i, inv_freq[i], pos[row / rpt], af, sign);
}

di_status di_v4k_rope(float *x, int ld, int n_rows, int n, int rows_per_token, const int32_t *pos, const float *inv_freq,
                      int rope_dim, float attn_factor, int sign, di_cu_stream s) {
  const int total = n_rows * (rope_dim / 2);
  if (total <= 0) return DI_OK;
  rope_k<<<(total + 255) / 256, 256, 0, s>>>(x, ld, n_rows, n, rows_per_token, pos, inv_freq, rope_dim, attn_factor, sign);
  V4_LAUNCH("rope");
  return DI_OK;
}

/* RMSNorm then RoPE of row blockIdx.x in one launch (the q heads; the kv row): rmsnorm_k's and rope_k's
 * arithmetic on the same values in the same order, so the same bits as the two launches; with win.pool the kv row
 * is then written into the window (window_write_k's copy). */
typedef struct v4k_win {
  float *pool;
  const di_v4k_seq *seqs;
  const int32_t *seq_of;
  int nl, l;
  const int32_t *n_tok; /* graph steps: rows past the step's own are not written */
} v4k_win;
__global__ void rmsnorm_rope_k(float *x, int ld, int n, const float *w, float eps, int rpt, const int32_t *pos,
                               const float *inv_freq, int d, float af, v4k_win win) {
  float *r = x + (size_t)blockIdx.x * ld;
  rmsnorm_row(r, n, w, eps);
  __syncthreads(); /* the normed row is visible to the CTA */
  for (int i = threadIdx.x; i < d / 2; i += blockDim.x) rope_pair(r + (n - d), i, inv_freq[i], pos[blockIdx.x / rpt], af, 1);
  if (!win.pool) return;
  __syncthreads(); /* the roped row, then into the window (window_write_k's copy, not past the step's own rows) */
  const int t = blockIdx.x;
  if (t >= (win.n_tok ? *win.n_tok : gridDim.x)) return;
  float *dst = (float *)window_row(win.pool, win.seqs[win.seq_of[t]].tab[3], win.nl, win.l, n, pos[t]);
  for (int e = threadIdx.x; e < n; e += blockDim.x) dst[e] = r[e];
}
#define FUSE_DEFAULT 2
static int g_fuse = FUSE_DEFAULT; /* 1 (norm + rope one launch: verified, session 14 request 1); 2 (and the kv window write: the
                                     same hashes, session 15's batch A; ncu: 6.5 us a layer against 4.9 + 2.9) the default */
static const v4k_win no_win = {NULL, NULL, NULL, 0, 0, NULL};
extern "C" void di_v4k_fuse(int on) { g_fuse = on < 0 ? FUSE_DEFAULT : on; }

di_status di_v4k_rmsnorm_rope(float *x, int ld, int n_rows, int n, const float *weight, float eps, int rows_per_token,
                              const int32_t *pos, const float *inv_freq, int rope_dim, float attn_factor, di_cu_stream s) {
  if (!g_fuse) {
    DI_TRY(di_v4k_rmsnorm(x, ld, n_rows, n, weight, eps, s));
    return di_v4k_rope(x, ld, n_rows, n, rows_per_token, pos, inv_freq, rope_dim, attn_factor, 1, s);
  }
  if (n_rows <= 0) return DI_OK;
  rmsnorm_rope_k<<<n_rows, 256, 0, s>>>(x, ld, n, weight, eps, rows_per_token, pos, inv_freq, rope_dim, attn_factor, no_win);
  V4_LAUNCH("rmsnorm_rope");
  return DI_OK;
}

di_status di_v4k_rmsnorm_rope_window(float *kv, int T, int hd, const float *weight, float eps, const int32_t *pos,
                                     const float *inv_freq, int rope_dim, float attn_factor, const int32_t *seq_of,
                                     const di_v4k_seq *seqs, float *pool, int n_layers, int l, const int32_t *n_tok,
                                     di_cu_stream s) {
  if (g_fuse < 2) {
    DI_TRY(di_v4k_rmsnorm_rope(kv, hd, T, hd, weight, eps, 1, pos, inv_freq, rope_dim, attn_factor, s));
    return di_v4k_window_write(kv, pos, seq_of, seqs, pool, n_layers, l, hd, T, n_tok, s);
  }
  if (T <= 0) return DI_OK;
  const v4k_win win = {pool, seqs, seq_of, n_layers, l, n_tok};
  rmsnorm_rope_k<<<T, 256, 0, s>>>(kv, hd, hd, weight, eps, 1, pos, inv_freq, rope_dim, attn_factor, win);
  V4_LAUNCH("rmsnorm_rope_window");
  return DI_OK;
}

template <typename WT>
__global__ void embed_k(const WT *E, const int32_t *tok, int T, int D, int hc, float *X) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * D) return;
  const int t = idx / D, d = idx % D;
  const float v = wload(E, (size_t)tok[t] * D + d);
  for (int j = 0; j < hc; j++) X[((size_t)t * hc + j) * D + d] = v;
}

di_status di_v4k_embed(const void *embed, int wf32, const int32_t *tokens, int T, int D, int hc, float *X, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  const int g = (T * D + 255) / 256;
  if (wf32) embed_k<float><<<g, 256, 0, s>>>((const float *)embed, tokens, T, D, hc, X);
  else embed_k<bf16><<<g, 256, 0, s>>>((const bf16 *)embed, tokens, T, D, hc, X);
  V4_LAUNCH("embed");
  return DI_OK;
}

/* y[t][c] = bf16(x[t][c]) (round to nearest even), the tensor-core mode's activations */
__global__ void to_bf16_k(const float *x, int ldx, int T, int C, bf16 *y) {
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (int64_t)T * C) return;
  const int t = (int)(idx / C), c = (int)(idx % C);
  y[idx] = __float2bfloat16_rn(x[(size_t)t * ldx + c]);
}

di_status di_v4k_to_bf16(const float *x, int ldx, int T, int C, uint16_t *y, di_cu_stream s) {
  if (T <= 0 || C <= 0) return DI_OK;
  const int64_t n = (int64_t)T * C;
  to_bf16_k<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, ldx, T, C, (bf16 *)y);
  V4_LAUNCH("to_bf16");
  return DI_OK;
}

/* ---- hyper-connections ------------------------------------------------------------------------------ */

#define HC_MAX 16
#define HC_MIX_MAX ((2 + HC_MAX) * HC_MAX)
#define HC_COLS 256 /* columns of a token's streams per CTA of hc_mix_k (its threads); fixed, so every sum runs
                       in the same order at any batch */
static __device__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

static int hc_splits(int D, int hc) { return (hc * D + HC_COLS - 1) / HC_COLS; }
size_t di_v4k_hc_scratch(int T, int D, int hc) {
  return (size_t)(T > 0 ? T : 1) * hc_splits(D, hc) * ((2 + hc) * hc + 1);
}

/* The mixes' dot products split over the columns (the mHC matrix is 24 rows of hc * D: one CTA per
 * token would stream it from one SM): CTA (s, i) takes columns [s * HC_COLS, +HC_COLS) of token
 * rows ? rows[i] : i and writes part[(i * nsplit + s) * (nmix + 1) + m]: its share of fn_m . X (m < nmix)
 * and of X . X (m = nmix), in double. */
/* GROUPED (di_v4k_hc_form 2): the mix rows' values read 8 at a time ahead of their sums (read-only loads, which the
 * shared-memory stores between the sums cannot alias), the same products and sums. */
#define HC_MIXG 8
template <bool GROUPED>
__global__ void __launch_bounds__(HC_COLS) hc_mix_k(const float *X, const int32_t *rows, const float *fn, int n, int nmix,
                                                    double *part) {
  const int s = blockIdx.x, i = blockIdx.y, t = rows ? rows[i] : i;
  const int c = s * HC_COLS + threadIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ double red[HC_COLS / 32][HC_MIX_MAX + 1];
  const float x = c < n ? X[(size_t)t * n + c] : 0.0f;
  if constexpr (GROUPED) {
    for (int m0 = 0; m0 < nmix; m0 += HC_MIXG) {
      float fv[HC_MIXG];
#pragma unroll
      for (int g = 0; g < HC_MIXG; g++) fv[g] = c < n && m0 + g < nmix ? __ldg(fn + (size_t)(m0 + g) * n + c) : 0.0f;
#pragma unroll
      for (int g = 0; g < HC_MIXG; g++) {
        if (m0 + g >= nmix) break;
        double v = c < n ? (double)fv[g] * x : 0.0;
        v = warp_sum_d(v);
        if (lane == 0) red[warp][m0 + g] = v;
      }
    }
  } else {
#pragma unroll 4
    for (int m = 0; m < nmix; m++) {
      double v = c < n ? (double)fn[(size_t)m * n + c] * x : 0.0;
      v = warp_sum_d(v);
      if (lane == 0) red[warp][m] = v;
    }
  }
  const double sq = warp_sum_d((double)x * x);
  if (lane == 0) red[warp][nmix] = sq;
  __syncthreads();
  for (int m = threadIdx.x; m <= nmix; m += blockDim.x) {
    double v = 0;
    for (int w = 0; w < HC_COLS / 32; w++) v += red[w][m];
    part[((size_t)i * gridDim.x + s) * (nmix + 1) + m] = v;
  }
}

/* mixes[m] = (fn_m . X) / rms(X) of one token from its partials (the splits summed in order); shared
 * memory out, the CTA synchronised after. The partials are first copied to shared memory by the whole CTA
 * (their loads in flight together; the in-order sums then read shared memory), when they fit. */
#define HC_GATHER_MAX 2048 /* doubles of partials staged (nsplit x (nmix + 1)); V4-Flash: 64 x 25 */
static __device__ void hc_gather(const double *part, int nsplit, int nmix, int n, float eps, double *mixes) {
  __shared__ double r;
  __shared__ double stage[HC_GATHER_MAX];
  const int np = nsplit * (nmix + 1), staged = np <= HC_GATHER_MAX;
  if (staged) {
    for (int i = threadIdx.x; i < np; i += blockDim.x) stage[i] = part[i];
    __syncthreads();
  }
  const double *src = staged ? stage : part;
  /* thread 0: the sum of squares; threads 1..nmix: the mixes' sums (each in split order), then scaled */
  double v = 0;
  const int m = (int)threadIdx.x - 1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < nsplit; s++) v += src[(size_t)s * (nmix + 1) + nmix];
    r = 1.0 / sqrt(v / n + (double)eps);
  } else if (m < nmix) {
    for (int s = 0; s < nsplit; s++) v += src[(size_t)s * (nmix + 1) + m];
  }
  __syncthreads();
  if (threadIdx.x > 0 && m < nmix) mixes[m] = v * r;
  for (int k = (int)blockDim.x - 1 + (int)threadIdx.x; k < nmix; k += blockDim.x) { /* (nmix >= blockDim.x: the rest) */
    double w = 0;
    for (int s = 0; s < nsplit; s++) w += src[(size_t)s * (nmix + 1) + k];
    mixes[k] = w * r;
  }
  __syncthreads();
}

/* out[d] = RMSNorm(sum_j pre[j] Xt[j][d]) * norm[d] (norm NULL: unweighted): the collapse of the mHC site
 * and of the head alike. One CTA. grouped (di_v4k_hc_form 1): a thread's columns d = threadIdx.x + i blockDim.x
 * are taken HCG at a time with all their loads issued first (the plain loop waits one memory latency per column:
 * each store to out may alias the next column's loads; hc_pre_k / head_pre_k took ~23 / 27 us at D = 4,096), then
 * summed in the plain loop's order: the same bits. */
#define HCG 4
#define HC_FORM_DEFAULT 1
static int g_hc_form = HC_FORM_DEFAULT; /* 1 (the collapse's grouped loads: verified, session 14 request 1), 2 (and the mixes') not yet run on the device */
extern "C" void di_v4k_hc_form(int form) { g_hc_form = form < 0 ? HC_FORM_DEFAULT : form; }
static __device__ void hc_collapse(const float *Xt, const double *pre, int D, int hc, float eps, const float *norm, float *out,
                                   int grouped) {
  if (!grouped) { /* the plain loops (di_v4k_hc_form 0) */
    double s2 = 0;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      double s = 0;
      for (int j = 0; j < hc; j++) s += pre[j] * Xt[j * D + d];
      const float v = (float)s;
      out[d] = v;
      s2 += (double)v * v;
    }
    s2 = block_sum_d(s2);
    const float k = (float)(1.0 / sqrt(s2 / D + (double)eps));
    for (int d = threadIdx.x; d < D; d += blockDim.x) out[d] = norm ? norm[d] * (out[d] * k) : out[d] * k;
    return;
  }
  double s2 = 0;
  const int bd = blockDim.x;
  for (int d0 = threadIdx.x; d0 < D; d0 += HCG * bd) {
    float xv[HCG][HC_MAX];
#pragma unroll
    for (int g = 0; g < HCG; g++)
#pragma unroll
      for (int j = 0; j < HC_MAX; j++) xv[g][j] = j < hc && d0 + g * bd < D ? Xt[j * D + d0 + g * bd] : 0.0f;
#pragma unroll
    for (int g = 0; g < HCG; g++) {
      if (d0 + g * bd >= D) break;
      double s = 0;
#pragma unroll
      for (int j = 0; j < HC_MAX; j++)
        if (j < hc) s += pre[j] * xv[g][j];
      const float v = (float)s;
      out[d0 + g * bd] = v;
      s2 += (double)v * v;
    }
  }
  s2 = block_sum_d(s2);
  const float k = (float)(1.0 / sqrt(s2 / D + (double)eps));
  for (int d0 = threadIdx.x; d0 < D; d0 += HCG * bd) {
    float ov[HCG], nv[HCG];
#pragma unroll
    for (int g = 0; g < HCG; g++) {
      const int d = d0 + g * bd;
      ov[g] = d < D ? out[d] : 0.0f;
      nv[g] = d < D && norm ? norm[d] : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < HCG; g++)
      if (d0 + g * bd < D) out[d0 + g * bd] = norm ? nv[g] * (ov[g] * k) : ov[g] * k;
  }
}

/* The Sinkhorn of one site (comb: softmax rows + hc_eps, then iters alternating row / column
 * normalisations), warp 0 with a lane per element (hc * hc <= 32): lane r * hc + k holds element (r, k)
 * and takes each row's / column's sum from the lanes holding it, in the CPU's order (k, then r, from 0),
 * so every lane's element gets the bits of the one-lane-per-row loop below, with hc x fewer dependent
 * divisions in a row. */
static __device__ void hc_sinkhorn_lanes(const double *mixes, const float *scale, const float *base, int hc, int iters,
                                         float hc_eps, double *comb_out) {
  const int lane = threadIdx.x & 31, r = lane / hc, k = lane % hc, on = lane < hc * hc;
  double v = on ? mixes[2 * hc + lane] * scale[2] + base[2 * hc + lane] : 0.0, mx = -INFINITY, sum = 0;
  for (int q = 0; q < hc; q++) {
    const double x = __shfl_sync(0xffffffffu, v, r * hc + q);
    mx = x > mx ? x : mx;
  }
  const double e = exp(v - mx);
  for (int q = 0; q < hc; q++) sum += __shfl_sync(0xffffffffu, e, r * hc + q);
  v = e / sum + hc_eps;
  for (int it = 0; it < iters; it++) {
    if (it > 0) { /* rows */
      double s = 0;
      for (int q = 0; q < hc; q++) s += __shfl_sync(0xffffffffu, v, r * hc + q);
      v /= s + hc_eps;
    }
    double s = 0; /* columns */
    for (int q = 0; q < hc; q++) s += __shfl_sync(0xffffffffu, v, q * hc + k);
    v /= s + hc_eps;
  }
  if (on) comb_out[lane] = v;
}

/* One site's pre-step: CTA (t, 0) the collapse (pre, then `in`), CTA (t, 1) post and the Sinkhorn, so the
 * two run side by side; each gathers the mixes itself. */
__global__ void hc_pre_k(const float *X, const double *part, int nsplit, const float *base, const float *scale,
                         const float *norm, int D, int hc, int iters, float eps, float hc_eps, float *in, double *post_out,
                         double *comb_out, int grouped, int role0) {
  const int t = blockIdx.x, n = hc * D, mix = (2 + hc) * hc, role = (int)blockIdx.y + role0;
  __shared__ double mixes[HC_MIX_MAX];
  __shared__ double pre[HC_MAX];
  hc_gather(part + (size_t)t * nsplit * (mix + 1), nsplit, mix, n, eps, mixes);
  const int j = threadIdx.x;
  if (role == 0) {
    if (j < hc) pre[j] = sigmoid_d(mixes[j] * scale[0] + base[j]) + hc_eps;
    __syncthreads();
    hc_collapse(X + (size_t)t * n, pre, D, hc, eps, norm, in + (size_t)t * D, grouped);
    return;
  }
  if (j < hc) post_out[(size_t)t * hc + j] = 2 * sigmoid_d(mixes[hc + j] * scale[1] + base[hc + j]);
  if (hc * hc <= 32) {
    if (threadIdx.x < 32) hc_sinkhorn_lanes(mixes, scale, base, hc, iters, hc_eps, comb_out + (size_t)t * hc * hc);
    return;
  }
  /* in shared memory, lane j of warp 0 taking row j (or column j) of each step: the CPU's per-row and
   * per-column sums, each in its own order (on global memory, one thread: ~100 us of dependent accesses) */
  __shared__ double cm[HC_MAX * HC_MAX];
  if (j < hc) {
    double *row = cm + j * hc, mx = -INFINITY, sum = 0;
    for (int k = 0; k < hc; k++) {
      row[k] = mixes[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
      mx = row[k] > mx ? row[k] : mx;
    }
    for (int k = 0; k < hc; k++) sum += (row[k] = exp(row[k] - mx));
    for (int k = 0; k < hc; k++) row[k] = row[k] / sum + hc_eps;
  }
  if (threadIdx.x < 32) {
    for (int it = 0; it < iters; it++) {
      __syncwarp();
      if (it > 0 && j < hc) { /* rows */
        double s = 0;
        for (int k = 0; k < hc; k++) s += cm[j * hc + k];
        for (int k = 0; k < hc; k++) cm[j * hc + k] /= s + hc_eps;
      }
      __syncwarp();
      if (j < hc) { /* columns */
        double s = 0;
        for (int r = 0; r < hc; r++) s += cm[r * hc + j];
        for (int r = 0; r < hc; r++) cm[r * hc + j] /= s + hc_eps;
      }
    }
    __syncwarp();
    for (int i = j; i < hc * hc; i += 32) comb_out[(size_t)t * hc * hc + i] = cm[i];
  }
}

di_status di_v4k_hc_pre_parts(const float *X, const float *fn, const float *base, const float *scale, const float *norm,
                              int T, int D, int hc, int iters, float eps, float hc_eps, float *in, double *post, double *comb,
                              double *part, int parts, di_cu_stream s) {
  if (hc > HC_MAX) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: hc_mult %d > %d", hc, HC_MAX);
  if (T <= 0) return DI_OK;
  if (T > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: mHC over %d tokens at once", T);
  const int nsplit = hc_splits(D, hc), mix = (2 + hc) * hc;
  if (parts & 1) {
    if (g_hc_form >= 2) hc_mix_k<true><<<dim3(nsplit, T), HC_COLS, 0, s>>>(X, NULL, fn, hc * D, mix, part);
    else hc_mix_k<false><<<dim3(nsplit, T), HC_COLS, 0, s>>>(X, NULL, fn, hc * D, mix, part);
    V4_LAUNCH("hc_mix");
  }
  /* CTA (t, y): role y + role0 (0 the collapse, 1 post + Sinkhorn) */
  const int roles = ((parts >> 1) & 1) + ((parts >> 2) & 1), role0 = (parts & 2) ? 0 : 1;
  if (roles) {
    hc_pre_k<<<dim3(T, roles), 256, 0, s>>>(X, part, nsplit, base, scale, norm, D, hc, iters, eps, hc_eps, in, post, comb,
                                            g_hc_form, role0);
    V4_LAUNCH("hc_pre");
  }
  return DI_OK;
}
di_status di_v4k_hc_pre(const float *X, const float *fn, const float *base, const float *scale, const float *norm, int T,
                        int D, int hc, int iters, float eps, float hc_eps, float *in, double *post, double *comb,
                        double *part, di_cu_stream s) {
  return di_v4k_hc_pre_parts(X, fn, base, scale, norm, T, D, hc, iters, eps, hc_eps, in, post, comb, part, 7, s);
}

__global__ void hc_post_k(float *X, const float *out, const double *post, const double *comb, int T, int D, int hc) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * D) return;
  const int t = idx / D, d = idx % D;
  float *Xt = X + (size_t)t * hc * D;
  const double *pt = post + (size_t)t * hc, *ct = comb + (size_t)t * hc * hc;
  float old[HC_MAX];
  for (int j = 0; j < hc; j++) old[j] = Xt[j * D + d];
  const float o = out[(size_t)t * D + d];
  for (int k = 0; k < hc; k++) {
    double s = pt[k] * o;
    for (int j = 0; j < hc; j++) s += ct[j * hc + k] * old[j];
    Xt[k * D + d] = (float)s;
  }
}

di_status di_v4k_hc_post(float *X, const float *out, const double *post, const double *comb, int T, int D, int hc,
                         di_cu_stream s) {
  if (T <= 0) return DI_OK;
  hc_post_k<<<(T * D + 255) / 256, 256, 0, s>>>(X, out, post, comb, T, D, hc);
  V4_LAUNCH("hc_post");
  return DI_OK;
}

/* The head's collapse: the mHC site's with hc sigmoid mixes only (no post / comb, no Sinkhorn). */
__global__ void head_pre_k(const float *X, const int32_t *rows, const double *part, int nsplit, const float *base,
                           const float *scale, const float *fnorm, int D, int hc, float eps, float hc_eps, float *y, int grouped) {
  const int i = blockIdx.x, n = hc * D;
  __shared__ double mixes[HC_MAX], pre[HC_MAX];
  hc_gather(part + (size_t)i * nsplit * (hc + 1), nsplit, hc, n, eps, mixes);
  if (threadIdx.x < hc) pre[threadIdx.x] = sigmoid_d(mixes[threadIdx.x] * scale[0] + base[threadIdx.x]) + hc_eps;
  __syncthreads();
  hc_collapse(X + (size_t)rows[i] * n, pre, D, hc, eps, fnorm, y + (size_t)i * D, grouped);
}

di_status di_v4k_head_pre(const float *X, const int32_t *rows, int n, const float *fn, const float *base,
                          const float *scale, const float *final_norm, int D, int hc, float eps, float hc_eps, float *y,
                          double *part, di_cu_stream s) {
  if (hc > HC_MAX) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: hc_mult %d > %d", hc, HC_MAX);
  if (n <= 0) return DI_OK;
  if (n > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: head over %d rows at once", n);
  const int nsplit = hc_splits(D, hc);
  if (g_hc_form >= 2) hc_mix_k<true><<<dim3(nsplit, n), HC_COLS, 0, s>>>(X, rows, fn, hc * D, hc, part);
  else hc_mix_k<false><<<dim3(nsplit, n), HC_COLS, 0, s>>>(X, rows, fn, hc * D, hc, part);
  V4_LAUNCH("head_mix");
  head_pre_k<<<n, 256, 0, s>>>(X, rows, part, nsplit, base, scale, final_norm, D, hc, eps, hc_eps, y, g_hc_form);
  V4_LAUNCH("head_pre");
  return DI_OK;
}

__global__ void add_ape_k(float *gate, const float *ape, const int32_t *pos, int T, int rate, int width) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * width) return;
  const int t = idx / width, c = idx % width;
  gate[idx] += ape[(size_t)(pos[t] % rate) * width + c];
}

di_status di_v4k_add_ape(float *gate, const float *ape, const int32_t *pos, int T, int rate, int width, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  add_ape_k<<<(T * width + 255) / 256, 256, 0, s>>>(gate, ape, pos, T, rate, width);
  V4_LAUNCH("add_ape");
  return DI_OK;
}

/* ---- MoE ------------------------------------------------------------------------------------------- */

#define ROUTE_MAX_E 1024
#define ROUTE_MAX_K 16
/* sqrt(softplus(x)) (x itself above 20) or sigmoid, rounded to float as the CPU stores it */
static __device__ float route_score(float x, int sigm) {
  const double d = x;
  return (float)(sigm ? 1.0 / (1.0 + exp(-d)) : sqrt(d > 20 ? d : log1p(exp(d))));
}

/* Token t's picks and weights from its router logits lg, the CPU's di_v4_moe routing: by tid2eid (hash layers),
 * else the top-k of work (the biased scores of the E experts, reordered) by torch.topk's own procedure
 * (backend/v4_torch_select.h, as the CPU), so exactly equal biased scores pick the same experts as the CPU; the
 * picks are then taken in ascending id order, as the CPU sums them, and merged into ids / wts. */
static __device__ void route_pick(const float *lg, di_v4_scored *work, const int32_t *tid2eid, const int32_t *tokens, int t, int E,
                                  int K, int sigm, float scaling, int32_t *ids, float *wts) {
  int idx[ROUTE_MAX_K];
  float sc[ROUTE_MAX_K];
  if (tid2eid) {
    for (int k = 0; k < K; k++) idx[k] = tid2eid[(size_t)tokens[t] * K + k];
  } else {
    di_v4s_select_pairs(work, E, K);
    for (int k = 0; k < K; k++) idx[k] = work[k].i;
    for (int a = 1; a < K; a++) /* ascending ids (insertion sort) */
      for (int b2 = a; b2 > 0 && idx[b2 - 1] > idx[b2]; b2--) {
        const int ti = idx[b2];
        idx[b2] = idx[b2 - 1];
        idx[b2 - 1] = ti;
      }
  }
  for (int k = 0; k < K; k++) sc[k] = route_score(lg[idx[k]], sigm);
  double sum = 0;
  for (int k = 0; k < K; k++) sum += sc[k];
  /* merged weights by expert, in the CPU's accumulation order (k ascending) */
  int uid[ROUTE_MAX_K];
  float uw[ROUTE_MAX_K];
  int nu = 0;
  for (int k = 0; k < K; k++) {
    const float w = (float)(sc[k] / (sum + 1e-20) * scaling);
    int u = 0;
    while (u < nu && uid[u] != idx[k]) u++;
    if (u == nu) { uid[nu] = idx[k]; uw[nu++] = 0; }
    uw[u] += w;
  }
  for (int a = 1; a < nu; a++) /* ascending ids (insertion sort) */
    for (int b2 = a; b2 > 0 && uid[b2 - 1] > uid[b2]; b2--) {
      int ti = uid[b2]; uid[b2] = uid[b2 - 1]; uid[b2 - 1] = ti;
      float tw = uw[b2]; uw[b2] = uw[b2 - 1]; uw[b2 - 1] = tw;
    }
  const int ns = K + 1;
  ids[(size_t)t * ns] = E;
  wts[(size_t)t * ns] = 1;
  for (int k = 0; k < K; k++) {
    ids[(size_t)t * ns + 1 + k] = k < nu ? uid[k] : -1;
    wts[(size_t)t * ns + 1 + k] = k < nu ? uw[k] : 0;
  }
}

/* One thread per token (E <= 1024 in local memory). */
__global__ void route_k(const float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tokens, int T, int E,
                        int K, int sigm, float scaling, int32_t *ids, float *wts) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float *lg = logits + (size_t)t * E;
  di_v4_scored work[ROUTE_MAX_E];
  if (!tid2eid)
    for (int e = 0; e < E; e++) work[e] = di_v4_scored{route_score(lg[e], sigm) + bias[e], e};
  route_pick(lg, work, tid2eid, tokens, t, E, K, sigm, scaling, ids, wts);
}

/* route_k with a warp per token (di_v4k_route_form 1): the lanes score the experts into shared memory (the same
 * per-expert function: route_k's one thread spent ~10 us on 8 experts' double exp / log1p / sqrt, ~40 at 256), then
 * lane 0 selects, merges and writes exactly as route_k. */
#define ROUTE_WARPS 2
__global__ void __launch_bounds__(ROUTE_WARPS * 32) route_warp_k(const float *logits, const float *bias, const int32_t *tid2eid,
                                                                 const int32_t *tokens, int T, int E, int K, int sigm,
                                                                 float scaling, int32_t *ids, float *wts) {
  __shared__ di_v4_scored work_s[ROUTE_WARPS][ROUTE_MAX_E];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.x * ROUTE_WARPS + warp;
  if (t >= T) return;
  const float *lg = logits + (size_t)t * E;
  di_v4_scored *work = work_s[warp];
  if (!tid2eid)
    for (int e = lane; e < E; e += 32) work[e] = di_v4_scored{route_score(lg[e], sigm) + bias[e], e};
  __syncwarp();
  if (lane == 0) route_pick(lg, tid2eid ? NULL : work, tid2eid, tokens, t, E, K, sigm, scaling, ids, wts);
}
#define ROUTE_FORM_DEFAULT 1
static int g_route_form = ROUTE_FORM_DEFAULT; /* 1 (route_warp_k: verified, session 14 request 1) */
extern "C" void di_v4k_route_form(int form) { g_route_form = form < 0 ? ROUTE_FORM_DEFAULT : form; }

di_status di_v4k_route(const float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tokens, int T,
                       int E, int K, int sigmoid_scores, float scaling, int32_t *ids, float *wts, di_cu_stream s) {
  if (E > ROUTE_MAX_E || K > ROUTE_MAX_K || K > E)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: routing of %d of %d experts (at most %d of %d)", K, E, ROUTE_MAX_K,
                        ROUTE_MAX_E);
  if (T <= 0) return DI_OK;
  if (g_route_form == 1)
    route_warp_k<<<(T + ROUTE_WARPS - 1) / ROUTE_WARPS, 32 * ROUTE_WARPS, 0, s>>>(logits, bias, tid2eid, tokens, T, E, K,
                                                                               sigmoid_scores, scaling, ids, wts);
  else
    route_k<<<(T + 63) / 64, 64, 0, s>>>(logits, bias, tid2eid, tokens, T, E, K, sigmoid_scores, scaling, ids, wts);
  V4_LAUNCH("route");
  return DI_OK;
}

/* The (token, slot) pairs of a step grouped by expert in tiles of up to LIN_TOK, so that one CTA reads an
 * expert's rows once for all its tokens of the tile. work: [0] the tile count, then max_tiles triples
 * (expert, first, count) into perm, then perm [T * n_slots] (slot indices ts, grouped by expert; the
 * order inside an expert is whatever the atomics give, which changes no result: row_dot). */
#define GROUP_MAX_E 1025
__global__ void expert_tiles_k(const int32_t *ids, int n, int E1, int max_tiles, int32_t *work) {
  __shared__ int cnt[GROUP_MAX_E], cur[GROUP_MAX_E];
  for (int e = threadIdx.x; e < E1; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int ts = threadIdx.x; ts < n; ts += blockDim.x)
    if (ids[ts] >= 0) atomicAdd(&cnt[ids[ts]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, nt = 0;
    for (int e = 0; e < E1; e++) {
      cur[e] = off;
      for (int j = 0; j < cnt[e] && nt < max_tiles; j += LIN_TOK, nt++) {
        work[1 + 3 * nt] = e;
        work[2 + 3 * nt] = off + j;
        work[3 + 3 * nt] = cnt[e] - j < LIN_TOK ? cnt[e] - j : LIN_TOK;
      }
      off += cnt[e];
    }
    work[0] = nt;
  }
  __syncthreads();
  int32_t *perm = work + 1 + 3 * max_tiles;
  for (int ts = threadIdx.x; ts < n; ts += blockDim.x)
    if (ids[ts] >= 0) perm[atomicAdd(&cur[ids[ts]], 1)] = ts;
}

int di_v4k_expert_max_tiles(int T, int n_slots, int E1) {
  const int n = T * n_slots;
  return n / LIN_TOK + (E1 < n ? E1 : n) + 1;
}

di_status di_v4k_expert_tiles(const int32_t *ids, int T, int n_slots, int E1, int32_t *work, di_cu_stream s) {
  if (E1 > GROUP_MAX_E) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: %d experts (at most %d)", E1 - 1, GROUP_MAX_E - 1);
  if (T <= 0) return DI_OK;
  expert_tiles_k<<<1, 1024, 0, s>>>(ids, T * n_slots, E1, di_v4k_expert_max_tiles(T, n_slots, E1), work);
  V4_LAUNCH("expert_tiles");
  return DI_OK;
}

/* The slots of a CTA: one slot (grid.y = slot, tiles NULL) or a tile of one expert's slots; none for expert
 * e_skip (the native mode's shared expert, computed on its own). */
static __device__ __forceinline__ int cta_slots(const int32_t *ids, const int32_t *tiles, int max_tiles, int e_skip, int *e,
                                                int *ts) {
  if (!tiles) {
    ts[0] = blockIdx.y;
    *e = ids[blockIdx.y];
    return *e >= 0 && *e != e_skip;
  }
  if ((int)blockIdx.y >= tiles[0]) return 0;
  const int32_t *tl = tiles + 1 + 3 * blockIdx.y, *perm = tiles + 1 + 3 * max_tiles;
  *e = tl[0];
  if (*e == e_skip) return 0;
  for (int j = 0; j < tl[2]; j++) ts[j] = perm[tl[1] + j];
  return tl[2];
}

template <typename WM, int VEC>
__global__ void expert_up_k(const float *x, const int32_t *ids, const int32_t *tiles, int max_tiles, int e_skip, WM w1, WM w3,
                            int ns, int D, int I, float lim, float *act) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * LIN_ROWS + warp;
  int e, ts[LIN_TOK];
  const int nt = cta_slots(ids, tiles, max_tiles, e_skip, &e, ts);
  constexpr int staged = VEC == VEC_STAGED && std::is_same<WM, const bf16 *>::value;
  if (nt <= 0 || (i >= I && !staged)) return; /* (nt is the CTA's) */
  const float *xr[LIN_TOK];
  gv_act_rows<LIN_TOK>(xr, x, D, ts, 0, nt, ns);
  float ag[LIN_TOK], au[LIN_TOK];
#pragma unroll
  for (int j = 0; j < LIN_TOK; j++) ag[j] = au[j] = 0;
  const size_t row = (size_t)e * I + (i < I ? i : 0);
  if constexpr (staged) {
    rows_dot_staged(w1 + row * D, w3 + row * D, xr, nt, D, i < I, ag, au);
    if (i >= I) return;
  } else {
    dot_row<VEC>(wrow(w1, row, D), xr, nt, D, lane, ag);
    dot_row<VEC>(wrow(w3, row, D), xr, nt, D, lane, au);
  }
#pragma unroll
  for (int j = 0; j < LIN_TOK; j++) {
    const float g = warp_sum_f(ag[j]), u = warp_sum_f(au[j]);
    if (lane == 0 && j < nt) {
      const float gv = g > lim ? lim : g;
      const float uv = u > lim ? lim : u < -lim ? -lim : u;
      act[(size_t)ts[j] * I + i] = (float)(gv / (1.0 + exp(-(double)gv))) * uv;
    }
  }
}

di_status di_v4k_expert_up(const float *x, const int32_t *ids, const int32_t *tiles, int E1, const void *w1, const void *w3,
                           int wf32, int T, int n_slots, int D, int I, float limit, float *act, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  const int mt = di_v4k_expert_max_tiles(T, n_slots, E1);
  dim3 grid((I + LIN_ROWS - 1) / LIN_ROWS, tiles ? mt : T * n_slots);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: %d tokens x %d expert slots at once", T, n_slots);
  const int v8 = vec8_ok(x, D, w1, D) && vec8_ok(x, D, w3, D);
  if (wf32 && v8) expert_up_k<const float *, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ids, tiles, mt, -1, (const float *)w1, (const float *)w3, n_slots, D, I, limit, act);
  else if (wf32) expert_up_k<const float *, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ids, tiles, mt, -1, (const float *)w1, (const float *)w3, n_slots, D, I, limit, act);
  else if (v8 && T == 1) expert_up_k<const bf16 *, VEC_STAGED><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ids, tiles, mt, -1, (const bf16 *)w1, (const bf16 *)w3, n_slots, D, I, limit, act);
  else if (v8) expert_up_k<const bf16 *, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ids, tiles, mt, -1, (const bf16 *)w1, (const bf16 *)w3, n_slots, D, I, limit, act);
  else expert_up_k<const bf16 *, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ids, tiles, mt, -1, (const bf16 *)w1, (const bf16 *)w3, n_slots, D, I, limit, act);
  V4_LAUNCH("expert_up");
  return DI_OK;
}

template <typename WM, int VEC>
__global__ void expert_down_k(const float *act, const int32_t *ids, const int32_t *tiles, int max_tiles, int e_skip, WM w2,
                              int D, int I, float *y) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d = blockIdx.x * LIN_ROWS + warp;
  int e, ts[LIN_TOK];
  const int nt = cta_slots(ids, tiles, max_tiles, e_skip, &e, ts);
  constexpr int staged = VEC == VEC_STAGED && std::is_same<WM, const bf16 *>::value;
  if (nt <= 0 || (d >= D && !staged)) return; /* (nt is the CTA's) */
  const float *xr[LIN_TOK];
  gv_act_rows<LIN_TOK>(xr, act, I, ts, 0, nt);
  float acc[LIN_TOK];
#pragma unroll
  for (int j = 0; j < LIN_TOK; j++) acc[j] = 0;
  const size_t row = (size_t)e * D + (d < D ? d : 0);
  if constexpr (staged) {
    rows_dot_staged(w2 + row * I, NULL, xr, nt, I, d < D, acc, NULL);
    if (d >= D) return;
  } else {
    dot_row<VEC>(wrow(w2, row, I), xr, nt, I, lane, acc);
  }
#pragma unroll
  for (int j = 0; j < LIN_TOK; j++) {
    const float v = warp_sum_f(acc[j]);
    if (lane == 0 && j < nt) y[(size_t)ts[j] * D + d] = v;
  }
}

di_status di_v4k_expert_down(const float *act, const int32_t *ids, const int32_t *tiles, int E1, const void *w2, int wf32, int T,
                             int n_slots, int D, int I, float *y, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  const int mt = di_v4k_expert_max_tiles(T, n_slots, E1);
  dim3 grid((D + LIN_ROWS - 1) / LIN_ROWS, tiles ? mt : T * n_slots);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: %d tokens x %d expert slots at once", T, n_slots);
  const int v8 = vec8_ok(act, I, w2, I);
  if (wf32 && v8) expert_down_k<const float *, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(act, ids, tiles, mt, -1, (const float *)w2, D, I, y);
  else if (wf32) expert_down_k<const float *, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(act, ids, tiles, mt, -1, (const float *)w2, D, I, y);
  else if (v8 && T == 1) expert_down_k<const bf16 *, VEC_STAGED><<<grid, 32 * LIN_ROWS, 0, s>>>(act, ids, tiles, mt, -1, (const bf16 *)w2, D, I, y);
  else if (v8) expert_down_k<const bf16 *, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(act, ids, tiles, mt, -1, (const bf16 *)w2, D, I, y);
  else expert_down_k<const bf16 *, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(act, ids, tiles, mt, -1, (const bf16 *)w2, D, I, y);
  V4_LAUNCH("expert_down");
  return DI_OK;
}

/* ---- MXFP4 experts, staged (the native mode's default form, di_v4k_mx_form 1) ----
 * The lane form above gives a warp one weight row with one 16-byte load per lane in flight ahead and reads
 * the activations straight from memory with a 128-byte stride between lanes (32 values per lane step), so
 * one token streams at ~0.45 TB/s and a tile of 8 tokens is bound by those uncoalesced activation reads.
 * Here a CTA of MXS_WARPS warps stages its tokens' activations MXS_STEP columns at a time in shared memory,
 * padded 4 floats per 32 (lane l's 32 values start at 36 l: the float4 reads of a quarter warp fall in
 * distinct banks), and a warp owns MXS_NR weight rows (up: the gate and up rows of two outputs; down: four
 * outputs) whose next step's 16-byte loads are in flight while a step is summed. Per (row, token) each
 * lane sums the same 32 columns with the same expression in the same order as mx_row_dot, then the warp
 * sum is the same warp_sum_f: every output is bit-equal to the lane form's. At one token (MT = 1) the
 * lane keeps its 32 activations in registers across the rows; in the FAST forms (4, 5) a row of up to
 * MXS_WHOLE columns is staged whole at the start (no barrier per step: at one token the per-step staging's
 * two barriers and its L2 round trip were a large part of a CTA of 2-4 steps) and the codes are decoded by
 * byte permutes (mx_decode8). */
#define MXS_WARPS 8
#define MXS_NR 4
#define MXS_STEP 1024
#define MXS_LD (MXS_STEP + MXS_STEP / 8)
#define MXS_WHOLE 4096 /* one token's row staged whole up to this many columns (18 KB padded) */
#define MX_FORM_DEFAULT 4
static int g_mx_form = MX_FORM_DEFAULT;
extern "C" void di_v4k_mx_form(int form) { g_mx_form = form < 0 ? MX_FORM_DEFAULT : form; }

/* The 32 values of a lane's step from 16 code bytes (forms 4, 5): the same floats as mx_row_dot's e2m1_f32
 * (tested bit for bit through the forms' comparison), in ~3 integer operations a value instead of ~10: at one token the
 * staged kernels were bound by the decode's integer work (the H200's integer pipe runs at half the FMA
 * rate), not by memory. Every E2M1 value is a bf16 (high byte H, low byte L: 0 = 00 00, 0.5 = 3f 00,
 * 1 = 3f 80, 1.5 = 3f c0, 2 = 40 00, 3 = 40 40, 4 = 40 80, 6 = 40 c0): byte permutes (prmt) look up H and L
 * of four codes at once from 8-byte tables indexed by the codes' magnitude bits, a permute pairs codes j and
 * j + 4 of a word into one bf16x2 (their sign bits are then 16 apart, so one shift and one lop3 set both),
 * and the halves widen to floats exactly. */
#define MX_TH0 0x3f3f3f00u /* H of magnitudes 0..3 */
#define MX_TH1 0x40404040u /* H of 4..7 */
#define MX_TL0 0xc0800000u /* L of 0..3 */
#define MX_TL1 0xc0804000u /* L of 4..7 */
static __device__ __forceinline__ void mx_decode8(uint32_t u, float *w) {
  const uint32_t u7 = u & 0x77777777u;                                   /* magnitudes (the selectors' bit 3 clear) */
  const uint32_t ca = __byte_perm(u7, 0, 0x20), cb = __byte_perm(u7, 0, 0x31); /* codes 0 1 4 5 / 2 3 6 7 */
  const uint32_t ha = __byte_perm(MX_TH0, MX_TH1, ca), la = __byte_perm(MX_TL0, MX_TL1, ca);
  const uint32_t hb = __byte_perm(MX_TH0, MX_TH1, cb), lb = __byte_perm(MX_TL0, MX_TL1, cb);
  const uint32_t p[4] = {__byte_perm(la, ha, 0x6240), __byte_perm(la, ha, 0x7351), __byte_perm(lb, hb, 0x6240),
                         __byte_perm(lb, hb, 0x7351)}; /* bf16x2 of codes (j, j + 4), unsigned */
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const uint32_t q = p[j] | ((u << (12 - 4 * j)) & 0x80008000u); /* the two sign bits (code bit 3 -> 15, 31) */
    w[j] = __uint_as_float(q << 16);
    w[j + 4] = __uint_as_float(q & 0xffff0000u);
  }
}
/* FAST (forms 4, 5): the byte-permute decode; else (forms 1-3) mx_row_dot's own e2m1_f32 per value */
template <bool FAST>
static __device__ __forceinline__ void mx_decode32(uint4 v, float *w) {
  if constexpr (FAST) {
    mx_decode8(v.x, w);
    mx_decode8(v.y, w + 8);
    mx_decode8(v.z, w + 16);
    mx_decode8(v.w, w + 24);
  } else {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 32; j++) w[j] = e2m1_f32(u[j / 8] >> (4 * (j % 8)));
  }
}
/* mx_row_dot's step sum of one row with one token's 32 staged values at xs (padded row, lane offset applied) */
static __device__ __forceinline__ float mx_part(const float *w, const float *xs) {
  float part = 0;
#pragma unroll
  for (int j = 0; j < 32; j += 4) {
    const float4 a = *(const float4 *)(xs + j);
    part += w[j] * a.x + w[j + 1] * a.y + w[j + 2] * a.z + w[j + 3] * a.w;
  }
  return part;
}

template <int MT, bool UP, int NR, int MINB, bool FAST>
__global__ void __launch_bounds__(MXS_WARPS * 32, MINB) mx_staged_k(const float *x, const int32_t *ids, const int32_t *tiles,
                                                                   int max_tiles, int e_skip, mx4mat wa, mx4mat wb, int ns, int D,
                                                                   int I, float lim, float *out) {
  __shared__ __align__(16) float xs[MT == 1 && FAST ? MXS_WHOLE + MXS_WHOLE / 8 : MT * MXS_LD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int e, ts[LIN_TOK];
  const int nt = cta_slots(ids, tiles, max_tiles, e_skip, &e, ts);
  if (nt <= 0) return; /* (the CTA's: no barrier is skipped by part of it) */
  const int C = UP ? D : I, N = UP ? I : D;
  /* the warp's rows: up, gate / up of outputs o0, o0 + 1; down, outputs o0 .. o0 + 3 (clamped: computed, not stored) */
  const int o0 = (blockIdx.x * MXS_WARPS + warp) * (UP ? NR / 2 : NR);
  mx4row wr[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) {
    const int o = UP ? o0 + r / 2 : o0 + r, oc = o < N ? o : N - 1;
    wr[r] = wrow(UP && (r & 1) ? wb : wa, (size_t)e * N + oc, C);
  }
  const float *xr[MT];
  gv_act_rows<MT>(xr, x, C, ts, 0, nt, UP ? ns : 1);
  float acc[NR][MT];
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int j = 0; j < MT; j++) acc[r][j] = 0;
  uint4 cur[NR], nxt[NR];
  uint32_t ec[NR], en[NR];
  {
    const int c = lane * 32;
#pragma unroll
    for (int r = 0; r < NR; r++) {
      cur[r] = c < C ? di_ld_stream16(wr[r].q + c / 2) : make_uint4(0, 0, 0, 0);
      ec[r] = c < C ? __ldg(wr[r].s + c / 32) : 127u;
    }
  }
  /* FAST, one token whose row fits: staged whole once (one barrier; its loads in flight with the first weights),
   * so the warps then run their steps unsynchronised; else MXS_STEP columns of the tokens' rows per step */
  const bool whole = FAST && MT == 1 && C <= MXS_WHOLE;
  if (whole) {
    for (int c = threadIdx.x * 4; c < C; c += blockDim.x * 4) *(float4 *)(xs + c + (c >> 5) * 4) = *(const float4 *)(xr[0] + c);
    __syncthreads();
  }
  for (int c0 = 0; c0 < C; c0 += MXS_STEP) {
    if (!whole) {
      __syncthreads(); /* the last step's reads of xs are done */
      for (int idx = threadIdx.x; idx < nt * (MXS_STEP / 4); idx += blockDim.x) {
        const int j = idx / (MXS_STEP / 4), c = (idx % (MXS_STEP / 4)) * 4;
        if (c0 + c < C) *(float4 *)(xs + j * MXS_LD + c + (c >> 5) * 4) = *(const float4 *)(xr[j] + c0 + c);
      }
      __syncthreads();
    }
    const int c = c0 + lane * 32, cn = c + MXS_STEP;
#pragma unroll
    for (int r = 0; r < NR; r++) {
      nxt[r] = cn < C ? di_ld_stream16(wr[r].q + cn / 2) : make_uint4(0, 0, 0, 0);
      en[r] = cn < C ? __ldg(wr[r].s + cn / 32) : 127u;
    }
    if (c < C) {
      const float *xl = xs + (whole ? c0 + c0 / 8 : 0) + lane * 36;
#pragma unroll
      for (int r = 0; r < NR; r++) {
        float w[32];
        mx_decode32<FAST>(cur[r], w);
        const float sc = e8m0_scale(ec[r]);
#pragma unroll
        for (int j = 0; j < MT; j++)
          if (j < nt) acc[r][j] += mx_part(w, xl + j * MXS_LD) * sc;
      }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) cur[r] = nxt[r], ec[r] = en[r];
  }
#pragma unroll
  for (int j = 0; j < MT; j++) {
    if (UP) {
#pragma unroll
      for (int p = 0; p < NR / 2; p++) {
        const float g = warp_sum_f(acc[2 * p][j]), u = warp_sum_f(acc[2 * p + 1][j]);
        const int i = o0 + p;
        if (lane == 0 && j < nt && i < N) {
          const float gv = g > lim ? lim : g;
          const float uv = u > lim ? lim : u < -lim ? -lim : u;
          out[(size_t)ts[j] * I + i] = (float)(gv / (1.0 + exp(-(double)gv))) * uv;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const float v = warp_sum_f(acc[r][j]);
        if (lane == 0 && j < nt && o0 + r < N) out[(size_t)ts[j] * D + o0 + r] = v;
      }
    }
  }
}

/* Forms 6 / 7 at one token (a CTA per slot, the row staged whole): form 4's kernel with RG = 2 / 4 row groups a warp
 * one after another in a CTA (the groups of RG of form 4's CTAs), so a CTA stages the activation row once for RG
 * times the rows (form 4: 768 CTAs of 4 steps a warp for 6 experts' gate / up, 2 steps for down) and a warp's weight
 * stream runs across its groups: the last step of a group issues the next group's first loads. Per output the same
 * lanes, columns, expressions and order as form 4 (acc += mx_part(w, xl) * sc per step, then warp_sum_f and the
 * same epilogue): the same bits. Capped at 128 registers for 2 CTAs an SM. */
template <bool UP, int RG>
__global__ void __launch_bounds__(MXS_WARPS * 32, 2) mx_one_rg_k(const float *x, const int32_t *ids, const int32_t *tiles,
                                                                int max_tiles, int e_skip, mx4mat wa, mx4mat wb, int ns, int D,
                                                                int I, float lim, float *out) {
  constexpr int NR = MXS_NR, NO = UP ? NR / 2 : NR;
  __shared__ __align__(16) float xs[MXS_WHOLE + MXS_WHOLE / 8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int e, ts[LIN_TOK];
  const int nt = cta_slots(ids, tiles, max_tiles, e_skip, &e, ts);
  if (nt <= 0) return;
  const int C = UP ? D : I, N = UP ? I : D;
  const float *xr[1];
  gv_act_rows<1>(xr, x, C, ts, 0, nt, UP ? ns : 1);
  mx4row wr[NR];
  int o0 = (blockIdx.x * RG * MXS_WARPS + warp) * NO; /* group g: + g * MXS_WARPS * NO */
#pragma unroll
  for (int r = 0; r < NR; r++) {
    const int o = UP ? o0 + r / 2 : o0 + r, oc = o < N ? o : N - 1;
    wr[r] = wrow(UP && (r & 1) ? wb : wa, (size_t)e * N + oc, C);
  }
  uint4 cur[NR], nxt[NR];
  uint32_t ec[NR], en[NR];
  {
    const int c = lane * 32;
#pragma unroll
    for (int r = 0; r < NR; r++) {
      cur[r] = c < C ? di_ld_stream16(wr[r].q + c / 2) : make_uint4(0, 0, 0, 0);
      ec[r] = c < C ? __ldg(wr[r].s + c / 32) : 127u;
    }
  }
  for (int c = threadIdx.x * 4; c < C; c += blockDim.x * 4) *(float4 *)(xs + c + (c >> 5) * 4) = *(const float4 *)(xr[0] + c);
  __syncthreads();
  for (int g = 0; g < RG; g++, o0 += MXS_WARPS * NO) {
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0;
    for (int c0 = 0; c0 < C; c0 += MXS_STEP) {
      const int c = c0 + lane * 32, cn = c + MXS_STEP;
      if (c0 + MXS_STEP < C) { /* this group's next step */
#pragma unroll
        for (int r = 0; r < NR; r++) {
          nxt[r] = cn < C ? di_ld_stream16(wr[r].q + cn / 2) : make_uint4(0, 0, 0, 0);
          en[r] = cn < C ? __ldg(wr[r].s + cn / 32) : 127u;
        }
      } else if (g + 1 < RG) { /* the next group's first step */
        const int c1 = lane * 32, o1 = o0 + MXS_WARPS * NO;
#pragma unroll
        for (int r = 0; r < NR; r++) {
          const int o = UP ? o1 + r / 2 : o1 + r, oc = o < N ? o : N - 1;
          wr[r] = wrow(UP && (r & 1) ? wb : wa, (size_t)e * N + oc, C);
          nxt[r] = c1 < C ? di_ld_stream16(wr[r].q + c1 / 2) : make_uint4(0, 0, 0, 0);
          en[r] = c1 < C ? __ldg(wr[r].s + c1 / 32) : 127u;
        }
      }
      if (c < C) {
        const float *xl = xs + c0 + c0 / 8 + lane * 36;
#pragma unroll
        for (int r = 0; r < NR; r++) {
          float w[32];
          mx_decode32<true>(cur[r], w);
          const float sc = e8m0_scale(ec[r]);
          acc[r] += mx_part(w, xl) * sc;
        }
      }
#pragma unroll
      for (int r = 0; r < NR; r++) cur[r] = nxt[r], ec[r] = en[r];
    }
    if (UP) {
#pragma unroll
      for (int p = 0; p < NR / 2; p++) {
        const float gs = warp_sum_f(acc[2 * p]), u = warp_sum_f(acc[2 * p + 1]);
        const int i = o0 + p;
        if (lane == 0 && i < N) {
          const float gv = gs > lim ? lim : gs;
          const float uv = u > lim ? lim : u < -lim ? -lim : u;
          out[(size_t)ts[0] * I + i] = (float)(gv / (1.0 + exp(-(double)gv))) * uv;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const float v = warp_sum_f(acc[r]);
        if (lane == 0 && o0 + r < N) out[(size_t)ts[0] * D + o0 + r] = v;
      }
    }
  }
}

/* form 1: MXS_NR rows a warp; forms 2 and 3 trade rows a warp for CTAs an SM (2, at one token: the same rows,
 * registers capped for 2 CTAs; 3: 2 rows, at one token capped for 2 CTAs); forms 4 and 5 are 1 and 3 with the
 * byte-permute decode and (one token) the row staged whole: all the same bits (A/B: bench_cuda_v4) */
template <bool UP, int MINB, bool FAST>
static void mx_staged_go(int nr, dim3 grid, int tiled, cudaStream_t s, const float *x, const int32_t *ids, const int32_t *tiles,
                         int mt, int m, mx4mat a, mx4mat b, int ns, int D, int I, float lim, float *out) {
  if (tiled && nr == 2) mx_staged_k<LIN_TOK, UP, 2, 0, FAST><<<grid, MXS_WARPS * 32, 0, s>>>(x, ids, tiles, mt, m, a, b, ns, D, I, lim, out);
  else if (tiled) mx_staged_k<LIN_TOK, UP, MXS_NR, 0, FAST><<<grid, MXS_WARPS * 32, 0, s>>>(x, ids, tiles, mt, m, a, b, ns, D, I, lim, out);
  else if (nr == 2) mx_staged_k<1, UP, 2, 2, FAST><<<grid, MXS_WARPS * 32, 0, s>>>(x, ids, tiles, mt, m, a, b, ns, D, I, lim, out);
  else mx_staged_k<1, UP, MXS_NR, MINB, FAST><<<grid, MXS_WARPS * 32, 0, s>>>(x, ids, tiles, mt, m, a, b, ns, D, I, lim, out);
}
template <bool UP>
static void mx_staged_launch(int form, int T, int n_slots, int mt, const float *x, const int32_t *ids, const int32_t *tiles, int E1,
                             di_cuk_mxfp4w wa, di_cuk_mxfp4w wb, int D, int I, float lim, float *out, cudaStream_t s) {
  const int nr = form == 3 || form == 5 ? 2 : MXS_NR, per = MXS_WARPS * (UP ? nr / 2 : nr), N = UP ? I : D;
  const dim3 grid((N + per - 1) / per, tiles ? mt : T * n_slots);
  const mx4mat a{wa}, b{wb};
  const int m = E1 - 1, tiled = tiles != NULL;
  if ((form == 6 || form == 7) && !tiled && (UP ? D : I) <= MXS_WHOLE) { /* one token a CTA, RG row groups a warp */
    const int rg = form == 6 ? 2 : 4;
    const dim3 g2((N + per * rg - 1) / (per * rg), T * n_slots);
    if (rg == 2) mx_one_rg_k<UP, 2><<<g2, MXS_WARPS * 32, 0, s>>>(x, ids, tiles, mt, m, a, b, n_slots, D, I, lim, out);
    else mx_one_rg_k<UP, 4><<<g2, MXS_WARPS * 32, 0, s>>>(x, ids, tiles, mt, m, a, b, n_slots, D, I, lim, out);
  } else if (form >= 4) mx_staged_go<UP, 0, true>(nr, grid, tiled, s, x, ids, tiles, mt, m, a, b, n_slots, D, I, lim, out);
  else if (form == 2) mx_staged_go<UP, 2, false>(nr, grid, tiled, s, x, ids, tiles, mt, m, a, b, n_slots, D, I, lim, out);
  else mx_staged_go<UP, 0, false>(nr, grid, tiled, s, x, ids, tiles, mt, m, a, b, n_slots, D, I, lim, out);
}

/* The native experts: MXFP4 stacks [E][..] (ids E, the shared expert, skipped: moe() computes it from its FP8
 * weights), the same kernels and tiles as above. */
static int mx_vec_ok(const void *x, int ldx, di_cuk_mxfp4w w, int C) {
  return C % 32 == 0 && ldx % 4 == 0 && (uintptr_t)x % 16 == 0 && w.ldq % 16 == 0 && (uintptr_t)w.q % 16 == 0;
}
di_status di_v4k_expert_up_mx(const float *x, const int32_t *ids, const int32_t *tiles, int E1, di_cuk_mxfp4w w1,
                              di_cuk_mxfp4w w3, int T, int n_slots, int D, int I, float limit, float *act, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  const int mt = di_v4k_expert_max_tiles(T, n_slots, E1);
  dim3 grid((I + LIN_ROWS - 1) / LIN_ROWS, tiles ? mt : T * n_slots);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: %d tokens x %d expert slots at once", T, n_slots);
  if (g_mx_form >= 1 && mx_vec_ok(x, D, w1, D) && mx_vec_ok(x, D, w3, D))
    mx_staged_launch<true>(g_mx_form, T, n_slots, mt, x, ids, tiles, E1, w1, w3, D, I, limit, act, s);
  else if (mx_vec_ok(x, D, w1, D) && mx_vec_ok(x, D, w3, D))
    expert_up_k<mx4mat, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ids, tiles, mt, E1 - 1, mx4mat{w1}, mx4mat{w3}, n_slots, D, I, limit, act);
  else
    expert_up_k<mx4mat, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(x, ids, tiles, mt, E1 - 1, mx4mat{w1}, mx4mat{w3}, n_slots, D, I, limit, act);
  V4_LAUNCH("expert_up_mx");
  return DI_OK;
}
di_status di_v4k_expert_down_mx(const float *act, const int32_t *ids, const int32_t *tiles, int E1, di_cuk_mxfp4w w2, int T,
                                int n_slots, int D, int I, float *y, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  const int mt = di_v4k_expert_max_tiles(T, n_slots, E1);
  dim3 grid((D + LIN_ROWS - 1) / LIN_ROWS, tiles ? mt : T * n_slots);
  if (grid.y > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: %d tokens x %d expert slots at once", T, n_slots);
  if (g_mx_form >= 1 && mx_vec_ok(act, I, w2, I))
    mx_staged_launch<false>(g_mx_form, T, n_slots, mt, act, ids, tiles, E1, w2, w2, D, I, 0.0f, y, s);
  else if (mx_vec_ok(act, I, w2, I))
    expert_down_k<mx4mat, 8><<<grid, 32 * LIN_ROWS, 0, s>>>(act, ids, tiles, mt, E1 - 1, mx4mat{w2}, D, I, y);
  else
    expert_down_k<mx4mat, 1><<<grid, 32 * LIN_ROWS, 0, s>>>(act, ids, tiles, mt, E1 - 1, mx4mat{w2}, D, I, y);
  V4_LAUNCH("expert_down_mx");
  return DI_OK;
}

/* act[t][i] = silu(min(g, lim)) * clamp(u, lim) of the gate / up products g[t], u[t] (row strides ldg, ldo
 * for act): expert_up_k's epilogue for the shared expert's FP8 products. */
__global__ void swiglu_k(const float *g, const float *u, int ldg, int T, int I, float lim, float *act, int ldo) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * I) return;
  const int t = idx / I, i = idx % I;
  const float gr = g[(size_t)t * ldg + i], uv = u[(size_t)t * ldg + i];
  const float gv = gr > lim ? lim : gr;
  const float uc = uv > lim ? lim : uv < -lim ? -lim : uv;
  act[(size_t)t * ldo + i] = (float)(gv / (1.0 + exp(-(double)gv))) * uc;
}
di_status di_v4k_swiglu(const float *g, const float *u, int ldg, int T, int I, float limit, float *act, int ldo, di_cu_stream s) {
  if (T <= 0 || I <= 0) return DI_OK;
  swiglu_k<<<(T * I + 255) / 256, 256, 0, s>>>(g, u, ldg, T, I, limit, act, ldo);
  V4_LAUNCH("swiglu");
  return DI_OK;
}

/* tok[t] < 0 (a feedback placeholder -1 - j) becomes fb[j], the token sampled for row j of the step before. */
__global__ void resolve_tokens_k(int32_t *tok, int T, const int32_t *fb) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T && tok[t] < 0) tok[t] = fb[-1 - tok[t]];
}
di_status di_v4k_resolve_tokens(int32_t *tok, int T, const int32_t *fb, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  resolve_tokens_k<<<(T + 255) / 256, 256, 0, s>>>(tok, T, fb);
  V4_LAUNCH("resolve_tokens");
  return DI_OK;
}

__global__ void moe_combine_k(const float *y, const int32_t *ids, const float *wts, int T, int ns, int D, float *out) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * D) return;
  const int t = idx / D, d = idx % D;
  float o = y[(size_t)t * ns * D + d];
  for (int k = 1; k < ns; k++)
    if (ids[(size_t)t * ns + k] >= 0) o += wts[(size_t)t * ns + k] * y[((size_t)t * ns + k) * D + d];
  out[idx] = o;
}

di_status di_v4k_moe_combine(const float *y, const int32_t *ids, const float *wts, int T, int n_slots, int D, float *out,
                             di_cu_stream s) {
  if (T <= 0) return DI_OK;
  moe_combine_k<<<(T * D + 255) / 256, 256, 0, s>>>(y, ids, wts, T, n_slots, D, out);
  V4_LAUNCH("moe_combine");
  return DI_OK;
}
