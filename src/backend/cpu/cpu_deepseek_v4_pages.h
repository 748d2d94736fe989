/* Where DeepSeek-V4's cached data lives in the engine's KV cache groups (backend.h), for the CPU:
 * which groups a configuration has, the float layout of one block of each, and the addresses of a
 * sequence's window rows, compressed entries and state snapshots through its block tables.
 *
 * Every group's block covers 64 token positions (DI_KV_BLOCK_SIZE):
 *   window   [n_layers][64][head_dim]   K=V of each position (sliding, freed behind the window)
 *   csa      [n_csa][slots][head_dim]   CSA entries whose window of csa_rate tokens closes in the block
 *   index    [n_csa][slots][index_hd]   the CSA indexer's compressed keys, likewise
 *   hca      [n_hca][slots][head_dim]   HCA entries (hca_rate 128 > 64: one slot, half the blocks empty)
 *   state    per compressor of each layer, its open windows at the block's end (the snapshot a
 *            prefix hit at that block resumes from; only the newest is needed while running)
 * slots = ceil(64 / rate); entry e (positions [e*rate, (e+1)*rate)) is in block ((e+1)*rate-1)/64,
 * slot e - floor(64*block/rate). Groups with no layers are left out (an all-sliding model has only
 * the window group). */
#ifndef DI_BACKEND_CPU_DEEPSEEK_V4_PAGES_H
#define DI_BACKEND_CPU_DEEPSEEK_V4_PAGES_H
#include <stddef.h>
#include <stdint.h>
#include "arch/deepseek_v4.h"
#include "backend/backend.h"

enum { DI_V4_G_CSA, DI_V4_G_INDEX, DI_V4_G_HCA, DI_V4_G_WINDOW, DI_V4_G_STATE, DI_V4_N_KINDS };

typedef struct di_v4_layout {
  int n_groups;                    /* engine groups, in the order csa, index, hca, window, state (present ones) */
  int group_of[DI_V4_N_KINDS];     /* engine group index of each kind, -1 when absent */
  size_t block_floats[DI_V4_N_KINDS];
  int slots[DI_V4_N_KINDS];        /* entry slots per block (csa, index, hca) */
  int n_csa, n_hca, n_layers, head_dim, index_head_dim, window;
  int lidx[DI_V4_MAX_LAYERS];      /* a CSA layer's index among CSA layers, an HCA layer's among HCA layers */
  size_t snap_off[DI_V4_MAX_LAYERS]; /* float offset of the layer's snapshot in a state block */
  size_t snap_floats[DI_V4_MAX_LAYERS]; /* its compressor's part (CSA: the indexer's follows) */
} di_v4_layout;

void di_v4_layout_init(const di_v4_config *c, di_v4_layout *lay);
/* The engine's group descriptions (kinds, bytes, windows) of this layout with elem_bytes per cached
 * value (the CPU's f32: 4); returns n_groups (<= cap). The V4 registry entry declares its groups
 * through it (api/arch_deepseek_v4.c). */
int di_v4_layout_groups(const di_v4_layout *lay, const di_v4_config *c, int elem_bytes, di_kv_group_info *g, int cap);

/* One sequence's view of the pools for one step: each kind's pool base and its block table. */
typedef struct di_v4_pages {
  const di_v4_layout *lay;
  float *pool[DI_V4_N_KINDS];
  int64_t pool_blocks[DI_V4_N_KINDS];
  const int32_t *table[DI_V4_N_KINDS];
  int n[DI_V4_N_KINDS];
} di_v4_pages;

/* Checks that a step of n tokens from position pos0 reads and writes only blocks the tables hold
 * (ids in range, none given back where needed): window rows from max(pos0 - (W-1), win_start) on
 * (win_start: where a bounded replay's rows begin, else 0), every entry block so far, and the state
 * blocks of the snapshots it writes (block ends past replay_until: a replay writes none of the
 * prefix's); `restore`: the step resumes from the snapshot at pos0 (a prefix hit), which must be
 * there too. Named errors. */
di_status di_v4_pages_check(const di_v4_pages *pg, int64_t pos0, int n, int64_t win_start, int64_t replay_until, int restore);

/* Sequence q's view of the pools (pool[k] / pool_blocks[k] per kind) through the batch's group tables. */
void di_v4_batch_pages(const di_v4_layout *lay, float *const *pool, const int64_t *pool_blocks, const di_batch *bt, int q,
                       di_v4_pages *pg);
/* First token index (from `from` on) and count of sequence q in the batch; an error (prefixed by who)
 * when its tokens are not contiguous. */
di_status di_v4_batch_span(const di_batch *bt, int q, int from, int *t0, int *n, const char *who);
/* The checks every V4 backend makes of a batch before it changes any state: shape, sequence and vocabulary
 * ranges, ascending output rows, no key twice, contiguous tokens with consecutive positions per sequence;
 * with group tables, that their count is n_groups. Named errors prefixed by who. */
di_status di_v4_batch_check(const di_batch *bt, int vocab, int n_groups, const char *who);

static inline float *di_v4_window_row(const di_v4_pages *pg, int l, int64_t pos) {
  const di_v4_layout *y = pg->lay;
  const int32_t b = pg->table[DI_V4_G_WINDOW][pos / DI_KV_BLOCK_SIZE];
  return pg->pool[DI_V4_G_WINDOW] + (((size_t)b * y->n_layers + l) * DI_KV_BLOCK_SIZE + (size_t)(pos % DI_KV_BLOCK_SIZE)) * y->head_dim;
}
/* Entry e of kind k (csa, index or hca) of the layer with index lidx among its kind's layers. */
static inline float *di_v4_entry(const di_v4_pages *pg, int k, int lidx, int rate, int dim, int e) {
  const int64_t blk = ((int64_t)(e + 1) * rate - 1) / DI_KV_BLOCK_SIZE;
  const int slot = e - (int)(blk * DI_KV_BLOCK_SIZE / rate), slots = pg->lay->slots[k];
  const int32_t b = pg->table[k][blk];
  const int n_in = k == DI_V4_G_HCA ? pg->lay->n_hca : pg->lay->n_csa;
  return pg->pool[k] + (((size_t)b * n_in + lidx) * slots + slot) * dim;
}
/* The state block of block index blk (its snapshot is the state at position 64 (blk + 1)). */
static inline float *di_v4_state_block(const di_v4_pages *pg, int64_t blk) {
  return pg->pool[DI_V4_G_STATE] + (size_t)pg->table[DI_V4_G_STATE][blk] * pg->lay->block_floats[DI_V4_G_STATE];
}
#endif
