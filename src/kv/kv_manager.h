/* The paged KV block manager: pools of blocks (one pool per cache group), per-sequence block tables
 * per group, and prefix caching (full blocks named by a hash chain over their tokens, shared by
 * reference count, evicted LRU when free blocks run out).
 *
 * Groups: the model declares its cache groups (backend kv_groups; kinds in backend.h); the engine may
 * add its DSpark drafter's (di_engine_add_drafter_group). A group's block covers block_tokens positions
 * (DI_KV_BLOCK_SIZE unless the group says otherwise; a compressed group's block holds the entries whose
 * window closes in it); block sizes divide DI_KV_BLOCK_SIZE, so a prefix hit has one length for all
 * groups: a multiple of 64 tokens (each group hashes its own blocks: a 16-token group registers and
 * finds four blocks per 64 tokens). A group with
 * a `window` only needs the blocks that cover the last `window` positions: older ones are given back
 * by di_kv_slide; given back with their hash, they stay findable (LRU) for later prefix hits, and a
 * hit of k blocks needs from such a group only the blocks covering the window before position 64 k
 * (the table holds -1 before them). Group 0's table is the one V2/V3 backends read.
 *
 * Invariants (checked by di_kv_check): a block is either referenced by >= 1 sequence or sits on
 * its pool's free list (LRU order, oldest first); a block that holds a registered hash is findable
 * in the hash table until it is handed out again (evicted). */
#ifndef DI_KV_MANAGER_H
#define DI_KV_MANAGER_H
#include <stdint.h>
#include "backend/backend.h"

typedef struct di_kv_manager di_kv_manager;

/* A sequence's view of the cache: one block table per group. Zero-initialise before first use. */
typedef struct di_kv_seq {
  int32_t *table[DI_KV_MAX_GROUPS]; /* block ids; -1 where a window group already gave a block back */
  int n[DI_KV_MAX_GROUPS];          /* blocks in the table */
  int cap[DI_KV_MAX_GROUPS];
  int n_hashed[DI_KV_MAX_GROUPS];   /* leading full blocks whose hash is known (registered or hit) */
  uint64_t last_hash[DI_KV_MAX_GROUPS]; /* chain hash of block n_hashed-1 (0 when none) */
  int n_freed[DI_KV_MAX_GROUPS];    /* leading blocks of a window group already given back */
} di_kv_seq;

typedef struct di_kv_stats {
  int64_t total_blocks;     /* all groups */
  int64_t used_blocks;      /* referenced by a sequence */
  int64_t free_blocks;      /* on free lists (includes cached ones) */
  int64_t cached_blocks;    /* free blocks still holding a reusable hashed prefix */
  int64_t query_tokens;     /* prompt tokens looked up in the prefix cache */
  int64_t hit_tokens;       /* of those, found cached */
  int64_t evictions;        /* cached blocks handed out again */
} di_kv_stats;

/* Creates the manager: group g gets n_blocks[g] blocks. prefix_caching: 0 disables lookups (hashes
 * are still registered, so `n` samples of one prompt can share its blocks; see di_kv_match_prefix). */
di_status di_kv_manager_create(const di_kv_group_info *groups, int n_groups, const int64_t *n_blocks,
                               int prefix_caching, di_kv_manager **out);
void di_kv_manager_free(di_kv_manager *m);
int di_kv_num_groups(const di_kv_manager *m);
int64_t di_kv_group_blocks(const di_kv_manager *m, int g);
/* Group g as the manager keeps it: block_tokens filled in (never 0), tokens_per_entry >= 1. */
const di_kv_group_info *di_kv_group(const di_kv_manager *m, int g);

/* Sizes the pools from a byte budget: every full-context group gets enough blocks (of its
 * block_tokens) to hold the same number of tokens; window groups get at most what `max_seqs` sequences can hold in their window,
 * plus one step's chunk (step_tokens: the engine's max_num_batched_tokens).
 * Groups' bytes_per_seq (times max_seqs) are set aside from the budget first.
 * Fills n_blocks[g]; fails when not even one block of each group fits. */
di_status di_kv_plan(const di_kv_group_info *groups, int n_groups, int64_t budget_bytes, int max_seqs, int step_tokens,
                     int64_t *n_blocks);

/* 1 when a sequence of n_tokens positions, computed in steps of at most step_tokens, can ever fit
 * (every group's pool holds the blocks it needs at once: a window group only those of its window and
 * a step); else 0 with the first group that cannot and its need. */
int di_kv_fits(const di_kv_manager *m, int64_t n_tokens, int step_tokens, int *group, int64_t *need);
/* SWA bounded replay: the sliding-window and state groups keep nothing for cached prefixes (their
 * blocks are never registered); a prefix hit takes only the other groups' blocks, is at least the
 * largest window long, and gets fresh sliding-window blocks for the window before the hit, which the
 * caller recomputes (the last window - 1 tokens of the hit). */
void di_kv_set_bounded_replay(di_kv_manager *m);
/* 0 when no sequence can take another's blocks (a group marked no_sharing):
 * di_kv_match_prefix then finds nothing, and samples of one request compute their prompts alone. */
int di_kv_shares_prefixes(const di_kv_manager *m);
/* Prefix lookup for an empty sequence: takes references on the cached blocks that hold the longest
 * prefix of tokens[0..n_tokens-1) (never the whole sequence: the last token is always computed, as
 * its logits are wanted) that every group can serve, and appends them to the tables. `force` looks up even when prefix caching
 * is off (samples of one request share their prompt). Returns the number of tokens found. */
int di_kv_match_prefix(di_kv_manager *m, di_kv_seq *s, const int32_t *tokens, int n_tokens, int force);
/* Blocks that allocating up to n_tokens (positions [0, n_tokens)) would take from the pools, per
 * group summed; 0 if the tables already cover it. */
int64_t di_kv_blocks_needed(const di_kv_manager *m, const di_kv_seq *s, int n_tokens);
/* 1 when di_kv_allocate(s, n_tokens) would succeed. */
int di_kv_can_allocate(const di_kv_manager *m, const di_kv_seq *s, int n_tokens);
/* Extends the tables to cover positions [0, n_tokens). All or nothing: DI_ERR_OOM (with a message)
 * when the free blocks do not suffice; the sequence is unchanged then. */
di_status di_kv_allocate(di_kv_manager *m, di_kv_seq *s, int n_tokens);
/* The KV of tokens[0..n_valid) is now written: registers the hashes of the full blocks among them so
 * that later requests can share them. */
void di_kv_commit(di_kv_manager *m, di_kv_seq *s, const int32_t *tokens, int n_valid);
/* Window groups: gives back blocks wholly before position `pos` - window (the next token to compute
 * is at `pos`), registering those among tokens[0..n_known) first (di_kv_commit), so that they stay
 * findable for prefix hits while cached. */
void di_kv_slide(di_kv_manager *m, di_kv_seq *s, const int32_t *tokens, int n_known, int pos);
/* Gives back the tail blocks not needed for positions [0, n_tokens) (undoing an allocation that
 * was planned but not used; those blocks hold no registered hash). */
void di_kv_truncate(di_kv_manager *m, di_kv_seq *s, int n_tokens);
/* Drops every reference of the sequence (tail blocks first, so they are evicted first) and frees
 * its tables. The sequence may be reused afterwards. */
void di_kv_free_seq(di_kv_manager *m, di_kv_seq *s);

void di_kv_get_stats(const di_kv_manager *m, di_kv_stats *st);
/* Verifies the invariants above plus `expected_refs` (the references the caller's live sequences
 * hold, -1 to skip). DI_ERR_INTERNAL with a message naming the broken one. */
di_status di_kv_check(const di_kv_manager *m, int64_t expected_refs);
/* References held by one sequence (for di_kv_check's expected_refs). */
int64_t di_kv_seq_refs(const di_kv_manager *m, const di_kv_seq *s);
/* Chain hash of one block: parent hash and the block's tokens. Stable across runs. */
uint64_t di_kv_block_hash(uint64_t parent, const int32_t *tokens, int n);
#endif
