/* The MPI communicator for CPU ranks (see comm.h). Every collective is a blocking MPI call watched
 * by a thread against the timeout: past it, this rank prints which collective timed out and exits,
 * and mpirun ends the others (a dead or stalled peer never hangs the job). Errors MPI itself reports
 * (a peer's connection gone) are returned (MPI_ERRORS_RETURN), not fatal. Built when CMake finds MPI. */
#include "util/switches.h"
#include "dist/comm.h"
#include "util/status.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int di_comm_launched_by_mpi(void) {
  return di_switch_get(DI_SW_MPI_OMPI_SIZE) != NULL || di_switch_get(DI_SW_MPI_PMIX_RANK) != NULL ||
         di_switch_get(DI_SW_MPI_PMI_RANK) != NULL;
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
di_status di_comm_post_work(di_comm *c, const void *buf, size_t bytes) {
  (void)c, (void)buf, (void)bytes;
  return di_error_set(DI_ERR_UNSUPPORTED, "this deepinfer was built without MPI");
}
di_status di_comm_wait_work(di_comm *c, void *buf, size_t bytes) { return di_comm_post_work(c, buf, bytes); }
void di_comm_abort(di_comm *c, const char *why) {
  fprintf(stderr, "deepinfer: rank %d: %s; ending the job\n", di_comm_rank(c), why);
  exit(1);
}

#else
#include <mpi.h>
#include <pthread.h>

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

/* The watchdog: a collective sets its name and deadline before the blocking MPI call and clears
 * them after; the thread checks twice a second and ends the process past the deadline (mpirun then
 * ends the other ranks). Blocking calls rather than nonblocking ones polled against the clock: Open
 * MPI 4.1's libnbc was seen to hang an Ialltoallv between a rank with rows and one without. */
static pthread_mutex_t g_wd_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *g_wd_what;
static double g_wd_deadline, g_wd_timeout;
static int g_wd_rank, g_wd_size, g_wd_stop;
static pthread_t g_wd_thread;

static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&g_wd_mu);
    const int stop = g_wd_stop, late = g_wd_what && now_s() > g_wd_deadline;
    const char *what = g_wd_what;
    pthread_mutex_unlock(&g_wd_mu);
    if (stop)
      return NULL;
    if (late) {
      fprintf(stderr,
              "deepinfer: rank %d: %s between ranks timed out after %g s on rank %d of %d (a peer died or stalled; "
              "--dist-timeout sets the limit); ending the job\n",
              g_wd_rank, what, g_wd_timeout, g_wd_rank, g_wd_size);
      fflush(stderr);
      _exit(1);
    }
  }
}

static void wd_arm(const char *what) {
  pthread_mutex_lock(&g_wd_mu);
  g_wd_what = what;
  g_wd_deadline = now_s() + g_wd_timeout;
  pthread_mutex_unlock(&g_wd_mu);
}
static int wd_disarm(int rc) {
  pthread_mutex_lock(&g_wd_mu);
  g_wd_what = NULL;
  pthread_mutex_unlock(&g_wd_mu);
  return rc;
}

static di_status mpi_barrier(di_comm *c) {
  mpi_comm *m = (mpi_comm *)c;
  wd_arm("barrier");
  int rc = wd_disarm(MPI_Barrier(m->comm));
  return rc != MPI_SUCCESS ? mpi_fail(m, "barrier", rc) : DI_OK;
}

static di_status mpi_allgather(di_comm *c, const void *send, size_t bytes, void *recv) {
  mpi_comm *m = (mpi_comm *)c;
  if (bytes > (size_t)0x7fffffff)
    return di_error_set(DI_ERR_INVALID_ARG, "allgather of %zu bytes per rank: more than MPI's int count", bytes);
  wd_arm("allgather");
  int rc = wd_disarm(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, m->comm));
  return rc != MPI_SUCCESS ? mpi_fail(m, "allgather", rc) : DI_OK;
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
  static char empty[8]; /* MPI wants valid pointers even for empty buffers */
  wd_arm("alltoallv");
  int rc = wd_disarm(MPI_Alltoallv(so ? send : empty, m->counts, m->displs, MPI_BYTE, ro ? recv : empty, m->rcounts,
                                   m->rdispls, MPI_BYTE, m->comm));
  return rc != MPI_SUCCESS ? mpi_fail(m, "alltoallv", rc) : DI_OK;
}

static di_status mpi_broadcast(di_comm *c, void *buf, size_t bytes, int root) {
  mpi_comm *m = (mpi_comm *)c;
  if (bytes > (size_t)0x7fffffff)
    return di_error_set(DI_ERR_INVALID_ARG, "broadcast of %zu bytes: more than MPI's int count", bytes);
  wd_arm("broadcast");
  int rc = wd_disarm(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, m->comm));
  return rc != MPI_SUCCESS ? mpi_fail(m, "broadcast", rc) : DI_OK;
}

static void mpi_destroy(di_comm *c) {
  mpi_comm *m = (mpi_comm *)c;
  free(m->counts);
  free(m->displs);
  free(m->rcounts);
  free(m->rdispls);
  if (c == g_world) {
    g_world = NULL;
    pthread_mutex_lock(&g_wd_mu);
    g_wd_stop = 1;
    pthread_mutex_unlock(&g_wd_mu);
    pthread_join(g_wd_thread, NULL);
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
  g_wd_rank = m->base.rank, g_wd_size = m->base.size, g_wd_timeout = m->base.timeout_s, g_wd_stop = 0;
  if (pthread_create(&g_wd_thread, NULL, watchdog, NULL) != 0) {
    g_world = NULL;
    mpi_destroy(&m->base);
    return di_error_set(DI_ERR_INTERNAL, "cannot start the collective watchdog thread");
  }
  snprintf(g_term_msg, sizeof g_term_msg,
           "deepinfer: rank %d: terminated by the launcher (another rank failed); ending the job\n", m->base.rank);
  signal(SIGTERM, on_term);
  *out = &m->base;
  return DI_OK;
}

di_comm *di_comm_mpi_world(void) { return g_world; }

enum { WORK_TAG = 7321 };

di_status di_comm_post_work(di_comm *c, const void *buf, size_t bytes) {
  mpi_comm *m = (mpi_comm *)c;
  if (strcmp(c->kind, "mpi") != 0 || bytes > 4096)
    return di_error_set(DI_ERR_INVALID_ARG, "work hand-off: an MPI communicator and at most 4096 bytes");
  for (int r = 1; r < c->size; r++) {
    wd_arm("work hand-off");
    int rc = wd_disarm(MPI_Send(buf, (int)bytes, MPI_BYTE, r, WORK_TAG, m->comm));
    if (rc != MPI_SUCCESS)
      return mpi_fail(m, "work hand-off", rc);
  }
  return DI_OK;
}

di_status di_comm_wait_work(di_comm *c, void *buf, size_t bytes) {
  mpi_comm *m = (mpi_comm *)c;
  if (strcmp(c->kind, "mpi") != 0 || bytes > 4096)
    return di_error_set(DI_ERR_INVALID_ARG, "work hand-off: an MPI communicator and at most 4096 bytes");
  MPI_Request req;
  const pid_t launcher = getppid();
  int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, 0, WORK_TAG, m->comm, &req);
  for (long polls = 0; rc == MPI_SUCCESS; polls++) {
    int done = 0;
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done)
      break;
    if (polls % 1024 == 1023 && getppid() != launcher) { /* mpirun itself was killed: nobody will end us */
      fprintf(stderr, "deepinfer: rank %d: the launcher (mpirun) is gone; ending\n", c->rank);
      _exit(1);
    }
    /* spin briefly (a busy server's next step comes within microseconds), then sleep 1 ms a poll */
    struct timespec ts = {0, polls < 200 ? 20000 : 1000000};
    nanosleep(&ts, NULL);
  }
  return rc != MPI_SUCCESS ? mpi_fail(m, "work hand-off", rc) : DI_OK;
}

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
