/* JSON text helpers for the JSON Schema front-end: the canonical compact serialisation that
 * generation writes for enum/const literals (Python json.dumps(separators=(",", ":"),
 * ensure_ascii=False) with integral numbers as integers), and grammar rules for integer ranges. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/json_text.h"

void di_sbuf_put(di_sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 64;
    while (nc < b->n + n + 1)
      nc *= 2;
    char *q = realloc(b->p, nc);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = nc;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static void sb_str(di_sbuf *b, const char *s) { di_sbuf_put(b, s, strlen(s)); }

void di_sbuf_json_string(di_sbuf *b, const char *s) {
  di_sbuf_put(b, "\"", 1);
  for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
    char e[8];
    switch (*u) {
    case '"': di_sbuf_put(b, "\\\"", 2); break;
    case '\\': di_sbuf_put(b, "\\\\", 2); break;
    case '\b': di_sbuf_put(b, "\\b", 2); break;
    case '\f': di_sbuf_put(b, "\\f", 2); break;
    case '\n': di_sbuf_put(b, "\\n", 2); break;
    case '\r': di_sbuf_put(b, "\\r", 2); break;
    case '\t': di_sbuf_put(b, "\\t", 2); break;
    default:
      if (*u < 0x20) {
        snprintf(e, sizeof e, "\\u%04x", *u);
        di_sbuf_put(b, e, 6);
      } else {
        di_sbuf_put(b, (const char *)u, 1);
      }
    }
  }
  di_sbuf_put(b, "\"", 1);
}

static void sb_number(di_sbuf *b, double v) {
  char t[64];
  if (v == floor(v) && fabs(v) < 1e300) {
    snprintf(t, sizeof t, "%.0f", v);
    if (strcmp(t, "-0") == 0)
      strcpy(t, "0");
  } else {
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(t, sizeof t, "%.*g", prec, v);
      if (strtod(t, NULL) == v)
        break;
    }
  }
  sb_str(b, t);
}

void di_sbuf_json(di_sbuf *b, const cJSON *j) {
  if (cJSON_IsNull(j))
    sb_str(b, "null");
  else if (cJSON_IsTrue(j))
    sb_str(b, "true");
  else if (cJSON_IsFalse(j))
    sb_str(b, "false");
  else if (cJSON_IsNumber(j))
    sb_number(b, j->valuedouble);
  else if (cJSON_IsString(j))
    di_sbuf_json_string(b, j->valuestring);
  else if (cJSON_IsArray(j)) {
    di_sbuf_put(b, "[", 1);
    for (const cJSON *e = j->child; e; e = e->next) {
      di_sbuf_json(b, e);
      if (e->next)
        di_sbuf_put(b, ",", 1);
    }
    di_sbuf_put(b, "]", 1);
  } else if (cJSON_IsObject(j)) {
    di_sbuf_put(b, "{", 1);
    for (const cJSON *e = j->child; e; e = e->next) {
      di_sbuf_json_string(b, e->string);
      di_sbuf_put(b, ":", 1);
      di_sbuf_json(b, e);
      if (e->next)
        di_sbuf_put(b, ",", 1);
    }
    di_sbuf_put(b, "}", 1);
  }
}

static int ndigits(uint64_t v) {
  int n = 1;
  while (v >= 10)
    v /= 10, n++;
  return n;
}

static void digit_class(di_gb *b, di_gseq *s, int lo, int hi) {
  di_gbyteset set = {{0}};
  for (int d = lo; d <= hi; d++)
    di_gbyteset_add(&set, (unsigned)('0' + d));
  di_gseq_push(b, s, (di_gel){DI_GE_CLASS, di_gb_class(b, &set)});
}

static int all_digit(const char *s, int len, char d) {
  for (int i = 0; i < len; i++)
    if (s[i] != d)
      return 0;
  return 1;
}

/* pre, then a digit in [d0, d1], then `rest` free digits, as one alternative of `rule`. */
static void span_alt(di_gb *b, int rule, const di_gseq *s, int d0, int d1, int rest) {
  di_gseq t = {0};
  for (int i = 0; i < s->n; i++)
    di_gseq_push(b, &t, s->v[i]);
  digit_class(b, &t, d0, d1);
  for (int i = 0; i < rest; i++)
    digit_class(b, &t, 0, 9);
  di_gb_add_alt(b, rule, t.v, t.n);
  di_gseq_free(&t);
}

/* Adds to `rule` alternatives for the fixed-length digit strings x..y (both `len` digits, leading
 * zeros allowed), prefixed by `pre`. The alternatives are disjoint in their first differing digit
 * and a free tail is written as digit classes, so there are O(len) of them (splitting every digit
 * into "x0 ...", "middle", "y0 ..." without merging full tails made 2^len alternatives, all alive
 * in parallel at the first digit: "too ambiguous" for 15-digit bounds). */
static void fixed_range(di_gb *b, int rule, const di_gseq *pre, const char *x, const char *y, int len) {
  if (len == 0) {
    di_gb_add_alt(b, rule, pre->v, pre->n);
    return;
  }
  di_gseq s = {0};
  for (int i = 0; i < pre->n; i++)
    di_gseq_push(b, &s, pre->v[i]);
  int x0 = x[0] - '0', y0 = y[0] - '0';
  if (x0 == y0) {
    digit_class(b, &s, x0, x0);
    fixed_range(b, rule, &s, x + 1, y + 1, len - 1);
    di_gseq_free(&s);
    return;
  }
  int x_low = all_digit(x + 1, len - 1, '0'), y_high = all_digit(y + 1, len - 1, '9');
  char nines[24], zeros[24];
  memset(nines, '9', (size_t)len);
  memset(zeros, '0', (size_t)len);
  nines[len] = zeros[len] = 0;
  int n0 = s.n;
  if (!x_low) {
    digit_class(b, &s, x0, x0);
    fixed_range(b, rule, &s, x + 1, nines, len - 1);
    s.n = n0;
  }
  int m0 = x_low ? x0 : x0 + 1, m1 = y_high ? y0 : y0 - 1;
  if (m0 <= m1)
    span_alt(b, rule, &s, m0, m1, len - 1);
  if (!y_high) {
    digit_class(b, &s, y0, y0);
    fixed_range(b, rule, &s, zeros, y + 1, len - 1);
  }
  di_gseq_free(&s);
}

/* Alternatives for non-negative integers a..b (b < 0: unbounded) without leading zeros. */
static void nonneg_range(di_gb *b, int rule, const di_gseq *pre, uint64_t a, int64_t top) {
  int la = ndigits(a), lb = top < 0 ? la : ndigits((uint64_t)top);
  for (int L = la; L <= lb; L++) {
    uint64_t lo = L == 1 ? 0 : 1;
    for (int i = 1; i < L; i++)
      lo *= 10;
    uint64_t hi = lo ? lo * 10 - 1 : 9;
    if (L == 1)
      hi = 9;
    uint64_t x = a > lo ? a : lo, y = (top >= 0 && (uint64_t)top < hi) ? (uint64_t)top : hi;
    if (x > y)
      continue;
    char xs[24], ys[24];
    snprintf(xs, sizeof xs, "%0*llu", L, (unsigned long long)x);
    snprintf(ys, sizeof ys, "%0*llu", L, (unsigned long long)y);
    fixed_range(b, rule, pre, xs, ys, L);
  }
  if (top < 0) { /* more digits than a: [1-9][0-9]{la,} */
    di_gseq s = {0};
    for (int i = 0; i < pre->n; i++)
      di_gseq_push(b, &s, pre->v[i]);
    digit_class(b, &s, 1, 9);
    di_gbyteset set = {{0}};
    for (int d = '0'; d <= '9'; d++)
      di_gbyteset_add(&set, (unsigned)d);
    di_gseq_repeat(b, &s, (di_gel){DI_GE_CLASS, di_gb_class(b, &set)}, la, -1);
    di_gb_add_alt(b, rule, s.v, s.n);
    di_gseq_free(&s);
  }
}

void di_json_int_range(di_gb *b, int rule, int has_lo, int64_t lo, int has_hi, int64_t hi) {
  di_gseq pre = {0};
  if (!has_hi || hi >= 0) /* non-negative part */
    nonneg_range(b, rule, &pre, has_lo && lo > 0 ? (uint64_t)lo : 0, has_hi ? hi : -1);
  if (!has_lo || lo < 0) { /* negative part: "-" then 1.. */
    di_gseq_byte(b, &pre, '-');
    uint64_t a = has_hi && hi < 0 ? (uint64_t)(-hi) : 1;
    nonneg_range(b, rule, &pre, a, has_lo ? -lo : -1);
  }
  di_gseq_free(&pre);
}
