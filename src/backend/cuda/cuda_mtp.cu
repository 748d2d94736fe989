/* The MTP drafting step of the CUDA backend (speculative decoding's draft model). */
#include "cuda_backend_impl.cuh"

/* The MTP layer (DeepSeek-V3's multi-token prediction module) for speculative decoding, as the CPU
 * backend's di_cpu_deepseek_mtp_forward: x = eh_proj([enorm(embed(token)) | hnorm(prev_hidden)]), one
 * decoder layer (its KV entries in the pool at layer n_layers), then shared_head's norm and head for
 * the output rows; hidden_out gets the layer's output before that norm. Eager (no graph), synchronous. */
di_status cu_mtp(di_backend *bb, const di_batch *batch, const float *prev_hidden, float *logits,
                        float *hidden_out) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->n_mtp) return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: the MTP layer is not loaded");
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: mtp while a step is in flight");
  if (!prev_hidden) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: mtp without previous hidden states");
  DI_TRY(prepare(b, batch));
  cudaStream_t s = b->stream;
  const int T = b->T, Tp = b->Tp, H = b->H;
  if (Tp > b->mtp_cap) {
    REALLOC(b->mtp_prev, sizeof(float) * (size_t)Tp * H);
    REALLOC(b->mtp_cat, 2 * (size_t)Tp * 2 * H);
    b->mtp_cap = Tp;
  }
  DI_CU(cudaMemcpyAsync(b->in_dev, b->in_host, b->in_used * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  DI_CU(cudaMemsetAsync(b->mtp_prev, 0, sizeof(float) * (size_t)Tp * H, s)); /* padding rows */
  DI_CU(cudaMemcpyAsync(b->mtp_prev, prev_hidden, sizeof(float) * (size_t)T * H, cudaMemcpyHostToDevice, s));
  DI_TRY(di_cuk_embed((const uint16_t *)b->mtp_embed, b->d_tokens, b->d_sample_out, Tp, H, b->h, s));
  DI_TRY(di_cuk_rmsnorm(b->h, H, b->mtp_enorm, Tp, H, b->eps, (uint16_t *)b->mtp_cat, 2 * H, NULL, s));
  DI_TRY(di_cuk_rmsnorm(b->mtp_prev, H, b->mtp_hnorm, Tp, H, b->eps, (uint16_t *)b->mtp_cat + H, 2 * H, NULL, s));
  DI_TRY(di_cu_gemm(b->blas, Tp, H, 2 * H, (const uint16_t *)b->mtp_cat, 2 * H, (const uint16_t *)b->mtp_eh, 2 * H,
                    b->h, H, 1, 0.f, s));
  int xn_ready = 0;
  const int normed_gemm = b->down_combine && di_cu_gemm_normed_ok(b->blas, Tp, H, H);
  DI_TRY(layer_step(b, b->n_layers, &xn_ready, normed_gemm));
  DI_TRY(di_cuk_gather_f32(b->h, b->d_out_rows, b->n_out_p, H, b->hout, s));
  DI_TRY(di_cuk_rmsnorm(b->hout, H, b->mtp_head_norm, b->n_out_p, H, b->eps, (uint16_t *)b->hn, H, NULL, s));
  if (logits && b->n_out > 0)
    DI_TRY(di_cu_gemm(b->blas, b->n_out_p, b->V, H, (const uint16_t *)b->hn, H, (const uint16_t *)b->mtp_head, H,
                      b->logits, b->V, 1, 0.f, s));
  DI_CU(cudaStreamSynchronize(s));
  if (logits && b->n_out > 0)
    DI_CU(cudaMemcpy(logits, b->logits, sizeof(float) * (size_t)b->n_out * b->V, cudaMemcpyDeviceToHost));
  if (hidden_out && b->n_out > 0)
    DI_CU(cudaMemcpy(hidden_out, b->hout, sizeof(float) * (size_t)b->n_out * H, cudaMemcpyDeviceToHost));
  return DI_OK;
}
