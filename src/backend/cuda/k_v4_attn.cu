/* DeepSeek-V4 attention-side kernels on CUDA over the engine's paged cache groups (cuda_v4_kernels.h;
 * layout of backend/cpu/cpu_deepseek_v4_pages.h, float32 like the CPU's): window rows in, the
 * compressors' pooling of closed windows into entries, their open windows (state / snapshots), the
 * lightning indexer with the fixed tie rule (radix select), and the sparse attention with sinks.
 *
 * The tricky part is the compressor's rows: a window closing in this step pools rows that come partly
 * from this step's projections and partly from before it. Rows before the step's first position pos0
 * are in the sequence's state (the snapshot layout: CSA [prev kv][prev gate][open kv][open gate], HCA
 * [open kv][open gate], rate x width each), which holds the open window at pos0 (window pos0 / rate) and,
 * for CSA, the one before it; every row a pooling or a new state needs is in one of those or in the
 * step (row_at). The state is only read during a step; the new one is written elsewhere (the backend
 * swaps them after the step), so the kernels of one step may run in any order over the sequences. */
#include "k_v4_common.cuh"
#include "cuda_v4_kernels.h"
#include <math.h>
#include <string.h>

#define BS V4K_BS

/* Entry e of compressor c in the blocks of table tab. */
static __device__ __forceinline__ float *entry_ptr(const di_v4k_comp &c, const int32_t *tab, int e) {
  const int64_t blk = ((int64_t)(e + 1) * c.rate - 1) / BS;
  const int slot = e - (int)(blk * BS / c.rate);
  return c.pool + (((size_t)tab[blk] * c.n_in + c.lidx) * c.slots + slot) * c.dim;
}


/* The kv (gate = 0) or gate (gate = 1) value of column col of the compressor row at position p of
 * sequence q (see the file comment). */
static __device__ __forceinline__ float row_at(const di_v4k_comp &c, const di_v4k_seq &q, int64_t p, int col, int gate) {
  if (p >= q.pos0) return (gate ? c.gate : c.kv)[(size_t)(q.t0 + p - q.pos0) * c.width + col];
  const size_t rows = (size_t)c.rate * c.width;
  const float *st = q.state + c.snap_off;
  const int64_t w = p / c.rate, wc = q.pos0 / c.rate;
  const int s = (int)(p % c.rate);
  const float *base = c.overlap ? (w == wc ? st + 2 * rows : st) : st;
  return base[(gate ? rows : 0) + (size_t)s * c.width + col];
}

__global__ void window_write_k(const float *kv, const int32_t *pos, const int32_t *seq_of, const di_v4k_seq *seqs,
                               float *pool, int nl, int l, int hd, int T, const int32_t *n_tok) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = n_tok ? *n_tok : T; /* graph steps: the padding rows after the step's own are not written */
  if (idx >= n * hd) return;
  const int t = idx / hd, e = idx % hd;
  const int64_t p = pos[t];
  float *dst = (float *)window_row(pool, seqs[seq_of[t]].tab[3], nl, l, hd, p);
  dst[e] = kv[idx];
}

di_status di_v4k_window_write(const float *kv, const int32_t *pos, const int32_t *seq_of, const di_v4k_seq *seqs,
                              float *pool, int n_layers, int l, int hd, int T, const int32_t *n_tok, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  window_write_k<<<(T * hd + 255) / 256, 256, 0, s>>>(kv, pos, seq_of, seqs, pool, n_layers, l, hd, T, n_tok);
  V4_LAUNCH("window_write");
  return DI_OK;
}

/* ---- compressor ---------------------------------------------------------------------------------- */

#define POOL_MAX_DIM 1024
__global__ void pool_k(di_v4k_comp c, const di_v4k_seq *seqs, const di_v4k_entry *ents, const int32_t *n_ents,
                       const float *inv_freq, int rd, float af, float eps) {
  if (n_ents && (int)blockIdx.x >= *n_ents) return; /* the grid is the bound, the list its own count */
  const di_v4k_entry en = ents[blockIdx.x];
  const di_v4k_seq q = seqs[en.seq];
  const int e = en.e, dim = c.dim, rate = c.rate;
  const int has_prev = c.overlap && e > 0;
  __shared__ float out[POOL_MAX_DIM];
  double ss = 0;
  for (int ch = threadIdx.x; ch < dim; ch += blockDim.x) {
    const int col = c.overlap ? dim + ch : ch;
    double mx = -INFINITY;
    if (has_prev)
      for (int s = 0; s < rate; s++) {
        const double g = row_at(c, q, (int64_t)(e - 1) * rate + s, ch, 1);
        mx = g > mx ? g : mx;
      }
    for (int s = 0; s < rate; s++) {
      const double g = row_at(c, q, (int64_t)e * rate + s, col, 1);
      mx = g > mx ? g : mx;
    }
    double sum = 0;
    if (has_prev)
      for (int s = 0; s < rate; s++) sum += exp((double)row_at(c, q, (int64_t)(e - 1) * rate + s, ch, 1) - mx);
    for (int s = 0; s < rate; s++) sum += exp((double)row_at(c, q, (int64_t)e * rate + s, col, 1) - mx);
    double acc = 0;
    if (has_prev)
      for (int s = 0; s < rate; s++) {
        const int64_t p = (int64_t)(e - 1) * rate + s;
        acc += exp((double)row_at(c, q, p, ch, 1) - mx) / sum * row_at(c, q, p, ch, 0);
      }
    for (int s = 0; s < rate; s++) {
      const int64_t p = (int64_t)e * rate + s;
      acc += exp((double)row_at(c, q, p, col, 1) - mx) / sum * row_at(c, q, p, col, 0);
    }
    out[ch] = (float)acc;
    ss += (double)out[ch] * out[ch];
  }
  ss = block_sum_d(ss);
  const float k = (float)(1.0 / sqrt(ss / dim + (double)eps));
  for (int ch = threadIdx.x; ch < dim; ch += blockDim.x) out[ch] = c.norm[ch] * (out[ch] * k);
  __syncthreads();
  for (int i = threadIdx.x; i < rd / 2; i += blockDim.x) rope_pair(out + (dim - rd), i, inv_freq[i], e * rate, af, 1);
  __syncthreads();
  float *dst = entry_ptr(c, q.tab[c.kind], e);
  for (int ch = threadIdx.x; ch < dim; ch += blockDim.x) dst[ch] = out[ch];
}

di_status di_v4k_pool(const di_v4k_comp *c, const di_v4k_seq *seqs, const di_v4k_entry *ents, int max_ents,
                      const int32_t *n_ents, const float *inv_freq, int rope_dim, float attn_factor, float eps,
                      di_cu_stream s) {
  if (c->dim > POOL_MAX_DIM) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: compressor dim %d > %d", c->dim, POOL_MAX_DIM);
  if (max_ents <= 0) return DI_OK;
  pool_k<<<max_ents, 256, 0, s>>>(*c, seqs, ents, n_ents, inv_freq, rope_dim, attn_factor, eps);
  V4_LAUNCH("pool");
  return DI_OK;
}

__global__ void state_write_k(di_v4k_comp c, const di_v4k_seq *seqs, const di_v4k_swrite *ws, const int32_t *n_w) {
  if (n_w && (int)blockIdx.x >= *n_w) return;
  const di_v4k_swrite w = ws[blockIdx.x];
  const di_v4k_seq q = seqs[w.seq];
  const int rate = c.rate, wd = c.width;
  const size_t rows = (size_t)rate * wd;
  float *dst = w.dst + c.snap_off;
  float *pend = c.overlap ? dst + 2 * rows : dst;
  const int64_t wp = w.P / rate;
  for (int s = blockIdx.y; s < rate; s += gridDim.y) { /* the window's rows s, s + gridDim.y, ... */
  const int64_t pp = wp * rate + s;
  const int pend_ok = pp < w.P, prev_ok = c.overlap && wp >= 1;
  for (int col = threadIdx.x; col < wd; col += blockDim.x) {
    if (pend_ok) {
      pend[(size_t)s * wd + col] = row_at(c, q, pp, col, 0);
      pend[rows + (size_t)s * wd + col] = row_at(c, q, pp, col, 1);
    }
    if (prev_ok) {
      const int64_t p = (wp - 1) * rate + s;
      dst[(size_t)s * wd + col] = row_at(c, q, p, col, 0);
      dst[rows + (size_t)s * wd + col] = row_at(c, q, p, col, 1);
    }
  }
  }
}

/* CTAs per write (rows strided over them): few, so that a graph's bound of writes past the count costs few idle CTAs;
 * at 4 an HCA write (128 rows x 512 x 2 floats) took ~13.5 us at one token (H200), so di_v4k_state_ctas(16) is
 * offered (the same copies; 4 the default until measured on the device). */
#define STATE_CTAS_DEFAULT 16
static int g_state_ctas = STATE_CTAS_DEFAULT;
extern "C" void di_v4k_state_ctas(int n) { g_state_ctas = n >= 1 && n <= 128 ? n : STATE_CTAS_DEFAULT; }

di_status di_v4k_state_write(const di_v4k_comp *c, const di_v4k_seq *seqs, const di_v4k_swrite *w, int max_w,
                             const int32_t *n_w, di_cu_stream s) {
  if (max_w <= 0) return DI_OK;
  state_write_k<<<dim3(max_w, c->rate < g_state_ctas ? c->rate : g_state_ctas), 128, 0, s>>>(*c, seqs, w, n_w);
  V4_LAUNCH("state_write");
  return DI_OK;
}

/* ---- indexer ------------------------------------------------------------------------------------- */

/* Query t's view of the indexer's entries: its sequence, the sequence's closed entries nc and those the query
 * may see, valid (the entries closed at or before its position). */
struct idx_query {
  di_v4k_seq sq;
  int nc, valid;
};
static __device__ __forceinline__ idx_query index_query(const int32_t *pos, const int32_t *seq_of, const di_v4k_seq *seqs,
                                                        int t, int rate) {
  idx_query r;
  r.sq = seqs[seq_of[t]];
  r.nc = (r.sq.pos0 + r.sq.n) / rate;
  const int v = (pos[t] + 1) / rate;
  r.valid = v < r.nc ? v : r.nc;
  return r;
}
/* Query t's nh x di floats into shared memory, rows padded by one float (lane h reads row h without bank
 * conflicts); every thread of the CTA, then a barrier. */
static __device__ void index_stage_query(float *qs, const float *q, int t, int nh, int di) {
  const float *qt = q + (size_t)t * nh * di;
  for (int i = threadIdx.x; i < nh * di; i += blockDim.x) qs[(i / di) * (di + 1) + i % di] = qt[i];
  __syncthreads();
}

/* Scores of IDX_ENTRIES entries per CTA, a warp per entry at a time: the query's heads in shared memory
 * (rows padded by one float: lane h reads row h without bank conflicts), lane j computes the dot products of
 * heads j, j + 32, ... in the CPU's order (double), relu, scale and head weight, then the warp sums its
 * heads. The entry's key is read by all lanes at once (a broadcast). */
#define IDX_WARPS 8
#define IDX_ENTRIES 16 /* entries per CTA (epc; two per warp): more CTAs at short contexts than 32 (32 CTAs at 4K), fewer stagings of the queries than 8 */
#define IDX_ENTRIES_SHORT 8 /* di_v4k_index_form 2: epc up to 4,096 entries (a CTA an SM at 4K: 64 CTAs of 16 used half the H200) */
__global__ void index_score_k(const float *q, const float *hw, const int32_t *pos, const int32_t *seq_of,
                              const di_v4k_seq *seqs, di_v4k_comp ic, int nh, int di, int max_n, float *score, int epc) {
  extern __shared__ float qs[]; /* [nh][di + 1] */
  const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx_query iq = index_query(pos, seq_of, seqs, t, ic.rate);
  const di_v4k_seq &sq = iq.sq;
  const int valid = iq.valid, s0 = blockIdx.x * epc;
  if (s0 >= valid) return;
  const float *ht = hw + (size_t)t * nh;
  index_stage_query(qs, q, t, nh, di);
  const double qk_scale = 1.0 / sqrt((double)di), w_scale = 1.0 / sqrt((double)nh);
  for (int sidx = s0 + warp; sidx < s0 + epc && sidx < valid; sidx += IDX_WARPS) {
    const float *K = entry_ptr(ic, sq.tab[1], sidx);
    double sc = 0;
    for (int h = lane; h < nh; h += 32) {
      const float *qh = qs + (size_t)h * (di + 1);
      double d = 0;
      for (int k = 0; k < di; k++) d += (double)qh[k] * K[k];
      sc += (d > 0 ? d * qk_scale : 0) * (ht[h] * w_scale);
    }
    sc = warp_sum_d(sc);
    if (lane == 0) score[(size_t)t * max_n + sidx] = (float)sc;
  }
}

/* The same scores (di_v4k_index_form 1, when nh == 64; not the default until run on the device) with the products register-tiled: a CTA of
 * IDX2_WARPS warps takes IDX2_ENTRIES entries, IDX2_E at a time per warp; the query stays float in shared
 * memory (rows padded by one), the warp's keys are widened to double once into shared memory, and lane
 * (hg, eg) = (lane % 16, lane / 16) accumulates heads 4 hg .. 4 hg + 3 against entries 4 eg .. 4 eg + 3: per
 * column k 4 query and 4 key reads for 16 products (index_score_k: one of each, and two widenings, per
 * product: the conversions' rate bound it, ~10 ms per CSA layer at batch 64, 128K). Each (entry, head) dot
 * product runs over k in order with the same operands; its relu and scale go to shared memory, and then lane l
 * adds heads l, l + 32 times their weights as index_score_k's lane did (the same expression, so the same fused
 * multiply-adds), followed by the same warp sum: the same bits as index_score_k. */
#define IDX2_WARPS 4
#define IDX2_E 8          /* entries per warp pass (2 groups of 4) */
#define IDX2_ENTRIES 64   /* entries per CTA (two passes per warp) */
#define IDX2_NH 64        /* the heads this form takes (16 lane groups of 4) */
static size_t idx2_smem(int nh, int di) {
  return sizeof(float) * (size_t)nh * (di + 1) + sizeof(double) * (size_t)IDX2_WARPS * IDX2_E * (di + nh);
}
__global__ void __launch_bounds__(IDX2_WARPS * 32) index_score2_k(const float *q, const float *hw, const int32_t *pos,
                                                                 const int32_t *seq_of, const di_v4k_seq *seqs, di_v4k_comp ic,
                                                                 int nh, int di, int max_n, float *score) {
  extern __shared__ double sm2[]; /* per warp [IDX2_E][di] keys, [IDX2_E][nh] terms; then the query [nh][di + 1] floats */
  const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx_query iq = index_query(pos, seq_of, seqs, t, ic.rate);
  const di_v4k_seq &sq = iq.sq;
  const int valid = iq.valid, s0 = blockIdx.x * IDX2_ENTRIES;
  if (s0 >= valid) return;
  double *kd = sm2 + (size_t)warp * IDX2_E * (di + nh), *term = kd + (size_t)IDX2_E * di;
  float *qs = (float *)(sm2 + (size_t)IDX2_WARPS * IDX2_E * (di + nh));
  const float *ht = hw + (size_t)t * nh;
  index_stage_query(qs, q, t, nh, di);
  const double qk_scale = 1.0 / sqrt((double)di), w_scale = 1.0 / sqrt((double)nh);
  const int hg = lane & 15, eg = lane >> 4;
  for (int b = s0 + warp * IDX2_E; b < s0 + IDX2_ENTRIES && b < valid; b += IDX2_WARPS * IDX2_E) {
    const int ne = valid - b < IDX2_E ? valid - b : IDX2_E;
    __syncwarp();
    for (int i = lane; i < IDX2_E * di; i += 32)
      kd[i] = i / di < ne ? (double)entry_ptr(ic, sq.tab[1], b + i / di)[i % di] : 0.0;
    __syncwarp();
    double d[4][4];
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
      for (int j = 0; j < 4; j++) d[e][j] = 0;
    const float *qh = qs + (size_t)(4 * hg) * (di + 1);
    const double *ke = kd + (size_t)(4 * eg) * di;
    for (int k = 0; k < di; k++) {
      double qv[4], kv[4];
#pragma unroll
      for (int j = 0; j < 4; j++) qv[j] = (double)qh[(size_t)j * (di + 1) + k];
#pragma unroll
      for (int e = 0; e < 4; e++) kv[e] = ke[(size_t)e * di + k];
#pragma unroll
      for (int e = 0; e < 4; e++)
#pragma unroll
        for (int j = 0; j < 4; j++) d[e][j] += qv[j] * kv[e];
    }
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        term[(4 * eg + e) * nh + 4 * hg + j] = d[e][j] > 0 ? d[e][j] * qk_scale : 0;
      }
    __syncwarp();
    for (int e = 0; e < ne; e++) { /* index_score_k's per-lane head order, then its warp sum */
      double sc = 0;
      for (int h = lane; h < nh; h += 32) sc += term[e * nh + h] * (ht[h] * w_scale);
      sc = warp_sum_d(sc);
      if (lane == 0) score[(size_t)t * max_n + b + e] = (float)sc;
    }
  }
}
/* The same scores (di_v4k_index_form 3, when nh == 64 and di % 4 == 0) with each float widened to double once
 * per CTA (query) or once per 16 products (key), no shared-memory traffic per product: index_score_k widens both
 * operands of every product (two float-to-double conversions per double FMA: the conversions' quarter rate bound
 * it, ~0.4 ms a CSA layer at 128K, batch 1). Here the CTA's query is widened once into shared memory (64 KB,
 * read as broadcasts: every lane of a warp reads the same head's double2), warp w takes heads 16 w .. 16 w + 15
 * of the CTA's 32 x EPL entries (lane l: entries s0 + l + 32 j), and a lane widens its entries' key floats once
 * for its 16 heads. Each (entry, head) dot product runs over k in order from 0 (products of two widened floats
 * are exact in double, so fma = the mul + add of index_score_k: the same d). The epilogue is index_score_k's
 * per-entry arithmetic written out (its PTX: lane L's sum is fma(X_L, Y_L, 0) then fma(X_{L+32}, Y_{L+32}, .),
 * X = d > 0 ? qk_scale d : 0, Y = w_scale (double)hw; then warp_sum_d's butterfly, which leaves at lane 0 the
 * tree s_i += s_{i+o} for o = 16, 8, 4, 2, 1; IEEE addition commutes): warps 2 / 3 pass X of heads 32..63
 * through shared memory (reusing the query's), warps 0 / 1 form lanes 0..15 / 16..31's sums, warp 1 passes its
 * sums, warp 0 runs the tree and stores. So the same bits as index_score_k for any EPL or grid. */
#define IDX3_NH 64      /* the heads this form takes: 4 warps x 16 */
#define IDX3_HW 16      /* heads per warp */
#define IDX3_WARPS 4
static size_t idx3_smem(int nh, int di) { return sizeof(double) * ((size_t)nh * di + nh); }
template <int EPL>
__global__ void __launch_bounds__(IDX3_WARPS * 32) index_score3_k(const float *q, const float *hw, const int32_t *pos,
                                                                 const int32_t *seq_of, const di_v4k_seq *seqs, di_v4k_comp ic,
                                                                 int nh, int di, int max_n, float *score) {
  extern __shared__ double sm3[]; /* [nh][di] widened query, then [nh] head weights Y; after the loop: X / sums */
  const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const idx_query iq = index_query(pos, seq_of, seqs, t, ic.rate);
  const int valid = iq.valid, s0 = blockIdx.x * (32 * EPL);
  if (s0 >= valid) return;
  const double qk_scale = 1.0 / sqrt((double)di), w_scale = 1.0 / sqrt((double)nh);
  double *qd = sm3, *yw = sm3 + (size_t)nh * di;
  {
    const float *qt = q + (size_t)t * nh * di;
    for (int i = threadIdx.x; i < nh * di; i += blockDim.x) qd[i] = (double)qt[i];
    const float *ht = hw + (size_t)t * nh;
    for (int h = threadIdx.x; h < nh; h += blockDim.x) yw[h] = (double)ht[h] * w_scale;
  }
  const float *kp[EPL];
  bool ok[EPL];
#pragma unroll
  for (int j = 0; j < EPL; j++) {
    const int s = s0 + lane + 32 * j;
    ok[j] = s < valid;
    kp[j] = ok[j] ? entry_ptr(ic, iq.sq.tab[1], s) : NULL;
  }
  __syncthreads();
  double acc[EPL][IDX3_HW];
#pragma unroll
  for (int j = 0; j < EPL; j++)
#pragma unroll
    for (int h = 0; h < IDX3_HW; h++) acc[j][h] = 0;
  const double *qw = qd + (size_t)(warp * IDX3_HW) * di;
  float4 nf[EPL];
#pragma unroll
  for (int j = 0; j < EPL; j++) nf[j] = ok[j] ? __ldg((const float4 *)kp[j]) : make_float4(0, 0, 0, 0);
  for (int k = 0; k < di; k += 4) {
    double kd[EPL][4];
#pragma unroll
    for (int j = 0; j < EPL; j++) {
      kd[j][0] = (double)nf[j].x;
      kd[j][1] = (double)nf[j].y;
      kd[j][2] = (double)nf[j].z;
      kd[j][3] = (double)nf[j].w;
    }
    if (k + 4 < di) { /* the next 4 columns' loads in flight during these 16 heads' products */
#pragma unroll
      for (int j = 0; j < EPL; j++) nf[j] = ok[j] ? __ldg((const float4 *)(kp[j] + k + 4)) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int h = 0; h < IDX3_HW; h++) {
      const double2 qa = *(const double2 *)(qw + (size_t)h * di + k), qb = *(const double2 *)(qw + (size_t)h * di + k + 2);
#pragma unroll
      for (int j = 0; j < EPL; j++) {
        acc[j][h] = __fma_rn(qa.x, kd[j][0], acc[j][h]);
        acc[j][h] = __fma_rn(qa.y, kd[j][1], acc[j][h]);
        acc[j][h] = __fma_rn(qb.x, kd[j][2], acc[j][h]);
        acc[j][h] = __fma_rn(qb.y, kd[j][3], acc[j][h]);
      }
    }
  }
  /* X = relu-scaled dot products; the epilogue of the file comment */
#pragma unroll
  for (int j = 0; j < EPL; j++)
#pragma unroll
    for (int h = 0; h < IDX3_HW; h++) acc[j][h] = acc[j][h] > 0 ? __dmul_rn(qk_scale, acc[j][h]) : 0.0;
  __syncthreads(); /* every warp is done with the query: its space takes X of heads 32..63 and warp 1's sums */
  const int ENT = 32 * EPL, XS = 33, PS = 17; /* row strides (doubles): lanes' rows in distinct bank pairs */
  double *xs = sm3, *ps = sm3 + (size_t)ENT * XS;
  if (warp >= 2) {
#pragma unroll
    for (int j = 0; j < EPL; j++)
#pragma unroll
      for (int h = 0; h < IDX3_HW; h++) xs[(size_t)(lane + 32 * j) * XS + (warp - 2) * IDX3_HW + h] = acc[j][h];
  }
  __syncthreads();
  if (warp < 2) {
#pragma unroll
    for (int j = 0; j < EPL; j++)
#pragma unroll
      for (int h = 0; h < IDX3_HW; h++) {
        const int L = warp * IDX3_HW + h; /* warp_sum_d's lane L: heads L and L + 32 */
        const double t0 = __fma_rn(acc[j][h], yw[L], 0.0);
        acc[j][h] = __fma_rn(xs[(size_t)(lane + 32 * j) * XS + L], yw[L + 32], t0);
      }
    if (warp == 1) {
#pragma unroll
      for (int j = 0; j < EPL; j++)
#pragma unroll
        for (int h = 0; h < IDX3_HW; h++) ps[(size_t)(lane + 32 * j) * PS + h] = acc[j][h];
    }
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int j = 0; j < EPL; j++) {
      double v[IDX3_HW];
#pragma unroll
      for (int i = 0; i < IDX3_HW; i++) v[i] = __dadd_rn(acc[j][i], ps[(size_t)(lane + 32 * j) * PS + i]); /* o = 16 */
#pragma unroll
      for (int i = 0; i < 8; i++) v[i] = __dadd_rn(v[i], v[i + 8]);
#pragma unroll
      for (int i = 0; i < 4; i++) v[i] = __dadd_rn(v[i], v[i + 4]);
      v[0] = __dadd_rn(v[0], v[2]);
      v[1] = __dadd_rn(v[1], v[3]);
      v[0] = __dadd_rn(v[0], v[1]);
      if (ok[j]) score[(size_t)t * max_n + s0 + lane + 32 * j] = (float)v[0];
    }
  }
}
#define INDEX_FORM_DEFAULT 4
static int g_index_form = INDEX_FORM_DEFAULT; /* 1 (index_score2_k: slower on the H200, session 14's request 6); 2 (index_score_k, 8 entries
                                 a CTA up to 4,096 entries) not yet run on the device; 3 (index_score3_k, each float widened once: the same hashes,
                                 session 15's request 1; 128K: the CSA indexer 382 -> 194 us a layer at batch 1, 9.6 -> 3.5 ms at
                                 64); 4 (the default): its 4 entries a lane past 8,192 entries (the same hashes, request 2:
                                 194 -> 168 us, 3.54 -> 3.14 ms) */
extern "C" void di_v4k_index_form(int form) { g_index_form = form < 0 ? INDEX_FORM_DEFAULT : form; }

/* Order-preserving key of a score: larger float, larger key; -0 as +0 (they are equal); NaN gets 0, the
 * lowest (di_v4_topk_earlier_first ranks NaN last). No real value maps to 0. */
static __device__ __forceinline__ uint32_t score_key(float v) {
  if (v != v) return 0;
  if (v == 0) v = 0.0f;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Top-k of one query's valid scores by an MSB-first radix select of the k-th largest key (4 passes of 8
 * bits over 256-bin histograms), then: keys above it are picked, and of the keys equal to it the earliest
 * entries (a block-wide scan in index order) until k are picked: di_v4_topk_earlier_first's result in
 * O(n) per query. */
#define TOPK_THREADS 256
#define TOPK_THREADS_LONG 1024 /* form 3, over 4,096 entries: a token's one CTA takes 4x the threads (the same picks: the
                                  counts are integers, the ties ranked by a scan in index order whatever the width) */
__global__ void __launch_bounds__(TOPK_THREADS_LONG) index_topk_k(const int32_t *pos, const int32_t *seq_of, const di_v4k_seq *seqs, int rate, int topk,
                             int max_n, const float *score, unsigned char *sel) {
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const idx_query iq = index_query(pos, seq_of, seqs, t, rate);
  const int nc = iq.nc, valid = iq.valid;
  const int k = topk < valid ? topk : valid;
  const float *sc = score + (size_t)t * max_n;
  unsigned char *out = sel + (size_t)t * max_n;
  /* sel is read up to the sequence's entry count nc (di_v4k_attend): the loops stop there, not at max_n (a
   * graph's bound for the whole step) */
  const int lim = nc < max_n ? nc : max_n;
  if (k >= valid) {
    for (int s = tid; s < lim; s += blockDim.x) out[s] = (unsigned char)(s < valid);
    return;
  }
  __shared__ unsigned hist[256];
  __shared__ uint32_t prefix, mask;
  __shared__ int remaining, base, tau_count;
  __shared__ int warp_tot[TOPK_THREADS_LONG / 32];
  if (tid == 0) {
    prefix = mask = 0;
    remaining = k;
    base = 0;
    tau_count = -1;
  }
  const unsigned full = 0xffffffffu;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const uint32_t pf = prefix, mk = mask;
    /* the counts, one atomic per distinct bin of a warp (the high bytes of similar scores share a few bins:
     * per-lane atomics on them serialise) */
    for (int s0 = 0; s0 < valid; s0 += blockDim.x) {
      const int s = s0 + tid;
      const uint32_t u = s < valid ? score_key(sc[s]) : 0;
      const int take = s < valid && (u & mk) == pf;
      const unsigned bin = take ? (u >> shift) & 255u : 256u;
      const unsigned peers = __match_any_sync(full, bin);
      if (take && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
    }
    __syncthreads();
    /* the first bin from the top whose count reaches the remaining rank (warp 0: 8 bins a lane, a scan over
     * the lanes; the sequential loop's bin and remainder) */
    if (warp == 0) {
      const int rem = remaining;
      int hv[8], ls = 0;
#pragma unroll
      for (int i = 0; i < 8; i++) ls += (hv[i] = (int)hist[255 - (lane * 8 + i)]);
      int incl = ls;
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(full, incl, o);
        if (lane >= o) incl += v;
      }
      const int total = __shfl_sync(full, incl, 31);
      const unsigned hit = __ballot_sync(full, incl >= rem);
      if (hit && lane == __ffs(hit) - 1) {
        int cum = incl - ls;
        for (int i = 0; i < 8; i++) {
          if (hv[i] >= rem - cum) {
            prefix |= (uint32_t)(255 - (lane * 8 + i)) << shift;
            mask |= 255u << shift;
            remaining = rem - cum;
            tau_count = hv[i];
            break;
          }
          cum += hv[i];
        }
      } else if (!hit && lane == 0)
        remaining = rem - total;
    }
    __syncthreads();
  }
  const uint32_t tau = prefix;
  const int ties = remaining; /* entries with key tau to take, earliest first */
  if (mask == full && tau_count == ties) { /* every entry with key tau is taken: no ranking of the ties */
    for (int s = tid; s < lim; s += blockDim.x) out[s] = (unsigned char)(s < valid && score_key(sc[s]) >= tau);
    return;
  }
  for (int c0 = 0; c0 < lim; c0 += blockDim.x) {
    const int s = c0 + tid;
    const uint32_t u = s < valid ? score_key(sc[s]) : 0;
    const int is_tie = s < valid && u == tau;
    const unsigned m = __ballot_sync(0xffffffffu, is_tie);
    if (lane == 0) warp_tot[warp] = __popc(m);
    __syncthreads();
    int before = base;
    for (int w2 = 0; w2 < warp; w2++) before += warp_tot[w2];
    const int rank = before + __popc(m & ((1u << lane) - 1u));
    if (s < lim) out[s] = (unsigned char)(s < valid && (u > tau || (is_tie && rank < ties)));
    __syncthreads();
    if (tid == 0) {
      int tot = 0;
      for (int w2 = 0; w2 < (int)(blockDim.x >> 5); w2++) tot += warp_tot[w2];
      base += tot;
    }
    __syncthreads();
  }
}

di_status di_v4k_indexer(const float *q, const float *hw, const int32_t *pos, const int32_t *seq_of,
                         const di_v4k_seq *seqs, const di_v4k_comp *ic, int T, int nh, int di, int topk, int max_n,
                         float *score, unsigned char *sel, di_cu_stream s) {
  if (T <= 0 || max_n <= 0) return DI_OK;
  const size_t smem = sizeof(float) * (size_t)nh * (di + 1);
  if (smem > 200 * 1024) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: indexer of %d x %d heads", nh, di);
  const size_t smem2 = idx2_smem(nh, di);
  const size_t smem3 = idx3_smem(nh, di);
  if ((g_index_form == 3 || g_index_form == 4) && nh == IDX3_NH && di % 4 == 0 && ic->dim % 4 == 0 && smem3 <= 200 * 1024 &&
      smem3 >= sizeof(double) * 128 * (33 + 17)) {
    static size_t smem3_set; /* the attribute once per size (not again while a graph is captured) */
    if (smem3 > 48 * 1024 && smem3 > smem3_set) {
      DI_CU(cudaFuncSetAttribute(index_score3_k<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem3));
      DI_CU(cudaFuncSetAttribute(index_score3_k<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem3));
      smem3_set = smem3;
    }
    /* 2 entries a lane from 8,192 entries (fewer query stagings; form 4: 4, half the query reads a product), 1 below
     * (more CTAs): the same bits either way */
    if (max_n > 8192 && g_index_form == 4) {
      static int set4;
      if (!set4) {
        DI_CU(cudaFuncSetAttribute(index_score3_k<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem3));
        set4 = 1;
      }
      index_score3_k<4><<<dim3((max_n + 127) / 128, T), 32 * IDX3_WARPS, smem3, s>>>(q, hw, pos, seq_of, seqs, *ic, nh, di,
                                                                                   max_n, score);
    } else if (max_n > 8192)
      index_score3_k<2><<<dim3((max_n + 63) / 64, T), 32 * IDX3_WARPS, smem3, s>>>(q, hw, pos, seq_of, seqs, *ic, nh, di,
                                                                                 max_n, score);
    else
      index_score3_k<1><<<dim3((max_n + 31) / 32, T), 32 * IDX3_WARPS, smem3, s>>>(q, hw, pos, seq_of, seqs, *ic, nh, di,
                                                                                 max_n, score);
  } else if (g_index_form == 1 && nh == IDX2_NH && smem2 <= 220 * 1024) {
    static size_t smem2_set; /* the attribute once per size (not again while a graph is captured) */
    if (smem2 > 48 * 1024 && smem2 > smem2_set) {
      DI_CU(cudaFuncSetAttribute(index_score2_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem2));
      smem2_set = smem2;
    }
    index_score2_k<<<dim3((max_n + IDX2_ENTRIES - 1) / IDX2_ENTRIES, T), 32 * IDX2_WARPS, smem2, s>>>(q, hw, pos, seq_of, seqs, *ic,
                                                                                                   nh, di, max_n, score);
  } else {
    static size_t smem_set; /* the attribute once per size (not again while a graph is captured) */
    if (smem > 48 * 1024 && smem > smem_set) {
      DI_CU(cudaFuncSetAttribute(index_score_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      smem_set = smem;
    }
    /* entries per CTA: every entry's score is one warp's whatever the grouping, so any epc gives the same bits */
    const int epc = g_index_form == 2 && max_n <= 4096 ? IDX_ENTRIES_SHORT : IDX_ENTRIES;
    index_score_k<<<dim3((max_n + epc - 1) / epc, T), 32 * IDX_WARPS, smem, s>>>(q, hw, pos, seq_of, seqs, *ic, nh, di, max_n,
                                                                               score, epc);
  }
  V4_LAUNCH("index_score");
  const int topk_threads = g_index_form >= 3 && max_n > 4096 ? TOPK_THREADS_LONG : TOPK_THREADS;
  index_topk_k<<<T, topk_threads, 0, s>>>(pos, seq_of, seqs, ic->rate, topk, max_n, score, sel);
  V4_LAUNCH("index_topk");
  return DI_OK;
}

/* ---- attention ----------------------------------------------------------------------------------- */

#define ATT_MAX_HD 1024
typedef struct att_args {
  const float *q;
  const int32_t *pos, *seq_of;
  const di_v4k_seq *seqs;
  const float *wpool;
  int nl, l, W, hca, max_n, H, hd, rd;
  const unsigned char *sel;
  const float *sink, *inv_freq;
  float af;
  float *p, *o;
  double *ex;
  int T; /* the step's tokens (the split form's slots in ex) */
} att_args;

/* One CTA of ATT_WARPS warps per (token, head). First the keys it attends to are listed, in order, as row
 * pointers (window rows, then the visible entries: for CSA the indexer's picks, compacted by a block scan
 * over sel), in the `ex` scratch; so the loops below run over W + top-k keys, not over every entry of
 * a long context. Scores: a warp per key, lane j summing channels j, j + 32, ... in double. Values: warp w
 * accumulates keys w, w + ATT_WARPS, ... over all channels (NJ per lane, registers), then the warps'
 * sums are added in warp order in shared memory. Every sum's order depends only on the token's own keys,
 * so results do not depend on the batch. */
#define ATT_WARPS 16
/* Token t's key list (every thread of the CTA calls it; blockDim.x <= 1024): the window rows, then the
 * visible entries (HCA: every complete one; CSA: those with sel, compacted in index order by a block scan), as
 * row pointers into kp; returns their count. */
static __device__ int att_key_list(const att_args &a, const di_v4k_comp &c, int has_comp, int t, const float **kp) {
  const di_v4k_seq sq = a.seqs[a.seq_of[t]];
  const int pos = a.pos[t], hd = a.hd;
  const int j0 = pos - a.W + 1 > 0 ? pos - a.W + 1 : 0, nw = pos - j0 + 1;
  int ncmp = 0;
  if (has_comp) {
    const int nc = (sq.pos0 + sq.n) / c.rate;
    if (a.hca) {
      const int v = (pos + 1) / c.rate;
      ncmp = v < nc ? v : nc;
    } else ncmp = nc;
  }
  const unsigned char *sel = a.sel && has_comp && !a.hca ? a.sel + (size_t)t * a.max_n : NULL;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nwarps = blockDim.x >> 5;
  __shared__ int wtot[32];
  for (int i = tid; i < nw; i += blockDim.x) kp[i] = window_row(a.wpool, sq.tab[3], a.nl, a.l, hd, j0 + i);
  int nk = nw;
  if (ncmp > 0 && !sel) {
    for (int e = tid; e < ncmp; e += blockDim.x) kp[nw + e] = entry_ptr(c, sq.tab[c.kind], e);
    nk += ncmp;
  } else if (ncmp > 0) {
    int base = 0;
    for (int c0 = 0; c0 < ncmp; c0 += blockDim.x) {
      const int e = c0 + tid, take = e < ncmp && sel[e];
      const unsigned m = __ballot_sync(0xffffffffu, take);
      if (lane == 0) wtot[warp] = __popc(m);
      __syncthreads();
      int before = base, tot = 0;
      for (int w2 = 0; w2 < nwarps; w2++) {
        before += w2 < warp ? wtot[w2] : 0;
        tot += wtot[w2];
      }
      if (take) kp[nw + before + __popc(m & ((1u << lane) - 1u))] = entry_ptr(c, sq.tab[c.kind], e);
      __syncthreads();
      base += tot;
    }
    nk += base;
  }
  return nk;
}

template <int NJ, int AU>
__global__ void __launch_bounds__(32 * ATT_WARPS) attend_k(att_args a, di_v4k_comp c, int has_comp) {
  const int t = blockIdx.x / a.H, h = blockIdx.x % a.H, hd = a.hd;
  const int pos = a.pos[t];
  const size_t stride = (size_t)a.W + a.max_n;
  float *p = a.p + (size_t)blockIdx.x * stride;
  const float **kp = (const float **)(a.ex + (size_t)blockIdx.x * stride);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  __shared__ double qs[ATT_MAX_HD]; /* the query widened once (not per key: the conversions bound the score loop) */
  const float *qh = a.q + ((size_t)t * a.H + h) * hd;
  for (int e = tid; e < hd; e += blockDim.x) qs[e] = (double)qh[e];
  const int nk = att_key_list(a, c, has_comp, t, kp);
  __syncthreads();
  const double scale = 1.0 / sqrt((double)hd);
  /* a warp's keys i = warp, warp + ATT_WARPS, ...: AU == 1 one after another (one key's memory latency after
   * another: the loop's bound at one token); else AU at a time with all their loads issued first, each key's sum
   * as in the one-key loop */
  if constexpr (AU == 1) {
    for (int i = warp; i < nk; i += ATT_WARPS) {
      const float *k = kp[i];
      double d = 0;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int e = lane + 32 * j;
        if (e < hd) d += qs[e] * k[e];
      }
      d = warp_sum_d(d);
      if (lane == 0) p[i] = (float)(d * scale);
    }
  } else
  for (int i0 = warp; i0 < nk; i0 += ATT_WARPS * AU) {
    float kv[AU][NJ];
#pragma unroll
    for (int u = 0; u < AU; u++) {
      const int i = i0 + u * ATT_WARPS;
      const float *k = i < nk ? kp[i] : NULL;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int e = lane + 32 * j;
        kv[u][j] = k && e < hd ? k[e] : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < AU; u++) {
      const int i = i0 + u * ATT_WARPS;
      if (i >= nk) break;
      double d = 0;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int e = lane + 32 * j;
        if (e < hd) d += qs[e] * kv[u][j];
      }
      d = warp_sum_d(d);
      if (lane == 0) p[i] = (float)(d * scale);
    }
  }
  __syncthreads();
  double mx = -INFINITY;
  for (int i = tid; i < nk; i += blockDim.x) mx = p[i] > mx ? p[i] : mx;
  mx = block_max_d(mx);
  const double sink = a.sink[h];
  mx = sink > mx ? sink : mx;
  double sum = 0;
  for (int i = tid; i < nk; i += blockDim.x) sum += exp((double)p[i] - mx);
  sum = block_sum_d(sum) + exp(sink - mx);
  double acc[NJ];
#pragma unroll
  for (int j = 0; j < NJ; j++) acc[j] = 0;
  if constexpr (AU == 1) {
    for (int i = warp; i < nk; i += ATT_WARPS) {
      const float *v = kp[i];
      const double w = exp((double)p[i] - mx);
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int e = lane + 32 * j;
        if (e < hd) acc[j] += w * v[e];
      }
    }
  } else
  for (int i0 = warp; i0 < nk; i0 += ATT_WARPS * AU) { /* the same keys, AU at a time, added in order */
    float vv[AU][NJ];
    double wv[AU];
#pragma unroll
    for (int u = 0; u < AU; u++) {
      const int i = i0 + u * ATT_WARPS;
      const float *v = i < nk ? kp[i] : NULL;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int e = lane + 32 * j;
        vv[u][j] = v && e < hd ? v[e] : 0.0f;
      }
      wv[u] = i < nk ? exp((double)p[i] - mx) : 0.0;
    }
#pragma unroll
    for (int u = 0; u < AU; u++) {
      if (i0 + u * ATT_WARPS >= nk) break;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int e = lane + 32 * j;
        if (e < hd) acc[j] += wv[u] * vv[u][j];
      }
    }
  }
  extern __shared__ double red[]; /* [ATT_WARPS][hd] */
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const int e = lane + 32 * j;
    if (e < hd) red[(size_t)warp * hd + e] = acc[j];
  }
  __syncthreads();
  __shared__ float os[ATT_MAX_HD];
  for (int e = tid; e < hd; e += blockDim.x) {
    double v = 0;
    for (int w2 = 0; w2 < ATT_WARPS; w2++) v += red[(size_t)w2 * hd + e];
    os[e] = (float)(v / sum);
  }
  __syncthreads();
  for (int i = tid; i < a.rd / 2; i += blockDim.x) rope_pair(os + (hd - a.rd), i, a.inv_freq[i], pos, a.af, -1);
  __syncthreads();
  float *oh = a.o + ((size_t)t * a.H + h) * hd;
  for (int e = tid; e < hd; e += blockDim.x) oh[e] = os[e];
}

/* ---- attention over many keys: attend_k's arithmetic in four kernels (di_v4k_attend_form 3) ----------------
 * attend_k's CTA per (token, head) reads and widens every key row twice (scores, values) for one head: at long
 * HCA contexts (1,152 keys at 128K) that is 64 x 2 reads of each 2 KB row a token, bound by the conversions and
 * L2 (3.5 ms a layer at batch 64). The one KV head is shared by all 64 heads, so here each row is read and widened
 * once per 8 heads (scores) or 4 heads (values), with every output the same expression in the same order as
 * attend_k's, so the same bits:
 *  1. att_keys_k: token t's key list (att_key_list, attend_k's) once, into ex's list slots, with its count;
 *  2. att_score_k: a warp takes 4 keys x 8 heads; lane l sums channels l + 32 j in j order (attend_k's lane
 *     partial; the product of two widened floats is exact, so fma = mul + add), then a transposed butterfly: at
 *     level o each lane keeps half its pairs and adds its partner's half, v_l + v_{l^o} per pair as warp_sum_d's
 *     (IEEE addition commutes), ending with pair l in lane l; p = (float)(d * scale);
 *  3. att_softmax_k: per (token, head) attend_k's max / sum code over the same 512 threads, storing each key's
 *     exp(p - mx) (attend_k recomputes the same expression in its value loop) and the sum;
 *  4. att_value_k: per (token, 4 heads, 128 channels) warp w adds keys w, w + 16, ... in order (attend_k's 16
 *     warps' accumulation streams, fma(w, v, acc)), the warps' sums in warp order, / sum, the rope's inverse on
 *     its pairs (never split by a 128-channel chunk: hd - rope_dim is even), the output.
 * ex holds (di_v4k_attend_ex): [T*H][W + max_n] weights, then per token the list and its count, then [T*H] sums. */
#define AS_KEYS 4   /* keys a warp (att_score_k) */
#define AS_HEADS 8  /* heads a CTA, every warp the same */
#define AS_WARPS 8  /* 32 keys a CTA */
#define AV_HEADS 4  /* heads a CTA (att_value_k) */
#define AV_CH 128   /* channels a CTA */
#define AV_U 4      /* keys a warp has in flight */
/* one step of the transposed butterfly: the lanes of each W-apart pair keep one half of v[0 .. 2W) and
 * add their partner's sum of the other half into v[0 .. W) */
template <int W>
static __device__ __forceinline__ void tbfly_step(double *v, int lane) {
  const bool up = lane & W;
#pragma unroll
  for (int m = 0; m < W; m++) {
    const double send = up ? v[m] : v[m + W], keep = up ? v[m + W] : v[m];
    v[m] = keep + __shfl_xor_sync(0xffffffffu, send, W);
  }
}

static __device__ __forceinline__ const float *const *att_list(const att_args &a, int t) {
  const size_t stride = (size_t)a.W + a.max_n;
  return (const float *const *)(a.ex + (size_t)a.T * a.H * stride + (size_t)t * (stride + 1));
}
#define AK_THREADS 1024 /* att_keys_k: a CSA token's scan of its sel row in 1,024-entry steps (32 steps at 128K) */
__global__ void __launch_bounds__(AK_THREADS) att_keys_k(att_args a, di_v4k_comp c, int has_comp) {
  const int t = blockIdx.x;
  const size_t stride = (size_t)a.W + a.max_n;
  const float **kp = (const float **)(a.ex + (size_t)a.T * a.H * stride + (size_t)t * (stride + 1));
  const int nk = att_key_list(a, c, has_comp, t, kp);
  if (threadIdx.x == 0) ((long long *)kp)[stride] = nk;
}
template <int NJ>
__global__ void __launch_bounds__(32 * AS_WARPS, 2) att_score_k(att_args a) {
  extern __shared__ double qd[]; /* [AS_HEADS][hd] the heads' queries widened */
  const int t = blockIdx.z, h0 = blockIdx.y * AS_HEADS, hd = NJ * 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float *const *kl = att_list(a, t);
  const size_t stride = (size_t)a.W + a.max_n;
  const int nk = (int)((const long long *)kl)[stride];
  if (blockIdx.x * (AS_KEYS * AS_WARPS) >= nk) return;
  const float *qt = a.q + ((size_t)t * a.H + h0) * hd;
  for (int i = threadIdx.x; i < AS_HEADS * hd; i += blockDim.x) qd[i] = (double)qt[i];
  __syncthreads();
  const double scale = 1.0 / sqrt((double)hd);
  /* the CTA's key blocks blockIdx.x, + gridDim.x, ... (the grid is capped: a CSA token has W + top-k keys, far fewer
   * than its bound W + max_n, and empty CTAs cost their launch) */
  for (int i0 = blockIdx.x * (AS_KEYS * AS_WARPS) + warp * AS_KEYS; i0 < nk; i0 += gridDim.x * (AS_KEYS * AS_WARPS)) {
  const float *kr[AS_KEYS];
#pragma unroll
  for (int u = 0; u < AS_KEYS; u++) kr[u] = kl[i0 + u < nk ? i0 + u : i0];
  double v[AS_KEYS * AS_HEADS];
#pragma unroll
  for (int i = 0; i < AS_KEYS * AS_HEADS; i++) v[i] = 0;
#pragma unroll 4
  for (int j = 0; j < NJ; j++) {
    const int e = lane + 32 * j;
    double kd[AS_KEYS];
#pragma unroll
    for (int u = 0; u < AS_KEYS; u++) kd[u] = (double)kr[u][e];
#pragma unroll
    for (int hh = 0; hh < AS_HEADS; hh++) {
      const double qv = qd[hh * hd + e];
#pragma unroll
      for (int u = 0; u < AS_KEYS; u++) v[u * AS_HEADS + hh] = __fma_rn(qv, kd[u], v[u * AS_HEADS + hh]);
    }
  }
  /* the transposed butterfly (file comment above): pair index u * 8 + hh ends in lane u * 8 + hh */
  tbfly_step<16>(v, lane);
  tbfly_step<8>(v, lane);
  tbfly_step<4>(v, lane);
  tbfly_step<2>(v, lane);
  tbfly_step<1>(v, lane);
  const int i = i0 + lane / AS_HEADS, h = h0 + lane % AS_HEADS;
  if (i < nk) a.p[((size_t)t * a.H + h) * stride + i] = (float)(v[0] * scale);
  }
}
__global__ void __launch_bounds__(32 * ATT_WARPS) att_softmax_k(att_args a) {
  const int t = blockIdx.x / a.H, h = blockIdx.x % a.H, tid = threadIdx.x;
  const size_t stride = (size_t)a.W + a.max_n;
  const int nk = (int)((const long long *)att_list(a, t))[stride];
  const float *p = a.p + (size_t)blockIdx.x * stride;
  double *ew = a.ex + (size_t)blockIdx.x * stride;
  double mx = -INFINITY;
  for (int i = tid; i < nk; i += blockDim.x) mx = p[i] > mx ? p[i] : mx;
  mx = block_max_d(mx);
  const double sink = a.sink[h];
  mx = sink > mx ? sink : mx;
  double sum = 0;
  for (int i = tid; i < nk; i += blockDim.x) {
    const double e = exp((double)p[i] - mx);
    sum += e;
    ew[i] = e;
  }
  sum = block_sum_d(sum) + exp(sink - mx);
  if (tid == 0) a.ex[(size_t)a.T * a.H * stride + (size_t)a.T * (stride + 1) + blockIdx.x] = sum;
}
__global__ void __launch_bounds__(32 * ATT_WARPS) att_value_k(att_args a) {
  extern __shared__ double red3[]; /* [AV_HEADS][ATT_WARPS][AV_CH] the warps' sums; then os */
  const int hg = a.H / AV_HEADS, t = blockIdx.x / hg, h0 = (blockIdx.x % hg) * AV_HEADS, c0 = blockIdx.y * AV_CH;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, hd = a.hd;
  const size_t stride = (size_t)a.W + a.max_n;
  const float *const *kl = att_list(a, t);
  const int nk = (int)((const long long *)kl)[stride];
  const double *ew = a.ex + ((size_t)t * a.H + h0) * stride;
  double acc[AV_HEADS][AV_CH / 32];
#pragma unroll
  for (int g = 0; g < AV_HEADS; g++)
#pragma unroll
    for (int j = 0; j < AV_CH / 32; j++) acc[g][j] = 0;
  /* keys i0, i0 + 16, ... AV_U at a time with all their loads issued first (one key at a time waits a memory latency
   * per key: the loop's bound), each added in order */
  for (int i0 = warp; i0 < nk; i0 += ATT_WARPS * AV_U) {
    float vf[AV_U][AV_CH / 32];
    double wv[AV_U][AV_HEADS];
#pragma unroll
    for (int u = 0; u < AV_U; u++) {
      const int i = i0 + u * ATT_WARPS;
      const float *vr = i < nk ? kl[i] + c0 + lane : NULL;
#pragma unroll
      for (int j = 0; j < AV_CH / 32; j++) vf[u][j] = vr ? vr[32 * j] : 0.0f;
#pragma unroll
      for (int g = 0; g < AV_HEADS; g++) wv[u][g] = i < nk ? ew[(size_t)g * stride + i] : 0.0;
    }
#pragma unroll
    for (int u = 0; u < AV_U; u++) {
      if (i0 + u * ATT_WARPS >= nk) break;
#pragma unroll
      for (int g = 0; g < AV_HEADS; g++)
#pragma unroll
        for (int j = 0; j < AV_CH / 32; j++) acc[g][j] = __fma_rn(wv[u][g], (double)vf[u][j], acc[g][j]);
    }
  }
#pragma unroll
  for (int g = 0; g < AV_HEADS; g++)
#pragma unroll
    for (int j = 0; j < AV_CH / 32; j++) red3[((size_t)g * ATT_WARPS + warp) * AV_CH + lane + 32 * j] = acc[g][j];
  __syncthreads();
  float *os = (float *)(red3 + (size_t)AV_HEADS * ATT_WARPS * AV_CH); /* [AV_HEADS][AV_CH] */
  const double *sums = a.ex + (size_t)a.T * a.H * stride + (size_t)a.T * (stride + 1) + (size_t)t * a.H + h0;
  for (int idx = tid; idx < AV_HEADS * AV_CH; idx += blockDim.x) {
    const int g = idx / AV_CH, el = idx % AV_CH;
    double v = 0;
    for (int w2 = 0; w2 < ATT_WARPS; w2++) v += red3[((size_t)g * ATT_WARPS + w2) * AV_CH + el];
    os[idx] = (float)(v / sums[g]);
  }
  __syncthreads();
  const int pos = a.pos[t], half = a.rd / 2;
  for (int idx = tid; idx < AV_HEADS * half; idx += blockDim.x) {
    const int g = idx / half, i = idx % half, ch = hd - a.rd + 2 * i;
    if (ch >= c0 && ch < c0 + AV_CH) rope_pair(os + (size_t)g * AV_CH + (ch - c0), 0, a.inv_freq[i], pos, a.af, -1);
  }
  __syncthreads();
  for (int idx = tid; idx < AV_HEADS * AV_CH; idx += blockDim.x) {
    const int g = idx / AV_CH, el = idx % AV_CH;
    a.o[((size_t)t * a.H + h0 + g) * hd + c0 + el] = os[idx];
  }
}
extern "C" size_t di_v4k_attend_ex(int T, int H, int W, int max_n) {
  const size_t stride = (size_t)W + max_n;
  return (size_t)T * H * stride + (size_t)T * (stride + 1) + (size_t)T * H;
}
/* Whether di_v4k_attend_form 3 takes this shape (else attend_k). */
static int att_split_ok(int H, int hd, int rd) {
  return hd % AV_CH == 0 && hd <= ATT_MAX_HD && H % AS_HEADS == 0 && H % AV_HEADS == 0 && rd % 2 == 0 && rd <= hd;
}
static di_status att_split(const att_args &a, const di_v4k_comp &cc, int has_comp, int T, int H, int hd, di_cu_stream s) {
  const size_t stride = (size_t)a.W + a.max_n;
  att_keys_k<<<T, AK_THREADS, 0, s>>>(a, cc, has_comp);
  V4_LAUNCH("att_keys");
  const size_t qsm = sizeof(double) * AS_HEADS * (size_t)hd;
  /* key blocks a token: its bound's, capped at 20 (640 keys: a CSA token's W + top-k in one pass; longer HCA rows
   * loop), so a CSA step does not launch the mostly empty blocks of its bound W + max_n */
  const size_t kb = (stride + AS_KEYS * AS_WARPS - 1) / (AS_KEYS * AS_WARPS);
  const dim3 sg((unsigned)(kb < 20 ? kb : 20), H / AS_HEADS, T);
  static size_t set_q[3]; /* each attribute once per size (not again while a graph is captured) */
  switch (hd / 128) {
#define AS_CASE(n, NJ)                                                                                    \
  case n:                                                                                                 \
    if (qsm > 48 * 1024 && qsm > set_q[n / 4]) {                                                           \
      DI_CU(cudaFuncSetAttribute(att_score_k<NJ>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)qsm)); \
      set_q[n / 4] = qsm;                                                                                  \
    }                                                                                                     \
    att_score_k<NJ><<<sg, 32 * AS_WARPS, qsm, s>>>(a);                                                    \
    break;
    AS_CASE(1, 4)
    AS_CASE(2, 8)
    AS_CASE(3, 12)
    AS_CASE(4, 16)
    AS_CASE(5, 20)
    AS_CASE(6, 24)
    AS_CASE(7, 28)
    AS_CASE(8, 32)
#undef AS_CASE
  default: return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: split attention of head_dim %d", hd);
  }
  V4_LAUNCH("att_score");
  att_softmax_k<<<T * H, 32 * ATT_WARPS, 0, s>>>(a);
  V4_LAUNCH("att_softmax");
  const size_t vsm = sizeof(double) * AV_HEADS * ATT_WARPS * AV_CH + sizeof(float) * AV_HEADS * AV_CH;
  static size_t set_v;
  if (vsm > 48 * 1024 && vsm > set_v) {
    DI_CU(cudaFuncSetAttribute(att_value_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)vsm));
    set_v = vsm;
  }
  att_value_k<<<dim3(T * (H / AV_HEADS), hd / AV_CH), 32 * ATT_WARPS, vsm, s>>>(a);
  V4_LAUNCH("att_value");
  return DI_OK;
}

#define ATT_FORM_DEFAULT 4
static int g_att_form = ATT_FORM_DEFAULT; /* 1: two keys a warp in flight at one token (129 <= head_dim <= 512); 2: at
                                           any T; 3: the split kernels (att_split); 4 (the default): 1 for one token over
                                           <= 256 keys, else 3 (session 15's request 1: split faster except there) */
extern "C" void di_v4k_attend_form(int form) { g_att_form = form < 0 ? ATT_FORM_DEFAULT : form; }

di_status di_v4k_attend(const float *q, const int32_t *pos, const int32_t *seq_of, const di_v4k_seq *seqs,
                        const float *window_pool, int n_layers, int l, int W, const di_v4k_comp *comp, int hca,
                        const unsigned char *sel, int max_n, const float *sink, int T, int H, int hd,
                        const float *inv_freq, int rope_dim, float attn_factor, float *p, double *ex, float *o,
                        di_cu_stream s) {
  if (hd > ATT_MAX_HD) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: head_dim %d > %d", hd, ATT_MAX_HD);
  if (T <= 0) return DI_OK;
  att_args a = {q, pos, seq_of, seqs, window_pool, n_layers, l, W, hca, max_n, H, hd, rope_dim, sel, sink, inv_freq,
                attn_factor, p, o, ex, T};
  di_v4k_comp none;
  memset(&none, 0, sizeof none);
  const size_t smem = sizeof(double) * ATT_WARPS * (size_t)hd;
  const di_v4k_comp cc = comp ? *comp : none;
  /* form 4 (the default): one token over at most 256 keys (sliding, short HCA) on attend_k's two-key loops, else split */
  const int split = g_att_form == 3 || (g_att_form == 4 && (T > 1 || (size_t)W + (comp ? max_n : 0) > 256));
  if (split && att_split_ok(H, hd, rope_dim)) return att_split(a, cc, comp != NULL, T, H, hd, s);
  if (hd <= 128) {
    attend_k<4, 1><<<T * H, 32 * ATT_WARPS, smem, s>>>(a, cc, comp != NULL);
  } else if (hd <= 512) {
    static size_t set16[2]; /* each attribute once per size (not again while a graph is captured) */
    /* form 1: at one token only (at batch 64 the two-key kernel was slower: 128 registers, 1 CTA an SM); 2: always */
    const int f = ((g_att_form == 1 || g_att_form == 4) && T == 1) || g_att_form == 2;
    if (smem > 48 * 1024 && smem > set16[f]) {
      DI_CU(cudaFuncSetAttribute(f ? attend_k<16, 2> : attend_k<16, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      set16[f] = smem;
    }
    if (f) attend_k<16, 2><<<T * H, 32 * ATT_WARPS, smem, s>>>(a, cc, comp != NULL);
    else attend_k<16, 1><<<T * H, 32 * ATT_WARPS, smem, s>>>(a, cc, comp != NULL);
  } else {
    static size_t set32;
    if (smem > set32) DI_CU(cudaFuncSetAttribute(attend_k<32, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    set32 = smem > set32 ? smem : set32;
    attend_k<32, 1><<<T * H, 32 * ATT_WARPS, smem, s>>>(a, cc, comp != NULL);
  }
  V4_LAUNCH("attend");
  return DI_OK;
}
