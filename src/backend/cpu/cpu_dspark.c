/* The DSpark drafter's CPU forward (see cpu_dspark.h). Float32 activations, weights read as stored.
 * Cache layout: [block][layer][slot][K | V], K and V each n_kv_heads * head_dim floats. RoPE is
 * Qwen3's (half-split pairs, inv_freq = theta^(-2i/head_dim)), applied after the per-head q/k norm. */
#include "backend/cpu/cpu_dspark.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_gqa.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/drafter_cache.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct di_cpu_dspark {
  const di_dspark *d;
  di_threadpool *tp;
  float *kv;
  int64_t n_blocks;
  int kvd; /* n_kv_heads * head_dim */
  double inv_freq[512];
  float *markov_w2; /* [vocab][rank] in float32: the Markov term is one small product per draft */
  /* scratch, grown by need */
  float *buf;
  size_t cap;
};

di_status di_cpu_dspark_create(const di_dspark *d, di_threadpool *tp, di_cpu_dspark **out) {
  if (d->head_dim / 2 > 512) return di_error_set(DI_ERR_UNSUPPORTED, "DSpark drafter: head_dim %d > 1024", d->head_dim);
  di_cpu_dspark *s = calloc(1, sizeof *s);
  if (!s) return di_error_set(DI_ERR_OOM, "out of memory");
  s->d = d;
  s->tp = tp;
  s->kvd = d->n_kv_heads * d->head_dim;
  for (int i = 0; i < d->head_dim / 2; i++)
    s->inv_freq[i] = 1.0 / pow((double)d->rope_theta, (double)(2 * i) / (double)d->head_dim);
  if (d->markov_rank > 0) {
    s->markov_w2 = malloc(sizeof(float) * (size_t)d->vocab * (size_t)d->markov_rank);
    if (!s->markov_w2) {
      free(s);
      return di_error_set(DI_ERR_OOM, "out of memory for the Markov head");
    }
    di_weight_rows_f32(&d->markov_w2, 0, d->vocab, s->markov_w2);
  }
  *out = s;
  return DI_OK;
}

void di_cpu_dspark_free(di_cpu_dspark *s) {
  if (!s) return;
  free(s->kv);
  free(s->buf);
  free(s->markov_w2);
  free(s);
}

di_status di_cpu_dspark_kv_alloc(di_cpu_dspark *s, int64_t n_blocks) {
  size_t n = (size_t)n_blocks * (size_t)s->d->n_layers * DI_DRAFTER_BLOCK_TOKENS * 2 * (size_t)s->kvd;
  float *p = n ? calloc(n, sizeof(float)) : NULL;
  if (n && !p) return di_error_set(DI_ERR_OOM, "DSpark drafter: cannot allocate its cache of %lld blocks", (long long)n_blocks);
  free(s->kv);
  s->kv = p;
  s->n_blocks = n_blocks;
  return DI_OK;
}

static float *scratch(di_cpu_dspark *s, size_t n) {
  if (n > s->cap) {
    float *p = realloc(s->buf, n * sizeof(float));
    if (!p) return NULL;
    s->buf = p;
    s->cap = n;
  }
  return s->buf;
}

static float *cache_row(const di_cpu_dspark *s, const di_batch_seq *q, int layer, int pos) {
  int32_t blk = q->block_table[pos / DI_DRAFTER_BLOCK_TOKENS];
  size_t off = (((size_t)blk * (size_t)s->d->n_layers + (size_t)layer) * DI_DRAFTER_BLOCK_TOKENS + (size_t)(pos % DI_DRAFTER_BLOCK_TOKENS)) *
               2 * (size_t)s->kvd;
  return s->kv + off;
}

static di_status check_pos(const di_cpu_dspark *s, const di_batch_seq *q, int pos) {
  int64_t slot;
  return di_drafter_cache_slot(q, pos, s->n_blocks, &slot);
}

/* per-head RMSNorm then RoPE at `pos`, for n_heads heads of one row */
static void norm_rope(const di_cpu_dspark *s, float *x, int n_heads, const float *w, int pos) {
  const int hd = s->d->head_dim, half = hd / 2;
  for (int h = 0; h < n_heads; h++) {
    float *v = x + (size_t)h * hd;
    di_cpu_rmsnorm_row(v, v, w, hd, s->d->eps);
    for (int i = 0; i < half; i++) {
      /* float32 angle, as torch computes positions * inv_freq */
      float ang = (float)pos * (float)s->inv_freq[i];
      float c = cosf(ang), sn = sinf(ang);
      float a = v[i], b = v[i + half];
      v[i] = a * c - b * sn;
      v[i + half] = b * c + a * sn;
    }
  }
}

/* Context rows t in [t0, t1): fc, hidden_norm, then every layer's k (k_norm, RoPE) and v into the cache. */
typedef struct context_job {
  di_cpu_dspark *s;
  const float *feats;
  const int32_t *pos, *seq_of;
  const di_batch_seq *seqs;
  float *ctx, *k, *v; /* [n][H], [n][kvd], [n][kvd] */
  int pooled;         /* 1: the products run inside the task (context_rows is itself a parallel loop's task) */
} context_job;

static void context_rows(void *p, int64_t t0, int64_t t1, int thread) {
  const context_job *c = p;
  di_cpu_dspark *s = c->s;
  const di_dspark *d = s->d;
  const int H = d->hidden, kvd = s->kvd, F = d->n_feats * d->target_hidden;
  const int64_t n = t1 - t0;
  float *ctx = c->ctx + (size_t)t0 * H, *k = c->k + (size_t)t0 * kvd, *v = c->v + (size_t)t0 * kvd;
  const float *feats = c->feats + (size_t)t0 * F;
  if (c->pooled) di_cpu_gemm_in_task(s->tp, thread, feats, n, F, &d->fc, 0, H, ctx, H);
  else di_cpu_gemm(s->tp, feats, n, F, &d->fc, 0, H, ctx, H);
  for (int64_t t = 0; t < n; t++) di_cpu_rmsnorm_row(ctx + (size_t)t * H, ctx + (size_t)t * H, d->hidden_norm, H, d->eps);
  for (int l = 0; l < d->n_layers; l++) {
    const di_dspark_layer *L = &d->layers[l];
    if (c->pooled) {
      di_cpu_gemm_in_task(s->tp, thread, ctx, n, H, &L->k, 0, kvd, k, kvd);
      di_cpu_gemm_in_task(s->tp, thread, ctx, n, H, &L->v, 0, kvd, v, kvd);
    } else {
      const di_gemm_job jobs[2] = {{ctx, n, H, &L->k, 0, kvd, k, kvd}, {ctx, n, H, &L->v, 0, kvd, v, kvd}};
      di_cpu_gemm_multi(s->tp, jobs, 2);
    }
    for (int64_t t = 0; t < n; t++) {
      float *kt = k + (size_t)t * kvd;
      norm_rope(s, kt, d->n_kv_heads, L->k_norm, c->pos[t0 + t]);
      float *row = cache_row(s, &c->seqs[c->seq_of[t0 + t]], l, c->pos[t0 + t]);
      memcpy(row, kt, sizeof(float) * (size_t)kvd);
      memcpy(row + kvd, v + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
    }
  }
}

/* Rows per task of the row-parallel context feed: the panel form's minimum (PANEL_MIN_M in cpu_gemm.c),
 * so every task converts each weight panel once for 8+ rows. */
#define CONTEXT_TASK_ROWS 8

di_status di_cpu_dspark_context(di_cpu_dspark *s, int n, const float *feats, const int32_t *pos, const int32_t *seq_of,
                                const di_batch_seq *seqs) {
  const di_dspark *d = s->d;
  const int H = d->hidden, kvd = s->kvd;
  if (n <= 0) return DI_OK;
  for (int t = 0; t < n; t++) DI_TRY(check_pos(s, &seqs[seq_of[t]], pos[t]));
  float *ctx = scratch(s, (size_t)n * (H + 2 * kvd));
  if (!ctx) return di_error_set(DI_ERR_OOM, "DSpark drafter: out of memory for %d context rows", n);
  context_job c = {s, feats, pos, seq_of, seqs, ctx, ctx + (size_t)n * H, ctx + (size_t)n * (H + kvd), 0};
  /* Many rows (a batch's decoding step, a prompt chunk): one parallel loop over the rows, each task
   * doing all of its rows' work (the products, the norms, RoPE and the cache writes); a product's
   * columns split over threads gave only ceil(224 / 48) = 5 tasks for fc and ran the per-row work on
   * one thread. Few rows: the products' own column-parallel loops. Either way every value is the same
   * (a row's product does not depend on the other rows: cpu_gemm.h). */
  const int nt = di_threadpool_size(s->tp);
  if (nt > 1 && n >= 2 * CONTEXT_TASK_ROWS) {
    c.pooled = 1;
    di_parallel_for(s->tp, n, CONTEXT_TASK_ROWS, context_rows, &c);
  } else {
    context_rows(&c, 0, n, 0);
  }
  return DI_OK;
}

di_status di_cpu_dspark_propose(di_cpu_dspark *s, int n, const int32_t *tok, const int32_t *pos, const di_batch_seq *seqs,
                                float *hidden, float *logits) {
  return di_cpu_dspark_propose_rows(s, n, tok, pos, seqs, NULL, hidden, logits);
}

di_status di_cpu_dspark_propose_rows(di_cpu_dspark *s, int n, const int32_t *tok, const int32_t *pos,
                                     const di_batch_seq *seqs, const uint8_t *want, float *hidden, float *logits) {
  const di_dspark *d = s->d;
  const int B = d->block_size, H = d->hidden, kvd = s->kvd, hd = d->head_dim, NH = d->n_heads, QD = NH * hd;
  const int I = d->inter, R = n * B;
  if (n <= 0) return DI_OK;
  int max_ctx = 0;
  for (int i = 0; i < n; i++) {
    if (tok[i] < 0 || tok[i] >= d->vocab) return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafter: token id %d", tok[i]);
    if (pos[i] > 0) DI_TRY(check_pos(s, &seqs[i], pos[i] - 1));
    if (pos[i] > max_ctx) max_ctx = pos[i];
  }
  const size_t nk = (size_t)max_ctx + (size_t)B;
  size_t need = (size_t)R * (3 * (size_t)H + QD + 2 * (size_t)kvd + QD + 2 * (size_t)I) + 2 * nk * kvd + nk;
  float *x = scratch(s, need);
  if (!x) return di_error_set(DI_ERR_OOM, "DSpark drafter: out of memory for %d blocks", n);
  float *xn = x + (size_t)R * H, *o = xn + (size_t)R * H, *q = o + (size_t)R * H, *kb = q + (size_t)R * QD;
  float *vb = kb + (size_t)R * kvd, *att = vb + (size_t)R * kvd, *g = att + (size_t)R * QD, *u = g + (size_t)R * I;
  float *K = u + (size_t)R * I, *Vv = K + nk * kvd, *sc = Vv + nk * kvd;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < B; j++) {
      int32_t id = j == 0 ? tok[i] : d->mask_token;
      di_weight_rows_f32(&d->embed, id, id + 1, x + ((size_t)i * B + j) * H);
    }
  const float scale = 1.0f / sqrtf((float)hd);
  for (int l = 0; l < d->n_layers; l++) {
    const di_dspark_layer *L = &d->layers[l];
    for (int r = 0; r < R; r++) di_cpu_rmsnorm_row(xn + (size_t)r * H, x + (size_t)r * H, L->in_norm, H, d->eps);
    const di_gemm_job qkv[3] = {{xn, R, H, &L->q, 0, QD, q, QD}, {xn, R, H, &L->k, 0, kvd, kb, kvd},
                                {xn, R, H, &L->v, 0, kvd, vb, kvd}};
    di_cpu_gemm_multi(s->tp, qkv, 3);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < B; j++) {
        size_t r = (size_t)i * B + j;
        norm_rope(s, q + r * QD, NH, L->q_norm, pos[i] + j);
        norm_rope(s, kb + r * kvd, d->n_kv_heads, L->k_norm, pos[i] + j);
      }
    for (int i = 0; i < n; i++) {
      const int a = pos[i];
      for (int p = 0; p < a; p++) {
        const float *row = cache_row(s, &seqs[i], l, p);
        memcpy(K + (size_t)p * kvd, row, sizeof(float) * (size_t)kvd);
        memcpy(Vv + (size_t)p * kvd, row + kvd, sizeof(float) * (size_t)kvd);
      }
      memcpy(K + (size_t)a * kvd, kb + (size_t)i * B * kvd, sizeof(float) * (size_t)B * kvd);
      memcpy(Vv + (size_t)a * kvd, vb + (size_t)i * B * kvd, sizeof(float) * (size_t)B * kvd);
      di_cpu_gqa_attend(q + (size_t)i * B * QD, B, QD, NH, d->n_kv_heads, hd, K, Vv, kvd, a + B, scale,
                        att + (size_t)i * B * QD, QD, sc);
    }
    di_cpu_gemm(s->tp, att, R, QD, &L->o, 0, H, o, H);
    for (size_t e = 0; e < (size_t)R * H; e++) x[e] += o[e];
    for (int r = 0; r < R; r++) di_cpu_rmsnorm_row(xn + (size_t)r * H, x + (size_t)r * H, L->post_norm, H, d->eps);
    const di_gemm_job gu[2] = {{xn, R, H, &L->gate, 0, I, g, I}, {xn, R, H, &L->up, 0, I, u, I}};
    di_cpu_gemm_multi(s->tp, gu, 2);
    di_cpu_silu_mul(g, u, (int64_t)R * I);
    di_cpu_gemm(s->tp, g, R, I, &L->down, 0, H, o, H);
    for (size_t e = 0; e < (size_t)R * H; e++) x[e] += o[e];
  }
  for (int r = 0; r < R; r++) di_cpu_rmsnorm_row(xn + (size_t)r * H, x + (size_t)r * H, d->norm, H, d->eps);
  if (hidden) memcpy(hidden, xn, sizeof(float) * (size_t)R * H);
  if (logits) di_cpu_gemm_selected(s->tp, xn, R, H, want, &d->lm_head, d->vocab, logits, d->vocab); /* xn: scratch now */
  return DI_OK;
}

void di_cpu_dspark_markov(di_cpu_dspark *s, int32_t prev, float *logits) {
  const di_dspark *d = s->d;
  const int Rk = d->markov_rank;
  if (Rk <= 0 || prev < 0 || prev >= d->vocab) return;
  float e[1024];
  di_weight_rows_f32(&d->markov_w1, prev, prev + 1, e);
  for (int v = 0; v < d->vocab; v++) logits[v] += di_cpu_dot(s->markov_w2 + (size_t)v * Rk, e, Rk);
}

float di_cpu_dspark_confidence(di_cpu_dspark *s, const float *h, int32_t prev) {
  const di_dspark *d = s->d;
  if (!d->has_conf) return 1.0f;
  float z = d->conf_b + di_cpu_dot(d->conf_w, h, d->hidden);
  if (d->conf_with_markov && prev >= 0 && prev < d->vocab) {
    float e[1024];
    if (d->markov_rank <= 1024) {
      di_weight_rows_f32(&d->markov_w1, prev, prev + 1, e);
      z += di_cpu_dot(d->conf_w + d->hidden, e, d->markov_rank);
    }
  }
  return 1.0f / (1.0f + expf(-z));
}
