/* The communicator between ranks: one small interface over MPI (CPU ranks, host buffers) and NCCL
 * (GPU ranks, device buffers; its unique id shared through the MPI communicator). Ranks are
 * processes started by `mpirun -np N deepinfer ...`.
 *
 * Contract: every collective is entered by every rank in the same order (the model's layers give the
 * order). A collective that does not finish within the timeout (a dead or stalled peer) ends the
 * job: the rank prints the collective, its rank and the timeout and exits, the launcher stops the
 * others (MPI; NCCL aborts its communicator and returns an error). Other failures return
 * DI_ERR_INTERNAL with a message; the caller ends the job with di_comm_abort (never a hang).
 * Byte counts are per peer; alltoallv's send and receive buffers are packed by peer in rank order. */
#ifndef DI_DIST_COMM_H
#define DI_DIST_COMM_H
#include "deepinfer.h"
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct di_comm di_comm;

typedef struct di_comm_ops {
  di_status (*barrier)(di_comm *c);
  /* recv[r * bytes ..] = rank r's send (bytes each) */
  di_status (*allgather)(di_comm *c, const void *send, size_t bytes, void *recv);
  /* rank r gets send_bytes[r] from this rank's send; this rank gets recv_bytes[r] from rank r */
  di_status (*alltoallv)(di_comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes);
  di_status (*broadcast)(di_comm *c, void *buf, size_t bytes, int root);
  void (*destroy)(di_comm *c);
} di_comm_ops;

struct di_comm {
  const di_comm_ops *ops;
  int rank, size;
  int n_nodes;        /* machines the ranks run on (ranks sharing memory count as one node) */
  double timeout_s;   /* for every collective */
  const char *kind;   /* "mpi" or "nccl" */
};

static inline int di_comm_rank(const di_comm *c) { return c ? c->rank : 0; }
static inline int di_comm_size(const di_comm *c) { return c ? c->size : 1; }
static inline di_status di_comm_barrier(di_comm *c) { return c->ops->barrier(c); }
static inline di_status di_comm_allgather(di_comm *c, const void *send, size_t bytes, void *recv) {
  return c->ops->allgather(c, send, bytes, recv);
}
static inline di_status di_comm_alltoallv(di_comm *c, const void *send, const size_t *send_bytes, void *recv,
                                          const size_t *recv_bytes) {
  return c->ops->alltoallv(c, send, send_bytes, recv, recv_bytes);
}
static inline di_status di_comm_broadcast(di_comm *c, void *buf, size_t bytes, int root) {
  return c->ops->broadcast(c, buf, bytes, root);
}
/* The work hand-off of a data-parallel front end (dist/dp_engine.c), outside the collectives' deadline:
 * rank 0 posts `bytes` to every other rank (MPI point to point, returns at once); a worker waits for
 * them as long as it takes (a server may sit idle for hours), polling with short sleeps rather than
 * spinning a core. A dead rank 0 is seen by mpirun, which ends the workers; a worker whose mpirun is
 * gone (killed) ends itself. MPI communicator only. */
di_status di_comm_post_work(di_comm *c, const void *buf, size_t bytes);
di_status di_comm_wait_work(di_comm *c, void *buf, size_t bytes);
/* Destroys the communicator; NULL does nothing. For MPI it finalizes MPI. */
void di_comm_destroy(di_comm *c);

/* 1 when this process was started by an MPI launcher (OpenMPI's or PMIx's rank variables are set). */
int di_comm_launched_by_mpi(void);
/* The world communicator over MPI (initializes MPI). DI_ERR_UNSUPPORTED when built without MPI. */
di_status di_comm_mpi_create(double timeout_s, di_comm **out);
/* The MPI world communicator once created (NULL before): what the NCCL communicator bootstraps over. */
di_comm *di_comm_mpi_world(void);
/* A one-rank communicator without MPI (collectives are copies). */
di_status di_comm_self_create(di_comm **out);
/* Prints "deepinfer: rank R: <why>; ending the job" on stderr and stops every rank (MPI_Abort; exit
 * when there is no MPI). For failures of the job itself: a dead peer, a timed-out collective. */
__attribute__((noreturn)) void di_comm_abort(di_comm *c, const char *why);
#ifdef __cplusplus
}
#endif
#endif
