/* The side stream of the CUDA backend's expert parallel (cuda_ep.cu): unless DEEPINFER_CUDA_EP_OVERLAP=0
 * the MoE layer runs the shared experts on it while the main stream exchanges and computes the routed
 * rows. cu_ep_side_begin makes the side stream wait for the main one (the layer's normed input is
 * ready); cu_ep_side_end makes the main one wait for the side (the combine adds after the shared). */
#ifndef DI_CUDA_EP_CUH
#define DI_CUDA_EP_CUH
#include "cuda_backend_impl.cuh"

/* The logical expert the device holds in local slot j of layer l on this rank (expert parallel):
 * e0 + j in contiguous blocks, or the EPLB placement's (dist/ep.c) with --enable-eplb. */
int cu_ep_local_expert(cu_backend *b, int l, int j);
/* EPLB: the host weights a rebalance uploads moved experts from (the model outlives the backend). */
void cu_ep_set_weights(cu_backend *b, const di_ds_weights *w);
/* Uploads logical expert e of layer l into local slot j (bf16, or FP8 when the layer's experts are
 * FP8): cuda_deepseek2.cu, used by an EPLB rebalance. Synchronous. */
di_status cu_upload_expert(cu_backend *b, const di_ds_layer *s, int l, int e, int j);

/* The side stream (a cudaStream_t), or NULL when the overlap is off or expert parallel is. */
void *cu_ep_side_stream(cu_backend *b);
di_status cu_ep_side_begin(cu_backend *b);
di_status cu_ep_side_end(cu_backend *b);
#endif
