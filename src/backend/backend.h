/* The backend interface: what the engine asks of a device (CPU, CUDA). The engine (scheduler + KV
 * block manager) decides WHAT runs each step and hands the backend a plain di_batch; the backend owns
 * the weights on its device, the KV block pool and the forward pass. Nothing here knows about
 * requests, sampling policy or tokenizers.
 *
 * KV cache addressing: the pool is `n_blocks` blocks of DI_KV_BLOCK_SIZE tokens. The token at
 * position p of sequence s lives in block `seqs[s].block_table[p / DI_KV_BLOCK_SIZE]`, slot
 * p % DI_KV_BLOCK_SIZE, for every layer. A forward step first writes the cache entries of all its
 * tokens, then computes attention: token i attends to positions [0, positions[i]] of its sequence
 * (so a chunk of a prompt sees the earlier chunks through the cache). */
#ifndef DI_BACKEND_H
#define DI_BACKEND_H
#include <stdint.h>
#include "util/status.h"
#include "model/config.h"

#define DI_KV_BLOCK_SIZE 64

typedef struct di_batch_seq {
  const int32_t *block_table; /* block ids, enough to cover every position this step touches */
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

/* What the engine needs to size the KV pool. One group for MLA models; DeepSeek-V4 adds groups
 * (sliding window, compressed entries, indexer keys) with their own sizes. */
typedef struct di_kv_group_info {
  int n_layers;               /* layers that keep an entry per token in this group */
  int64_t bytes_per_token;    /* all layers of the group together, in the backend's cache dtype */
  int tokens_per_entry;       /* 1: every token; 4 or 128: compressed groups (V4) */
  int window;                 /* 0: whole context; else only the last `window` tokens are kept */
  /* 1: a sequence's cache cannot be shared with another (no prefix caching, no prompt blocks shared
   * between samples): the backend keeps per-sequence state that the blocks do not hold (V4) */
  int no_sharing;
  /* bytes every running sequence holds besides its per-token growth (V4's sliding-window ring and
   * compressor scratch); the KV plan sets max_num_seqs of them aside from the budget */
  int64_t bytes_per_seq;
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
