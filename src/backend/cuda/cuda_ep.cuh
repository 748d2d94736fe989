/* Expert parallel on the CUDA backends (cuda_ep.cu): the exchange core both DeepSeek backends share
 * (cu_ep_core: placement, counts, alltoallv of rows, the data-parallel listener), the V2/V3 backend's
 * glue (cu_ep: its side stream and expert buffers), and the expert products of cuda_deepseek2.cu the
 * exchange runs on received rows (cu_routed_experts: the kernels one GPU runs).
 * The side stream: unless DEEPINFER_CUDA_EP_OVERLAP=0 (or in the batch-invariant mode, where the
 * shared experts are folded) the V2/V3 MoE layer runs the shared experts on it while the main stream
 * exchanges and computes the routed rows. cu_ep_side_begin makes the side stream wait for the main one
 * (the layer's normed input is ready); cu_ep_side_end makes the main one wait for the side (the combine
 * adds after the shared). */
#ifndef DI_CUDA_EP_CUH
#define DI_CUDA_EP_CUH
#include "cuda_backend_impl.cuh"

typedef struct cu_ep_core cu_ep_core;

/* The received rows x [n] (x_bytes each) through this rank's experts: e [n] device local slot ids
 * (0..per_rank-1 the routed block, per_rank + j the j-th local extra) -> y [n] (y_bytes each), in the
 * order received, on the spec's stream. */
typedef di_status (*cu_ep_compute_fn)(void *user, int layer, const void *x, const int32_t *e, int n, void *y);
/* EPLB: logical expert e of layer l into local slot j (synchronous); *done = 0 when l has no experts. */
typedef di_status (*cu_ep_upload_fn)(void *user, int layer, int e, int j, int *done);

typedef struct cu_ep_spec {
  int n_layers;       /* layer indices of cu_epc_run are < n_layers */
  int n_experts;      /* routed experts (ids >= n_experts are local extras) */
  int hidden, n_groups;
  int n_extra;        /* experts every rank holds after its routed block (shared ones computed as experts) */
  size_t x_bytes, y_bytes; /* one token row in, one slot's output row out (multiples of 4) */
  cudaStream_t stream;
  cu_ep_compute_fn compute;
  cu_ep_upload_fn upload; /* NULL: EPLB refused by the caller */
  void *user;
} cu_ep_spec;

/* One MoE layer's exchange: d_ids [T * K] device expert ids per (token, slot) (-1 unused), token rows
 * d_x [T], outputs into d_y [T * K] (unused slots untouched). */
typedef struct cu_ep_rows {
  const int32_t *d_ids;
  int T, K;
  const void *d_x;
  size_t x_bytes;
  void *d_y;
  size_t y_bytes;
} cu_ep_rows;

/* Under --enable-expert-parallel (the caller checks): the placement (dist/ep.c, one per process), the
 * communicator (NCCL, or MPI with DEEPINFER_COMM=mpi / without NCCL) and the listener of di_ep_listen. */
di_status cu_epc_create(const cu_ep_spec *sp, cu_ep_core **out);
void cu_epc_destroy(cu_ep_core *ep);
/* real: 1 from a forward, 0 from a listening rank (T = 0); *any_real (may be NULL): whether any rank's
 * call was a forward's (when none was, nothing is exchanged). Collective over the ranks. */
di_status cu_epc_run(cu_ep_core *ep, int layer, int real, const cu_ep_rows *r, int *any_real);
int cu_epc_rank(const cu_ep_core *ep);
int cu_epc_size(const cu_ep_core *ep);
int cu_epc_per_rank(const cu_ep_core *ep); /* routed slots per rank */
int cu_epc_eplb(const cu_ep_core *ep);
const char *cu_epc_comm_kind(const cu_ep_core *ep);
/* the logical expert local slot j of layer l holds (the contiguous block, or EPLB's) */
int cu_epc_expert_of_slot(const cu_ep_core *ep, int layer, int j);
/* device [n] = 0, 1, ..., n-1 (grown as needed; valid until the next call) */
const int32_t *cu_epc_identity(cu_ep_core *ep, int n, di_status *st);
/* dst row j = src row (src_idx ? src_idx[j] / div : j), at row dst_idx ? dst_idx[j] : j */
di_status cu_ep_move_rows(void *dst, const void *src, const int32_t *src_idx, int div, const int32_t *dst_idx, int n,
                          size_t row_bytes, cudaStream_t s);

/* ---- V2/V3 (cuda_deepseek2.cu) ---- */
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

/* The routed (and folded shared) experts' products over A rows sorted by expert (the tiles of
 * di_cuk_moe_permute): x rows [x_rows] (Hp bf16 each) read through perm_tok; gate/up into egu (FP8) or
 * act, down into y (f32 [A][Hp], sorted order). T (about the tokens of the step) and the mode pick the
 * kernels as on one GPU; pf0 / pf_e0: the one-token prefetch of the shared tiles (-1: none). */
typedef struct cu_expert_rows {
  const bf16 *x;
  int x_rows;
  const int32_t *perm_tok, *expert_off, *tiles, *n_tiles;
  int max_tiles, bm, A, T, pf0, pf_e0;
  bf16 *act, *egu;
  float *y;
} cu_expert_rows;
di_status cu_routed_experts(cu_backend *b, const cu_layer *L, const cu_expert_rows *io);
#endif
