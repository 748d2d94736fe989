/* Decimal bounds for JSON numbers (see json_decimal.h). The fraction language is built digit by
 * digit: a digit above the lower bound's (or below the upper bound's) frees that side, an equal
 * digit keeps the rest of that bound, so each step shortens a bound; a bound compared after its
 * last digit is padded with zeros ("0.5" is "0.5000..."), which leaves four final cases: nothing
 * bounds the rest (any digits), the rest must not be all zeros (above an exclusive bound reached
 * exactly), the rest must be all zeros (at an inclusive upper bound), or nothing fits. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "grammar/json_decimal.h"

int di_decimal_from_double(double x, di_decimal *out) {
  x = fabs(x);
  if (!(x < 9e15))
    return 0;
  char buf[64];
  snprintf(buf, sizeof buf, "%.15f", x);
  char *dot = strchr(buf, '.');
  size_t n = strlen(dot + 1);
  while (n > 0 && dot[n] == '0')
    n--;
  *dot = 0;
  out->i = 0;
  for (const char *p = buf; *p; p++)
    out->i = out->i * 10 + (*p - '0');
  memcpy(out->f, dot + 1, n);
  out->f[n] = 0;
  return 1;
}

typedef struct {
  char *s;
  size_t n, cap;
  int over;
} sbuf;

static void put(sbuf *b, const char *t) {
  size_t k = strlen(t);
  if (b->n + k + 1 > b->cap) {
    b->over = 1;
    return;
  }
  memcpy(b->s + b->n, t, k + 1);
  b->n += k;
}

static void tail(sbuf *b, const char *one, int max_digits, int at_least_one) {
  char t[48];
  if (max_digits < 0)
    snprintf(t, sizeof t, "%s%s", one, at_least_one ? "+" : "*");
  else
    snprintf(t, sizeof t, "%s{%d,%d}", one, at_least_one ? 1 : 0, max_digits);
  put(b, t);
}

/* Nonempty digit strings d with lo <(=) 0.d <(=) hi, into b; *empty_ok: whether the empty string
 * (fraction zero) also fits. Returns 0 when no nonempty string fits. */
static int between(const char *lo, int lo_ex, const char *hi, int hi_ex, int md, sbuf *b, int *empty_ok) {
  if (lo && !*lo && !lo_ex)
    lo = NULL; /* at least zero: no bound */
  int lo_nonzero = lo && !*lo;            /* exclusive bound reached exactly: the rest must not be 0 */
  int hi_zero = hi && !*hi;               /* the rest must be 0 (or fits nothing when exclusive) */
  *empty_ok = !lo && (!hi || *hi || !hi_ex);
  if (!lo && !hi) {
    tail(b, "[0-9]", md, 1);
    return 1;
  }
  if (hi_zero) {
    if (hi_ex || lo) {
      *empty_ok = 0;
      return 0;
    }
    tail(b, "0", md, 1);
    return 1;
  }
  if (lo_nonzero && !hi) {
    put(b, md < 0 ? "[0-9]*[1-9][0-9]*" : "");
    if (md >= 0) {
      char t[48];
      snprintf(t, sizeof t, "0{0,%d}[1-9][0-9]{0,%d}", md, md);
      put(b, t);
    }
    return 1;
  }
  /* at least one bound has digits left: branch on the first digit */
  char lh = lo ? (*lo ? *lo : '0') : 0, hh = hi ? *hi : 0;
  const char *lrest = lo ? (*lo ? lo + 1 : lo) : NULL, *hrest = hi ? hi + 1 : NULL;
  int any = 0;
  put(b, "(?:");
  for (int c = '0'; c <= '9';) {
    /* the digits c..e that lead to the same remaining bounds */
    int lstate = !lo ? 0 : c > lh ? 0 : c == lh ? 1 : -1, hstate = !hi ? 0 : c < hh ? 0 : c == hh ? 1 : -1;
    int e = c;
    if (lstate == 0 && hstate == 0)
      while (e + 1 <= '9' && (!lo || e + 1 > lh) && (!hi || e + 1 < hh))
        e++;
    if (lstate >= 0 && hstate >= 0) {
      size_t mark = b->n;
      char cls[16];
      snprintf(cls, sizeof cls, c == e ? "%c" : "[%c-%c]", c, e);
      if (any)
        put(b, "|");
      put(b, cls);
      size_t after_digit = b->n;
      int sub_empty = 0;
      put(b, "(?:");
      int sub = between(lstate ? lrest : NULL, lo_ex, hstate ? hrest : NULL, hi_ex, md, b, &sub_empty);
      put(b, sub_empty ? ")?" : ")");
      if (!sub && sub_empty) { /* only the digit itself */
        b->n = after_digit;
        b->s[b->n] = 0;
      }
      if (!sub && !sub_empty) { /* nothing after this digit fits: drop it */
        b->n = mark;
        b->s[b->n] = 0;
      } else {
        any = 1;
      }
    }
    c = e + 1;
  }
  put(b, ")");
  return any;
}

int di_decimal_fraction_regex(const char *lo, int lo_ex, const char *hi, int hi_ex, int max_digits, char *out,
                              size_t cap) {
  char body[8192];
  sbuf b = {body, 0, sizeof body, 0};
  body[0] = 0;
  int empty_ok = 0;
  int some = between(lo, lo_ex, hi, hi_ex, max_digits, &b, &empty_ok);
  if (b.over)
    return -1;
  int n;
  if (!some)
    n = empty_ok ? snprintf(out, cap, "%s", "") : -2;
  else
    n = snprintf(out, cap, empty_ok ? "(\\.%s)?" : "\\.%s", body);
  if (n == -2)
    return 0;
  return n < 0 || (size_t)n >= cap ? -1 : 1;
}
