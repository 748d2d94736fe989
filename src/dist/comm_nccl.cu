/* The NCCL communicator for GPU ranks (see comm.h): buffers are device pointers on the rank's
 * stream. Rank 0 makes the NCCL unique id and the MPI world communicator broadcasts it; alltoallv is
 * grouped ncclSend/ncclRecv (the form that overlaps with the shared experts on another stream).
 * Every collective is enqueued, then its stream polled against the timeout; a timeout or an
 * asynchronous NCCL error aborts the NCCL communicator (ncclCommAbort unblocks the kernels) and
 * returns an error naming the collective, so the caller ends the job instead of hanging.
 * In the library when CUDA, NCCL and MPI are found (DI_HAVE_NCCL); the CUDA backend's expert
 * parallel (src/backend/cuda/cuda_ep.cu) exchanges through it. */
#include "dist/comm.h"
extern "C" {
#include "util/status.h"
}
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
di_status di_comm_nccl_create(di_comm *mpi_world, int device, void *stream, di_comm **out);
}

typedef struct {
  di_comm base;
  ncclComm_t nccl;
  cudaStream_t stream;
  int dead;
} nccl_comm;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static di_status nccl_wait(nccl_comm *n, const char *what) {
  const double t0 = now_s();
  for (;;) {
    cudaError_t ce = cudaStreamQuery(n->stream);
    if (ce == cudaSuccess)
      return DI_OK;
    if (ce != cudaErrorNotReady)
      return di_error_set(DI_ERR_INTERNAL, "%s on GPU rank %d: %s", what, n->base.rank, cudaGetErrorString(ce));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(n->nccl, &async);
    const int late = now_s() - t0 > n->base.timeout_s;
    if (async != ncclSuccess || late) {
      ncclCommAbort(n->nccl);
      n->dead = 1;
      if (late)
        return di_error_set(DI_ERR_INTERNAL, "%s between GPU ranks timed out after %g s on rank %d of %d (a peer died "
                            "or stalled)", what, n->base.timeout_s, n->base.rank, n->base.size);
      return di_error_set(DI_ERR_INTERNAL, "%s between GPU ranks failed on rank %d: %s", what, n->base.rank,
                          ncclGetErrorString(async));
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

static di_status nccl_check(nccl_comm *n, ncclResult_t r, const char *what) {
  if (n->dead)
    return di_error_set(DI_ERR_INTERNAL, "%s: the NCCL communicator was aborted after an earlier failure", what);
  if (r != ncclSuccess)
    return di_error_set(DI_ERR_INTERNAL, "%s on GPU rank %d: %s", what, n->base.rank, ncclGetErrorString(r));
  return nccl_wait(n, what);
}

static di_status nccl_barrier(di_comm *c) {
  nccl_comm *n = (nccl_comm *)c;
  static int *one; /* one device int, allocated once */
  if (!one && cudaMalloc(&one, sizeof(int)) != cudaSuccess)
    return di_error_set(DI_ERR_OOM, "barrier: cudaMalloc failed");
  return nccl_check(n, ncclAllReduce(one, one, 1, ncclInt32, ncclSum, n->nccl, n->stream), "barrier");
}

static di_status nccl_allgather(di_comm *c, const void *send, size_t bytes, void *recv) {
  nccl_comm *n = (nccl_comm *)c;
  return nccl_check(n, ncclAllGather(send, recv, bytes, ncclUint8, n->nccl, n->stream), "allgather");
}

static di_status nccl_alltoallv(di_comm *c, const void *send, const size_t *send_bytes, void *recv,
                                const size_t *recv_bytes) {
  nccl_comm *n = (nccl_comm *)c;
  size_t so = 0, ro = 0;
  ncclResult_t r = ncclGroupStart();
  for (int p = 0; p < c->size && r == ncclSuccess; p++) {
    if (send_bytes[p])
      r = ncclSend((const char *)send + so, send_bytes[p], ncclUint8, p, n->nccl, n->stream);
    if (r == ncclSuccess && recv_bytes[p])
      r = ncclRecv((char *)recv + ro, recv_bytes[p], ncclUint8, p, n->nccl, n->stream);
    so += send_bytes[p];
    ro += recv_bytes[p];
  }
  ncclResult_t r2 = ncclGroupEnd();
  return nccl_check(n, r != ncclSuccess ? r : r2, "alltoallv");
}

static di_status nccl_broadcast(di_comm *c, void *buf, size_t bytes, int root) {
  nccl_comm *n = (nccl_comm *)c;
  return nccl_check(n, ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->nccl, n->stream), "broadcast");
}

static void nccl_destroy(di_comm *c) {
  nccl_comm *n = (nccl_comm *)c;
  if (!n->dead)
    ncclCommDestroy(n->nccl);
  free(n);
}

static const di_comm_ops NCCL_OPS = {nccl_barrier, nccl_allgather, nccl_alltoallv, nccl_broadcast, nccl_destroy};

/* mpi_world: the MPI communicator (di_comm_mpi_create) the unique id is shared through, or NULL for
 * one rank (its own id; no MPI needed: every exchange is a send to itself through NCCL); device: this
 * rank's GPU; stream: the cudaStream_t the collectives run on (NULL: the default stream). */
di_status di_comm_nccl_create(di_comm *mpi_world, int device, void *stream, di_comm **out) {
  *out = NULL;
  const int rank = mpi_world ? mpi_world->rank : 0, size = mpi_world ? mpi_world->size : 1;
  if (cudaSetDevice(device) != cudaSuccess)
    return di_error_set(DI_ERR_INTERNAL, "cudaSetDevice(%d) failed on rank %d", device, rank);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
    return di_error_set(DI_ERR_INTERNAL, "ncclGetUniqueId failed");
  if (mpi_world)
    DI_TRY(di_comm_broadcast(mpi_world, &id, sizeof id, 0));
  nccl_comm *n = (nccl_comm *)calloc(1, sizeof *n);
  if (!n)
    return di_error_set(DI_ERR_OOM, "out of memory");
  n->stream = (cudaStream_t)stream;
  ncclResult_t r = ncclCommInitRank(&n->nccl, size, id, rank);
  if (r != ncclSuccess) {
    free(n);
    return di_error_set(DI_ERR_INTERNAL, "ncclCommInitRank on rank %d: %s", rank, ncclGetErrorString(r));
  }
  n->base.ops = &NCCL_OPS;
  n->base.rank = rank;
  n->base.size = size;
  n->base.n_nodes = mpi_world ? mpi_world->n_nodes : 1;
  n->base.timeout_s = mpi_world ? mpi_world->timeout_s : 60.0;
  n->base.kind = "nccl";
  *out = &n->base;
  return DI_OK;
}
