/* Notices the connections libmicrohttpd closes without an answer and without telling the
 * application: a request line it cannot split (`GARBAGE`), a head not finished within the
 * connection timeout (no 408 is sent: 0.9.75 closes a timed-out connection silently), a client
 * that closed mid-head. None of these reach the access handler or the completion callback, so the
 * server learns of them only when the socket is closed (MHD_CONNECTION_NOTIFY_CLOSED, called
 * before libmicrohttpd closes the descriptor). The kernel's TCP counters tell them apart from an
 * idle keep-alive connection: bytes received since the last request ended, nothing sent since
 * (when libmicrohttpd answered with its own error page it sent bytes, and its logger already said
 * why). Its own file because it needs <linux/tcp.h> (the byte counters), which clashes with the
 * <netinet/tcp.h> the transport uses. */
#include "server/conn_watch.h"
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct di_conn_watch {
  int in_request;          /* the access handler has this connection's current request */
  unsigned long long rx_done, tx_done; /* the socket's byte counters when the last request ended */
};

static int tcp_counters(int fd, unsigned long long *rx, unsigned long long *tx, unsigned *idle_ms) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  memset(&ti, 0, sizeof ti);
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
    return -1; /* not TCP, or a kernel older than 4.19 (no counters): nothing is reported */
  *rx = ti.tcpi_bytes_received;
  *tx = ti.tcpi_bytes_acked; /* acknowledged by the client: enough to say "something was sent" */
  if (len >= offsetof(struct tcp_info, tcpi_bytes_sent) + sizeof ti.tcpi_bytes_sent) *tx = ti.tcpi_bytes_sent;
  *idle_ms = ti.tcpi_last_data_recv;
  return 0;
}

di_conn_watch *di_conn_watch_new(void) { return calloc(1, sizeof(di_conn_watch)); }

void di_conn_watch_request_begin(di_conn_watch *w) {
  if (w) w->in_request = 1;
}

void di_conn_watch_request_end(di_conn_watch *w, int fd) {
  if (!w) return;
  w->in_request = 0;
  unsigned idle;
  if (tcp_counters(fd, &w->rx_done, &w->tx_done, &idle) != 0) w->rx_done = w->tx_done = ~0ull;
}

int di_conn_watch_closed(di_conn_watch *w, int fd, int timeout_s, int stopping, char *why, size_t cap) {
  if (!w) return 0;
  int report = 0;
  unsigned long long rx, tx;
  unsigned idle_ms;
  struct pollfd p = {fd, POLLRDHUP, 0};
  int peer_closed = fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP));
  /* the kernel counts the client's FIN as one byte received */
  if (!w->in_request && w->rx_done != ~0ull && tcp_counters(fd, &rx, &tx, &idle_ms) == 0 &&
      rx - (peer_closed && rx > 0) > w->rx_done && tx == w->tx_done) {
    unsigned long long pending = rx - (unsigned long long)peer_closed - w->rx_done;
    report = 1;
    if (stopping)
      snprintf(why, cap, "%llu bytes of an unfinished request head when the server stopped", pending);
    else if ((unsigned long long)idle_ms + 1000 >= (unsigned long long)timeout_s * 1000)
      snprintf(why, cap, "408: no complete request head within %d s (--keep-alive-timeout; %llu bytes came); "
               "closed without a response (libmicrohttpd 0.9.75 sends none on a timeout)", timeout_s, pending);
    else if (peer_closed)
      snprintf(why, cap, "the client closed after %llu bytes of an unfinished request head", pending);
    else
      snprintf(why, cap, "400: a request line libmicrohttpd cannot parse (%llu bytes); closed without a response "
               "(libmicrohttpd 0.9.75 answers none)", pending);
  }
  free(w);
  return report;
}
