/* Log-likelihood of continuations (di_model_loglikelihood, _batch) with the rows per forward call
 * exposed, so tests can force the multi-chunk and multi-group paths on short sequences. */
#ifndef DI_API_MODEL_LOGLIK_H
#define DI_API_MODEL_LOGLIK_H
#include "deepinfer.h"

/* di_model_loglikelihood_batch with at most `max_rows` logits rows per forward call (<= 0: default). */
di_status di_model_loglikelihood_batch_rows(di_model *m, int n_seqs, const int32_t *const *ids, const int *n,
                                            const int *start, int max_rows, float *logprob, int *is_greedy);
/* di_model_loglikelihood with at most `max_rows` logits rows per forward call (<= 0: the default,
 * about 64 MiB of logits). */
di_status di_model_loglikelihood_chunked(di_model *m, const int32_t *ids, int n, int start, int max_rows,
                                         float *logprob, int *is_greedy);
#endif
