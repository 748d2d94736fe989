/* Expert parallel on the CUDA backends (DeepSeek-V2/V3 in cuda_deepseek2.cu, V4 in cuda_deepseek_v4.cu;
 * off unless --enable-expert-parallel): rank r of N holds the routed experts [r*E/N, (r+1)*E/N) only
 * (or EPLB's slots), plus the "local extras" every rank holds (the shared experts where they are
 * computed as experts: V4's, and V2/V3's when folded). Attention, embeddings and head are replicated.
 * One MoE layer (cu_epc_run, after the router), the same on every rank:
 *   1. the step's expert ids come to the host; each (token, slot) goes to the rank holding its expert
 *      (a local extra stays here); the per-rank row counts and a "this call is a forward" flag are
 *      all-gathered over MPI (small, host);
 *   2. the token rows are gathered per destination on the device and sent with their local expert ids
 *      (alltoallv through the communicator: NCCL on device buffers, its unique id broadcast over MPI,
 *      when the build has NCCL; else, or with DEEPINFER_COMM=mpi, MPI through host copies; one rank
 *      without mpirun: a self copy);
 *   3. the receiver runs the backend's expert function over the received rows (ep->compute: the same
 *      kernels as one GPU) and returns the outputs in arrival order;
 *   4. the sender scatters each output to its (token, slot) row, and the backend's usual combine adds
 *      them in top-k slot order, so a row's sum is the one-GPU sum.
 * Data-parallel listening: a rank with no work joins each MoE layer's exchange with zero tokens
 * (di_ep_listen calls listen_layer here for every MoE layer of the recorded order, dist/ep.c), running
 * its experts for the others' rows; the round ends when no rank's call came from a forward.
 * The placement (which slot holds which expert, EPLB's replicas and its step counting) is dist/ep.c's,
 * through di_ep_pick_slots; after a rebalance every local slot whose expert changed is uploaded again
 * from the host weights (ep->upload) before the layer's exchange (the stream is idle then: step 1
 * synchronizes). CUDA graphs are off under expert parallel (the row counts change the launches), so
 * nothing captured holds an old expert pointer. */
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

#define MAX_RANKS 1024

struct cu_ep_core {
  cu_ep_spec sp;
  di_comm *comm;       /* the exchange's: NCCL (device buffers) or MPI / self (host buffers) */
  di_comm *ctl;        /* counts: MPI world, or the self communicator */
  int own_comm;        /* comm is ours to destroy (NCCL) */
  int on_device;       /* comm takes device pointers */
  int rank, size, per_rank;
  /* host */
  int32_t *ids, *send_slot, *send_e, *counts_all, *pslot;
  size_t *sb, *rb;
  int cap_slots;
  void *h_send, *h_recv;  /* host staging without NCCL */
  size_t h_cap;
  /* device, grown on demand (graphs are off) */
  int32_t *d_send_slot, *d_send_e, *d_recv_e, *d_ident;
  void *d_send_x, *d_recv_x, *d_y_recv, *d_ret;
  int cap_send, cap_recv, cap_ident;
  /* EPLB */
  di_ep *place;        /* the placement and loads (dist/ep.c) */
  int eplb, uploaded;  /* --enable-eplb; rebalances already on the device */
  int32_t *held;       /* [layers][per_rank]: the logical expert each local slot holds on the device */
};

/* dst row j (row_words 32-bit words) = src row (src_idx ? src_idx[j] / div : j), stored at row
 * dst_idx ? dst_idx[j] : j */
static __global__ void move_rows(uint32_t *dst, const uint32_t *src, const int32_t *src_idx, int div,
                                 const int32_t *dst_idx, int n, int row_words) {
  const int j = blockIdx.x;
  if (j >= n) return;
  const int64_t from = src_idx ? src_idx[j] / div : j, to = dst_idx ? dst_idx[j] : j;
  for (int c = threadIdx.x; c < row_words; c += blockDim.x) dst[to * row_words + c] = src[from * row_words + c];
}

static __global__ void iota(int32_t *p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i;
}

di_status cu_ep_move_rows(void *dst, const void *src, const int32_t *src_idx, int div, const int32_t *dst_idx, int n,
                          size_t row_bytes, cudaStream_t s) {
  if (n <= 0) return DI_OK;
  if (row_bytes % 4) return di_error_set(DI_ERR_INTERNAL, "cuda expert parallel: rows of %zu bytes", row_bytes);
  move_rows<<<n, 256, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, src_idx, div, dst_idx, n, (int)(row_bytes / 4));
  DI_CU(cudaGetLastError());
  return DI_OK;
}

/* device buffer grown to at least `bytes` (contents not kept) */
static di_status grow_dev(void **p, size_t bytes) {
  if (*p) cudaFree(*p);
  *p = NULL;
  DI_CU(cudaMalloc(p, bytes > 0 ? bytes : 16));
  return DI_OK;
}

void cu_ep_pick_device(int ndev) {
  const char *lr = di_switch_get(DI_SW_MPI_OMPI_LOCAL_RANK);
  if ((di_dist_expert_parallel() || di_dist_dp_size() > 1) && lr && ndev > 0) cudaSetDevice(atoi(lr) % ndev);
}

static di_status listen_layer(void *user, int layer, int *any_real) {
  cu_ep_core *ep = (cu_ep_core *)user;
  const cu_ep_rows none = {NULL, 0, 1, NULL, ep->sp.x_bytes, NULL, ep->sp.y_bytes};
  return cu_epc_run(ep, layer, 0, &none, any_real);
}

di_status cu_epc_create(const cu_ep_spec *sp, cu_ep_core **out) {
  *out = NULL;
  di_comm *ctl = di_dist_comm();
  cu_ep_core *ep = (cu_ep_core *)calloc(1, sizeof *ep);
  if (!ep) return di_error_set(DI_ERR_OOM, "out of memory");
  ep->sp = *sp;
  ep->ctl = ctl;
  ep->rank = di_comm_rank(ctl);
  ep->size = di_comm_size(ctl);
  ep->eplb = di_dist_eplb_enabled();
  di_status st = DI_OK;
  if (ep->size > MAX_RANKS) st = di_error_set(DI_ERR_UNSUPPORTED, "cuda expert parallel: at most %d ranks", MAX_RANKS);
  if (st == DI_OK && !ep->eplb && sp->n_experts % ep->size)
    st = di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: %d routed experts do not split over %d ranks", sp->n_experts,
                      ep->size);
  /* the placement (contiguous blocks without EPLB): its step counting and layer order also drive the
   * data-parallel listener */
  if (st == DI_OK)
    st = di_dist_ep_get(sp->n_layers, sp->n_experts, sp->hidden, sp->n_groups > 0 ? sp->n_groups : 1, 0, &ep->place);
  if (st != DI_OK) {
    free(ep);
    return st;
  }
  *out = ep;
  ep->per_rank = di_ep_slots(ep->place) / ep->size;
  if (ep->eplb) {
    ep->held = (int32_t *)malloc(sizeof(int32_t) * (size_t)sp->n_layers * ep->per_rank);
    if (!ep->held) return di_error_set(DI_ERR_OOM, "out of memory");
    for (int l = 0; l < sp->n_layers; l++)
      for (int j = 0; j < ep->per_rank; j++)
        ep->held[(size_t)l * ep->per_rank + j] = di_ep_slot_expert(ep->place, l, ep->rank * ep->per_rank + j);
  }
  ep->comm = ctl;
#ifdef DI_HAVE_NCCL
  /* NCCL whenever the build has it: over the MPI world, or over this one rank without mpirun (the
   * one-GPU check of the exchange, tests/cuda/ep_nccl_check.sh); DEEPINFER_COMM=mpi keeps MPI (several
   * ranks on one GPU, which NCCL refuses) */
  const char *want = di_switch_get(DI_SW_COMM);
  const int force_mpi = want && strcmp(want, "mpi") == 0;
  if (want && !force_mpi && strcmp(want, "auto") != 0 && strcmp(want, "nccl") != 0)
    return di_error_set(DI_ERR_INVALID_ARG, "DEEPINFER_COMM=%s: not one of auto, nccl, mpi", want);
  if (!force_mpi && (di_comm_mpi_world() || ep->size == 1)) {
    int dev = 0;
    DI_CU(cudaGetDevice(&dev));
    DI_TRY(di_comm_nccl_create(di_comm_mpi_world(), dev, sp->stream, &ep->comm));
    ep->own_comm = 1;
    ep->on_device = 1;
  }
#else
  const char *want = di_switch_get(DI_SW_COMM);
  if (want && strcmp(want, "mpi") != 0 && strcmp(want, "auto") != 0)
    return di_error_set(DI_ERR_INVALID_ARG, "DEEPINFER_COMM=%s: this build has no NCCL (auto or mpi)", want);
#endif
  di_ep_set_listen_layer(ep->place, listen_layer, ep);
  return DI_OK;
}

int cu_epc_rank(const cu_ep_core *ep) { return ep->rank; }
int cu_epc_size(const cu_ep_core *ep) { return ep->size; }
int cu_epc_per_rank(const cu_ep_core *ep) { return ep->per_rank; }
int cu_epc_eplb(const cu_ep_core *ep) { return ep->eplb; }
const char *cu_epc_comm_kind(const cu_ep_core *ep) { return ep->comm->kind; }

int cu_epc_expert_of_slot(const cu_ep_core *ep, int l, int j) {
  if (!ep->eplb || l >= ep->sp.n_layers) return ep->rank * ep->per_rank + j;
  return ep->held[(size_t)l * ep->per_rank + j];
}

/* EPLB: after a rebalance, every local slot of every MoE layer whose expert moved, from the host */
static di_status upload_moved(cu_ep_core *ep) {
  const int rebal = di_ep_rebalances(ep->place);
  if (rebal == ep->uploaded) return DI_OK;
  if (!ep->sp.upload) return di_error_set(DI_ERR_INTERNAL, "cuda expert parallel: EPLB without an expert upload");
  int moved = 0;
  for (int l = 0; l < ep->sp.n_layers; l++) {
    for (int j = 0; j < ep->per_rank; j++) {
      const int e = di_ep_slot_expert(ep->place, l, ep->rank * ep->per_rank + j);
      int32_t *h = &ep->held[(size_t)l * ep->per_rank + j];
      if (*h == e) continue;
      int done = 0;
      DI_TRY(ep->sp.upload(ep->sp.user, l, e, j, &done));
      *h = e;
      moved += done;
    }
  }
  ep->uploaded = rebal;
  if (ep->rank == 0)
    fprintf(stderr, "deepinfer: cuda expert parallel: EPLB rebalance %d moved %d expert slot%s on rank 0\n", rebal,
            moved, moved == 1 ? "" : "s");
  return DI_OK;
}

void cu_epc_destroy(cu_ep_core *ep) {
  if (!ep) return;
  if (ep->place) di_ep_set_listen_layer(ep->place, NULL, NULL); /* the placement outlives the backend */
  if (ep->own_comm) di_comm_destroy(ep->comm);
  free(ep->ids), free(ep->send_slot), free(ep->send_e), free(ep->counts_all), free(ep->sb), free(ep->rb);
  free(ep->h_send), free(ep->h_recv), free(ep->held), free(ep->pslot);
  void *dev[] = {ep->d_send_slot, ep->d_send_e, ep->d_recv_e, ep->d_ident, ep->d_send_x, ep->d_recv_x, ep->d_y_recv,
                 ep->d_ret};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    if (dev[i]) cudaFree(dev[i]);
  free(ep);
}

static di_status grow_host(cu_ep_core *ep, int slots) {
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

static di_status grow_host_stage(cu_ep_core *ep, size_t bytes) {
  if (bytes <= ep->h_cap) return DI_OK;
  free(ep->h_send), free(ep->h_recv);
  ep->h_send = malloc(bytes), ep->h_recv = malloc(bytes);
  if (!ep->h_send || !ep->h_recv) return di_error_set(DI_ERR_OOM, "cuda expert parallel: out of host memory");
  ep->h_cap = bytes;
  return DI_OK;
}

/* alltoallv of device buffers through the communicator (host copies when it takes host pointers) */
static di_status exchange(cu_ep_core *ep, const void *send, const size_t *sb, void *recv, const size_t *rb) {
  cudaStream_t s = ep->sp.stream;
  if (ep->on_device) return di_comm_alltoallv(ep->comm, send, sb, recv, rb);
  size_t ns = 0, nr = 0;
  for (int r = 0; r < ep->size; r++) ns += sb[r], nr += rb[r];
  DI_TRY(grow_host_stage(ep, (ns > nr ? ns : nr) + 8));
  if (ns) DI_CU(cudaMemcpyAsync(ep->h_send, send, ns, cudaMemcpyDeviceToHost, s));
  DI_CU(cudaStreamSynchronize(s));
  DI_TRY(di_comm_alltoallv(ep->comm, ep->h_send, sb, ep->h_recv, rb));
  if (nr) DI_CU(cudaMemcpyAsync(recv, ep->h_recv, nr, cudaMemcpyHostToDevice, s));
  DI_CU(cudaStreamSynchronize(s)); /* the staging buffer is reused by the next exchange */
  return DI_OK;
}

const int32_t *cu_epc_identity(cu_ep_core *ep, int n, di_status *st) {
  *st = DI_OK;
  if (n > ep->cap_ident) {
    const int cap = n * 2;
    if ((*st = grow_dev((void **)&ep->d_ident, sizeof(int32_t) * cap)) != DI_OK) return NULL;
    iota<<<(cap + 255) / 256, 256, 0, ep->sp.stream>>>(ep->d_ident, cap);
    if (cudaGetLastError() != cudaSuccess) {
      *st = di_error_set(DI_ERR_BACKEND, "cuda expert parallel: iota failed");
      return NULL;
    }
    ep->cap_ident = cap;
  }
  return ep->d_ident;
}

di_status cu_epc_run(cu_ep_core *ep, int l, int real, const cu_ep_rows *r, int *any_real_out) {
  cudaStream_t s = ep->sp.stream;
  const int K = r->K, A = r->T * r->K, N = ep->size, E = ep->sp.n_experts, X = ep->sp.n_extra;
  const size_t xb = ep->sp.x_bytes, yb = ep->sp.y_bytes;
  di_dist_count_exchange(); /* the failure tests' injection point (DEEPINFER_DIST_TEST_FAIL) */
  DI_TRY(grow_host(ep, A + 1));
  if (!ep->counts_all) {
    ep->counts_all = (int32_t *)calloc((size_t)N * (N + 1), sizeof(int32_t));
    ep->sb = (size_t *)calloc((size_t)N, sizeof(size_t));
    ep->rb = (size_t *)calloc((size_t)N, sizeof(size_t));
    if (!ep->counts_all || !ep->sb || !ep->rb) return di_error_set(DI_ERR_OOM, "cuda expert parallel: out of memory");
  }
  /* 1: destinations and counts */
  if (A) {
    DI_CU(cudaMemcpyAsync(ep->ids, r->d_ids, sizeof(int32_t) * A, cudaMemcpyDeviceToHost, s));
    DI_CU(cudaStreamSynchronize(s));
  }
  for (int i = 0; i < A; i++)
    if (ep->ids[i] < -1 || ep->ids[i] >= E + X)
      return di_error_set(DI_ERR_INTERNAL, "cuda expert parallel: expert id %d out of range", ep->ids[i]);
  if (real) { /* each routed (token, slot)'s physical slot (in place; extras and unused: -1) */
    for (int i = 0; i < A; i++) ep->pslot[i] = ep->ids[i] < E ? ep->ids[i] : -1;
    DI_TRY(di_ep_pick_slots(ep->place, l, ep->pslot, A, ep->pslot));
  } else {
    DI_TRY(di_ep_pick_slots_listening(ep->place, l));
  }
  if (ep->eplb) DI_TRY(upload_moved(ep)); /* a rebalance lands in the call above */
  int32_t mine[MAX_RANKS + 1];
  memset(mine, 0, sizeof(int32_t) * (N + 1));
  int n_send = 0, n_extra = 0;
  for (int d = 0; d < N; d++) /* slots grouped by destination, in slot order inside each */
    for (int i = 0; i < A; i++) {
      const int id = ep->ids[i];
      if (id < 0) continue;
      const int extra = id >= E, dest = extra ? ep->rank : ep->pslot[i] / ep->per_rank;
      if (dest != d) continue;
      ep->send_slot[n_send] = i;
      ep->send_e[n_send++] = extra ? ep->per_rank + (id - E) : ep->pslot[i] - d * ep->per_rank; /* the local slot */
      mine[d]++;
      n_extra += extra;
    }
  mine[N] = real;
  DI_TRY(di_comm_allgather(ep->ctl, mine, sizeof(int32_t) * (N + 1), ep->counts_all));
  int n_recv = 0, any_real = 0;
  for (int q = 0; q < N; q++) {
    n_recv += ep->counts_all[(size_t)q * (N + 1) + ep->rank];
    any_real |= ep->counts_all[(size_t)q * (N + 1) + N] != 0;
  }
  if (any_real_out) *any_real_out = any_real;
  if (!any_real) return DI_OK; /* every rank is listening: the round is over */
  di_ep_count_rows(ep->place, n_recv - n_extra);
  /* device buffers for this step's rows */
  if (n_send > ep->cap_send || !ep->d_send_x) {
    const int cap = (n_send > 16 ? n_send : 16) * 2;
    DI_TRY(grow_dev((void **)&ep->d_send_slot, sizeof(int32_t) * cap));
    DI_TRY(grow_dev((void **)&ep->d_send_e, sizeof(int32_t) * cap));
    DI_TRY(grow_dev(&ep->d_send_x, xb * cap));
    DI_TRY(grow_dev(&ep->d_ret, yb * cap));
    ep->cap_send = cap;
  }
  if (n_recv > ep->cap_recv || !ep->d_recv_x) {
    const int cap = (n_recv > 16 ? n_recv : 16) * 2;
    DI_TRY(grow_dev((void **)&ep->d_recv_e, sizeof(int32_t) * cap));
    DI_TRY(grow_dev(&ep->d_recv_x, xb * cap));
    DI_TRY(grow_dev(&ep->d_y_recv, yb * cap));
    ep->cap_recv = cap;
  }
  /* 2: dispatch */
  if (n_send) {
    DI_CU(cudaMemcpyAsync(ep->d_send_slot, ep->send_slot, sizeof(int32_t) * n_send, cudaMemcpyHostToDevice, s));
    DI_CU(cudaMemcpyAsync(ep->d_send_e, ep->send_e, sizeof(int32_t) * n_send, cudaMemcpyHostToDevice, s));
  }
  DI_TRY(cu_ep_move_rows(ep->d_send_x, r->d_x, ep->d_send_slot, K, NULL, n_send, xb, s));
  for (int q = 0; q < N; q++) {
    ep->sb[q] = (size_t)mine[q] * xb;
    ep->rb[q] = (size_t)ep->counts_all[(size_t)q * (N + 1) + ep->rank] * xb;
  }
  DI_TRY(exchange(ep, ep->d_send_x, ep->sb, ep->d_recv_x, ep->rb));
  for (int q = 0; q < N; q++) ep->sb[q] = ep->sb[q] / xb * 4, ep->rb[q] = ep->rb[q] / xb * 4;
  DI_TRY(exchange(ep, ep->d_send_e, ep->sb, ep->d_recv_e, ep->rb));
  /* 3: the local experts over the received rows, as one GPU runs them */
  if (n_recv) DI_TRY(ep->sp.compute(ep->sp.user, l, ep->d_recv_x, ep->d_recv_e, n_recv, ep->d_y_recv));
  /* 4: outputs back to their senders, each to its (token, slot) row of y */
  for (int q = 0; q < N; q++) {
    const size_t sent = ep->sb[q] / 4, got = ep->rb[q] / 4;
    ep->sb[q] = got * yb;
    ep->rb[q] = sent * yb;
  }
  DI_TRY(exchange(ep, ep->d_y_recv, ep->sb, ep->d_ret, ep->rb));
  return cu_ep_move_rows(r->d_y, ep->d_ret, NULL, 1, ep->d_send_slot, n_send, yb, s);
}

/* ---- the DeepSeek-V2/V3 backend's side (cuda_deepseek2.cu) ----------------------------------------
 * Default mode: the shared experts unfolded (mlp_dense, on a second stream during the exchange unless
 * DEEPINFER_CUDA_EP_OVERLAP=0), the routed ones exchanged. Batch-invariant mode: the shared experts
 * stay folded into the grouped GEMM as on one GPU (n_sh experts of width I), as local extras every
 * rank holds: each (token, slot) row, shared ones included, is computed by the same kernel as on one
 * GPU (cu_routed_experts: per-row arithmetic independent of the rows beside it in that mode) and the
 * combine adds the K + n_sh slots in the same order, so EP N == EP 1 == one GPU bit for bit. */
struct cu_ep {
  cu_ep_core *core;
  cudaStream_t side;   /* DEEPINFER_CUDA_EP_OVERLAP=1: the shared experts' stream */
  cudaEvent_t ev_main, ev_side;
  int logged_format;   /* rank 0 said once which expert format the exchange feeds */
  /* the received rows' expert products */
  int32_t *perm_tok, *inv, *expert_off, *tiles, *n_tiles;
  bf16 *act, *egu;
  float *y_sorted;
  int cap;
  const di_ds_weights *w;
};

static di_status v2_upload(void *user, int l, int e, int j, int *done) {
  cu_backend *b = (cu_backend *)user;
  *done = 0;
  if (l >= b->n_layers + b->n_mtp || !b->L[l].is_moe) return DI_OK;
  if (!b->ep->w) return di_error_set(DI_ERR_INTERNAL, "cuda expert parallel: EPLB without the host weights");
  DI_TRY(cu_upload_expert(b, &b->ep->w->layers[l], l, e, j));
  *done = 1;
  return DI_OK;
}

/* the received rows x [n] (Hp bf16 each) through this rank's experts (local ids e, extras included)
 * into y [n] (Hp f32 each) in arrival order */
static di_status v2_compute(void *user, int l, const void *x, const int32_t *e, int n, void *y) {
  cu_backend *b = (cu_backend *)user;
  cu_ep *v = b->ep;
  const int El = b->ep_El + b->n_sh, Hp = b->Hp, bm = n >= 32 * El ? 64 : 16;
  int max_tiles = (n + bm - 1) / bm + El;
  if (max_tiles > n) max_tiles = n;
  if (n > v->cap) {
    const int cap = (n > 16 ? n : 16) * 2;
    DI_TRY(grow_dev((void **)&v->perm_tok, sizeof(int32_t) * cap));
    DI_TRY(grow_dev((void **)&v->inv, sizeof(int32_t) * cap));
    DI_TRY(grow_dev((void **)&v->tiles, sizeof(int32_t) * (size_t)(cap / 16 + El + 1)));
    DI_TRY(grow_dev((void **)&v->expert_off, sizeof(int32_t) * (size_t)(El + 1)));
    DI_TRY(grow_dev((void **)&v->n_tiles, sizeof(int32_t) * 4));
    DI_TRY(grow_dev((void **)&v->act, 2 * (size_t)cap * b->Ip));
    DI_TRY(grow_dev((void **)&v->egu, 2 * (size_t)cap * 2 * b->Ip));
    DI_TRY(grow_dev((void **)&v->y_sorted, sizeof(float) * (size_t)cap * Hp));
    v->cap = cap;
  }
  DI_TRY(di_cuk_moe_permute(e, n, 1, El, bm, v->perm_tok, v->inv, v->expert_off, v->tiles, v->n_tiles, b->stream));
  const int Kt = b->K + b->n_sh, T = (n + Kt - 1) / Kt; /* about the tokens the rows are of (kernel choice) */
  const cu_expert_rows io = {(const bf16 *)x, n, v->perm_tok, v->expert_off, v->tiles, v->n_tiles, max_tiles, bm, n,
                             T, -1, El, v->act, v->egu, v->y_sorted};
  DI_TRY(cu_routed_experts(b, &b->L[l], &io));
  return cu_ep_move_rows(y, v->y_sorted, v->inv, 1, NULL, n, sizeof(float) * Hp, b->stream);
}

di_status cu_ep_setup(cu_backend *b, const di_model_config *c) {
  if (!di_dist_expert_parallel() || c->n_routed_experts <= 0) return DI_OK;
  cu_ep *v = (cu_ep *)calloc(1, sizeof *v);
  if (!v) return di_error_set(DI_ERR_OOM, "out of memory");
  b->ep = v;
  if (!b->invariant) b->n_sh = 0; /* default mode: the shared experts through mlp_dense (see above) */
  const cu_ep_spec sp = {c->num_hidden_layers + (c->num_nextn_predict_layers > 0 ? c->num_nextn_predict_layers : 0),
                         c->n_routed_experts, c->hidden_size, c->n_group, b->n_sh, (size_t)b->Hp * 2,
                         sizeof(float) * (size_t)b->Hp, b->stream, v2_compute, v2_upload, b};
  DI_TRY(cu_epc_create(&sp, &v->core));
  b->ep_e0 = cu_epc_eplb(b->ep->core) ? 0 : cu_epc_rank(b->ep->core) * cu_epc_per_rank(b->ep->core);
  b->ep_El = cu_epc_per_rank(b->ep->core);
  if (b->n_sh == 0 && di_switch_bool(DI_SW_CUDA_EP_OVERLAP, 1)) {
    DI_CU(cudaStreamCreateWithFlags(&v->side, cudaStreamNonBlocking));
    DI_CU(cudaEventCreateWithFlags(&v->ev_main, cudaEventDisableTiming));
    DI_CU(cudaEventCreateWithFlags(&v->ev_side, cudaEventDisableTiming));
  }
  b->use_graphs = 0;  /* the exchange's sizes are the host's */
  const int size = cu_epc_size(b->ep->core);
  if (cu_epc_rank(b->ep->core) == 0) {
    fprintf(stderr, "deepinfer: cuda expert parallel over %d rank%s (%s): ", size, size > 1 ? "s" : "",
            cu_epc_comm_kind(b->ep->core));
    if (cu_epc_eplb(b->ep->core)) fprintf(stderr, "%d expert slots here (EPLB)", b->ep_El);
    else fprintf(stderr, "experts %d..%d here", b->ep_e0, b->ep_e0 + b->ep_El - 1);
    fprintf(stderr, "%s%s\n", b->n_sh ? ", shared experts folded (batch-invariant mode)" : "",
            v->side ? ", shared experts on a second stream" : "");
  }
  return DI_OK;
}

void cu_ep_set_weights(cu_backend *b, const di_ds_weights *w) {
  if (b->ep) b->ep->w = w;
}

int cu_ep_local_expert(cu_backend *b, int l, int j) { return cu_epc_expert_of_slot(b->ep->core, l, j); }

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
  cu_ep *v = b->ep;
  if (!v) return;
  cu_epc_destroy(v->core);
  if (v->side) cudaStreamDestroy(v->side), cudaEventDestroy(v->ev_main), cudaEventDestroy(v->ev_side);
  void *dev[] = {v->perm_tok, v->inv, v->expert_off, v->tiles, v->n_tiles, v->act, v->egu, v->y_sorted};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    if (dev[i]) cudaFree(dev[i]);
  free(v);
  b->ep = NULL;
}

di_status cu_ep_moe(cu_backend *b, int l, int T, const int32_t **inv_out) {
  cu_ep *v = b->ep;
  if (!v->logged_format && cu_epc_rank(b->ep->core) == 0)
    fprintf(stderr, "deepinfer: cuda expert parallel: layer %d's experts in %s\n", l,
            b->L[l].f_exp_gu.q ? "fp8" : "bf16");
  v->logged_format = 1;
  const int Kt = b->K + b->n_sh;
  const cu_ep_rows r = {b->topk_ids, T, Kt, b->xn, (size_t)b->Hp * 2, b->y, sizeof(float) * (size_t)b->Hp};
  DI_TRY(cu_epc_run(b->ep->core, l, 1, &r, NULL));
  di_status st;
  *inv_out = cu_epc_identity(b->ep->core, T * Kt, &st);
  return st;
}
