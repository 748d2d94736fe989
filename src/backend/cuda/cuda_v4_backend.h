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
 * DEEPINFER_CUDA_V4_NATIVE=1); `w` is not kept. */
di_status di_backend_cuda_v4_create(const di_model_config *cfg, const di_v4_config *v4, const di_v4_weights *w,
                                    di_backend **out);
/* Device bytes of the weights as uploaded (tests: the native formats' saving), or -1 for another backend. */
int64_t di_backend_cuda_v4_weight_bytes(const di_backend *b);
/* Sequences with device state (tests: none left after an engine), or -1 for another backend. */
int di_backend_cuda_v4_live_states(const di_backend *b);
/* CUDA graphs (DEEPINFER_CUDA_V4_GRAPHS): graphs captured and replayed so far into *captures / *replays (either
 * may be NULL); returns 1 when the backend runs graphs, 0 when not, -1 for another backend. */
int di_backend_cuda_v4_graph_stats(const di_backend *b, int64_t *captures, int64_t *replays);
#ifdef __cplusplus
}
#endif
#endif
