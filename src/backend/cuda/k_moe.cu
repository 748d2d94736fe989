/* MoE routing on the GPU: router scores (softmax or sigmoid over the router logits), expert choice
 * by every DeepSeek variant (greedy, group-limited greedy, noaux_tc with the score-correction bias),
 * the k weights (renormalized, scaled); then the permutation of the T*k (token, expert) assignments
 * into expert-contiguous order with the tile list the grouped GEMM walks; and the weighted combine
 * of the expert outputs back into the residual stream. Everything stays on the device so a decode
 * step can be captured in a CUDA graph (no host round trip for the expert counts). */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include <cooperative_groups.h>
#include <string.h>

namespace cg = cooperative_groups;

#define MAXE 1024

/* The routing's outputs for token t, by one thread: the k chosen experts with their weights
 * (renormalized and/or scaled as the router says), then the shared experts with weight 1. */
static __device__ void route_write(const di_cuk_router &r, int t, const int *myid, const float *myw, float wsum,
                                   int32_t *ids, float *wout) {
  const int kt = r.k + r.n_shared, normalized = r.norm_topk && r.k > 1;
  for (int j = 0; j < r.k && j < 8; j++) {
    float w = myw[j];
    if (normalized) w /= (wsum + 1e-20f);
    if (!normalized || r.scale_after_norm) w *= r.routed_scale;
    ids[(int64_t)t * kt + j] = myid[j];
    wout[(int64_t)t * kt + j] = w;
  }
  for (int j = 0; j < r.n_shared; j++) {
    ids[(int64_t)t * kt + r.k + j] = r.E + j;
    wout[(int64_t)t * kt + r.k + j] = 1.f;
  }
}

/* The permutation of a one-token step, by threads tid, tid + nth, ...: its kt experts sid[] are
 * distinct, so each is a one-row segment and an assignment's rank is its sorted position. */
static __device__ void route_perm(const int *sid, int kt, int Et, const di_cuk_perm &pm, int tid, int nth) {
  for (int x = tid; x <= Et; x += nth) {
    int c = 0;
    for (int j = 0; j < kt; j++) c += sid[j] < x;
    pm.expert_off[x] = c;
  }
  for (int j = tid; j < kt; j += nth) {
    int rank = 0;
    for (int q = 0; q < kt; q++) rank += sid[q] < sid[j];
    pm.inv[j] = rank;
    pm.perm_tok[rank] = 0;
    pm.tiles[rank] = sid[j] << 16;
  }
  if (tid == 0) *pm.n_tiles = kt;
}

/* Routes token t: the whole block, one thread per expert (blockDim >= E, a multiple of 32). Top-k by
 * k rounds of a block-wide argmax; ties go to the lower expert id. The logits are read through L2
 * (__ldcg): in the fused gate kernel other CTAs wrote them during this kernel. */
static __device__ void route_token(const float *logits, const float *bias, const di_cuk_router &r, int t,
                                   int32_t *ids, float *wout, const di_cuk_perm &pm, int do_perm,
                                   const float *lg_local = NULL) {
  __shared__ int sid[16];
  __shared__ float sc[MAXE], ch[MAXE];  /* score, choice value */
  __shared__ float gsc[MAXE];
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ float red[32];
  const int e = threadIdx.x, E = r.E;
  float x = e < E ? (lg_local ? lg_local[e] : __ldcg(logits + (int64_t)t * E + e)) : -INFINITY;
  float s;
  if (r.sigmoid) {
    s = e < E ? 1.f / (1.f + expf(-x)) : 0.f;
  } else {
    float mx = di_block_max(x, red);
    float ex = e < E ? expf(x - mx) : 0.f;
    float sum = di_block_sum(ex, red);
    s = ex / sum;
  }
  if (e < E) {
    sc[e] = s;
    ch[e] = (r.method == 2 && bias) ? s + bias[e] : s;
  }
  __syncthreads();
  if (r.method != 0 && r.n_group > 1) {
    /* group score: max (group_limited_greedy) or sum of the top two (noaux_tc) */
    int gs = E / r.n_group;
    if (e < r.n_group) {
      float a = -INFINITY, b = -INFINITY;
      for (int i = e * gs; i < (e + 1) * gs; i++) {
        float v = ch[i];
        if (v > a) { b = a; a = v; } else if (v > b) b = v;
      }
      gsc[e] = r.method == 2 ? a + (gs > 1 ? b : 0.f) : a;
    }
    __syncthreads();
    /* rank of my group among groups (ties to the lower id): kept when rank < topk_group */
    if (e < E) {
      int grp = e / gs, rank = 0;
      float my = gsc[grp];
      for (int q = 0; q < r.n_group; q++)
        rank += (gsc[q] > my) || (gsc[q] == my && q < grp);
      if (rank >= r.topk_group) ch[e] = -INFINITY;
    }
    __syncthreads();
  }
  float v = e < E ? ch[e] : -INFINITY;
  float wsum = 0.f;
  float myw[8];
  int myid[8];
  for (int j = 0; j < r.k; j++) {
    /* block argmax of v */
    float bv = v;
    int bi = e < E ? e : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) { red_v[w] = bv; red_i[w] = bi; }
    __syncthreads();
    if (w == 0) {
      bv = l < nw ? red_v[l] : -INFINITY;
      bi = l < nw ? red_i[l] : 0x7fffffff;
      for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
      }
      if (l == 0) red_i[0] = bi;
    }
    __syncthreads();
    int win = red_i[0];
    if (win < 0 || win >= E) win = 0; /* all -inf / NaN: any valid id keeps the permutation in bounds */
    __syncthreads();
    if (e == win) v = -INFINITY;
    if (j < 8) { myid[j] = win; myw[j] = sc[win]; }
    wsum += sc[win];
  }
  const int kt = r.k + r.n_shared;
  if (threadIdx.x == 0) {
    route_write(r, t, myid, myw, wsum, ids, wout);
    for (int j = 0; j < kt; j++) sid[j] = j < r.k ? myid[j] : E + (j - r.k);
  }
  if (!do_perm) return; /* uniform: the whole block returns or none */
  __syncthreads();
  route_perm(sid, kt, E + r.n_shared, pm, threadIdx.x, blockDim.x);
}

/* The common routers (no expert groups, E <= 256: V2-Lite, Moonlight) by one warp, each lane holding
 * experts lane, lane+32, ...: the same choices, ties to the lower id, as route_token, with no block
 * barriers (the k rounds of a block argmax cost ~20 of them). Both the fused gate and route_kernel use
 * it where it applies, so their results stay equal. */
#define RW_PER_LANE 8
static __device__ __forceinline__ bool route_warp_ok(const di_cuk_router &r) {
  return !r.block_route && r.E <= 32 * RW_PER_LANE && !(r.method != 0 && r.n_group > 1);
}

static __device__ void route_warp(const float *logits, const float *bias, const di_cuk_router &r, int t,
                                  int32_t *ids, float *wout, const di_cuk_perm &pm, int do_perm,
                                  const float *lg_local = NULL) {
  const int lane = threadIdx.x & 31, E = r.E;
  float sc[RW_PER_LANE], ch[RW_PER_LANE];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < RW_PER_LANE; j++) {
    const int e = lane + 32 * j;
    sc[j] = e < E ? (lg_local ? lg_local[e] : __ldcg(logits + (int64_t)t * E + e)) : -INFINITY;
    mx = fmaxf(mx, sc[j]);
  }
  if (r.sigmoid) {
#pragma unroll
    for (int j = 0; j < RW_PER_LANE; j++) sc[j] = lane + 32 * j < E ? 1.f / (1.f + expf(-sc[j])) : 0.f;
  } else {
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < RW_PER_LANE; j++) {
      sc[j] = lane + 32 * j < E ? expf(sc[j] - mx) : 0.f;
      sum += sc[j];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
    for (int j = 0; j < RW_PER_LANE; j++) sc[j] = sc[j] / sum;
  }
#pragma unroll
  for (int j = 0; j < RW_PER_LANE; j++) {
    const int e = lane + 32 * j;
    ch[j] = e < E ? ((r.method == 2 && bias) ? sc[j] + bias[e] : sc[j]) : -INFINITY;
  }
  int myid[8];
  float myw[8], wsum = 0.f;
  for (int q = 0; q < r.k; q++) {
    float bv = -INFINITY, bs = 0.f;
    int bi = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < RW_PER_LANE; j++) /* increasing ids: strict > keeps the lowest on ties */
      if (ch[j] > bv) { bv = ch[j]; bi = lane + 32 * j; bs = sc[j]; }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o), os = __shfl_xor_sync(0xffffffffu, bs, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; bs = os; }
    }
    int win = bi;
    if (win < 0 || win >= E) { win = 0; bs = __shfl_sync(0xffffffffu, sc[0], 0); } /* all -inf / NaN */
#pragma unroll
    for (int j = 0; j < RW_PER_LANE; j++)
      if (lane + 32 * j == win) ch[j] = -INFINITY;
    myid[q] = win;
    myw[q] = bs;
    wsum += bs;
  }
  const int kt = r.k + r.n_shared;
  if (lane == 0) route_write(r, t, myid, myw, wsum, ids, wout);
  if (!do_perm) return;
  int sid[16];
  for (int j = 0; j < kt; j++) sid[j] = j < r.k ? myid[j] : E + (j - r.k);
  route_perm(sid, kt, E + r.n_shared, pm, lane, 32);
}

static __global__ void route_kernel(const float *logits, const float *bias, di_cuk_router r,
                                    int32_t *ids, float *wout, di_cuk_perm pm, int do_perm) {
  DI_PDL_ENTRY();
  if (route_warp_ok(r)) {
    if (threadIdx.x < 32) route_warp(logits, bias, r, blockIdx.x, ids, wout, pm, do_perm);
    return;
  }
  route_token(logits, bias, r, blockIdx.x, ids, wout, pm, do_perm);
}

extern "C" di_status di_cuk_moe_route(const float *logits, const float *bias, int T, di_cuk_router r,
                                      int32_t *ids, float *w, const di_cuk_perm *perm, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  if (r.E + r.n_shared > MAXE || r.k > 8 || r.k < 1 || r.k > r.E || r.n_shared < 0)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: router with %d experts, top-%d unsupported", r.E, r.k);
  if (r.n_group > 1 && (r.E % r.n_group || r.n_group > MAXE))
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: %d experts not divisible into %d groups", r.E, r.n_group);
  int threads = (r.E + 31) / 32 * 32;
  if (threads < 32) threads = 32;
  if (r.k + r.n_shared > 16) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: %d experts per token (<= 16)", r.k + r.n_shared);
  di_cuk_perm pm;
  memset(&pm, 0, sizeof pm);
  const int do_perm = perm != NULL && T == 1;
  if (do_perm) pm = *perm;
  DI_CU(di_launch(route_kernel, T, threads, 0, s, logits, bias, r, ids, w, pm, do_perm));
  DI_CU_LAUNCH("moe_route");
  return DI_OK;
}

/* One router logit by one warp: x (f32, H) . w (bf16 row), 16-byte weight loads (a 2-byte-per-lane
 * loop was a chain of dependent round trips), reduced across the warp; every lane gets the sum. The
 * fused gate and router_kernel share it, so their logits are equal. */
static __device__ __forceinline__ float router_dot(const float *x, const bf16 *w, int H, int lane) {
  float acc = 0.f;
  if ((H & 7) == 0 && ((uintptr_t)w & 15) == 0) {
#pragma unroll 8
    for (int i = lane * 8; i < H; i += 256) {
      uint4 wv = *(const uint4 *)(w + i);
      const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&wv;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float2 c = __bfloat1622float2(wp[j]);
        acc = fmaf(x[i + 2 * j], c.x, acc);
        acc = fmaf(x[i + 2 * j + 1], c.y, acc);
      }
    }
  } else {
    for (int i = lane; i < H; i += 32) acc += x[i] * di_bf(w[i]);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

/* Router logits of larger steps: one warp per (token, expert); W (E x n bf16) stays in L2. */
static __global__ void router_kernel(const float *x, const bf16 *W, int T, int E, int n, float *out) {
  DI_PDL_ENTRY();
  int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (gw >= T * E) return;
  int t = gw / E, e = gw % E;
  const float acc = router_dot(x + (int64_t)t * n, W + (int64_t)e * n, n, lane);
  if (lane == 0) out[(int64_t)t * E + e] = acc;
}

extern "C" di_status di_cuk_router_logits(const float *x, const uint16_t *W, int T, int E, int n, float *out,
                                          di_cu_stream s) {
  if (T <= 0) return DI_OK;
  int warps = T * E;
  DI_CU(di_launch(router_kernel, (warps + 7) / 8, 256, 0, s, x, (const bf16 *)W, T, E, n, out));
  return DI_OK;
}

/* The MoE gate of a small step in one kernel: RMSNorm of the residual row (the expert GEMMs' bf16
 * input, written by CTA 0 of the token), router logits (a cluster of GATE_CLUSTER CTAs per token, each
 * taking a slice of the experts, one warp per expert; the same arithmetic as rmsnorm_kernel +
 * router_kernel), and the routing of the token by CTA 0 after a cluster barrier; the CTAs write their
 * logits into CTA 0's shared memory (distributed shared memory), so the routing reads them without an
 * L2 round trip (an atomic last-CTA hand-off here cost a fence and an L2 round trip more). At decode this replaces three launches per layer; the router weights are prefetched into L2
 * before the kernel waits for its predecessor. blockDim is 256 (>= E: route_token's thread per expert). */
#define GATE_CLUSTER 8
#define GATE_THREADS 256
#define GATE_STAGE_MAX (96 * 1024)

static __global__ void __launch_bounds__(GATE_THREADS)
moe_gate_kernel(const float *h, const float *norm_w, float eps, int H, const bf16 *W, const float *bias,
                di_cuk_router r, bf16 *xn, int ldxn, float *logits, int32_t *ids, float *wout, di_cuk_perm pm,
                int do_perm, int stage) {
  extern __shared__ __align__(16) float xs[]; /* the normed row, fp32 [H]; staged: norm weights [H], router rows */
  __shared__ float red[32];
  __shared__ float lg[GATE_THREADS]; /* CTA 0's: every CTA's logits, through distributed shared memory */
  const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = GATE_THREADS / 32;
  const int per = (r.E + GATE_CLUSTER - 1) / GATE_CLUSTER;
  const int e0 = blockIdx.x * per, e1 = min(r.E, e0 + per);
  float *nws = xs + H;
  bf16 *wsl = (bf16 *)(nws + H);
  if (stage) { /* norm weights and this CTA's router rows into shared memory while the predecessor runs */
    for (int c = threadIdx.x; c < H / 4; c += blockDim.x) di_cp_async16(nws + 4 * c, norm_w + 4 * c, true);
    for (int c = threadIdx.x; c < (e1 - e0) * H / 8; c += blockDim.x)
      di_cp_async16(wsl + 8 * c, W + (int64_t)e0 * H + 8 * c, true);
    di_cp_commit();
  } else {
    for (int e = e0 + warp; e < e1; e += nw)
      for (int i = lane * 64; i < H; i += 32 * 64) di_prefetch_l2(W + (int64_t)e * H + i); /* 128-byte lines */
  }
  DI_PDL_ENTRY();
  const float *xr = h + (int64_t)t * H;
  /* the sum of squares in rmsnorm_kernel's order (thread i: elements i, i + 256, ...), so that the fused
   * and the unfused gate give bit-equal norms and routings (a prefill and a decode of the same token) */
  float ss = 0.f;
#pragma unroll 4
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = xr[i];
    ss += v * v;
  }
  if (stage) di_cp_wait<0>(); /* the block sum's barrier publishes every thread's copies */
  ss = di_block_sum(ss, red);
  const float inv = rsqrtf(ss / H + eps);
  const float *nwp = stage ? nws : norm_w;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = xr[i] * inv * nwp[i];
    xs[i] = v;
    if (blockIdx.x == 0) xn[(int64_t)t * ldxn + i] = di_fb(v);
  }
  __syncthreads();
  cg::cluster_group cl = cg::this_cluster();
  float *lg0 = cl.map_shared_rank(lg, 0);
  for (int e = e0 + warp; e < e1; e += nw) {
    const float acc = router_dot(xs, stage ? wsl + (int64_t)(e - e0) * H : W + (int64_t)e * H, H, lane);
    if (lane == 0) {
      logits[(int64_t)t * r.E + e] = acc;
      lg0[e] = acc;
    }
  }
  cl.sync(); /* release / acquire at cluster scope: every slice's logits are in CTA 0's lg */
  if (blockIdx.x != 0) return;
  if (route_warp_ok(r)) {
    if (threadIdx.x < 32) route_warp(logits, bias, r, t, ids, wout, pm, do_perm, lg);
    return;
  }
  route_token(logits, bias, r, t, ids, wout, pm, do_perm, lg);
}

extern "C" di_status di_cuk_moe_gate(const float *h, const float *norm_w, float eps, int T, int H,
                                     const uint16_t *W, const float *bias, di_cuk_router r, uint16_t *xn,
                                     int ldxn, float *logits, int32_t *ids, float *w, const di_cuk_perm *perm,
                                     di_cu_stream s) {
  if (T <= 0) return DI_OK;
  if (!di_cuk_moe_gate_supported(r.E, H) || r.k > 8 || r.k < 1 || r.k > r.E || r.n_shared < 0 ||
      r.k + r.n_shared > 16)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: fused MoE gate with %d experts, top-%d, hidden %d", r.E, r.k, H);
  if (r.n_group > 1 && r.E % r.n_group)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: %d experts not divisible into %d groups", r.E, r.n_group);
  if (T > 65535) return di_error_set(DI_ERR_INVALID_ARG, "cuda: fused MoE gate of %d tokens", T);
  di_cuk_perm pm;
  memset(&pm, 0, sizeof pm);
  const int do_perm = perm != NULL && T == 1;
  if (do_perm) pm = *perm;
  /* staged: the norm weights and each CTA's slice of router rows copied into shared memory before the
   * wait, so the routing's critical path has no weight read from L2 (when they fit: V2-Lite's 8 x 2048
   * rows are 32 KB per CTA, V3's 32 x 7168 would not) */
  const int per = (r.E + GATE_CLUSTER - 1) / GATE_CLUSTER;
  const size_t staged = sizeof(float) * 2 * (size_t)H + (size_t)per * H * 2;
  const int stage = H % 8 == 0 && ((uintptr_t)W & 15) == 0 && ((uintptr_t)norm_w & 15) == 0 && ((uintptr_t)h & 15) == 0 &&
                    staged <= GATE_STAGE_MAX;
  const size_t smem = stage ? staged : sizeof(float) * (size_t)H;
  static size_t smem_set; /* the opt-in covers static + dynamic shared memory above 48 KB */
  if (smem > smem_set) {
    DI_CU(cudaFuncSetAttribute(moe_gate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    smem_set = smem;
  }
  DI_CU(di_launch_cluster(moe_gate_kernel, dim3(GATE_CLUSTER, T), GATE_THREADS, smem, s, GATE_CLUSTER, h, norm_w, eps,
                          H, (const bf16 *)W, bias, r, (bf16 *)xn, ldxn, logits, ids, w, pm, do_perm, stage));
  return DI_OK;
}

extern "C" int di_cuk_moe_gate_supported(int E, int H) {
  return E >= 1 && E <= GATE_THREADS && H >= 1 && H <= 8192; /* 32 KB of row + 12.5 KB of routing smem */
}

/* One block does the whole permutation: counts per expert, offsets, tile list, scatter. The order
 * inside an expert's segment follows the atomics and may vary run to run; every row of the grouped
 * GEMM is computed independently, so the results do not. */
static __global__ void permute_kernel(const int32_t *ids, int n, int k, int E, int bm,
                                      int32_t *perm_tok, int32_t *inv, int32_t *off, int32_t *tiles,
                                      int32_t *n_tiles) {
  __shared__ int cnt[MAXE], fill[MAXE], soff[MAXE + 1];
  DI_PDL_ENTRY();
  for (int e = threadIdx.x; e < E; e += blockDim.x) { cnt[e] = 0; fill[e] = 0; }
  __syncthreads();
  for (int a = threadIdx.x; a < n; a += blockDim.x) atomicAdd(&cnt[ids[a]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0, nt = 0;
    for (int e = 0; e < E; e++) {
      soff[e] = acc;
      off[e] = acc;
      for (int i = 0; i * bm < cnt[e]; i++) tiles[nt++] = (e << 16) | i;
      acc += cnt[e];
    }
    soff[E] = acc;
    off[E] = acc;
    *n_tiles = nt;
  }
  __syncthreads();
  for (int a = threadIdx.x; a < n; a += blockDim.x) {
    int e = ids[a];
    int p = soff[e] + atomicAdd(&fill[e], 1);
    perm_tok[p] = a / k;
    inv[a] = p;
  }
}

extern "C" di_status di_cuk_moe_permute(const int32_t *ids, int n_assign, int k, int E, int bm,
                                        int32_t *perm_tok, int32_t *inv, int32_t *expert_off,
                                        int32_t *tiles, int32_t *n_tiles, di_cu_stream s) {
  if (E > MAXE || E >= 32768)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: %d experts unsupported", E);
  DI_CU(di_launch(permute_kernel, 1, 1024, 0, s, ids, n_assign, k, E, bm, perm_tok, inv, expert_off, tiles, n_tiles));
  DI_CU_LAUNCH("moe_permute");
  return DI_OK;
}

/* h[t] += sum_j w_j y[row_j]. Without a norm to fuse, CTAs of CMB_COLS columns. With the next
 * layer's norm fused in, a cluster of CMB_CLUSTER CTAs per token, each taking an eighth of the columns:
 * each leaves the sum of squares of its columns in shared memory, and after a cluster barrier every
 * CTA adds the eight partial sums (distributed shared memory, in rank order, so all agree bit for bit)
 * and writes its own columns of the normed row. One kernel, no atomics, no serial tail: one CTA per
 * token took 9 us per layer at decode, a last-CTA hand-off ~6. */
#define CMB_COLS 256
#define CMB_CLUSTER 8
#define CMB_MAX_PER_THREAD 4 /* columns per thread in the cluster form: n <= 8 * 256 * 4 */

static __global__ void __launch_bounds__(CMB_COLS)
combine_kernel(const float *y, int ldy, const int32_t *inv, const float *w, int k, int n, float *h) {
  DI_PDL_ENTRY();
  const int t = blockIdx.y, c = blockIdx.x * CMB_COLS + threadIdx.x;
  if (c >= n) return;
  float acc = 0.f;
  for (int j = 0; j < k; j++) acc += w[t * k + j] * y[(int64_t)inv[t * k + j] * ldy + c];
  h[(int64_t)t * n + c] += acc;
}

static __global__ void __launch_bounds__(CMB_COLS)
combine_norm_kernel(const float *y, int ldy, const int32_t *inv, const float *w, int k, int n, float *h,
                    const float *norm_w, float eps, bf16 *xn, int ldo) {
  __shared__ float red[32];
  __shared__ float s_ss;
  DI_PDL_ENTRY();
  cg::cluster_group cl = cg::this_cluster();
  const int t = blockIdx.y, per = ((n + CMB_CLUSTER - 1) / CMB_CLUSTER + 7) & ~7;
  const int c0 = blockIdx.x * per, c1 = min(n, c0 + per);
  float v[CMB_MAX_PER_THREAD], ss = 0.f;
#pragma unroll
  for (int q = 0; q < CMB_MAX_PER_THREAD; q++) {
    const int c = c0 + threadIdx.x + q * CMB_COLS;
    v[q] = 0.f;
    if (c < c1) {
      float acc = 0.f;
      for (int j = 0; j < k; j++) acc += w[t * k + j] * y[(int64_t)inv[t * k + j] * ldy + c];
      v[q] = h[(int64_t)t * n + c] + acc;
      h[(int64_t)t * n + c] = v[q];
      ss += v[q] * v[q];
    }
  }
  ss = di_block_sum(ss, red);
  if (threadIdx.x == 0) s_ss = ss;
  cl.sync();
  float tot = 0.f;
  for (int p = 0; p < CMB_CLUSTER; p++) tot += *cl.map_shared_rank(&s_ss, p);
  const float inv_rms = rsqrtf(tot / n + eps);
#pragma unroll
  for (int q = 0; q < CMB_MAX_PER_THREAD; q++) {
    const int c = c0 + threadIdx.x + q * CMB_COLS;
    if (c < c1) xn[(int64_t)t * ldo + c] = di_fb(v[q] * inv_rms * norm_w[c]);
  }
  cl.sync(); /* no CTA leaves while another may still read its s_ss */
}

extern "C" di_status di_cuk_moe_combine(const float *y, int ldy, const int32_t *inv, const float *w, int T,
                                        int k, int n, float *h, const float *norm_w, float eps, uint16_t *xn,
                                        int ldo, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  if (k > 16) return di_error_set(DI_ERR_UNSUPPORTED, "cuda: %d experts per token unsupported (<= 16)", k);
  if (T > 65535 || n > CMB_CLUSTER * CMB_COLS * CMB_MAX_PER_THREAD - 8 * CMB_CLUSTER)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda: moe_combine of %d x %d", T, n);
  if (!norm_w) {
    DI_CU(di_launch(combine_kernel, dim3((n + CMB_COLS - 1) / CMB_COLS, T), CMB_COLS, 0, s, y, ldy, inv, w, k, n, h));
    return DI_OK;
  }
  DI_CU(di_launch_cluster(combine_norm_kernel, dim3(CMB_CLUSTER, T), CMB_COLS, 0, s, CMB_CLUSTER, y, ldy, inv, w, k, n,
                          h, norm_w, eps, (bf16 *)xn, ldo));
  return DI_OK;
}

