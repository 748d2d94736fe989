/* Expert parallel for DeepSeek-V4's MoE on the CPU (hook in di_v4_moe, after the shared expert):
 * each token's distinct chosen experts (ascending, as the single-rank loop visits them) go to the
 * ranks holding them; the outputs come back and are added to out in expert order with the same
 * weights, so the sum is bit-identical to one rank (di_v4_linear's rows do not depend on the rows
 * beside them). A hash layer's repeated expert is one slot with its summed weight, as on one rank. */
#include "backend/cpu/cpu_deepseek_v4_ops.h"
#include "dist/dist.h"
#include <string.h>

typedef struct {
  di_v4_ctx *cx;
  di_v4_swiglu_fn swiglu;
} v4_ep_user;

/* The experts of layer `layer` over rows sorted by expert (di_ep_experts_fn); a forward's own
 * context, or the listener's (below), whose allocations are released after each call. */
static di_status run_experts(void *user, int layer, const float *x, const int32_t *count, int n, float *y,
                             float *scratch) {
  (void)n, (void)scratch;
  v4_ep_user *u = user;
  const di_v4_layer *L = &u->cx->w->layers[layer];
  const int D = u->cx->c->hidden_size, E = u->cx->c->n_routed_experts;
  di_v4_blk *m = di_v4_mark(u->cx);
  di_status st = DI_OK;
  for (int e = 0, r0 = 0; e < E && st == DI_OK; r0 += count[e], e++)
    if (count[e])
      st = u->swiglu(u->cx, &L->exp_w1[e], &L->exp_w2[e], &L->exp_w3[e], x + (size_t)r0 * D, count[e],
                     y + (size_t)r0 * D);
  di_v4_release(u->cx, m);
  return st;
}

/* A data-parallel rank that listens (no forward of its own this round) runs its experts for the other
 * ranks' rows with this context: the expert products read only the config, the weights and the
 * allocator, so a context made at the first forward serves every later listen. One per process, as
 * the expert-parallel state is (dist.c: one model per process). */
static di_v4_ctx listen_cx;
static v4_ep_user listen_user;

static void set_listener(di_ep *ep, const di_v4_ctx *cx, di_v4_swiglu_fn swiglu) {
  if (listen_cx.w == cx->w && listen_user.swiglu == swiglu)
    return;
  memset(&listen_cx, 0, sizeof listen_cx);
  listen_cx.c = cx->c;
  listen_cx.w = cx->w;
  listen_cx.first_tie_pos = -1;
  listen_user.cx = &listen_cx;
  listen_user.swiglu = swiglu;
  di_ep_set_listener(ep, run_experts, &listen_user);
}

di_status di_v4_moe_ep(di_v4_ctx *cx, int l, const float *x, const float *wt, float *out, di_v4_swiglu_fn swiglu) {
  const di_v4_config *c = cx->c;
  const int T = cx->T, D = c->hidden_size, E = c->n_routed_experts, K = c->top_k;
  di_ep *ep;
  DI_TRY(di_dist_ep_get(c->n_layers, E, D, 1, 0, &ep));
  di_v4_blk *m = di_v4_mark(cx);
  DI_V4_ALLOC(y, (size_t)T * K * D);
  int32_t *ids = (int32_t *)di_v4_alloc_f(cx, (size_t)T * K); /* float-sized slots */
  if (!ids)
    return DI_ERR_OOM;
  for (int t = 0; t < T; t++) {
    int k = 0;
    for (int e = 0; e < E && k < K; e++)
      if (wt[(size_t)t * E + e] != 0)
        ids[t * K + k++] = e;
    for (; k < K; k++)
      ids[t * K + k] = -1;
  }
  set_listener(ep, cx, swiglu);
  v4_ep_user u = {cx, swiglu};
  DI_TRY(di_ep_routed(ep, l, x, T, ids, K, y, run_experts, &u));
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K && ids[t * K + k] >= 0; k++) {
      const float w = wt[(size_t)t * E + ids[t * K + k]];
      const float *yk = y + ((size_t)t * K + k) * D;
      for (int d = 0; d < D; d++)
        out[(size_t)t * D + d] += w * yk[d];
    }
  di_v4_release(cx, m);
  return DI_OK;
}
