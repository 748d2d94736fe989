/* The DSpark drafter's forward on the CPU (arch/dspark.h holds its weights) and its KV cache.
 *
 * Context: every position the target has computed gets one context row, hidden_norm(fc(features)),
 * whose keys (k_norm, RoPE at the position) and values every drafter layer keeps in the drafter's
 * cache. That cache is paged by the sequence's table in the engine's drafter KV group (its own pool,
 * DI_DRAFTER_BLOCK_TOKENS slots a block; the seqs handed in carry that table), which the KV manager
 * allocates, prefix-caches, truncates and frees with the request: a block's drafter rows were written
 * when the target computed the block's positions.
 *
 * Proposal: for each sequence a block of block_size rows [anchor token, mask, ..., mask] at
 * positions a..a+B-1 attends to the context rows of positions < a and to the whole block (not
 * causal; the block's own keys are never cached) through the GQA op (cpu_gqa.h), then the MLP; the
 * output is norm(h) per row and the base logits lm_head(norm(h)). The Markov term and the confidence
 * head depend on the previous draft token, so they are separate calls made left to right. */
#ifndef DI_CPU_DSPARK_H
#define DI_CPU_DSPARK_H
#include "arch/dspark.h"
#include "backend/backend.h"
#include "util/threadpool.h"

typedef struct di_cpu_dspark di_cpu_dspark;

di_status di_cpu_dspark_create(const di_dspark *d, di_threadpool *tp, di_cpu_dspark **out);
void di_cpu_dspark_free(di_cpu_dspark *s);
/* (Re)allocates the cache for n_blocks blocks of DI_DRAFTER_BLOCK_TOKENS positions (the drafter group's pool). */
di_status di_cpu_dspark_kv_alloc(di_cpu_dspark *s, int64_t n_blocks);
/* Context rows: feats [n][n_feats * target_hidden]; row t is position pos[t] of seqs[seq_of[t]]. */
di_status di_cpu_dspark_context(di_cpu_dspark *s, int n, const float *feats, const int32_t *pos, const int32_t *seq_of,
                                const di_batch_seq *seqs);
/* One block per sequence i: anchor token tok[i] at position pos[i] (context rows < pos[i] must be
 * written). hidden [n * B][hidden] = norm(h), logits [n * B][vocab] = base logits (either may be NULL). */
di_status di_cpu_dspark_propose(di_cpu_dspark *s, int n, const int32_t *tok, const int32_t *pos, const di_batch_seq *seqs,
                                float *hidden, float *logits);
/* The same with want [n * B] (NULL: all): only those rows' logits are computed (the others untouched). */
di_status di_cpu_dspark_propose_rows(di_cpu_dspark *s, int n, const int32_t *tok, const int32_t *pos,
                                     const di_batch_seq *seqs, const uint8_t *want, float *hidden, float *logits);
/* logits[vocab] += markov_w2 . markov_w1[prev] (nothing when markov_rank is 0). */
void di_cpu_dspark_markov(di_cpu_dspark *s, int32_t prev, float *logits);
/* The confidence head's probability for a row with hidden state h after token prev (1 without a head). */
float di_cpu_dspark_confidence(di_cpu_dspark *s, const float *h, int32_t prev);
#endif
