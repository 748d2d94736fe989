/* The DeepSeek-V2/V3 forward pass on the CPU backend: MLA attention over the paged latent cache in
 * the absorbed form, DeepSeekMoE with shared experts, float32 activations, weights read as stored.
 *
 * Per layer, for the T tokens of a step (x: [T][hidden] residual stream):
 *   h = RMSNorm(x)
 *   q = q_b(RMSNorm(q_a(h)))  (or q_proj(h))            -> per head [q_nope | q_pe]
 *   [c_kv | k_pe] = kv_a(h);  c_kv = RMSNorm(c_kv);  k_pe, q_pe = RoPE(pos)
 *   cache[layer][pos] = [c_kv | k_pe]                     (written before any token reads)
 *   q_lat = W_UK^T q_nope;  s_j = (q_lat . c_kv_j + q_pe . k_pe_j) * scale, j <= pos
 *   o_lat = sum_j softmax(s)_j c_kv_j;  out_h = W_UV o_lat;  x += o_proj(out)
 *   x += FFN(RMSNorm(x))        (dense SiLU-gated MLP, or routed top-k experts + shared experts)
 * Every per-token quantity is computed with a reduction order that does not depend on the other
 * tokens of the step (see cpu_gemm.h), which makes the backend batch-invariant. */
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "dist/dist.h"
#include "util/numeric.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- small row ops ------------------------------------------------------------------------------ */

/* (the row ops rmsnorm and silu * up: cpu_ops.c, where the op test table runs them) */

/* cos/sin of every rotary pair for each token of the step, computed once per step (not per layer
 * and head): rope[t] = di_cpu_rope_cos_sin of positions[t]. */
static void rope_table(di_cpu_backend *b, const di_batch *batch) {
  const int half = b->cfg->qk_rope_head_dim / 2;
  for (int t = 0; t < batch->n_tokens; t++)
    di_cpu_rope_cos_sin(batch->positions[t], b->inv_freq, half, b->cfg->rope_attention_factor,
                        b->s_rope + (size_t)t * 2 * half);
}

/* Rotates `x` (rope_dim values) in place with the cos/sin row `cs` of its token. */
static void rope_apply(const di_cpu_backend *b, float *x, const float *cs) {
  di_cpu_rope_apply(x, cs, b->cfg->qk_rope_head_dim / 2, b->cfg->rope_interleave);
}

static inline float *kv_entry(const di_cpu_backend *b, int layer, int32_t block, int slot) {
  return b->kv_pool + (((size_t)block * (size_t)b->n_cache_layers + (size_t)layer) * DI_KV_BLOCK_SIZE + (size_t)slot) *
                          (size_t)b->kv_stride;
}

/* --kv-cache-dtype fp8: an entry is [nsc f32 scales | R E4M3 bytes | dr bf16], the latent quantized per
 * 128 channels (scale amax / 448, 1 for an all-zero group; rounded to nearest even), the rope part
 * rounded to bf16. Every read of the cache goes through kv_key, so attention always sees the stored
 * values, the current step's entries included (they are written before any token reads): a token's
 * result still does not depend on the other tokens of its step, nor on how its prompt was chunked. */
static void kv_store(const di_cpu_backend *b, float *e, const float *x) {
  const int R = b->cfg->kv_lora_rank, dr = b->cfg->qk_rope_head_dim, nsc = (R + 127) / 128;
  if (!b->kv_fp8) {
    memcpy(e, x, sizeof(float) * (size_t)(R + dr));
    return;
  }
  uint8_t *q = (uint8_t *)(e + nsc);
  uint16_t *pe = (uint16_t *)(q + R);
  di_kv_fp8_quantize(x, R, e, q);
  for (int i = 0; i < dr; i++) pe[i] = di_f32_to_bf16(x[R + i]);
}

/* the stored entry e as [c_kv | k_pe] floats: e itself (f32 cache), or decoded into tmp (kv_dim floats) */
static inline const float *kv_key(const di_cpu_backend *b, const float *e, float *tmp) {
  if (!b->kv_fp8)
    return e;
  const int R = b->cfg->kv_lora_rank, dr = b->cfg->qk_rope_head_dim, nsc = (R + 127) / 128;
  const uint8_t *q = (const uint8_t *)(e + nsc);
  const uint16_t *pe = (const uint16_t *)(q + R);
  for (int c = 0; c < R; c++) tmp[c] = di_fp8e4m3_to_f32(q[c]) * e[c / 128];
  for (int i = 0; i < dr; i++) tmp[R + i] = di_bf16_to_f32(pe[i]);
  return tmp;
}

/* ---- per-token loops of a step in parallel ------------------------------------------------------ */

/* Steps of at least this many tokens run their per-token loops (norms, cache writes, residual adds,
 * SiLU, the MoE combine) on the thread pool; smaller ones (decode) stay on the caller, where a pool
 * round trip would cost more than the loop. Each token's arithmetic is the same either way. */
#define PAR_ROWS_MIN 16

typedef struct {
  float *out;
  const float *x, *w;
  int n;
  float eps;
} norm_rows_ctx;

static void norm_rows_task(void *p, int64_t begin, int64_t end, int thread) {
  (void)thread;
  norm_rows_ctx *c = p;
  for (int64_t t = begin; t < end; t++) di_cpu_rmsnorm_row(c->out + t * c->n, c->x + t * c->n, c->w, c->n, c->eps);
}

/* out[t] = rmsnorm(x[t]) * w for T rows of n (out may be x) */
static void norm_rows(di_cpu_backend *b, float *out, const float *x, const float *w, int T, int n) {
  norm_rows_ctx c = {out, x, w, n, b->cfg->rms_norm_eps};
  if (T >= PAR_ROWS_MIN) di_parallel_for(b->tp, T, 4, norm_rows_task, &c);
  else norm_rows_task(&c, 0, T, 0);
}

typedef struct {
  float *a;
  const float *b;
  int mode; /* 0: a += b; 1: a = silu(a) * b */
} elem_ctx;

static void elem_task(void *p, int64_t begin, int64_t end, int thread) {
  (void)thread;
  elem_ctx *c = p;
  const int64_t i0 = begin * 1024, n = end * 1024 - i0;
  if (c->mode) {
    di_cpu_silu_mul(c->a + i0, c->b + i0, n);
  } else {
    for (int64_t i = i0; i < i0 + n; i++) c->a[i] += c->b[i];
  }
}

/* elementwise over n floats (n a multiple of 1024 or not: the tail is the caller's) */
static void elementwise(di_cpu_backend *b, float *x, const float *y, int64_t n, int mode, int T) {
  elem_ctx c = {x, y, mode};
  const int64_t blocks = T >= PAR_ROWS_MIN ? n / 1024 : 0;
  if (blocks > 1) di_parallel_for(b->tp, blocks, 8, elem_task, &c);
  else blocks ? elem_task(&c, 0, blocks, 0) : (void)0;
  for (int64_t i = blocks * 1024; i < n; i++) {
    if (mode) di_cpu_silu_mul(x + i, y + i, 1);
    else x[i] += y[i];
  }
}

/* ---- attention -------------------------------------------------------------------------------- */

/* A job is one token and a group of `group` heads: the group's heads go over the token's keys
 * together, so each latent cache entry is read once per group instead of once per head (prefill
 * reads the whole context per token). Every score, softmax and output element is computed exactly
 * as for one head alone (the same dot products in the same order), so neither the grouping nor the
 * step's size changes a result. */
typedef struct {
  di_cpu_backend *b;
  const di_batch *batch;
  int layer, group;
  const float *q;  /* [T][NH*dqk] */
  float *out;      /* [T][NH*dv] */
} attn_ctx;

/* DI_CPU_ATTN_GROUP heads per job at most; the per-thread scratch holds that many heads */
static void attn_task(void *p, int64_t begin, int64_t end, int thread) {
  attn_ctx *a = p;
  di_cpu_backend *b = a->b;
  const di_model_config *c = b->cfg;
  const int NH = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
  const int dqk = dn + dr, R = c->kv_lora_rank, G = a->group, n_groups = (NH + G - 1) / G;
  const size_t stride = b->attn_scratch_per_thread / DI_CPU_ATTN_GROUP; /* one head's scratch */
  float *scratch = b->attn_scratch + (size_t)thread * b->attn_scratch_per_thread;
  const float *wk = b->w_uk[a->layer], *wv = b->w_uv[a->layer];
  float *ktmp = b->s_kv_tmp + (size_t)thread * 4 * b->kv_dim; /* fp8 cache: 4 decoded keys (kv_key) */
  for (int64_t job = begin; job < end; job++) {
    /* the step's last tokens first: a prefill's later tokens have the most keys, and the pool hands
     * out chunks in order, so the long ones start first and the short ones fill the gaps */
    const int t = a->batch->n_tokens - 1 - (int)(job / n_groups), h0 = (int)(job % n_groups) * G;
    const int ng = NH - h0 < G ? NH - h0 : G;
    const int pos = a->batch->positions[t];
    const di_batch_seq *seq = &a->batch->seqs[a->batch->seq_of[t]];
    float *q_lat[DI_CPU_ATTN_GROUP], *q_pe[DI_CPU_ATTN_GROUP], *o_lat[DI_CPU_ATTN_GROUP], *scores[DI_CPU_ATTN_GROUP];
    float mx[DI_CPU_ATTN_GROUP];
    for (int g = 0; g < ng; g++) {
      const int h = h0 + g;
      q_lat[g] = scratch + (size_t)g * stride;
      q_pe[g] = q_lat[g] + R;
      o_lat[g] = q_pe[g] + dr;
      scores[g] = o_lat[g] + R;
      const float *q = a->q + (size_t)t * NH * dqk + (size_t)h * dqk;
      /* q_lat[r] = sum_d W_UK[h][d][r] q_nope[d], via the transposed copy [h][r][d], four rows per
       * di_cpu_dot4 (bit-equal to one di_cpu_dot each) */
      int rq = 0;
      for (; rq + 4 <= R; rq += 4) {
        const float *rows[4];
        for (int i = 0; i < 4; i++) rows[i] = wk + ((size_t)h * R + rq + i) * dn;
        di_cpu_dot4(q, rows, dn, q_lat[g] + rq);
      }
      for (; rq < R; rq++)
        q_lat[g][rq] = di_cpu_dot(q, wk + ((size_t)h * R + rq) * dn, dn);
      memcpy(q_pe[g], q + dn, sizeof(float) * (size_t)dr);
      rope_apply(b, q_pe[g], b->s_rope + (size_t)t * dr);
      mx[g] = -INFINITY;
    }
    /* scores: each key once, every head of the group against it */
    for (int j = 0; j <= pos; j++) {
      const float *e = kv_key(b, kv_entry(b, a->layer, seq->block_table[j / DI_KV_BLOCK_SIZE], j % DI_KV_BLOCK_SIZE), ktmp);
      int g = 0;
      for (; g + 4 <= ng; g += 4) {
        float sl[4], sp[4];
        di_cpu_dot4(e, (const float *const *)&q_lat[g], R, sl);
        di_cpu_dot4(e + R, (const float *const *)&q_pe[g], dr, sp);
        for (int i = 0; i < 4; i++) {
          const float sc = (sl[i] + sp[i]) * c->softmax_scale;
          scores[g + i][j] = sc;
          if (sc > mx[g + i])
            mx[g + i] = sc;
        }
      }
      for (; g < ng; g++) {
        const float sc = (di_cpu_dot(q_lat[g], e, R) + di_cpu_dot(q_pe[g], e + R, dr)) * c->softmax_scale;
        scores[g][j] = sc;
        if (sc > mx[g])
          mx[g] = sc;
      }
    }
    float inv[DI_CPU_ATTN_GROUP];
    for (int g = 0; g < ng; g++) {
      float sum = 0.0f;
      for (int j = 0; j <= pos; j++) {
        scores[g][j] = expf(scores[g][j] - mx[g]);
        sum += scores[g][j];
      }
      inv[g] = 1.0f / sum;
      memset(o_lat[g], 0, sizeof(float) * (size_t)R);
    }
    /* o_lat += p_j * e_j over the keys in order, four keys per pass over o_lat (each addition as
     * in the one-key loop: o + (p_j * e_j[r]), rounded after the product and after the sum) */
    int jv = 0;
    for (; jv + 4 <= pos + 1 && R % 8 == 0; jv += 4) {
      const float *e[4];
      for (int i = 0; i < 4; i++)
        e[i] = kv_key(b, kv_entry(b, a->layer, seq->block_table[(jv + i) / DI_KV_BLOCK_SIZE], (jv + i) % DI_KV_BLOCK_SIZE),
                      ktmp + (size_t)i * b->kv_dim);
      for (int g = 0; g < ng; g++) {
        const __m256 p0 = _mm256_set1_ps(scores[g][jv] * inv[g]), p1 = _mm256_set1_ps(scores[g][jv + 1] * inv[g]);
        const __m256 p2 = _mm256_set1_ps(scores[g][jv + 2] * inv[g]), p3 = _mm256_set1_ps(scores[g][jv + 3] * inv[g]);
        float *ol = o_lat[g];
        for (int r = 0; r < R; r += 8) {
          __m256 o = _mm256_loadu_ps(ol + r);
          o = _mm256_add_ps(o, _mm256_mul_ps(p0, _mm256_loadu_ps(e[0] + r)));
          o = _mm256_add_ps(o, _mm256_mul_ps(p1, _mm256_loadu_ps(e[1] + r)));
          o = _mm256_add_ps(o, _mm256_mul_ps(p2, _mm256_loadu_ps(e[2] + r)));
          o = _mm256_add_ps(o, _mm256_mul_ps(p3, _mm256_loadu_ps(e[3] + r)));
          _mm256_storeu_ps(ol + r, o);
        }
      }
    }
    for (int j = jv; j <= pos; j++) {
      const float *e = kv_key(b, kv_entry(b, a->layer, seq->block_table[j / DI_KV_BLOCK_SIZE], j % DI_KV_BLOCK_SIZE), ktmp);
      for (int g = 0; g < ng; g++) {
        const float pj = scores[g][j] * inv[g];
        float *ol = o_lat[g];
        for (int r = 0; r < R; r++)
          ol[r] += pj * e[r];
      }
    }
    for (int g = 0; g < ng; g++) {
      const int h = h0 + g;
      float *o = a->out + (size_t)t * NH * dv + (size_t)h * dv;
      int e2 = 0;
      for (; e2 + 4 <= dv; e2 += 4) {
        const float *rows[4];
        for (int i = 0; i < 4; i++) rows[i] = wv + ((size_t)h * dv + e2 + i) * R;
        di_cpu_dot4(o_lat[g], rows, R, o + e2);
      }
      for (; e2 < dv; e2++)
        o[e2] = di_cpu_dot(o_lat[g], wv + ((size_t)h * dv + e2) * R, R);
    }
  }
}

static void attention(di_cpu_backend *b, const di_batch *batch, int layer, const di_ds_layer *L, const float *h,
                      float *out) {
  const di_model_config *c = b->cfg;
  const int T = batch->n_tokens, H = c->hidden_size, NH = c->num_attention_heads;
  const int dqk = di_cfg_qk_head_dim(c), R = c->kv_lora_rank, dr = c->qk_rope_head_dim;
  float *q = b->s_q, *kv = b->s_kv;
  /* the projections that read h run as one parallel loop */
  di_gemm_job first[2] = {{h, T, H, &L->kv_a, 0, R + dr, kv, R + dr}};
  if (c->q_lora_rank > 0) {
    float *qa = b->s_qa;
    first[1] = (di_gemm_job){h, T, H, &L->q_a, 0, c->q_lora_rank, qa, c->q_lora_rank};
    di_cpu_gemm_multi(b->tp, first, 2);
    norm_rows(b, qa, qa, L->q_a_norm, T, c->q_lora_rank);
    di_cpu_gemm(b->tp, qa, T, c->q_lora_rank, &L->q_b, 0, (int64_t)NH * dqk, q, (int64_t)NH * dqk);
  } else {
    first[1] = (di_gemm_job){h, T, H, &L->q_proj, 0, (int64_t)NH * dqk, q, (int64_t)NH * dqk};
    di_cpu_gemm_multi(b->tp, first, 2);
  }
  /* write the cache entries of every token of the step first */
  for (int t = 0; t < T; t++) {
    const int pos = batch->positions[t];
    const di_batch_seq *seq = &batch->seqs[batch->seq_of[t]];
    float *e = kv_entry(b, layer, seq->block_table[pos / DI_KV_BLOCK_SIZE], pos % DI_KV_BLOCK_SIZE);
    float *src = kv + (size_t)t * (R + dr); /* normed and roped in place (s_kv is not read again) */
    di_cpu_rmsnorm_row(src, src, L->kv_a_norm, R, c->rms_norm_eps);
    rope_apply(b, src + R, b->s_rope + (size_t)t * dr);
    kv_store(b, e, src);
  }
  di_cpu_mla_attend(b, batch, layer, q, b->s_attn);
  di_cpu_gemm(b->tp, b->s_attn, T, (int64_t)NH * c->v_head_dim, &L->o_proj, 0, H, out, H);
}

void di_cpu_mla_attend(di_cpu_backend *b, const di_batch *batch, int layer, const float *q, float *out) {
  const int T = batch->n_tokens, NH = b->cfg->num_attention_heads;
  /* heads in groups when there are tokens enough to keep the threads busy (prefill); one head per
   * job at decode, so a single token's heads still spread over the threads */
  const int group = T >= 4 ? (NH < DI_CPU_ATTN_GROUP ? NH : DI_CPU_ATTN_GROUP) : 1;
  attn_ctx a = {b, batch, layer, group, q, out};
  di_parallel_for(b->tp, (int64_t)T * ((NH + group - 1) / group), 1, attn_task, &a);
}

/* ---- feed-forward --------------------------------------------------------------------------------- */

/* out[m] = down(silu(gate x[m]) * up x[m]) for M rows. */
static void mlp(di_cpu_backend *b, const float *x, int M, const di_weight *gate, const di_weight *up,
                const di_weight *down, float *out) {
  const int H = b->cfg->hidden_size;
  const int64_t I = gate->rows;
  float *g = b->s_g, *u = b->s_u;
  const di_gemm_job gu[2] = {{x, M, H, gate, 0, I, g, I}, {x, M, H, up, 0, I, u, I}};
  di_cpu_gemm_multi(b->tp, gu, 2);
  elementwise(b, g, u, (int64_t)M * I, 1, M);
  di_cpu_gemm(b->tp, g, M, I, down, 0, H, out, H);
}

typedef struct {
  di_cpu_backend *b;
  float *out;
  int has_shared;
} combine_ctx;

/* out[t] = sum_k w[t][k] * expert_out[where[t][k]] in the router's order, + the shared experts' */
static void combine_task(void *p, int64_t begin, int64_t end, int thread) {
  (void)thread;
  combine_ctx *c = p;
  di_cpu_backend *b = c->b;
  const int H = b->cfg->hidden_size, K = b->cfg->num_experts_per_tok;
  for (int64_t t = begin; t < end; t++) {
    float *o = c->out + (size_t)t * H;
    memset(o, 0, sizeof(float) * (size_t)H);
    for (int k = 0; k < K; k++) {
      const float w = b->s_topk_w[t * K + k], *y = b->s_exp_out + (size_t)b->s_exp_where[t * K + k] * H;
      for (int i = 0; i < H; i++)
        o[i] += w * y[i];
    }
    if (c->has_shared)
      for (int i = 0; i < H; i++)
        o[i] += b->s_shared[(size_t)t * H + i];
  }
}

static void moe(di_cpu_backend *b, const di_ds_layer *L, const float *x, int T, float *out) {
  const di_model_config *c = b->cfg;
  const int H = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
  float *logits = b->s_router;
  di_cpu_gemm(b->tp, x, T, H, &L->router, 0, E, logits, E);
  int32_t *ids = b->s_topk_ids;
  float *wts = b->s_topk_w;
  for (int t = 0; t < T; t++)
    di_cpu_route(c, L->router_bias, logits + (size_t)t * E, ids + (size_t)t * K, wts + (size_t)t * K);
  /* group (token, k) pairs by expert; each expert's rows go through one GEMM */
  int32_t *count = b->s_exp_count, *start = b->s_exp_start, *rows = b->s_exp_rows;
  memset(count, 0, sizeof(int32_t) * (size_t)E);
  for (int i = 0; i < T * K; i++)
    count[ids[i]]++;
  for (int e = 0, acc = 0; e < E; e++) {
    start[e] = acc;
    acc += count[e];
  }
  int32_t *fill = b->s_exp_fill, *where = b->s_exp_where;
  memcpy(fill, start, sizeof(int32_t) * (size_t)E);
  for (int i = 0; i < T * K; i++) {
    where[i] = fill[ids[i]];    /* slot i = t*K + k lands in expert-sorted row where[i] */
    rows[fill[ids[i]]++] = i;   /* ascending slots within each expert */
  }
  if (di_dist_expert_parallel()) { /* experts on their ranks; outputs land in rows where[] (cpu_deepseek_ep.c) */
    di_cpu_deepseek_moe_ep(b, L, x, T);
    goto combine;
  }
  /* gather each expert's rows, then run every expert's gate+up (and the shared experts') as one
   * parallel loop, SiLU-and-multiply, and every down projection as a second loop */
  float *xin = b->s_exp_in, *g = b->s_g, *u = b->s_u;
  const int64_t I = c->moe_intermediate_size;
  const int64_t SI = L->has_shared ? L->sh_gate.rows : 0;
  di_gemm_job *jobs = b->s_jobs;
  int nj = 0;
  for (int e = 0; e < E; e++) {
    const int n = count[e];
    if (!n)
      continue;
    float *xe = xin + (size_t)start[e] * H, *ge = g + (size_t)start[e] * I, *ue = u + (size_t)start[e] * I;
    for (int r = 0; r < n; r++)
      memcpy(xe + (size_t)r * H, x + (size_t)(rows[start[e] + r] / K) * H, sizeof(float) * (size_t)H);
    jobs[nj++] = (di_gemm_job){xe, n, H, &L->exp_gate[e], 0, I, ge, I};
    jobs[nj++] = (di_gemm_job){xe, n, H, &L->exp_up[e], 0, I, ue, I};
  }
  float *sg = g + (size_t)T * K * I, *su = u + (size_t)T * K * I;
  if (L->has_shared) {
    jobs[nj++] = (di_gemm_job){x, T, H, &L->sh_gate, 0, SI, sg, SI};
    jobs[nj++] = (di_gemm_job){x, T, H, &L->sh_up, 0, SI, su, SI};
  }
  di_cpu_gemm_multi(b->tp, jobs, nj);
  elementwise(b, g, u, (int64_t)T * K * I, 1, T);
  elementwise(b, sg, su, (int64_t)T * SI, 1, T);
  nj = 0;
  for (int e = 0; e < E; e++) {
    const int n = count[e];
    if (!n)
      continue;
    jobs[nj++] = (di_gemm_job){g + (size_t)start[e] * I, n, I, &L->exp_down[e], 0, H, b->s_exp_out + (size_t)start[e] * H, H};
  }
  if (L->has_shared)
    jobs[nj++] = (di_gemm_job){sg, T, SI, &L->sh_down, 0, H, b->s_shared, H};
  di_cpu_gemm_multi(b->tp, jobs, nj);
combine:;
  /* combine in the router's order, then add the shared experts */
  combine_ctx cc = {b, out, L->has_shared};
  if (T >= PAR_ROWS_MIN) di_parallel_for(b->tp, T, 4, combine_task, &cc);
  else combine_task(&cc, 0, T, 0);
}

/* ---- the whole pass --------------------------------------------------------------------------------- */

static void decoder_layer(di_cpu_backend *b, const di_batch *batch, int layer, const di_ds_layer *L, float *x) {
  const int T = batch->n_tokens, H = b->cfg->hidden_size;
  float *h = b->s_h, *o = b->s_o;
  norm_rows(b, h, x, L->attn_norm, T, H);
  attention(b, batch, layer, L, h, o);
  elementwise(b, x, o, (int64_t)T * H, 0, T);
  norm_rows(b, h, x, L->ffn_norm, T, H);
  if (L->is_moe)
    moe(b, L, h, T, o);
  else
    mlp(b, h, T, &L->gate, &L->up, &L->down, o);
  elementwise(b, x, o, (int64_t)T * H, 0, T);
}

di_status di_cpu_deepseek_forward(di_cpu_backend *b, const di_batch *batch, float *logits, float *hidden) {
  const di_model_config *c = b->cfg;
  const di_ds_weights *w = b->w;
  const int T = batch->n_tokens, H = c->hidden_size;
  DI_TRY(di_cpu_backend_reserve(b, T, batch));
  rope_table(b, batch);
  float *x = b->s_x;
  for (int t = 0; t < T; t++) {
    int32_t id = batch->tokens[t];
    if (id < 0 || id >= c->vocab_size)
      return di_error_set(DI_ERR_INVALID_ARG, "token id %d out of range [0, %d)", id, c->vocab_size);
    di_weight_rows_f32(&w->embed, id, id + 1, x + (size_t)t * H);
  }
  const int nc = hidden ? b->n_capture : 0, last = w->n_layers - 1;
  for (int l = -1; l < w->n_layers; l++) {
    if (l >= 0)
      decoder_layer(b, batch, l, &w->layers[l], x);
    for (int k = 0; k < nc; k++) /* a drafter's features: this layer's output (the last: below) */
      if (b->capture[k] == l && l != last)
        for (int i = 0; i < batch->n_outputs; i++)
          memcpy(hidden + ((size_t)i * nc + k) * H, x + (size_t)batch->output_rows[i] * H, sizeof(float) * (size_t)H);
  }
  /* final norm and lm_head for the output rows only */
  float *hn = b->s_h;
  for (int i = 0; i < batch->n_outputs; i++)
    di_cpu_rmsnorm_row(hn + (size_t)i * H, x + (size_t)batch->output_rows[i] * H, w->final_norm, H, c->rms_norm_eps);
  if (hidden && nc == 0)
    memcpy(hidden, hn, sizeof(float) * (size_t)batch->n_outputs * H);
  for (int k = 0; k < nc; k++)
    if (b->capture[k] == last)
      for (int i = 0; i < batch->n_outputs; i++)
        memcpy(hidden + ((size_t)i * nc + k) * H, hn + (size_t)i * H, sizeof(float) * (size_t)H);
  if (logits) /* the wanted rows only (hn is scratch from here) */
    di_cpu_gemm_selected(b->tp, hn, batch->n_outputs, H, batch->output_logits, &w->lm_head, c->vocab_size, logits,
                         c->vocab_size);
  return DI_OK;
}

di_status di_cpu_deepseek_mtp_forward(di_cpu_backend *b, int mtp_index, const di_batch *batch, const float *prev_hidden,
                                      float *logits, float *hidden_out) {
  const di_model_config *c = b->cfg;
  const di_ds_weights *w = b->w;
  if (mtp_index < 0 || mtp_index >= w->n_mtp)
    return di_error_set(DI_ERR_INVALID_ARG, "the model has %d MTP layers; %d requested", w->n_mtp, mtp_index);
  const di_ds_layer *L = &w->layers[w->n_layers + mtp_index];
  const int T = batch->n_tokens, H = c->hidden_size;
  DI_TRY(di_cpu_backend_reserve(b, T, batch));
  rope_table(b, batch);
  float *x = b->s_x, *cat = b->s_mtp_cat;
  /* x = eh_proj([enorm(embed(next token)) | hnorm(h_prev)]) */
  for (int t = 0; t < T; t++) {
    int32_t id = batch->tokens[t];
    if (id < 0 || id >= c->vocab_size)
      return di_error_set(DI_ERR_INVALID_ARG, "token id %d out of range [0, %d)", id, c->vocab_size);
    float *row = cat + (size_t)t * 2 * H;
    di_weight_rows_f32(&L->mtp_embed, id, id + 1, row);
    di_cpu_rmsnorm_row(row, row, L->enorm, H, c->rms_norm_eps);
    di_cpu_rmsnorm_row(row + H, prev_hidden + (size_t)t * H, L->hnorm, H, c->rms_norm_eps);
  }
  di_cpu_gemm(b->tp, cat, T, 2 * H, &L->eh_proj, 0, H, x, H);
  decoder_layer(b, batch, w->n_layers + mtp_index, L, x);
  float *hn = b->s_h;
  for (int i = 0; i < batch->n_outputs; i++)
    di_cpu_rmsnorm_row(hn + (size_t)i * H, x + (size_t)batch->output_rows[i] * H, L->head_norm, H, c->rms_norm_eps);
  if (hidden_out)
    for (int i = 0; i < batch->n_outputs; i++)
      memcpy(hidden_out + (size_t)i * H, x + (size_t)batch->output_rows[i] * H, sizeof(float) * (size_t)H);
  if (logits)
    di_cpu_gemm(b->tp, hn, batch->n_outputs, H, &L->head, 0, c->vocab_size, logits, c->vocab_size);
  return DI_OK;
}
