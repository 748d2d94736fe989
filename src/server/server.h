/* `deepinfer serve`: an OpenAI-compatible HTTP/1.1 server over one engine. libmicrohttpd's epoll
 * threads hold the connections and read requests, one thread per request being answered runs its
 * endpoint, and one engine thread owns the engine (engine_loop.h). Endpoints: see docs/server.md. */
#ifndef DI_SERVER_SERVER_H
#define DI_SERVER_SERVER_H
#include <stddef.h>
#include "deepinfer.h"

typedef struct di_server_config {
  const char *host;              /* address to bind (default 127.0.0.1) */
  int port;                      /* 0: any free port (di_server_port tells which) */
  const char *served_name;       /* the model name clients use */
  const char *api_key;           /* NULL: no authentication; else every route but /health, /ping and /metrics
                                    needs "Authorization: Bearer KEY" */
  size_t max_head_bytes;         /* request line + headers (default 64 KiB) */
  size_t max_body_bytes;         /* default 32 MiB */
  int max_connections;           /* open connections at once (default 16384); more are closed at accept */
  int max_n;                     /* samples per request (n x prompts; default 1024) */
  int keep_alive_timeout_s;      /* a connection with no traffic for this long is closed (default 60) */
  int request_timeout_s;         /* a request's body must arrive within this of its head (default 60; 408) */
  int shutdown_grace_s;          /* on stop, in-flight requests get this long before being aborted (default 10) */
  int log_requests;              /* one access-log line per request on stderr */
  di_model *model;               /* borrowed; outlives the server */
  di_engine *engine;             /* borrowed; the server's engine thread is its only user while it runs */
  di_chat_template *tmpl;        /* borrowed; NULL: no chat endpoint */
  int max_model_len;             /* the engine's (prompt + output) limit */
  int tool_call_parser;          /* nonzero: parse DeepSeek tool-call markup out of chat replies (tool_calls) */
  int reasoning_parser;          /* nonzero: <think>...</think> of chat replies goes to reasoning_content */
  const char *allowed_origins;   /* CORS: "*" (default), a comma-separated list of origins, or "" (no CORS headers) */
} di_server_config;

void di_server_config_default(di_server_config *c);

typedef struct di_server di_server;
/* Binds and listens (errors name the address). Nothing is served until di_server_run. */
di_status di_server_create(const di_server_config *cfg, di_server **out);
int di_server_port(const di_server *s);
/* Serves until di_server_request_stop, then shuts down gracefully: stops accepting, lets in-flight
 * requests finish within shutdown_grace_s, aborts the rest, closes every connection, stops the
 * engine thread. */
di_status di_server_run(di_server *s);
/* Async-signal-safe: may be called from a SIGINT/SIGTERM handler. */
void di_server_request_stop(di_server *s);
void di_server_free(di_server *s);
#endif
