/* The DSpark block drafter on the CUDA backend (cuda_dspark.cu): the same operations as the CPU's
 * (backend/cpu/cpu_dspark.h, whose comment describes the cache and the block), on the device of the
 * target's CUDA backend and its stream; plus the target's feature capture the drafter reads. */
#ifndef DI_CUDA_DSPARK_H
#define DI_CUDA_DSPARK_H
#include "arch/dspark.h"
#include "backend/backend.h"

/* Sets (n > 0) or clears (n == 0) the capture of the target layers layer_ids (increasing, in
 * [-1, n_layers); -1 the embedding, the last layer's after the final norm): wait()'s hidden rows are then
 * [n_outputs][n * hidden] f32, per id that layer's output (as the CPU's di_cpu_backend_set_capture). */
di_status di_backend_cuda_set_capture(di_backend *b, const int *layer_ids, int n);

typedef struct di_cuda_dspark di_cuda_dspark;
/* Uploads the drafter's weights to the device of `target` (a CUDA V2/V3 backend, which must outlive it). */
di_status di_cuda_dspark_create(di_backend *target, const di_dspark *d, di_cuda_dspark **out);
void di_cuda_dspark_free(di_cuda_dspark *s);
di_status di_cuda_dspark_kv_alloc(di_cuda_dspark *s, int64_t n_blocks);
/* The CPU's di_cpu_dspark_context / di_cpu_dspark_propose, host arrays in and out. */
di_status di_cuda_dspark_context(di_cuda_dspark *s, int n, const float *feats, const int32_t *pos, const int32_t *seq_of,
                                 const di_batch_seq *seqs);
di_status di_cuda_dspark_propose(di_cuda_dspark *s, int n, const int32_t *tok, const int32_t *pos, const di_batch_seq *seqs,
                                 const uint8_t *want, float *hidden, float *logits);
/* The context fed on the device from now on (cuda_dspark.cu's comment): the target's captured features
 * of each step go to a device log that becomes cache entries before each proposal; context() is then
 * not needed (nor the host's copy of the features). max_step_rows: the most rows of a step. */
di_status di_cuda_dspark_log_on(di_cuda_dspark *s, int max_step_rows);
/* Greedy drafts of the blocks of the last proposal (n its block count), on the device: per block i
 * and round j < cap[i] the Markov term of the previous draft (anchor[i] for j = 0) added to row j's
 * base logits, the argmax over [0, limit) and the confidence head; tok / conf [n][block_size] (-1 past
 * the cap). The host path of the engine (spec_dspark.c) does the same for the CPU drafter. */
di_status di_cuda_dspark_draft_greedy(di_cuda_dspark *s, int n, const int32_t *anchor, const int32_t *cap, int limit,
                                      int32_t *tok, float *conf);
/* Proposals inside the step from now on (needs the feature log on): a step whose batch carries
 * propose_row (backend.h) drafts in its own graph after its sampling, greedy over [0, vocab_limit). */
di_status di_cuda_dspark_graph_on(di_cuda_dspark *s, int vocab_limit);
/* The drafts of the last step that proposed, for its n sequences: anchor [n][2] (token, position; -1:
 * none), tok / conf [n][block_size] (-1 past a block's cap); *made 0 when the last step proposed
 * nothing (or they were read already). */
di_status di_cuda_dspark_graph_drafts(di_cuda_dspark *s, int n, int *made, int32_t *anchor, int32_t *tok, float *conf);
#endif
