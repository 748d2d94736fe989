/* One character of a quoted grammar literal (see literal_char.h). */
#include <string.h>
#include "grammar/literal_char.h"
#include "util/text.h"

di_lit_result di_read_literal_char(const char *s, size_t n, size_t *i, const char *self_escaping, int32_t *cp,
                                   int *hex_digits) {
  if (s[*i] != '\\') {
    *cp = di_utf8_decode(s, n, i);
    return *cp < 0 ? DI_LIT_BAD_UTF8 : DI_LIT_OK;
  }
  if (++*i >= n)
    return DI_LIT_UNFINISHED;
  char e = s[(*i)++];
  int digits = 0;
  switch (e) {
  case 'n': *cp = '\n'; return DI_LIT_OK;
  case 't': *cp = '\t'; return DI_LIT_OK;
  case 'r': *cp = '\r'; return DI_LIT_OK;
  case 'f': *cp = '\f'; return DI_LIT_OK;
  case 'v': *cp = '\v'; return DI_LIT_OK;
  case '0': *cp = 0; return DI_LIT_OK;
  case '\\': case '"': case '\'': *cp = (unsigned char)e; return DI_LIT_OK;
  case 'x': digits = 2; break;
  case 'u': digits = 4; break;
  case 'U': digits = 8; break;
  default:
    if (e && self_escaping && strchr(self_escaping, e)) {
      *cp = (unsigned char)e;
      return DI_LIT_OK;
    }
    return DI_LIT_UNKNOWN;
  }
  uint32_t v = 0;
  *hex_digits = digits;
  int ok = di_parse_hex_escape(s, n, i, digits, &v);
  if (ok <= 0)
    return ok == 0 ? DI_LIT_BAD_HEX : DI_LIT_RANGE;
  *cp = (int32_t)v;
  return DI_LIT_OK;
}
