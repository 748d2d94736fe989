/* DeepSeek tool-call markup out of a reply's text (see tool_calls.h). A call that is cut off (the
 * reply hit max_tokens inside it) is not returned; a reply with no complete call stays content. */
#include "server/tool_calls.h"
#include <stdlib.h>
#include <string.h>

#define CALLS_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define CALL_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"

static const char *find(const char *h, size_t hl, const char *n) {
  size_t nl = strlen(n);
  if (nl > hl) return NULL;
  for (size_t i = 0; i + nl <= hl; i++)
    if (h[i] == n[0] && memcmp(h + i, n, nl) == 0) return h + i;
  return NULL;
}

static char *dup_trim(const char *s, size_t n) {
  while (n && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')) { s++; n--; }
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == '\t')) n--;
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

void di_tool_calls_free(di_tool_call *calls, int n) {
  for (int i = 0; calls && i < n; i++) {
    free(calls[i].name);
    free(calls[i].arguments);
  }
  free(calls);
}

/* one call's body (between CALL_BEGIN and CALL_END) */
static int parse_call(const char *b, size_t n, di_tool_call *out) {
  const char *sep = find(b, n, SEP);
  if (!sep) return 0;
  size_t left = (size_t)(sep - b), sl = strlen(SEP);
  const char *r = sep + sl;
  size_t rn = n - left - sl;
  const char *fence = find(r, rn, "```json");
  if (left == 8 && memcmp(b, "function", 8) == 0 && fence) {
    /* V3: NAME\n```json\nARGS\n``` */
    const char *args = fence + 7;
    size_t an = rn - (size_t)(args - r);
    const char *close = NULL;
    for (const char *p = args; (p = find(p, an - (size_t)(p - args), "```")); p += 3) close = p; /* the last fence */
    if (!close) return 0;
    out->name = dup_trim(r, (size_t)(fence - r));
    out->arguments = dup_trim(args, (size_t)(close - args));
  } else {
    out->name = dup_trim(b, left);
    out->arguments = dup_trim(r, rn);
  }
  if (!out->name || !out->arguments || !out->name[0]) {
    free(out->name);
    free(out->arguments);
    out->name = out->arguments = NULL;
    return 0;
  }
  return 1;
}

int di_tool_calls_parse(const char *text, size_t len, size_t *content_len, di_tool_call **calls) {
  *calls = NULL;
  *content_len = len;
  const char *start = find(text, len, CALLS_BEGIN);
  if (!start) return 0;
  int n = 0, cap = 0;
  di_tool_call *a = NULL;
  const char *p = start + strlen(CALLS_BEGIN), *end = text + len;
  for (;;) {
    const char *cb = find(p, (size_t)(end - p), CALL_BEGIN);
    if (!cb) break;
    const char *body = cb + strlen(CALL_BEGIN);
    const char *ce = find(body, (size_t)(end - body), CALL_END);
    if (!ce) break;
    di_tool_call c = {0};
    if (parse_call(body, (size_t)(ce - body), &c)) {
      if (n == cap) {
        cap = cap ? 2 * cap : 4;
        di_tool_call *b = realloc(a, (size_t)cap * sizeof *b);
        if (!b) { free(c.name); free(c.arguments); di_tool_calls_free(a, n); return -1; }
        a = b;
      }
      a[n++] = c;
    }
    p = ce + strlen(CALL_END);
  }
  if (n == 0) return 0;
  *content_len = (size_t)(start - text);
  *calls = a;
  return n;
}

size_t di_tool_calls_safe_prefix(const char *text, size_t len) {
  const char *start = find(text, len, CALLS_BEGIN);
  if (start) return (size_t)(start - text);
  size_t ml = strlen(CALLS_BEGIN);
  /* the longest tail that is a proper prefix of the marker is held back */
  for (size_t k = ml - 1; k > 0; k--)
    if (k <= len && memcmp(text + len - k, CALLS_BEGIN, k) == 0) return len - k;
  return len;
}
