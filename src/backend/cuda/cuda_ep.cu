/* Expert parallel on the CUDA backend (DeepSeek-V2/V3; off unless --enable-expert-parallel): rank r
 * of N holds the routed experts [r*E/N, (r+1)*E/N) only (upload_layer uploads those), attention,
 * shared experts, embeddings and head are replicated. One MoE layer (cu_ep_moe, after the router):
 *   1. the step's top-k ids come to the host; each (token, slot) goes to the rank holding its expert;
 *      the per-rank row counts are all-gathered over MPI (small, host);
 *   2. the rows of xn are gathered per destination on the device and sent with their local expert
 *      ids (alltoallv through the communicator: NCCL on device buffers, its unique id broadcast over
 *      MPI, when the build has NCCL; else MPI through host copies; one rank: a self copy);
 *   3. the receiver permutes its rows by expert and runs the same grouped GEMMs as one GPU (gate/up
 *      with the GLU, then down into f32), gathers the outputs back into arrival order and returns them;
 *   4. the sender scatters each output to its (token, slot) row, and the usual combine adds them in
 *      top-k slot order with the shared experts (computed here, unfolded: mlp_dense) as on one GPU.
 * Decided for this first form: shared experts are not folded into the grouped GEMM and CUDA graphs are
 * off under expert parallel (the row counts change the launches); data-parallel listening (a rank
 * with no work joining others' forwards) is not on CUDA yet and is refused. The single-GPU path does
 * not run any of this (b->ep is NULL).
 * FP8 experts (DEEPINFER_CUDA_FP8=1): this rank's block is uploaded in FP8 like the whole set on one
 * GPU, and the received rows go through the FP8 grouped GEMVs (16 rows a pass; 1 in the invariant mode).
 * The shared experts run on a second stream during the exchange (cuda_ep.cuh; DEEPINFER_CUDA_EP_OVERLAP=0:
 * in order on one stream; the same bits either way, checked on the H200 at EP 1).
 * EPLB (--enable-eplb): the placement is the CPU ranks' (dist/ep.c: E + R physical slots, slot p on
 * rank p / (slots / ranks), replicas by DeepSeek's algorithm, loads counted per step and rebalanced
 * every step_interval steps, the same on every rank); each (token, slot) gets its physical slot from
 * di_ep_pick_slots, and after a rebalance every local slot whose expert changed is uploaded again from
 * the host weights before the layer's exchange (the stream is idle then: step 1 synchronizes). CUDA
 * graphs are off under expert parallel, so nothing captured holds an old expert pointer. */
#include "cuda_backend_impl.cuh"
#include "cuda_ep.cuh"
extern "C" {
#include "dist/dist.h"
#include "dist/ep.h"
}
#include <stdlib.h>
#include <string.h>

#ifdef DI_HAVE_NCCL
extern "C" di_status di_comm_nccl_create(di_comm *mpi_world, int device, void *stream, di_comm **out);
#endif

struct cu_ep {
  di_comm *comm;       /* the exchange's: NCCL (device buffers) or MPI / self (host buffers) */
  di_comm *ctl;        /* counts: MPI world, or the self communicator */
  int own_comm;        /* comm is ours to destroy (NCCL) */
  int on_device;       /* comm takes device pointers */
  int rank, size, per_rank;
  /* host */
  int32_t *ids, *send_slot, *send_e, *counts_all;
  size_t *sb, *rb;
  int cap_slots;
  void *h_send, *h_recv;  /* host staging without NCCL */
  size_t h_cap;
  /* device, grown on demand (graphs are off) */
  int32_t *d_send_slot, *d_send_e, *d_recv_e, *d_ident, *perm_tok, *inv, *expert_off, *tiles, *n_tiles;
  bf16 *d_send_x, *d_recv_x, *act;
  float *y_recv, *d_back, *d_ret;
  bf16 *egu;           /* FP8 experts: gate/up rows before the GLU */
  int cap_send, cap_recv, cap_ident;
  cudaStream_t side;   /* DEEPINFER_CUDA_EP_OVERLAP=1: the shared experts' stream */
  cudaEvent_t ev_main, ev_side;
  int logged_format;   /* rank 0 said once which expert format the exchange feeds */
  /* EPLB */
  di_ep *place;        /* the placement and loads (dist/ep.c); NULL without --enable-eplb */
  int n_place_layers, uploaded;  /* layers it covers; rebalances already on the device */
  int32_t *held;       /* [layers][per_rank]: the logical expert each local slot holds on the device */
  int32_t *pslot;      /* host: the physical slot of each (token, slot) */
  const di_ds_weights *w;
};

/* dst[j] = src[src_idx ? src_idx[j] / div : j] and stored at row dst_idx ? dst_idx[j] : j; W elements */
template <typename T>
static __global__ void move_rows(T *dst, const T *src, const int32_t *src_idx, int div, const int32_t *dst_idx,
                                 int n, int W) {
  const int j = blockIdx.x;
  if (j >= n) return;
  const int64_t from = src_idx ? src_idx[j] / div : j, to = dst_idx ? dst_idx[j] : j;
  for (int c = threadIdx.x; c < W; c += blockDim.x) dst[to * W + c] = src[from * W + c];
}

static __global__ void iota(int32_t *p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i;
}

template <typename T>
static di_status move(cu_backend *b, T *dst, const T *src, const int32_t *src_idx, int div, const int32_t *dst_idx,
                      int n, int W) {
  if (n <= 0) return DI_OK;
  move_rows<T><<<n, 256, 0, b->stream>>>(dst, src, src_idx, div, dst_idx, n, W);
  DI_CU(cudaGetLastError());
  return DI_OK;
}

void cu_ep_pick_device(int ndev) {
  const char *lr = di_switch_get(DI_SW_MPI_OMPI_LOCAL_RANK);
  if ((di_dist_expert_parallel() || di_dist_dp_size() > 1) && lr && ndev > 0) cudaSetDevice(atoi(lr) % ndev);
}

di_status cu_ep_setup(cu_backend *b, const di_model_config *c) {
  if (!di_dist_expert_parallel() || c->n_routed_experts <= 0) return DI_OK;
  di_comm *ctl = di_dist_comm();
  if (di_dist_dp_size() > 1)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: --data-parallel-size with --enable-expert-parallel is on "
                                            "CPU ranks only for now (a GPU rank cannot listen for the others' rows yet)");
  cu_ep *ep = (cu_ep *)calloc(1, sizeof *ep);
  if (!ep) return di_error_set(DI_ERR_OOM, "out of memory");
  b->ep = ep;
  ep->ctl = ctl;
  ep->rank = di_comm_rank(ctl);
  ep->size = di_comm_size(ctl);
  if (di_dist_eplb_enabled()) { /* slots of the placement (it checks slots % ranks) */
    ep->n_place_layers = c->num_hidden_layers + (c->num_nextn_predict_layers > 0 ? c->num_nextn_predict_layers : 0);
    DI_TRY(di_dist_ep_get(ep->n_place_layers, c->n_routed_experts, c->hidden_size, c->n_group > 0 ? c->n_group : 1, 0,
                          &ep->place));
    ep->per_rank = di_ep_slots(ep->place) / ep->size;
    ep->held = (int32_t *)malloc(sizeof(int32_t) * (size_t)ep->n_place_layers * ep->per_rank);
    if (!ep->held) return di_error_set(DI_ERR_OOM, "out of memory");
    for (int l = 0; l < ep->n_place_layers; l++)
      for (int j = 0; j < ep->per_rank; j++)
        ep->held[(size_t)l * ep->per_rank + j] = di_ep_slot_expert(ep->place, l, ep->rank * ep->per_rank + j);
  } else {
    if (c->n_routed_experts % ep->size)
      return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: %d routed experts do not split over %d ranks",
                          c->n_routed_experts, ep->size);
    ep->per_rank = c->n_routed_experts / ep->size;
  }
  b->ep_e0 = ep->place ? 0 : ep->rank * ep->per_rank;
  b->ep_El = ep->per_rank;
  ep->comm = ctl;
#ifdef DI_HAVE_NCCL
  /* NCCL whenever the build has it: over the MPI world, or over this one rank without mpirun (the
   * one-GPU check of the exchange, tests/cuda/ep_nccl_check.sh) */
  if (di_comm_mpi_world() || ep->size == 1) {
    int dev = 0;
    DI_CU(cudaGetDevice(&dev));
    DI_TRY(di_comm_nccl_create(di_comm_mpi_world(), dev, b->stream, &ep->comm));
    ep->own_comm = 1;
    ep->on_device = 1;
  }
#endif
  if (di_switch_bool(DI_SW_CUDA_EP_OVERLAP, 1)) {
    DI_CU(cudaStreamCreateWithFlags(&ep->side, cudaStreamNonBlocking));
    DI_CU(cudaEventCreateWithFlags(&ep->ev_main, cudaEventDisableTiming));
    DI_CU(cudaEventCreateWithFlags(&ep->ev_side, cudaEventDisableTiming));
  }
  b->n_sh = 0;        /* shared experts through mlp_dense (see the top) */
  b->use_graphs = 0;  /* the exchange's sizes are the host's */
  if (ep->rank == 0 && ep->place)
    fprintf(stderr, "deepinfer: cuda expert parallel over %d rank%s (%s): %d expert slots here (EPLB)%s\n", ep->size,
            ep->size > 1 ? "s" : "", ep->comm->kind, ep->per_rank, ep->side ? ", shared experts on a second stream" : "");
  else if (ep->rank == 0)
    fprintf(stderr, "deepinfer: cuda expert parallel over %d rank%s (%s): experts %d..%d here%s\n", ep->size,
            ep->size > 1 ? "s" : "", ep->comm->kind, b->ep_e0, b->ep_e0 + b->ep_El - 1,
            ep->side ? ", shared experts on a second stream" : "");
  return DI_OK;
}

int cu_ep_local_expert(cu_backend *b, int l, int j) {
  const cu_ep *ep = b->ep;
  if (!ep->place || l >= ep->n_place_layers) return b->ep_e0 + j;
  return ep->held[(size_t)l * ep->per_rank + j];
}

void cu_ep_set_weights(cu_backend *b, const di_ds_weights *w) {
  if (b->ep) b->ep->w = w;
}

/* EPLB: after a rebalance, every local slot of every MoE layer whose expert moved, from the host */
static di_status upload_moved(cu_backend *b) {
  cu_ep *ep = b->ep;
  const int rebal = di_ep_rebalances(ep->place);
  if (rebal == ep->uploaded) return DI_OK;
  if (!ep->w) return di_error_set(DI_ERR_INTERNAL, "cuda expert parallel: EPLB without the host weights");
  int moved = 0;
  for (int l = 0; l < b->n_layers + b->n_mtp && l < ep->n_place_layers; l++) {
    if (!b->L[l].is_moe) continue;
    for (int j = 0; j < ep->per_rank; j++) {
      const int e = di_ep_slot_expert(ep->place, l, ep->rank * ep->per_rank + j);
      int32_t *h = &ep->held[(size_t)l * ep->per_rank + j];
      if (*h == e) continue;
      DI_TRY(cu_upload_expert(b, &ep->w->layers[l], l, e, j));
      *h = e;
      moved++;
    }
  }
  ep->uploaded = rebal;
  if (ep->rank == 0)
    fprintf(stderr, "deepinfer: cuda expert parallel: EPLB rebalance %d moved %d expert slot%s on rank 0\n", rebal,
            moved, moved == 1 ? "" : "s");
  return DI_OK;
}

void *cu_ep_side_stream(cu_backend *b) { return b->ep ? (void *)b->ep->side : NULL; }

di_status cu_ep_side_begin(cu_backend *b) {
  DI_CU(cudaEventRecord(b->ep->ev_main, b->stream));
  DI_CU(cudaStreamWaitEvent(b->ep->side, b->ep->ev_main, 0));
  return DI_OK;
}

di_status cu_ep_side_end(cu_backend *b) {
  DI_CU(cudaEventRecord(b->ep->ev_side, b->ep->side));
  DI_CU(cudaStreamWaitEvent(b->stream, b->ep->ev_side, 0));
  return DI_OK;
}

void cu_ep_destroy(cu_backend *b) {
  cu_ep *ep = b->ep;
  if (!ep) return;
  if (ep->own_comm) di_comm_destroy(ep->comm);
  if (ep->side) cudaStreamDestroy(ep->side), cudaEventDestroy(ep->ev_main), cudaEventDestroy(ep->ev_side);
  free(ep->ids), free(ep->send_slot), free(ep->send_e), free(ep->counts_all), free(ep->sb), free(ep->rb);
  free(ep->h_send), free(ep->h_recv), free(ep->held), free(ep->pslot);
  free(ep); /* device buffers and the placement (dist.c's): freed with their owners */
  b->ep = NULL;
}

static di_status grow_host(cu_ep *ep, int slots) {
  if (slots <= ep->cap_slots) return DI_OK;
  const int n = slots * 2;
  int32_t *a = (int32_t *)realloc(ep->ids, sizeof(int32_t) * n), *s = NULL, *e = NULL, *p = NULL;
  if (a) ep->ids = a;
  if (a) s = (int32_t *)realloc(ep->send_slot, sizeof(int32_t) * n);
  if (s) ep->send_slot = s;
  if (s) e = (int32_t *)realloc(ep->send_e, sizeof(int32_t) * n);
  if (e) ep->send_e = e;
  if (e) p = (int32_t *)realloc(ep->pslot, sizeof(int32_t) * n);
  if (p) ep->pslot = p;
  if (!a || !s || !e || !p) return di_error_set(DI_ERR_OOM, "cuda expert parallel: out of host memory");
  ep->cap_slots = n;
  return DI_OK;
}

static di_status grow_host_stage(cu_ep *ep, size_t bytes) {
  if (bytes <= ep->h_cap) return DI_OK;
  free(ep->h_send), free(ep->h_recv);
  ep->h_send = malloc(bytes), ep->h_recv = malloc(bytes);
  if (!ep->h_send || !ep->h_recv) return di_error_set(DI_ERR_OOM, "cuda expert parallel: out of host memory");
  ep->h_cap = bytes;
  return DI_OK;
}

/* alltoallv of device buffers through the communicator (host copies when it takes host pointers) */
static di_status exchange(cu_backend *b, const void *send, const size_t *sb, void *recv, const size_t *rb) {
  cu_ep *ep = b->ep;
  if (ep->on_device) return di_comm_alltoallv(ep->comm, send, sb, recv, rb);
  size_t ns = 0, nr = 0;
  for (int r = 0; r < ep->size; r++) ns += sb[r], nr += rb[r];
  DI_TRY(grow_host_stage(ep, (ns > nr ? ns : nr) + 8));
  if (ns) DI_CU(cudaMemcpyAsync(ep->h_send, send, ns, cudaMemcpyDeviceToHost, b->stream));
  DI_CU(cudaStreamSynchronize(b->stream));
  DI_TRY(di_comm_alltoallv(ep->comm, ep->h_send, sb, ep->h_recv, rb));
  if (nr) DI_CU(cudaMemcpyAsync(recv, ep->h_recv, nr, cudaMemcpyHostToDevice, b->stream));
  DI_CU(cudaStreamSynchronize(b->stream)); /* the staging buffer is reused by the next exchange */
  return DI_OK;
}

/* The routed experts of layer l for the step's T tokens (see the top): writes b->y in slot order
 * (row t*K + k) and returns in *inv_out the identity permutation the combine then reads it through. */
di_status cu_ep_moe(cu_backend *b, int l, int T, const int32_t **inv_out) {
  cu_ep *ep = b->ep;
  const cu_layer *L = &b->L[l];
  const int K = b->K, A = T * K, N = ep->size, Hp = b->Hp, El = b->ep_El;
  DI_TRY(grow_host(ep, A + 1));
  if (!ep->counts_all) {
    ep->counts_all = (int32_t *)calloc((size_t)N * N, sizeof(int32_t));
    ep->sb = (size_t *)calloc((size_t)N, sizeof(size_t));
    ep->rb = (size_t *)calloc((size_t)N, sizeof(size_t));
    if (!ep->counts_all || !ep->sb || !ep->rb) return di_error_set(DI_ERR_OOM, "cuda expert parallel: out of memory");
  }
  if (!ep->logged_format && ep->rank == 0)
    fprintf(stderr, "deepinfer: cuda expert parallel: layer %d's experts in %s\n", l, L->f_exp_gu.q ? "fp8" : "bf16");
  ep->logged_format = 1;
  /* 1: destinations and counts */
  DI_CU(cudaMemcpyAsync(ep->ids, b->topk_ids, sizeof(int32_t) * A, cudaMemcpyDeviceToHost, b->stream));
  DI_CU(cudaStreamSynchronize(b->stream));
  int32_t mine[1024];
  if (N > 1024) return di_error_set(DI_ERR_UNSUPPORTED, "cuda expert parallel: at most 1024 ranks");
  memset(mine, 0, sizeof(int32_t) * N);
  for (int i = 0; i < A; i++)
    if (ep->ids[i] < 0 || ep->ids[i] >= b->E)
      return di_error_set(DI_ERR_INTERNAL, "cuda expert parallel: expert id %d out of range", ep->ids[i]);
  if (ep->place) { /* EPLB: each (token, slot)'s physical slot; a rebalance lands here first */
    DI_TRY(di_ep_pick_slots(ep->place, l, ep->ids, A, ep->pslot));
    DI_TRY(upload_moved(b));
  } else {
    memcpy(ep->pslot, ep->ids, sizeof(int32_t) * (size_t)A); /* slot e is expert e */
  }
  for (int i = 0; i < A; i++) mine[ep->pslot[i] / ep->per_rank]++;
  int n_send = 0;
  for (int r = 0; r < N; r++) /* slots grouped by destination, in slot order inside each */
    for (int i = 0; i < A; i++)
      if (ep->pslot[i] / ep->per_rank == r) {
        ep->send_slot[n_send] = i;
        ep->send_e[n_send++] = ep->pslot[i] - r * ep->per_rank; /* the local slot */
      }
  DI_TRY(di_comm_allgather(ep->ctl, mine, sizeof(int32_t) * N, ep->counts_all));
  int n_recv = 0;
  for (int r = 0; r < N; r++) n_recv += ep->counts_all[(size_t)r * N + ep->rank];
  if (ep->place) di_ep_count_rows(ep->place, n_recv);
  /* device buffers for this step's rows */
  if (n_send > ep->cap_send || !ep->d_send_x) {
    const int cap = (n_send > 16 ? n_send : 16) * 2;
    REALLOC(ep->d_send_slot, sizeof(int32_t) * cap);
    REALLOC(ep->d_send_e, sizeof(int32_t) * cap);
    REALLOC(ep->d_send_x, 2 * (size_t)cap * Hp);
    REALLOC(ep->d_ret, sizeof(float) * (size_t)cap * Hp);
    ep->cap_send = cap;
  }
  if (n_recv > ep->cap_recv || !ep->d_recv_x) {
    const int cap = (n_recv > 16 ? n_recv : 16) * 2;
    REALLOC(ep->d_recv_e, sizeof(int32_t) * cap);
    REALLOC(ep->d_recv_x, 2 * (size_t)cap * Hp);
    REALLOC(ep->perm_tok, sizeof(int32_t) * cap);
    REALLOC(ep->inv, sizeof(int32_t) * cap);
    REALLOC(ep->tiles, sizeof(int32_t) * (size_t)(cap / 16 + El + 1));
    REALLOC(ep->expert_off, sizeof(int32_t) * (size_t)(El + 1));
    REALLOC(ep->n_tiles, sizeof(int32_t) * 4);
    REALLOC(ep->act, 2 * (size_t)cap * b->Ip);
    if (b->fp8) REALLOC(ep->egu, 2 * (size_t)cap * 2 * b->Ip);
    REALLOC(ep->y_recv, sizeof(float) * (size_t)cap * Hp);
    REALLOC(ep->d_back, sizeof(float) * (size_t)cap * Hp);
    ep->cap_recv = cap;
  }
  if (A > ep->cap_ident) {
    const int cap = A * 2;
    REALLOC(ep->d_ident, sizeof(int32_t) * cap);
    iota<<<(cap + 255) / 256, 256, 0, b->stream>>>(ep->d_ident, cap);
    DI_CU(cudaGetLastError());
    ep->cap_ident = cap;
  }
  /* 2: dispatch */
  if (n_send) {
    DI_CU(cudaMemcpyAsync(ep->d_send_slot, ep->send_slot, sizeof(int32_t) * n_send, cudaMemcpyHostToDevice, b->stream));
    DI_CU(cudaMemcpyAsync(ep->d_send_e, ep->send_e, sizeof(int32_t) * n_send, cudaMemcpyHostToDevice, b->stream));
  }
  DI_TRY(move(b, ep->d_send_x, b->xn, ep->d_send_slot, K, (const int32_t *)NULL, n_send, Hp));
  for (int r = 0; r < N; r++) {
    ep->sb[r] = (size_t)mine[r] * Hp * 2;
    ep->rb[r] = (size_t)ep->counts_all[(size_t)r * N + ep->rank] * Hp * 2;
  }
  DI_TRY(exchange(b, ep->d_send_x, ep->sb, ep->d_recv_x, ep->rb));
  for (int r = 0; r < N; r++) ep->sb[r] = ep->sb[r] / ((size_t)Hp * 2) * 4, ep->rb[r] = ep->rb[r] / ((size_t)Hp * 2) * 4;
  DI_TRY(exchange(b, ep->d_send_e, ep->sb, ep->d_recv_e, ep->rb));
  /* 3: the local experts over the received rows, as one GPU runs them */
  if (n_recv) {
    const int bm = n_recv >= 32 * El ? 64 : 16;
    int max_tiles = (n_recv + bm - 1) / bm + El;
    if (max_tiles > n_recv) max_tiles = n_recv;
    DI_TRY(di_cuk_moe_permute(ep->d_recv_e, n_recv, 1, El, bm, ep->perm_tok, ep->inv, ep->expert_off, ep->tiles,
                              ep->n_tiles, b->stream));
    if (L->f_exp_gu.q) { /* FP8 experts: the grouped GEMVs over the received rows (see the top) */
      const int rows = b->invariant ? 1 : 16, Ip = b->Ip;
      DI_TRY(di_cuk_fp8_grouped_gemv((const uint16_t *)ep->d_recv_x, Hp, ep->perm_tok, L->f_exp_gu, 2 * Ip, Hp,
                                     ep->expert_off, ep->tiles, ep->n_tiles, max_tiles, bm, rows, ep->egu, 2 * Ip, 0,
                                     b->stream));
      DI_TRY(di_cuk_silu_mul((const uint16_t *)ep->egu, n_recv, Ip, (uint16_t *)ep->act, b->stream));
      DI_TRY(di_cuk_fp8_grouped_gemv((const uint16_t *)ep->act, Ip, NULL, L->f_exp_down, Hp, Ip, ep->expert_off,
                                     ep->tiles, ep->n_tiles, max_tiles, bm, rows, ep->y_recv, Hp, 1, b->stream));
    } else {
      DI_TRY(di_cuk_grouped_gemm((const uint16_t *)ep->d_recv_x, Hp, ep->perm_tok, (const uint16_t *)L->exp_gu,
                                 2 * b->Ip, Hp, ep->expert_off, ep->tiles, ep->n_tiles, max_tiles, bm, ep->act, b->Ip,
                                 0, 1, b->stream));
      DI_TRY(di_cuk_grouped_gemm((const uint16_t *)ep->act, b->Ip, NULL, (const uint16_t *)L->exp_down, Hp, b->Ip,
                                 ep->expert_off, ep->tiles, ep->n_tiles, max_tiles, bm, ep->y_recv, Hp, 1, 0,
                                 b->stream));
    }
    DI_TRY(move(b, ep->d_back, (const float *)ep->y_recv, ep->inv, 1, (const int32_t *)NULL, n_recv, Hp));
  }
  /* 4: combine: outputs back to their senders, each to its (token, slot) row of y */
  for (int r = 0; r < N; r++) {
    const size_t sent = ep->sb[r] / 4, got = ep->rb[r] / 4;
    ep->sb[r] = got * Hp * sizeof(float);
    ep->rb[r] = sent * Hp * sizeof(float);
  }
  DI_TRY(exchange(b, ep->d_back, ep->sb, ep->d_ret, ep->rb));
  DI_TRY(move(b, b->y, (const float *)ep->d_ret, (const int32_t *)NULL, 1, ep->d_send_slot, n_send, Hp));
  *inv_out = ep->d_ident;
  return DI_OK;
}
