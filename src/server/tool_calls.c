/* DeepSeek tool-call markup out of a reply's text (see tool_calls.h): the V3 / V3.1 forms here, the
 * DSML form of V4 in tool_calls_dsml.c. A call that is cut off (the reply hit max_tokens inside it)
 * is not returned by the whole parse; a reply with no complete call stays content. The partial parse
 * serves streaming: what it returns of an unfinished call is a prefix of what the whole parse will
 * return once the call is closed, so deltas of it reassemble to the whole reply. */
#include "server/tool_calls.h"
#include <stdlib.h>
#include <string.h>

#define CALLS_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define CALL_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"
#define DSML_BLOCK "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "tool_calls>"
#define DSML_BLOCK_V32 "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "function_calls>"

static const char *const BEGIN_MARKERS[] = {CALLS_BEGIN, DSML_BLOCK, DSML_BLOCK_V32};
#define N_BEGIN 3

const char *di_tc_find(const char *h, size_t hl, const char *n) {
  size_t nl = strlen(n);
  if (nl == 0 || nl > hl) return NULL;
  /* libc's search, not a memcmp per position: streamed replies ask di_tool_calls_safe_prefix of
   * every longer text, and the per-position loop was most of the tool-call fuzz target's time */
  return memmem(h, hl, n, nl);
}

size_t di_tc_partial_tail(const char *t, size_t len, const char *m) {
  size_t ml = strlen(m);
  for (size_t k = ml - 1; k > 0; k--)
    if (k <= len && memcmp(t + len - k, m, k) == 0) return k;
  return 0;
}

char *di_tc_dup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static char *dup_trim(const char *s, size_t n) {
  while (n && is_space(*s)) { s++; n--; }
  while (n && is_space(s[n - 1])) n--;
  return di_tc_dup(s, n);
}

int di_tc_push(di_tool_call **a, int *n, int *cap, char *name, char *arguments, int complete) {
  if (!name || !arguments) { free(name); free(arguments); return -1; }
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 4;
    di_tool_call *b = realloc(*a, (size_t)c * sizeof *b);
    if (!b) { free(name); free(arguments); return -1; }
    *a = b;
    *cap = c;
  }
  (*a)[(*n)++] = (di_tool_call){name, arguments, complete};
  return 0;
}

void di_tool_calls_free(di_tool_call *calls, int n) {
  for (int i = 0; calls && i < n; i++) {
    free(calls[i].name);
    free(calls[i].arguments);
  }
  free(calls);
}

/* One V3 / V3.1 call's body b[0..n) (after CALL_BEGIN; up to CALL_END when complete). An incomplete
 * body yields a call once its name is known, its arguments up to what cannot change: a tail that may
 * start the closing fence or CALL_END, and trailing whitespace, wait. Returns 1 with a call, 0 none. */
static int parse_call(const char *b, size_t n, int complete, char **name, char **args) {
  if (!complete) n -= di_tc_partial_tail(b, n, CALL_END);
  const char *sep = di_tc_find(b, n, SEP);
  if (!sep) return 0;
  size_t left = (size_t)(sep - b), sl = strlen(SEP);
  const char *r = sep + sl;
  size_t rn = n - left - sl;
  const char *fence = di_tc_find(r, rn, "```json");
  if (left == 8 && memcmp(b, "function", 8) == 0 && (fence || !complete)) {
    /* V3: NAME\n```json\nARGS\n``` (the name is known once the fence opens). A body that reaches
     * CALL_END with its fence still open takes its arguments up to CALL_END: the stream showed this
     * call and its arguments while they were written (fuzz_tool_calls' check: a call streamed is a
     * call of the whole parse, with its arguments a prefix of the final ones) */
    if (!fence) return 0;
    const char *a = fence + 7;
    size_t an = rn - (size_t)(a - r);
    const char *close = NULL;
    for (const char *p = a; (p = di_tc_find(p, an - (size_t)(p - a), "```")); p += 3) close = p; /* the last fence */
    size_t end = close ? (size_t)(close - a) : complete ? an : an - di_tc_partial_tail(a, an, "```");
    *name = dup_trim(r, (size_t)(fence - r));
    *args = dup_trim(a, end);
  } else {
    *name = dup_trim(b, left);
    *args = dup_trim(r, rn);
  }
  if (*name && !**name) { free(*name); free(*args); *name = *args = NULL; return 0; }
  return 1;
}

/* the V3 / V3.1 calls after CALLS_BEGIN at text[at] */
static int parse_v3(const char *text, size_t len, size_t at, int partial, di_tool_call **calls) {
  int n = 0, cap = 0;
  const char *p = text + at + strlen(CALLS_BEGIN), *end = text + len;
  for (;;) {
    const char *cb = di_tc_find(p, (size_t)(end - p), CALL_BEGIN);
    if (!cb) break;
    const char *body = cb + strlen(CALL_BEGIN);
    const char *ce = di_tc_find(body, (size_t)(end - body), CALL_END);
    if (!ce && !partial) break;
    char *name = NULL, *args = NULL;
    if (parse_call(body, ce ? (size_t)(ce - body) : (size_t)(end - body), ce != NULL, &name, &args) &&
        di_tc_push(calls, &n, &cap, name, args, ce != NULL) != 0) {
      di_tool_calls_free(*calls, n);
      *calls = NULL;
      return -1;
    }
    if (!ce) break;
    p = ce + strlen(CALL_END);
  }
  return n;
}

/* the first block marker of any form: its offset (len: none) and which */
static size_t markup_start(const char *text, size_t len, int *form) {
  size_t best = len;
  for (int i = 0; i < N_BEGIN; i++) {
    const char *s = di_tc_find(text, len, BEGIN_MARKERS[i]);
    if (s && (size_t)(s - text) < best) { best = (size_t)(s - text); *form = i; }
  }
  return best;
}

static int parse_any(const char *text, size_t len, int partial, size_t *content_len, di_tool_call **calls) {
  *calls = NULL;
  *content_len = len;
  int form = -1;
  size_t at = markup_start(text, len, &form);
  if (form < 0) return 0;
  int n = form == 0 ? parse_v3(text, len, at, partial, calls) : di_tool_calls_parse_dsml(text, len, at, partial, calls);
  if (n < 0) return -1;
  if (partial) *content_len = at;
  if (n == 0) { free(*calls); *calls = NULL; return 0; }
  /* the whole parse keeps only complete calls (a cut-off one is the last) */
  if (!partial && !(*calls)[n - 1].complete) {
    n--;
    free((*calls)[n].name);
    free((*calls)[n].arguments);
    if (n == 0) { free(*calls); *calls = NULL; return 0; }
  }
  *content_len = at;
  return n;
}

int di_tool_calls_parse(const char *text, size_t len, size_t *content_len, di_tool_call **calls) {
  return parse_any(text, len, 0, content_len, calls);
}

int di_tool_calls_parse_partial(const char *text, size_t len, size_t *content_len, di_tool_call **calls) {
  return parse_any(text, len, 1, content_len, calls);
}

size_t di_tool_calls_safe_prefix(const char *text, size_t len) {
  int form = -1;
  size_t end = markup_start(text, len, &form);
  if (form < 0) {
    /* the longest tail that is a proper prefix of a marker is held back */
    size_t hold = 0;
    for (int i = 0; i < N_BEGIN; i++) {
      size_t k = di_tc_partial_tail(text, len, BEGIN_MARKERS[i]);
      if (k > hold) hold = k;
    }
    end = len - hold;
  }
  while (end && is_space(text[end - 1])) end--;
  return end;
}
