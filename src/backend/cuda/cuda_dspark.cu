/* The DSpark block drafter on the CUDA backend (the CPU's is backend/cpu/cpu_dspark.c; the design is
 * there and in docs/speculative.md) and the target's feature capture it reads.
 *
 * Capture: di_backend_cuda_set_capture names the target layers; the forward then copies each output
 * row's output of those layers into cap_buf (capture_layer, from forward()), inside the step's CUDA
 * graph, and wait() returns them as the step's hidden rows.
 *
 * Drafter: weights in bf16 on the device (GEMM operands, f32 accumulation), activations, the cache
 * and the attention in f32. The cache is [layer][block][slot][K | V], paged by the sequence's table in
 * the engine's drafter KV group (its own pool, DI_DRAFTER_BLOCK_TOKENS slots a block). context() writes the keys/values of the
 * computed positions; propose() runs the blocks [anchor, mask, ...] through every layer in one pass
 * and returns norm(h) and the base logits of each row wanted. Greedy drafts are then made on the device
 * (draft_greedy: per round the Markov term, the argmax and the confidence head, one kernel a round;
 * only the tokens and confidences come back); the rows of requests that sample their drafts or follow
 * a grammar go to the host, where the engine applies the Markov and confidence heads (spec_dspark.c).
 * propose() runs eagerly on the target's stream after the step's wait(); its inputs (positions, block
 * tables) travel from the host.
 *
 * Proposals inside the step (di_cuda_dspark_graph_on; the engine's DEEPINFER_DSPARK_GRAPH_PROPOSE):
 * a step whose batch carries propose_row runs prop_forward at the end of its forward, inside its CUDA
 * graph, after its own sampling: the step's logged feature rows become cache entries (the log's
 * earlier rows were flushed eagerly in prepare(), so order is kept: a later write wins), each block's
 * anchor comes from the step's samples on the device (dspark_anchor_kernel: the verified drafts
 * accepted while equal to the sample before them, as the host's exact match accepts them), the blocks
 * go through block_forward and the greedy rounds, and the anchors, drafts and confidences are copied
 * to pinned host memory (graph_drafts reads them after wait()). Its scratch is sized in prepare()
 * (prop_prepare), before any capture; growing it drops the captured graphs, which name the old
 * buffers. The attention's key bound is the graph's table stride (prop_bt x 16 + B), not the step's
 * context, so one graph serves every context its tables cover.
 *
 * The context fed on the device (di_cuda_dspark_log_on, the engine's DEEPINFER_DSPARK_DEVICE_STEPS): the
 * capture then appends every step's feature rows to a device log (cu_backend.flog, inside the step's
 * graph) and the host keeps their positions and slots; the log becomes cache entries in one pass
 * (log_flush) before each proposal or when it is full. So the features never leave the device and a
 * step that proposes nothing (the plain path of the engine) pays only the capture's copies. Rows the
 * host path would not feed (rejected drafts, padding) are harmless: padding has no slot; a rejected
 * draft's position is written again by the row of the token that replaces it (the later row of a
 * flush wins) before any proposal can read it (a block reads the context below its anchor only). */
#include "cuda_backend_impl.cuh"
#include "k_dspark.h"
extern "C" {
#include "backend/cuda/cuda_dspark.h"
#include "backend/drafter_cache.h"
}

extern "C" di_status di_backend_cuda_set_capture(di_backend *bb, const int *layer_ids, int n) {
  if (!bb || strcmp(bb->ops->name, "cuda") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, "hidden-state capture on CUDA needs the CUDA V2/V3 backend");
  cu_backend *b = (cu_backend *)bb;
  if (n < 0 || n > 16) return di_error_set(DI_ERR_INVALID_ARG, "capture of %d layers (at most 16)", n);
  for (int i = 0; i < n; i++)
    if (layer_ids[i] < -1 || layer_ids[i] >= b->n_layers || (i > 0 && layer_ids[i] <= layer_ids[i - 1]))
      return di_error_set(DI_ERR_INVALID_ARG, "capture layer id %d is not an increasing id in [-1, %d)", layer_ids[i],
                          b->n_layers);
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: capture changed while a step is in flight");
  drop_graphs(b);
  for (int i = 0; i < n; i++) b->capture[i] = layer_ids[i];
  b->n_capture = n;
  dev_free(b, b->cap_buf);
  b->cap_buf = NULL;
  b->cap_rows = 0; /* the next ensure_acts allocates it */
  return DI_OK;
}

di_status capture_layer(cu_backend *b, int l) {
  const int last = b->n_layers - 1, F = b->n_capture * b->H;
  float *dst = b->flog ? b->flog : b->cap_buf;
  for (int k = 0; k < b->n_capture; k++)
    if (b->capture[k] == l)
      DI_TRY(di_cuk_capture_rows(b->h, b->H, b->d_out_rows, b->n_out_p, l == last ? b->final_norm : NULL, b->eps,
                                 dst + (size_t)k * b->H, F, b->flog ? b->d_flog_row0 : NULL, b->stream));
  return DI_OK;
}

typedef struct cd_layer {
  float *in_norm, *post_norm, *q_norm, *k_norm;
  bf16 *q, *k, *v, *o, *gate_up, *down; /* gate_up: [gate rows | up rows][hidden] (silu_mul's layout) */
} cd_layer;

struct di_cuda_dspark {
  cu_backend *b;
  const di_dspark *d;
  int kvd, qd, F;
  bf16 *fc, *embed, *lm_head;
  float *hidden_norm, *norm, *inv_freq;
  float *mw1, *mw2, *conf_w; /* the Markov head [vocab][rank] x 2 and the confidence head, f32 */
  cd_layer *L;
  float *cache;
  int64_t n_blocks;
  /* scratch, grown by need (rows / ints); the context pass's buffers (x, xn, kf, vf, featb) may hold more
   * rows (cap_ctx >= cap_rows: the feature log's flush in chunks of `chunk` rows, log_on) */
  int cap_rows, cap_ints, cap_ctx, chunk;
  float *x, *qf, *kf, *vf, *hf, *featf;
  bf16 *xn, *att, *gu, *act, *featb;
  int32_t *ints;
  int cap_greedy;
  int last_n;      /* blocks of the last proposal (whose logits and hidden rows draft_greedy reads) */
  int32_t *g_ints; /* greedy drafting: prev [n], cap [n], tokens [n * B] */
  float *g_conf;   /* [n * B] */
  void *gscr;      /* the greedy rounds' per-chunk maxima (di_cuk_dspark_greedy_scratch), for cap_rows / B blocks */
  int log_owner;   /* the target's feature log is this drafter's (di_cuda_dspark_log_on) */
  /* proposals inside the step (di_cuda_dspark_graph_on): device scratch for p_cap blocks (block tokens
   * [cap * B], anchor positions, prev, caps [cap] each, anchor out [cap][2], draft tokens [cap * B] as
   * int32, then confidences [cap * B] f32), its pinned host copy (anchor out, tokens, confidences) and
   * the proposal's sizes (p_n real blocks, p_blk padded; p_made: the last step proposed) */
  int graph_owner, p_limit, p_cap, p_n, p_blk, p_made;
  int32_t *p_dev, *p_host;
  uint32_t *stamp, stamp_gen; /* per cache slot: the flush that last wrote it (a flush's later rows win) */
  /* log_flush's pinned staging of the log's slots and positions [2 * flog_cap] and the event after its
   * upload (waited for at the next flush only: the host rewrites the log's host arrays at once) */
  int32_t *flush_stage;
  cudaEvent_t ev_flush;
  int flush_pending, flush_async; /* flush_async: DEEPINFER_DSPARK_FLUSH_ASYNC, read at log_on */
};

static di_status up_w(cu_backend *b, const di_weight *w, int64_t rows, int64_t cols, bf16 **out, const char *what) {
  DI_TRY(check_shape(w, rows, cols, what));
  DI_TRY(dev_alloc(b, (void **)out, (size_t)(rows * cols) * 2));
  return up_rows(w, 0, rows, *out, cols);
}

static di_status create_in(di_cuda_dspark *s) {
  cu_backend *b = s->b;
  const di_dspark *d = s->d;
  const int H = d->hidden, I = d->inter;
  DI_TRY(up_w(b, &d->fc, H, s->F, &s->fc, "dspark fc"));
  DI_TRY(up_w(b, &d->embed, d->vocab, H, &s->embed, "dspark embed_tokens"));
  DI_TRY(up_w(b, &d->lm_head, d->vocab, H, &s->lm_head, "dspark lm_head"));
  DI_TRY(up_vec(b, d->hidden_norm, H, &s->hidden_norm));
  DI_TRY(up_vec(b, d->norm, H, &s->norm));
  float inv[1024];
  for (int i = 0; i < d->head_dim / 2; i++) inv[i] = (float)(1.0 / pow((double)d->rope_theta, (double)(2 * i) / (double)d->head_dim));
  DI_TRY(up_vec(b, inv, d->head_dim / 2, &s->inv_freq));
  if (d->markov_rank > 0) { /* as the CPU holds them: float32 rows */
    const size_t n = (size_t)d->vocab * d->markov_rank;
    float *tmp = (float *)malloc(sizeof(float) * n);
    if (!tmp) return di_error_set(DI_ERR_OOM, "out of memory");
    di_weight_rows_f32(&d->markov_w1, 0, d->vocab, tmp);
    di_status st = up_vec(b, tmp, (int64_t)n, &s->mw1);
    if (st == DI_OK) {
      di_weight_rows_f32(&d->markov_w2, 0, d->vocab, tmp);
      st = up_vec(b, tmp, (int64_t)n, &s->mw2);
    }
    free(tmp);
    DI_TRY(st);
  }
  if (d->has_conf) DI_TRY(up_vec(b, d->conf_w, d->conf_dim, &s->conf_w));
  s->L = (cd_layer *)calloc((size_t)d->n_layers, sizeof *s->L);
  if (!s->L) return di_error_set(DI_ERR_OOM, "out of memory");
  for (int l = 0; l < d->n_layers; l++) {
    const di_dspark_layer *w = &d->layers[l];
    cd_layer *c = &s->L[l];
    DI_TRY(up_vec(b, w->in_norm, H, &c->in_norm));
    DI_TRY(up_vec(b, w->post_norm, H, &c->post_norm));
    DI_TRY(up_vec(b, w->q_norm, d->head_dim, &c->q_norm));
    DI_TRY(up_vec(b, w->k_norm, d->head_dim, &c->k_norm));
    DI_TRY(up_w(b, &w->q, s->qd, H, &c->q, "dspark q_proj"));
    DI_TRY(up_w(b, &w->k, s->kvd, H, &c->k, "dspark k_proj"));
    DI_TRY(up_w(b, &w->v, s->kvd, H, &c->v, "dspark v_proj"));
    DI_TRY(up_w(b, &w->o, H, s->qd, &c->o, "dspark o_proj"));
    DI_TRY(check_shape(&w->gate, I, H, "dspark gate_proj"));
    DI_TRY(check_shape(&w->up, I, H, "dspark up_proj"));
    DI_TRY(dev_alloc(b, (void **)&c->gate_up, (size_t)2 * I * H * 2));
    DI_TRY(up_rows(&w->gate, 0, I, c->gate_up, H));
    DI_TRY(up_rows(&w->up, 0, I, c->gate_up + (size_t)I * H, H));
    DI_TRY(up_w(b, &w->down, H, I, &c->down, "dspark down_proj"));
  }
  return DI_OK;
}

extern "C" di_status di_cuda_dspark_create(di_backend *target, const di_dspark *d, di_cuda_dspark **out) {
  *out = NULL;
  if (!target || strcmp(target->ops->name, "cuda") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, "the DSpark drafter on CUDA needs the CUDA V2/V3 backend");
  if (d->head_dim % 2 || d->head_dim > 1024 || d->n_kv_heads <= 0 || d->n_heads % d->n_kv_heads)
    return di_error_set(DI_ERR_UNSUPPORTED, "DSpark drafter on CUDA: head_dim %d with %d heads over %d KV heads", d->head_dim,
                        d->n_heads, d->n_kv_heads);
  di_cuda_dspark *s = (di_cuda_dspark *)calloc(1, sizeof *s);
  if (!s) return di_error_set(DI_ERR_OOM, "out of memory");
  s->b = (cu_backend *)target;
  s->d = d;
  s->kvd = d->n_kv_heads * d->head_dim;
  s->qd = d->n_heads * d->head_dim;
  s->F = d->n_feats * d->target_hidden;
  di_status st = create_in(s);
  if (st != DI_OK) {
    di_cuda_dspark_free(s);
    return st;
  }
  *out = s;
  return DI_OK;
}

static void log_off(di_cuda_dspark *s) {
  cu_backend *b = s->b;
  if (!s->log_owner) return;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* their capture kernels write into the log */
  dev_free(b, b->flog);
  free(b->flog_pos);
  free(b->flog_slot);
  b->flog = NULL;
  b->flog_pos = b->flog_slot = NULL;
  b->flog_cap = b->flog_n = 0;
  b->flog_flush = NULL;
  b->flog_ctx = NULL;
  if (s->flush_stage) cudaFreeHost(s->flush_stage);
  if (s->ev_flush) cudaEventDestroy(s->ev_flush);
  s->flush_stage = NULL;
  s->ev_flush = NULL;
  s->flush_pending = 0;
  b->prop_prepare = NULL;
  b->prop_forward = NULL;
  b->prop_ctx = NULL;
  s->log_owner = s->graph_owner = 0;
}

extern "C" void di_cuda_dspark_free(di_cuda_dspark *s) {
  if (!s) return;
  cu_backend *b = s->b;
  log_off(s);
  free(s->stamp);
  if (s->p_host) cudaFreeHost(s->p_host);
  cudaStreamSynchronize(b->stream);
  void *ptrs[] = {s->fc, s->embed, s->lm_head, s->hidden_norm, s->norm, s->inv_freq, s->cache, s->x, s->qf, s->kf,
                  s->vf, s->hf, s->featf, s->xn, s->att, s->gu, s->act, s->featb, s->ints, s->mw1, s->mw2,
                  s->conf_w, s->g_ints, s->g_conf, s->p_dev, s->gscr};
  for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) dev_free(b, ptrs[i]);
  if (s->L)
    for (int l = 0; l < s->d->n_layers; l++) {
      cd_layer *c = &s->L[l];
      void *lp[] = {c->in_norm, c->post_norm, c->q_norm, c->k_norm, c->q, c->k, c->v, c->o, c->gate_up, c->down};
      for (size_t i = 0; i < sizeof lp / sizeof *lp; i++) dev_free(b, lp[i]);
    }
  free(s->L);
  free(s);
}

extern "C" di_status di_cuda_dspark_kv_alloc(di_cuda_dspark *s, int64_t n_blocks) {
  cu_backend *b = s->b;
  DI_CU(cudaStreamSynchronize(b->stream));
  dev_free(b, s->cache);
  s->cache = NULL;
  s->n_blocks = 0;
  size_t n = (size_t)n_blocks * (size_t)s->d->n_layers * DI_DRAFTER_BLOCK_TOKENS * 2 * (size_t)s->kvd;
  DI_TRY(dev_alloc(b, (void **)&s->cache, sizeof(float) * n));
  DI_CU(cudaMemset(s->cache, 0, sizeof(float) * n));
  s->n_blocks = n_blocks;
  free(s->stamp);
  s->stamp = (uint32_t *)calloc((size_t)n_blocks * DI_DRAFTER_BLOCK_TOKENS, sizeof *s->stamp);
  if (!s->stamp) return di_error_set(DI_ERR_OOM, "DSpark drafter: out of host memory for %lld cache slots", (long long)n_blocks);
  s->stamp_gen = 0;
  if (s->log_owner) b->flog_n = 0; /* its rows name slots of the old cache */
  return DI_OK;
}

/* the context pass's buffers for `rows` rows (callers sync and drop the proposal graphs first) */
static di_status reserve_ctx(di_cuda_dspark *s, int rows) {
  cu_backend *b = s->b;
  const size_t R = (size_t)rows, H = (size_t)s->d->hidden;
  REALLOC(s->x, sizeof(float) * R * H);
  REALLOC(s->kf, sizeof(float) * R * s->kvd);
  REALLOC(s->vf, sizeof(float) * R * s->kvd);
  REALLOC(s->xn, 2 * R * H);
  REALLOC(s->featb, 2 * R * s->F);
  s->cap_ctx = rows;
  return DI_OK;
}

static di_status reserve(di_cuda_dspark *s, int rows, int ints) {
  cu_backend *b = s->b;
  const di_dspark *d = s->d;
  if (rows > s->cap_rows) {
    int c = s->cap_rows ? s->cap_rows : 64;
    while (c < rows) c *= 2;
    DI_CU(cudaStreamSynchronize(b->stream));
    if (s->graph_owner) drop_proposal_graphs(b); /* the step graphs with a proposal name the old scratch (the
                                                   * others only the feature log, which does not move) */
    const size_t R = (size_t)c, H = (size_t)d->hidden, I = (size_t)d->inter, V = (size_t)d->vocab;
    const size_t wide = (size_t)s->F > V ? (size_t)s->F : V; /* featf: the context's features or the logits */
    if (c > s->cap_ctx) {
      DI_TRY(reserve_ctx(s, c));
    }
    REALLOC(s->qf, sizeof(float) * R * s->qd);
    REALLOC(s->hf, sizeof(float) * R * H);
    REALLOC(s->featf, sizeof(float) * R * wide);
    REALLOC(s->att, 2 * R * s->qd);
    REALLOC(s->gu, 2 * R * 2 * I);
    REALLOC(s->act, 2 * R * I);
    REALLOC(s->gscr, di_cuk_dspark_greedy_scratch(c / d->block_size + 1));
    s->cap_rows = c;
  }
  if (ints > s->cap_ints) {
    int c = s->cap_ints ? s->cap_ints : 1024;
    while (c < ints) c *= 2;
    DI_CU(cudaStreamSynchronize(b->stream));
    REALLOC(s->ints, sizeof(int32_t) * (size_t)c);
    s->cap_ints = c;
  }
  return DI_OK;
}

static di_status slot_of(const di_cuda_dspark *s, const di_batch_seq *q, int pos, int32_t *gslot) {
  int64_t slot;
  DI_TRY(di_drafter_cache_slot(q, pos, s->n_blocks, &slot));
  if (slot > INT32_MAX) return di_error_set(DI_ERR_UNSUPPORTED, "DSpark drafter on CUDA: cache slot %lld", (long long)slot);
  *gslot = (int32_t)slot;
  return DI_OK;
}

static float *cache_layer(const di_cuda_dspark *s, int l) {
  return s->cache + (size_t)l * (size_t)s->n_blocks * DI_DRAFTER_BLOCK_TOKENS * 2 * (size_t)s->kvd;
}

static di_status context_rows(di_cuda_dspark *s, int n, const float *feats, const int32_t *d_slot, const int32_t *d_pos);

extern "C" di_status di_cuda_dspark_context(di_cuda_dspark *s, int n, const float *feats, const int32_t *pos,
                                           const int32_t *seq_of, const di_batch_seq *seqs) {
  if (n <= 0) return DI_OK;
  cudaStream_t st = s->b->stream;
  DI_TRY(reserve(s, n, 2 * n));
  int32_t *h_ints = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)n);
  if (!h_ints) return di_error_set(DI_ERR_OOM, "out of memory");
  di_status e = DI_OK;
  for (int t = 0; t < n && e == DI_OK; t++) {
    e = slot_of(s, &seqs[seq_of[t]], pos[t], &h_ints[t]);
    h_ints[n + t] = pos[t];
  }
  if (e == DI_OK && cudaMemcpyAsync(s->ints, h_ints, sizeof(int32_t) * 2 * (size_t)n, cudaMemcpyHostToDevice, st) != cudaSuccess)
    e = di_error_set(DI_ERR_BACKEND, "cuda: DSpark context upload failed");
  if (e == DI_OK && cudaMemcpyAsync(s->featf, feats, sizeof(float) * (size_t)n * s->F, cudaMemcpyHostToDevice, st) != cudaSuccess)
    e = di_error_set(DI_ERR_BACKEND, "cuda: DSpark feature upload failed");
  if (e == DI_OK) e = cudaStreamSynchronize(st) == cudaSuccess ? DI_OK : di_error_set(DI_ERR_BACKEND, "cuda: DSpark upload");
  free(h_ints);
  DI_TRY(e);
  return context_rows(s, n, s->featf, s->ints, s->ints + n);
}

/* the context's math for n rows whose features (f32 [n][F]) are on the device already */
static di_status context_rows(di_cuda_dspark *s, int n, const float *feats, const int32_t *d_slot, const int32_t *d_pos) {
  const di_dspark *d = s->d;
  cu_backend *b = s->b;
  cudaStream_t st = b->stream;
  const int H = d->hidden, kvd = s->kvd;
  DI_TRY(di_cuk_f32_to_bf16(feats, (int64_t)n * s->F, (uint16_t *)s->featb, st));
  DI_TRY(di_cu_gemm(b->blas, n, H, s->F, (const uint16_t *)s->featb, s->F, (const uint16_t *)s->fc, s->F, s->x, H, 1, 0.f, st));
  DI_TRY(di_cuk_rmsnorm(s->x, H, s->hidden_norm, n, H, d->eps, (uint16_t *)s->xn, H, NULL, st));
  for (int l = 0; l < d->n_layers; l++) {
    const cd_layer *L = &s->L[l];
    DI_TRY(di_cu_gemm(b->blas, n, kvd, H, (const uint16_t *)s->xn, H, (const uint16_t *)L->k, H, s->kf, kvd, 1, 0.f, st));
    DI_TRY(di_cu_gemm(b->blas, n, kvd, H, (const uint16_t *)s->xn, H, (const uint16_t *)L->v, H, s->vf, kvd, 1, 0.f, st));
    DI_TRY(di_cuk_head_norm_rope(s->kf, kvd, n, d->n_kv_heads, d->head_dim, L->k_norm, d->eps, d_pos, 1, s->inv_freq, st));
    DI_TRY(di_cuk_dspark_cache_write(s->kf, s->vf, kvd, n, d_slot, cache_layer(s, l), st));
  }
  return DI_OK;
}

/* The feature log's rows into the drafter cache (cu_backend.flog): a slot written by several logged
 * rows (a rejected draft's row, then the real token's at that position; a block that changed hands)
 * keeps the last one, the earlier ones are skipped (one cache-write kernel has no order between rows).
 * Without host synchronisation (DEEPINFER_DSPARK_FLUSH_ASYNC, default 1 since session 15: test_dspark on
 * the H200 gave the synchronous flush's counts; 0: one sync per 1,024 rows, from pageable memory, and so
 * a drained pipeline under token feedback at every flush): the slots and positions are staged in pinned memory and uploaded once, the
 * chunks' kernels queued behind the step in flight (which writes the log's last rows: stream order), and
 * the staging is reused at the next flush after its upload's event. */
enum { LOG_CHUNK = 1024 }; /* rows per context pass (the scratch is sized by rows) */
static di_status log_flush(void *c) {
  di_cuda_dspark *s = (di_cuda_dspark *)c;
  cu_backend *b = s->b;
  const int n = b->flog_n;
  if (n == 0) return DI_OK;
  const int64_t n_slots = s->n_blocks * DI_DRAFTER_BLOCK_TOKENS;
  if (++s->stamp_gen == 0) { /* wrapped: start the stamps again */
    memset(s->stamp, 0, sizeof *s->stamp * (size_t)n_slots);
    s->stamp_gen = 1;
  }
  for (int t = n - 1; t >= 0; t--) {
    const int32_t g = b->flog_slot[t];
    if (g < 0) continue;
    if (g >= n_slots || s->stamp[g] == s->stamp_gen) b->flog_slot[t] = -1;
    else s->stamp[g] = s->stamp_gen;
  }
  b->flog_n = 0;
  if (!s->flush_async) { /* session 13's flush: a sync per chunk (the pageable sources, s->ints rewritten) */
    for (int c0 = 0; c0 < n; c0 += LOG_CHUNK) {
      const int m = n - c0 < LOG_CHUNK ? n - c0 : LOG_CHUNK;
      DI_TRY(reserve(s, m, 2 * m));
      DI_CU(cudaMemcpyAsync(s->ints, b->flog_slot + c0, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice, b->stream));
      DI_CU(cudaMemcpyAsync(s->ints + m, b->flog_pos + c0, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice, b->stream));
      DI_CU(cudaStreamSynchronize(b->stream));
      DI_TRY(context_rows(s, m, b->flog + (size_t)c0 * s->F, s->ints, s->ints + m));
    }
    return DI_OK;
  }
  DI_TRY(reserve(s, 0, 2 * n)); /* (the context buffers hold s->chunk rows since log_on) */
  if (s->flush_pending) DI_CU(cudaEventSynchronize(s->ev_flush)); /* the last flush's upload read the staging */
  memcpy(s->flush_stage, b->flog_slot, sizeof(int32_t) * (size_t)n);
  memcpy(s->flush_stage + n, b->flog_pos, sizeof(int32_t) * (size_t)n);
  DI_CU(cudaMemcpyAsync(s->ints, s->flush_stage, sizeof(int32_t) * 2 * (size_t)n, cudaMemcpyHostToDevice, b->stream));
  DI_CU(cudaEventRecord(s->ev_flush, b->stream));
  s->flush_pending = 1;
  for (int c0 = 0; c0 < n; c0 += s->chunk) { /* (one pass of up to s->chunk rows: launches cost the host ~9 a pass) */
    const int m = n - c0 < s->chunk ? n - c0 : s->chunk;
    DI_TRY(context_rows(s, m, b->flog + (size_t)c0 * s->F, s->ints + c0, s->ints + n + c0));
  }
  return DI_OK;
}

extern "C" di_status di_cuda_dspark_log_on(di_cuda_dspark *s, int max_step_rows) {
  cu_backend *b = s->b;
  if (s->log_owner) return DI_OK;
  if (b->flog) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: its DSpark feature log belongs to another drafter");
  if (b->n_capture <= 0 || b->n_capture * b->H != s->F)
    return di_error_set(DI_ERR_INVALID_ARG, "DSpark feature log: the target captures %d x %d features, the drafter reads %d",
                        b->n_capture, b->H, s->F);
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "DSpark feature log: turned on while a step is in flight");
  int rows = 1;
  while (rows < max_step_rows) rows *= 2; /* a graph step's rows are a power of two */
  const int cap = rows * 2 > 8192 ? rows * 2 : 8192;
  DI_CU(cudaStreamSynchronize(b->stream));
  drop_graphs(b); /* their capture kernels write into cap_buf */
  DI_TRY(dev_alloc(b, (void **)&b->flog, sizeof(float) * (size_t)cap * s->F));
  b->flog_pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)cap);
  b->flog_slot = (int32_t *)malloc(sizeof(int32_t) * (size_t)cap);
  s->flush_async = di_switch_bool(DI_SW_DSPARK_FLUSH_ASYNC, 1);
  if (s->flush_async && cudaMallocHost((void **)&s->flush_stage, sizeof(int32_t) * 2 * (size_t)cap) != cudaSuccess)
    s->flush_stage = NULL;
  if (s->flush_stage && cudaEventCreateWithFlags(&s->ev_flush, cudaEventDisableTiming) != cudaSuccess) s->ev_flush = NULL;
  if (!b->flog_pos || !b->flog_slot || (s->flush_async && (!s->flush_stage || !s->ev_flush))) {
    s->log_owner = 1;
    log_off(s);
    return di_error_set(DI_ERR_OOM, "DSpark feature log: out of host memory");
  }
  b->flog_cap = cap;
  b->flog_n = 0;
  b->flog_flush = log_flush;
  b->flog_ctx = s;
  s->log_owner = 1;
  /* every flush's scratch (a chunk's rows, the async flush's slots and positions) now, not grown (a
   * stream sync, reallocations) at the first flushes while requests run. The async flush's passes take
   * as many rows as 64 MiB of context buffers hold (at least LOG_CHUNK, at most the log): the shipped
   * model's whole log of 8,192 rows in one pass (26 MB; was 8 passes of 1,024, ~72 launches, ~0.6 ms of
   * host time a flush: every 32 steps at batch 256) */
  const di_dspark *d = s->d;
  const size_t row_bytes = 2 * (size_t)s->F + 6 * (size_t)d->hidden + 8 * (size_t)s->kvd;
  int chunk = LOG_CHUNK;
  while (chunk < cap && (size_t)(2 * chunk) * row_bytes <= ((size_t)64 << 20)) chunk *= 2;
  s->chunk = s->flush_async ? chunk : LOG_CHUNK;
  DI_CU(cudaStreamSynchronize(b->stream));
  if (s->graph_owner) drop_proposal_graphs(b);
  if (s->chunk > s->cap_ctx) DI_TRY(reserve_ctx(s, s->chunk));
  DI_TRY(reserve(s, LOG_CHUNK, 2 * cap));
  /* DEEPINFER_DSPARK_FLUSH_WARM (default 0): one pass of a full flush now, every slot -1 (the cache write skips
   * them) over zero features, so the pass's GEMM shapes are planned at startup: on the H200 the first full flush
   * (at step 128 with 64 sequences) was one step of 3.4-3.8 ms, the planning of its M = 8,192 products (session 16) */
  if (di_switch_bool(DI_SW_DSPARK_FLUSH_WARM, 0)) {
    const int m = s->chunk < cap ? s->chunk : cap;
    DI_CU(cudaMemsetAsync(s->ints, 0xff, sizeof(int32_t) * 2 * (size_t)m, b->stream));
    DI_CU(cudaMemsetAsync(b->flog, 0, sizeof(float) * (size_t)m * s->F, b->stream));
    DI_TRY(context_rows(s, m, b->flog, s->ints, s->ints + m));
    DI_CU(cudaStreamSynchronize(b->stream));
  }
  return DI_OK;
}

static di_status block_forward(di_cuda_dspark *s, int n, const int32_t *d_tok, const int32_t *d_anchor, const int32_t *d_bt,
                               int bt_stride, int max_keys);

extern "C" di_status di_cuda_dspark_propose(di_cuda_dspark *s, int n, const int32_t *tok, const int32_t *pos,
                                           const di_batch_seq *seqs, const uint8_t *want, float *hidden, float *logits) {
  if (n <= 0) return DI_OK;
  const di_dspark *d = s->d;
  cu_backend *b = s->b;
  cudaStream_t st = b->stream;
  const int B = d->block_size, H = d->hidden, R = n * B, V = d->vocab;
  if (s->log_owner) DI_TRY(log_flush(s)); /* the context up to every anchor */
  int max_ctx = 0, bt_stride = 1;
  for (int i = 0; i < n; i++) {
    if (tok[i] < 0 || tok[i] >= V) return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafter: token id %d", tok[i]);
    if (pos[i] > 0) {
      int32_t g;
      DI_TRY(slot_of(s, &seqs[i], pos[i] - 1, &g));
    }
    if (pos[i] > max_ctx) max_ctx = pos[i];
    int nb = (pos[i] + DI_DRAFTER_BLOCK_TOKENS - 1) / DI_DRAFTER_BLOCK_TOKENS;
    if (nb > bt_stride) bt_stride = nb;
  }
  /* ints: block tokens [R], anchors [n], block tables [n][bt_stride] */
  const int n_ints = R + n + n * bt_stride;
  DI_TRY(reserve(s, R, n_ints));
  int32_t *h = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_ints);
  if (!h) return di_error_set(DI_ERR_OOM, "out of memory");
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < B; j++) h[i * B + j] = j == 0 ? tok[i] : d->mask_token;
    h[R + i] = pos[i];
    int nb = (pos[i] + DI_DRAFTER_BLOCK_TOKENS - 1) / DI_DRAFTER_BLOCK_TOKENS;
    for (int k = 0; k < bt_stride; k++) h[R + n + i * bt_stride + k] = k < nb ? seqs[i].block_table[k] : 0;
  }
  cudaError_t ce = cudaMemcpyAsync(s->ints, h, sizeof(int32_t) * (size_t)n_ints, cudaMemcpyHostToDevice, st);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(st);
  free(h);
  if (ce != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda: DSpark proposal upload: %s", cudaGetErrorString(ce));
  DI_TRY(block_forward(s, n, s->ints, s->ints + R, s->ints + R + n, bt_stride, max_ctx + B));
  s->last_n = n;
  if (!hidden && !logits) return DI_OK; /* (draft_greedy reads them on the device) */
  DI_CU(cudaStreamSynchronize(st));
  if (hidden) DI_CU(cudaMemcpy(hidden, s->hf, sizeof(float) * (size_t)R * H, cudaMemcpyDeviceToHost));
  /* the logits rows read (want), in runs of consecutive rows */
  const size_t row = sizeof(float) * (size_t)V;
  for (int i = 0; logits && i < R;) {
    if (want && !want[i]) { i++; continue; }
    int j = i;
    while (j < R && (!want || want[j])) j++;
    DI_CU(cudaMemcpy((char *)logits + i * row, (const char *)s->featf + i * row, (size_t)(j - i) * row, cudaMemcpyDeviceToHost));
    i = j;
  }
  return DI_OK;
}

/* n blocks of B rows (tokens d_tok [n * B], anchor positions d_anchor [n], drafter tables d_bt [n][bt_stride])
 * through every layer in one pass: the normed hidden rows into hf, the base logits into featf. max_keys:
 * at least every anchor + B (the attention's shared memory). Stream work only (no host sync), so it
 * runs eagerly or inside a step's graph. */
static di_status block_forward(di_cuda_dspark *s, int n, const int32_t *d_tok, const int32_t *d_anchor, const int32_t *d_bt,
                               int bt_stride, int max_keys) {
  const di_dspark *d = s->d;
  cu_backend *b = s->b;
  cudaStream_t st = b->stream;
  const int B = d->block_size, H = d->hidden, kvd = s->kvd, hd = d->head_dim, NH = d->n_heads, QD = s->qd;
  const int I = d->inter, R = n * B, V = d->vocab;
  const float scale = 1.0f / sqrtf((float)hd);
  DI_TRY(di_cuk_embed((const uint16_t *)s->embed, d_tok, NULL, R, H, s->x, st));
  for (int l = 0; l < d->n_layers; l++) {
    const cd_layer *L = &s->L[l];
    DI_TRY(di_cuk_rmsnorm(s->x, H, L->in_norm, R, H, d->eps, (uint16_t *)s->xn, H, NULL, st));
    DI_TRY(di_cu_gemm(b->blas, R, QD, H, (const uint16_t *)s->xn, H, (const uint16_t *)L->q, H, s->qf, QD, 1, 0.f, st));
    DI_TRY(di_cu_gemm(b->blas, R, kvd, H, (const uint16_t *)s->xn, H, (const uint16_t *)L->k, H, s->kf, kvd, 1, 0.f, st));
    DI_TRY(di_cu_gemm(b->blas, R, kvd, H, (const uint16_t *)s->xn, H, (const uint16_t *)L->v, H, s->vf, kvd, 1, 0.f, st));
    DI_TRY(di_cuk_head_norm_rope(s->qf, QD, R, NH, hd, L->q_norm, d->eps, d_anchor, B, s->inv_freq, st));
    DI_TRY(di_cuk_head_norm_rope(s->kf, kvd, R, d->n_kv_heads, hd, L->k_norm, d->eps, d_anchor, B, s->inv_freq, st));
    DI_TRY(di_cuk_dspark_attend(s->qf, s->kf, s->vf, cache_layer(s, l), d_bt, bt_stride, d_anchor, n, B, NH, d->n_kv_heads,
                                hd, scale, max_keys, (uint16_t *)s->att, st));
    DI_TRY(di_cu_gemm(b->blas, R, H, QD, (const uint16_t *)s->att, QD, (const uint16_t *)L->o, QD, s->x, H, 1, 1.f, st));
    DI_TRY(di_cuk_rmsnorm(s->x, H, L->post_norm, R, H, d->eps, (uint16_t *)s->xn, H, NULL, st));
    DI_TRY(di_cu_gemm(b->blas, R, 2 * I, H, (const uint16_t *)s->xn, H, (const uint16_t *)L->gate_up, H, s->gu, 2 * I, 0, 0.f, st));
    DI_TRY(di_cuk_silu_mul((const uint16_t *)s->gu, R, I, (uint16_t *)s->act, st));
    DI_TRY(di_cu_gemm(b->blas, R, H, I, (const uint16_t *)s->act, I, (const uint16_t *)L->down, I, s->x, H, 1, 1.f, st));
  }
  DI_TRY(di_cuk_rmsnorm(s->x, H, s->norm, R, H, d->eps, (uint16_t *)s->xn, H, s->hf, st));
  /* the base logits stay on the device for the greedy rounds; propose() copies the wanted rows */
  DI_TRY(di_cu_gemm(b->blas, R, V, H, (const uint16_t *)s->xn, H, (const uint16_t *)s->lm_head, H, s->featf, V, 1, 0.f, st));
  return DI_OK;
}

extern "C" di_status di_cuda_dspark_draft_greedy(di_cuda_dspark *s, int n, const int32_t *anchor, const int32_t *cap,
                                                int limit, int32_t *tok, float *conf) {
  if (n <= 0) return DI_OK;
  if (n != s->last_n)
    return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafter: greedy drafts of %d blocks after a proposal of %d", n, s->last_n);
  const di_dspark *d = s->d;
  cu_backend *b = s->b;
  cudaStream_t st = b->stream;
  const int B = d->block_size;
  if (n > s->cap_greedy) {
    int c = s->cap_greedy ? s->cap_greedy : 64;
    while (c < n) c *= 2;
    DI_CU(cudaStreamSynchronize(st));
    REALLOC(s->g_ints, sizeof(int32_t) * (size_t)c * (2 + B));
    REALLOC(s->g_conf, sizeof(float) * (size_t)c * B);
    s->cap_greedy = c;
  }
  int rounds = 0;
  for (int i = 0; i < n; i++) rounds = cap[i] > rounds ? cap[i] : rounds;
  if (rounds > B) rounds = B;
  DI_CU(cudaMemcpyAsync(s->g_ints, anchor, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, st));
  DI_CU(cudaMemcpyAsync(s->g_ints + n, cap, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, st));
  int32_t *d_tok = s->g_ints + 2 * n;
  for (int j = 0; j < rounds; j++)
    DI_TRY(di_cuk_dspark_greedy_round(s->featf, s->hf, s->g_ints, s->g_ints + n, j, n, B, d->vocab, limit, d->hidden,
                                      d->markov_rank, s->mw1, s->mw2, s->conf_w, d->conf_b, d->has_conf,
                                      d->conf_with_markov, d_tok, s->g_conf, s->gscr, st));
  DI_CU(cudaStreamSynchronize(st)); /* the anchors and caps above were copied from pageable memory */
  for (int i = 0; i < n; i++)
    for (int j = rounds; j < B; j++) tok[i * B + j] = -1;
  if (rounds > 0) {
    DI_CU(cudaMemcpy2D(tok, sizeof(int32_t) * B, d_tok, sizeof(int32_t) * B, sizeof(int32_t) * rounds, (size_t)n,
                       cudaMemcpyDeviceToHost));
    DI_CU(cudaMemcpy2D(conf, sizeof(float) * B, s->g_conf, sizeof(float) * B, sizeof(float) * rounds, (size_t)n,
                       cudaMemcpyDeviceToHost));
  }
  return DI_OK;
}

/* ---- proposals inside the step (di_cuda_dspark_graph_on) ------------------------------------------ */

/* the proposal's block buffers for blk blocks (device, and pinned host for its results) */
static di_status prop_alloc(di_cuda_dspark *s, int blk) {
  cu_backend *b = s->b;
  const int B = s->d->block_size;
  if (blk <= s->p_cap) return DI_OK;
  int c2 = s->p_cap ? s->p_cap : 64;
  while (c2 < blk) c2 *= 2;
  DI_CU(cudaStreamSynchronize(b->stream));
  drop_proposal_graphs(b); /* the step graphs with a proposal name the old buffers */
  const size_t ints = (size_t)c2 * (2 * (size_t)B + 5), host = (size_t)c2 * (2 + 2 * (size_t)B);
  REALLOC(s->p_dev, sizeof(int32_t) * (ints + (size_t)c2 * B));
  if (s->p_host) cudaFreeHost(s->p_host);
  s->p_host = NULL;
  DI_CU(cudaMallocHost((void **)&s->p_host, sizeof(int32_t) * host));
  s->p_cap = c2;
  return DI_OK;
}

static di_status prop_prepare(void *c, int rows, int blk) {
  di_cuda_dspark *s = (di_cuda_dspark *)c;
  cu_backend *b = s->b;
  const int B = s->d->block_size;
  DI_TRY(reserve(s, rows > blk * B ? rows : blk * B, 0));
  DI_TRY(prop_alloc(s, blk));
  s->p_n = b->prop_n;
  s->p_blk = blk;
  s->p_made = 1;
  return DI_OK;
}

/* Inside the step, after its sampling: the step's rows (the feature log's first Tp rows) into the
 * drafter's cache, the anchors from the samples (di_cuk_dspark_anchor), the blocks through the drafter,
 * the greedy rounds, and the anchors, drafts and confidences to the pinned host buffer. */
static di_status prop_forward(void *c) {
  di_cuda_dspark *s = (di_cuda_dspark *)c;
  cu_backend *b = s->b;
  cudaStream_t st = b->stream;
  const di_dspark *d = s->d;
  const int B = d->block_size, PB = b->prop_blk, PT = b->prop_bt, P = s->p_cap;
  const int32_t *first = b->d_prop, *last = first + PB, *cap = last + PB, *tabs = cap + PB, *cslot = tabs + (size_t)PB * PT;
  DI_TRY(context_rows(s, b->Tp, b->flog, cslot, b->d_pos));
  int32_t *btok = s->p_dev, *apos = btok + (size_t)P * B, *prev = apos + P, *pcap = prev + P, *aout = pcap + P;
  int32_t *otok = aout + 2 * (size_t)P;
  float *oconf = (float *)(otok + (size_t)P * B);
  DI_TRY(di_cuk_dspark_anchor(PB, first, last, cap, b->d_tokens, b->d_pos, b->d_sample_out, B, d->mask_token, btok, apos,
                              prev, pcap, aout, st));
  DI_TRY(block_forward(s, PB, btok, apos, tabs, PT, PT * DI_DRAFTER_BLOCK_TOKENS + B));
  for (int j = 0; j < B; j++)
    DI_TRY(di_cuk_dspark_greedy_round(s->featf, s->hf, prev, pcap, j, PB, B, d->vocab, s->p_limit, d->hidden, d->markov_rank,
                                      s->mw1, s->mw2, s->conf_w, d->conf_b, d->has_conf, d->conf_with_markov, otok, oconf,
                                      s->gscr, st));
  int32_t *h = s->p_host;
  DI_CU(cudaMemcpyAsync(h, aout, sizeof(int32_t) * 2 * (size_t)PB, cudaMemcpyDeviceToHost, st));
  DI_CU(cudaMemcpyAsync(h + 2 * (size_t)P, otok, sizeof(int32_t) * (size_t)PB * B, cudaMemcpyDeviceToHost, st));
  DI_CU(cudaMemcpyAsync(h + 2 * (size_t)P + (size_t)P * B, oconf, sizeof(float) * (size_t)PB * B, cudaMemcpyDeviceToHost, st));
  return DI_OK;
}

extern "C" di_status di_cuda_dspark_graph_on(di_cuda_dspark *s, int vocab_limit) {
  cu_backend *b = s->b;
  if (!s->log_owner) return di_error_set(DI_ERR_INVALID_ARG, "DSpark proposals in the step need the drafter's feature log on");
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "DSpark proposals in the step: turned on while a step is in flight");
  if (s->d->markov_rank > 1024) return di_error_set(DI_ERR_UNSUPPORTED, "DSpark drafter on CUDA: Markov rank %d > 1024", s->d->markov_rank);
  drop_graphs(b);
  /* the block buffers for the most blocks a step can propose (one a sequence, a graph step's at most
   * DI_CUDA_PROP_MAX_T: ~20 KB) now: made at the first proposal, their pinned allocation (cudaMallocHost)
   * and sync cost that step ~5 ms on the H200 (session 15) */
  DI_TRY(prop_alloc(s, DI_CUDA_PROP_MAX_T));
  s->p_limit = vocab_limit < s->d->vocab ? vocab_limit : s->d->vocab;
  b->prop_prepare = prop_prepare;
  b->prop_forward = prop_forward;
  b->prop_ctx = s;
  b->prop_split = di_switch_bool(DI_SW_DSPARK_PROP_GRAPH, 0); /* the proposal as a graph of its own (cuda_step.cu) */
  s->graph_owner = 1;
  return DI_OK;
}

extern "C" di_status di_cuda_dspark_graph_drafts(di_cuda_dspark *s, int n, int *made, int32_t *anchor, int32_t *tok,
                                                float *conf) {
  cu_backend *b = s->b;
  *made = 0;
  if (!s->graph_owner || !b->prop_on || !s->p_made) return DI_OK; /* (prop_on: the last step submitted) */
  s->p_made = 0;
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafts of a step still in flight");
  if (n != s->p_n) return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafts of %d sequences after a step of %d", n, s->p_n);
  const int B = s->d->block_size, P = s->p_cap;
  DI_CU(cudaStreamSynchronize(b->stream)); /* (wait() synchronised already: free) */
  memcpy(anchor, s->p_host, sizeof(int32_t) * 2 * (size_t)n);
  memcpy(tok, s->p_host + 2 * (size_t)P, sizeof(int32_t) * (size_t)n * B);
  memcpy(conf, s->p_host + 2 * (size_t)P + (size_t)P * B, sizeof(float) * (size_t)n * B);
  *made = 1;
  return DI_OK;
}
