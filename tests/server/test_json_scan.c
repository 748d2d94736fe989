/* The server's own parsing of client bytes: the streaming JSON pre-check (json_scan.h: depth, UTF-8,
 * value bound; fed whole and byte by byte, checked against a plain whole-buffer reference on
 * seeded random inputs), the response header-line splitter (http.h), and the fuzz corpus replayed. */
#include "server/http.h"
#include "server/json_scan.h"
#include "test_util.h"
/* the fuzz target itself (pieces of its first byte's size, the header-line splitter), replayed too */
#define LLVMFuzzerTestOneInput fuzz_http_one
#include "../../fuzz/fuzz_http.c"
#undef LLVMFuzzerTestOneInput
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* scans `s` (n bytes) whole or one byte at a time; returns the error status (0: accepted) */
static int scan(const char *s, size_t n, int depth, long long values, int bytewise, di_json_scan *out) {
  di_json_scan_init(out, depth, values);
  int rc = 0;
  if (bytewise) {
    for (size_t i = 0; i < n && rc == 0; i++) rc = di_json_scan_feed(out, s + i, 1);
  } else {
    rc = di_json_scan_feed(out, s, n);
  }
  if (rc == 0) rc = di_json_scan_end(out);
  return rc == 0 ? 0 : out->error_status;
}

static int scan_str(const char *s, int depth, long long values) {
  di_json_scan a, b;
  int x = scan(s, strlen(s), depth, values, 0, &a), y = scan(s, strlen(s), depth, values, 1, &b);
  CHECKF(x == y && strcmp(a.error, b.error) == 0, "%s: whole %d '%s', bytewise %d '%s'", s, x, a.error, y, b.error);
  return x;
}

static void test_utf8(void) {
  CHECK(scan_str("{\"p\": \"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"}", 64, 100) == 0);
  static const char *const bad[] = {"\"\xc0\xaf\"", "\"\xc1\xbf\"", "\"\xe0\x80\xaf\"", "\"\xed\xa0\x80\"",
                                    "\"\xf4\x90\x80\x80\"", "\"\xf5\x80\x80\x80\"", "\"\x80\"", "\"\xff\"",
                                    "\"\xc3\"", "\"\xe2\x82\"", "\"\xc3\x28\""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECKF(scan_str(bad[i], 64, 100) == 400, "case %zu", i);
  di_json_scan s;
  scan("{\"a\": \"\xff\"}", 10, 64, 100, 0, &s);
  CHECK(strstr(s.error, "not valid UTF-8") && strstr(s.error, "0xff") && strstr(s.error, "byte 7"));
  scan("\"\xe2\x82", 3, 64, 100, 0, &s);
  CHECK(strstr(s.error, "ends inside a character"));
}

static void test_depth_and_values(void) {
  char deep[300];
  for (int d = 0; d < 2; d++) {
    int n = d ? 65 : 64;
    memset(deep, '[', (size_t)n);
    memset(deep + n, ']', (size_t)n);
    deep[2 * n] = 0;
    CHECK(scan_str(deep, 64, 1000) == (d ? 400 : 0));
  }
  di_json_scan s;
  scan(deep, strlen(deep), 64, 1000, 0, &s);
  CHECK(strstr(s.error, "nested deeper than 64 levels") && strstr(s.error, "byte 64"));
  /* brackets, commas and escaped quotes inside strings do not count */
  CHECK(scan_str("[\"[[[[,,,,\\\"[[[[\", 1]", 2, 4) == 0);
  CHECK(scan_str("[[[]]]", 2, 100) == 400);
  /* the value bound: 1 + commas + 2 per container */
  CHECK(scan_str("[1,2,3]", 64, 5) == 0);  /* 1 + 2 + 2 = 5 */
  CHECK(scan_str("[1,2,3,4]", 64, 5) == 413);
  scan("[1,2,3,4]", 9, 64, 5, 0, &s);
  CHECK(strstr(s.error, "more than 5 values"));
}

/* reference: the same verdict computed over the whole buffer without any state machine trickery */
static int reference(const unsigned char *s, size_t n, int max_depth, long long max_values) {
  int depth = 0, in_str = 0;
  long long values = 1;
  for (size_t i = 0; i < n; i++) {
    unsigned c = s[i];
    if (c >= 0x80) {
      int len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
      if (!len || i + (size_t)len > n) return 400;
      uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
      for (int k = 1; k < len; k++) {
        if ((s[i + (size_t)k] & 0xC0) != 0x80) return 400;
        cp = cp << 6 | (s[i + (size_t)k] & 0x3F);
      }
      if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 400;
      i += (size_t)len - 1;
      continue;
    }
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = 0;
      continue;
    }
    if (c == '"') in_str = 1;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) return 400;
      values += 2;
    } else if ((c == ']' || c == '}') && depth > 0) depth--;
    else if (c == ',') values++;
    if (values > max_values) return 413;
  }
  return 0;
}

static void test_random_against_reference(void) {
  static const char alphabet[] = "[]{},\"\\ a1";
  static const unsigned char high[] = {0x80, 0xBF, 0xC2, 0xC3, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xA0, 0x9F, 0x90, 0x8F, 0xFF};
  srand(20261201);
  int mismatches = 0, accepted = 0;
  for (int t = 0; t < 4000; t++) {
    unsigned char buf[64];
    size_t n = (size_t)(rand() % 64);
    for (size_t i = 0; i < n; i++)
      buf[i] = rand() % 4 ? (unsigned char)alphabet[rand() % (int)(sizeof alphabet - 1)] : high[rand() % (int)sizeof high];
    /* an escape right before a multi-byte character: the reference skips a whole byte; avoid that case */
    for (size_t i = 0; i + 1 < n; i++)
      if (buf[i] == '\\' && buf[i + 1] >= 0x80) buf[i + 1] = 'a';
    di_json_scan a, b;
    int want = reference(buf, n, 4, 12);
    int got = scan((const char *)buf, n, 4, 12, t % 2, &a);
    (void)b;
    if (got != want) mismatches++;
    accepted += got == 0;
  }
  CHECKF(mismatches == 0, "%d of 4000 random inputs disagree with the reference", mismatches);
  CHECK(accepted > 100 && accepted < 3900);
}

static void test_header_lines(void) {
  const char *text = "Access-Control-Allow-Origin: *\r\nX-Request-Id:  r-1 \r\nBad line\r\n: empty\r\nX-Ctl: a\x01z\r\nAllow: GET";
  const char *p = text, *name, *value;
  size_t nl, vl;
  char got[256] = "";
  while (di_http_next_header_line(&p, &name, &nl, &value, &vl))
    snprintf(got + strlen(got), sizeof got - strlen(got), "[%.*s=%.*s]", (int)nl, name, (int)vl, value);
  CHECKF(strcmp(got, "[Access-Control-Allow-Origin=*][X-Request-Id=r-1][Allow=GET]") == 0, "%s", got);
  p = NULL;
  CHECK(di_http_next_header_line(&p, &name, &nl, &value, &vl) == 0);
  di_http_request r = {0};
  r.headers[0] = (di_http_header){"Content-Type", "application/json", 12, 16};
  r.n_headers = 1;
  CHECK(di_http_header_get(&r, "content-type", &nl) && nl == 16 && !di_http_header_get(&r, "accept", NULL));
}

/* the HTTP fuzz corpus (fuzz/fuzz_http.c): whole and byte-by-byte scans agree on every input */
static void scan_corpus_file(const char *name, const char *rel, const char *buf, size_t n, void *ctx) {
  (void)rel;
  (void)ctx;
  if (n < 1) return;
  di_json_scan a, b;
  int x = scan(buf + 1, n - 1, 8, 64, 0, &a), y = scan(buf + 1, n - 1, 8, 64, 1, &b);
  CHECKF(x == y && (x == 0 || x == 400 || x == 413), "%s: %d vs %d", name, x, y);
}

static void test_fuzz_corpus(void) {
  CHECK(test_for_each_file("fuzz/corpus/http", scan_corpus_file, NULL) >= 5);
  CHECK(test_fuzz_replay("fuzz/corpus/http", fuzz_http_one) >= 5);
}

int main(void) {
  test_utf8();
  test_depth_and_values();
  test_random_against_reference();
  test_header_lines();
  test_fuzz_corpus();
  return test_finish("test_json_scan");
}
