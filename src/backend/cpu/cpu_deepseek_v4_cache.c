/* DeepSeek-V4 cached forward on the CPU: the per-sequence state (window ring, compressed entries,
 * indexer keys, compressors' pending windows) and the step that appends a chunk of tokens. Shares its
 * arithmetic with the reference forward (cpu_deepseek_v4_ops.c), so the logits are bit-identical to
 * di_cpu_v4_forward_chunked; only what is cached differs. Mirrors transformers' DeepseekV4 cache layers. */
#include "backend/cpu/cpu_deepseek_v4_cache.h"
#include "backend/cpu/cpu_deepseek_v4_ops.h"
#include "backend/cpu/cpu_deepseek_v4_pages.h"
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WHO "deepseek_v4 cached step"

/* One compressor's running state (CSA main / CSA indexer / HCA). */
typedef struct comp_state {
  int dim, width, rate, overlap;
  float *pend_kv, *pend_gate; /* [rate][width]: rows of the incomplete window; gate has the position bias added */
  int n_pend;                 /* == positions % rate */
  float *prev_kv, *prev_gate; /* overlap only, [rate][width]: the last complete window (its Ca half joins the next entry) */
  float *ent;                 /* [cap][dim]: the entries so far, normed and roped at their first position
                                 (paged states: in the engine's blocks instead, see comp_entry) */
  int n_ent, cap;
  int skip_below;             /* bounded replay: entries below this exist in the cache (not pooled again) */
  int kind, lidx;             /* paged: DI_V4_G_CSA / _INDEX / _HCA and the layer's index among its kind */
  size_t snap_off;            /* paged: float offset of this compressor's snapshot in a state block */
} comp_state;

typedef struct layer_state {
  int kind;
  float *ring;                /* [ring_cap][head_dim]: K=V of position p at slot p % ring_cap */
  comp_state comp, icomp;     /* comp: CSA / HCA; icomp: CSA's indexer */
} layer_state;

struct di_v4_seq_state {
  int n_layers, head_dim, window, ring_cap, csa_rate, hca_rate, index_head_dim;
  uint8_t attn_kind[DI_V4_MAX_LAYERS];
  int64_t n_pos;
  /* bounded replay (paged): window rows exist from win_start on; positions below replay_until are
   * replayed only to rebuild the window and the open compressor windows (no snapshot, no entry) */
  int64_t win_start, replay_until;
  int broken;                 /* a step failed midway: the state is inconsistent until reset */
  int paged;                  /* window rows and entries live in the engine's blocks (pg, per step) */
  const di_v4_pages *pg;      /* paged: the sequence's blocks during a step, else NULL */
  layer_state *layers;
};

/* ---- state ------------------------------------------------------------------------------------- */

static di_status comp_init(comp_state *cs, int dim, int rate, int overlap) {
  cs->dim = dim;
  cs->rate = rate;
  cs->overlap = overlap;
  cs->width = overlap ? 2 * dim : dim;
  const size_t rows = (size_t)rate * cs->width;
  cs->pend_kv = calloc(rows * (overlap ? 4 : 2), sizeof(float));
  if (!cs->pend_kv)
    return di_error_set(DI_ERR_OOM, WHO ": out of memory for the compressor state");
  cs->pend_gate = cs->pend_kv + rows;
  if (overlap) {
    cs->prev_kv = cs->pend_gate + rows;
    cs->prev_gate = cs->prev_kv + rows;
  }
  return DI_OK;
}

/* pend_kv is the base of the one allocation (prev/pend pointers swap, so remember the lowest). */
static void comp_free(comp_state *cs) {
  float *base = cs->pend_kv;
  if (cs->overlap && cs->prev_kv < base)
    base = cs->prev_kv;
  free(base);
  free(cs->ent);
}

static size_t comp_fixed_floats(const comp_state *cs) { return (size_t)cs->rate * cs->width * (cs->overlap ? 4 : 2); }

static size_t comp_bytes(const comp_state *cs, int paged) {
  if (!cs->rate)
    return 0;
  return sizeof(float) * (comp_fixed_floats(cs) + (paged ? 0 : (size_t)cs->n_ent * cs->dim));
}

/* Where entry e of a compressor is: its own array, or the engine's block of the window it closes. */
static float *comp_entry(const di_v4_seq_state *s, const comp_state *cs, int e) {
  if (!s->pg)
    return cs->ent + (size_t)e * cs->dim;
  return di_v4_entry(s->pg, cs->kind, cs->lidx, cs->rate, cs->dim, e);
}

/* The open windows at a block's end into / out of its snapshot: [prev kv][prev gate] (CSA only),
 * then [pending kv][pending gate], rate x width floats each (rows past n_pend are stale, unused). */
static void comp_snapshot(const comp_state *cs, float *dst) {
  const size_t rows = (size_t)cs->rate * cs->width * sizeof(float);
  if (cs->overlap) {
    memcpy(dst, cs->prev_kv, rows);
    memcpy((char *)dst + rows, cs->prev_gate, rows);
    dst = (float *)((char *)dst + 2 * rows);
  }
  memcpy(dst, cs->pend_kv, rows);
  memcpy((char *)dst + rows, cs->pend_gate, rows);
}

static void comp_restore(comp_state *cs, const float *src, int64_t pos) {
  const size_t rows = (size_t)cs->rate * cs->width * sizeof(float);
  if (cs->overlap) {
    memcpy(cs->prev_kv, src, rows);
    memcpy(cs->prev_gate, (const char *)src + rows, rows);
    src = (const float *)((const char *)src + 2 * rows);
  }
  memcpy(cs->pend_kv, src, rows);
  memcpy(cs->pend_gate, (const char *)src + rows, rows);
  cs->n_pend = (int)(pos % cs->rate);
  cs->n_ent = (int)(pos / cs->rate);
}

void di_v4_seq_state_free(di_v4_seq_state *s) {
  if (!s)
    return;
  if (s->layers)
    for (int l = 0; l < s->n_layers; l++) {
      free(s->layers[l].ring);
      comp_free(&s->layers[l].comp);
      comp_free(&s->layers[l].icomp);
    }
  free(s->layers);
  free(s);
}

static di_status state_create(const di_v4_config *cfg, int paged, di_v4_seq_state **out) {
  if (!cfg || !out)
    return di_error_set(DI_ERR_INVALID_ARG, "deepseek_v4 state: NULL config or output pointer");
  *out = NULL;
  if (cfg->n_layers < 1 || cfg->n_layers > DI_V4_MAX_LAYERS || cfg->sliding_window < 1 || cfg->head_dim < 1 ||
      cfg->csa_rate < 1 || cfg->hca_rate < 1 || cfg->csa_rate > 1024 || cfg->hca_rate > 1024)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "deepseek_v4 state: unusable config (layers %d, sliding_window %d, head_dim %d, rates %d/%d)",
                        cfg->n_layers, cfg->sliding_window, cfg->head_dim, cfg->csa_rate, cfg->hca_rate);
  di_v4_seq_state *s = calloc(1, sizeof *s);
  if (!s)
    return di_error_set(DI_ERR_OOM, "deepseek_v4 state: out of memory");
  s->n_layers = cfg->n_layers;
  s->head_dim = cfg->head_dim;
  s->window = cfg->sliding_window;
  s->ring_cap = cfg->sliding_window - 1;
  s->csa_rate = cfg->csa_rate;
  s->hca_rate = cfg->hca_rate;
  s->index_head_dim = cfg->index_head_dim;
  memcpy(s->attn_kind, cfg->attn_kind, sizeof s->attn_kind);
  s->paged = paged;
  di_v4_layout lay;
  di_v4_layout_init(cfg, &lay);
  s->layers = calloc((size_t)cfg->n_layers, sizeof *s->layers);
  if (!s->layers) {
    free(s);
    return di_error_set(DI_ERR_OOM, "deepseek_v4 state: out of memory");
  }
  di_status st = DI_OK;
  for (int l = 0; l < cfg->n_layers && st == DI_OK; l++) {
    layer_state *ls = &s->layers[l];
    ls->kind = cfg->attn_kind[l];
    if (!paged && s->ring_cap > 0 && !(ls->ring = calloc((size_t)s->ring_cap * cfg->head_dim, sizeof(float))))
      st = di_error_set(DI_ERR_OOM, "deepseek_v4 state: out of memory for the window of layer %d", l);
    else if (ls->kind == DI_V4_ATTN_HCA) {
      st = comp_init(&ls->comp, cfg->head_dim, cfg->hca_rate, 0);
      ls->comp.kind = DI_V4_G_HCA;
    } else if (ls->kind == DI_V4_ATTN_CSA) {
      st = comp_init(&ls->comp, cfg->head_dim, cfg->csa_rate, 1);
      if (st == DI_OK)
        st = comp_init(&ls->icomp, cfg->index_head_dim, cfg->csa_rate, 1);
      ls->comp.kind = DI_V4_G_CSA;
      ls->icomp.kind = DI_V4_G_INDEX;
    }
    ls->comp.lidx = ls->icomp.lidx = lay.lidx[l];
    ls->comp.snap_off = lay.snap_off[l];
    ls->icomp.snap_off = lay.snap_off[l] + lay.snap_floats[l];
  }
  if (st != DI_OK) {
    di_v4_seq_state_free(s);
    return st;
  }
  *out = s;
  return DI_OK;
}

di_status di_v4_seq_state_create(const di_v4_config *cfg, di_v4_seq_state **out) { return state_create(cfg, 0, out); }

di_status di_v4_seq_state_create_paged(const di_v4_config *cfg, di_v4_seq_state **out) { return state_create(cfg, 1, out); }

int di_v4_seq_state_is_paged(const di_v4_seq_state *s) { return s && s->paged; }

void di_v4_seq_state_reset(di_v4_seq_state *s) {
  if (!s)
    return;
  s->n_pos = s->win_start = s->replay_until = 0;
  s->broken = 0;
  for (int l = 0; l < s->n_layers; l++) {
    s->layers[l].comp.n_pend = s->layers[l].comp.n_ent = s->layers[l].comp.skip_below = 0;
    s->layers[l].icomp.n_pend = s->layers[l].icomp.n_ent = s->layers[l].icomp.skip_below = 0;
  }
}

int64_t di_v4_seq_state_positions(const di_v4_seq_state *s) { return s ? s->n_pos : 0; }

void di_v4_seq_state_replay_bounds(const di_v4_seq_state *s, int64_t *win_start, int64_t *replay_until) {
  *win_start = s ? s->win_start : 0;
  *replay_until = s ? s->replay_until : 0;
}

size_t di_v4_seq_state_bytes(const di_v4_seq_state *s) {
  if (!s)
    return 0;
  size_t b = 0;
  for (int l = 0; l < s->n_layers; l++) {
    const layer_state *ls = &s->layers[l];
    b += (s->paged ? 0 : sizeof(float) * (size_t)s->ring_cap * s->head_dim) + comp_bytes(&ls->comp, s->paged) +
         comp_bytes(&ls->icomp, s->paged);
  }
  return b;
}

/* ---- the step ------------------------------------------------------------------------------------ */

/* Feeds the chunk's rows a [T][D] (positions pos0...) to a compressor: projects kv and gate, adds the
 * position bias of each row's slot in its window, and pools every window the chunk completes into a
 * new entry (at position entry*rate), as the reference's compress() pools it. */
static di_status comp_feed(di_v4_ctx *cx, comp_state *cs, const di_v4_compressor *cp, const float *a) {
  const di_v4_seq_state *s = cx->user;
  const int T = cx->T, wd = cs->width, rate = cs->rate;
  const int need = cs->n_ent + (cs->n_pend + T) / rate;
  if (!s->pg && need > cs->cap) {
    int cap = cs->cap ? cs->cap : 16;
    while (cap < need)
      cap *= 2;
    float *e = realloc(cs->ent, sizeof(float) * (size_t)cap * cs->dim);
    if (!e)
      return di_error_set(DI_ERR_OOM, WHO ": out of memory for %d compressed entries", cap);
    cs->ent = e;
    cs->cap = cap;
  }
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(kv, (size_t)T * wd);
  DI_V4_ALLOC(gate, (size_t)T * wd);
  DI_TRY(di_v4_linear(cx, &cp->wkv, a, T, kv));
  DI_TRY(di_v4_linear(cx, &cp->wgate, a, T, gate));
  for (int t = 0; t < T; t++) {
    const int slot = cs->n_pend; /* == (pos0 + t) % rate */
    const float *bias = cp->ape + (size_t)slot * wd;
    float *pk = cs->pend_kv + (size_t)slot * wd, *pg = cs->pend_gate + (size_t)slot * wd;
    for (int ch = 0; ch < wd; ch++) {
      pk[ch] = kv[(size_t)t * wd + ch];
      pg[ch] = gate[(size_t)t * wd + ch] + bias[ch];
    }
    if (++cs->n_pend == rate) {
      const int has_prev = cs->overlap && cs->n_ent > 0;
      if (cs->n_ent >= cs->skip_below) /* a replayed window's entry is in the cache already */
        di_v4_pool_window(cx, cp, rate, cs->overlap, has_prev ? cs->prev_kv : NULL, has_prev ? cs->prev_gate : NULL,
                          cs->pend_kv, cs->pend_gate, cs->n_ent * rate, comp_entry(s, cs, cs->n_ent));
      cs->n_ent++;
      cs->n_pend = 0;
      if (cs->overlap) { /* the window just closed is the next entry's previous one */
        float *k = cs->prev_kv, *g = cs->prev_gate;
        cs->prev_kv = cs->pend_kv;
        cs->prev_gate = cs->pend_gate;
        cs->pend_kv = k;
        cs->pend_gate = g;
      }
    }
    const int64_t pos = (int64_t)cx->pos0 + t;
    if (s->pg && s->pg->lay->group_of[DI_V4_G_STATE] >= 0 && (pos + 1) % DI_KV_BLOCK_SIZE == 0 &&
        pos + 1 > s->replay_until) /* a block of its own ends */
      comp_snapshot(cs, di_v4_state_block(s->pg, pos / DI_KV_BLOCK_SIZE) + cs->snap_off);
  }
  di_v4_release(cx, m);
  return DI_OK;
}

/* CSA: for each query of the chunk, flags over the ic->n_ent entries that exist after the chunk: the
 * indexer's top index_topk among those complete at the query, equal scores to the earlier entry (as
 * the reference's indexer; independent of the chunking). */
static di_status indexer_step(di_v4_ctx *cx, const di_v4_layer *L, const comp_state *ic, const float *a, const float *qr,
                              unsigned char *sel) {
  const di_v4_config *c = cx->c;
  const int T = cx->T, nh = c->index_n_heads, di = c->index_head_dim, rate = c->csa_rate, n = ic->n_ent;
  di_v4_blk *m = di_v4_mark(cx);
  float *q, *hw, *score;
  di_v4_scored *work;
  DI_TRY(di_v4_indexer_inputs(cx, L, a, qr, n, &q, &hw, &score, &work));
  const float *K = ic->ent;
  if (((const di_v4_seq_state *)cx->user)->pg) { /* paged: gather the keys from their blocks */
    float *g = di_v4_alloc_f(cx, (size_t)n * di + 1);
    if (!g)
      return DI_ERR_OOM;
    for (int e = 0; e < n; e++)
      memcpy(g + (size_t)e * di, comp_entry(cx->user, ic, e), sizeof(float) * di);
    K = g;
  }
  memset(sel, 0, (size_t)T * n);
  for (int t = 0; t < T && n > 0; t++) {
    const int pos = cx->pos0 + t;
    int valid = (pos + 1) / rate;
    if (valid > n)
      valid = n;
    float *qt = q + (size_t)t * nh * di;
    for (int h = 0; h < nh; h++)
      di_v4_rope_apply(&cx->compress_rope, qt + h * di, di, pos, 1);
    di_v4_index_pick(cx, qt, hw + (size_t)t * nh, K, n, valid, n, pos, score, work, sel + (size_t)t * n);
  }
  di_v4_release(cx, m);
  return DI_OK;
}

/* The attention sublayer over the chunk, reading and extending the layer's state. Window keys of a
 * query: the ring's past positions then the chunk's own, laid out in position order (the reference's
 * summation order); compressed entries: all made so far, HCA's limited to complete windows, CSA's
 * to the indexer's picks. */
static di_status attention_step(di_v4_ctx *cx, int l, const float *a, float *out) {
  const di_v4_config *c = cx->c;
  di_v4_seq_state *s = cx->user;
  layer_state *ls = &s->layers[l];
  const di_v4_layer *L = &cx->w->layers[l];
  const int T = cx->T, H = c->n_heads, hd = c->head_dim, kind = ls->kind;
  di_v4_blk *m = di_v4_mark(cx);
  const di_v4_rope_tab *rt;
  float *qr, *q, *kv;
  DI_TRY(di_v4_attn_inputs(cx, l, a, &rt, &qr, &q, &kv));

  /* window keys: positions [base, pos0 + T) */
  const int W = s->window, R = s->ring_cap, P0 = cx->pos0, ws = (int)s->win_start;
  const int npast = P0 - ws < R ? P0 - ws : R, base = P0 - npast;
  DI_V4_ALLOC(wkeys, (size_t)(npast + T) * hd);
  const di_v4_pages *pg = s->pg;
  for (int j = 0; j < npast; j++)
    memcpy(wkeys + (size_t)j * hd, pg ? di_v4_window_row(pg, l, base + j) : ls->ring + (size_t)((base + j) % R) * hd,
           sizeof(float) * hd);
  memcpy(wkeys + (size_t)npast * hd, kv, sizeof(float) * (size_t)T * hd);
  if (pg) /* every position into its window block (blocks behind the window are given back later) */
    for (int t = 0; t < T; t++)
      memcpy(di_v4_window_row(pg, l, P0 + t), kv + (size_t)t * hd, sizeof(float) * hd);
  else
    for (int t = T > R ? T - R : 0; t < T; t++) /* the ring keeps the last R positions */
      memcpy(ls->ring + (size_t)((P0 + t) % R) * hd, kv + (size_t)t * hd, sizeof(float) * hd);

  unsigned char *sel = NULL;
  int nc = 0;
  if (kind != DI_V4_ATTN_SLIDING) {
    DI_TRY(comp_feed(cx, &ls->comp, &L->comp, a));
    nc = ls->comp.n_ent;
    if (kind == DI_V4_ATTN_CSA) {
      DI_TRY(comp_feed(cx, &ls->icomp, &L->icomp, a));
      float *selbuf = di_v4_alloc_f(cx, ((size_t)T * nc + 3) / 4 + 1);
      if (!selbuf)
        return DI_ERR_OOM;
      sel = (unsigned char *)selbuf;
      DI_TRY(indexer_step(cx, L, &ls->icomp, a, qr, sel));
    }
  }
  const float *ent = ls->comp.ent;
  if (pg && nc > 0) { /* paged: gather the entries from their blocks */
    float *g = di_v4_alloc_f(cx, (size_t)nc * hd);
    if (!g)
      return DI_ERR_OOM;
    for (int e = 0; e < nc; e++)
      memcpy(g + (size_t)e * hd, comp_entry(s, &ls->comp, e), sizeof(float) * hd);
    ent = g;
  }
  DI_V4_ALLOC(o, (size_t)T * H * hd);
  DI_V4_ALLOC(p, (size_t)W + nc + 1);
  DI_V4_ALLOC(ex, 2 * ((size_t)W + nc + 1));
  for (int t = 0; t < T; t++) {
    const int pos = P0 + t, j0 = pos - W + 1 > ws ? pos - W + 1 : ws;
    const int n_cmp = di_v4_visible_entries(kind, pos, ls->comp.rate, nc);
    di_v4_attend(cx, L, rt, q + (size_t)t * H * hd, pos, wkeys + (size_t)(j0 - base) * hd, pos - j0 + 1, ent, n_cmp,
                 sel ? sel + (size_t)t * nc : NULL, p, (double *)ex, o + (size_t)t * H * hd);
  }
  DI_TRY(di_v4_attn_out(cx, L, o, out));
  di_v4_release(cx, m);
  return DI_OK;
}

/* Whether the state was made for a configuration of this shape. */
static int state_matches(const di_v4_seq_state *s, const di_v4_config *c) {
  return s->n_layers == c->n_layers && s->head_dim == c->head_dim && s->window == c->sliding_window &&
         s->csa_rate == c->csa_rate && s->hca_rate == c->hca_rate && s->index_head_dim == c->index_head_dim &&
         memcmp(s->attn_kind, c->attn_kind, (size_t)c->n_layers) == 0;
}

/* rows NULL: every position's logits; else only rows[0..n_rows) (ascending), in that order. The head
 * works row by row (each logit a sum over its own row), so a subset gives the same bits. */
static di_status run_step(di_v4_ctx *cx, const int *rows, int n_rows, float *logits) {
  const di_v4_config *c = cx->c;
  const size_t row = (size_t)c->hc_mult * c->hidden_size;
  DI_V4_ALLOC(X, (size_t)cx->T * row);
  DI_TRY(di_v4_layers(cx, X, attention_step));
  if (!rows)
    return di_v4_head(cx, X, logits);
  if (n_rows == 0)
    return DI_OK;
  for (int i = 0; i < n_rows; i++) /* in place: rows ascending, so row i's source is at or after i */
    memmove(X + (size_t)i * row, X + (size_t)rows[i] * row, row * sizeof *X);
  const int T = cx->T;
  cx->T = n_rows; /* the head loops over cx->T rows of X */
  di_status st = di_v4_head(cx, X, logits);
  cx->T = T;
  return st;
}

static di_status forward_step(const di_v4_config *cfg, const di_v4_weights *w, di_v4_seq_state *s, const di_v4_pages *pg,
                              const int32_t *tokens, int n, const int *rows, int n_rows, float *logits_out) {
  if (!cfg || !w || !s || !tokens || (!logits_out && (!rows || n_rows > 0)))
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": NULL %s", !cfg ? "config" : !w ? "weights" : !s ? "state"
                                                                   : !tokens ? "tokens" : "logits buffer");
  if (rows) {
    if (n_rows < 0 || n_rows > n)
      return di_error_set(DI_ERR_INVALID_ARG, WHO ": %d logits rows for %d tokens", n_rows, n);
    for (int i = 0; i < n_rows; i++)
      if (rows[i] < 0 || rows[i] >= n || (i > 0 && rows[i] <= rows[i - 1]))
        return di_error_set(DI_ERR_INVALID_ARG, WHO ": logits row %d is %d (rows must ascend within [0, %d))", i, rows[i], n);
  }
  if (s->broken)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": the state is unusable after a failed step (reset it)");
  if (!state_matches(s, cfg))
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": the state was made for another configuration (layers %d, head_dim %d, "
                                            "window %d) than this model's (%d, %d, %d)",
                        s->n_layers, s->head_dim, s->window, cfg->n_layers, cfg->head_dim, cfg->sliding_window);
  if (w->n_layers != cfg->n_layers)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": weights have %d layers, the config %d", w->n_layers, cfg->n_layers);
  if (s->paged != (pg != NULL))
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": a %s state %s", s->paged ? "paged" : "self-contained",
                        s->paged ? "needs its cache blocks" : "takes no cache blocks");
  if (pg)
    DI_TRY(di_v4_pages_check(pg, s->n_pos, n, s->win_start, s->replay_until, 0));
  di_v4_ctx cx;
  DI_TRY(di_v4_ctx_init(&cx, cfg, w, tokens, n, WHO));
  if (s->n_pos > INT_MAX - (int64_t)n)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": %d more tokens at position %lld pass the position limit (%d)", n,
                        (long long)s->n_pos, INT_MAX);
  cx.pos0 = (int)s->n_pos;
  cx.user = s;
  s->broken = 1; /* until the step completes: a failure midway leaves some layers updated */
  s->pg = pg;
  di_status st = run_step(&cx, rows, n_rows, logits_out);
  s->pg = NULL;
  di_v4_release(&cx, NULL);
  if (st == DI_OK) {
    s->n_pos += n;
    s->broken = 0;
  }
  return st;
}

di_status di_cpu_v4_forward_step(const di_v4_config *cfg, const di_v4_weights *w, di_v4_seq_state *s, const int32_t *tokens,
                                 int n, float *logits_out) {
  return forward_step(cfg, w, s, NULL, tokens, n, NULL, 0, logits_out);
}

di_status di_cpu_v4_forward_step_rows(const di_v4_config *cfg, const di_v4_weights *w, di_v4_seq_state *s,
                                      const int32_t *tokens, int n, const int *rows, int n_rows, float *logits_out) {
  if (!rows)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": NULL rows");
  return forward_step(cfg, w, s, NULL, tokens, n, rows, n_rows, logits_out);
}

di_status di_cpu_v4_forward_step_paged(const di_v4_config *cfg, const di_v4_weights *w, di_v4_seq_state *s,
                                       const di_v4_pages *pg, const int32_t *tokens, int n, const int *rows, int n_rows,
                                       float *logits_out) {
  if (!rows || !pg)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": NULL %s", rows ? "pages" : "rows");
  return forward_step(cfg, w, s, pg, tokens, n, rows, n_rows, logits_out);
}

di_status di_v4_seq_state_restore(di_v4_seq_state *s, const di_v4_config *cfg, const di_v4_pages *pg, int64_t pos) {
  if (!s || !pg || !s->paged)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": restore needs a paged state and its blocks");
  if (!state_matches(s, cfg))
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": restore into a state made for another configuration");
  DI_TRY(di_v4_pages_check(pg, pos, 1, 0, 0, 1));
  di_v4_seq_state_reset(s);
  if (pg->lay->group_of[DI_V4_G_STATE] >= 0) {
    const float *snap = di_v4_state_block(pg, pos / DI_KV_BLOCK_SIZE - 1);
    for (int l = 0; l < s->n_layers; l++) {
      layer_state *ls = &s->layers[l];
      if (ls->comp.rate)
        comp_restore(&ls->comp, snap + ls->comp.snap_off, pos);
      if (ls->icomp.rate)
        comp_restore(&ls->icomp, snap + ls->icomp.snap_off, pos);
    }
  }
  s->n_pos = pos;
  return DI_OK;
}

di_status di_v4_seq_state_restore_replay(di_v4_seq_state *s, const di_v4_config *cfg, const di_v4_pages *pg, int64_t pos,
                                         int replay) {
  if (!s || !pg || !s->paged)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": restore needs a paged state and its blocks");
  if (!state_matches(s, cfg))
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": restore into a state made for another configuration");
  if (replay < 1 || replay > pos)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": replay of %d positions before position %lld", replay, (long long)pos);
  const int64_t from = pos - replay;
  DI_TRY(di_v4_pages_check(pg, from, replay, from, pos, 0));
  di_v4_seq_state_reset(s);
  for (int l = 0; l < s->n_layers; l++) {
    comp_state *cs[2] = {&s->layers[l].comp, &s->layers[l].icomp};
    for (int i = 0; i < 2; i++)
      if (cs[i]->rate) { /* as at `from`, except that the open window's rows before it are unknown (zeros) */
        const size_t rows = sizeof(float) * (size_t)cs[i]->rate * cs[i]->width;
        memset(cs[i]->pend_kv, 0, rows);
        memset(cs[i]->pend_gate, 0, rows);
        if (cs[i]->overlap) {
          memset(cs[i]->prev_kv, 0, rows);
          memset(cs[i]->prev_gate, 0, rows);
        }
        cs[i]->n_pend = (int)(from % cs[i]->rate);
        cs[i]->n_ent = (int)(from / cs[i]->rate);
        cs[i]->skip_below = (int)(pos / cs[i]->rate);
      }
  }
  s->n_pos = s->win_start = from;
  s->replay_until = pos;
  return DI_OK;
}
