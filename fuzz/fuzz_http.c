/* libFuzzer target: the HTTP/1.1 request-head parser and the chunked body decoder of
 * `deepinfer serve`. The input is raw bytes from a client; when the head parses and announces a
 * chunked body, the rest is fed to the decoder in pieces whose size comes from the first byte, so
 * that every split of the stream is tried. Small limits, so oversize paths are reached. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t step = (size_t)(data[0] % 17) + 1;
  const char *buf = (const char *)data + 1;
  size_t len = size - 1;
  di_http_limits lim = {2048, 4096};
  di_http_request req;
  int complete = 0;
  /* every prefix must parse to "incomplete" or the same verdict: check a few */
  for (size_t cut = len / 3; cut < len; cut += len / 3 + 1) {
    di_http_request r2;
    int c2;
    (void)di_http_parse_head(buf, cut, &lim, &r2, &c2);
  }
  if (di_http_parse_head(buf, len, &lim, &req, &complete) != DI_OK || !complete) return 0;
  size_t n;
  (void)di_http_header_get(&req, "content-type", &n);
  if (req.head_len > len) __builtin_trap();
  if (!req.chunked) return 0;
  di_http_chunked d;
  di_http_chunked_init(&d, lim.max_body_bytes);
  size_t pos = req.head_len;
  while (pos < len && !d.done) {
    size_t take = len - pos < step ? len - pos : step, used;
    if (di_http_chunked_feed(&d, buf + pos, take, &used) != DI_OK) break;
    if (used > take) __builtin_trap();
    pos += used;
    if (used < take && !d.done) __builtin_trap(); /* the decoder stops early only at the end */
  }
  if (d.body_len > lim.max_body_bytes) __builtin_trap();
  di_http_chunked_free(&d);
  return 0;
}
