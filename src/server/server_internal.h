/* Shared between server.c (the transport: libmicrohttpd, limits, request threads, shutdown) and
 * handlers.c (the endpoints). */
#ifndef DI_SERVER_INTERNAL_H
#define DI_SERVER_INTERNAL_H
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include "server/server.h"
#include "server/engine_loop.h"
#include "server/http.h"
#include "server/json_scan.h"
#include "server/openai.h"

struct MHD_Connection;
struct MHD_Response;
struct MHD_Daemon;

/* One HTTP request, from its head to the end of its response. libmicrohttpd owns the connection;
 * once the body is in, a request thread runs the endpoint (handlers.c) while the connection is
 * suspended, and hands the response back through this struct (see server.c for the protocol).
 * Reference-counted: libmicrohttpd's (dropped when the request completes), the request thread's,
 * and a streamed response's. */
typedef struct di_conn {
  struct di_server *srv;
  struct MHD_Connection *mc;
  int fd;                        /* the socket, polled (never read) while suspended to notice a client gone */
  char peer[80];
  int status;                    /* status of the response (access and rejection log) */
  unsigned long json_mark;       /* di_json_alloc_failures() when the request was dispatched: a JSON
                                  * reply built after a failed cJSON allocation is not sent (util/json.h) */
  char extra[768];               /* headers every response to this request carries (CORS, X-Request-Id) */
  di_http_request req;
  char *body;
  size_t body_len, body_cap;
  di_json_scan scan;
  int refuse_status;             /* a limit crossed mid-body: answered once the body is in (libmicrohttpd */
  char refuse_msg[256];          /* queues responses only before or after the body), the rest is dropped */
  size_t dropped;
  size_t max_body;               /* di_srv_body_limit */
  int prompt_bound;
  double t0;                     /* monotonic seconds: the head arrived */
  pthread_mutex_t mu;            /* guards what follows */
  pthread_cond_t cond;           /* the stream buffer drained; the request completed */
  int refs;
  int gone;                      /* libmicrohttpd finished the request (the socket may be closed) */
  int suspended;                 /* suspended, waiting for the request thread to resume it */
  int dispatched;                /* the request thread was started */
  int ready;                     /* `resp` (NULL: close the connection) is set for the access handler */
  int queued;                    /* a response was queued */
  int thread_done;
  struct MHD_Response *resp;
  unsigned resp_status;
  int stream, stream_end, stream_err;
  char *sb;                      /* streamed bytes not yet taken by libmicrohttpd */
  size_t sb_len, sb_off, sb_cap;
} di_conn;

/* A Prometheus histogram with fixed bucket bounds. */
#define DI_HIST_MAX 24
typedef struct di_histogram {
  int n;                         /* bounds */
  const double *le;
  long long counts[DI_HIST_MAX]; /* per bucket (not cumulative) */
  double sum;
  long long count;
} di_histogram;

struct di_server {
  di_server_config cfg;
  int listen_fd, port;
  atomic_int stop_requested;     /* set from a signal handler: lock-free atomic */
  struct MHD_Daemon *mhd;
  di_srv_engine *loop;
  di_oai_ctx oai;
  const di_tokenizer *tok;       /* NULL when the model folder has no tokenizer.json */
  di_tokenizer *own_tok;
  time_t started;
  uint64_t id_seed;
  pthread_mutex_t mu;            /* guards everything below */
  pthread_cond_t conns_cond;
  int n_conns, n_busy;           /* open connections; request threads running */
  int n_answering;               /* requests dispatched whose response libmicrohttpd has not finished */
  int stopping;                  /* no new requests are served */
  uint64_t next_id;
  long long n_requests, n_generate_requests, n_errors, n_disconnects, n_rejected_protocol, n_timeouts;
  long long n_prompt_tokens, n_generation_tokens;
  di_histogram ttft, e2e, tpot, itl; /* seconds: to the first token, whole request, per output token, between tokens */
  long long finished[5];         /* samples by di_finish_reason */
};

/* Answers one request (handlers.c). Returns 1 to keep the connection open, 0 to close it. */
int di_srv_dispatch(struct di_server *s, di_conn *c, const di_http_request *req, const char *body, size_t body_len);
/* The largest body the request's route takes (--max-body-bytes, or less for a prompt route of a model
 * whose longest prompt is smaller: *prompt_bound = 1 then). */
size_t di_srv_body_limit(const struct di_server *s, const di_http_request *req, int *prompt_bound);
/* Sends an OpenAI error (logged, with the reason); returns keep_alive, or 0 when the send failed. */
int di_srv_send_error(di_conn *c, const di_oai_error *e, int keep_alive);
/* One line on stderr for a refused request: peer, method, path, status and reason. */
void di_srv_log_rejection(di_conn *c, int status, const char *reason);

/* The response side of a request (server.c). A whole response: di_conn_respond (once). A stream:
 * di_conn_begin_stream, di_conn_write (any number), di_conn_end_stream. `extra_headers` are
 * "Name: value\r\n" lines (may be NULL). They return 0, or -1 when the client is gone. */
int di_conn_respond(di_conn *c, int status, const char *content_type, const char *body, size_t len, int keep_alive,
                    const char *extra_headers);
int di_conn_begin_stream(di_conn *c, int status, const char *content_type, int keep_alive, const char *extra_headers);
int di_conn_write(di_conn *c, const char *data, size_t len);
int di_conn_end_stream(di_conn *c);
/* Frees the request body (the request thread's, once it is parsed: a long stream does not keep it). */
void di_conn_release_body(di_conn *c);
/* 1 when the client closed its side (checked without blocking). */
int di_conn_peer_gone(di_conn *c);
#endif
