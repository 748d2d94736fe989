/* The HTTP/1.1 parser of `deepinfer serve`: request heads (keep-alive defaults, limits, malformed
 * input with the status it is answered with), chunked bodies fed whole and byte by byte, and the
 * fuzz corpus replayed (every input parses or fails cleanly). */
#include "server/http.h"
#include "test_util.h"
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

static const di_http_limits LIM = {4096, 1 << 16};

/* parses `s`; returns the status (0 ok) and fills req/complete */
static int parse(const char *s, di_http_request *req, int *complete) {
  di_status st = di_http_parse_head(s, strlen(s), &LIM, req, complete);
  return st == DI_OK ? 0 : req->error_status;
}

static void test_heads(void) {
  di_http_request r;
  int c;
  CHECK(parse("GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nAccept:  */*  \r\n\r\nrest", &r, &c) == 0 && c == 1);
  CHECK(strcmp(r.method, "GET") == 0 && strcmp(r.target, "/v1/models?x=1") == 0 && r.path_len == 10);
  CHECK(r.version_minor == 1 && r.keep_alive == 1 && r.content_length == -1 && !r.chunked && r.n_headers == 3);
  CHECK(r.head_len == strlen("GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nAccept:  */*  \r\n\r\n"));
  size_t n;
  const char *v = di_http_header_get(&r, "ACCEPT", &n);
  CHECK(v && n == 3 && memcmp(v, "*/*", 3) == 0);
  v = di_http_header_get(&r, "x-empty", &n);
  CHECK(v && n == 0);
  CHECK(di_http_header_get(&r, "missing", &n) == NULL);
  /* incomplete heads ask for more, at every cut */
  const char *full = "POST /v1/completions HTTP/1.1\r\nContent-Length: 12\r\n\r\n";
  for (size_t cut = 0; cut < strlen(full); cut++) {
    di_status st = di_http_parse_head(full, cut, &LIM, &r, &c);
    CHECKF(st == DI_OK && c == 0, "cut %zu", cut);
  }
  CHECK(parse(full, &r, &c) == 0 && c == 1 && r.content_length == 12);
  /* keep-alive: HTTP/1.0 closes unless asked; 1.1 keeps unless asked */
  CHECK(parse("GET / HTTP/1.0\r\n\r\n", &r, &c) == 0 && c && !r.keep_alive);
  CHECK(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &r, &c) == 0 && r.keep_alive);
  CHECK(parse("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n", &r, &c) == 0 && !r.keep_alive);
  /* bare LF line ends and leading empty lines are accepted */
  CHECK(parse("\r\n\nGET / HTTP/1.1\nHost: x\n\n", &r, &c) == 0 && c && r.n_headers == 1);
  CHECK(parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", &r, &c) == 0 && r.chunked &&
        r.expect_continue);
  /* a parse that reused the request struct starts clean */
  CHECK(parse("GET / HTTP/1.1\r\n\r\n", &r, &c) == 0 && !r.chunked && !r.expect_continue && r.content_length == -1);
}

static void test_head_errors(void) {
  di_http_request r;
  int c;
  CHECK(parse("GET / HTTP/2.0\r\n\r\n", &r, &c) == 505);
  CHECK(parse("GET / FTP/1.1\r\n\r\n", &r, &c) == 400);
  CHECK(parse("GET  / HTTP/1.1\r\n\r\n", &r, &c) == 400);
  CHECK(parse("G(T / HTTP/1.1\r\n\r\n", &r, &c) == 400);
  CHECK(parse("VERYLONGMETHODNAME / HTTP/1.1\r\n\r\n", &r, &c) == 501);
  CHECK(parse("GET /a\x01 HTTP/1.1\r\n\r\n", &r, &c) == 400);
  CHECK(parse("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", &r, &c) == 400);
  CHECK(parse("GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", &r, &c) == 400);
  CHECK(parse("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", &r, &c) == 400);
  CHECK(parse("GET / HTTP/1.1\r\nContent-Length: 12a\r\n\r\n", &r, &c) == 400);
  CHECK(parse("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", &r, &c) == 400);
  CHECK(parse("GET / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", &r, &c) == 0 && r.content_length == 3);
  CHECK(parse("POST / HTTP/1.1\r\nContent-Length: 65537\r\n\r\n", &r, &c) == 413);
  CHECK(parse("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", &r, &c) == 413);
  CHECK(parse("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", &r, &c) == 400);
  CHECK(parse("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &r, &c) == 501);
  CHECK(parse("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", &r, &c) == 400);
  CHECK(parse("POST / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n", &r, &c) == 417);
  CHECK_ERR(di_http_parse_head("GET / HTTP/1.1\r\nX y\r\n\r\n", 23, &LIM, &r, &c), "malformed header line");
  /* a head larger than the limit, with or without its end seen */
  char *big = malloc(8192);
  strcpy(big, "GET / HTTP/1.1\r\nX: ");
  memset(big + strlen(big), 'a', 5000);
  big[19 + 5000] = 0;
  CHECK(di_http_parse_head(big, strlen(big), &LIM, &r, &c) != DI_OK && r.error_status == 431);
  strcat(big, "\r\n\r\n");
  CHECK(di_http_parse_head(big, strlen(big), &LIM, &r, &c) != DI_OK && r.error_status == 431);
  /* more header fields than the table holds */
  strcpy(big, "GET / HTTP/1.1\r\n");
  for (int i = 0; i < DI_HTTP_MAX_HEADERS + 1; i++) sprintf(big + strlen(big), "H%d: v\r\n", i);
  strcat(big, "\r\n");
  CHECK(parse(big, &r, &c) == 431);
  CHECK(strstr(di_last_error(), "too many header") != NULL);
  free(big);
}

/* decodes `s` in pieces of `step` bytes; returns the status (0 ok) */
static int chunked(const char *s, size_t len, size_t step, size_t max, char **body, size_t *body_len, size_t *used_total) {
  di_http_chunked d;
  di_http_chunked_init(&d, max);
  size_t pos = 0;
  int rc = 0;
  while (pos < len && !d.done) {
    size_t take = len - pos < step ? len - pos : step, used;
    if (di_http_chunked_feed(&d, s + pos, take, &used) != DI_OK) { rc = d.error_status; break; }
    pos += used;
  }
  if (!rc && !d.done) rc = -1; /* incomplete */
  *used_total = pos;
  *body_len = d.body_len;
  *body = d.body;
  d.body = NULL;
  di_http_chunked_free(&d);
  return rc;
}

static void test_chunked(void) {
  const char *in = "5;name=val\r\nhello\r\n7\r\n, world\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  size_t len = strlen(in);
  for (size_t step = 1; step <= len; step += step < 8 ? 1 : 13) {
    char *body;
    size_t blen, used;
    int rc = chunked(in, len, step, 1024, &body, &blen, &used);
    CHECKF(rc == 0 && blen == 22 && body && memcmp(body, "hello, world0123456789", 22) == 0 && body[22] == 0,
           "step %zu rc %d", step, rc);
    CHECKF(used == len - 4, "step %zu: used %zu", step, used); /* the pipelined "NEXT" is left */
    free(body);
  }
  char *body;
  size_t blen, used;
  CHECK(chunked("0\r\n\r\n", 5, 5, 10, &body, &blen, &used) == 0 && blen == 0 && body && body[0] == 0);
  free(body);
  CHECK(chunked("3\nabc\n0\n\n", 10, 3, 10, &body, &blen, &used) == 0 && blen == 3);
  free(body);
  CHECK(chunked("zz\r\n", 4, 4, 10, &body, &blen, &used) == 400);
  free(body);
  CHECK(chunked("\r\n", 2, 4, 10, &body, &blen, &used) == 400);
  free(body);
  CHECK(chunked("3\r\nabcd\r\n", 9, 4, 10, &body, &blen, &used) == 400);
  free(body);
  CHECK(chunked("b\r\nhello world\r\n0\r\n\r\n", 22, 4, 10, &body, &blen, &used) == 413);
  free(body);
  CHECK(chunked("6\r\nhello \r\n6\r\nworld!\r\n0\r\n\r\n", 28, 7, 10, &body, &blen, &used) == 413);
  free(body);
  CHECK(chunked("ffffffffffffffffff\r\n", 20, 4, 10, &body, &blen, &used) == 413);
  free(body);
  CHECK(chunked("5\r\nhel", 6, 2, 10, &body, &blen, &used) == -1);
  free(body);
}

static void test_reasons(void) {
  CHECK(strcmp(di_http_reason(404), "Not Found") == 0);
  CHECK(strcmp(di_http_reason(413), "Content Too Large") == 0);
  CHECK(strcmp(di_http_reason(799), "Unknown") == 0);
}

/* the fuzz corpus: the first byte is the fuzzer's piece size, the rest the client's bytes */
static void test_fuzz_corpus(void) {
  const char *dir = test_path("fuzz/corpus/http");
  DIR *d = opendir(dir);
  CHECKF(d != NULL, "no corpus at %s", dir);
  if (!d) return;
  int files = 0, heads = 0, bodies = 0;
  struct dirent *e;
  di_http_limits lim = {2048, 4096};
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    char *buf = malloc(1 << 20);
    size_t n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    files++;
    if (n < 1) { free(buf); continue; }
    di_http_request req;
    int complete;
    if (di_http_parse_head(buf + 1, n - 1, &lim, &req, &complete) == DI_OK && complete) {
      heads++;
      CHECK(req.head_len <= n - 1);
      if (req.chunked) {
        char *body;
        size_t blen, used;
        if (chunked(buf + 1 + req.head_len, n - 1 - req.head_len, (size_t)(buf[0] % 17) + 1, lim.max_body_bytes, &body,
                    &blen, &used) == 0)
          bodies++;
        CHECK(blen <= lim.max_body_bytes);
        free(body);
      }
    }
    free(buf);
  }
  closedir(d);
  CHECKF(files >= 15, "only %d corpus files", files);
  CHECKF(heads >= 5 && bodies >= 2, "%d heads, %d chunked bodies parsed", heads, bodies);
  printf("fuzz corpus: %d files, %d heads, %d chunked bodies\n", files, heads, bodies);
}

int main(void) {
  test_heads();
  test_head_errors();
  test_chunked();
  test_reasons();
  test_fuzz_corpus();
  return test_finish("test_http");
}
