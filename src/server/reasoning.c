/* <think>...</think> split of a reply (see reasoning.h), as vLLM's deepseek_r1 parser does it: text
 * before an opening <think> is dropped, the reasoning runs to the first </think>, the rest is
 * content. */
#include "server/reasoning.h"
#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static const char *find(const char *h, size_t hl, const char *n, size_t nl) {
  for (size_t i = 0; i + nl <= hl; i++)
    if (h[i] == n[0] && memcmp(h + i, n, nl) == 0) return h + i;
  return NULL;
}

/* the longest tail of t[0..len) that is a proper prefix of m */
static size_t partial_tail(const char *t, size_t len, const char *m, size_t ml) {
  for (size_t k = ml - 1; k > 0; k--)
    if (k <= len && memcmp(t + len - k, m, k) == 0) return k;
  return 0;
}

void di_reasoning_split_text(const char *text, size_t len, int final, di_reasoning_split *out) {
  size_t ol = sizeof OPEN - 1, cl = sizeof CLOSE - 1;
  const char *open = find(text, len, OPEN, ol);
  size_t begin = open ? (size_t)(open - text) + ol : 0;
  const char *close = find(text + begin, len - begin, CLOSE, cl);
  out->r_begin = begin;
  if (close) {
    out->r_end = (size_t)(close - text);
    out->c_begin = out->r_end + cl;
    out->ended = 1;
    return;
  }
  out->ended = 0;
  out->c_begin = len;
  size_t hold = 0;
  if (!final) {
    hold = partial_tail(text + begin, len - begin, CLOSE, cl);
    if (!open) {
      size_t h2 = partial_tail(text, len, OPEN, ol);
      if (h2 > hold) hold = h2;
    }
  }
  out->r_end = len - hold;
}
