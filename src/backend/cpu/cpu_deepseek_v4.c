/* DeepSeek-V4 reference forward on the CPU, float32 storage with double reductions, whole sequence at
 * once (no cache). Written for clarity: the blocks shared with the cached path (mHC, MoE, RoPE, linear
 * layers, per-query attention / pooling / scoring) are in cpu_deepseek_v4_ops.c; here are the
 * whole-sequence compressor, indexer and attention. Semantics follow transformers 5.17's
 * DeepseekV4ForCausalLM; where they are subtle, a comment says so. */
#include "backend/cpu/cpu_deepseek_v4.h"
#include "backend/cpu/cpu_deepseek_v4_ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- compressor -------------------------------------------------------------------------------- */

/* Compresses every complete window of `rate` tokens of `a` [T][D] into one entry of cp->dim
 * channels: per channel, a softmax over the window's slots of (gate + position bias) weighs the
 * slots' KV values. With `overlap` (CSA) each token projects two series, Ca (first dim channels) and
 * Cb (last dim): entry w pools window w-1's Ca slots with window w's Cb slots (2*rate slots; entry 0
 * has only its Cb slots). Then RMSNorm and the compress rope at the window's first position w*rate.
 * A trailing incomplete window is dropped (no cache holds it here). out: [T/rate][dim]. */
static di_status compress(di_v4_ctx *cx, const di_v4_compressor *cp, int rate, int overlap, const float *a, float *out) {
  const int T = cx->T, nw = T / rate, wd = cp->width;
  if (nw == 0)
    return DI_OK;
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(kv, (size_t)nw * rate * wd);
  DI_V4_ALLOC(gate, (size_t)nw * rate * wd);
  DI_TRY(di_v4_linear(cx, &cp->wkv, a, nw * rate, kv));
  DI_TRY(di_v4_linear(cx, &cp->wgate, a, nw * rate, gate));
  for (int t = 0; t < nw * rate; t++)
    for (int ch = 0; ch < wd; ch++)
      gate[(size_t)t * wd + ch] += cp->ape[(size_t)(t % rate) * wd + ch];
  for (int w = 0; w < nw; w++) {
    const size_t cur = (size_t)w * rate * wd, prev = (size_t)(w - 1) * rate * wd;
    di_v4_pool_window(cx, cp, rate, overlap, w > 0 ? kv + prev : NULL, w > 0 ? gate + prev : NULL, kv + cur, gate + cur,
                      w * rate, out + (size_t)w * cp->dim);
  }
  di_v4_release(cx, m);
  return DI_OK;
}

/* ---- lightning indexer (CSA) ---------------------------------------------------------------------- */

/* For every query t, marks in sel[t][nc] the compressed entries it attends: the index_topk best by
 * score(t, s) = sum_h w[t][h] * relu(q[t][h] . K[s]) / sqrt(index_head_dim) among the entries whose
 * window is complete at t (s < (t+1)/rate). Fewer candidates than index_topk: all of them. Exact
 * ties (common: every head's relu at 0) go to the earlier entry, or, with cx->torch_ties, are broken
 * as torch.topk breaks them in transformers' run (di_v4_index_pick): torch ranks all the entries that
 * exist in the call (the incomplete ones masked to -inf), nc here or chunk_end[t]/rate when the caller
 * models a chunked (cached) run, so its pick among tied entries depends on that count. */
static di_status indexer(di_v4_ctx *cx, const di_v4_layer *L, const float *a, const float *qr, int nc, unsigned char *sel) {
  const di_v4_config *c = cx->c;
  const int T = cx->T, nh = c->index_n_heads, di = c->index_head_dim, rate = c->csa_rate;
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(K, (size_t)nc * di + 1);
  DI_TRY(compress(cx, &L->icomp, rate, 1, a, K));
  float *q, *hw, *score;
  di_v4_scored *work;
  DI_TRY(di_v4_indexer_inputs(cx, L, a, qr, nc, &q, &hw, &score, &work));
  memset(sel, 0, (size_t)T * nc);
  for (int t = 0; t < T; t++) {
    int valid = (t + 1) / rate;
    if (valid > nc)
      valid = nc;
    int n_t = cx->torch_ties && cx->chunk_end ? cx->chunk_end[t] / rate : nc; /* entries that exist for this query */
    if (n_t > nc)
      n_t = nc;
    float *qt = q + (size_t)t * nh * di;
    for (int h = 0; h < nh; h++)
      di_v4_rope_apply(&cx->compress_rope, qt + h * di, di, t, 1);
    di_v4_index_pick(cx, qt, hw + (size_t)t * nh, K, n_t, valid, nc, t, score, work, sel + (size_t)t * nc);
  }
  di_v4_release(cx, m);
  return DI_OK;
}

/* ---- attention ------------------------------------------------------------------------------------ */

/* One attention block. A single K=V head (MQA) of head_dim with RoPE on its trailing channels; each
 * query sees the keys of its sliding window (t-W, t] plus, on CSA/HCA layers, compressed entries:
 * HCA every entry whose window is complete, CSA the indexer's picks. A per-head learned sink joins
 * the softmax with no value. Because V carries the rotation too, the output's rope channels are
 * rotated back by the query position before the grouped low-rank output projection. */
static di_status attention(di_v4_ctx *cx, int l, const float *a, float *out) {
  const di_v4_config *c = cx->c;
  const di_v4_layer *L = &cx->w->layers[l];
  const int T = cx->T, H = c->n_heads, hd = c->head_dim, kind = c->attn_kind[l];
  di_v4_blk *m = di_v4_mark(cx);
  const di_v4_rope_tab *rt;
  float *qr, *q, *kv;
  DI_TRY(di_v4_attn_inputs(cx, l, a, &rt, &qr, &q, &kv));
  /* compressed entries and which query may read which */
  int nc = 0, rate = 0;
  float *ckv = NULL;
  unsigned char *sel = NULL;
  if (kind != DI_V4_ATTN_SLIDING) {
    rate = kind == DI_V4_ATTN_CSA ? c->csa_rate : c->hca_rate;
    nc = T / rate;
    ckv = di_v4_alloc_f(cx, (size_t)nc * hd + 1);
    if (!ckv)
      return DI_ERR_OOM;
    DI_TRY(compress(cx, &L->comp, rate, kind == DI_V4_ATTN_CSA, a, ckv));
    if (kind == DI_V4_ATTN_CSA && nc > 0) {
      float *selbuf = di_v4_alloc_f(cx, ((size_t)T * nc + 3) / 4);
      if (!selbuf)
        return DI_ERR_OOM;
      sel = (unsigned char *)selbuf;
      DI_TRY(indexer(cx, L, a, qr, nc, sel));
    }
  }
  DI_V4_ALLOC(o, (size_t)T * H * hd);
  DI_V4_ALLOC(p, (size_t)T + nc + 1);
  DI_V4_ALLOC(ex, 2 * ((size_t)T + nc + 1));
  const int W = c->sliding_window;
  for (int t = 0; t < T; t++) {
    const int j0 = t - W + 1 > 0 ? t - W + 1 : 0;
    const int n_cmp = di_v4_visible_entries(kind, t, rate, nc);
    di_v4_attend(cx, L, rt, q + (size_t)t * H * hd, t, kv + (size_t)j0 * hd, t - j0 + 1, ckv, n_cmp,
                 sel ? sel + (size_t)t * nc : NULL, p, (double *)ex, o + (size_t)t * H * hd);
  }
  DI_TRY(di_v4_attn_out(cx, L, o, out));
  di_v4_release(cx, m);
  return DI_OK;
}

/* ---- the whole model ------------------------------------------------------------------------------- */

static di_status forward(di_v4_ctx *cx, float *logits) {
  const di_v4_config *c = cx->c;
  DI_V4_ALLOC(X, (size_t)cx->T * c->hc_mult * c->hidden_size); /* hc residual streams per token */
  DI_TRY(di_v4_layers(cx, X, attention));
  return logits ? di_v4_head(cx, X, logits) : DI_OK; /* NULL: only the tie report is wanted */
}

di_status di_cpu_v4_forward_with(const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                                 di_v4_ref_options *opt, float *logits_out) {
  di_v4_ctx cx;
  DI_TRY(di_v4_ctx_init(&cx, cfg, w, tokens, n, "deepseek_v4 reference"));
  const int *chunk_end = opt && opt->torch_ties ? opt->chunk_end : NULL;
  if (chunk_end)
    for (int t = 0; t < n; t++)
      if (chunk_end[t] <= t || chunk_end[t] > n || (t > 0 && chunk_end[t] < chunk_end[t - 1]))
        return di_error_set(DI_ERR_INVALID_ARG, "deepseek_v4 reference: chunk_end[%d] = %d is not a chunk end after %d", t,
                            chunk_end[t], t);
  cx.torch_ties = opt && opt->torch_ties;
  cx.chunk_end = chunk_end;
  di_status st = forward(&cx, logits_out);
  if (opt) {
    opt->boundary_ties = cx.boundary_ties;
    opt->first_tie_pos = cx.first_tie_pos;
  }
  di_v4_release(&cx, NULL);
  return st;
}

di_status di_cpu_v4_forward_full(const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                                 float *logits_out) {
  return di_cpu_v4_forward_with(cfg, w, tokens, n, NULL, logits_out);
}
