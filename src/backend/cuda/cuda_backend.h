/* The NVIDIA backend: the whole DeepSeek-V2/V3 forward pass, the paged latent KV pool and sampling
 * on one CUDA device (sm_90), behind the backend vtable of backend/backend.h. Weights are uploaded
 * once at create (bf16 as stored; FP8 (F32 or UE8M0 scales) / MXFP4 / F16 / F32 converted to bf16 on the
 * host, cuda_upload.cu). The parts: cuda_backend_impl.cuh. */
#ifndef DI_CUDA_BACKEND_H
#define DI_CUDA_BACKEND_H
#include "backend/backend.h"
#include "arch/deepseek.h"

/* `w` must outlive nothing: everything is copied to the device before this returns. batch_invariant
 * (or $DEEPINFER_BATCH_INVARIANT=1): each row's arithmetic independent of the rest of the step. */
di_status di_backend_cuda_create(const di_model_config *cfg, const di_ds_weights *w, int batch_invariant,
                                 di_backend **out);
/* Free device memory in bytes right now (for sizing the KV pool from a budget); -1 on error. */
int64_t di_backend_cuda_free_bytes(void);
/* Statistics of the CUDA backend since create (graphs captured / replayed), for tests and benches. */
typedef struct di_cuda_stats {
  int64_t steps, graph_captures, graph_replays;
  /* with DEEPINFER_CUDA_GPU_TIME=1: replays timed by events around the graph launch and their summed
   * device time, so a benchmark can tell the GPU's step time from the wall time per step (the gap is
   * host work and transfers between steps) */
  int64_t timed_replays;
  double graph_ms;
  /* sample / sample_async calls whose rows differed from the step's di_batch.sample_rows (sampled
   * again after the step); 0 when the engine's guesses hold */
  int64_t resamples;
} di_cuda_stats;
void di_backend_cuda_stats(di_backend *b, di_cuda_stats *out);
/* Benchmarking only: leave the named phases (a comma list of qkv, prep, absorb, attn, vo, gate,
 * experts, combine, lmhead) out of every later step; "" restores the full pass. Outputs are garbage
 * while phases are skipped. Also read from DEEPINFER_CUDA_SKIP at create. */
void di_backend_cuda_set_skip(di_backend *b, const char *phases);
/* Benchmarking only (alternating runs in one process): the fixed-split attention on with splits of
 * `split` keys (a multiple of 32), or off (0), for every later step; DEEPINFER_CUDA_ATTN_FIXED at
 * create. Changing it mid-sequence changes later rows' bits (not for the invariant mode's users). */
di_status di_backend_cuda_set_attn_fixed(di_backend *b, int split);
/* Benchmarking only (both modes alternating in one process, weights uploaded once): the batch-invariant
 * mode on or off for every later step, with the settings create gives that mode (tensor-core GEMMs,
 * fixed-split attention, no arithmetic-changing fusions). Not for serving: a sequence's rows before
 * and after the change come from different arithmetic. */
di_status di_backend_cuda_set_invariant(di_backend *b, int on);
/* Benchmarking only: DEEPINFER_CUDA_MLA_FIXED_TC for later steps (0, 1, 2; the same bits either way) */
void di_backend_cuda_set_fixed_tc(di_backend *b, int level);
/* DEEPINFER_CUDA_MLA_FIXED_DEC's level (0 / 1 / 2), + 4 for DEEPINFER_CUDA_MLA_FIXED_DEC_MERGE=1, for A/B runs in
 * one process (drops captured graphs) */
void di_backend_cuda_set_fixed_dec(di_backend *b, int level);
/* DEEPINFER_CUDA_INV_DOWN_COMBINE's value (steps of up to max_tokens: the invariant combine in the down GEMM; 0 off) */
void di_backend_cuda_set_inv_down_combine(di_backend *b, int max_tokens);
/* DEEPINFER_CUDA_INV_PREP_ABSORB's value (the invariant MLA prep in the absorption's launch) */
void di_backend_cuda_set_inv_prep_absorb(di_backend *b, int on);
/* Benchmarking only (bf16 and FP8 caches alternating in one process): frees the KV pool and sets the cache
 * format of the next kv_alloc (on: --kv-cache-dtype fp8's entries; off: bf16); the caller then calls
 * kv_alloc again (the pool's contents are gone). The engine's path is ops->set_kv_fp8 (before any pool). */
di_status di_backend_cuda_set_kv_fp8(di_backend *b, int on);
/* Benchmarking only: DEEPINFER_CUDA_PREFILL_MHA for later steps (0 off, 1 = 512, N: steps of >= N tokens) */
void di_backend_cuda_set_prefill_mha(di_backend *b, int min_tokens);
/* Benchmarking only (A/B in one process; drops captured graphs): DEEPINFER_CUDA_SKINNY_ROWS (0 off, N) for later
 * steps (the same bits) */
void di_backend_cuda_set_skinny_rows(di_backend *b, int min_n);
/* Benchmarking only: DEEPINFER_CUDA_PROFILE's per-phase device time on (graphs off) or off for later steps;
 * di_backend_cuda_profile_dump prints what was gathered (decode-sized and larger steps apart, to stderr)
 * under `title` and clears it. */
di_status di_backend_cuda_set_profile(di_backend *b, int on);
void di_backend_cuda_profile_dump(di_backend *b, const char *title);
/* The CUDA backend's runner of the op test table (backend/op_table.h; a di_op_runner): ctx is a
 * di_cu_blas (backend/cuda/cuda_kernels.h). */
struct di_op_data;
di_status di_cuda_op_run(void *ctx, const struct di_op_data *d, float *out);
/* DEEPINFER_CUDA_GRAPHS=0 in the environment turns graph capture off (checked at create). */
#endif
