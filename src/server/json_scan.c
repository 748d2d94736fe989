/* The streaming JSON pre-check (json_scan.h). One pass, one byte at a time, constant memory. UTF-8
 * is checked fully (no overlong forms, no surrogates, nothing above U+10FFFF) by narrowing the range
 * of the first continuation byte after E0, ED, F0 and F4 (RFC 3629's table). Strings are tracked
 * (with backslash escapes) so brackets and commas inside them are not counted. */
#include "server/json_scan.h"
#include <stdio.h>
#include <string.h>

void di_json_scan_init(di_json_scan *s, int max_depth, long long max_values) {
  memset(s, 0, sizeof *s);
  s->max_depth = max_depth;
  s->max_values = max_values;
  s->values = 1;
}

static int fail(di_json_scan *s, int status, size_t at, const char *what) {
  s->error_status = status;
  snprintf(s->error, sizeof s->error, "%s (at byte %zu of the request body)", what, at);
  return -1;
}

/* 0 ok, -1 invalid: one byte of UTF-8 outside ASCII */
static int utf8_byte(di_json_scan *s, unsigned char c) {
  if (s->utf8_need) {
    if (c < s->utf8_lo || c > s->utf8_hi) return -1;
    s->utf8_lo = 0x80;
    s->utf8_hi = 0xBF;
    s->utf8_need--;
    return 0;
  }
  if (c >= 0xC2 && c <= 0xDF) { s->utf8_need = 1; s->utf8_lo = 0x80; s->utf8_hi = 0xBF; return 0; }
  if (c >= 0xE0 && c <= 0xEF) {
    s->utf8_need = 2;
    s->utf8_lo = c == 0xE0 ? 0xA0 : 0x80;
    s->utf8_hi = c == 0xED ? 0x9F : 0xBF;
    return 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    s->utf8_need = 3;
    s->utf8_lo = c == 0xF0 ? 0x90 : 0x80;
    s->utf8_hi = c == 0xF4 ? 0x8F : 0xBF;
    return 0;
  }
  return -1; /* a stray continuation byte, C0, C1, F5..FF */
}

int di_json_scan_feed(di_json_scan *s, const char *p, size_t n) {
  if (s->error_status) return -1;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    size_t at = s->pos + i;
    if (c >= 0x80 || s->utf8_need) {
      if (c < 0x80 || utf8_byte(s, c) != 0) {
        char what[96];
        snprintf(what, sizeof what, "the request body is not valid UTF-8 (byte 0x%02x)", c);
        s->pos += i;
        return fail(s, 400, at, what);
      }
      s->escape = 0;
      continue;
    }
    if (s->in_string) {
      if (s->escape) s->escape = 0;
      else if (c == '\\') s->escape = 1;
      else if (c == '"') s->in_string = 0;
      continue;
    }
    switch (c) {
      case '"': s->in_string = 1; break;
      case '{': case '[':
        if (++s->depth > s->max_depth) {
          char what[96];
          snprintf(what, sizeof what, "the JSON body is nested deeper than %d levels", s->max_depth);
          s->pos += i;
          return fail(s, 400, at, what);
        }
        s->values += 2;
        break;
      case '}': case ']':
        if (s->depth > 0) s->depth--;
        break;
      case ',': s->values++; break;
      default: break;
    }
    if (s->values > s->max_values) {
      char what[128];
      snprintf(what, sizeof what, "the JSON body has more than %lld values", s->max_values);
      s->pos += i;
      return fail(s, 413, at, what);
    }
  }
  s->pos += n;
  return 0;
}

int di_json_scan_end(di_json_scan *s) {
  if (s->error_status) return -1;
  if (s->utf8_need) return fail(s, 400, s->pos, "the request body is not valid UTF-8 (it ends inside a character)");
  return 0;
}
