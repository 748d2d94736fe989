/* A one-sequence di_batch for the DeepSeek-V4 CUDA tests (test_cuda_v4.c, test_cuda_v4_kernels.c, test_cuda_mx_tc.c): n tokens
 * at positions p0 .. p0 + n - 1 of one sequence, its block table, either every row an output row or only
 * the last, and optionally the engine's cache groups' tables (n_groups > 0: each group's table and
 * block count; 0: none, the backend's own pools of kv_alloc). The token, position, sequence and row
 * arrays live in the struct (tokens copied from ids, or zero when ids is NULL: the caller fills tok). */
#ifndef DI_TEST_V4_ONE_SEQ_H
#define DI_TEST_V4_ONE_SEQ_H
#include "backend/backend.h"
#include <stdlib.h>
#include <string.h>

typedef struct v4_one_seq {
  di_batch b;
  di_batch_seq seq;
  int32_t *tok, *pos, *seq_of, *rows; /* [n] each (one allocation) */
  const int32_t *gt[DI_KV_MAX_GROUPS];
  int gb[DI_KV_MAX_GROUPS];
} v4_one_seq;

/* Returns 0 when out of memory. all_rows: every row an output row, else only the last. */
static inline int v4_one_seq_init(v4_one_seq *o, const int32_t *ids, int n, int p0, uint64_t key, const int32_t *table,
                                  int n_blocks, int n_groups, const int32_t *const *group_tables, const int *group_blocks,
                                  int all_rows) {
  memset(o, 0, sizeof *o);
  o->tok = (int32_t *)calloc((size_t)(n > 0 ? n : 1) * 4, sizeof(int32_t));
  if (!o->tok) return 0;
  o->pos = o->tok + n;
  o->seq_of = o->pos + n;
  o->rows = o->seq_of + n;
  for (int t = 0; t < n; t++) {
    o->tok[t] = ids ? ids[t] : 0;
    o->pos[t] = p0 + t;
    o->seq_of[t] = 0;
  }
  const int n_out = all_rows ? n : (n > 0 ? 1 : 0);
  for (int i = 0; i < n_out; i++) o->rows[i] = all_rows ? i : n - 1;
  o->seq.block_table = table;
  o->seq.n_blocks = n_blocks;
  o->seq.key = key;
  for (int g = 0; g < n_groups && g < DI_KV_MAX_GROUPS; g++) {
    o->gt[g] = group_tables[g];
    o->gb[g] = group_blocks[g];
  }
  o->b.n_tokens = n;
  o->b.tokens = o->tok;
  o->b.positions = o->pos;
  o->b.seq_of = o->seq_of;
  o->b.n_seqs = 1;
  o->b.seqs = &o->seq;
  o->b.n_outputs = n_out;
  o->b.output_rows = o->rows;
  o->b.n_groups = n_groups;
  o->b.group_tables = n_groups > 0 ? o->gt : NULL;
  o->b.group_blocks = n_groups > 0 ? o->gb : NULL;
  return 1;
}

static inline void v4_one_seq_free(v4_one_seq *o) {
  free(o->tok);
  memset(o, 0, sizeof *o);
}
/* One prompt of T tokens (ids (t * 7919) % 4096) through be in one step as sequence 1 on blocks 0..3,
 * every row's logits into logits; the sequence released after. Shared by the random V4-Flash model
 * checks of test_cuda_v4_kernels.c and test_cuda_mx_tc.c. */
static inline di_status v4_run_prompt(di_backend *be, int T, float *logits) {
  int32_t tok[128], table[4] = {0, 1, 2, 3};
  for (int t = 0; t < T; t++) tok[t] = (t * 7919) % 4096;
  v4_one_seq o;
  di_status st = v4_one_seq_init(&o, tok, T, 0, 1, table, 4, 0, NULL, NULL, 1) ? DI_OK : DI_ERR_OOM;
  if (st == DI_OK) st = be->ops->kv_alloc(be, 8);
  if (st == DI_OK) st = be->ops->submit(be, &o.b);
  if (st == DI_OK) st = be->ops->wait(be, logits, NULL);
  be->ops->release(be, 1);
  v4_one_seq_free(&o);
  return st;
}

#endif
