/* Shared between server.c (sockets, connections, shutdown) and handlers.c (the endpoints). */
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
#include "server/openai.h"

typedef struct di_conn {
  int fd;
  char peer[80];
  struct di_server *srv;
  struct di_conn *prev, *next;
  int status;                    /* status of the last response sent (access log) */
  char extra[768];               /* headers every response to the current request carries (CORS, X-Request-Id) */
} di_conn;

/* A Prometheus histogram with fixed bucket bounds. */
#define DI_HIST_MAX 20
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
  di_srv_engine *loop;
  di_oai_ctx oai;
  const di_tokenizer *tok;       /* NULL when the model folder has no tokenizer.json */
  di_tokenizer *own_tok;
  time_t started;
  uint64_t id_seed;
  pthread_mutex_t mu;            /* guards everything below */
  pthread_cond_t conns_cond;
  di_conn *conns;
  int n_conns, n_busy;           /* open connections; of them, inside a request */
  int n_rejecting;               /* threads answering connections over the limit with 503 */
  int stopping;                  /* no new requests are read */
  uint64_t next_id;
  long long n_requests, n_generate_requests, n_errors, n_disconnects;
  long long n_prompt_tokens, n_generation_tokens;
  di_histogram ttft, e2e, tpot;  /* seconds: to the first token, whole request, per output token */
  long long finished[5];         /* samples by di_finish_reason */
};

/* Answers one request (handlers.c). Returns 1 to keep the connection open, 0 to close it. */
int di_srv_dispatch(struct di_server *s, di_conn *c, const di_http_request *req, const char *body, size_t body_len);
/* Sends an OpenAI error; returns keep_alive, or 0 when the send failed. */
int di_srv_send_error(di_conn *c, const di_oai_error *e, int keep_alive);
/* 1 when the client closed its side (checked without blocking; pipelined bytes are left alone). */
int di_srv_peer_gone(int fd);
#endif
