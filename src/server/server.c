/* The socket side of `deepinfer serve` (server.h): binding, the accept loop, one thread per
 * connection reading HTTP/1.1 requests (keep-alive, pipelining, Expect: 100-continue, chunked
 * bodies, timeouts and size limits), and the graceful shutdown. Endpoints live in handlers.c. */
#include "server/server_internal.h"
#include "api/model_internal.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_CHUNK 65536
#define TICK_MS 200

void di_server_config_default(di_server_config *c) {
  memset(c, 0, sizeof *c);
  c->host = "127.0.0.1";
  c->port = 8000;
  c->max_head_bytes = 64 << 10;
  c->max_body_bytes = 32u << 20;
  c->max_connections = 512;
  c->keep_alive_timeout_s = 60;
  c->request_timeout_s = 60;
  c->shutdown_grace_s = 10;
  c->log_requests = 1;
  c->allowed_origins = "*";
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

di_status di_server_create(const di_server_config *cfg, di_server **out) {
  if (!cfg || !cfg->model || !cfg->engine || !cfg->served_name)
    return di_error_set(DI_ERR_INVALID_ARG, "server: model, engine and served_name are required");
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->port);
  const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
  int gai = getaddrinfo(host, port, &hints, &ai);
  if (gai != 0) return di_error_set(DI_ERR_INVALID_ARG, "server: cannot resolve %s: %s", host, gai_strerror(gai));
  int fd = -1, last_errno = 0;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) { last_errno = errno; continue; }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
    last_errno = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  if (fd < 0) return di_error_set(DI_ERR_IO, "server: cannot listen on %s:%d: %s", host, cfg->port, strerror(last_errno));
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int bound_port = cfg->port;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  di_server *s = calloc(1, sizeof *s);
  if (!s) { close(fd); return di_error_set(DI_ERR_OOM, "out of memory"); }
  s->cfg = *cfg;
  if (!s->cfg.max_head_bytes) s->cfg.max_head_bytes = 64 << 10;
  if (!s->cfg.allowed_origins) s->cfg.allowed_origins = "";
  if (!s->cfg.max_body_bytes) s->cfg.max_body_bytes = 32u << 20;
  if (s->cfg.max_connections <= 0) s->cfg.max_connections = 512;
  if (s->cfg.keep_alive_timeout_s <= 0) s->cfg.keep_alive_timeout_s = 60;
  if (s->cfg.request_timeout_s <= 0) s->cfg.request_timeout_s = 60;
  if (s->cfg.shutdown_grace_s < 0) s->cfg.shutdown_grace_s = 0;
  s->listen_fd = fd;
  s->port = bound_port;
  s->started = time(NULL);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  s->id_seed = (uint64_t)t.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)t.tv_sec ^ ((uint64_t)getpid() << 32);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->conns_cond, NULL);
  /* vLLM's bucket bounds, so dashboards made for it read these the same way */
  static const double ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0};
  static const double e2e_le[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0};
  static const double tpot_le[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
  s->ttft = (di_histogram){.n = 16, .le = ttft_le};
  s->e2e = (di_histogram){.n = 15, .le = e2e_le};
  s->tpot = (di_histogram){.n = 13, .le = tpot_le};
  di_model *m = cfg->model;
  /* the server's own tokenizer (prompts are encoded on the handler threads; it is thread-safe) */
  s->tok = m->tokenizer;
  char tpath[4200];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", di_model_dir(m));
  if (!s->tok && access(tpath, R_OK) == 0) {
    if (di_tokenizer_load(di_model_dir(m), &s->own_tok) != DI_OK) {
      di_status st = di_error_wrap(DI_ERR_FORMAT, "server");
      di_server_free(s);
      return st;
    }
    s->tok = s->own_tok;
  }
  s->oai.tok = s->tok;
  s->oai.tmpl = cfg->tmpl;
  s->oai.served_name = cfg->served_name;
  s->oai.model_dir = di_model_dir(m);
  s->oai.max_model_len = cfg->max_model_len > 0 ? cfg->max_model_len : di_model_max_context(m);
  s->cfg.max_model_len = s->oai.max_model_len;
  s->oai.vocab_size = di_model_vocab_size(m);
  s->oai.default_temperature = m->cfg.gen_temperature;
  s->oai.default_top_p = m->cfg.gen_top_p;
  s->oai.default_top_k = m->cfg.gen_top_k;
  s->oai.tool_parser = cfg->tool_call_parser;
  s->oai.reasoning_parser = cfg->reasoning_parser;
  *out = s;
  return DI_OK;
}

int di_server_port(const di_server *s) { return s->port; }

void di_server_request_stop(di_server *s) { atomic_store_explicit(&s->stop_requested, 1, memory_order_relaxed); }

static int stop_requested(di_server *s) { return atomic_load_explicit(&s->stop_requested, memory_order_relaxed); }

void di_server_free(di_server *s) {
  if (!s) return;
  if (s->listen_fd >= 0) close(s->listen_fd);
  di_tokenizer_free(s->own_tok);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->conns_cond);
  free(s);
}

int di_srv_peer_gone(int fd) {
  struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return 0;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return 1;
  if (p.revents & POLLIN) {
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return 0;
}

/* ---- one connection ---------------------------------------------------------------------------- */
typedef struct rbuf {
  char *data;
  size_t len, cap;
} rbuf;

/* Reads more bytes (waiting up to the deadline, waking every tick to notice a shutdown).
 * Returns bytes read, 0 on EOF, -1 on error, -2 on timeout, -3 when the server stops and
 * `idle` (nothing of a request read yet). */
static ssize_t read_more(di_server *s, int fd, rbuf *b, double deadline, int idle) {
  if (b->cap - b->len < READ_CHUNK) {
    size_t cap = b->cap ? b->cap : READ_CHUNK * 2;
    while (cap - b->len < READ_CHUNK) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
  }
  for (;;) {
    if (idle && stop_requested(s)) return -3;
    double left = deadline - now_s();
    if (left <= 0) return -2;
    int ms = left * 1000 < TICK_MS ? (int)(left * 1000) + 1 : TICK_MS; /* int-cast: checked: below TICK_MS */
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, ms);
    if (r < 0 && errno != EINTR) return -1;
    if (r <= 0) continue;
    ssize_t k = recv(fd, b->data + b->len, b->cap - b->len - 1, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return -1;
    b->len += (size_t)k;
    return k;
  }
}

static void send_simple_error(di_conn *c, int status, const char *msg) {
  di_oai_error e;
  di_oai_fail(&e, status, status >= 500 ? "server_error" : "invalid_request_error", "", NULL, "%s", msg);
  di_srv_send_error(c, &e, 0);
}

static void access_log(di_server *s, di_conn *c, const di_http_request *req, double t0) {
  if (!s->cfg.log_requests) return;
  fprintf(stderr, "deepinfer serve: %s \"%s %.200s HTTP/1.%d\" %d %.3fs\n", c->peer, req->method, req->target,
          req->version_minor, c->status, now_s() - t0);
}

static void serve_connection(di_server *s, di_conn *c) {
  rbuf b = {0};
  di_http_limits lim = {s->cfg.max_head_bytes, s->cfg.max_body_bytes};
  for (;;) {
    /* the request head: an idle connection waits keep_alive_timeout_s, a started one request_timeout_s */
    di_http_request req;
    int complete = 0;
    c->extra[0] = 0;
    double idle_deadline = now_s() + s->cfg.keep_alive_timeout_s, deadline = 0;
    for (;;) {
      if (b.len) {
        di_status st = di_http_parse_head(b.data, b.len, &lim, &req, &complete);
        if (st != DI_OK) {
          c->status = req.error_status;
          send_simple_error(c, req.error_status ? req.error_status : 400, di_last_error());
          goto close;
        }
        if (complete) break;
        if (deadline == 0) deadline = now_s() + s->cfg.request_timeout_s;
      }
      ssize_t k = read_more(s, c->fd, &b, b.len ? deadline : idle_deadline, b.len == 0);
      if (k == -2 && b.len) { send_simple_error(c, 408, "timed out reading the request"); goto close; }
      if (k <= 0) goto close;
    }
    double t0 = now_s();
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    if (!stopping) s->n_busy++;
    pthread_mutex_unlock(&s->mu);
    if (stopping) {
      send_simple_error(c, 503, "the server is shutting down");
      goto close;
    }
    /* the body */
    const char *body = NULL;
    size_t body_len = 0, consumed = req.head_len;
    char *owned = NULL;
    int ok = 1;
    if (req.expect_continue && (req.chunked || (req.content_length > 0 && b.len < req.head_len + (size_t)req.content_length))) {
      if (di_http_write_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25) != 0) ok = 0;
    }
    if (ok && req.chunked) {
      di_http_chunked d;
      di_http_chunked_init(&d, s->cfg.max_body_bytes);
      size_t pos = req.head_len;
      double dl = now_s() + s->cfg.request_timeout_s;
      while (ok) {
        size_t used;
        if (di_http_chunked_feed(&d, b.data + pos, b.len - pos, &used) != DI_OK) {
          send_simple_error(c, d.error_status ? d.error_status : 400, di_last_error());
          ok = 0;
          break;
        }
        pos += used;
        if (d.done) break;
        /* the raw chunks already decoded are dropped so the buffer stays small */
        memmove(b.data + req.head_len, b.data + pos, b.len - pos);
        b.len -= pos - req.head_len;
        pos = req.head_len;
        ssize_t k = read_more(s, c->fd, &b, dl, 0);
        if (k == -2) send_simple_error(c, 408, "timed out reading the request body");
        if (k <= 0) ok = 0;
      }
      if (ok) {
        owned = d.body;
        d.body = NULL;
        body = owned;
        body_len = d.body_len;
        consumed = pos;
      }
      di_http_chunked_free(&d);
    } else if (ok && req.content_length > 0) {
      size_t need = req.head_len + (size_t)req.content_length;
      double dl = now_s() + s->cfg.request_timeout_s;
      while (ok && b.len < need) {
        ssize_t k = read_more(s, c->fd, &b, dl, 0);
        if (k == -2) send_simple_error(c, 408, "timed out reading the request body");
        if (k <= 0) ok = 0;
      }
      body = b.data + req.head_len;
      body_len = (size_t)req.content_length;
      consumed = need;
    } else if (ok && req.content_length < 0 && strcmp(req.method, "POST") == 0) {
      c->status = 411;
      send_simple_error(c, 411, "a POST body needs Content-Length (or Transfer-Encoding: chunked)");
      ok = 0;
    }
    int keep = 0;
    if (ok) {
      c->status = 0;
      keep = di_srv_dispatch(s, c, &req, body ? body : "", body_len);
      access_log(s, c, &req, t0);
    }
    free(owned);
    pthread_mutex_lock(&s->mu);
    s->n_busy--;
    if (s->stopping) keep = 0;
    pthread_cond_broadcast(&s->conns_cond);
    pthread_mutex_unlock(&s->mu);
    if (!ok || !keep) goto close;
    /* pipelined bytes of the next request stay in the buffer */
    memmove(b.data, b.data + consumed, b.len - consumed);
    b.len -= consumed;
  }
close:
  free(b.data);
}

/* Closes the way RFC 9112 9.6 asks: our side first, then whatever the client still sends is read
 * and dropped (up to 1 s / 1 MiB), so an error answered before the request was fully read (413,
 * 503, ...) is not lost to a reset caused by unread bytes. */
static void linger_drain(int fd) {
  shutdown(fd, SHUT_WR);
  char scratch[4096];
  size_t total = 0;
  double end = now_s() + 1.0;
  while (total < (1u << 20)) {
    double left = end - now_s();
    if (left <= 0) break;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) break; /* int-cast: checked: left <= 1 s */
    ssize_t k = recv(fd, scratch, sizeof scratch, 0);
    if (k <= 0) break;
    total += (size_t)k;
  }
}

static void *conn_main(void *arg) {
  di_conn *c = arg;
  di_server *s = c->srv;
  serve_connection(s, c);
  linger_drain(c->fd);
  pthread_mutex_lock(&s->mu);
  if (c->prev) c->prev->next = c->next; else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  pthread_cond_broadcast(&s->conns_cond);
  /* closed under the lock so the shutdown path never calls shutdown() on a reused descriptor */
  close(c->fd);
  pthread_mutex_unlock(&s->mu);
  free(c);
  return NULL;
}

static void *reject_main(void *arg) {
  di_conn *c = arg;
  di_server *s = c->srv;
  send_simple_error(c, 503, "too many open connections");
  linger_drain(c->fd);
  close(c->fd);
  pthread_mutex_lock(&s->mu);
  s->n_rejecting--;
  pthread_cond_broadcast(&s->conns_cond);
  pthread_mutex_unlock(&s->mu);
  free(c);
  return NULL;
}

static void accept_one(di_server *s) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
  if (fd < 0) {
    /* out of descriptors: the listener stays readable, so back off instead of spinning */
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) usleep(100000);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* SSE chunks go out at once */
  struct timeval tv = {60, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);    /* a client that stops reading is dropped */
  di_conn *c = calloc(1, sizeof *c);
  if (!c) { close(fd); return; }
  c->fd = fd;
  c->srv = s;
  char host[64] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
    port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
    port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  }
  snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
  pthread_mutex_lock(&s->mu);
  if (s->n_conns >= s->cfg.max_connections) {
    /* answered on a short-lived thread (at most 16 at once) so the lingering close does not stall
     * the accept loop; beyond that the connection is just closed */
    int take = s->n_rejecting < 16;
    if (take) s->n_rejecting++;
    pthread_mutex_unlock(&s->mu);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    int started = take && pthread_create(&th, &attr, reject_main, c) == 0;
    pthread_attr_destroy(&attr);
    if (!started) {
      if (take) {
        pthread_mutex_lock(&s->mu);
        s->n_rejecting--;
        pthread_mutex_unlock(&s->mu);
      }
      close(fd);
      free(c);
    }
    return;
  }
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 1 << 20);
  pthread_t th;
  int rc = pthread_create(&th, &attr, conn_main, c);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    s->conns = c->next;
    if (c->next) c->next->prev = NULL;
    s->n_conns--;
    pthread_mutex_unlock(&s->mu);
    send_simple_error(c, 503, "cannot start a connection thread");
    close(fd);
    free(c);
    return;
  }
  pthread_mutex_unlock(&s->mu);
}

/* waits until `cond_fn` holds or `seconds` pass; mutex held */
static int wait_until(di_server *s, int (*done)(di_server *), double seconds) {
  double end = now_s() + seconds;
  while (!done(s)) {
    double left = end - now_s();
    if (left <= 0) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double ms = left * 1000 < TICK_MS ? left * 1000 : TICK_MS;
    ts.tv_nsec += (long)(ms * 1e6); /* int-cast: checked: ms <= TICK_MS */
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&s->conns_cond, &s->mu, &ts);
  }
  return 1;
}
static int none_busy(di_server *s) { return s->n_busy == 0; }
static int none_open(di_server *s) { return s->n_conns == 0 && s->n_rejecting == 0; }

di_status di_server_run(di_server *s) {
  DI_TRY(di_srv_engine_start(s->cfg.engine, &s->loop));
  while (!stop_requested(s)) {
    struct pollfd p = {s->listen_fd, POLLIN, 0};
    int r = poll(&p, 1, TICK_MS);
    if (r > 0 && (p.revents & POLLIN)) accept_one(s);
  }
  /* graceful shutdown: stop accepting; idle keep-alive connections close at their next tick;
   * in-flight requests get the grace period, then are aborted; stragglers are shut down */
  close(s->listen_fd);
  s->listen_fd = -1;
  if (s->cfg.log_requests) fprintf(stderr, "deepinfer serve: shutting down\n");
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  wait_until(s, none_busy, s->cfg.shutdown_grace_s);
  pthread_mutex_unlock(&s->mu);
  di_srv_abort_all(s->loop);
  pthread_mutex_lock(&s->mu);
  wait_until(s, none_open, 5);
  for (di_conn *c = s->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
  wait_until(s, none_open, 30);
  int left = s->n_conns;
  pthread_mutex_unlock(&s->mu);
  if (left) {
    /* a connection thread still runs and would use the engine loop: keep it alive (leak) */
    fprintf(stderr, "deepinfer serve: %d connections did not close\n", left);
    return di_error_set(DI_ERR_INTERNAL, "%d connections did not close at shutdown", left);
  }
  di_srv_engine_stop(s->loop);
  s->loop = NULL;
  return DI_OK;
}
