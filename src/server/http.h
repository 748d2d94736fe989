/* The request as the endpoints see it (filled by the transport, server.c, from libmicrohttpd's
 * parsed request), and the one piece of HTTP text the server still splits itself: the
 * "Name: value\r\n" lines that handlers hand to a response (CORS, X-Request-Id, Allow ...). The
 * request line, headers, chunked bodies, keep-alive and pipelining are libmicrohttpd's. */
#ifndef DI_SERVER_HTTP_H
#define DI_SERVER_HTTP_H
#include <stddef.h>
#include <stdint.h>

#define DI_HTTP_MAX_HEADERS 64

typedef struct di_http_header {
  const char *name, *value;  /* owned by the transport for the request's lifetime */
  size_t name_len, value_len;
} di_http_header;

typedef struct di_http_request {
  char method[16];
  char target[4096];         /* the path (libmicrohttpd keeps the query apart), NUL-terminated */
  size_t path_len;
  int version_minor;         /* HTTP/1.x */
  int n_headers;             /* the first DI_HTTP_MAX_HEADERS headers */
  di_http_header headers[DI_HTTP_MAX_HEADERS];
} di_http_request;

/* The value of header `name` (case-insensitive), or NULL; *len gets its length. */
const char *di_http_header_get(const di_http_request *req, const char *name, size_t *len);

/* Iterates "Name: value\r\n" lines: returns 1 with the next line's name and value (trimmed, not
 * NUL-terminated) and advances *p, 0 at the end. A line without a colon, an empty name or a value
 * with CR, LF or other control characters (header injection) is skipped. */
int di_http_next_header_line(const char **p, const char **name, size_t *name_len, const char **value,
                             size_t *value_len);
#endif
