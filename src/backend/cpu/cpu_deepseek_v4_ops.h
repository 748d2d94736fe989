/* DeepSeek-V4 on the CPU: the building blocks shared by the whole-sequence reference forward
 * (cpu_deepseek_v4.c) and the cached, incremental one (cpu_deepseek_v4_cache.c), so both compute every
 * value with the same operations in the same order (their logits are then bit-identical). Internal. */
#ifndef DI_BACKEND_CPU_DEEPSEEK_V4_OPS_H
#define DI_BACKEND_CPU_DEEPSEEK_V4_OPS_H
#include <stddef.h>
#include <stdint.h>
#include "arch/deepseek_v4.h"
#include "backend/v4_torch_select.h" /* di_v4_scored and torch.topk's procedure, shared with the CUDA router */

/* Scratch memory: a stack of blocks released back to a mark. */
typedef struct di_v4_blk {
  struct di_v4_blk *prev;
  max_align_t data[];
} di_v4_blk;

typedef struct di_v4_rope_tab {
  const di_v4_rope *p;
  float inv_freq[512]; /* dim/2 entries */
} di_v4_rope_tab;

/* One forward call over T consecutive tokens starting at absolute position pos0. */
typedef struct di_v4_ctx {
  const di_v4_config *c;
  const di_v4_weights *w;
  const int32_t *tokens; /* [T] */
  int T, pos0;
  di_v4_blk *top;
  di_v4_rope_tab main_rope, compress_rope;
  /* reference only (di_cpu_v4_forward_torch_ties): rank the indexer's picks as torch.topk does in
   * transformers' run with these chunk ends; 0: the fixed rule (di_v4_topk_earlier_first) */
  int torch_ties;
  const int *chunk_end;
  int boundary_ties;     /* queries whose k-th and (k+1)-th best index scores were equal (fixed rule) */
  int first_tie_pos;     /* position of the first such query, -1 if none */
  void *user;            /* the caller's per-call state (the cached path's sequence) */
} di_v4_ctx;

/* Checks tokens and the size limits the fixed buffers below assume; sets up cx (ropes included). */
di_status di_v4_ctx_init(di_v4_ctx *cx, const di_v4_config *cfg, const di_v4_weights *w, const int32_t *tokens, int n,
                         const char *who);
di_v4_blk *di_v4_mark(const di_v4_ctx *cx);
void di_v4_release(di_v4_ctx *cx, di_v4_blk *m);
/* Zeroed float array of n elements, or NULL (error set) when memory runs out. */
float *di_v4_alloc_f(di_v4_ctx *cx, size_t n);

#define DI_V4_ALLOC(var, n)                     \
  float *var = di_v4_alloc_f(cx, (size_t)(n)); \
  if (!var)                                     \
    return DI_ERR_OOM;

/* y[t][r] = sum_c W[r][c] x[t][c] for t < T (double sums); W is dequantized once per call. */
di_status di_v4_linear(di_v4_ctx *cx, const di_weight *W, const float *x, int T, float *y);
/* In-place RMSNorm of n values; weight NULL means unweighted. */
void di_v4_rmsnorm(float *x, int n, const float *weight, double eps);
/* Rotates the trailing rope dim channels of x[0..n) at `pos`; sign = -1 is the inverse rotation. */
void di_v4_rope_apply(const di_v4_rope_tab *rt, float *x, int n, int pos, int sign);

/* Marks in `chosen` (n flags, cleared first) the k entries of v[0..n) torch.topk(v, k) returns on the
 * CPU, ties included. work: n entries of scratch (2 floats each). */
void di_v4_topk_like_torch(const float *v, int n, int k, di_v4_scored *work, unsigned char *chosen);
/* The indexer's rule: sets chosen[i] for the k best of v[0..n), ranked by value, equal values by the
 * EARLIER index first, so the picks depend on the scores alone (not on how many entries exist or how
 * a selection algorithm moves them). work: n entries of scratch. Returns 1 when the rule decided
 * something: k < n and the k-th and (k+1)-th best values are equal. */
int di_v4_topk_earlier_first(const float *v, int n, int k, di_v4_scored *work, unsigned char *chosen);

/* mHC mixing weights of one token from its hc streams X[hc][D] (hidden_size D): pre[hc] (collapse),
 * post[hc] (where the sublayer output goes), comb[hc][hc] (softmax rows, then Sinkhorn towards doubly
 * stochastic, transformers' order); fnw [(2 + hc) hc][hc D] in f32, base [(2 + hc) hc], scale [3]. */
void di_v4_hc_weights(const di_v4_config *c, const float *fnw, const float *base, const float *scale, const float *X,
                      double *pre, double *post, double *comb);
/* The router of one token: adds to wt[E] (zeroed by the caller) the weight of each chosen expert:
 * scores sqrt(softplus(logit)) (or sigmoid), the top_k of score + bias (torch's topk) or hash_ids'
 * top_k experts (tid2eid's row), the chosen scores normalized to sum 1 and scaled by routed_scaling. */
void di_v4_route(const di_v4_config *c, const float *logits, const float *bias, const int32_t *hash_ids, float *wt);
/* A sublayer over the cx->T tokens: in [T][D] -> out [T][D]. */
typedef di_status (*di_v4_sublayer_fn)(di_v4_ctx *cx, int l, const float *in, float *out);
/* Embeds cx->tokens into X [T][hc][D] (every stream starts as the embedding). */
void di_v4_embed(di_v4_ctx *cx, float *X);
/* One mHC residual site over X [T][hc][D]: collapse, RMSNorm, sublayer, expand + mix. */
di_status di_v4_hc_site(di_v4_ctx *cx, int l, float *X, const di_weight *fn, const float *base, const float *scale,
                        const float *norm, di_v4_sublayer_fn sub);
/* The MoE sublayer (routed experts by hash or learned top-k, plus the shared expert). */
di_status di_v4_moe(di_v4_ctx *cx, int l, const float *x, float *out);
/* Expert parallel (cpu_deepseek_v4_ep.c): the routed experts of wt [T][E] on their ranks, added to out
 * (which holds the shared expert's output) in expert order; swiglu runs one expert over gathered rows. */
typedef di_status (*di_v4_swiglu_fn)(di_v4_ctx *cx, const di_weight *w1, const di_weight *w2, const di_weight *w3,
                                     const float *x, int T, float *y);
di_status di_v4_moe_ep(di_v4_ctx *cx, int l, const float *x, const float *wt, float *out, di_v4_swiglu_fn swiglu);
/* The whole layer stack: embeds cx->tokens into X [T][hc][D], then each layer's attention site (with
 * `attention`: the reference's whole-sequence sublayer or the cached forward's step) and MoE site. */
di_status di_v4_layers(di_v4_ctx *cx, float *X, di_v4_sublayer_fn attention);
/* Head: collapse the streams, final norm, output projection: logits [T][vocab]. */
di_status di_v4_head(di_v4_ctx *cx, const float *X, float *logits);

/* Attention inputs of layer l for T tokens at positions pos0+t, in arrays from the context's arena
 * (the caller's mark releases them): qr [T][q_lora] (the q residual, also the indexer's input),
 * q [T][H][hd] and kv [T][hd] (normed, roped with *rt, the rope table of the layer's kind). */
di_status di_v4_attn_inputs(di_v4_ctx *cx, int l, const float *a, const di_v4_rope_tab **rt, float **qr, float **q,
                            float **kv);
/* One compressed entry at position pos: per channel, a softmax over the slots of (gate + position
 * bias) weighs the slots' KV values; then RMSNorm and the compress rope. kv/gate rows are cp->width
 * wide with the bias already added to gate. With `overlap`, prev_* (may be NULL: no previous window)
 * are the previous window's rows whose first dim channels (Ca) join the current window's last dim
 * channels (Cb); without it the current rows are all there is. */
void di_v4_pool_window(const di_v4_ctx *cx, const di_v4_compressor *cp, int rate, int overlap, const float *prev_kv,
                       const float *prev_gate, const float *cur_kv, const float *cur_gate, int pos, float *out);
/* Indexer score of query qt (index heads, roped) with head weights hw (raw weights_proj output)
 * against n compressed keys K [n][index_head_dim]: score[s] = sum_h w_h * relu(q_h . K_s) scaled. */
void di_v4_index_scores(const di_v4_config *c, const float *qt, const float *hw, const float *K, int n, float *score);
/* The indexer's inputs for a chunk: its queries q [T][index heads][index_head_dim] (not yet roped)
 * from qr, its head weights hw [T][index heads] from a, and scratch for di_v4_index_pick over n
 * entries; all from the context's arena. */
di_status di_v4_indexer_inputs(di_v4_ctx *cx, const di_v4_layer *L, const float *a, const float *qr, int n, float **q,
                               float **hw, float **score, di_v4_scored **work);
/* Compressed entries a query at position pos may attend on a layer of this kind, of the nc made:
 * none on sliding layers, the complete windows' on HCA, all on CSA (the indexer's picks mask them). */
static inline int di_v4_visible_entries(int kind, int pos, int rate, int nc) {
  if (kind == DI_V4_ATTN_HCA) {
    const int n = (pos + 1) / rate;
    return n < nc ? n : nc;
  }
  return kind == DI_V4_ATTN_CSA ? nc : 0;
}
/* The indexer's picks for one query (qt roped, hw as above, at position pos) among the entries of K of
 * which the first `valid` are complete at the query: sel (nc >= n flags) marks the top index_topk of
 * the complete entries (all of them when there are fewer).
 * Ties: with cx->torch_ties 0 (the engine's rule) equal scores go to the earlier entry
 * (di_v4_topk_earlier_first), so the picks do not depend on the chunking; cx->boundary_ties counts
 * the queries where that rule decided. With torch_ties, as transformers does it: torch.topk over all
 * n entries that exist when the query's chunk runs (the incomplete ones at -inf), whose order among
 * equal scores depends on n and on its selection algorithm (di_v4_topk_like_torch).
 * score: n floats, work: 2n + 2 scored entries of scratch. */
void di_v4_index_pick(di_v4_ctx *cx, const float *qt, const float *hw, const float *K, int n, int valid, int nc, int pos,
                      float *score, di_v4_scored *work, unsigned char *sel);
/* Attention of one query (all heads, q_t [H][hd]) at position pos over the window keys win
 * [n_win][hd] (in position order) then the compressed entries cmp [n_cmp][hd], of which only those
 * with sel[i] set when sel is given; sink logits per head; output rope rotated back. p, ex: scratch of
 * n_win + n_cmp floats / doubles. o_t: [H][hd]. */
void di_v4_attend(const di_v4_ctx *cx, const di_v4_layer *L, const di_v4_rope_tab *rt, const float *q_t, int pos,
                  const float *win, int n_win, const float *cmp, int n_cmp, const unsigned char *sel, float *p, double *ex, float *o_t);
/* Grouped low-rank output projection of head outputs o [T][H*hd] -> out [T][D]. */
di_status di_v4_attn_out(di_v4_ctx *cx, const di_v4_layer *L, const float *o, float *out);

#endif
