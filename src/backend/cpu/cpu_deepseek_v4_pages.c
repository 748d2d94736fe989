/* DeepSeek-V4's cache groups on the CPU: layout of the blocks and the checks of a step's tables (see
 * cpu_deepseek_v4_pages.h). */
#include "backend/cpu/cpu_deepseek_v4_pages.h"
#include <string.h>

#define WHO "DeepSeek-V4 cache blocks"

/* floats of one compressor's open windows: pending kv + gate rows, and CSA's previous window's */
static size_t comp_floats(int dim, int rate, int overlap) {
  const size_t width = overlap ? 2 * (size_t)dim : (size_t)dim;
  return (size_t)rate * width * (overlap ? 4 : 2);
}

void di_v4_layout_init(const di_v4_config *c, di_v4_layout *y) {
  memset(y, 0, sizeof *y);
  y->n_layers = c->n_layers;
  y->head_dim = c->head_dim;
  y->index_head_dim = c->index_head_dim;
  y->window = c->sliding_window;
  size_t snap = 0;
  for (int l = 0; l < c->n_layers; l++) {
    if (c->attn_kind[l] == DI_V4_ATTN_CSA) {
      y->lidx[l] = y->n_csa++;
      y->snap_off[l] = snap;
      y->snap_floats[l] = comp_floats(c->head_dim, c->csa_rate, 1);
      snap += y->snap_floats[l] + comp_floats(c->index_head_dim, c->csa_rate, 1);
    } else if (c->attn_kind[l] == DI_V4_ATTN_HCA) {
      y->lidx[l] = y->n_hca++;
      y->snap_off[l] = snap;
      y->snap_floats[l] = comp_floats(c->head_dim, c->hca_rate, 0);
      snap += y->snap_floats[l];
    }
  }
  const int B = DI_KV_BLOCK_SIZE;
  y->slots[DI_V4_G_CSA] = y->slots[DI_V4_G_INDEX] = (B + c->csa_rate - 1) / c->csa_rate;
  y->slots[DI_V4_G_HCA] = (B + c->hca_rate - 1) / c->hca_rate;
  y->block_floats[DI_V4_G_CSA] = (size_t)y->n_csa * y->slots[DI_V4_G_CSA] * c->head_dim;
  y->block_floats[DI_V4_G_INDEX] = (size_t)y->n_csa * y->slots[DI_V4_G_INDEX] * c->index_head_dim;
  y->block_floats[DI_V4_G_HCA] = (size_t)y->n_hca * y->slots[DI_V4_G_HCA] * c->head_dim;
  y->block_floats[DI_V4_G_WINDOW] = (size_t)c->n_layers * B * c->head_dim;
  y->block_floats[DI_V4_G_STATE] = snap;
  for (int k = 0; k < DI_V4_N_KINDS; k++)
    y->group_of[k] = y->block_floats[k] > 0 ? y->n_groups++ : -1;
}

int di_v4_layout_groups(const di_v4_layout *y, const di_v4_config *c, int elem_bytes, di_kv_group_info *g, int cap) {
  static const di_kv_kind kind[DI_V4_N_KINDS] = {DI_KV_COMPRESSED, DI_KV_INDEXER, DI_KV_COMPRESSED, DI_KV_SLIDING, DI_KV_STATE};
  for (int k = 0; k < DI_V4_N_KINDS; k++) {
    const int gi = y->group_of[k];
    if (gi < 0 || gi >= cap)
      continue;
    const int64_t block_bytes = (int64_t)y->block_floats[k] * elem_bytes;
    di_kv_group_info *o = &g[gi];
    memset(o, 0, sizeof *o);
    o->kind = kind[k];
    o->n_layers = k == DI_V4_G_HCA ? y->n_hca : k == DI_V4_G_WINDOW ? y->n_layers : y->n_csa;
    if (k == DI_V4_G_STATE)
      o->n_layers = y->n_csa + y->n_hca;
    o->bytes_per_token = (block_bytes + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    o->tokens_per_entry = k == DI_V4_G_HCA ? c->hca_rate : k <= DI_V4_G_INDEX ? c->csa_rate : k == DI_V4_G_STATE ? DI_KV_BLOCK_SIZE : 1;
    o->bytes_per_entry = k == DI_V4_G_WINDOW ? block_bytes / DI_KV_BLOCK_SIZE
                         : k == DI_V4_G_STATE ? block_bytes
                                              : block_bytes / (y->slots[k] > 0 ? y->slots[k] : 1);
    /* the window group: the last W positions (the step's own keys included); the state group: the
     * newest block only (a running sequence writes the snapshot of the block it fills) */
    o->window = k == DI_V4_G_WINDOW ? c->sliding_window : k == DI_V4_G_STATE ? DI_KV_BLOCK_SIZE : 0;
  }
  return y->n_groups;
}

/* block index blk of kind k present (in the table, not given back, inside the pool) */
static di_status need(const di_v4_pages *pg, int k, int64_t blk, const char *what, int64_t pos) {
  static const char *const name[DI_V4_N_KINDS] = {"CSA entries", "indexer keys", "HCA entries", "window", "state"};
  if (blk >= pg->n[k] || blk < 0)
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": the %s table has %d blocks; %s at position %lld needs block %lld", name[k],
                        pg->n[k], what, (long long)pos, (long long)blk);
  const int32_t b = pg->table[k][blk];
  if (b < 0 || b >= pg->pool_blocks[k])
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": %s block %lld is %d (%s at position %lld; the pool has %lld blocks)", name[k],
                        (long long)blk, b, b < 0 ? "given back" : "out of range", (long long)pos, (long long)pg->pool_blocks[k]);
  return DI_OK;
}

di_status di_v4_pages_check(const di_v4_pages *pg, int64_t pos0, int n, int64_t win_start, int64_t replay_until, int restore) {
  const di_v4_layout *y = pg->lay;
  const int64_t B = DI_KV_BLOCK_SIZE, end = pos0 + n;
  if (restore && (pos0 % B != 0 || pos0 <= 0))
    return di_error_set(DI_ERR_INVALID_ARG, WHO ": a sequence resumed from cached blocks must start at a multiple of %d, not %lld",
                        DI_KV_BLOCK_SIZE, (long long)pos0);
  /* window: the rows read (W-1 before pos0) and written */
  int64_t first = pos0 - (y->window - 1);
  if (first < win_start)
    first = win_start;
  for (int64_t blk = first / B; blk <= (end - 1) / B; blk++)
    DI_TRY(need(pg, DI_V4_G_WINDOW, blk, "the sliding window", blk * B < first ? first : blk * B));
  /* entries: every block so far (the entries of a whole-context group) */
  for (int k = DI_V4_G_CSA; k <= DI_V4_G_HCA; k++)
    if (y->group_of[k] >= 0)
      for (int64_t blk = 0; blk <= (end - 1) / B; blk++)
        DI_TRY(need(pg, k, blk, "compressed entries", blk * B));
  if (y->group_of[DI_V4_G_STATE] >= 0) {
    if (restore)
      DI_TRY(need(pg, DI_V4_G_STATE, pos0 / B - 1, "the snapshot to resume from", pos0));
    for (int64_t blk = pos0 / B; (blk + 1) * B <= end; blk++) /* snapshots this step writes */
      if ((blk + 1) * B > replay_until)
        DI_TRY(need(pg, DI_V4_G_STATE, blk, "a snapshot", (blk + 1) * B));
  }
  return DI_OK;
}

void di_v4_batch_pages(const di_v4_layout *lay, float *const *pool, const int64_t *pool_blocks, const di_batch *bt, int q,
                       di_v4_pages *pg) {
  memset(pg, 0, sizeof *pg);
  pg->lay = lay;
  for (int k = 0; k < DI_V4_N_KINDS; k++) {
    const int gi = lay->group_of[k];
    if (gi < 0)
      continue;
    pg->pool[k] = pool[k];
    pg->pool_blocks[k] = pool_blocks[k];
    pg->table[k] = bt->group_tables[(size_t)q * bt->n_groups + gi];
    pg->n[k] = bt->group_blocks[(size_t)q * bt->n_groups + gi];
  }
}

di_status di_v4_batch_span(const di_batch *bt, int q, int from, int *t0, int *n, const char *who) {
  int t = from;
  while (t < bt->n_tokens && bt->seq_of[t] != q)
    t++;
  *t0 = t;
  int k = t;
  while (k < bt->n_tokens && bt->seq_of[k] == q)
    k++;
  *n = k - t;
  for (int j = k; j < bt->n_tokens; j++)
    if (bt->seq_of[j] == q)
      return di_error_set(DI_ERR_INVALID_ARG, "%s: the tokens of batch sequence %d are not contiguous in the batch", who, q);
  return DI_OK;
}

di_status di_v4_batch_check(const di_batch *bt, int vocab, int n_groups, const char *who) {
  if (!bt || bt->n_tokens < 0 || bt->n_seqs < 0 || (bt->n_tokens > 0 && (!bt->tokens || !bt->positions || !bt->seq_of)) ||
      (bt->n_seqs > 0 && !bt->seqs) || bt->n_outputs < 0 || bt->n_outputs > bt->n_tokens ||
      (bt->n_outputs > 0 && !bt->output_rows) || (bt->n_groups > 0 && (!bt->group_tables || !bt->group_blocks)))
    return di_error_set(DI_ERR_INVALID_ARG, "%s: malformed batch", who);
  if (bt->n_groups > 0 && bt->n_groups != n_groups)
    return di_error_set(DI_ERR_INVALID_ARG, "%s: the batch carries %d cache groups' tables, the model has %d", who, bt->n_groups,
                        n_groups);
  for (int t = 0; t < bt->n_tokens; t++) {
    if (bt->seq_of[t] < 0 || bt->seq_of[t] >= bt->n_seqs)
      return di_error_set(DI_ERR_INVALID_ARG, "%s: token %d belongs to sequence %d of %d", who, t, bt->seq_of[t], bt->n_seqs);
    if (bt->tokens[t] < 0 || bt->tokens[t] >= vocab)
      return di_error_set(DI_ERR_INVALID_ARG, "%s: token id %d at batch row %d is outside the vocabulary [0, %d)", who,
                          bt->tokens[t], t, vocab);
  }
  for (int j = 0; j < bt->n_outputs; j++)
    if (bt->output_rows[j] < 0 || bt->output_rows[j] >= bt->n_tokens || (j > 0 && bt->output_rows[j] <= bt->output_rows[j - 1]))
      return di_error_set(DI_ERR_INVALID_ARG, "%s: output row %d is %d (rows must ascend within the batch's %d tokens)", who, j,
                          bt->output_rows[j], bt->n_tokens);
  int from = 0;
  for (int q = 0; q < bt->n_seqs; q++) {
    for (int p = 0; p < q; p++)
      if (bt->seqs[p].key == bt->seqs[q].key)
        return di_error_set(DI_ERR_INVALID_ARG, "%s: sequence key %llu appears twice in one batch", who,
                            (unsigned long long)bt->seqs[q].key);
    int t0, n;
    DI_TRY(di_v4_batch_span(bt, q, from, &t0, &n, who));
    if (n == 0)
      continue;
    from = t0 + n;
    for (int k = 1; k < n; k++)
      if (bt->positions[t0 + k] != bt->positions[t0] + k)
        return di_error_set(DI_ERR_INVALID_ARG, "%s: sequence key %llu: positions %d then %d are not consecutive", who,
                            (unsigned long long)bt->seqs[q].key, bt->positions[t0 + k - 1], bt->positions[t0 + k]);
  }
  return DI_OK;
}
