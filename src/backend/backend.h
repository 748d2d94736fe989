/* The backend interface: what the engine asks of a device (CPU, CUDA). The engine (scheduler + KV
 * block manager) decides WHAT runs each step and hands the backend a plain di_batch; the backend owns
 * the weights on its device, the KV block pool and the forward pass. Nothing here knows about
 * requests, sampling policy or tokenizers.
 *
 * KV cache addressing: the cache is made of groups (di_kv_group_info: kinds below), each a pool of
 * blocks, and every block of every group the backend reports covers DI_KV_BLOCK_SIZE token positions
 * (the engine's own DSpark drafter group: DI_DRAFTER_BLOCK_TOKENS, see block_tokens): block i of a
 * sequence's table in group g holds what group g keeps for positions [64 i, 64 i + 64) (a token's
 * K/V, the compressed entries whose window closes there, a state snapshot at the block's end).
 * Group 0 (the only one of V2/V3, the MLA latents) is `seqs[s].block_table`: the token at position p
 * lives in block `block_table[p / DI_KV_BLOCK_SIZE]`, slot p % DI_KV_BLOCK_SIZE, for every layer.
 * A forward step first writes the cache entries of all its tokens, then computes attention: token i
 * attends to positions [0, positions[i]] of its sequence (so a chunk of a prompt sees the earlier
 * chunks through the cache). */
#ifndef DI_BACKEND_H
#define DI_BACKEND_H
#include <stdint.h>
#include "util/status.h"
#include "model/config.h"

#define DI_KV_BLOCK_SIZE 64
#define DI_KV_MAX_GROUPS 8
/* A DSpark drafter's cache group (the engine adds it: di_engine_add_drafter_group) pages by blocks of
 * this many positions: block i of a sequence's drafter table holds positions [16 i, 16 i + 16). */
#define DI_DRAFTER_BLOCK_TOKENS 16

typedef struct di_batch_seq {
  const int32_t *block_table; /* group 0's block ids, enough to cover every position this step touches */
  int n_blocks;
  /* Stable identity of the running sequence (the engine: request id and sample index), for backends
   * that keep per-sequence state beside the blocks (DeepSeek-V4's CPU backend); others ignore it.
   * The engine calls ops->release(key) when the sequence's KV is freed. */
  uint64_t key;
} di_batch_seq;

typedef struct di_batch {
  int n_tokens;
  const int32_t *tokens;      /* [n_tokens] token ids */
  const int32_t *positions;   /* [n_tokens] position of each token in its sequence */
  const int32_t *seq_of;      /* [n_tokens] index into seqs */
  int n_seqs;
  const di_batch_seq *seqs;   /* [n_seqs] */
  int n_outputs;
  const int32_t *output_rows; /* [n_outputs] rows (token indices) whose logits are wanted, ascending */
  /* Optional [n_outputs] (NULL: none), for backends with ops->sample: how the step's output rows will
   * be sampled, given at submit so the device samples as part of the step (no launches between
   * steps). The step's sample / sample_async call still passes its rows; where they differ from these
   * the backend samples again with them, so a wrong guess costs time, never a different token. */
  const struct di_sample_row *sample_rows;
  /* Every cache group's tables, for backends with more than one group (n_groups 0: the batch carries
   * group 0 only, as seqs[].block_table). Sequence s's table in group g is group_tables[s * n_groups
   * + g] with group_blocks[s * n_groups + g] entries (group 0's equals seqs[s].block_table). An entry
   * of -1 is a block a sliding-window or state group has given back (behind the window); the engine
   * never asks a step to read one. A sequence whose first position in a step is P > 0 and that the
   * backend holds no state for starts from a prefix-cache hit: P is a multiple of DI_KV_BLOCK_SIZE
   * and the tables hold what the groups keep for [0, P) (the backend restores its per-sequence state
   * from there). */
  int n_groups;
  const int32_t *const *group_tables;
  const int *group_blocks;
  /* Optional [n_seqs] (NULL: none), SWA bounded replay: seq_replay[s] = R > 0 on the step that
   * resumes sequence s from a prefix-cache hit at P = its first position + R whose blocks keep no
   * window rows (nor state snapshots): its first R positions (of this step and, when the step is
   * shorter, the next ones) are replayed to rebuild the sliding window; P is a multiple of
   * DI_KV_BLOCK_SIZE. */
  const int32_t *seq_replay;
  /* Optional [n_outputs] (NULL: every output row's logits are wanted): 0 where an output row's logits
   * are not wanted (speculative decoding makes every row an output row for its hidden state, but only
   * the sampled and prompt-logprob rows need logits). A backend may leave those rows of the logits
   * unwritten or compute them anyway. */
  const uint8_t *output_logits;
  /* Optional [n_seqs] (NULL: no drafter group): each sequence's block table in the engine's DSpark
   * drafter cache group (blocks of DI_DRAFTER_BLOCK_TOKENS positions, drafter_blocks[s] entries), for a
   * backend that feeds the drafter's cache from the step itself (the CUDA feature log). The target's
   * forward never reads it. */
  const int32_t *const *drafter_tables;
  const int *drafter_blocks;
  /* Optional [n_seqs] (NULL: no proposal in the step): a DSpark proposal made inside the step itself
   * (the CUDA drafter in the step's graph, after the step's own sampling; needs sample_rows and the
   * feature log). propose_row[s] >= 0: the row whose sample is sequence s's first new token; the rows
   * after it up to the sequence's last row are its drafts, accepted on the device while they equal the
   * samples before them, and the block is anchored at the token after the last accepted one (its
   * sample); propose_cap[s] draft rounds at most. -1: no block for s. */
  const int32_t *propose_row;
  const int32_t *propose_cap;
} di_batch;

/* Per output row sampling request for backends that sample on the device (optional). */
typedef struct di_sample_row { /* (di_batch.sample_rows above) */
  float temperature;          /* <= 0: greedy */
  float top_p;                /* 1: off */
  int top_k;                  /* <= 0: off */
  float min_p;                /* 0: off */
  uint64_t seed;              /* counter-based RNG key */
  uint64_t counter;           /* position in the request: (seed, counter) -> one uniform draw */
  int vocab_limit;            /* ids >= vocab_limit never sampled (padding beyond the tokenizer) */
} di_sample_row;

/* What a cache group keeps (the KV spec; vLLM's KV cache groups):
 *  FULL        one entry per token, for the whole context (V2/V3's MLA latents);
 *  SLIDING     one entry per token, only the last `window` positions are read: the blocks wholly
 *              behind the window are given back while the sequence runs (di_kv_slide);
 *  COMPRESSED  one entry per `tokens_per_entry` tokens (V4's C4 / C128 entries), stored in the block
 *              where the entry's window closes;
 *  INDEXER     like COMPRESSED: the CSA indexer's compressed keys;
 *  STATE       per block, a snapshot of per-sequence state at the block's end (V4's open compressor
 *              windows), so that a prefix-cache hit can resume there; only the newest block is
 *              needed by a running sequence (window = DI_KV_BLOCK_SIZE).
 * Per-sequence state a running sequence holds outside the blocks (the open compressor windows
 * themselves) is `bytes_per_seq`. */
typedef enum di_kv_kind { DI_KV_FULL = 0, DI_KV_SLIDING, DI_KV_COMPRESSED, DI_KV_INDEXER, DI_KV_STATE } di_kv_kind;

typedef struct di_kv_group_info {
  int n_layers;               /* layers that keep entries in this group */
  /* one block's bytes / DI_KV_BLOCK_SIZE, all layers of the group together, in the backend's cache
   * dtype (what the KV plan sizes pools by) */
  int64_t bytes_per_token;
  int tokens_per_entry;       /* 1: every token; m: compressed groups (one entry per m tokens) */
  int window;                 /* 0: whole context; else only the last `window` positions are read */
  /* 1: a sequence's cache cannot be shared with another (no prefix caching, no prompt blocks shared
   * between samples): the backend keeps state that the blocks do not hold. 0: a prefix hit may
   * share the group's blocks. */
  int no_sharing;
  /* bytes every running sequence holds besides its blocks (V4's open compressor windows); the KV
   * plan sets max_num_seqs of them aside from the budget */
  int64_t bytes_per_seq;
  di_kv_kind kind;
  int64_t bytes_per_entry;    /* one entry (token, compressed entry or snapshot), all layers */
  /* positions one block of this group covers; 0 (what backends report) means DI_KV_BLOCK_SIZE. Other
   * values must divide DI_KV_BLOCK_SIZE and are for FULL groups without a window (the DSpark drafter's
   * group: DI_DRAFTER_BLOCK_TOKENS), so a prefix hit (a multiple of DI_KV_BLOCK_SIZE) ends on a block
   * boundary of every group. bytes_per_token stays per token: a block is block_tokens x it. */
  int block_tokens;
} di_kv_group_info;

typedef struct di_backend di_backend;

typedef struct di_backend_ops {
  const char *name;
  /* KV layout facts of this model on this backend. Returns the number of groups (<= cap). */
  int (*kv_groups)(di_backend *b, di_kv_group_info *groups, int cap);
  /* (Re)allocates the KV pool with n_blocks blocks of DI_KV_BLOCK_SIZE tokens. */
  di_status (*kv_alloc)(di_backend *b, int64_t n_blocks);
  /* Starts a forward step. The batch's arrays must stay valid until wait() returns. */
  di_status (*submit)(di_backend *b, const di_batch *batch);
  /* Finishes the step started by submit(); writes logits [n_outputs][vocab] (host, float32) when
   * `logits` is non-NULL, and the final hidden states of the output rows [n_outputs][hidden] (after
   * the final norm; for MTP drafting) when `hidden` is non-NULL. */
  di_status (*wait)(di_backend *b, float *logits, float *hidden);
  /* Optional (NULL if unsupported): after wait(), sample one token per output row on the device. */
  di_status (*sample)(di_backend *b, const di_sample_row *rows, int n, int32_t *tokens);
  /* Optional (NULL, or n_mtp_layers == 0: unavailable): the model's first MTP layer, for speculative
   * decoding. tokens[t] follows the token whose final hidden state is prev_hidden[t] ([n_tokens][hidden]);
   * writes the MTP layer's KV entries at positions[t]; logits [n_outputs][vocab] and hidden_out
   * [n_outputs][hidden] (the MTP output before its head, for a next draft) of the output rows, either
   * may be NULL. Synchronous (not between submit and wait). */
  di_status (*mtp)(di_backend *b, const di_batch *batch, const float *prev_hidden, float *logits, float *hidden_out);
  /* Optional (NULL: the backend keeps no per-sequence state): the sequence with this key is gone
   * (finished, aborted, preempted): drop its state. Unknown keys are ignored. Never called while a
   * step that contains the sequence is in flight. */
  void (*release)(di_backend *b, uint64_t key);
  /* Optional pair (both or neither), for device backends: sampling whose tokens stay on the device, so
   * the next step can be queued before the host has them ("zero-overhead" decoding). sample_async:
   * instead of wait() + sample(), queue the sampling of the submitted step's output rows (one per row,
   * as sample()) behind it, without blocking; the step then counts as finished for submit(), and its
   * logits and hidden states cannot be read. A following submit() may then hold token ids < 0 in its
   * batch: -1 - j is the token sampled for output row j of that step, resolved on the device.
   * sample_fetch: blocks until those tokens are on the host and writes them (one per row); it may be
   * called after the next submit(), whose work then overlaps it. */
  di_status (*sample_async)(di_backend *b, const di_sample_row *rows, int n);
  di_status (*sample_fetch)(di_backend *b, int32_t *tokens);
  void (*destroy)(di_backend *b);
  /* Optional (NULL: host memory, no device to report; the engine then uses a fixed KV budget): for
   * sizing the KV cache by gpu_memory_utilization. Reserves the buffers of the largest step the
   * engine will submit (max_step_tokens tokens, max_outputs output rows) so that they count as used,
   * then reports the device's total memory and the bytes in use (weights, workspaces) before the KV
   * pool is allocated. */
  di_status (*memory_info)(di_backend *b, int max_step_tokens, int max_outputs, int64_t *total_bytes,
                           int64_t *used_bytes);
  /* Optional, for backends that report more than one group (kv_groups): (re)allocates every group's
   * pool, n_blocks[g] blocks for group g; batches then carry every group's tables. Without it the
   * engine uses kv_alloc (group 0) and refuses a backend with more groups. */
  di_status (*kv_alloc_groups)(di_backend *b, const int64_t *n_blocks, int n_groups);
  /* Optional (NULL: not supported): --kv-cache-dtype fp8, the latent cache in E4M3 with one f32 scale per
   * token per 128 latent channels and the rope part in bf16 (docs/quantization.md); before kv_groups is
   * read and before the first kv_alloc. */
  di_status (*set_kv_fp8)(di_backend *b);
  /* Optional (NULL: none): the step sizes in tokens that this backend replays from captured graphs,
   * ascending, at most cap of them; a step of fewer tokens than the largest is padded up to the next
   * (the CUDA backend: powers of two up to DI_CUDA_GRAPH_MAX_T, none with graphs off). Returns the
   * count. For a step-time profile per bucket (DSpark's startup profile, engine/spec_profile.c). */
  int (*graph_buckets)(di_backend *b, int *tokens, int cap);
} di_backend_ops;

struct di_backend {
  const di_backend_ops *ops;
  const di_model_config *cfg;
  int vocab_size, hidden_size;
  int n_mtp_layers; /* MTP layers the backend can run through ops->mtp */
};

/* Synchronous forward: submit + wait. */
static inline di_status di_backend_forward(di_backend *b, const di_batch *batch, float *logits) {
  DI_TRY(b->ops->submit(b, batch));
  return b->ops->wait(b, logits, NULL);
}
#endif
