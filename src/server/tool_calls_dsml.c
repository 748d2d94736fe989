/* DeepSeek-V4's DSML tool calls (V3.2 names the block function_calls instead of tool_calls):
 *   <｜DSML｜tool_calls>
 *   <｜DSML｜invoke name="NAME">
 *   <｜DSML｜parameter name="KEY" string="true">VALUE</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 *   </｜DSML｜tool_calls>
 * Each call's parameters become the JSON object text {"KEY": VALUE, ...}: a string="true" value is
 * written as a JSON string (escaped here), any other as the JSON the model wrote. The object is built
 * left to right (a separator when the next parameter opens, "}" when the invoke closes), so the
 * partial text of a call being written is always a prefix of its final text: streamed deltas of it
 * reassemble exactly. Text between the tags (newlines) is ignored. */
#include "server/tool_calls.h"
#include <stdlib.h>
#include <string.h>

#define BAR "\xEF\xBD\x9C" /* U+FF5C, the fullwidth vertical bar of DeepSeek's markers */
#define INVOKE_OPEN "<" BAR "DSML" BAR "invoke name=\""
#define INVOKE_CLOSE "</" BAR "DSML" BAR "invoke>"
#define PARAM_OPEN "<" BAR "DSML" BAR "parameter name=\""
#define PARAM_CLOSE "</" BAR "DSML" BAR "parameter>"
#define BLOCK_CLOSE_PREFIX "</" BAR "DSML" BAR

typedef struct buf { char *p; size_t len, cap; int oom; } buf;

static void put(buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    char *q = realloc(b->p, cap);
    if (!q) { b->oom = 1; return; }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

/* JSON string escaping byte by byte (UTF-8 passes through), so a prefix escapes to a prefix */
static void put_escaped(buf *b, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[8];
    if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; put(b, e, 2); }
    else if (c == '\n') put(b, "\\n", 2);
    else if (c == '\r') put(b, "\\r", 2);
    else if (c == '\t') put(b, "\\t", 2);
    else if (c < 0x20) {
      static const char hex[] = "0123456789abcdef";
      memcpy(e, "\\u00", 4);
      e[4] = hex[c >> 4];
      e[5] = hex[c & 15];
      put(b, e, 6);
    } else put(b, (const char *)&c, 1);
  }
}

/* One invoke's body after its name tag, b[0..n) (up to INVOKE_CLOSE when complete): its
 * parameters as JSON object text (closed with "}" only when complete). */
static void build_args(const char *b, size_t n, int complete, buf *out) {
  /* an open invoke's body ends before what may be the start of its close tag: the whole parse ends
   * the body at that tag, so without holding it back a key or tag being written could take bytes
   * the final body does not have (two inputs of session 10's fuzz run, fuzz/corpus/tool_calls) */
  if (!complete) n -= di_tc_partial_tail(b, n, INVOKE_CLOSE);
  put(out, "{", 1);
  int first = 1;
  const char *p = b, *end = b + n;
  for (;;) {
    const char *po = di_tc_find(p, (size_t)(end - p), PARAM_OPEN);
    if (!po) break;
    const char *key = po + strlen(PARAM_OPEN);
    const char *kq = memchr(key, '"', (size_t)(end - key));
    if (!kq) break; /* the key is still being written */
    const char *tag_end = memchr(kq, '>', (size_t)(end - kq));
    if (!tag_end) break;
    int is_string = di_tc_find(kq, (size_t)(tag_end - kq), "string=\"true\"") != NULL;
    const char *v = tag_end + 1;
    const char *pc = di_tc_find(v, (size_t)(end - v), PARAM_CLOSE);
    /* an unclosed value ends before what may be the start of its close tag, or, while the invoke is
     * open, of the invoke's close tag (the whole parse ends the body there: without holding that
     * back, a prefix's value could hold bytes the final one does not) */
    size_t avail = (size_t)(end - v), tail = di_tc_partial_tail(v, avail, PARAM_CLOSE);
    if (!complete && di_tc_partial_tail(v, avail, INVOKE_CLOSE) > tail) tail = di_tc_partial_tail(v, avail, INVOKE_CLOSE);
    size_t vn = pc ? (size_t)(pc - v) : avail - tail;
    if (!first) put(out, ", ", 2);
    first = 0;
    put(out, "\"", 1);
    put_escaped(out, key, (size_t)(kq - key));
    put(out, "\": ", 3);
    if (is_string) {
      put(out, "\"", 1);
      put_escaped(out, v, vn);
      if (pc) put(out, "\"", 1);
    } else {
      put(out, v, vn);
    }
    if (!pc) return;
    p = pc + strlen(PARAM_CLOSE);
  }
  if (complete) put(out, "}", 1);
}

int di_tool_calls_parse_dsml(const char *text, size_t len, size_t at, int partial, di_tool_call **calls) {
  int n = 0, cap = 0;
  const char *p = text + at, *end = text + len;
  for (;;) {
    const char *io = di_tc_find(p, (size_t)(end - p), INVOKE_OPEN);
    if (!io) break;
    /* the block closing before this invoke ends the calls */
    const char *bc = di_tc_find(p, (size_t)(io - p), BLOCK_CLOSE_PREFIX "tool_calls>");
    if (!bc) bc = di_tc_find(p, (size_t)(io - p), BLOCK_CLOSE_PREFIX "function_calls>");
    if (bc) break;
    const char *name = io + strlen(INVOKE_OPEN);
    const char *nq = memchr(name, '"', (size_t)(end - name));
    const char *tag_end = nq ? memchr(nq, '>', (size_t)(end - nq)) : NULL;
    if (!tag_end) break; /* the name is still being written */
    const char *body = tag_end + 1;
    const char *ic = di_tc_find(body, (size_t)(end - body), INVOKE_CLOSE);
    if (!ic && !partial) break;
    if (nq > name) {
      buf args = {0};
      size_t bn = ic ? (size_t)(ic - body) : (size_t)(end - body);
      build_args(body, bn, ic != NULL, &args);
      if (args.oom || di_tc_push(calls, &n, &cap, di_tc_dup(name, (size_t)(nq - name)), args.p ? args.p : di_tc_dup("", 0),
                                 ic != NULL) != 0) {
        if (args.oom) free(args.p);
        di_tool_calls_free(*calls, n);
        *calls = NULL;
        return -1;
      }
    }
    if (!ic) break;
    p = ic + strlen(INVOKE_CLOSE);
  }
  return n;
}
