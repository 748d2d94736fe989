/* Log-likelihood of a continuation (di_model_loglikelihood) with the chunk size exposed, so tests can
 * force the multi-chunk path on short sequences. */
#ifndef DI_API_MODEL_LOGLIK_H
#define DI_API_MODEL_LOGLIK_H
#include "deepinfer.h"

/* di_model_loglikelihood with at most `max_rows` logits rows per forward call (<= 0: the default,
 * about 64 MiB of logits). */
di_status di_model_loglikelihood_chunked(di_model *m, const int32_t *ids, int n, int start, int max_rows,
                                         float *logprob, int *is_greedy);
#endif
