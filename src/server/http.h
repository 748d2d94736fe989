/* HTTP/1.1 for `deepinfer serve`: a request-head parser over a byte buffer (request line and
 * headers, with limits), an incremental decoder of chunked request bodies, and response writers
 * (whole responses, and chunked transfer for server-sent events). The parsers see untrusted bytes:
 * they never read past `len`, never allocate more than the limits allow, and report every malformed
 * input as an error with the HTTP status to answer it with. */
#ifndef DI_SERVER_HTTP_H
#define DI_SERVER_HTTP_H
#include <stddef.h>
#include <stdint.h>
#include "util/status.h"

#define DI_HTTP_MAX_HEADERS 64

typedef struct di_http_header {
  const char *name, *value;  /* point into the parsed buffer (not NUL-terminated) */
  size_t name_len, value_len;
} di_http_header;

typedef struct di_http_request {
  char method[16];
  char target[4096];         /* the request target as sent (path and query), NUL-terminated */
  size_t path_len;           /* length of the path part of target (before '?') */
  int version_minor;         /* HTTP/1.x */
  int n_headers;
  di_http_header headers[DI_HTTP_MAX_HEADERS];
  int64_t content_length;    /* -1: none */
  int chunked;               /* Transfer-Encoding: chunked */
  int keep_alive;            /* the connection stays open after the response */
  int expect_continue;       /* Expect: 100-continue */
  size_t head_len;           /* bytes of the request line + headers + the blank line */
  int error_status;          /* on a parse error: the HTTP status to answer (400, 413, 431, 501, 505) */
} di_http_request;

typedef struct di_http_limits {
  size_t max_head_bytes;     /* request line + headers (431 beyond) */
  size_t max_body_bytes;     /* body (413 beyond) */
} di_http_limits;

/* Parses the request head at the start of buf[0..len). *complete = 0: more bytes are needed (no
 * error yet); 1: `req` is filled. A malformed or oversized head is DI_ERR_FORMAT with the message
 * set and req->error_status the HTTP status to answer. Header pointers point into `buf`. */
di_status di_http_parse_head(const char *buf, size_t len, const di_http_limits *lim, di_http_request *req,
                             int *complete);
/* The value of header `name` (case-insensitive), or NULL; *len gets its length. */
const char *di_http_header_get(const di_http_request *req, const char *name, size_t *len);

/* Chunked request bodies, decoded as bytes arrive. */
typedef struct di_http_chunked {
  int state;
  uint64_t remaining;        /* bytes left in the current chunk */
  size_t line_len;           /* bytes in the current size/extension/trailer line */
  size_t trailer_bytes;
  size_t max_body;
  char *body;                /* the decoded body (malloc'd, NUL-terminated; the caller takes it) */
  size_t body_len, body_cap;
  int done;
  int error_status;
} di_http_chunked;

void di_http_chunked_init(di_http_chunked *d, size_t max_body);
/* Consumes bytes of in[0..len); *used: how many (after the final chunk, the rest belongs to the
 * next request). Sets d->done at the end of the body. Malformed input: DI_ERR_FORMAT, and
 * d->error_status (400 or 413). */
di_status di_http_chunked_feed(di_http_chunked *d, const char *in, size_t len, size_t *used);
void di_http_chunked_free(di_http_chunked *d);

/* The reason phrase of a status ("Not Found"). */
const char *di_http_reason(int status);

/* Response writers over a connected socket. They return 0 on success, -1 when the peer is gone.
 * `extra_headers` ("Name: value\r\n" lines) may be NULL. */
int di_http_write_all(int fd, const void *data, size_t len);
int di_http_respond(int fd, int status, const char *content_type, const char *body, size_t len, int keep_alive,
                    const char *extra_headers);
/* Starts a chunked response (for text/event-stream); each di_http_write_chunk sends one chunk;
 * di_http_end_chunked sends the terminating zero chunk. */
int di_http_begin_chunked(int fd, int status, const char *content_type, int keep_alive, const char *extra_headers);
int di_http_write_chunk(int fd, const char *data, size_t len);
int di_http_end_chunked(int fd);
#endif
