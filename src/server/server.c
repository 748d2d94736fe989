/* The transport of `deepinfer serve` (server.h) on libmicrohttpd: binding, the daemon (an epoll
 * thread pool: idle connections cost a socket and a little memory, no thread), request bodies
 * taken incrementally with the limits checked as bytes arrive (size, JSON depth, UTF-8, values:
 * json_scan.h), one thread per request being answered, and the graceful shutdown. Endpoints live
 * in handlers.c.
 *
 * The hand-off between libmicrohttpd and a request thread (the tricky part): once the body is in,
 * the access handler suspends the connection and starts the thread. The thread fills c->resp and
 * resumes the connection; libmicrohttpd calls the access handler again, which queues c->resp. A
 * stream's response reads c->sb through a callback: when it is empty the callback suspends the
 * connection (c->suspended) and the next di_conn_write resumes it. Every suspend is matched by
 * exactly one resume, by whoever clears c->suspended under c->mu, called after c->mu is released.
 * While suspended, libmicrohttpd does not watch the socket: the request thread polls it
 * (di_conn_peer_gone) to abort the work of a client that went away. */
#include "server/server_internal.h"
#include "api/model_internal.h"
#include "server/conn_watch.h"
#include "util/json.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define TICK_MS 200
#define MAX_JSON_DEPTH 64
/* the parsed tree of a body costs ~64 bytes a value (cJSON): bounded, whatever the body's size */
#define MAX_JSON_VALUES (1 << 20)
#define STREAM_BUFFER_MAX (8u << 20) /* a stream's unsent bytes; beyond, its thread waits for the client */
#define MHD_THREADS 2
#define MAX_REQUEST_THREADS 2048 /* requests being answered at once; more get 503 */

void di_server_config_default(di_server_config *c) {
  memset(c, 0, sizeof *c);
  c->host = "127.0.0.1";
  c->port = 8000;
  c->max_head_bytes = 64 << 10;
  c->max_body_bytes = 32u << 20;
  c->max_connections = 16384;
  c->max_n = 1024;
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
  di_json_track_alloc_failures(); /* replies are sent whole or not at all (util/json.h); `serve` did it first */
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
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 4096) == 0) break;
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
  if (s->cfg.max_connections <= 0) s->cfg.max_connections = 16384;
  if (s->cfg.max_n <= 0) s->cfg.max_n = 1024;
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
  static const double itl_le[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  s->itl = (di_histogram){.n = 19, .le = itl_le};
  /* idle connections are cheap now, but each holds a descriptor: take what the hard limit allows */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  di_model *m = cfg->model;
  /* the server's own tokenizer (prompts are encoded on the handler threads; it is thread-safe) */
  char tpath[4200];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", di_model_dir(m));
  if (access(tpath, R_OK) == 0) {
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
  for (int32_t id = 0; s->tok && id < di_tokenizer_vocab_size(s->tok); id++) {
    size_t n = 0;
    if (di_tokenizer_token_bytes(s->tok, id, &n) && n > s->oai.max_token_bytes) s->oai.max_token_bytes = n;
  }
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

/* ---- one request --------------------------------------------------------------------------------- */
static void conn_unref(di_conn *c) {
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last) return;
  if (c->resp) MHD_destroy_response(c->resp);
  free(c->body);
  free(c->sb);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cond);
  free(c);
}

/* c->mu held: takes the suspension if there is one; the caller resumes after unlocking */
static int take_suspension(di_conn *c) {
  int s = c->suspended;
  c->suspended = 0;
  return s;
}

static void resume_if(di_conn *c, int taken) {
  if (taken) MHD_resume_connection(c->mc);
}

int di_conn_peer_gone(di_conn *c) {
  pthread_mutex_lock(&c->mu);
  int gone = c->gone;
  /* only while suspended: otherwise libmicrohttpd reads the socket and sees the close itself */
  if (!gone && c->suspended && c->fd >= 0) {
    struct pollfd p = {c->fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) > 0) {
      if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) gone = 1;
      else if (p.revents & POLLIN) {
        char b;
        ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        gone = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      }
    }
  }
  pthread_mutex_unlock(&c->mu);
  return gone;
}

static void add_headers(struct MHD_Response *r, const char *content_type, int keep_alive, const char *extra) {
  MHD_add_response_header(r, "Server", "deepinfer");
  if (content_type) MHD_add_response_header(r, "Content-Type", content_type);
  if (!keep_alive) MHD_add_response_header(r, "Connection", "close");
  const char *p = extra, *name, *value;
  size_t nl, vl;
  while (p && di_http_next_header_line(&p, &name, &nl, &value, &vl)) {
    char n[128], v[1024];
    if (nl >= sizeof n || vl >= sizeof v) continue;
    memcpy(n, name, nl);
    n[nl] = 0;
    memcpy(v, value, vl);
    v[vl] = 0;
    MHD_add_response_header(r, n, v);
  }
}

/* hands a response to the access handler (request thread) */
static int hand_over(di_conn *c, struct MHD_Response *r, int status) {
  pthread_mutex_lock(&c->mu);
  if (c->ready || c->gone) {
    pthread_mutex_unlock(&c->mu);
    if (r) MHD_destroy_response(r);
    return -1;
  }
  c->resp = r;
  c->resp_status = (unsigned)status;
  c->ready = 1;
  int t = take_suspension(c);
  pthread_mutex_unlock(&c->mu);
  resume_if(c, t);
  return r ? 0 : -1;
}

int di_conn_respond(di_conn *c, int status, const char *content_type, const char *body, size_t len, int keep_alive,
                    const char *extra_headers) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
  if (r) add_headers(r, content_type, keep_alive, extra_headers);
  c->status = status;
  return hand_over(c, r, status);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  di_conn *c = cls;
  pthread_mutex_lock(&c->mu);
  size_t avail = c->sb_len - c->sb_off;
  ssize_t rc;
  if (avail) {
    size_t n = avail < max ? avail : max;
    memcpy(buf, c->sb + c->sb_off, n);
    c->sb_off += n;
    if (c->sb_off == c->sb_len) c->sb_off = c->sb_len = 0;
    pthread_cond_broadcast(&c->cond);
    rc = (ssize_t)n;
  } else if (c->stream_end) {
    rc = c->stream_err ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
  } else {
    /* nothing to send yet: sleep until di_conn_write (returning 0 without suspending would spin) */
    MHD_suspend_connection(c->mc);
    c->suspended = 1;
    rc = 0;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static void stream_free(void *cls) { conn_unref(cls); }

int di_conn_begin_stream(di_conn *c, int status, const char *content_type, int keep_alive, const char *extra_headers) {
  pthread_mutex_lock(&c->mu);
  c->refs++; /* the response's */
  c->stream = 1;
  pthread_mutex_unlock(&c->mu);
  struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, c, stream_free);
  if (!r) {
    conn_unref(c);
    return -1;
  }
  add_headers(r, content_type, keep_alive, extra_headers);
  MHD_add_response_header(r, "Cache-Control", "no-cache");
  c->status = status;
  return hand_over(c, r, status);
}

int di_conn_write(di_conn *c, const char *data, size_t len) {
  if (len == 0) return 0;
  pthread_mutex_lock(&c->mu);
  /* a client that reads slower than the stream is produced: wait (bounded), then give up on it */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += c->srv->cfg.keep_alive_timeout_s;
  while (!c->gone && c->sb_len - c->sb_off > STREAM_BUFFER_MAX)
    if (pthread_cond_timedwait(&c->cond, &c->mu, &until) == ETIMEDOUT) break;
  int rc = -1;
  if (!c->gone && c->sb_len - c->sb_off <= STREAM_BUFFER_MAX) {
    if (c->sb_off && c->sb_len + len > c->sb_cap) {
      memmove(c->sb, c->sb + c->sb_off, c->sb_len - c->sb_off);
      c->sb_len -= c->sb_off;
      c->sb_off = 0;
    }
    if (c->sb_len + len > c->sb_cap) {
      size_t cap = c->sb_cap ? c->sb_cap : 4096;
      while (cap < c->sb_len + len) cap *= 2;
      char *b = realloc(c->sb, cap);
      if (b) { c->sb = b; c->sb_cap = cap; }
    }
    if (c->sb_len + len <= c->sb_cap) {
      memcpy(c->sb + c->sb_len, data, len);
      c->sb_len += len;
      rc = 0;
    }
  }
  int t = take_suspension(c);
  pthread_mutex_unlock(&c->mu);
  resume_if(c, t);
  return rc;
}

static void end_stream(di_conn *c, int error) {
  pthread_mutex_lock(&c->mu);
  if (!c->stream_end) {
    c->stream_end = 1;
    c->stream_err = error;
  }
  int t = take_suspension(c);
  pthread_mutex_unlock(&c->mu);
  resume_if(c, t);
}

int di_conn_end_stream(di_conn *c) {
  end_stream(c, 0);
  pthread_mutex_lock(&c->mu);
  int gone = c->gone;
  pthread_mutex_unlock(&c->mu);
  return gone ? -1 : 0;
}

static double mono_now(void) { return now_s(); }

/* client bytes for a log line: non-printable ones escaped as \xNN, at most cap - 1 bytes */
static void printable(const char *in, char *out, size_t cap) {
  size_t k = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p && k + 5 < cap; p++) {
    if (*p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\') out[k++] = (char)*p;
    else k += (size_t)snprintf(out + k, cap - k, "\\x%02x", *p);
  }
  out[k] = 0;
}

void di_srv_log_rejection(di_conn *c, int status, const char *reason) {
  char why[800], path[300], method[70];
  printable(reason, why, sizeof why);
  printable(c->req.target, path, sizeof path);
  printable(c->req.method, method, sizeof method);
  fprintf(stderr, "deepinfer serve: %s \"%s %s\" rejected %d: %s\n", c->peer, method, path, status, why);
}

/* an error answered by the transport itself (before a request thread runs) */
static enum MHD_Result reject(di_conn *c, int status, const char *msg) {
  di_oai_error e;
  di_oai_fail(&e, status, status >= 500 ? "server_error" : "invalid_request_error", "", NULL, "%s", msg);
  char *json = di_oai_error_json(&e);
  di_srv_log_rejection(c, status, e.message);
  pthread_mutex_lock(&c->srv->mu);
  c->srv->n_errors++;
  pthread_mutex_unlock(&c->srv->mu);
  struct MHD_Response *r = MHD_create_response_from_buffer(json ? strlen(json) : 2, json ? json : "{}", MHD_RESPMEM_MUST_COPY);
  free(json);
  if (!r) return MHD_NO;
  add_headers(r, "application/json", 0, NULL);
  c->status = status;
  enum MHD_Result q = MHD_queue_response(c->mc, (unsigned)status, r);
  MHD_destroy_response(r);
  pthread_mutex_lock(&c->mu);
  c->queued = 1;
  pthread_mutex_unlock(&c->mu);
  return q;
}

static void access_log(di_server *s, di_conn *c) {
  if (!s->cfg.log_requests) return;
  char path[300], method[70];
  printable(c->req.target, path, sizeof path);
  printable(c->req.method, method, sizeof method);
  fprintf(stderr, "deepinfer serve: %s \"%s %s HTTP/1.%d\" %d %.3fs\n", c->peer, method, path, c->req.version_minor,
          c->status, mono_now() - c->t0);
}

void di_conn_release_body(di_conn *c) {
  free(c->body);
  c->body = NULL;
  c->body_len = c->body_cap = 0;
}

static void *request_main(void *arg) {
  di_conn *c = arg;
  di_server *s = c->srv;
  c->status = 0;
  int keep = di_srv_dispatch(s, c, &c->req, c->body ? c->body : "", c->body_len);
  (void)keep;
  access_log(s, c);
  /* whatever the handler left undone: a stream not ended (client gone: an error end), or no response */
  pthread_mutex_lock(&c->mu);
  int stream = c->stream, ready = c->ready;
  c->thread_done = 1;
  pthread_mutex_unlock(&c->mu);
  if (stream) end_stream(c, 1);
  else if (!ready) hand_over(c, NULL, 0);
  di_conn_release_body(c);
  conn_unref(c);
  pthread_mutex_lock(&s->mu);
  s->n_busy--;
  pthread_cond_broadcast(&s->conns_cond);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  di_http_request *r = cls;
  if (r->n_headers == DI_HTTP_MAX_HEADERS) return MHD_NO;
  di_http_header *h = &r->headers[r->n_headers++];
  h->name = key;
  h->name_len = strlen(key);
  h->value = value ? value : "";
  h->value_len = strlen(h->value);
  return MHD_YES;
}

/* "host:port" of the client */
static void format_peer(struct MHD_Connection *mc, char *out, size_t cap) {
  const union MHD_ConnectionInfo *ai = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  char host[64] = "?";
  int port = 0;
  if (ai && ai->client_addr) {
    const struct sockaddr *sa = ai->client_addr;
    if (sa->sa_family == AF_INET) {
      inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, host, sizeof host);
      port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
    } else if (sa->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof host);
      port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    }
  }
  snprintf(out, cap, "%s:%d", host, port);
}

static di_conn_watch *socket_watch(struct MHD_Connection *mc) {
  const union MHD_ConnectionInfo *si = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return si ? si->socket_context : NULL;
}

static int socket_fd(struct MHD_Connection *mc) {
  const union MHD_ConnectionInfo *fi = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
  return fi ? fi->connect_fd : -1;
}

static di_conn *conn_new(di_server *s, struct MHD_Connection *mc, const char *url, const char *method,
                         const char *version) {
  di_conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->srv = s;
  c->mc = mc;
  c->refs = 1;
  c->t0 = now_s();
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cond, NULL);
  snprintf(c->req.method, sizeof c->req.method, "%s", method);
  snprintf(c->req.target, sizeof c->req.target, "%s", url);
  c->req.path_len = strlen(c->req.target);
  c->req.version_minor = version && strcmp(version, "HTTP/1.0") == 0 ? 0 : 1;
  MHD_get_connection_values(mc, MHD_HEADER_KIND, collect_header, &c->req);
  c->fd = socket_fd(mc);
  format_peer(mc, c->peer, sizeof c->peer);
  di_conn_watch_request_begin(socket_watch(mc));
  di_json_scan_init(&c->scan, MAX_JSON_DEPTH, MAX_JSON_VALUES);
  c->max_body = di_srv_body_limit(s, &c->req, &c->prompt_bound);
  return c;
}

static void body_limit_message(di_server *s, di_conn *c, unsigned long long announced, char *msg, size_t cap) {
  int k = announced ? snprintf(msg, cap, "the request body (%llu bytes) is larger", announced)
                    : snprintf(msg, cap, "the request body is larger");
  if (k < 0 || (size_t)k >= cap) return;
  if (c->prompt_bound)
    snprintf(msg + k, cap - (size_t)k, " than %zu bytes, more than a prompt of at most %d tokens (max_model_len) of at "
             "most %zu bytes each can need", c->max_body, s->oai.max_model_len, s->oai.max_token_bytes);
  else
    snprintf(msg + k, cap - (size_t)k, " than the limit of %zu bytes (--max-body-bytes)", c->max_body);
}

/* the head arrived: the checks that need no body */
static enum MHD_Result on_head(di_server *s, di_conn *c) {
  size_t n;
  const char *cl = di_http_header_get(&c->req, "content-length", &n);
  const char *te = di_http_header_get(&c->req, "transfer-encoding", &n);
  pthread_mutex_lock(&s->mu);
  int stopping = s->stopping;
  pthread_mutex_unlock(&s->mu);
  if (stopping) return reject(c, 503, "the server is shutting down");
  if (cl) {
    unsigned long long v = strtoull(cl, NULL, 10);
    if (v > c->max_body) {
      char msg[256];
      body_limit_message(s, c, v, msg, sizeof msg);
      return reject(c, 413, msg);
    }
    c->body_cap = (size_t)v + 1; /* the whole body at once: no regrowth, no slack */
    c->body = malloc(c->body_cap);
    if (!c->body) return reject(c, 503, "out of memory for the request body");
    if (te) return reject(c, 400, "both Content-Length and Transfer-Encoding");
  } else if (!te && strcmp(c->req.method, "POST") == 0) {
    return reject(c, 411, "a POST body needs Content-Length (or Transfer-Encoding: chunked)");
  }
  return MHD_YES;
}

/* a limit crossed mid-body: the body read so far is freed, the rest is read and dropped (up to
 * --max-body-bytes more), and the error is answered when the body ends */
static enum MHD_Result refuse_later(di_conn *c, int status, const char *msg) {
  c->refuse_status = status;
  snprintf(c->refuse_msg, sizeof c->refuse_msg, "%s", msg);
  free(c->body);
  c->body = NULL;
  c->body_len = c->body_cap = 0;
  return MHD_YES;
}

/* more of the body: stored and scanned as it arrives */
static enum MHD_Result on_body(di_server *s, di_conn *c, const char *data, size_t len) {
  if (c->refuse_status) {
    c->dropped += len;
    if (c->dropped <= s->cfg.max_body_bytes) return MHD_YES;
    di_srv_log_rejection(c, c->refuse_status, c->refuse_msg);
    return MHD_NO; /* a client that keeps sending after the limit: closed without an answer */
  }
  if (now_s() - c->t0 > s->cfg.request_timeout_s) {
    di_srv_log_rejection(c, 408, "timed out reading the request body");
    return MHD_NO;
  }
  if (len > c->max_body - c->body_len) {
    char msg[256];
    body_limit_message(s, c, 0, msg, sizeof msg);
    return refuse_later(c, 413, msg);
  }
  if (di_json_scan_feed(&c->scan, data, len) != 0) return refuse_later(c, c->scan.error_status, c->scan.error);
  if (c->body_len + len + 1 > c->body_cap) {
    size_t cap = c->body_cap ? c->body_cap : 4096;
    while (cap < c->body_len + len + 1) cap *= 2;
    if (cap > c->max_body + 1) cap = c->max_body + 1;
    char *b = realloc(c->body, cap);
    if (!b) return refuse_later(c, 503, "out of memory for the request body");
    c->body = b;
    c->body_cap = cap;
  }
  memcpy(c->body + c->body_len, data, len);
  c->body_len += len;
  c->body[c->body_len] = 0;
  return MHD_YES;
}

/* the whole request is in: a request thread answers it while the connection is suspended */
static enum MHD_Result on_complete(di_server *s, di_conn *c) {
  if (c->refuse_status) return reject(c, c->refuse_status, c->refuse_msg);
  if (c->body_len && di_json_scan_end(&c->scan) != 0) return reject(c, c->scan.error_status, c->scan.error);
  pthread_mutex_lock(&s->mu);
  int stopping = s->stopping, over = s->n_busy >= MAX_REQUEST_THREADS;
  if (!stopping && !over) {
    s->n_busy++;
    s->n_answering++;
  }
  pthread_mutex_unlock(&s->mu);
  if (stopping) return reject(c, 503, "the server is shutting down");
  if (over) return reject(c, 503, "too many requests in flight");
  pthread_mutex_lock(&c->mu);
  c->refs++; /* the thread's */
  c->dispatched = 1;
  MHD_suspend_connection(c->mc);
  c->suspended = 1;
  pthread_mutex_unlock(&c->mu);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 1 << 20);
  pthread_t th;
  int rc = pthread_create(&th, &attr, request_main, c);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    pthread_mutex_lock(&s->mu);
    s->n_busy--; /* n_answering: the error below is answered and completes as any response */
    pthread_mutex_unlock(&s->mu);
    c->refs--; /* cannot be the last: libmicrohttpd holds one */
    di_oai_error e;
    di_oai_fail(&e, 503, "server_error", "", NULL, "cannot start a request thread");
    di_srv_send_error(c, &e, 0); /* hands the response over and resumes */
  }
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
  di_server *s = cls;
  di_conn *c = *con_cls;
  if (!c) {
    c = conn_new(s, mc, url, method, version);
    if (!c) return MHD_NO;
    *con_cls = c;
    return on_head(s, c);
  }
  pthread_mutex_lock(&c->mu);
  int queued = c->queued, dispatched = c->dispatched, ready = c->ready;
  pthread_mutex_unlock(&c->mu);
  if (queued) {
    *upload_size = 0; /* an early error is on its way: the rest of the body is dropped */
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    return on_body(s, c, upload_data, n);
  }
  if (!dispatched) return on_complete(s, c);
  if (!ready) {
    /* not expected (only a resume calls back here): wait again */
    pthread_mutex_lock(&c->mu);
    if (!c->suspended && !c->ready) {
      MHD_suspend_connection(mc);
      c->suspended = 1;
    }
    pthread_mutex_unlock(&c->mu);
    return MHD_YES;
  }
  pthread_mutex_lock(&c->mu);
  struct MHD_Response *r = c->resp;
  c->resp = NULL;
  c->queued = 1;
  pthread_mutex_unlock(&c->mu);
  if (!r) return MHD_NO; /* the client is gone, or the handler failed to build a response: close */
  enum MHD_Result q = MHD_queue_response(mc, c->resp_status, r);
  MHD_destroy_response(r);
  return q;
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
  di_server *s = cls;
  di_conn *c = *con_cls;
  di_conn_watch_request_end(socket_watch(mc), socket_fd(mc));
  if (!c) return;
  *con_cls = NULL;
  pthread_mutex_lock(&c->mu);
  c->gone = 1;
  c->fd = -1;
  int dispatched = c->dispatched;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->mu);
  if (dispatched) {
    pthread_mutex_lock(&s->mu);
    s->n_answering--;
    pthread_cond_broadcast(&s->conns_cond);
    pthread_mutex_unlock(&s->mu);
  }
  if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && toe != MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN) {
    const char *why = toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? "timed out (no traffic)"
                      : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT ? "client closed the connection"
                      : toe == MHD_REQUEST_TERMINATED_READ_ERROR  ? "read error"
                                                                   : "error";
    pthread_mutex_lock(&s->mu);
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) s->n_timeouts++;
    pthread_mutex_unlock(&s->mu);
    if (s->cfg.log_requests || toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) {
      char path[300], method[70];
      printable(c->req.target, path, sizeof path);
      printable(c->req.method, method, sizeof method);
      fprintf(stderr, "deepinfer serve: %s \"%s %s\" ended: %s\n", c->peer, method, path, why);
    }
  }
  conn_unref(c);
}

/* open / closed connections; a close of bytes nobody answered is a rejection (conn_watch.c) */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_ctx, enum MHD_ConnectionNotificationCode t) {
  di_server *s = cls;
  char why[300];
  int rejected = 0;
  if (t == MHD_CONNECTION_NOTIFY_STARTED) {
    *socket_ctx = di_conn_watch_new();
  } else {
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    rejected = di_conn_watch_closed(*socket_ctx, socket_fd(mc), s->cfg.keep_alive_timeout_s, stopping, why, sizeof why);
    *socket_ctx = NULL;
  }
  pthread_mutex_lock(&s->mu);
  s->n_conns += t == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
  if (rejected) s->n_rejected_protocol++;
  if (rejected && strncmp(why, "408", 3) == 0) s->n_timeouts++;
  pthread_mutex_unlock(&s->mu);
  if (rejected) {
    char peer[80];
    format_peer(mc, peer, sizeof peer);
    fprintf(stderr, "deepinfer serve: %s connection closed unanswered: %s\n", peer, why);
  }
}

/* libmicrohttpd's own messages: the protocol errors it answers itself (malformed request line or
 * headers, a header block over the limit, a bad chunk, HTTP/2 ...) say their status and reason here */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  di_server *s = cls;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
  unsigned status = 0;
  const char *code = strstr(msg, "HTTP response code is ");
  if (code) status = (unsigned)strtoul(code + 22, NULL, 10);
  pthread_mutex_lock(&s->mu);
  s->n_rejected_protocol++;
  pthread_mutex_unlock(&s->mu);
  /* its answers are fixed HTML pages compiled into the library (0.9.75 has no hook to replace
   * them): the log line names the status and the page's title as the reason */
  const char *t0 = strstr(msg, "<title>"), *t1 = t0 ? strstr(t0, "</title>") : NULL;
  const char *b0 = t1 ? strstr(t1, "<body>") : NULL, *b1 = b0 ? strstr(b0, "</body>") : NULL;
  if (status && t0 && t1)
    fprintf(stderr, "deepinfer serve: http: rejected %u by libmicrohttpd (its HTML body, not JSON): %.*s: %.*s\n",
            status, (int)(t1 - t0 - 7), t0 + 7, b1 ? (int)(b1 - b0 - 6) : 0, b1 ? b0 + 6 : "");
  else
    fprintf(stderr, "deepinfer serve: http: %s\n", msg);
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
static int none_answering(di_server *s) { return s->n_answering == 0; }

di_status di_server_run(di_server *s) {
  DI_TRY(di_srv_engine_start(s->cfg.engine, &s->loop));
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                   MHD_USE_TURBO;
  s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                            MHD_OPTION_LISTEN_SOCKET, s->listen_fd,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)MHD_THREADS,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.keep_alive_timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)s->cfg.max_head_bytes, /* beyond: 431 */
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            /* permissive: an HTTP/1.1 request without Host is served (curl -0, tests) */
                            MHD_OPTION_STRICT_FOR_CLIENT, (int)-1, MHD_OPTION_END);
  if (!s->mhd) {
    di_srv_engine_stop(s->loop);
    s->loop = NULL;
    return di_error_set(DI_ERR_INTERNAL, "server: cannot start libmicrohttpd on port %d", s->port);
  }
  while (!stop_requested(s)) {
    struct timespec ts = {0, TICK_MS * 1000000L};
    nanosleep(&ts, NULL);
  }
  /* graceful shutdown: stop accepting; new requests on open connections get 503; in-flight ones get
   * the grace period, then are aborted; then the daemon closes every connection */
  /* the listening socket is closed only after the daemon stopped: its threads drop it from their
   * epoll sets asynchronously (closing it now races with them) */
  MHD_quiesce_daemon(s->mhd);
  if (s->cfg.log_requests) fprintf(stderr, "deepinfer serve: shutting down\n");
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  wait_until(s, none_busy, s->cfg.shutdown_grace_s);
  pthread_mutex_unlock(&s->mu);
  di_srv_abort_all(s->loop);
  pthread_mutex_lock(&s->mu);
  wait_until(s, none_busy, 30);
  int left = s->n_busy;
  /* a finished request thread may have left a stream's last bytes to send: libmicrohttpd gets a few
   * seconds to deliver them before the daemon closes every connection */
  if (!left) wait_until(s, none_answering, 5);
  pthread_mutex_unlock(&s->mu);
  if (left) {
    /* a request thread still runs and would use the engine loop and the daemon: keep them (leak) */
    s->listen_fd = -1; /* the daemon still runs over it */
    fprintf(stderr, "deepinfer serve: %d requests did not finish\n", left);
    return di_error_set(DI_ERR_INTERNAL, "%d requests did not finish at shutdown", left);
  }
  MHD_stop_daemon(s->mhd);
  s->mhd = NULL;
  close(s->listen_fd);
  s->listen_fd = -1;
  di_srv_engine_stop(s->loop);
  s->loop = NULL;
  return DI_OK;
}
