/* libFuzzer target: a whole request as the server's endpoints see it once libmicrohttpd has parsed
 * it: the method and path, the headers the handlers read (Authorization against an API key, Origin
 * against a CORS list, X-Request-Id echoed, Access-Control-Request-Headers of a preflight) and the
 * body, through di_srv_dispatch (handlers.c) on a server with no socket and no engine thread. The
 * input is "METHOD PATH\n", then "Name: value\r\n" header lines (di_http_next_header_line, as the
 * response side splits them), an empty line, then the body. Routes that start an engine job
 * (/v1/completions, /v1/chat/completions, /v1/responses: fuzz_openai and fuzz_responses read their
 * bodies), /health, /ping and /metrics (which ask the engine thread) and /tokenizer_info (files of the model
 * folder, no client input) are skipped here, so every other route, /tokenize and /detokenize
 * above all, runs with the engine-dummy tokenizer and chat template (oai_fuzz_ctx.h). Checked: one
 * response exactly (not a stream), a status in 200..599, no header of it with CR or LF (the echoed
 * ones come from the client), and a body limit for every route.
 * di_conn_respond with no libmicrohttpd connection keeps the response in the conn (nothing was
 * suspended, so nothing is resumed): that is what lets the handlers run here unchanged. */
#include <microhttpd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "oai_fuzz_ctx.h"
#include "server/server_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_server_dispatch_cleanup(void);

static di_server srv;
static di_tokenizer *tok;
static di_chat_template *tmpl;
static int ready;
unsigned fuzz_server_dispatch_last_status; /* the last response's status (read by the replay test) */

static void setup(void) {
  di_server_config_default(&srv.cfg);
  srv.cfg.served_name = "m";
  srv.cfg.api_key = "sk-fuzz";
  srv.cfg.allowed_origins = "https://a.example, http://b.example";
  srv.cfg.max_model_len = 256;
  oai_fuzz_ctx_init(&srv.oai, &tok, &tmpl);
  srv.tok = tok;
  srv.oai.max_token_bytes = 16;
  pthread_mutex_init(&srv.mu, NULL);
  ready = 1;
}

/* Frees what setup loaded (the corpus replay test calls it, so leak checks stay clean). */
void fuzz_server_dispatch_cleanup(void) {
  di_tokenizer_free(tok);
  di_chat_template_free(tmpl);
  tok = NULL;
  tmpl = NULL;
  if (ready) pthread_mutex_destroy(&srv.mu);
  ready = 0;
}

static int skipped(const di_http_request *req) {
  static const char *const routes[] = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/health", "/ping",
                                       "/metrics", "/tokenizer_info"}; /* (/ping, like /health, asks the engine thread) */
  if (strcmp(req->method, "OPTIONS") == 0) return 0; /* a preflight is answered before any route */
  for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
    if (req->path_len == strlen(routes[i]) && memcmp(req->target, routes[i], req->path_len) == 0) return 1;
  return 0;
}

static enum MHD_Result header_ok(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  if (strpbrk(key, "\r\n") || (value && strpbrk(value, "\r\n"))) *(int *)cls = 1;
  return MHD_YES;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) setup();
  fuzz_server_dispatch_last_status = 0;
  char *text = malloc(size + 1); /* NUL-terminated: the header splitter reads up to a NUL */
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  di_http_request req;
  memset(&req, 0, sizeof req);
  const char *eol = memchr(text, '\n', size), *sp = memchr(text, ' ', eol ? (size_t)(eol - text) : size);
  const char *line_end = eol ? eol : text + size;
  if (!sp) sp = line_end;
  size_t ml = (size_t)(sp - text) < sizeof req.method - 1 ? (size_t)(sp - text) : sizeof req.method - 1;
  memcpy(req.method, text, ml);
  const char *path = sp < line_end ? sp + 1 : line_end;
  size_t pl = (size_t)(line_end - path) < sizeof req.target - 1 ? (size_t)(line_end - path) : sizeof req.target - 1;
  memcpy(req.target, path, pl);
  req.path_len = strnlen(req.target, pl);
  req.version_minor = 1;
  /* the head: header lines up to an empty line; the body is what follows */
  const char *head = eol ? eol + 1 : text + size, *body_at = strstr(head, "\r\n\r\n");
  size_t head_len = body_at ? (size_t)(body_at - head) + 2 : strlen(head);
  char *head_copy = strndup(head, head_len);
  const char *body = body_at ? body_at + 4 : text + size;
  size_t body_len = size - (size_t)(body - text);
  const char *p = head_copy, *name, *value;
  size_t nl, vl;
  while (head_copy && req.n_headers < DI_HTTP_MAX_HEADERS && di_http_next_header_line(&p, &name, &nl, &value, &vl))
    req.headers[req.n_headers++] = (di_http_header){name, value, nl, vl};
  if (!head_copy || skipped(&req)) {
    free(head_copy);
    free(text);
    return 0;
  }
  int prompt_bound;
  if (di_srv_body_limit(&srv, &req, &prompt_bound) == 0) __builtin_trap();
  di_conn c;
  memset(&c, 0, sizeof c);
  c.srv = &srv;
  c.fd = -1;
  snprintf(c.peer, sizeof c.peer, "fuzz");
  c.req = req;
  pthread_mutex_init(&c.mu, NULL);
  pthread_cond_init(&c.cond, NULL);
  di_srv_dispatch(&srv, &c, &req, body, body_len);
  if (!c.ready || !c.resp || c.resp_status < 200 || c.resp_status > 599 || c.stream) __builtin_trap();
  int bad_header = 0;
  MHD_get_response_headers(c.resp, header_ok, &bad_header);
  if (bad_header) __builtin_trap();
  fuzz_server_dispatch_last_status = c.resp_status;
  MHD_destroy_response(c.resp);
  pthread_cond_destroy(&c.cond);
  pthread_mutex_destroy(&c.mu);
  free(head_copy);
  free(text);
  return 0;
}
