/* A block drafter as the engine sees it (DSpark; the CPU implementation is
 * src/backend/cpu/cpu_dspark.c, bound by src/api/engine_spec.c). The engine feeds it the target's
 * features of every computed position (context), asks it for one block per decoding sequence
 * (propose), then applies the Markov head and the confidence head left to right itself. */
#ifndef DI_ENGINE_DRAFTER_H
#define DI_ENGINE_DRAFTER_H
#include "backend/backend.h"

typedef struct di_drafter_ops {
  void *ctx;
  int block_size;  /* rows of a proposal: block_size drafts */
  int hidden;      /* the drafter's hidden size (propose's hidden rows) */
  int feat_dim;    /* one feature row: what the target backend's wait() writes per output row */
  int64_t cache_bytes_per_token; /* the drafter's cache per position: its KV group's size (in the KV budget) */
  /* (re)allocates the drafter's cache: n_blocks blocks of DI_DRAFTER_BLOCK_TOKENS positions, the pool
   * of the engine's drafter KV group (di_engine_add_drafter_group). The seqs handed to context and
   * propose carry each sequence's table in that group (block ids < n_blocks). */
  di_status (*kv_alloc)(void *ctx, int64_t n_blocks);
  di_status (*context)(void *ctx, int n, const float *feats, const int32_t *pos, const int32_t *seq_of,
                       const di_batch_seq *seqs);
  /* want [n * block_size] (NULL: all): rows whose logits are read (the others may stay unwritten);
   * hidden / logits NULL: not returned (draft_greedy drafts every block where they are) */
  di_status (*propose)(void *ctx, int n, const int32_t *tok, const int32_t *pos, const di_batch_seq *seqs,
                       const uint8_t *want, float *hidden, float *logits);
  /* Optional (NULL: the engine drafts on the host with markov / confidence): greedy drafts of the
   * last proposal's n blocks made where its logits are (the CUDA drafter: on the device), block i's
   * rounds j < cap[i] (cap 0: a block the engine drafts itself) from anchor[i]; tok / conf [n][block_size],
   * -1 where it stopped. The same arithmetic as markov + argmax over [0, limit) + confidence. */
  di_status (*draft_greedy)(void *ctx, int n, const int32_t *anchor, const int32_t *cap, int limit, int32_t *tok,
                            float *conf);
  /* Optional (NULL: context() is fed from the host): from now on the drafter takes the target's
   * features of every step on the device itself (the CUDA drafter's feature log), so the engine
   * neither copies them to the host nor calls context(); max_step_rows: the most rows of a step. */
  di_status (*context_on_device)(void *ctx, int max_step_rows);
  /* Optional (NULL: every proposal runs after the step through propose): from now on (after
   * context_on_device) a step whose batch carries propose_row / propose_cap (backend.h) proposes
   * inside itself, greedy over [0, vocab_limit) (the CUDA drafter: in the step's graph, after its
   * sampling; anchors found on the device from the samples). graph_drafts returns the last such step's
   * blocks for its n sequences: anchor [n][2] (token, position; -1: no block), tok / conf
   * [n][block_size] (-1 past a block's cap); *made 0 when that step did not propose (the backend
   * declined it, e.g. a step too large): the engine then proposes after the step as before. */
  di_status (*graph_on)(void *ctx, int vocab_limit);
  di_status (*graph_drafts)(void *ctx, int n, int *made, int32_t *anchor, int32_t *tok, float *conf);
  void (*markov)(void *ctx, int32_t prev, float *logits);
  float (*confidence)(void *ctx, const float *hidden, int32_t prev);
  void (*destroy)(void *ctx);
} di_drafter_ops;
#endif
