/* The side stream of the CUDA backend's expert parallel (cuda_ep.cu): with DEEPINFER_CUDA_EP_OVERLAP=1
 * the MoE layer runs the shared experts on it while the main stream exchanges and computes the routed
 * rows. cu_ep_side_begin makes the side stream wait for the main one (the layer's normed input is
 * ready); cu_ep_side_end makes the main one wait for the side (the combine adds after the shared). */
#ifndef DI_CUDA_EP_CUH
#define DI_CUDA_EP_CUH
#include "cuda_backend_impl.cuh"

/* The side stream (a cudaStream_t), or NULL when the overlap is off or expert parallel is. */
void *cu_ep_side_stream(cu_backend *b);
di_status cu_ep_side_begin(cu_backend *b);
di_status cu_ep_side_end(cu_backend *b);
#endif
