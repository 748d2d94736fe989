/* A one-rank communicator (no MPI): every collective is a copy. It lets the expert-parallel path and
 * EPLB run (and be tested) in a single process, with the same code as N ranks. */
#include "dist/comm.h"
#include "util/status.h"
#include <stdlib.h>
#include <string.h>

static di_status self_barrier(di_comm *c) { return DI_OK; }
static di_status self_allgather(di_comm *c, const void *send, size_t bytes, void *recv) {
  if (bytes)
    memmove(recv, send, bytes);
  return DI_OK;
}
static di_status self_alltoallv(di_comm *c, const void *send, const size_t *send_bytes, void *recv,
                                const size_t *recv_bytes) {
  if (send_bytes[0] != recv_bytes[0])
    return di_error_set(DI_ERR_INTERNAL, "alltoallv on one rank: %zu bytes sent, %zu expected", send_bytes[0],
                        recv_bytes[0]);
  if (send_bytes[0])
    memmove(recv, send, send_bytes[0]);
  return DI_OK;
}
static di_status self_broadcast(di_comm *c, void *buf, size_t bytes, int root) { return DI_OK; }
static void self_destroy(di_comm *c) { free(c); }

static const di_comm_ops SELF_OPS = {self_barrier, self_allgather, self_alltoallv, self_broadcast, self_destroy};

di_status di_comm_self_create(di_comm **out) {
  di_comm *c = calloc(1, sizeof *c);
  if (!c)
    return di_error_set(DI_ERR_OOM, "out of memory");
  *c = (di_comm){&SELF_OPS, 0, 1, 1, 60.0, "self"};
  *out = c;
  return DI_OK;
}
