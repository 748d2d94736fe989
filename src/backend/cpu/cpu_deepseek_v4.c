/* DeepSeek-V4 reference forward on the CPU, float32 storage with double reductions, whole sequence at
 * once (no cache). Written for clarity: one static function per block of the architecture (mHC
 * mixing, attention per layer type, compressor, indexer, MoE with hash or learned routing, RoPE).
 * The semantics follow transformers 5.17's DeepseekV4ForCausalLM; where they are subtle, a comment says so. */
#include "backend/cpu/cpu_deepseek_v4.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scratch memory: a stack of blocks released back to a mark ---------------------------------- */

typedef struct blk {
  struct blk *prev;
  max_align_t data[];
} blk;

typedef struct rope_tab {
  const di_v4_rope *p;
  float inv_freq[512]; /* dim/2 entries */
} rope_tab;

typedef struct ctx {
  const di_v4_config *c;
  const di_v4_weights *w;
  const int32_t *tokens;
  int T;
  blk *top;
  rope_tab main_rope, compress_rope;
} ctx;

static blk *mark(const ctx *cx) { return cx->top; }

static void release(ctx *cx, blk *m) {
  while (cx->top != m) {
    blk *p = cx->top->prev;
    free(cx->top);
    cx->top = p;
  }
}

/* Zeroed float array of n elements, or NULL (error set) when memory runs out. */
static float *alloc_f(ctx *cx, size_t n) {
  blk *b = calloc(1, sizeof(blk) + n * sizeof(float) + 1);
  if (!b) {
    di_error_set(DI_ERR_OOM, "deepseek_v4 reference: out of memory (%zu floats)", n);
    return NULL;
  }
  b->prev = cx->top;
  cx->top = b;
  return (float *)b->data;
}

#define ALLOC(var, n)                 \
  float *var = alloc_f(cx, (size_t)(n)); \
  if (!var)                           \
    return DI_ERR_OOM;

/* ---- basic blocks ----------------------------------------------------------------------------- */

/* y[t][r] = sum_c W[r][c] x[t][c] for t < T; W is dequantized once per call. */
static di_status linear(ctx *cx, const di_weight *W, const float *x, int T, float *y) {
  blk *m = mark(cx);
  const int64_t R = W->rows, C = W->cols;
  ALLOC(wf, R * C);
  di_weight_rows_f32(W, 0, R, wf);
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * C;
    for (int64_t r = 0; r < R; r++) {
      const float *wr = wf + (size_t)r * C;
      double s = 0;
      for (int64_t k = 0; k < C; k++)
        s += (double)wr[k] * xt[k];
      y[(size_t)t * R + r] = (float)s;
    }
  }
  release(cx, m);
  return DI_OK;
}

/* In-place RMSNorm of n values; weight NULL means unweighted. */
static void rmsnorm(float *x, int n, const float *weight, double eps) {
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
static void rope_init(rope_tab *rt, const di_v4_rope *p) {
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
static void rope_apply(const rope_tab *rt, float *x, int n, int pos, int sign) {
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
static void hc_weights(const ctx *cx, const float *fnw, const float *base, const float *scale, const float *X, double *pre,
                       double *post, double *comb) {
  const int hc = cx->c->hc_mult, D = cx->c->hidden_size, n = hc * D, mix = (2 + hc) * hc;
  double ss = 0;
  for (int i = 0; i < n; i++)
    ss += (double)X[i] * X[i];
  const double r = 1.0 / sqrt(ss / n + cx->c->rms_eps);
  double mixes[64 * 66];
  for (int m = 0; m < mix; m++) {
    double s = 0;
    const float *f = fnw + (size_t)m * n;
    for (int i = 0; i < n; i++)
      s += (double)f[i] * X[i];
    mixes[m] = s * r;
  }
  const double eps = cx->c->hc_eps;
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
  for (int it = 0; it < cx->c->hc_sinkhorn_iters; it++) {
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
typedef di_status (*sublayer_fn)(ctx *cx, int l, const float *in, float *out);

static di_status hc_site(ctx *cx, int l, float *X, const di_weight *fn, const float *base, const float *scale, const float *norm,
                         sublayer_fn sub) {
  const int T = cx->T, hc = cx->c->hc_mult, D = cx->c->hidden_size;
  blk *m = mark(cx);
  ALLOC(fnw, fn->rows * fn->cols);
  di_weight_rows_f32(fn, 0, fn->rows, fnw);
  ALLOC(in, (size_t)T * D);
  ALLOC(out, (size_t)T * D);
  double *post = malloc(sizeof(double) * (size_t)T * (hc + hc * hc));
  if (!post)
    return di_error_set(DI_ERR_OOM, "deepseek_v4 reference: out of memory");
  double *comb = post + (size_t)T * hc;
  for (int t = 0; t < T; t++) {
    double pre[64];
    const float *Xt = X + (size_t)t * hc * D;
    hc_weights(cx, fnw, base, scale, Xt, pre, post + (size_t)t * hc, comb + (size_t)t * hc * hc);
    float *it = in + (size_t)t * D;
    for (int d = 0; d < D; d++) {
      double s = 0;
      for (int j = 0; j < hc; j++)
        s += pre[j] * Xt[j * D + d];
      it[d] = (float)s;
    }
    rmsnorm(it, D, norm, cx->c->rms_eps);
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
  release(cx, m);
  return st;
}

/* ---- compressor -------------------------------------------------------------------------------- */

/* Compresses every complete window of `rate` tokens of `a` [T][D] into one entry of cp->dim
 * channels: per channel, a softmax over the window's slots of (gate + position bias) weighs the
 * slots' KV values. With `overlap` (CSA) each token projects two series, Ca (first dim channels) and
 * Cb (last dim): entry w pools window w-1's Ca slots with window w's Cb slots (2*rate slots; entry 0
 * has only its Cb slots). Then RMSNorm and the compress rope at the window's first position w*rate.
 * A trailing incomplete window is dropped (no cache holds it here). out: [T/rate][dim]. */
static di_status compress(ctx *cx, const di_v4_compressor *cp, int rate, int overlap, const float *a, float *out) {
  const int T = cx->T, nw = T / rate, dim = cp->dim, wd = cp->width;
  if (nw == 0)
    return DI_OK;
  blk *m = mark(cx);
  ALLOC(kv, (size_t)nw * rate * wd);
  ALLOC(gate, (size_t)nw * rate * wd);
  DI_TRY(linear(cx, &cp->wkv, a, nw * rate, kv));
  DI_TRY(linear(cx, &cp->wgate, a, nw * rate, gate));
  for (int t = 0; t < nw * rate; t++)
    for (int ch = 0; ch < wd; ch++)
      gate[(size_t)t * wd + ch] += cp->ape[(size_t)(t % rate) * wd + ch];
  for (int w = 0; w < nw; w++) {
    float *o = out + (size_t)w * dim;
    for (int ch = 0; ch < dim; ch++) {
      /* slots: (token, channel) pairs */
      double g[2 * 1024], mx = -INFINITY, sum = 0, acc = 0;
      int tok[2 * 1024], col[2 * 1024], ns = 0;
      if (overlap && w > 0)
        for (int s = 0; s < rate; s++, ns++) {
          tok[ns] = (w - 1) * rate + s;
          col[ns] = ch;
        }
      for (int s = 0; s < rate; s++, ns++) {
        tok[ns] = w * rate + s;
        col[ns] = overlap ? dim + ch : ch;
      }
      for (int i = 0; i < ns; i++) {
        g[i] = gate[(size_t)tok[i] * wd + col[i]];
        mx = g[i] > mx ? g[i] : mx;
      }
      for (int i = 0; i < ns; i++)
        sum += (g[i] = exp(g[i] - mx));
      for (int i = 0; i < ns; i++)
        acc += g[i] / sum * kv[(size_t)tok[i] * wd + col[i]];
      o[ch] = (float)acc;
    }
    rmsnorm(o, dim, cp->norm, cx->c->rms_eps);
    rope_apply(&cx->compress_rope, o, dim, w * rate, 1);
  }
  release(cx, m);
  return DI_OK;
}

/* ---- top-k with torch's tie-breaking ----------------------------------------------------------------- */

/* Which of several equal scores torch.topk keeps is an artefact of its CPU algorithm, and the indexer
 * meets exact ties often (a score is exactly 0 whenever relu zeroes every head). To select the same
 * entries we run the same selection procedure on (value, index) pairs: with k*64 <= n a heap select
 * of the first k, otherwise an introselect (median-of-three quickselect, insertion sort below four
 * elements, heap select when the depth budget 2*floor(log2 n) runs out), ordering by value only.
 * Checked against torch.topk on thousands of tie-heavy random rows by tests/data/tools/v4_topk_ties.py. */
typedef struct {
  float v;
  int i;
} scored;

static int before(const scored *x, const scored *y) { return x->v > y->v; }
static void swap_sc(scored *a, scored *b) {
  scored t = *a;
  *a = *b;
  *b = t;
}

/* Sifts `val` into the max-first heap a[0..len) from the hole at `hole`: down to a leaf, then up. */
static void heap_adjust(scored *a, long hole, long len, scored val) {
  const long top = hole;
  long child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (before(&a[child], &a[child - 1]))
      child--;
    a[hole] = a[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    a[hole] = a[child - 1];
    hole = child - 1;
  }
  long parent = (hole - 1) / 2;
  while (hole > top && before(&a[parent], &val)) {
    a[hole] = a[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  a[hole] = val;
}

/* Leaves in a[0..k) the k best of a[0..n): a heap of the first k whose worst is replaced by any better later element. */
static void heap_select(scored *a, long k, long n) {
  if (k >= 2)
    for (long parent = (k - 2) / 2;; parent--) {
      heap_adjust(a, parent, k, a[parent]);
      if (parent == 0)
        break;
    }
  for (long i = k; i < n; i++)
    if (before(&a[i], &a[0])) {
      scored v = a[i];
      a[i] = a[0];
      heap_adjust(a, 0, k, v);
    }
}

static void insertion_sort(scored *a, long n) {
  for (long i = 1; i < n; i++) {
    scored v = a[i];
    if (before(&v, &a[0])) {
      memmove(a + 1, a, sizeof(scored) * (size_t)i);
      a[0] = v;
    } else {
      long j = i;
      while (before(&v, &a[j - 1])) {
        a[j] = a[j - 1];
        j--;
      }
      a[j] = v;
    }
  }
}

/* Puts the element of rank `nth` at a[nth], better ones before it, worse ones after. */
static void introselect(scored *a, long nth, long n) {
  long lo = 0, hi = n, depth = 0;
  for (long m = n; m > 1; m >>= 1)
    depth += 2;
  while (hi - lo > 3) {
    if (depth-- == 0) {
      heap_select(a + lo, nth - lo + 1, hi - lo);
      swap_sc(&a[lo], &a[nth]);
      return;
    }
    /* median of a[lo+1], a[mid], a[hi-1] moved to a[lo] as the pivot */
    scored *x = &a[lo + 1], *y = &a[lo + (hi - lo) / 2], *z = &a[hi - 1], *med;
    if (before(x, y))
      med = before(y, z) ? y : before(x, z) ? z : x;
    else
      med = before(x, z) ? x : before(y, z) ? z : y;
    swap_sc(&a[lo], med);
    long f = lo + 1, l = hi;
    for (;;) {
      while (before(&a[f], &a[lo]))
        f++;
      l--;
      while (before(&a[lo], &a[l]))
        l--;
      if (f >= l)
        break;
      swap_sc(&a[f], &a[l]);
      f++;
    }
    if (f <= nth)
      lo = f;
    else
      hi = f;
  }
  insertion_sort(a + lo, hi - lo);
}

/* Marks in `chosen` (n flags, cleared first) the k entries of v[0..n) torch.topk(v, k) returns. */
static void topk_like_torch(const float *v, int n, int k, scored *work, unsigned char *chosen) {
  for (int i = 0; i < n; i++) {
    work[i].v = v[i];
    work[i].i = i;
  }
  if ((long)k * 64 <= n)
    heap_select(work, k, n);
  else
    introselect(work, k - 1, n);
  memset(chosen, 0, (size_t)n);
  for (int i = 0; i < k; i++)
    chosen[work[i].i] = 1;
}

/* ---- lightning indexer (CSA) ---------------------------------------------------------------------- */

/* For every query t, marks in sel[t][nc] the compressed entries it attends: the index_topk best by
 * score(t, s) = sum_h w[t][h] * relu(q[t][h] . K[s]) / sqrt(index_head_dim) among the entries whose
 * window is complete at t (s < (t+1)/rate). Fewer candidates than index_topk: all of them. Exact
 * ties (common: every head's relu at 0) are broken as torch.topk breaks them (topk_like_torch). */
static di_status indexer(ctx *cx, const di_v4_layer *L, const float *a, const float *qr, int nc, unsigned char *sel) {
  const di_v4_config *c = cx->c;
  const int T = cx->T, nh = c->index_n_heads, di = c->index_head_dim, rate = c->csa_rate;
  blk *m = mark(cx);
  ALLOC(K, (size_t)nc * di + 1);
  DI_TRY(compress(cx, &L->icomp, rate, 1, a, K));
  ALLOC(q, (size_t)T * nh * di);
  DI_TRY(linear(cx, &L->idx_wq_b, qr, T, q));
  ALLOC(hw, (size_t)T * nh);
  DI_TRY(linear(cx, &L->idx_weights, a, T, hw));
  ALLOC(score, (size_t)nc + 1);
  scored *work = (scored *)alloc_f(cx, 2 * (size_t)nc + 2);
  if (!work)
    return DI_ERR_OOM;
  const double qk_scale = 1.0 / sqrt((double)di), w_scale = 1.0 / sqrt((double)nh);
  memset(sel, 0, (size_t)T * nc);
  for (int t = 0; t < T; t++) {
    int valid = (t + 1) / rate;
    if (valid > nc)
      valid = nc;
    float *qt = q + (size_t)t * nh * di;
    for (int h = 0; h < nh; h++)
      rope_apply(&cx->compress_rope, qt + h * di, di, t, 1);
    for (int s = 0; s < valid; s++) {
      double sc = 0;
      for (int h = 0; h < nh; h++) {
        double d = 0;
        for (int k = 0; k < di; k++)
          d += (double)qt[h * di + k] * K[(size_t)s * di + k];
        sc += (d > 0 ? d * qk_scale : 0) * (hw[(size_t)t * nh + h] * w_scale);
      }
      score[s] = (float)sc;
    }
    /* torch takes the top min(index_topk, nc) of all nc entries, the incomplete ones at -inf, then
     * drops picks that are not complete; so the kept set is the top-k of the complete entries */
    for (int s = valid; s < nc; s++)
      score[s] = -INFINITY;
    unsigned char *st = sel + (size_t)t * nc;
    topk_like_torch(score, nc, c->index_topk < nc ? c->index_topk : nc, work, st);
    for (int s = valid; s < nc; s++)
      st[s] = 0;
  }
  release(cx, m);
  return DI_OK;
}

/* ---- attention ------------------------------------------------------------------------------------ */

/* One attention block. A single K=V head (MQA) of head_dim with RoPE on its trailing channels; each
 * query sees the keys of its sliding window (t-W, t] plus, on CSA/HCA layers, compressed entries:
 * HCA every entry whose window is complete, CSA the indexer's picks. A per-head learned sink joins
 * the softmax with no value. Because V carries the rotation too, the output's rope channels are
 * rotated back by the query position before the grouped low-rank output projection. */
static di_status attention(ctx *cx, int l, const float *a, float *out) {
  const di_v4_config *c = cx->c;
  const di_v4_layer *L = &cx->w->layers[l];
  const int T = cx->T, H = c->n_heads, hd = c->head_dim, ql = c->q_lora_rank, kind = c->attn_kind[l];
  const rope_tab *rt = kind == DI_V4_ATTN_SLIDING ? &cx->main_rope : &cx->compress_rope;
  blk *m = mark(cx);
  ALLOC(qr, (size_t)T * ql);
  DI_TRY(linear(cx, &L->wq_a, a, T, qr));
  for (int t = 0; t < T; t++)
    rmsnorm(qr + (size_t)t * ql, ql, L->q_norm, c->rms_eps);
  ALLOC(q, (size_t)T * H * hd);
  DI_TRY(linear(cx, &L->wq_b, qr, T, q));
  ALLOC(kv, (size_t)T * hd);
  DI_TRY(linear(cx, &L->wkv, a, T, kv));
  for (int t = 0; t < T; t++) {
    for (int h = 0; h < H; h++) {
      float *qh = q + ((size_t)t * H + h) * hd;
      rmsnorm(qh, hd, NULL, c->rms_eps);
      rope_apply(rt, qh, hd, t, 1);
    }
    rmsnorm(kv + (size_t)t * hd, hd, L->kv_norm, c->rms_eps);
    rope_apply(rt, kv + (size_t)t * hd, hd, t, 1);
  }
  /* compressed entries and which query may read which */
  int nc = 0, rate = 0;
  float *ckv = NULL;
  unsigned char *sel = NULL;
  if (kind != DI_V4_ATTN_SLIDING) {
    rate = kind == DI_V4_ATTN_CSA ? c->csa_rate : c->hca_rate;
    nc = T / rate;
    ckv = alloc_f(cx, (size_t)nc * hd + 1);
    if (!ckv)
      return DI_ERR_OOM;
    DI_TRY(compress(cx, &L->comp, rate, kind == DI_V4_ATTN_CSA, a, ckv));
    if (kind == DI_V4_ATTN_CSA && nc > 0) {
      float *selbuf = alloc_f(cx, ((size_t)T * nc + 3) / 4);
      if (!selbuf)
        return DI_ERR_OOM;
      sel = (unsigned char *)selbuf;
      DI_TRY(indexer(cx, L, a, qr, nc, sel));
    }
  }
  ALLOC(o, (size_t)T * H * hd);
  ALLOC(p, (size_t)T + nc + 1);
  const double scale = 1.0 / sqrt((double)hd);
  const int W = c->sliding_window;
  for (int t = 0; t < T; t++) {
    const int j0 = t - W + 1 > 0 ? t - W + 1 : 0;
    const int n_win = t - j0 + 1;
    int n_cmp = 0; /* HCA: entries [0, n_cmp) */
    if (kind == DI_V4_ATTN_HCA) {
      n_cmp = (t + 1) / rate;
      if (n_cmp > nc)
        n_cmp = nc;
    } else if (kind == DI_V4_ATTN_CSA) {
      n_cmp = nc;
    }
    for (int h = 0; h < H; h++) {
      const float *qh = q + ((size_t)t * H + h) * hd;
      double mx = L->sink[h];
      /* logits into p: window keys first, then compressed entries (-inf when not selected) */
      for (int i = 0; i < n_win + n_cmp; i++) {
        const float *k = i < n_win ? kv + (size_t)(j0 + i) * hd : ckv + (size_t)(i - n_win) * hd;
        if (i >= n_win && sel && !sel[(size_t)t * nc + (i - n_win)]) {
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
      for (int i = 0; i < n_win + n_cmp; i++)
        sum += p[i] == -INFINITY ? 0 : exp(p[i] - mx);
      float *oh = o + ((size_t)t * H + h) * hd;
      for (int e = 0; e < hd; e++) {
        double acc = 0;
        for (int i = 0; i < n_win + n_cmp; i++) {
          if (p[i] == -INFINITY)
            continue;
          const float *v = i < n_win ? kv + (size_t)(j0 + i) * hd : ckv + (size_t)(i - n_win) * hd;
          acc += exp(p[i] - mx) * v[e];
        }
        oh[e] = (float)(acc / sum);
      }
      rope_apply(rt, oh, hd, t, -1);
    }
  }
  /* grouped output: head outputs [H*hd] split into o_groups slices, each projected by its own
   * o_lora_rank rows of wo_a, then wo_b mixes the concatenation */
  const int G = c->o_groups, R = c->o_lora_rank, gin = H * hd / G;
  ALLOC(wa, (size_t)G * R * gin);
  di_weight_rows_f32(&L->wo_a, 0, (int64_t)G * R, wa);
  ALLOC(mid, (size_t)T * G * R);
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
  DI_TRY(linear(cx, &L->wo_b, mid, T, out));
  release(cx, m);
  return DI_OK;
}

/* ---- mixture of experts --------------------------------------------------------------------------- */

/* SwiGLU with V4's clamp: the gate is clamped from above only, the up projection on both sides. */
static di_status swiglu(ctx *cx, const di_weight *w1, const di_weight *w2, const di_weight *w3, const float *x, int T,
                        float *y) {
  const int I = (int)w1->rows;
  const float lim = (float)cx->c->swiglu_limit;
  blk *m = mark(cx);
  ALLOC(g, (size_t)T * I);
  ALLOC(u, (size_t)T * I);
  DI_TRY(linear(cx, w1, x, T, g));
  DI_TRY(linear(cx, w3, x, T, u));
  for (size_t i = 0; i < (size_t)T * I; i++) {
    const float gv = g[i] > lim ? lim : g[i];
    const float uv = u[i] > lim ? lim : u[i] < -lim ? -lim : u[i];
    g[i] = (float)(gv / (1.0 + exp(-(double)gv))) * uv;
  }
  DI_TRY(linear(cx, w2, g, T, y));
  release(cx, m);
  return DI_OK;
}

/* Router score of one logit: sqrt(softplus(x)) (softplus is x itself above 20, as in torch) or sigmoid. */
static double route_score(const di_v4_config *c, double x) {
  if (c->scoring == DI_V4_SCORE_SIGMOID)
    return sigmoid(x);
  const double sp = x > 20 ? x : log1p(exp(x));
  return sqrt(sp);
}

/* Routed experts plus the shared one. Hash layers take the experts from tid2eid[token] (the router
 * still weighs them); others take the top-k of score + correction bias. The chosen scores are
 * normalised to sum 1 (always: transformers ignores norm_topk_prob) and scaled by routed_scaling. */
static di_status moe(ctx *cx, int l, const float *x, float *out) {
  const di_v4_config *c = cx->c;
  const di_v4_layer *L = &cx->w->layers[l];
  const int T = cx->T, D = c->hidden_size, E = c->n_routed_experts, K = c->top_k;
  blk *m = mark(cx);
  ALLOC(logits, (size_t)T * E);
  DI_TRY(linear(cx, &L->router, x, T, logits));
  ALLOC(wt, (size_t)T * E); /* per token: the weight of each expert (0 when not chosen) */
  for (int t = 0; t < T; t++) {
    double sc[1024];
    int idx[1024];
    for (int e = 0; e < E; e++)
      sc[e] = (float)route_score(c, logits[(size_t)t * E + e]);
    if (L->tid2eid) {
      for (int k = 0; k < K; k++)
        idx[k] = L->tid2eid[(size_t)cx->tokens[t] * K + k];
    } else {
      float biased[1024];
      scored work[1024];
      unsigned char taken[1024];
      for (int e = 0; e < E; e++)
        biased[e] = (float)sc[e] + L->router_bias[e];
      topk_like_torch(biased, E, K, work, taken);
      for (int e = 0, k = 0; e < E; e++)
        if (taken[e])
          idx[k++] = e;
    }
    double sum = 0;
    for (int k = 0; k < K; k++)
      sum += sc[idx[k]];
    for (int k = 0; k < K; k++) /* a repeated id in tid2eid counts twice, as index_add does */
      wt[(size_t)t * E + idx[k]] += (float)(sc[idx[k]] / (sum + 1e-20) * c->routed_scaling);
  }
  DI_TRY(swiglu(cx, &L->sh_w1, &L->sh_w2, &L->sh_w3, x, T, out));
  /* each expert runs over the tokens routed to it, gathered into one block */
  ALLOC(xs, (size_t)T * D);
  ALLOC(ys, (size_t)T * D);
  int *rows = malloc(sizeof(int) * (size_t)T);
  if (!rows)
    return di_error_set(DI_ERR_OOM, "deepseek_v4 reference: out of memory");
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
  release(cx, m);
  return st;
}

/* ---- the whole model ------------------------------------------------------------------------------- */

static di_status forward(ctx *cx, float *logits) {
  const di_v4_config *c = cx->c;
  const di_v4_weights *w = cx->w;
  const int T = cx->T, D = c->hidden_size, hc = c->hc_mult;
  ALLOC(X, (size_t)T * hc * D); /* hc residual streams per token, all starting as the embedding */
  for (int t = 0; t < T; t++) {
    di_weight_rows_f32(&w->embed, cx->tokens[t], cx->tokens[t] + 1, X + (size_t)t * hc * D);
    for (int j = 1; j < hc; j++)
      memcpy(X + ((size_t)t * hc + j) * D, X + (size_t)t * hc * D, sizeof(float) * D);
  }
  for (int l = 0; l < c->n_layers; l++) {
    const di_v4_layer *L = &w->layers[l];
    DI_TRY(hc_site(cx, l, X, &L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, L->attn_norm, attention));
    DI_TRY(hc_site(cx, l, X, &L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, L->ffn_norm, moe));
  }
  /* head: collapse the streams with sigmoid weights (no Sinkhorn), final norm, output projection */
  ALLOC(fnw, (size_t)hc * hc * D);
  di_weight_rows_f32(&w->hc_head_fn, 0, hc, fnw);
  ALLOC(y, (size_t)T * D);
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
    rmsnorm(y + (size_t)t * D, D, w->final_norm, c->rms_eps);
  }
  return linear(cx, &w->head, y, T, logits);
}

di_status di_cpu_v4_forward_full(const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                                 float *logits_out) {
  if (n < 1)
    return di_error_set(DI_ERR_INVALID_ARG, "deepseek_v4 reference: empty token sequence");
  for (int t = 0; t < n; t++)
    if (tokens[t] < 0 || tokens[t] >= cfg->vocab_size)
      return di_error_set(DI_ERR_INVALID_ARG, "deepseek_v4 reference: token %d at position %d is outside the vocabulary (%d)",
                          tokens[t], t, cfg->vocab_size);
  if (cfg->hc_mult > 64 || cfg->n_routed_experts > 1024 || cfg->rope_main.dim > 1024 || cfg->rope_compress.dim > 1024 ||
      cfg->csa_rate > 1024 || cfg->hca_rate > 1024)
    return di_error_set(DI_ERR_UNSUPPORTED, "deepseek_v4 reference: hc_mult > 64, > 1024 experts, rope dim > 1024 or "
                                            "compress rate > 1024 are not supported");
  ctx cx = {.c = cfg, .w = w, .tokens = tokens, .T = n};
  rope_init(&cx.main_rope, &cfg->rope_main);
  rope_init(&cx.compress_rope, &cfg->rope_compress);
  di_status st = forward(&cx, logits_out);
  release(&cx, NULL);
  return st;
}
