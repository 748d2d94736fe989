/* Sampling one token from one row of logits: logit bias, bans and masks (padding ids, grammar),
 * repetition / presence / frequency penalties, log-probabilities (chosen + top-n), then greedy or
 * temperature + top-k + top-p + min-p and one counter-based draw.
 *
 * Order (documented for users): bias -> bans/masks -> penalties -> logprobs are taken here (the
 * distribution after penalties and masks, before temperature and truncation) -> temperature ->
 * top-k -> top-p -> min-p -> draw. Greedy (temperature <= 0) takes the largest logit, the lowest id
 * on ties. A row never depends on another row: the engine samples rows independently. */
#ifndef DI_SAMPLER_H
#define DI_SAMPLER_H
#include <stdint.h>
#include "util/status.h"

#define DI_MAX_LOGPROBS 20

typedef struct di_sampling {
  float temperature, top_p, min_p;
  int top_k;
  float repetition_penalty, presence_penalty, frequency_penalty;
  const int32_t *bias_ids;
  const float *bias_values;
  int n_bias;
  const int32_t *ban_ids;      /* never sampled this step (min_tokens) */
  int n_ban;
  int logprobs;                /* < 0: none */
  uint64_t seed;
  uint64_t stream;             /* the sample index */
} di_sampling;

typedef struct di_sample_result {
  int32_t token;
  float logprob;
  int n_top;
  int32_t top_ids[DI_MAX_LOGPROBS];
  float top_logprobs[DI_MAX_LOGPROBS];
} di_sample_result;

typedef struct di_sampler di_sampler; /* scratch buffers for one vocabulary size; one thread */

/* Row statistics shared by everything that turns logits into log-probabilities (the sampler's
 * logprobs, the engine's prompt logprobs, di_model_loglikelihood): the largest logit and its lowest id
 * (-1 when every logit is -inf or NaN; NaN never wins), and sum_i exp(l[i] - mx) in double with NaN
 * logits left out (the log-softmax's normaliser is mx + log of it). */
int32_t di_row_argmax(const float *l, int V, float *out_max);
double di_row_expsum(const float *l, int V, float mx);

di_status di_sampler_create(int vocab, di_sampler **out);
void di_sampler_free(di_sampler *s);

/* Samples from `logits` ([vocab], modified in place). Ids >= vocab_limit are never chosen; when
 * `allow` (a bitmask, bit i = id i allowed) is non-NULL only allowed ids are. `history` holds the
 * prompt (first n_prompt) then the output tokens (n_history in all) for the penalties. `counter`
 * is the position being generated (keys the draw). DI_ERR_INVALID_ARG when nothing is allowed. */
di_status di_sampler_sample(di_sampler *s, float *logits, int vocab_limit, const di_sampling *sp,
                            const int32_t *history, int n_prompt, int n_history, const uint32_t *allow,
                            uint64_t counter, di_sample_result *res);
/* The distribution di_sampler_sample draws from, for speculative sampling (min(1, p/q) acceptance):
 * the same processing of `logits` (in place: bias, masks, bans, penalties), then temperature and
 * top-k / top-p / min-p; probs[i] for i < the vocabulary limit, summing to 1 (greedy: one-hot at the
 * argmax). *lse is the log-softmax normaliser of the processed logits when sp->logprobs >= 0. */
di_status di_sampler_probs(di_sampler *s, float *logits, int vocab_limit, const di_sampling *sp,
                           const int32_t *history, int n_prompt, int n_history, const uint32_t *allow,
                           float *probs, double *lse);
/* Inverse-CDF draw in id order from non-negative weights (normalised here) with uniform u in [0, 1);
 * -1 when every weight is 0. */
int32_t di_sample_from_probs(const float *probs, int V, double u);
/* res for token `tok` of processed logits l (as di_sampler_probs left them): its log-probability and
 * the top `logprobs` (as di_sampler_sample reports them). */
void di_sampler_logprobs(const float *l, int V, int logprobs, double lse, int32_t tok, di_sample_result *res);
/* Checks parameter ranges; names the bad one. */
di_status di_sampling_validate(const di_sampling *sp, int vocab);
#endif
