/* MLA's value up-projection and output projection of a one-token decode step in one kernel:
 *   v_h = bf16(W_UV[h] . o_lat[h])          (dv values per head; W_UV[h]: dv x R rows of kv_b)
 *   h[n] += sum_h  W_o[n, h*dv .. +dv] . v_h  (the residual add)
 * The two skinny GEMMs it replaces are two dependent kernels of ~3-4 us each at batch 1; here the grid
 * is (heads, row tiles) in thread-block clusters of all the heads of one row tile. Before it waits for
 * the attention (weights only: the PDL rule) each CTA copies its W_o block (RT rows x dv) into shared
 * memory and its warps load W_UV[h] into registers; after the wait it computes v_h (one read of o_lat),
 * its partial rows W_o[tile, h] . v_h, and the cluster adds the heads' partials through distributed
 * shared memory, each CTA finishing RT / heads rows in head order (the same sum on every run).
 * FP8 form (di_cuk_mla_vo_fp8): W_o block-FP8 (the FP8 path's o_proj); the CTA's block goes to shared
 * memory as E4M3 bytes and a partial row is scale(row, head) * sum_k e4m3(w_k) v_k (a head's dv columns
 * inside one scale block). */
#include "k_fp8_common.cuh"
#include "cuda_kernels.h"
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define VO_THREADS 256
#define VO_RT_MAX 512 /* rows per tile (threads take rows r, r + 256 in the partial product) */
#define VO_DV_MAX 128
#define VO_ROWS_PER_WARP (VO_DV_MAX / (VO_THREADS / 32)) /* 16: a warp's W_UV rows, held in registers */

/* W_o block row stride in shared memory: dv + 8 elements keeps 16-byte rows aligned and spreads a
 * quarter-warp's rows over all 32 banks (row r starts at bank 4r mod 32 for dv = 128) */
static __host__ __device__ inline int vo_ld(int dv) { return dv + 8; }

/* bytes of a W_o block row in shared memory: bf16, or E4M3 (dv + 16: 16-byte rows, banks spread) */
static __host__ __device__ inline int vo_row_bytes(int dv, bool fp8) { return fp8 ? dv + 16 : vo_ld(dv) * 2; }

static size_t vo_smem(int rt, int dv, bool fp8 = false) {
  return (size_t)rt * vo_row_bytes(dv, fp8) + sizeof(float) * ((size_t)VO_DV_MAX + VO_RT_MAX);
}

template <bool FP8>
static __global__ void __launch_bounds__(VO_THREADS, 1)
mla_vo_kernel(const bf16 *olat, int ld_olat, const bf16 *wuv, int64_t wuv_stride, int R, int dv, const bf16 *wo,
              int ldo, int rt, float *h, di_cuk_fp8w wq) {
  extern __shared__ __align__(16) unsigned char vo_sm[];
  const int ldw = vo_ld(dv), rowb = vo_row_bytes(dv, FP8);
  bf16 *wsm = (bf16 *)vo_sm;                           /* [rt][ldw] this CTA's W_o block (FP8: [rt][rowb] bytes) */
  float *vsm = (float *)(vo_sm + (size_t)rt * rowb);   /* [dv] v_h (bf16-rounded values) */
  float *part = vsm + VO_DV_MAX;                       /* [rt] this head's partial rows */
  const int head = blockIdx.x, nh = gridDim.x, tile = blockIdx.y, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int row0 = tile * rt;
  const bf16 *wh = wuv + (int64_t)head * wuv_stride; /* W_UV[head]: dv rows of R */
  /* before the wait, weights only: the W_o block into shared memory, and this warp's 16 rows of
   * W_UV[head] into registers (16 B of each row per lane and 256-column step, R <= 512: two steps),
   * so that after the wait v_h costs one read of o_lat and the FMAs */
  if constexpr (FP8) {
    const int chunks = dv / 16; /* 16-byte chunks per W_o block row */
    for (int c = tid; c < rt * chunks; c += VO_THREADS) {
      const int r = c / chunks, k = (c % chunks) * 16;
      di_cp_async16(vo_sm + (size_t)r * rowb + k, wq.q + (int64_t)(row0 + r) * wq.ldq + (int64_t)head * dv + k, true);
    }
  } else {
    const int chunks = dv / 8; /* 16-byte chunks per W_o block row */
    for (int c = tid; c < rt * chunks; c += VO_THREADS) {
      const int r = c / chunks, k = (c % chunks) * 8;
      di_cp_async16(wsm + (size_t)r * ldw + k, wo + (int64_t)(row0 + r) * ldo + (int64_t)head * dv + k, true);
    }
  }
  di_cp_commit();
  uint4 wreg[VO_ROWS_PER_WARP][2];
#pragma unroll
  for (int r = 0; r < VO_ROWS_PER_WARP; r++) {
    const int i = warp * VO_ROWS_PER_WARP + r;
#pragma unroll
    for (int st = 0; st < 2; st++) {
      const int k = st * 256 + lane * 8;
      wreg[r][st] = i < dv && k < R ? di_ld_stream16(wh + (int64_t)i * R + k) : make_uint4(0, 0, 0, 0);
    }
  }
  DI_PDL_ENTRY();
  /* v_h: lane l ends with the sum of row l >> 1 of this warp's 16 */
  const bf16 *ol = olat + (int64_t)head * ld_olat;
  uint4 o4[2];
#pragma unroll
  for (int st = 0; st < 2; st++) {
    const int k = st * 256 + lane * 8;
    o4[st] = k < R ? *(const uint4 *)(ol + k) : make_uint4(0, 0, 0, 0);
  }
  float acc[VO_ROWS_PER_WARP];
#pragma unroll
  for (int r = 0; r < VO_ROWS_PER_WARP; r++) {
    float a = 0.f;
#pragma unroll
    for (int st = 0; st < 2; st++) {
      const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&wreg[r][st], *op = (const __nv_bfloat162 *)&o4[st];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float2 x = __bfloat1622float2(wp[j]), y = __bfloat1622float2(op[j]);
        a = fmaf(x.x, y.x, fmaf(x.y, y.y, a));
      }
    }
    acc[r] = a;
  }
  const float vsum = di_warp_sum16(acc, lane);
  const int vi = warp * VO_ROWS_PER_WARP + (lane >> 1);
  if ((lane & 1) == 0 && vi < dv) vsm[vi] = di_bf(di_fb(vsum)); /* a bf16 activation, as the unfused GEMM writes it */
  di_cp_wait<0>();
  __syncthreads(); /* v_h and the W_o block are in shared memory */
  /* partial rows: thread r takes row r of the block */
  for (int row = tid; row < rt && FP8; row += VO_THREADS) {
    const uint8_t *w = vo_sm + (size_t)row * rowb;
    float a = 0.f;
    for (int k = 0; k < dv; k += 16) {
      const uint4 w4 = *(const uint4 *)(w + k);
      float wf[16];
      fp8x4_to_f32(w4.x, wf); fp8x4_to_f32(w4.y, wf + 4); fp8x4_to_f32(w4.z, wf + 8); fp8x4_to_f32(w4.w, wf + 12);
#pragma unroll
      for (int j = 0; j < 16; j++) a = fmaf(wf[j], vsm[k + j], a);
    }
    part[row] = a * __ldg(wq.scale + (int64_t)((row0 + row) / wq.block_rows) * wq.scale_cols + head * dv / wq.block_cols);
  }
  for (int row = tid; row < rt && !FP8; row += VO_THREADS) {
    const bf16 *w = wsm + (size_t)row * ldw;
    float a = 0.f;
    for (int k = 0; k < dv; k += 8) {
      const uint4 w4 = *(const uint4 *)(w + k);
      const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&w4;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float2 x = __bfloat1622float2(wp[j]);
        a = fmaf(x.x, vsm[k + 2 * j], fmaf(x.y, vsm[k + 2 * j + 1], a));
      }
    }
    part[row] = a;
  }
  cg::cluster_group cl = cg::this_cluster();
  cl.sync(); /* every head's partials are written */
  /* this CTA finishes rows head * per .. +per of the tile: the heads' partials in head order */
  const int per = rt / nh;
  for (int q = tid; q < per; q += VO_THREADS) {
    const int r = head * per + q;
    float sum = 0.f;
    for (int g = 0; g < nh; g++) sum += cl.map_shared_rank(part, g)[r];
    h[row0 + r] += sum;
  }
  cl.sync(); /* no CTA leaves while another still reads its partials */
}

/* Rows per tile: 512 (V2-Lite: 4 clusters of 16 CTAs, one CTA per SM; the decode attention's cluster
 * holds one GPC while these wait, and 8 clusters of 256 rows would need 8 more: 256-row tiles measured
 * 391 vs 420 tok/s at batch 1), else 256, else the whole row when it is shorter. */
static int vo_rows_per_tile(int H) { return H % 512 == 0 ? 512 : H % 256 == 0 ? 256 : H; }

extern "C" int di_cuk_mla_vo_ok(int T, int NH, int H, int R, int dv) {
  const int rt = vo_rows_per_tile(H);
  if (!(T == 1 && NH >= 1 && NH <= 16 && (NH & (NH - 1)) == 0 && dv % 8 == 0 && dv <= VO_DV_MAX && R % 8 == 0 &&
        R <= 512 && rt <= VO_RT_MAX && rt % NH == 0 && H % rt == 0))
    return 0;
  /* a cluster of all the heads (16 is non-portable) with the W_o block in shared memory: asked once per
   * (heads, shared memory) pair; the tests run several shapes in one process */
  static struct { int nh; size_t smem; int fits; } seen[16];
  static int n_seen;
  const size_t smem = vo_smem(rt, dv);
  for (int i = 0; i < n_seen; i++)
    if (seen[i].nh == NH && seen[i].smem == smem) return seen[i].fits;
  const int fits = di_cu_cluster_fits((const void *)mla_vo_kernel<false>, NH, VO_THREADS, smem);
  if (n_seen < 16) seen[n_seen++] = {NH, smem, fits};
  return fits;
}

extern "C" di_status di_cuk_mla_vo(const uint16_t *olat, int ld_olat, const uint16_t *wuv, int64_t wuv_stride, int R,
                                   int dv, const uint16_t *wo, int ldo, int NH, int H, float *h, di_cu_stream s) {
  if (!di_cuk_mla_vo_ok(1, NH, H, R, dv) || ld_olat % 8 || wuv_stride % 8 || ldo % 8 || ((uintptr_t)olat & 15) ||
      ((uintptr_t)wuv & 15) || ((uintptr_t)wo & 15))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fused W_UV + o_proj with %d heads, hidden %d, rank %d, dv %d", NH, H,
                        R, dv);
  const int rt = vo_rows_per_tile(H);
  const size_t smem = vo_smem(rt, dv);
  static size_t smem_set; /* the limit this function set (di_cu_cluster_fits only ever raises it) */
  if (smem > smem_set) {
    DI_CU(cudaFuncSetAttribute(mla_vo_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    smem_set = smem;
  }
  const di_cuk_fp8w none = {NULL, NULL, 0, 1, 1, 1};
  DI_CU(di_launch_cluster(mla_vo_kernel<false>, dim3(NH, H / rt), VO_THREADS, smem, s, NH, (const bf16 *)olat, ld_olat,
                          (const bf16 *)wuv, wuv_stride, R, dv, (const bf16 *)wo, ldo, rt, h, none));
  return DI_OK;
}

/* The FP8 form's shape conditions on top of di_cuk_mla_vo_ok's (which sized the bf16 block, larger). */
extern "C" int di_cuk_mla_vo_fp8_ok(int T, int NH, int H, int R, int dv, const di_cuk_fp8w *wo) {
  if (!(di_cuk_mla_vo_ok(T, NH, H, R, dv) && wo && wo->q && dv % 16 == 0 && wo->ldq % 16 == 0 &&
        wo->block_rows > 0 && wo->block_cols > 0 && wo->block_cols % dv == 0 && ((uintptr_t)wo->q & 15) == 0))
    return 0;
  static struct { int nh; size_t smem; int fits; } seen[16]; /* as di_cuk_mla_vo_ok, for this kernel */
  static int n_seen;
  const size_t smem = vo_smem(vo_rows_per_tile(H), dv, true);
  for (int i = 0; i < n_seen; i++)
    if (seen[i].nh == NH && seen[i].smem == smem) return seen[i].fits;
  const int fits = di_cu_cluster_fits((const void *)mla_vo_kernel<true>, NH, VO_THREADS, smem);
  if (n_seen < 16) seen[n_seen++] = {NH, smem, fits};
  return fits;
}

extern "C" di_status di_cuk_mla_vo_fp8(const uint16_t *olat, int ld_olat, const uint16_t *wuv, int64_t wuv_stride,
                                       int R, int dv, const di_cuk_fp8w *wo, int NH, int H, float *h, di_cu_stream s) {
  if (!di_cuk_mla_vo_fp8_ok(1, NH, H, R, dv, wo) || ld_olat % 8 || wuv_stride % 8 || ((uintptr_t)olat & 15) ||
      ((uintptr_t)wuv & 15))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fused W_UV + FP8 o_proj with %d heads, hidden %d, rank %d, dv %d",
                        NH, H, R, dv);
  const int rt = vo_rows_per_tile(H);
  const size_t smem = vo_smem(rt, dv, true);
  static size_t smem_set;
  if (smem > smem_set) {
    DI_CU(cudaFuncSetAttribute(mla_vo_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    smem_set = smem;
  }
  DI_CU(di_launch_cluster(mla_vo_kernel<true>, dim3(NH, H / rt), VO_THREADS, smem, s, NH, (const bf16 *)olat, ld_olat,
                          (const bf16 *)wuv, wuv_stride, R, dv, (const bf16 *)NULL, 0, rt, h, *wo));
  return DI_OK;
}
