/* The MPI communicator for CPU ranks (see comm.h). Every collective is the nonblocking MPI call
 * polled against a deadline, so a dead or stalled peer becomes an error naming the collective after
 * the timeout instead of a hang; errors of MPI itself are returned (MPI_ERRORS_RETURN), not fatal.
 * Polling yields the CPU between tests: CI oversubscribes 4 ranks on 2 cores, where a spinning
 * waiter would take the core the peer it waits for needs. Built only when CMake finds MPI. */
#include "dist/comm.h"
#include "util/status.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>

int di_comm_launched_by_mpi(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL || getenv("PMI_RANK") != NULL;
}

void di_comm_destroy(di_comm *c) {
  if (c)
    c->ops->destroy(c);
}

#ifndef DI_HAVE_MPI

di_status di_comm_mpi_create(double timeout_s, di_comm **out) {
  (void)timeout_s;
  *out = NULL;
  return di_error_set(DI_ERR_UNSUPPORTED, "this deepinfer was built without MPI (install libopenmpi-dev and rebuild)");
}
di_comm *di_comm_mpi_world(void) { return NULL; }
void di_comm_abort(di_comm *c, const char *why) {
  fprintf(stderr, "deepinfer: rank %d: %s; ending the job\n", di_comm_rank(c), why);
  exit(1);
}

#else
#include <mpi.h>

typedef struct {
  di_comm base;
  MPI_Comm comm;
  int *counts, *displs, *rcounts, *rdispls; /* [size] each, for alltoallv */
} mpi_comm;

static di_comm *g_world;
static char g_term_msg[160];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static di_status mpi_fail(mpi_comm *m, const char *what, int rc) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return di_error_set(DI_ERR_INTERNAL, "%s between ranks failed on rank %d of %d: %s (a peer died?)", what,
                      m->base.rank, m->base.size, msg);
}

/* Waits for `req` until the communicator's timeout. */
static di_status wait_req(mpi_comm *m, MPI_Request *req, const char *what) {
  const double t0 = now_s();
  for (long spins = 0;; spins++) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return mpi_fail(m, what, rc);
    if (done)
      return DI_OK;
    if (now_s() - t0 > m->base.timeout_s)
      return di_error_set(DI_ERR_INTERNAL,
                          "%s between ranks timed out after %g s on rank %d of %d (a peer died or stalled; "
                          "--dist-timeout sets the limit)",
                          what, m->base.timeout_s, m->base.rank, m->base.size);
    if (spins > 64) {
      struct timespec ts = {0, spins > 4096 ? 200000 : 20000};
      nanosleep(&ts, NULL);
    } else {
      sched_yield();
    }
  }
}

static di_status mpi_barrier(di_comm *c) {
  mpi_comm *m = (mpi_comm *)c;
  MPI_Request req;
  int rc = MPI_Ibarrier(m->comm, &req);
  return rc != MPI_SUCCESS ? mpi_fail(m, "barrier", rc) : wait_req(m, &req, "barrier");
}

static di_status mpi_allgather(di_comm *c, const void *send, size_t bytes, void *recv) {
  mpi_comm *m = (mpi_comm *)c;
  if (bytes > (size_t)0x7fffffff)
    return di_error_set(DI_ERR_INVALID_ARG, "allgather of %zu bytes per rank: more than MPI's int count", bytes);
  MPI_Request req;
  int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, m->comm, &req);
  return rc != MPI_SUCCESS ? mpi_fail(m, "allgather", rc) : wait_req(m, &req, "allgather");
}

static di_status mpi_alltoallv(di_comm *c, const void *send, const size_t *send_bytes, void *recv,
                               const size_t *recv_bytes) {
  mpi_comm *m = (mpi_comm *)c;
  size_t so = 0, ro = 0;
  for (int r = 0; r < c->size; r++) {
    if (so + send_bytes[r] > (size_t)0x7fffffff || ro + recv_bytes[r] > (size_t)0x7fffffff)
      return di_error_set(DI_ERR_INVALID_ARG, "alltoallv of more than 2 GiB: more than MPI's int displacements");
    m->counts[r] = (int)send_bytes[r];
    m->displs[r] = (int)so;
    m->rcounts[r] = (int)recv_bytes[r];
    m->rdispls[r] = (int)ro;
    so += send_bytes[r];
    ro += recv_bytes[r];
  }
  /* MPI wants valid pointers even for empty buffers */
  static char empty[8];
  MPI_Request req;
  int rc = MPI_Ialltoallv(so ? send : empty, m->counts, m->displs, MPI_BYTE, ro ? recv : empty, m->rcounts, m->rdispls,
                          MPI_BYTE, m->comm, &req);
  return rc != MPI_SUCCESS ? mpi_fail(m, "alltoallv", rc) : wait_req(m, &req, "alltoallv");
}

static di_status mpi_broadcast(di_comm *c, void *buf, size_t bytes, int root) {
  mpi_comm *m = (mpi_comm *)c;
  if (bytes > (size_t)0x7fffffff)
    return di_error_set(DI_ERR_INVALID_ARG, "broadcast of %zu bytes: more than MPI's int count", bytes);
  MPI_Request req;
  int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, m->comm, &req);
  return rc != MPI_SUCCESS ? mpi_fail(m, "broadcast", rc) : wait_req(m, &req, "broadcast");
}

static void mpi_destroy(di_comm *c) {
  mpi_comm *m = (mpi_comm *)c;
  free(m->counts);
  free(m->displs);
  free(m->rcounts);
  free(m->rdispls);
  if (c == g_world) {
    g_world = NULL;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
      MPI_Finalize();
  }
  free(m);
}

static const di_comm_ops MPI_OPS = {mpi_barrier, mpi_allgather, mpi_alltoallv, mpi_broadcast, mpi_destroy};

/* mpirun ends the surviving ranks with SIGTERM when one dies: say so before going (write(2) is
 * async-signal-safe; the message was formatted at start-up). */
static void on_term(int sig) {
  ssize_t w = write(2, g_term_msg, strlen(g_term_msg));
  (void)w;
  signal(sig, SIG_DFL);
  raise(sig);
}

di_status di_comm_mpi_create(double timeout_s, di_comm **out) {
  *out = NULL;
  if (g_world)
    return di_error_set(DI_ERR_INVALID_ARG, "the MPI world communicator exists already");
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS)
    return di_error_set(DI_ERR_INTERNAL, "MPI_Init failed (is this process started by mpirun?)");
  mpi_comm *m = calloc(1, sizeof *m);
  if (!m)
    return di_error_set(DI_ERR_OOM, "out of memory");
  m->comm = MPI_COMM_WORLD;
  MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  m->base.ops = &MPI_OPS;
  m->base.kind = "mpi";
  m->base.timeout_s = timeout_s > 0 ? timeout_s : 60.0;
  MPI_Comm_rank(m->comm, &m->base.rank);
  MPI_Comm_size(m->comm, &m->base.size);
  const size_t n = (size_t)m->base.size;
  m->counts = malloc(sizeof(int) * n);
  m->displs = malloc(sizeof(int) * n);
  m->rcounts = malloc(sizeof(int) * n);
  m->rdispls = malloc(sizeof(int) * n);
  if (!m->counts || !m->displs || !m->rcounts || !m->rdispls) {
    mpi_destroy(&m->base);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  /* nodes: how many ranks are the lowest rank of their shared-memory group */
  MPI_Comm local;
  int local_rank = 0;
  if (MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, m->base.rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
  }
  int leader = local_rank == 0, nodes = 1;
  MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, m->comm);
  m->base.n_nodes = nodes;
  g_world = &m->base;
  snprintf(g_term_msg, sizeof g_term_msg,
           "deepinfer: rank %d: terminated by the launcher (another rank failed); ending the job\n", m->base.rank);
  signal(SIGTERM, on_term);
  *out = &m->base;
  return DI_OK;
}

di_comm *di_comm_mpi_world(void) { return g_world; }

void di_comm_abort(di_comm *c, const char *why) {
  fprintf(stderr, "deepinfer: rank %d: %s; ending the job\n", di_comm_rank(c), why);
  fflush(stderr);
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin)
    MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}
#endif
