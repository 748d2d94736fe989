/* DeepSeek-V4 cached (incremental) forward on the CPU: a per-sequence state that holds what later
 * tokens need (sliding-window K=V, compressed entries, indexer keys, the compressors' pending windows)
 * and a step that appends n tokens (a prompt chunk or one decode token) and returns their logits.
 * Equal to the reference forward (di_cpu_v4_forward_full) bit for bit under any chunking;
 * tests/model/test_v4_cached.c. */
#ifndef DI_BACKEND_CPU_DEEPSEEK_V4_CACHE_H
#define DI_BACKEND_CPU_DEEPSEEK_V4_CACHE_H
#include <stddef.h>
#include <stdint.h>
#include "arch/deepseek_v4.h"
#include "backend/cpu/cpu_deepseek_v4_pages.h"

/* One sequence's state, per layer:
 *  - every layer: K=V of the last sliding_window-1 positions (a ring; the current token is the W-th key);
 *  - CSA and HCA layers: the compressed entries made so far (one per complete window of rate tokens),
 *    and the compressor's pending rows (kv, gate + position bias) of the incomplete window;
 *  - CSA layers also: the previous complete window's rows (its Ca half joins the next entry), and the
 *    same three things for the indexer's own compressor (its entries are the indexer's keys).
 * Sizes: the ring and the pending rows are fixed; the entries grow by one per rate tokens. */
typedef struct di_v4_seq_state di_v4_seq_state;

/* A fresh state (position 0) for a model of this configuration. */
di_status di_v4_seq_state_create(const di_v4_config *cfg, di_v4_seq_state **out);
void di_v4_seq_state_free(di_v4_seq_state *s);
/* A state whose window rows and compressed entries live in the engine's cache blocks
 * (cpu_deepseek_v4_pages.h), passed to each step; the state itself holds only the compressors'
 * open windows (fixed size). */
di_status di_v4_seq_state_create_paged(const di_v4_config *cfg, di_v4_seq_state **out);
int di_v4_seq_state_is_paged(const di_v4_seq_state *s);
/* A paged state resumed at position pos (a multiple of 64, > 0) from blocks that hold a sequence's
 * first pos positions (a prefix-cache hit): the open windows from the snapshot of block pos/64 - 1;
 * window rows and entries are read from the blocks by the following steps. */
di_status di_v4_seq_state_restore(di_v4_seq_state *s, const di_v4_config *cfg, const di_v4_pages *pg, int64_t pos);
/* SWA bounded replay: a paged state resumed at position pos from blocks that hold only the compressed
 * entries and indexer keys of the first pos positions (no window rows, no snapshot). The following
 * steps must feed positions pos - replay .. pos - 1 again (replay <= pos): they rebuild the window rows
 * and the compressors' open windows (their entries are not pooled again; no snapshot is written for
 * the prefix) while seeing only the replayed window keys before them, so the rebuilt window is an
 * approximation of the exact one; the logits of replayed positions are approximate too. */
di_status di_v4_seq_state_restore_replay(di_v4_seq_state *s, const di_v4_config *cfg, const di_v4_pages *pg, int64_t pos,
                                         int replay);
/* Back to position 0 (the memory is kept). */
void di_v4_seq_state_reset(di_v4_seq_state *s);
/* A bounded replay's bounds (both 0 otherwise): window rows exist from win_start; positions below
 * replay_until are being replayed. */
void di_v4_seq_state_replay_bounds(const di_v4_seq_state *s, int64_t *win_start, int64_t *replay_until);
/* Tokens appended so far. */
int64_t di_v4_seq_state_positions(const di_v4_seq_state *s);
/* Bytes of cache data the state holds now (rings, pending rows and the entries made so far; not the
 * spare capacity of its growable arrays). */
size_t di_v4_seq_state_bytes(const di_v4_seq_state *s);

/* Appends tokens[0..n) (n >= 1) at positions state.positions ... and writes their logits to
 * logits_out [n][vocab_size]. Equal to di_cpu_v4_forward_full over the whole sequence so far, bit for
 * bit, however the sequence was cut into steps (the indexer's fixed tie rule; see cpu_deepseek_v4.h).
 * Bad arguments (a NULL pointer, n < 1, a token outside the vocabulary, a state made for another
 * configuration) are errors naming the problem and leave the state as it was; a state whose step
 * failed midway (out of memory) refuses further steps until reset. */
di_status di_cpu_v4_forward_step(const di_v4_config *cfg, const di_v4_weights *w, di_v4_seq_state *s, const int32_t *tokens,
                                 int n, float *logits_out);
/* The same step, writing only the logits of rows[0..n_rows) (ascending indices into tokens) to
 * logits_out [n_rows][vocab_size] (NULL when n_rows is 0): the same bits as those rows of the full
 * step (the head is per row); the engine's backend asks for the rows it samples. */
di_status di_cpu_v4_forward_step_rows(const di_v4_config *cfg, const di_v4_weights *w, di_v4_seq_state *s,
                                      const int32_t *tokens, int n, const int *rows, int n_rows, float *logits_out);

/* The step of a paged state over its blocks pg (checked: every block the step reads or writes must be
 * in the tables): the same logits, bit for bit, as the self-contained state's step. */
di_status di_cpu_v4_forward_step_paged(const di_v4_config *cfg, const di_v4_weights *w, di_v4_seq_state *s,
                                       const di_v4_pages *pg, const int32_t *tokens, int n, const int *rows, int n_rows,
                                       float *logits_out);

#endif
