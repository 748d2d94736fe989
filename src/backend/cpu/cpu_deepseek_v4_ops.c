/* DeepSeek-V4 CPU building blocks shared by the reference forward and the cached forward: scratch
 * memory, linear layers with double sums, RMSNorm, RoPE (YaRN), mHC, torch-like top-k, MoE, the head,
 * and the per-query pieces of attention, the compressor and the indexer. See cpu_deepseek_v4_ops.h. */
#include "backend/cpu/cpu_deepseek_v4_ops.h"
#include "dist/dist.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scratch memory ---------------------------------------------------------------------------- */

di_v4_blk *di_v4_mark(const di_v4_ctx *cx) { return cx->top; }

void di_v4_release(di_v4_ctx *cx, di_v4_blk *m) {
  while (cx->top != m) {
    di_v4_blk *p = cx->top->prev;
    free(cx->top);
    cx->top = p;
  }
}

float *di_v4_alloc_f(di_v4_ctx *cx, size_t n) {
  di_v4_blk *b = calloc(1, sizeof(di_v4_blk) + n * sizeof(float) + 1);
  if (!b) {
    di_error_set(DI_ERR_OOM, "deepseek_v4: out of memory (%zu floats)", n);
    return NULL;
  }
  b->prev = cx->top;
  cx->top = b;
  return (float *)b->data;
}

/* ---- basic blocks ----------------------------------------------------------------------------- */

/* y[t][r] = sum_c W[r][c] x[t][c] for t < T; W is dequantized once per call. */
di_status di_v4_linear(di_v4_ctx *cx, const di_weight *W, const float *x, int T, float *y) {
  di_v4_blk *m = di_v4_mark(cx);
  const int64_t R = W->rows, C = W->cols;
  /* aligned float32 weights are read in place: a decode step would otherwise be dominated by the copy */
  const float *wf = W->data;
  if (W->dtype != DI_DT_F32 || (uintptr_t)W->data % _Alignof(float) != 0) {
    float *conv = di_v4_alloc_f(cx, (size_t)(R * C));
    if (!conv)
      return DI_ERR_OOM;
    di_weight_rows_f32(W, 0, R, conv);
    wf = conv;
  }
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * C;
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) { /* four rows at once for parallelism; each row still sums in order */
      const float *w0 = wf + (size_t)r * C, *w1 = w0 + C, *w2 = w1 + C, *w3 = w2 + C;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t k = 0; k < C; k++) {
        const double xk = xt[k];
        s0 += (double)w0[k] * xk;
        s1 += (double)w1[k] * xk;
        s2 += (double)w2[k] * xk;
        s3 += (double)w3[k] * xk;
      }
      y[(size_t)t * R + r] = (float)s0;
      y[(size_t)t * R + r + 1] = (float)s1;
      y[(size_t)t * R + r + 2] = (float)s2;
      y[(size_t)t * R + r + 3] = (float)s3;
    }
    for (; r < R; r++) {
      const float *wr = wf + (size_t)r * C;
      double s = 0;
      for (int64_t k = 0; k < C; k++)
        s += (double)wr[k] * xt[k];
      y[(size_t)t * R + r] = (float)s;
    }
  }
  di_v4_release(cx, m);
  return DI_OK;
}

/* In-place RMSNorm of n values; weight NULL means unweighted. */
void di_v4_rmsnorm(float *x, int n, const float *weight, double eps) {
  double ss = 0;
  for (int i = 0; i < n; i++)
    ss += (double)x[i] * x[i];
  const float r = (float)(1.0 / sqrt(ss / n + eps));
  for (int i = 0; i < n; i++)
    x[i] = weight ? weight[i] * (x[i] * r) : x[i] * r;
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- rotary embeddings ------------------------------------------------------------------------ */

/* Inverse frequencies as transformers computes them, in float32 (base^(2i/dim) with float operands),
 * so the angles at long positions round the same way. YaRN blends interpolated (/factor) and
 * extrapolated frequencies with a linear ramp over the truncated correction range; transformers
 * always truncates here (it reads `truncate` from the top level of rope_parameters, which V4's nested
 * form never has). */
static void rope_init(di_v4_rope_tab *rt, const di_v4_rope *p) {
  rt->p = p;
  const int half = p->dim / 2;
  const float base = (float)p->theta;
  double low = 0, high = 0;
  if (p->yarn) {
    const double lb = 2 * log(p->theta), omax = (double)p->original_max_pos;
    low = floor(p->dim * log(omax / (p->beta_fast * 2 * M_PI)) / lb);
    high = ceil(p->dim * log(omax / (p->beta_slow * 2 * M_PI)) / lb);
    if (low < 0)
      low = 0;
    if (high > p->dim - 1)
      high = p->dim - 1;
    if (low == high)
      high += 0.001;
  }
  for (int i = 0; i < half && i < 512; i++) {
    const float pos_freq = powf(base, (float)(2 * i) / (float)p->dim);
    const float extra = 1.0f / pos_freq;
    if (!p->yarn) {
      rt->inv_freq[i] = extra;
      continue;
    }
    const float inter = 1.0f / ((float)p->factor * pos_freq);
    float ramp = (float)(((double)i - low) / (high - low));
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    const float ef = 1.0f - ramp; /* weight of the extrapolated frequency */
    rt->inv_freq[i] = inter * (1.0f - ef) + extra * ef;
  }
}

/* Rotates the trailing rope dim channels of x[0..n) at `pos`: interleaved pairs (2i, 2i+1).
 * sign = -1 applies the inverse rotation. */
void di_v4_rope_apply(const di_v4_rope_tab *rt, float *x, int n, int pos, int sign) {
  const int d = rt->p->dim;
  float *r = x + (n - d);
  const float af = (float)rt->p->attention_factor;
  for (int i = 0; i < d / 2; i++) {
    const float f = (float)pos * rt->inv_freq[i];
    const float c = (float)cos((double)f) * af, s = sign * ((float)sin((double)f) * af);
    const float a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = a * c - b * s;
    r[2 * i + 1] = b * c + a * s;
  }
}

/* ---- manifold-constrained hyper-connections (mHC) ----------------------------------------------- */

/* Mixing weights of one token from its hc streams X[hc][D]: pre[hc] (collapse), post[hc] (where the
 * sublayer output goes) and comb[hc][hc] (stream mixer, Sinkhorn-projected towards doubly
 * stochastic). fn/base/scale are the layer's hc_attn_* or hc_ffn_* tensors; fnw is fn in f32. */
void di_v4_hc_weights(const di_v4_config *c, const float *fnw, const float *base, const float *scale, const float *X,
                      double *pre, double *post, double *comb) {
  const int hc = c->hc_mult, D = c->hidden_size, n = hc * D, mix = (2 + hc) * hc;
  double ss = 0;
  for (int i = 0; i < n; i++)
    ss += (double)X[i] * X[i];
  const double r = 1.0 / sqrt(ss / n + c->rms_eps);
  double mixes[64 * 66];
  for (int m = 0; m < mix; m++) {
    double s = 0;
    const float *f = fnw + (size_t)m * n;
    for (int i = 0; i < n; i++)
      s += (double)f[i] * X[i];
    mixes[m] = s * r;
  }
  const double eps = c->hc_eps;
  for (int j = 0; j < hc; j++) {
    pre[j] = sigmoid(mixes[j] * scale[0] + base[j]) + eps;
    post[j] = 2 * sigmoid(mixes[hc + j] * scale[1] + base[hc + j]);
  }
  /* comb: softmax along each row, then Sinkhorn. Note the order transformers uses: the first
   * normalisation after the softmax is over columns; each of the remaining iters-1 rounds normalises
   * rows then columns, and every division adds eps to the sum. */
  for (int j = 0; j < hc; j++) {
    double *row = comb + j * hc, mx = -INFINITY, sum = 0;
    for (int k = 0; k < hc; k++) {
      row[k] = mixes[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
      mx = row[k] > mx ? row[k] : mx;
    }
    for (int k = 0; k < hc; k++)
      sum += (row[k] = exp(row[k] - mx));
    for (int k = 0; k < hc; k++)
      row[k] = row[k] / sum + eps;
  }
  for (int it = 0; it < c->hc_sinkhorn_iters; it++) {
    if (it > 0)
      for (int j = 0; j < hc; j++) {
        double s = 0;
        for (int k = 0; k < hc; k++)
          s += comb[j * hc + k];
        for (int k = 0; k < hc; k++)
          comb[j * hc + k] /= s + eps;
      }
    for (int k = 0; k < hc; k++) {
      double s = 0;
      for (int j = 0; j < hc; j++)
        s += comb[j * hc + k];
      for (int j = 0; j < hc; j++)
        comb[j * hc + k] /= s + eps;
    }
  }
}

/* One residual site: collapse the streams with `pre`, run the sublayer (attention or FFN) on
 * RMSNorm(collapsed), then streams[k] = post[k]*out + sum_j comb[j][k]*streams[j]. comb is applied
 * transposed (the sum runs over its first index); Sinkhorn leaves it non-symmetric, so this matters. */
di_status di_v4_hc_site(di_v4_ctx *cx, int l, float *X, const di_weight *fn, const float *base, const float *scale, const float *norm,
                         di_v4_sublayer_fn sub) {
  const int T = cx->T, hc = cx->c->hc_mult, D = cx->c->hidden_size;
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(fnw, fn->rows * fn->cols);
  di_weight_rows_f32(fn, 0, fn->rows, fnw);
  DI_V4_ALLOC(in, (size_t)T * D);
  DI_V4_ALLOC(out, (size_t)T * D);
  double *post = malloc(sizeof(double) * (size_t)T * (hc + hc * hc));
  if (!post)
    return di_error_set(DI_ERR_OOM, "deepseek_v4: out of memory");
  double *comb = post + (size_t)T * hc;
  for (int t = 0; t < T; t++) {
    double pre[64];
    const float *Xt = X + (size_t)t * hc * D;
    di_v4_hc_weights(cx->c, fnw, base, scale, Xt, pre, post + (size_t)t * hc, comb + (size_t)t * hc * hc);
    float *it = in + (size_t)t * D;
    for (int d = 0; d < D; d++) {
      double s = 0;
      for (int j = 0; j < hc; j++)
        s += pre[j] * Xt[j * D + d];
      it[d] = (float)s;
    }
    di_v4_rmsnorm(it, D, norm, cx->c->rms_eps);
  }
  di_status st = sub(cx, l, in, out);
  if (st == DI_OK)
    for (int t = 0; t < T; t++) {
      float *Xt = X + (size_t)t * hc * D;
      const double *pt = post + (size_t)t * hc, *ct = comb + (size_t)t * hc * hc;
      float nx[64 * 8];
      for (int d0 = 0; d0 < D; d0 += 8) { /* 8 columns at a time: new values need the old streams */
        const int nd = D - d0 < 8 ? D - d0 : 8;
        for (int k = 0; k < hc; k++)
          for (int dd = 0; dd < nd; dd++) {
            double s = pt[k] * out[(size_t)t * D + d0 + dd];
            for (int j = 0; j < hc; j++)
              s += ct[j * hc + k] * Xt[j * D + d0 + dd];
            nx[k * 8 + dd] = (float)s;
          }
        for (int k = 0; k < hc; k++)
          for (int dd = 0; dd < nd; dd++)
            Xt[k * D + d0 + dd] = nx[k * 8 + dd];
      }
    }
  free(post);
  di_v4_release(cx, m);
  return st;
}

/* ---- top-k with torch's tie-breaking (the procedure: backend/v4_torch_select.h) ---------------------- */

/* Marks in `chosen` (n flags, cleared first) the k entries of v[0..n) torch.topk(v, k) returns. */
void di_v4_topk_like_torch(const float *v, int n, int k, di_v4_scored *work, unsigned char *chosen) {
  di_v4s_select(v, n, k, work);
  memset(chosen, 0, (size_t)n);
  for (int i = 0; i < k; i++)
    chosen[work[i].i] = 1;
}

/* ---- top-k with a fixed tie rule (the indexer) -------------------------------------------------------- */

/* value descending, then index ascending: a total order, so the sort's result is unique */
static int rank_order(const void *pa, const void *pb) {
  const di_v4_scored *a = pa, *b = pb;
  if (a->v != b->v) {
    if (a->v > b->v || b->v != b->v) /* a NaN ranks last */
      return -1;
    if (b->v > a->v || a->v != a->v)
      return 1;
  }
  return (a->i > b->i) - (a->i < b->i);
}

int di_v4_topk_earlier_first(const float *v, int n, int k, di_v4_scored *work, unsigned char *chosen) {
  if (k <= 0 || n <= 0)
    return 0;
  for (int i = 0; i < n; i++) {
    work[i].v = v[i];
    work[i].i = i;
  }
  if (k < n)
    qsort(work, (size_t)n, sizeof *work, rank_order);
  for (int i = 0; i < (k < n ? k : n); i++)
    chosen[work[i].i] = 1;
  return k < n && work[k - 1].v == work[k].v;
}

/* ---- mixture of experts --------------------------------------------------------------------------- */

/* SwiGLU with V4's clamp: the gate is clamped from above only, the up projection on both sides. */
static di_status swiglu(di_v4_ctx *cx, const di_weight *w1, const di_weight *w2, const di_weight *w3, const float *x, int T,
                        float *y) {
  const int I = (int)w1->rows;
  const float lim = (float)cx->c->swiglu_limit;
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(g, (size_t)T * I);
  DI_V4_ALLOC(u, (size_t)T * I);
  DI_TRY(di_v4_linear(cx, w1, x, T, g));
  DI_TRY(di_v4_linear(cx, w3, x, T, u));
  for (size_t i = 0; i < (size_t)T * I; i++) {
    const float gv = g[i] > lim ? lim : g[i];
    const float uv = u[i] > lim ? lim : u[i] < -lim ? -lim : u[i];
    g[i] = (float)(gv / (1.0 + exp(-(double)gv))) * uv;
  }
  DI_TRY(di_v4_linear(cx, w2, g, T, y));
  di_v4_release(cx, m);
  return DI_OK;
}

/* Router score of one logit: sqrt(softplus(x)) (softplus is x itself above 20, as in torch) or sigmoid. */
static double route_score(const di_v4_config *c, double x) {
  if (c->scoring == DI_V4_SCORE_SIGMOID)
    return sigmoid(x);
  const double sp = x > 20 ? x : log1p(exp(x));
  return sqrt(sp);
}

void di_v4_route(const di_v4_config *c, const float *logits, const float *bias, const int32_t *hash_ids, float *wt) {
  const int E = c->n_routed_experts, K = c->top_k;
  double sc[1024];
  int idx[1024];
  for (int e = 0; e < E; e++)
    sc[e] = (float)route_score(c, logits[e]);
  if (hash_ids) {
    for (int k = 0; k < K; k++)
      idx[k] = (int)hash_ids[k];
  } else {
    float biased[1024] = {0}; /* (all E written below; the initializer quiets -Wmaybe-uninitialized) */
    di_v4_scored work[1024];
    unsigned char taken[1024];
    for (int e = 0; e < E; e++)
      biased[e] = (float)sc[e] + bias[e];
    di_v4_topk_like_torch(biased, E, K, work, taken);
    for (int e = 0, k = 0; e < E; e++)
      if (taken[e])
        idx[k++] = e;
  }
  double sum = 0;
  for (int k = 0; k < K; k++)
    sum += sc[idx[k]];
  for (int k = 0; k < K; k++) /* a repeated id in tid2eid counts twice, as index_add does */
    wt[idx[k]] += (float)(sc[idx[k]] / (sum + 1e-20) * c->routed_scaling);
}

/* Routed experts plus the shared one. Hash layers take the experts from tid2eid[token] (the router
 * still weighs them); others take the top-k of score + correction bias. The chosen scores are
 * normalised to sum 1 (always: transformers ignores norm_topk_prob) and scaled by routed_scaling. */
di_status di_v4_moe(di_v4_ctx *cx, int l, const float *x, float *out) {
  const di_v4_config *c = cx->c;
  const di_v4_layer *L = &cx->w->layers[l];
  const int T = cx->T, D = c->hidden_size, E = c->n_routed_experts, K = c->top_k;
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(logits, (size_t)T * E);
  DI_TRY(di_v4_linear(cx, &L->router, x, T, logits));
  DI_V4_ALLOC(wt, (size_t)T * E); /* per token: the weight of each expert (0 when not chosen) */
  for (int t = 0; t < T; t++)
    di_v4_route(c, logits + (size_t)t * E, L->router_bias, L->tid2eid ? L->tid2eid + (size_t)cx->tokens[t] * K : NULL,
                wt + (size_t)t * E);
  DI_TRY(swiglu(cx, &L->sh_w1, &L->sh_w2, &L->sh_w3, x, T, out));
  if (di_dist_expert_parallel()) { /* routed experts on their ranks (cpu_deepseek_v4_ep.c) */
    di_status ep_st = di_v4_moe_ep(cx, l, x, wt, out, swiglu);
    if (ep_st != DI_OK && di_dist_comm() && di_comm_size(di_dist_comm()) > 1)
      di_dist_fail();
    di_v4_release(cx, m);
    return ep_st;
  }
  /* each expert runs over the tokens routed to it, gathered into one block */
  DI_V4_ALLOC(xs, (size_t)T * D);
  DI_V4_ALLOC(ys, (size_t)T * D);
  int *rows = malloc(sizeof(int) * (size_t)T);
  if (!rows)
    return di_error_set(DI_ERR_OOM, "deepseek_v4: out of memory");
  di_status st = DI_OK;
  for (int e = 0; e < E && st == DI_OK; e++) {
    int n = 0;
    for (int t = 0; t < T; t++)
      if (wt[(size_t)t * E + e] != 0)
        rows[n++] = t;
    if (!n)
      continue;
    for (int i = 0; i < n; i++)
      memcpy(xs + (size_t)i * D, x + (size_t)rows[i] * D, sizeof(float) * D);
    st = swiglu(cx, &L->exp_w1[e], &L->exp_w2[e], &L->exp_w3[e], xs, n, ys);
    for (int i = 0; st == DI_OK && i < n; i++)
      for (int d = 0; d < D; d++)
        out[(size_t)rows[i] * D + d] += wt[(size_t)rows[i] * E + e] * ys[(size_t)i * D + d];
  }
  free(rows);
  di_v4_release(cx, m);
  return st;
}

/* ---- embedding, layer stack and head ------------------------------------------------------------- */

di_status di_v4_layers(di_v4_ctx *cx, float *X, di_v4_sublayer_fn attention) {
  const di_v4_config *c = cx->c;
  di_v4_embed(cx, X);
  for (int l = 0; l < c->n_layers; l++) {
    const di_v4_layer *L = &cx->w->layers[l];
    DI_TRY(di_v4_hc_site(cx, l, X, &L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, L->attn_norm, attention));
    DI_TRY(di_v4_hc_site(cx, l, X, &L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, L->ffn_norm, di_v4_moe));
  }
  return DI_OK;
}

void di_v4_embed(di_v4_ctx *cx, float *X) {
  const int D = cx->c->hidden_size, hc = cx->c->hc_mult;
  for (int t = 0; t < cx->T; t++) {
    di_weight_rows_f32(&cx->w->embed, cx->tokens[t], cx->tokens[t] + 1, X + (size_t)t * hc * D);
    for (int j = 1; j < hc; j++)
      memcpy(X + ((size_t)t * hc + j) * D, X + (size_t)t * hc * D, sizeof(float) * D);
  }
}

/* Head: collapse the streams with sigmoid weights (no Sinkhorn), final norm, output projection. */
di_status di_v4_head(di_v4_ctx *cx, const float *X, float *logits) {
  const di_v4_config *c = cx->c;
  const di_v4_weights *w = cx->w;
  const int T = cx->T, D = c->hidden_size, hc = c->hc_mult;
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(fnw, (size_t)hc * hc * D);
  di_weight_rows_f32(&w->hc_head_fn, 0, hc, fnw);
  DI_V4_ALLOC(y, (size_t)T * D);
  for (int t = 0; t < T; t++) {
    const float *Xt = X + (size_t)t * hc * D;
    double ss = 0;
    for (int i = 0; i < hc * D; i++)
      ss += (double)Xt[i] * Xt[i];
    const double r = 1.0 / sqrt(ss / (hc * D) + c->rms_eps);
    double pre[64];
    for (int j = 0; j < hc; j++) {
      double mixv = 0;
      for (int i = 0; i < hc * D; i++)
        mixv += (double)fnw[(size_t)j * hc * D + i] * Xt[i];
      pre[j] = sigmoid(mixv * r * w->hc_head_scale[0] + w->hc_head_base[j]) + c->hc_eps;
    }
    for (int d = 0; d < D; d++) {
      double s = 0;
      for (int j = 0; j < hc; j++)
        s += pre[j] * Xt[j * D + d];
      y[(size_t)t * D + d] = (float)s;
    }
    di_v4_rmsnorm(y + (size_t)t * D, D, w->final_norm, c->rms_eps);
  }
  di_status st = di_v4_linear(cx, &w->head, y, T, logits);
  di_v4_release(cx, m);
  return st;
}

/* ---- attention pieces ---------------------------------------------------------------------------- */

/* q: q_a -> RMSNorm(q_norm) = q residual -> q_b -> unweighted RMSNorm per head -> rope. kv: wkv ->
 * RMSNorm(kv_norm) -> rope. Positions are absolute (pos0 + t). Sliding layers use the main rope,
 * CSA/HCA layers the compress rope. */
di_status di_v4_attn_inputs(di_v4_ctx *cx, int l, const float *a, const di_v4_rope_tab **rt_out, float **qr_out,
                            float **q_out, float **kv_out) {
  const di_v4_config *c = cx->c;
  const di_v4_layer *L = &cx->w->layers[l];
  const int T = cx->T, H = c->n_heads, hd = c->head_dim, ql = c->q_lora_rank;
  const di_v4_rope_tab *rt = c->attn_kind[l] == DI_V4_ATTN_SLIDING ? &cx->main_rope : &cx->compress_rope;
  DI_V4_ALLOC(qr, (size_t)T * ql);
  DI_V4_ALLOC(q, (size_t)T * H * hd);
  DI_V4_ALLOC(kv, (size_t)T * hd);
  *rt_out = rt;
  *qr_out = qr;
  *q_out = q;
  *kv_out = kv;
  DI_TRY(di_v4_linear(cx, &L->wq_a, a, T, qr));
  for (int t = 0; t < T; t++)
    di_v4_rmsnorm(qr + (size_t)t * ql, ql, L->q_norm, c->rms_eps);
  DI_TRY(di_v4_linear(cx, &L->wq_b, qr, T, q));
  DI_TRY(di_v4_linear(cx, &L->wkv, a, T, kv));
  for (int t = 0; t < T; t++) {
    for (int h = 0; h < H; h++) {
      float *qh = q + ((size_t)t * H + h) * hd;
      di_v4_rmsnorm(qh, hd, NULL, c->rms_eps);
      di_v4_rope_apply(rt, qh, hd, cx->pos0 + t, 1);
    }
    di_v4_rmsnorm(kv + (size_t)t * hd, hd, L->kv_norm, c->rms_eps);
    di_v4_rope_apply(rt, kv + (size_t)t * hd, hd, cx->pos0 + t, 1);
  }
  return DI_OK;
}

void di_v4_pool_window(const di_v4_ctx *cx, const di_v4_compressor *cp, int rate, int overlap, const float *prev_kv,
                       const float *prev_gate, const float *cur_kv, const float *cur_gate, int pos, float *out) {
  const int dim = cp->dim, wd = cp->width;
  for (int ch = 0; ch < dim; ch++) {
    /* slots: (row, channel) pairs, the previous window's Ca slots first */
    double g[2 * 1024], mx = -INFINITY, sum = 0, acc = 0;
    const float *kvp[2 * 1024];
    int ns = 0;
    if (overlap && prev_kv)
      for (int s = 0; s < rate; s++, ns++) {
        g[ns] = prev_gate[(size_t)s * wd + ch];
        kvp[ns] = prev_kv + (size_t)s * wd + ch;
      }
    for (int s = 0; s < rate; s++, ns++) {
      const int col = overlap ? dim + ch : ch;
      g[ns] = cur_gate[(size_t)s * wd + col];
      kvp[ns] = cur_kv + (size_t)s * wd + col;
    }
    for (int i = 0; i < ns; i++)
      mx = g[i] > mx ? g[i] : mx;
    for (int i = 0; i < ns; i++)
      sum += (g[i] = exp(g[i] - mx));
    for (int i = 0; i < ns; i++)
      acc += g[i] / sum * *kvp[i];
    out[ch] = (float)acc;
  }
  di_v4_rmsnorm(out, dim, cp->norm, cx->c->rms_eps);
  di_v4_rope_apply(&cx->compress_rope, out, dim, pos, 1);
}

void di_v4_index_scores(const di_v4_config *c, const float *qt, const float *hw, const float *K, int n, float *score) {
  const int nh = c->index_n_heads, di = c->index_head_dim;
  const double qk_scale = 1.0 / sqrt((double)di), w_scale = 1.0 / sqrt((double)nh);
  for (int s = 0; s < n; s++) {
    double sc = 0;
    for (int h = 0; h < nh; h++) {
      double d = 0;
      for (int k = 0; k < di; k++)
        d += (double)qt[h * di + k] * K[(size_t)s * di + k];
      sc += (d > 0 ? d * qk_scale : 0) * (hw[h] * w_scale);
    }
    score[s] = (float)sc;
  }
}

di_status di_v4_indexer_inputs(di_v4_ctx *cx, const di_v4_layer *L, const float *a, const float *qr, int n, float **q,
                               float **hw, float **score, di_v4_scored **work) {
  const di_v4_config *c = cx->c;
  const int T = cx->T, nh = c->index_n_heads;
  if (!(*q = di_v4_alloc_f(cx, (size_t)T * nh * c->index_head_dim)) || !(*hw = di_v4_alloc_f(cx, (size_t)T * nh)) ||
      !(*score = di_v4_alloc_f(cx, (size_t)n + 1)) || !(*work = (di_v4_scored *)di_v4_alloc_f(cx, 2 * (size_t)n + 2)))
    return DI_ERR_OOM;
  DI_TRY(di_v4_linear(cx, &L->idx_wq_b, qr, T, *q));
  return di_v4_linear(cx, &L->idx_weights, a, T, *hw);
}

void di_v4_index_pick(di_v4_ctx *cx, const float *qt, const float *hw, const float *K, int n, int valid, int nc, int pos,
                      float *score, di_v4_scored *work, unsigned char *sel) {
  const di_v4_config *c = cx->c;
  di_v4_index_scores(c, qt, hw, K, valid, score);
  if (!cx->torch_ties) {
    memset(sel, 0, (size_t)nc);
    if (di_v4_topk_earlier_first(score, valid, c->index_topk < valid ? c->index_topk : valid, work, sel)) {
      if (cx->boundary_ties++ == 0 || pos < cx->first_tie_pos) /* layers run one after another: keep the least */
        cx->first_tie_pos = pos;
    }
    return;
  }
  for (int s = valid; s < n; s++)
    score[s] = -INFINITY;
  if (n > 0)
    di_v4_topk_like_torch(score, n, c->index_topk < n ? c->index_topk : n, work, sel);
  for (int s = valid; s < nc; s++)
    sel[s] = 0;
}

void di_v4_attend(const di_v4_ctx *cx, const di_v4_layer *L, const di_v4_rope_tab *rt, const float *q_t, int pos,
                  const float *win, int n_win, const float *cmp, int n_cmp, const unsigned char *sel, float *p, double *ex, float *o_t) {
  const int H = cx->c->n_heads, hd = cx->c->head_dim;
  const double scale = 1.0 / sqrt((double)hd);
  for (int h = 0; h < H; h++) {
    const float *qh = q_t + (size_t)h * hd;
    double mx = L->sink[h];
    /* logits into p: window keys first, then compressed entries (-inf when not selected) */
    for (int i = 0; i < n_win + n_cmp; i++) {
      const float *k = i < n_win ? win + (size_t)i * hd : cmp + (size_t)(i - n_win) * hd;
      if (i >= n_win && sel && !sel[i - n_win]) {
        p[i] = -INFINITY;
        continue;
      }
      double d = 0;
      for (int e = 0; e < hd; e++)
        d += (double)qh[e] * k[e];
      p[i] = (float)(d * scale);
      mx = p[i] > mx ? p[i] : mx;
    }
    double sum = exp(L->sink[h] - mx);
    for (int i = 0; i < n_win + n_cmp; i++) {
      ex[i] = p[i] == -INFINITY ? 0 : exp(p[i] - mx); /* once per key, not per channel */
      sum += ex[i];
    }
    /* keys outer, channels inner: each channel still sums over the keys in order */
    double acc[1024];
    for (int e = 0; e < hd; e++)
      acc[e] = 0;
    for (int i = 0; i < n_win + n_cmp; i++) {
      if (p[i] == -INFINITY)
        continue;
      const float *v = i < n_win ? win + (size_t)i * hd : cmp + (size_t)(i - n_win) * hd;
      for (int e = 0; e < hd; e++)
        acc[e] += ex[i] * v[e];
    }
    float *oh = o_t + (size_t)h * hd;
    for (int e = 0; e < hd; e++)
      oh[e] = (float)(acc[e] / sum);
    di_v4_rope_apply(rt, oh, hd, pos, -1);
  }
}

/* Head outputs [H*hd] split into o_groups slices, each projected by its own o_lora_rank rows of
 * wo_a, then wo_b mixes the concatenation. */
di_status di_v4_attn_out(di_v4_ctx *cx, const di_v4_layer *L, const float *o, float *out) {
  const di_v4_config *c = cx->c;
  const int T = cx->T, H = c->n_heads, hd = c->head_dim;
  const int G = c->o_groups, R = c->o_lora_rank, gin = H * hd / G;
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(wa, (size_t)G * R * gin);
  di_weight_rows_f32(&L->wo_a, 0, (int64_t)G * R, wa);
  DI_V4_ALLOC(mid, (size_t)T * G * R);
  for (int t = 0; t < T; t++)
    for (int g = 0; g < G; g++) {
      const float *x = o + (size_t)t * H * hd + (size_t)g * gin;
      for (int r = 0; r < R; r++) {
        const float *wr = wa + ((size_t)g * R + r) * gin;
        double s = 0;
        for (int k = 0; k < gin; k++)
          s += (double)wr[k] * x[k];
        mid[((size_t)t * G + g) * R + r] = (float)s;
      }
    }
  di_status st = di_v4_linear(cx, &L->wo_b, mid, T, out);
  di_v4_release(cx, m);
  return st;
}

/* ---- setup ---------------------------------------------------------------------------------------- */

di_status di_v4_ctx_init(di_v4_ctx *cx, const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                         const char *who) {
  if (n < 1)
    return di_error_set(DI_ERR_INVALID_ARG, "%s: empty token sequence", who);
  for (int t = 0; t < n; t++)
    if (tokens[t] < 0 || tokens[t] >= cfg->vocab_size)
      return di_error_set(DI_ERR_INVALID_ARG, "%s: token %d at position %d is outside the vocabulary (%d)", who, tokens[t], t,
                          cfg->vocab_size);
  if (cfg->hc_mult > 64 || cfg->n_routed_experts > 1024 || cfg->rope_main.dim > 1024 || cfg->rope_compress.dim > 1024 ||
      cfg->csa_rate > 1024 || cfg->hca_rate > 1024 || cfg->head_dim > 1024)
    return di_error_set(DI_ERR_UNSUPPORTED, "%s: hc_mult > 64, > 1024 experts, rope dim > 1024, head_dim > 1024 or "
                                            "compress rate > 1024 are not supported",
                        who);
  memset(cx, 0, sizeof *cx);
  cx->first_tie_pos = -1;
  cx->c = cfg;
  cx->w = w;
  cx->tokens = tokens;
  cx->T = n;
  rope_init(&cx->main_rope, &cfg->rope_main);
  rope_init(&cx->compress_rope, &cfg->rope_compress);
  return DI_OK;
}
