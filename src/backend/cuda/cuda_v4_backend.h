/* The DeepSeek-V4 CUDA backend (cuda_deepseek_v4.cu): the V4 forward on one CUDA device over the
 * engine's paged cache groups, same contract as backend/cpu/cpu_v4_backend.h. Reached from the V4
 * registry entry for accelerator cuda unless DEEPINFER_CUDA_V4=0 (see docs/NOTES.md, issue 20). */
#ifndef DI_CUDA_V4_BACKEND_H
#define DI_CUDA_V4_BACKEND_H
#include "arch/deepseek_v4.h"
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif
/* Copies the weights to the device (bf16, float32 with DEEPINFER_CUDA_V4_F32=1, or FP8 / MXFP4 as stored with
 * DEEPINFER_CUDA_V4_NATIVE=1, the default; 0: bf16); `w` is not kept. */
di_status di_backend_cuda_v4_create(const di_model_config *cfg, const di_v4_config *v4, const di_v4_weights *w,
                                    di_backend **out);
/* The same in a mode: batch_invariant != 0 (di_model_options.batch_invariant, or DEEPINFER_BATCH_INVARIANT=1) keeps
 * every kernel one form at every step size, so a token's logits do not depend on its batch or chunk (the MXFP4
 * experts on the CUDA-core kernels unless DEEPINFER_CUDA_V4_MX_TC=1 asks for the tensor-core form at every step; an
 * explicit N > 1 counts as 0 there); 0 (the default mode, di_backend_cuda_v4_create) lets a step's size pick the form:
 * steps of >= DEEPINFER_CUDA_V4_MX_TC tokens (unset: DI_V4_MX_TC_DEFAULT) take the MXFP4 tensor-core experts.
 * DI_V4_MX_TC_DEFAULT is 0 (off) until the GPU run of scripts/pending_device_checks/s16-20-req-1.sh shows the
 * proposed 2 (one-token steps on the CUDA-core kernels, larger steps and prefill on the tensor cores) faster at every
 * batch (docs/NOTES.md, issue 20, session 16); the invariant mode's default stays 0 either way. */
#define DI_V4_MX_TC_DEFAULT 0
di_status di_backend_cuda_v4_create_mode(const di_model_config *cfg, const di_v4_config *v4, const di_v4_weights *w,
                                         int batch_invariant, di_backend **out);
/* The step size from which the MXFP4 tensor-core experts run (0: never), as the backend chose it; -1 for another backend. */
int di_backend_cuda_v4_mx_tc(const di_backend *b);
/* Device bytes of the weights as uploaded (tests: the native formats' saving), or -1 for another backend. */
int64_t di_backend_cuda_v4_weight_bytes(const di_backend *b);
/* Sequences with device state (tests: none left after an engine), or -1 for another backend. */
int di_backend_cuda_v4_live_states(const di_backend *b);
/* CUDA graphs (DEEPINFER_CUDA_V4_GRAPHS): graphs captured and replayed so far into *captures / *replays (either
 * may be NULL); returns 1 when the backend runs graphs, 0 when not, -1 for another backend. */
int di_backend_cuda_v4_graph_stats(const di_backend *b, int64_t *captures, int64_t *replays);

/* Phase profile (bench_cuda_v4): with it on, every step runs eager (no graph) with a timing event at each
 * phase's start, and wait() adds each phase's device time to its (layer, phase) sum. The phases of a layer
 * (the embedding and the head count as layer n_layers): */
enum {
  DI_V4_PROF_HC,      /* hyper-connections: hc_pre (mixes, Sinkhorn, collapse, norm) and hc_post, both sites */
  DI_V4_PROF_QKV,     /* wq_a + wkv, q_norm, wq_b, per-head norm, ropes, kv norm, window write */
  DI_V4_PROF_COMP,    /* the layer's compressor (CSA / HCA): projections, ape, pooling, open windows */
  DI_V4_PROF_INDEX,   /* the indexer (CSA): its compressor, idx_wq_b, idx_weights, scores, top-k */
  DI_V4_PROF_ATTEND,  /* sparse attention with sinks and the inverse rope */
  DI_V4_PROF_OUT,     /* grouped wo_a, wo_b */
  DI_V4_PROF_ROUTE,   /* router logits and top-k */
  DI_V4_PROF_EXPERTS, /* routed + shared experts, combine */
  DI_V4_PROF_EMBED,   /* (layer n_layers) the embedding */
  DI_V4_PROF_HEAD,    /* (layer n_layers) hc_head, final norm, the head, in-step sampling */
  DI_V4_PROF_N
};
/* on = 1: clears the sums and starts; 0 stops. Returns 0, or -1 for another backend. */
int di_backend_cuda_v4_profile(di_backend *b, int on);
/* Layer l (0..n_layers; n_layers: embedding and head), phase p: the device ms summed over the profiled steps
 * (*ms), their number (*steps), and the weight bytes one batch-1 step reads in that phase in the device
 * layout (*bytes1: the matrices and float parameters it reads; routed experts: top_k of them, plus the
 * shared one). Any pointer may be NULL. Returns 0, or -1 (another backend, l or p out of range). */
int di_backend_cuda_v4_profile_read(const di_backend *b, int l, int p, double *ms, int64_t *steps, double *bytes1);
#ifdef __cplusplus
}
#endif
#endif
