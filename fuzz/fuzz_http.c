/* libFuzzer target: the parsing of client bytes that the server still does itself now that
 * libmicrohttpd parses HTTP (request line, headers, chunked bodies): the streaming JSON pre-check of
 * request bodies (json_scan.h) and the response header-line splitter (http.h). The input is fed to
 * the scanner in pieces whose size comes from the first byte; the verdict (and where it came) must
 * be the same as when it is fed whole, and a scanner that accepted must have kept within its
 * limits. Small limits, so the depth and value paths are reached. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/http.h"
#include "server/json_scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t step = (size_t)(data[0] % 17) + 1;
  const char *buf = (const char *)data + 1;
  size_t len = size - 1;
  di_json_scan whole, parts;
  di_json_scan_init(&whole, 8, 64);
  di_json_scan_init(&parts, 8, 64);
  int rw = di_json_scan_feed(&whole, buf, len);
  if (rw == 0) rw = di_json_scan_end(&whole);
  int rp = 0;
  for (size_t pos = 0; pos < len && rp == 0; pos += step) rp = di_json_scan_feed(&parts, buf + pos, len - pos < step ? len - pos : step);
  if (rp == 0) rp = di_json_scan_end(&parts);
  if (rw != rp || whole.error_status != parts.error_status || strcmp(whole.error, parts.error) != 0) __builtin_trap();
  if (rw == 0 && (whole.depth > 8 || whole.values > 64)) __builtin_trap();
  /* header lines: every line returned is inside the input and free of CR/LF */
  char *text = malloc(len + 1);
  if (!text) return 0;
  memcpy(text, buf, len);
  text[len] = 0;
  const char *p = text, *name, *value;
  size_t nl, vl;
  while (di_http_next_header_line(&p, &name, &nl, &value, &vl)) {
    if (name < text || value + vl > text + len || nl == 0) __builtin_trap();
    if (memchr(value, '\r', vl) || memchr(value, '\n', vl) || memchr(name, ':', nl)) __builtin_trap();
  }
  free(text);
  return 0;
}
