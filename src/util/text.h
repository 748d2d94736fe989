/* Small text helpers shared by the parsers (grammar front-ends, Jinja lexer, HTTP). */
#ifndef DI_UTIL_TEXT_H
#define DI_UTIL_TEXT_H
#include <stddef.h>
#include <stdint.h>

/* The value of a hexadecimal digit, or -1. */
/* The 1-based line and column of byte offset `at` in s[0..n) (parsers' error messages) */
static inline void di_text_line_col(const char *s, size_t n, size_t at, int *line, int *col) {
  int l = 1, c = 1;
  for (size_t k = 0; k < at && k < n; k++) {
    if (s[k] == '\n')
      l++, c = 1;
    else
      c++;
  }
  *line = l, *col = c;
}

static inline int di_hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Reads exactly nd hex digits at s[*i] (an escape's \xHH, \uHHHH, \UHHHHHHHH), advancing *i past
 * them. 0 when a digit is missing (*i then at it); -1 when the value is beyond U+10FFFF; else 1. */
static inline int di_parse_hex_escape(const char *s, size_t n, size_t *i, int nd, uint32_t *out) {
  uint32_t v = 0;
  for (int k = 0; k < nd; k++) {
    int h = *i < n ? di_hexval(s[*i]) : -1;
    if (h < 0)
      return 0;
    v = v * 16 + (uint32_t)h;
    (*i)++;
  }
  *out = v;
  return v > 0x10FFFF ? -1 : 1;
}

/* Reads the decimal number at s[*i] (s has n bytes), advancing *i past its digits; values above 1e6
 * read as 1e6 (repetition bounds: a larger bound is refused later by name). 0 (and *i unchanged)
 * when no digit is there. */
static inline int di_parse_decimal_capped(const char *s, size_t n, size_t *i, int *out) {
  if (*i >= n || s[*i] < '0' || s[*i] > '9')
    return 0;
  long v = 0;
  while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
    v = v * 10 + (s[(*i)++] - '0');
    if (v > 1000000)
      v = 1000000;
  }
  *out = (int)v;
  return 1;
}

/* Decodes the UTF-8 code point at s[*i] (s has n bytes) and advances *i past it; -1 (and *i
 * unchanged) when the sequence is malformed or truncated. Lead bytes are checked by form only
 * (no overlong or surrogate check). */
static inline int32_t di_utf8_decode(const char *s, size_t n, size_t *i) {
  const unsigned char *u = (const unsigned char *)s;
  unsigned c = u[*i];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (!len || *i + (size_t)len > n)
    return -1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 31) : len == 3 ? (c & 15) : (c & 7);
  for (int k = 1; k < len; k++) {
    if ((u[*i + (size_t)k] & 0xC0) != 0x80)
      return -1;
    cp = (cp << 6) | (u[*i + (size_t)k] & 63);
  }
  *i += (size_t)len;
  return (int32_t)cp;
}
#endif
