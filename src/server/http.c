/* HTTP/1.1 request-head parser, chunked body decoder and response writers (see http.h). The head
 * is re-parsed from the start of the buffer each time more bytes arrive: heads are small (limit
 * max_head_bytes), and a stateless parser is easier to fuzz. Bodies are not re-scanned: a
 * Content-Length body is only counted, a chunked body goes through a byte-at-a-time state machine. */
#include "util/text.h"
#include "server/http.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>

static int is_tchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
  return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static di_status head_error(di_http_request *req, int status, const char *msg) {
  req->error_status = status;
  return di_error_set(DI_ERR_FORMAT, "%s", msg);
}

static int ieq(const char *a, size_t alen, const char *b) {
  size_t blen = strlen(b);
  return alen == blen && strncasecmp(a, b, alen) == 0;
}

/* comma-separated tokens of a header value, compared case-insensitively */
static int has_token(const char *v, size_t len, const char *tok) {
  size_t i = 0;
  while (i < len) {
    while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t s = i;
    while (i < len && v[i] != ',') i++;
    size_t e = i;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (e > s && ieq(v + s, e - s, tok)) return 1;
  }
  return 0;
}

static di_status parse_request_line(const char *l, size_t n, di_http_request *req) {
  size_t i = 0;
  while (i < n && is_tchar((unsigned char)l[i])) i++;
  if (i == 0 || i >= n || l[i] != ' ') return head_error(req, 400, "malformed request line (method)");
  if (i >= sizeof req->method) return head_error(req, 501, "unknown method");
  memcpy(req->method, l, i);
  req->method[i] = 0;
  size_t t = ++i;
  while (i < n && l[i] != ' ') {
    unsigned char c = (unsigned char)l[i];
    if (c <= 0x20 || c == 0x7f) return head_error(req, 400, "malformed request target");
    i++;
  }
  size_t tlen = i - t;
  if (tlen == 0 || i >= n) return head_error(req, 400, "malformed request line (target)");
  if (tlen >= sizeof req->target) return head_error(req, 414, "request target too long");
  memcpy(req->target, l + t, tlen);
  req->target[tlen] = 0;
  const char *q = memchr(req->target, '?', tlen);
  req->path_len = q ? (size_t)(q - req->target) : tlen;
  i++;
  if (n - i != 8 || memcmp(l + i, "HTTP/", 5) != 0 || l[i + 5] < '0' || l[i + 5] > '9' || l[i + 6] != '.' ||
      l[i + 7] < '0' || l[i + 7] > '9')
    return head_error(req, 400, "malformed request line (version)");
  if (l[i + 5] != '1') return head_error(req, 505, "HTTP version not supported (HTTP/1.x only)");
  req->version_minor = l[i + 7] - '0';
  return DI_OK;
}

static di_status parse_header(const char *l, size_t n, const di_http_limits *lim, di_http_request *req, int *saw_te) {
  if (n > 0 && (l[0] == ' ' || l[0] == '\t')) return head_error(req, 400, "obsolete header line folding");
  size_t i = 0;
  while (i < n && is_tchar((unsigned char)l[i])) i++;
  if (i == 0 || i >= n || l[i] != ':') return head_error(req, 400, "malformed header line");
  size_t name_len = i++;
  while (i < n && (l[i] == ' ' || l[i] == '\t')) i++;
  size_t vs = i, ve = n;
  while (ve > vs && (l[ve - 1] == ' ' || l[ve - 1] == '\t')) ve--;
  for (size_t k = vs; k < ve; k++) {
    unsigned char c = (unsigned char)l[k];
    if ((c < 0x20 && c != '\t') || c == 0x7f) return head_error(req, 400, "control character in a header value");
  }
  if (req->n_headers == DI_HTTP_MAX_HEADERS) return head_error(req, 431, "too many header fields");
  di_http_header *h = &req->headers[req->n_headers++];
  h->name = l;
  h->name_len = name_len;
  h->value = l + vs;
  h->value_len = ve - vs;
  if (ieq(l, name_len, "content-length")) {
    if (ve == vs) return head_error(req, 400, "empty Content-Length");
    uint64_t v = 0;
    for (size_t k = vs; k < ve; k++) {
      if (l[k] < '0' || l[k] > '9') return head_error(req, 400, "Content-Length is not a number");
      if (v > (UINT64_MAX - 9) / 10) return head_error(req, 413, "request body too large");
      v = v * 10 + (uint64_t)(l[k] - '0');
    }
    if (v > lim->max_body_bytes) return head_error(req, 413, "request body too large");
    if (req->content_length >= 0 && (uint64_t)req->content_length != v)
      return head_error(req, 400, "conflicting Content-Length headers");
    req->content_length = (int64_t)v;
  } else if (ieq(l, name_len, "transfer-encoding")) {
    /* only "chunked" alone: other codings (gzip, ...) are not implemented */
    if (*saw_te || !ieq(l + vs, ve - vs, "chunked"))
      return head_error(req, 501, "unsupported Transfer-Encoding (only chunked)");
    *saw_te = 1;
    req->chunked = 1;
  } else if (ieq(l, name_len, "connection")) {
    if (has_token(l + vs, ve - vs, "close")) req->keep_alive = 0;
    else if (has_token(l + vs, ve - vs, "keep-alive")) req->keep_alive = 1;
  } else if (ieq(l, name_len, "expect")) {
    if (!ieq(l + vs, ve - vs, "100-continue")) return head_error(req, 417, "unsupported Expect header");
    req->expect_continue = 1;
  }
  return DI_OK;
}

di_status di_http_parse_head(const char *buf, size_t len, const di_http_limits *lim, di_http_request *req,
                             int *complete) {
  *complete = 0;
  memset(req, 0, offsetof(di_http_request, headers));
  req->content_length = -1;
  req->chunked = req->keep_alive = req->expect_continue = 0;
  req->head_len = 0;
  req->error_status = 0;
  size_t limit = len < lim->max_head_bytes ? len : lim->max_head_bytes;
  size_t pos = 0;
  /* robustness (RFC 9112 2.2): empty lines before the request line are ignored */
  while (pos < limit && (buf[pos] == '\r' || buf[pos] == '\n')) {
    if (buf[pos] == '\r' && (pos + 1 >= limit || buf[pos + 1] != '\n')) break;
    pos += buf[pos] == '\r' ? 2 : 1;
    if (pos > 64) return head_error(req, 400, "too many empty lines before the request");
  }
  int line_no = 0, saw_te = 0;
  for (;;) {
    const char *nl = memchr(buf + pos, '\n', limit - pos);
    if (!nl) {
      if (len >= lim->max_head_bytes) return head_error(req, 431, "request head too large");
      return DI_OK; /* need more */
    }
    size_t end = (size_t)(nl - buf), n = end - pos;
    if (n > 0 && buf[end - 1] == '\r') n--;
    const char *l = buf + pos;
    if (memchr(l, '\r', n) || memchr(l, 0, n)) return head_error(req, 400, "stray CR or NUL in the request head");
    pos = end + 1;
    if (line_no == 0) {
      DI_TRY(parse_request_line(l, n, req));
      req->keep_alive = req->version_minor >= 1;
    } else if (n == 0) {
      break;
    } else {
      DI_TRY(parse_header(l, n, lim, req, &saw_te));
    }
    line_no++;
  }
  if (req->chunked && req->content_length >= 0)
    return head_error(req, 400, "both Content-Length and Transfer-Encoding");
  if (req->chunked && req->version_minor == 0) return head_error(req, 400, "chunked body in an HTTP/1.0 request");
  req->head_len = pos;
  *complete = 1;
  return DI_OK;
}

const char *di_http_header_get(const di_http_request *req, const char *name, size_t *len) {
  for (int i = 0; i < req->n_headers; i++)
    if (ieq(req->headers[i].name, req->headers[i].name_len, name)) {
      if (len) *len = req->headers[i].value_len;
      return req->headers[i].value;
    }
  return NULL;
}

/* ---- chunked bodies --------------------------------------------------------------------------- */
enum { CH_SIZE, CH_EXT, CH_SIZE_LF, CH_DATA, CH_DATA_CR, CH_DATA_LF, CH_TRAILER_START, CH_TRAILER,
       CH_TRAILER_LF, CH_END_LF, CH_DONE };
#define CH_MAX_LINE 4096
#define CH_MAX_TRAILERS 8192

void di_http_chunked_init(di_http_chunked *d, size_t max_body) {
  memset(d, 0, sizeof *d);
  d->state = CH_SIZE;
  d->max_body = max_body;
}

void di_http_chunked_free(di_http_chunked *d) {
  free(d->body);
  d->body = NULL;
}

static di_status ch_error(di_http_chunked *d, int status, const char *msg) {
  d->error_status = status;
  return di_error_set(DI_ERR_FORMAT, "chunked body: %s", msg);
}


/* the size line ended: start the chunk's data, or the trailers after the last chunk */
static di_status ch_size_done(di_http_chunked *d) {
  if (d->line_len == 0) return ch_error(d, 400, "missing chunk size");
  d->line_len = 0;
  if (d->remaining == 0) {
    d->state = CH_TRAILER_START;
    return DI_OK;
  }
  if (d->remaining > d->max_body - d->body_len) return ch_error(d, 413, "request body too large");
  size_t need = d->body_len + (size_t)d->remaining + 1;
  if (need > d->body_cap) {
    size_t cap = d->body_cap ? d->body_cap : 256;
    while (cap < need) cap *= 2;
    if (cap > d->max_body + 1) cap = d->max_body + 1;
    char *b = realloc(d->body, cap);
    if (!b) return ch_error(d, 413, "out of memory for the request body");
    d->body = b;
    d->body_cap = cap;
  }
  d->state = CH_DATA;
  return DI_OK;
}

di_status di_http_chunked_feed(di_http_chunked *d, const char *in, size_t len, size_t *used) {
  size_t i = 0;
  *used = 0;
  while (i < len && d->state != CH_DONE) {
    char c = in[i];
    switch (d->state) {
      case CH_SIZE: {
        int h = di_hexval(c);
        if (h >= 0 && d->line_len < 16) {
          if (d->line_len == 15 || d->remaining > (UINT64_MAX >> 4)) return ch_error(d, 413, "chunk size too large");
          d->remaining = d->remaining * 16 + (uint64_t)h;
          d->line_len++;
          i++;
          break;
        }
        if (d->line_len == 0) return ch_error(d, 400, "missing chunk size");
        if (c == ';' || c == ' ' || c == '\t') { d->state = CH_EXT; i++; break; }
        if (c == '\r') { d->state = CH_SIZE_LF; i++; break; }
        if (c == '\n') { i++; DI_TRY(ch_size_done(d)); break; }
        return ch_error(d, 400, "malformed chunk size");
      }
      case CH_EXT:
        /* chunk extensions are ignored, but their length is bounded */
        if (++d->line_len > CH_MAX_LINE) return ch_error(d, 400, "chunk extension too long");
        if (c == '\r') d->state = CH_SIZE_LF;
        else if (c == '\n') { i++; DI_TRY(ch_size_done(d)); break; }
        else if ((unsigned char)c < 0x20 && c != '\t') return ch_error(d, 400, "control character in a chunk extension");
        i++;
        break;
      case CH_SIZE_LF:
        if (c != '\n') return ch_error(d, 400, "chunk size line without LF");
        i++;
        DI_TRY(ch_size_done(d));
        break;
      case CH_DATA: {
        size_t take = len - i;
        if ((uint64_t)take > d->remaining) take = (size_t)d->remaining;
        memcpy(d->body + d->body_len, in + i, take);
        d->body_len += take;
        d->body[d->body_len] = 0;
        d->remaining -= take;
        i += take;
        if (d->remaining == 0) d->state = CH_DATA_CR;
        break;
      }
      case CH_DATA_CR:
        if (c == '\r') d->state = CH_DATA_LF;
        else if (c == '\n') d->state = CH_SIZE;
        else return ch_error(d, 400, "chunk data longer than its size");
        i++;
        break;
      case CH_DATA_LF:
        if (c != '\n') return ch_error(d, 400, "chunk data without CRLF");
        d->state = CH_SIZE;
        i++;
        break;
      case CH_TRAILER_START:
        if (c == '\r') d->state = CH_END_LF;
        else if (c == '\n') d->state = CH_DONE;
        else d->state = CH_TRAILER;
        if (d->state != CH_TRAILER) i++;
        break;
      case CH_TRAILER:
        if (++d->trailer_bytes > CH_MAX_TRAILERS) return ch_error(d, 431, "trailer section too large");
        if (c == '\r') d->state = CH_TRAILER_LF;
        else if (c == '\n') d->state = CH_TRAILER_START;
        else if (c == 0) return ch_error(d, 400, "NUL in a trailer");
        i++;
        break;
      case CH_TRAILER_LF:
        if (c != '\n') return ch_error(d, 400, "trailer line without LF");
        d->state = CH_TRAILER_START;
        i++;
        break;
      case CH_END_LF:
        if (c != '\n') return ch_error(d, 400, "chunked body without a final CRLF");
        d->state = CH_DONE;
        i++;
        break;
      default:
        return ch_error(d, 400, "internal state");
    }
  }
  if (d->state == CH_DONE) {
    d->done = 1;
    if (!d->body) {
      d->body = malloc(1);
      if (!d->body) return ch_error(d, 413, "out of memory for the request body");
      d->body[0] = 0;
    }
  }
  *used = i;
  return DI_OK;
}

/* ---- responses -------------------------------------------------------------------------------- */
const char *di_http_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

int di_http_write_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len > 0) {
    /* MSG_NOSIGNAL: a closed peer gives EPIPE here instead of killing the process */
    ssize_t k = send(fd, p, len, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

/* Sends the buffers as one message (one packet for small responses: with TCP_NODELAY separate
 * sends would each go out alone). */
static int write_iov(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)n;
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    while (n > 0 && (size_t)k >= iov->iov_len) {
      k -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + k;
      iov->iov_len -= (size_t)k;
    }
  }
  return 0;
}

static int write_head(int fd, int status, const char *content_type, long long content_length, int keep_alive,
                      const char *extra, const char *body, size_t body_len) {
  char head[1024];
  int n;
  if (content_length >= 0)
    n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nServer: deepinfer\r\nContent-Type: %s\r\nContent-Length: %lld\r\n"
                 "Connection: %s\r\n", status, di_http_reason(status), content_type, content_length,
                 keep_alive ? "keep-alive" : "close");
  else
    n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nServer: deepinfer\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n"
                 "Cache-Control: no-cache\r\nConnection: %s\r\n", status, di_http_reason(status), content_type,
                 keep_alive ? "keep-alive" : "close");
  if (n < 0 || (size_t)n >= sizeof head) return -1;
  struct iovec iov[4] = {{head, (size_t)n}, {(void *)(extra ? extra : ""), extra ? strlen(extra) : 0},
                         {(void *)"\r\n", 2}, {(void *)(body ? body : ""), body ? body_len : 0}};
  return write_iov(fd, iov, 4);
}

int di_http_respond(int fd, int status, const char *content_type, const char *body, size_t len, int keep_alive,
                    const char *extra_headers) {
  return write_head(fd, status, content_type, (long long)len, keep_alive, extra_headers, body, len);
}

int di_http_begin_chunked(int fd, int status, const char *content_type, int keep_alive, const char *extra_headers) {
  return write_head(fd, status, content_type, -1, keep_alive, extra_headers, NULL, 0);
}

int di_http_write_chunk(int fd, const char *data, size_t len) {
  if (len == 0) return 0; /* a zero-size chunk would end the body */
  char sz[32];
  int n = snprintf(sz, sizeof sz, "%zx\r\n", len);
  struct iovec iov[3] = {{sz, (size_t)n}, {(void *)data, len}, {(void *)"\r\n", 2}};
  return write_iov(fd, iov, 3);
}

int di_http_end_chunked(int fd) { return di_http_write_all(fd, "0\r\n\r\n", 5); }
