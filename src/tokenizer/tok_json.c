/* A purpose-built scanner for tokenizer.json: cJSON needs ~100 ms and 400k allocations for the
 * DeepSeek-V3 vocab and merges, so those two arrays are decoded straight from the text here, and
 * only the small remaining values (normalizer, added_tokens, ...) go through cJSON. Errors name the
 * byte offset. */
#include "tokenizer/tok_json.h"
#include "tokenizer/unicode.h"
#include <stddef.h>
#include <stdio.h>

static void ws(di_jscan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
    s->p++;
}

static di_status fail(di_jscan *s, const char *msg) {
  return di_error_set(DI_ERR_FORMAT, "%s: %s at byte %zu", s->what, msg, (size_t)(s->p - s->begin));
}

static int hex4(const char *p, uint32_t *v) {
  uint32_t x = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0)
      return -1;
    x = x * 16 + (uint32_t)d;
  }
  *v = x;
  return 0;
}

di_status di_jscan_string(di_jscan *s, di_buf *out) {
  ws(s);
  if (s->p >= s->end || *s->p != '"')
    return fail(s, "expected a string");
  s->p++;
  for (;;) {
    const char *q = s->p;
    while (q < s->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
      q++;
    if (q > s->p && di_buf_append(out, s->p, (size_t)(q - s->p)))
      return di_error_set(DI_ERR_OOM, "%s: out of memory", s->what);
    s->p = q;
    if (q >= s->end)
      return fail(s, "unterminated string");
    if (*q == '"') {
      s->p++;
      break;
    }
    if ((unsigned char)*q < 0x20)
      return fail(s, "control character in a string");
    /* escape */
    if (q + 1 >= s->end)
      return fail(s, "unterminated escape");
    char e = q[1];
    s->p = q + 2;
    char c;
    switch (e) {
    case '"': c = '"'; break;
    case '\\': c = '\\'; break;
    case '/': c = '/'; break;
    case 'b': c = '\b'; break;
    case 'f': c = '\f'; break;
    case 'n': c = '\n'; break;
    case 'r': c = '\r'; break;
    case 't': c = '\t'; break;
    case 'u': {
      uint32_t v;
      if (s->end - s->p < 4 || hex4(s->p, &v))
        return fail(s, "bad \\u escape");
      s->p += 4;
      if (v >= 0xD800 && v <= 0xDBFF) {
        uint32_t lo;
        if (s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u' && !hex4(s->p + 2, &lo) && lo >= 0xDC00 &&
            lo <= 0xDFFF) {
          s->p += 6;
          v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        } else {
          v = 0xFFFD; /* lone surrogate: as serde_json would refuse; keep going with U+FFFD */
        }
      } else if (v >= 0xDC00 && v <= 0xDFFF) {
        v = 0xFFFD;
      }
      char u[4];
      int l = di_utf8_encode(v, u);
      if (di_buf_append(out, u, (size_t)l))
        return di_error_set(DI_ERR_OOM, "%s: out of memory", s->what);
      continue;
    }
    default:
      s->p = q;
      return fail(s, "bad escape in a string");
    }
    if (di_buf_putc(out, c))
      return di_error_set(DI_ERR_OOM, "%s: out of memory", s->what);
  }
  return DI_OK;
}

di_status di_jscan_int(di_jscan *s, int64_t *v) {
  ws(s);
  const char *q = s->p;
  int neg = 0;
  if (q < s->end && *q == '-')
    neg = 1, q++;
  if (q >= s->end || *q < '0' || *q > '9')
    return fail(s, "expected an integer");
  int64_t x = 0;
  while (q < s->end && *q >= '0' && *q <= '9') {
    if (x > (INT64_MAX - 9) / 10)
      return fail(s, "integer too large");
    x = x * 10 + (*q - '0');
    q++;
  }
  if (q < s->end && (*q == '.' || *q == 'e' || *q == 'E'))
    return fail(s, "expected an integer");
  s->p = q;
  *v = neg ? -x : x;
  return DI_OK;
}

/* Skips any value (depth-limited). */
static di_status skip_value(di_jscan *s, int depth) {
  ws(s);
  if (s->p >= s->end)
    return fail(s, "unexpected end of input");
  if (depth > 64)
    return fail(s, "nesting too deep");
  char c = *s->p;
  if (c == '"') {
    /* find the closing quote: one preceded by an even number of backslashes */
    const char *q = s->p + 1;
    for (;;) {
      q = q < s->end ? memchr(q, '"', (size_t)(s->end - q)) : NULL;
      if (!q) {
        return fail(s, "unterminated string");
      }
      size_t bs = 0;
      while (q - bs > s->p + 1 && q[-1 - (ptrdiff_t)bs] == '\\')
        bs++;
      if (bs % 2 == 0)
        break;
      q++;
    }
    s->p = q + 1;
    return DI_OK;
  }
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == close) {
      s->p++;
      return DI_OK;
    }
    for (;;) {
      if (c == '{') {
        DI_TRY(skip_value(s, depth + 1)); /* key */
        ws(s);
        if (s->p >= s->end || *s->p != ':')
          return fail(s, "expected ':'");
        s->p++;
      }
      DI_TRY(skip_value(s, depth + 1));
      ws(s);
      if (s->p < s->end && *s->p == ',') {
        s->p++;
        continue;
      }
      if (s->p < s->end && *s->p == close) {
        s->p++;
        return DI_OK;
      }
      return fail(s, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
  /* number, true, false, null */
  const char *q = s->p;
  while (q < s->end && (isalnum_ascii(*q) || *q == '-' || *q == '+' || *q == '.'))
    q++;
  if (q == s->p)
    return fail(s, "unexpected character");
  s->p = q;
  return DI_OK;
}

di_status di_jscan_value_extent(di_jscan *s, const char **start, size_t *len) {
  ws(s);
  const char *a = s->p;
  DI_TRY(skip_value(s, 0));
  *start = a;
  *len = (size_t)(s->p - a);
  return DI_OK;
}

di_status di_jscan_expect(di_jscan *s, char c) {
  ws(s);
  if (s->p >= s->end || *s->p != c) {
    char msg[32];
    snprintf(msg, sizeof msg, "expected '%c'", c);
    return fail(s, msg);
  }
  s->p++;
  return DI_OK;
}

/* After an element: returns 1 if another follows (consumed ','), 0 at the closing bracket
 * (consumed), or an error. */
di_status di_jscan_next(di_jscan *s, char close, int *more) {
  ws(s);
  if (s->p < s->end && *s->p == ',') {
    s->p++;
    *more = 1;
    return DI_OK;
  }
  if (s->p < s->end && *s->p == close) {
    s->p++;
    *more = 0;
    return DI_OK;
  }
  char msg[40];
  snprintf(msg, sizeof msg, "expected ',' or '%c'", close);
  return fail(s, msg);
}

int di_jscan_peek(di_jscan *s, char c) {
  ws(s);
  return s->p < s->end && *s->p == c;
}
