/* Per-connection watch for the closes libmicrohttpd does not report (conn_watch.c). */
#ifndef DI_SERVER_CONN_WATCH_H
#define DI_SERVER_CONN_WATCH_H
#include <stddef.h>

typedef struct di_conn_watch di_conn_watch;

di_conn_watch *di_conn_watch_new(void); /* NULL when out of memory: the others accept NULL */
/* the access handler took a request on this connection / the request ended (fd: the socket) */
void di_conn_watch_request_begin(di_conn_watch *w);
void di_conn_watch_request_end(di_conn_watch *w, int fd);
/* The connection is closing (fd still open); frees w. Returns 1 and writes the reason to `why` when
 * the client sent bytes since the last request ended that nobody answered: a rejection to log. */
int di_conn_watch_closed(di_conn_watch *w, int fd, int timeout_s, int stopping, char *why, size_t cap);
#endif
