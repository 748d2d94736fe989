/* See cpu_ops.h. */
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_deepseek_v4_ops.h"
#include "backend/cpu/cpu_gemm.h"
#include "sampler/sampler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void di_cpu_rmsnorm_row(float *out, const float *x, const float *w, int n, float eps) {
  /* HF: x * rsqrt(mean(x^2) + eps) * w, in float32 */
  float ss = di_cpu_dot(x, x, n) / (float)n;
  float r = 1.0f / sqrtf(ss + eps);
  for (int i = 0; i < n; i++)
    out[i] = w[i] * (x[i] * r);
}

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

void di_cpu_silu_mul(float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    g[i] = silu(g[i]) * u[i];
}

/* The MoE's grouping (cpu_deepseek.c's moe): each expert's rows gathered in row order, every
 * expert's product in one parallel loop (di_cpu_gemm_multi), scattered back. The experts are row
 * ranges [e n, e n + n) of one stacked weight. */
static di_status grouped_gemm(di_threadpool *tp, const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  const int E = c->p[0];
  float *xg = malloc(sizeof(float) * (size_t)c->m * (size_t)c->k), *yg = malloc(sizeof(float) * (size_t)c->m * (size_t)c->n);
  int *rows = malloc(sizeof(int) * (size_t)c->m);
  di_gemm_job *jobs = calloc((size_t)E, sizeof(di_gemm_job));
  if (!xg || !yg || !rows || !jobs) {
    free(xg);
    free(yg);
    free(rows);
    free(jobs);
    return di_error_set(DI_ERR_OOM, "cpu ops: out of memory");
  }
  int nr = 0, nj = 0;
  for (int e = 0; e < E; e++) {
    const int r0 = nr;
    for (int i = 0; i < c->m; i++)
      if (d->ids[i] == e) {
        rows[nr] = i;
        memcpy(xg + (int64_t)nr * c->k, d->x + (int64_t)i * c->k, sizeof(float) * (size_t)c->k);
        nr++;
      }
    if (nr > r0)
      jobs[nj++] = (di_gemm_job){xg + (int64_t)r0 * c->k, nr - r0, c->k, &d->w, (int64_t)e * c->n, (int64_t)(e + 1) * c->n,
                                 yg + (int64_t)r0 * c->n, c->n};
  }
  di_cpu_gemm_multi(tp, jobs, nj);
  for (int r = 0; r < nr; r++) memcpy(out + (int64_t)rows[r] * c->n, yg + (int64_t)r * c->n, sizeof(float) * (size_t)c->n);
  free(xg);
  free(yg);
  free(rows);
  free(jobs);
  return DI_OK;
}

/* The forward's attention (di_cpu_mla_attend) on an attention-only backend (cpu_backend.h): one cache
 * layer of the case's rows in blocks numbered in reverse, the absorbed matrices, the rope rows. */
static di_status mla_attn(di_threadpool *tp, const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  const int dr = c->p[1], nb = (c->k + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE, total = nb * d->n_seqs;
  float *uk = d->w_uk, *uv = d->w_uv;
  di_cpu_backend b;
  di_status st = di_cpu_attention_backend_init(&b, &d->cfg, tp, &uk, &uv, total, c->m, c->k);
  if (st != DI_OK)
    return st;
  int32_t *tables = malloc(sizeof(int32_t) * (size_t)total), *seq_of = malloc(sizeof(int32_t) * (size_t)c->m);
  di_batch_seq *seqs = calloc((size_t)d->n_seqs, sizeof *seqs);
  if (!tables || !seq_of || !seqs) {
    st = di_error_set(DI_ERR_OOM, "cpu ops: out of memory");
  } else {
    for (int sq = 0; sq < d->n_seqs; sq++) {
      seqs[sq].block_table = tables + (size_t)sq * nb;
      seqs[sq].n_blocks = nb;
      for (int j = 0; j < nb; j++) tables[sq * nb + j] = total - 1 - (sq * nb + j);
      for (int j = 0; j < c->k; j++)
        memcpy(b.kv_pool + ((size_t)tables[sq * nb + j / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + j % DI_KV_BLOCK_SIZE) * b.kv_stride,
               d->kv + ((size_t)sq * c->k + j) * b.kv_dim, sizeof(float) * (size_t)b.kv_dim);
    }
    for (int i = 0; i < c->m; i++) {
      int pos;
      di_op_mla_query(c, i, &seq_of[i], &pos);
      di_cpu_rope_cos_sin(pos, b.inv_freq, dr / 2, 1.0f, b.s_rope + (size_t)i * dr);
    }
    di_batch batch = {.n_tokens = c->m, .positions = d->ids, .seq_of = seq_of, .n_seqs = d->n_seqs, .seqs = seqs};
    di_cpu_mla_attend(&b, &batch, 0, d->x, out);
  }
  di_cpu_attention_backend_free(&b);
  free(tables);
  free(seq_of);
  free(seqs);
  return st;
}

di_status di_cpu_op_run(void *ctx, const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  switch (c->op) {
  case DI_OP_GEMM:
    di_cpu_gemm((di_threadpool *)ctx, d->x, c->m, c->k, &d->w, 0, c->n, out, c->n);
    return DI_OK;
  case DI_OP_RMSNORM:
    for (int i = 0; i < c->m; i++)
      di_cpu_rmsnorm_row(out + (int64_t)i * c->n, d->x + (int64_t)i * c->n, d->nw, c->n, d->eps);
    return DI_OK;
  case DI_OP_SILU_MUL: {
    float *u = malloc(sizeof(float) * (size_t)c->n);
    if (!u) return di_error_set(DI_ERR_OOM, "cpu ops: out of memory");
    for (int i = 0; i < c->m; i++) {
      memcpy(out + (int64_t)i * c->n, d->x + (int64_t)i * 2 * c->n, sizeof(float) * (size_t)c->n);
      memcpy(u, d->x + (int64_t)i * 2 * c->n + c->n, sizeof(float) * (size_t)c->n);
      di_cpu_silu_mul(out + (int64_t)i * c->n, u, c->n);
    }
    free(u);
    return DI_OK;
  }
  case DI_OP_ROPE: {
    float cs[DI_OP_MAX_ROPE];
    for (int t = 0; t < c->m; t++) {
      float *y = out + (int64_t)t * c->n;
      memcpy(y, d->x + (int64_t)t * c->n, sizeof(float) * (size_t)c->n);
      di_cpu_rope_cos_sin(d->ids[t], d->inv_freq, c->n / 2, d->cfg.rope_attention_factor, cs);
      di_cpu_rope_apply(y, cs, c->n / 2, d->cfg.rope_interleave);
    }
    return DI_OK;
  }
  case DI_OP_ROUTER: {
    const int K = c->p[0];
    int32_t ids[64];
    float w[64];
    if (K > 64) return di_error_set(DI_ERR_UNSUPPORTED, "cpu ops: router top-%d", K);
    for (int t = 0; t < c->m; t++) {
      di_cpu_route(&d->cfg, d->bias, d->x + (int64_t)t * c->n, ids, w);
      for (int k = 0; k < K; k++) {
        out[(int64_t)t * K + k] = (float)ids[k];
        out[d->n_exact + (int64_t)t * K + k] = w[k];
      }
    }
    return DI_OK;
  }
  case DI_OP_GROUPED_GEMM: return grouped_gemm((di_threadpool *)ctx, d, out);
  case DI_OP_MLA_ATTN: return mla_attn((di_threadpool *)ctx, d, out);
  case DI_OP_V4_HC: {
    const int hc = c->p[0], mix = (2 + hc) * hc;
    const float *base = d->aux + (int64_t)mix * hc * c->n;
    double pre[64], post[64], comb[64 * 64];
    for (int t = 0; t < c->m; t++) {
      di_v4_hc_weights(&d->v4, d->aux, base, base + mix, d->x + (int64_t)t * hc * c->n, pre, post, comb);
      float *o = out + (int64_t)t * mix;
      for (int j = 0; j < hc; j++) {
        o[j] = (float)pre[j];
        o[hc + j] = (float)post[j];
      }
      for (int j = 0; j < hc * hc; j++) o[2 * hc + j] = (float)comb[j];
    }
    return DI_OK;
  }
  case DI_OP_V4_ROUTE:
    memset(out, 0, sizeof(float) * (size_t)d->n_out);
    for (int t = 0; t < c->m; t++)
      di_v4_route(&d->v4, d->x + (int64_t)t * c->n, d->bias, c->p[1] ? d->hash_ids + t * c->p[0] : NULL,
                  out + (int64_t)t * c->n);
    return DI_OK;
  case DI_OP_V4_TOPK: {
    di_v4_scored *work = malloc(sizeof *work * (size_t)c->n);
    unsigned char *chosen = malloc((size_t)c->n);
    if (!work || !chosen) {
      free(work);
      free(chosen);
      return di_error_set(DI_ERR_OOM, "cpu ops: out of memory");
    }
    for (int t = 0; t < c->m; t++) {
      memset(chosen, 0, (size_t)c->n);
      di_v4_topk_earlier_first(d->x + (int64_t)t * c->n, c->n, c->p[0], work, chosen);
      for (int j = 0; j < c->n; j++) out[(int64_t)t * c->n + j] = chosen[j];
    }
    free(work);
    free(chosen);
    return DI_OK;
  }
  case DI_OP_EMBED:
    /* the table's rows as the forward reads them (di_weight_get_row: every format to f32) */
    for (int i = 0; i < c->m; i++)
      for (int j = 0; j < c->n; j++) out[(int64_t)i * c->n + j] = di_weight_get(&d->w, d->ids[i], j);
    return DI_OK;
  case DI_OP_ARGMAX:
    for (int i = 0; i < c->m; i++) {
      float mx;
      out[i] = (float)di_row_argmax(d->x + (int64_t)i * c->n, c->n, &mx);
    }
    return DI_OK;
  default: return di_error_set(DI_ERR_UNSUPPORTED, "cpu ops: op %d", (int)c->op);
  }
}

void di_cpu_rope_cos_sin(int pos, const float *inv_freq, int half, float attn_factor, float *cs) {
  for (int i = 0; i < half; i++) {
    float ang = (float)pos * inv_freq[i];
    cs[2 * i] = cosf(ang) * attn_factor;
    cs[2 * i + 1] = sinf(ang) * attn_factor;
  }
}

void di_cpu_rope_apply(float *x, const float *cs, int half, int interleave) {
  for (int i = 0; i < half; i++) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    int i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
    float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * c - x1 * s;
    x[i1] = x1 * c + x0 * s;
  }
}

void di_cpu_route(const di_model_config *c, const float *bias, const float *logits, int32_t *ids, float *wts) {
  const int E = c->n_routed_experts, K = c->num_experts_per_tok;
  float scores[DI_MAX_EXPERTS], choice[DI_MAX_EXPERTS];
  if (c->scoring_func == DI_SCORE_SOFTMAX) {
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
      mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < E; e++)
      sum += (scores[e] = expf(logits[e] - mx));
    for (int e = 0; e < E; e++)
      scores[e] /= sum;
  } else {
    for (int e = 0; e < E; e++)
      scores[e] = 1.0f / (1.0f + expf(-logits[e]));
  }
  for (int e = 0; e < E; e++)
    choice[e] = scores[e] + (bias && c->topk_method == DI_TOPK_NOAUX_TC ? bias[e] : 0.0f);
  if (c->topk_method != DI_TOPK_GREEDY && c->n_group > 1) {
    const int G = c->n_group, per = E / G;
    float gscore[DI_MAX_EXPERT_GROUPS];
    for (int g = 0; g < G; g++) {
      const float *v = choice + g * per;
      if (c->topk_method == DI_TOPK_NOAUX_TC) { /* sum of the group's top-2 */
        float a = -INFINITY, a2 = -INFINITY;
        for (int i = 0; i < per; i++) {
          if (v[i] > a) {
            a2 = a;
            a = v[i];
          } else if (v[i] > a2) {
            a2 = v[i];
          }
        }
        gscore[g] = a + a2;
      } else { /* group_limited_greedy: the group's max */
        float a = -INFINITY;
        for (int i = 0; i < per; i++)
          a = v[i] > a ? v[i] : a;
        gscore[g] = a;
      }
    }
    /* keep the topk_group best groups (ties: lower index), mask the rest out */
    int keep[DI_MAX_EXPERT_GROUPS] = {0};
    for (int k = 0; k < c->topk_group; k++) {
      int best = -1;
      for (int g = 0; g < G; g++)
        if (!keep[g] && (best < 0 || gscore[g] > gscore[best]))
          best = g;
      keep[best] = 1;
    }
    for (int g = 0; g < G; g++)
      if (!keep[g])
        for (int i = 0; i < per; i++)
          choice[g * per + i] = -INFINITY;
  }
  /* top-K by choice score, descending; ties go to the lower expert index */
  unsigned char taken[DI_MAX_EXPERTS] = {0};
  float sum = 0.0f;
  for (int k = 0; k < K; k++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || choice[e] > choice[best]))
        best = e;
    taken[best] = 1;
    ids[k] = best;
    wts[k] = scores[best];
    sum += wts[k];
  }
  /* DeepSeek's own code: V3 renormalizes (norm_topk_prob) then scales; V2 either renormalizes or
   * scales. transformers' V2 ignores norm_topk_prob; we follow DeepSeek (see docs/NOTES.md). */
  const int renorm = K > 1 && c->norm_topk_prob;
  for (int k = 0; k < K; k++) {
    if (renorm)
      wts[k] /= (sum + 1e-20f);
    if (c->scale_after_renorm || !renorm)
      wts[k] *= c->routed_scaling_factor;
  }
}

