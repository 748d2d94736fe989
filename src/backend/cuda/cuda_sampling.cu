/* Sampling on the CUDA backend: the tokens of a step sampled inside its graph when the engine's
 * guessed rows hold (else sampled again after it), their copy to the host through two pinned halves,
 * and device token feedback (sample_async / sample_fetch: the next step reads the tokens on the device). */
#include "cuda_backend_impl.cuh"
#include <string.h>

/* the device's sampled tokens of the last step to the host (the next half of h_sample_out) */
di_status queue_tokens(cu_backend *b, int n) {
  b->tok_par ^= 1;
  DI_CU(cudaMemcpyAsync(b->h_sample_out + (size_t)b->tok_par * b->cap_out, b->d_sample_out, sizeof(int32_t) * (size_t)n,
                        cudaMemcpyDeviceToHost, b->stream));
  DI_CU(cudaEventRecord(b->ev_sampled[b->tok_par], b->stream));
  return DI_OK;
}

/* The step sampled these rows already: the rows submitted with it equal them (a greedy row's seed and
 * counter do not matter). */
static int sampled_in_step(const cu_backend *b, const di_sample_row *rows, int n) {
  if (!b->step_sample || n != b->n_out) return 0;
  for (int i = 0; i < n; i++) {
    const di_sample_row *a = &rows[i], *c = &b->sub_rows[i];
    const int greedy = !(a->temperature > 0.f) || a->top_k == 1;
    if (a->temperature != c->temperature || a->top_k != c->top_k || a->vocab_limit != c->vocab_limit) return 0;
    if (!greedy && (a->top_p != c->top_p || a->min_p != c->min_p || a->seed != c->seed || a->counter != c->counter))
      return 0;
  }
  return 1;
}

/* the sample kernel's work of cu_sample / cu_sample_async where the step did not do it */
static di_status sample_rows_now(cu_backend *b, const di_sample_row *rows, int n) {
  for (int i = 0; i < n; i++) b->h_sample_rows[i] = cuk_row(&rows[i]);
  DI_CU(cudaMemcpyAsync(b->d_sample_rows, b->h_sample_rows, sizeof(di_cuk_sample_row) * (size_t)n,
                        cudaMemcpyHostToDevice, b->stream));
  DI_TRY(di_cuk_sample(b->logits, n, b->V, b->d_sample_rows, b->d_sample_out, b->stream));
  b->stats.resamples++;
  return DI_OK;
}

/* the tokens of the submitted step on their way to the host: sampled again where its rows differ */
static di_status tokens_for(cu_backend *b, const di_sample_row *rows, int n) {
  if (b->lg_gather) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: device sampling after a step whose output head ran on "
                                        "its wanted rows only");
  const int in_step = sampled_in_step(b, rows, n);
  if (in_step && b->tok_queued) return DI_OK;
  if (!in_step) DI_TRY(sample_rows_now(b, rows, n));
  b->tok_queued = 0;
  return queue_tokens(b, n);
}

di_status cu_sample(di_backend *bb, const di_sample_row *rows, int n, int32_t *tokens) {
  cu_backend *b = (cu_backend *)bb;
  if (n != b->n_out) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample of %d rows after a step with %d outputs", n, b->n_out);
  DI_TRY(tokens_for(b, rows, n));
  DI_CU(cudaEventSynchronize(b->ev_sampled[b->tok_par]));
  memcpy(tokens, b->h_sample_out + (size_t)b->tok_par * b->cap_out, sizeof(int32_t) * (size_t)n);
  return DI_OK;
}

/* Device token feedback: cu_sample's work queued without waiting (the step then counts as finished for
 * submit(); its logits are not read), and the host copy of the tokens behind an event. The next
 * submit may name these tokens as -1 - row; embed_kernel reads them from d_sample_out, which the
 * stream orders before it. */
di_status cu_sample_async(di_backend *bb, const di_sample_row *rows, int n) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample_async without a submitted step");
  if (n != b->n_out) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample of %d rows after a step with %d outputs", n, b->n_out);
  DI_TRY(tokens_for(b, rows, n));
  b->pending = 0;
  b->timing = 0;
  b->fb_n = n;
  b->fb_par = b->tok_par;
  b->fb_pending = 1;
  return DI_OK;
}

di_status cu_sample_fetch(di_backend *bb, int32_t *tokens) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->fb_pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sample_fetch without sample_async");
  DI_CU(cudaEventSynchronize(b->ev_sampled[b->fb_par]));
  memcpy(tokens, b->h_sample_out + (size_t)b->fb_par * b->cap_out, sizeof(int32_t) * (size_t)b->fb_n);
  b->fb_pending = 0;
  return DI_OK;
}
