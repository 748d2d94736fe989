/* Kernels of the DSpark block drafter on CUDA (cuda_dspark.cu composes them with the GEMMs) and the
 * target's feature capture (cuda_deepseek2.cu's forward): row copies into a strided feature buffer
 * (optionally RMS-normed: the last target layer's feature is after the final norm), f32 -> bf16,
 * Qwen3's per-head RMSNorm + half-split RoPE in place, the drafter's cache writes, and the block's
 * grouped-query attention over the cached context plus the block's own keys (not causal inside the
 * block, as the CPU's cpu_dspark.c). Float32 throughout; the softmax normaliser is a block sum. */
#include "cuda_common.cuh"
#include "k_dspark.h"
extern "C" {
#include "backend/backend.h" /* DI_DRAFTER_BLOCK_TOKENS: the drafter cache is paged by its own KV group */
}
#define DI_DRAFTER_BLOCK_CU DI_DRAFTER_BLOCK_TOKENS

/* dst row (*row0 + i) (row stride ld_dst; row0 NULL: 0) = h[rows[i]] over H columns, RMS-normed by w
 * when w != NULL. row0 is read on the device: a step's rows appended to a feature log at an offset
 * that changes from step to step while the CUDA graph that holds this kernel stays the same */
static __global__ void capture_rows_kernel(const float *h, int H, const int32_t *rows, const float *w, float eps,
                                           float *dst, int ld_dst, const int32_t *row0) {
  __shared__ float red[32];
  DI_PDL_ENTRY();
  const float *x = h + (int64_t)rows[blockIdx.x] * H;
  float *o = dst + ((int64_t)(row0 ? *row0 : 0) + blockIdx.x) * ld_dst;
  float inv = 1.f;
  if (w) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss += x[i] * x[i];
    ss = di_block_sum(ss, red);
    inv = rsqrtf(ss / H + eps);
  }
  for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = w ? x[i] * inv * w[i] : x[i];
}

extern "C" di_status di_cuk_capture_rows(const float *h, int H, const int32_t *rows, int n, const float *norm_w,
                                         float eps, float *dst, int ld_dst, const int32_t *row0, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  DI_CU(di_launch(capture_rows_kernel, n, 256, 0, s, h, H, rows, norm_w, eps, dst, ld_dst, row0));
  DI_CU_LAUNCH("capture_rows");
  return DI_OK;
}

static __global__ void to_bf16_kernel(const float *x, int64_t n, bf16 *out) {
  DI_PDL_ENTRY();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = di_fb(x[i]);
}

extern "C" di_status di_cuk_f32_to_bf16(const float *x, int64_t n, uint16_t *out, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  DI_CU(di_launch(to_bf16_kernel, (int)blocks, 256, 0, s, x, n, (bf16 *)out));
  DI_CU_LAUNCH("f32_to_bf16");
  return DI_OK;
}

/* one block per (row, head): RMSNorm over head_dim with w, then RoPE (pairs (i, i + hd/2)) at the row's
 * position; pos_of_row(r) = pos[r / rows_per_pos] + r % rows_per_pos (a proposal block: anchor + j) */
static __global__ void head_norm_rope_kernel(float *x, int ld, int hd, const float *w, float eps, const int32_t *pos,
                                             int rows_per_pos, const float *inv_freq) {
  __shared__ float red[32];
  DI_PDL_ENTRY();
  const int r = blockIdx.x, hh = blockIdx.y, half = hd / 2;
  float *v = x + (int64_t)r * ld + (int64_t)hh * hd;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += v[i] * v[i];
  ss = di_block_sum(ss, red);
  const float inv = rsqrtf(ss / hd + eps);
  const int p = pos[r / rows_per_pos] + r % rows_per_pos;
  __syncthreads();
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float a = v[i] * inv * w[i], b = v[i + half] * inv * w[i + half];
    float ang = (float)p * inv_freq[i], c = cosf(ang), sn = sinf(ang);
    v[i] = a * c - b * sn;
    v[i + half] = b * c + a * sn;
  }
}

extern "C" di_status di_cuk_head_norm_rope(float *x, int ld, int n_rows, int n_heads, int hd, const float *w, float eps,
                                           const int32_t *pos, int rows_per_pos, const float *inv_freq,
                                           di_cu_stream s) {
  if (n_rows <= 0) return DI_OK;
  if (hd % 2 || hd > 1024) return di_error_set(DI_ERR_UNSUPPORTED, "head_norm_rope: head_dim %d", hd);
  DI_CU(di_launch(head_norm_rope_kernel, dim3((unsigned)n_rows, (unsigned)n_heads), 64, 0, s, x, ld, hd, w, eps, pos,
                  rows_per_pos, inv_freq));
  DI_CU_LAUNCH("head_norm_rope");
  return DI_OK;
}

/* cache slot row gslot[t] of the layer: [K | V], kvd floats each; gslot[t] < 0: row t is not written
 * (a padding row of a logged step, or a row a later one of the same flush overwrites) */
static __global__ void cache_write_kernel(const float *k, const float *v, int kvd, const int32_t *gslot, float *cache) {
  DI_PDL_ENTRY();
  const int t = blockIdx.x;
  if (gslot[t] < 0) return;
  float *row = cache + (int64_t)gslot[t] * 2 * kvd;
  for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
    row[i] = k[(int64_t)t * kvd + i];
    row[kvd + i] = v[(int64_t)t * kvd + i];
  }
}

extern "C" di_status di_cuk_dspark_cache_write(const float *k, const float *v, int kvd, int n, const int32_t *gslot,
                                               float *cache_layer, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  DI_CU(di_launch(cache_write_kernel, n, 128, 0, s, k, v, kvd, gslot, cache_layer));
  DI_CU_LAUNCH("dspark_cache_write");
  return DI_OK;
}

/* one block (128 threads) per (block row, head): scores of the a cached keys (through the sequence's
 * block table) and the B block keys in shared memory (a warp a key, its lanes over the head dimension:
 * coalesced key reads), a max-shifted softmax, then out[d] summed over the keys in order by thread d.
 * Written in bf16 (the o_proj GEMM's operand). */
static __global__ void dspark_attend_kernel(const float *q, const float *kb, const float *vb, const float *cache,
                                            const int32_t *bt, int bt_stride, const int32_t *anchor, int B, int NH,
                                            int NKV, int hd, float scale, bf16 *out) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  DI_PDL_ENTRY();
  const int r = blockIdx.x, h = blockIdx.y, i = r / B, g = h / (NH / NKV), kvd = NKV * hd;
  const int a = anchor[i], nk = a + B;
  float *qs = sm, *sc = sm + hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[(int64_t)r * NH * hd + (int64_t)h * hd + d];
  __syncthreads();
  const int32_t *tab = bt + (int64_t)i * bt_stride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int j = warp; j < nk; j += n_warps) {
    const float *kr = j < a ? cache + ((int64_t)tab[j / DI_DRAFTER_BLOCK_CU] * DI_DRAFTER_BLOCK_CU + j % DI_DRAFTER_BLOCK_CU) * 2 * kvd
                            : kb + (int64_t)(i * B + j - a) * kvd;
    kr += (int64_t)g * hd;
    float acc = 0.f;
    for (int d = lane; d < hd; d += 32) acc += qs[d] * kr[d];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) sc[j] = acc * scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < nk; j += blockDim.x) mx = fmaxf(mx, sc[j]);
  /* block max through the sum helper's layout: negate-free max reduction */
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float z = 0.f;
  for (int j = threadIdx.x; j < nk; j += blockDim.x) {
    float e = __expf(sc[j] - mx);
    sc[j] = e;
    z += e;
  }
  z = di_block_sum(z, red);
  __syncthreads();
  const float inv = 1.f / z;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < nk; j++) {
      const float *vr = j < a ? cache + ((int64_t)tab[j / DI_DRAFTER_BLOCK_CU] * DI_DRAFTER_BLOCK_CU + j % DI_DRAFTER_BLOCK_CU) * 2 * kvd + kvd
                              : vb + (int64_t)(i * B + j - a) * kvd;
      acc += sc[j] * vr[(int64_t)g * hd + d];
    }
    out[(int64_t)r * NH * hd + (int64_t)h * hd + d] = di_fb(acc * inv);
  }
}

extern "C" size_t di_cuk_dspark_attend_smem(int hd, int max_keys) {
  return sizeof(float) * ((size_t)hd + (size_t)max_keys);
}

extern "C" di_status di_cuk_dspark_attend(const float *q, const float *kb, const float *vb, const float *cache_layer,
                                          const int32_t *bt, int bt_stride, const int32_t *anchor, int n, int B, int NH,
                                          int NKV, int hd, float scale, int max_keys, uint16_t *out, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  if (NKV <= 0 || NH % NKV) return di_error_set(DI_ERR_UNSUPPORTED, "dspark attention: %d heads over %d KV heads", NH, NKV);
  size_t smem = di_cuk_dspark_attend_smem(hd, max_keys);
  if (smem > 200 * 1024)
    return di_error_set(DI_ERR_UNSUPPORTED, "DSpark drafter on CUDA: a context of %d positions exceeds the attention kernel's "
                        "shared memory (at most ~%d)", max_keys, (int)(200 * 1024 / sizeof(float)) - hd);
  DI_CU(cudaFuncSetAttribute(dspark_attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  DI_CU(di_launch(dspark_attend_kernel, dim3((unsigned)(n * B), (unsigned)NH), 128, smem, s, q, kb, vb, cache_layer, bt,
                  bt_stride, anchor, B, NH, NKV, hd, scale, (bf16 *)out));
  DI_CU_LAUNCH("dspark_attend");
  return DI_OK;
}

/* One round j of greedy drafting for n proposal blocks, in two kernels. Part 1: grid (n, C chunks of the
 * vocabulary), a warp a vocabulary row (its lanes over the Markov rank: coalesced reads of markov_w2),
 * row j's base logit + markov_w2[v] . markov_w1[prev[i]] for v in the chunk, and the chunk's first
 * maximum over [0, limit) (NaN never chosen) into part[i][c]. Part 2: one CTA per block, the first
 * maximum over the chunks (ties: the lower index, so the whole is the first maximum of the row), the
 * confidence head's sigmoid on [h_j ; markov_w1[prev]], then prev[i] = the draft. Rounds past cap[i], or
 * after a block found no token, write -1. (One CTA a block scanning the vocabulary alone took ~0.15 ms a
 * round on the H200: the CTA's strided reads of markov_w2 were latency-bound.) */
#define DSPARK_GREEDY_CHUNKS 64
static __global__ void dspark_greedy_part_kernel(const float *logits, const int32_t *prev, const int32_t *cap, int j, int B,
                                                 int V, int limit, int rank, const float *w1, const float *w2, int chunk,
                                                 float *part_v, int32_t *part_i) {
  __shared__ float e[1024];
  __shared__ float wv[8];
  __shared__ int wi[8];
  DI_PDL_ENTRY();
  const int i = blockIdx.x, c = blockIdx.y, C = gridDim.y, p = prev[i];
  if (j >= cap[i] || p < 0) return;
  const int rk = rank > 0 && p < V ? rank : 0;
  for (int k = threadIdx.x; k < rk; k += blockDim.x) e[k] = w1[(int64_t)p * rank + k];
  __syncthreads();
  const float *row = logits + ((int64_t)i * B + j) * V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int v0 = c * chunk, v1 = v0 + chunk < V ? v0 + chunk : V;
  float bv = -INFINITY;
  int bi = -1;
  for (int v = v0 + warp; v < v1; v += n_warps) {
    float acc = 0.f;
    const float *w = w2 + (int64_t)v * rank;
    for (int k = lane; k < rk; k += 32) acc += w[k] * e[k];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    const float x = row[v] + acc;
    if (v < limit && x > bv) { bv = x; bi = v; } /* rows of a warp rise: the first maximum */
  }
  if (lane == 0) { wv[warp] = bv; wi[warp] = bi; }
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = -INFINITY;
    int t = -1;
    for (int w = 0; w < n_warps; w++)
      if (wi[w] >= 0 && (t < 0 || wv[w] > b || (wv[w] == b && wi[w] < t))) { b = wv[w]; t = wi[w]; }
    part_v[i * C + c] = b;
    part_i[i * C + c] = t;
  }
}

static __global__ void dspark_greedy_pick_kernel(const float *hid, int32_t *prev, const int32_t *cap, int j, int B, int V,
                                                 int C, int H, int rank, const float *w1, const float *conf_w, float conf_b,
                                                 int has_conf, int conf_markov, const float *part_v, const int32_t *part_i,
                                                 int32_t *out_tok, float *out_conf) {
  __shared__ float red[32];
  __shared__ int pick;
  DI_PDL_ENTRY();
  const int i = blockIdx.x, p = prev[i];
  if (j >= cap[i] || p < 0) {
    if (threadIdx.x == 0) {
      out_tok[i * B + j] = -1;
      out_conf[i * B + j] = 0.f;
      prev[i] = -1;
    }
    return;
  }
  if (threadIdx.x == 0) {
    float b = -INFINITY;
    int t = -1;
    for (int c = 0; c < C; c++) {
      const int ci = part_i[i * C + c];
      if (ci >= 0 && (t < 0 || part_v[i * C + c] > b || (part_v[i * C + c] == b && ci < t))) { b = part_v[i * C + c]; t = ci; }
    }
    pick = t;
  }
  const int rk = rank > 0 && p < V ? rank : 0;
  float z = 0.f;
  if (has_conf) {
    const float *h = hid + ((int64_t)i * B + j) * H;
    for (int k = threadIdx.x; k < H; k += blockDim.x) z += conf_w[k] * h[k];
    if (conf_markov)
      for (int k = threadIdx.x; k < rk; k += blockDim.x) z += conf_w[H + k] * w1[(int64_t)p * rank + k];
    z = di_block_sum(z, red);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int t = pick;
    out_tok[i * B + j] = t;
    out_conf[i * B + j] = t < 0 ? 0.f : has_conf ? 1.f / (1.f + expf(-(z + conf_b))) : 1.f;
    prev[i] = t;
  }
}

extern "C" size_t di_cuk_dspark_greedy_scratch(int n) { return (size_t)n * DSPARK_GREEDY_CHUNKS * (sizeof(float) + sizeof(int32_t)); }

extern "C" di_status di_cuk_dspark_greedy_round(float *logits, const float *hid, int32_t *prev, const int32_t *cap, int j,
                                                int n, int B, int V, int limit, int H, int rank, const float *w1,
                                                const float *w2, const float *conf_w, float conf_b, int has_conf,
                                                int conf_markov, int32_t *out_tok, float *out_conf, void *scratch,
                                                di_cu_stream s) {
  if (n <= 0) return DI_OK;
  if (rank > 1024) return di_error_set(DI_ERR_UNSUPPORTED, "DSpark drafter on CUDA: Markov rank %d > 1024", rank);
  int C = (V + 255) / 256;
  if (C > DSPARK_GREEDY_CHUNKS) C = DSPARK_GREEDY_CHUNKS;
  const int chunk = (V + C - 1) / C;
  float *part_v = (float *)scratch;
  int32_t *part_i = (int32_t *)(part_v + (size_t)n * DSPARK_GREEDY_CHUNKS);
  DI_CU(di_launch(dspark_greedy_part_kernel, dim3((unsigned)n, (unsigned)C), 256, 0, s, (const float *)logits, prev, cap, j, B, V,
                  limit, rank, w1, w2, chunk, part_v, part_i));
  DI_CU_LAUNCH("dspark_greedy_part");
  DI_CU(di_launch(dspark_greedy_pick_kernel, n, 256, 0, s, hid, prev, cap, j, B, V, C, H, rank, w1, conf_w, conf_b, has_conf,
                  conf_markov, (const float *)part_v, (const int32_t *)part_i, out_tok, out_conf));
  DI_CU_LAUNCH("dspark_greedy_pick");
  return DI_OK;
}

/* A proposal inside the step (cuda_dspark.cu's prop_forward): block i's anchor from the step's own
 * samples. Its rows first[i] .. last[i] were sampled (sampled[t], by row: every row is an output row);
 * rows after first[i] hold drafts (tokens[t]), accepted while each equals the sample of the row before
 * it, as the engine's exact-match verification accepts them. The anchor is the sample after the last
 * accepted draft, at the position after that row; block i's rows become [anchor, mask, ...], prev[i]
 * the anchor, cap_out[i] = cap[i]. first[i] < 0: a padding block (mask tokens at position 0, cap 0).
 * anchor_out[2 i], [2 i + 1]: the anchor token and position (-1 for padding), for the host to check. */
static __global__ void dspark_anchor_kernel(int n, const int32_t *first, const int32_t *last, const int32_t *cap,
                                            const int32_t *tokens, const int32_t *positions, const int32_t *sampled,
                                            int B, int mask, int32_t *block_tok, int32_t *anchor_pos, int32_t *prev,
                                            int32_t *cap_out, int32_t *anchor_out) {
  DI_PDL_ENTRY();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int f = first[i];
  int32_t tok = -1, pos = 0;
  if (f >= 0) {
    int a = 0;
    while (f + a < last[i] && sampled[f + a] == tokens[f + a + 1]) a++;
    tok = sampled[f + a];
    pos = positions[f + a] + 1;
  }
  for (int j = 0; j < B; j++) block_tok[i * B + j] = j == 0 && tok >= 0 ? tok : mask;
  anchor_pos[i] = pos;
  prev[i] = tok;
  cap_out[i] = tok >= 0 ? cap[i] : 0;
  anchor_out[2 * i] = tok;
  anchor_out[2 * i + 1] = tok >= 0 ? pos : -1;
}

extern "C" di_status di_cuk_dspark_anchor(int n, const int32_t *first, const int32_t *last, const int32_t *cap,
                                          const int32_t *tokens, const int32_t *positions, const int32_t *sampled, int B,
                                          int mask, int32_t *block_tok, int32_t *anchor_pos, int32_t *prev,
                                          int32_t *cap_out, int32_t *anchor_out, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  DI_CU(di_launch(dspark_anchor_kernel, (n + 127) / 128, 128, 0, s, n, first, last, cap, tokens, positions, sampled, B,
                  mask, block_tok, anchor_pos, prev, cap_out, anchor_out));
  DI_CU_LAUNCH("dspark_anchor");
  return DI_OK;
}
