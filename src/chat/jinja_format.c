/* Python's printf-style string formatting (`'%s and %d' % (a, b)`, Jinja's `format` filter):
 * conversions s r a d i u f F e E g G x X o c %, flags - + space 0 #, width and precision
 * (numbers or *), and %(key)s with a mapping. Numbers go through C's printf, which spells them
 * as Python does for these conversions. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "chat/jinja.h"
#include "util/json.h"

static di_status fmt_err(struct jj_ctx *c, const jnode *at, const char *msg) {
  return jj_err(c, at, DI_ERR_INVALID_ARG, "string formatting: %s", msg);
}

/* Pads `s` (n bytes, `cps` code points) to `width` code points. */
static void pad(jj_buf *b, const char *s, size_t n, size_t cps, int width, int left, char fill) {
  size_t w = width > 0 ? (size_t)width : 0;
  if (!left)
    for (size_t k = cps; k < w; k++) jj_buf_putc(b, fill);
  jj_buf_put(b, s, n);
  if (left)
    for (size_t k = cps; k < w; k++) jj_buf_putc(b, ' ');
}

di_status jj_format(struct jj_ctx *c, const jnode *at, jv fmt, jv args, jv *out) {
  jj_buf b = {.limit = jj_ctx_out_limit(c)};
  const char *p = fmt.u.s.p;
  size_t n = fmt.u.s.n, i = 0, argi = 0;
  int tuple = args.kind == JV_LIST && args.tuple == JV_SEQ_TUPLE, mapping = args.kind == JV_DICT;
  size_t nargs = tuple ? args.u.l->n : 1;
  int used_mapping = 0;
  di_status st = DI_OK;
#define NEXT_ARG(dst)                                                                          \
  do {                                                                                         \
    if (argi >= nargs) { st = fmt_err(c, at, "not enough arguments for format string"); goto done; } \
    (dst) = tuple ? args.u.l->v[argi] : args;                                                  \
    argi++;                                                                                    \
  } while (0)
  while (i < n) {
    if (p[i] != '%') {
      jj_buf_putc(&b, p[i++]);
      continue;
    }
    i++;
    if (i >= n) { st = fmt_err(c, at, "incomplete format"); goto done; }
    jv val = jv_undef();
    int have_val = 0;
    if (p[i] == '(') { /* %(key)s */
      size_t k = ++i;
      int depth = 1;
      while (i < n && depth) { if (p[i] == '(') depth++; else if (p[i] == ')') depth--; if (depth) i++; }
      if (i >= n) { st = fmt_err(c, at, "incomplete format key"); goto done; }
      if (!mapping) { st = fmt_err(c, at, "format requires a mapping"); goto done; }
      jv *v = jj_dict_gets(args.u.d, p + k, i - k);
      if (!v) { st = jj_err(c, at, DI_ERR_INVALID_ARG, "string formatting: missing key '%.*s'", (int)(i - k), p + k); goto done; }
      val = *v;
      have_val = 1;
      used_mapping = 1;
      i++;
    }
    int left = 0, plus = 0, space = 0, zero = 0, alt = 0;
    for (; i < n && strchr("-+ 0#", p[i]); i++) {
      if (p[i] == '-') left = 1;
      else if (p[i] == '+') plus = 1;
      else if (p[i] == ' ') space = 1;
      else if (p[i] == '0') zero = 1;
      else alt = 1;
    }
    int width = -1, prec = -1;
    if (i < n && p[i] == '*') {
      jv w;
      NEXT_ARG(w);
      if (w.kind != JV_INT) { st = fmt_err(c, at, "* wants int"); goto done; }
      /* the magnitude is checked before it is negated or narrowed (INT64_MIN, 2^40 both overflow) */
      if (w.u.i > 100000 || w.u.i < -100000) { st = fmt_err(c, at, "width or precision too large"); goto done; }
      width = (int)(w.u.i < 0 ? -w.u.i : w.u.i);
      if (w.u.i < 0) left = 1;
      i++;
    } else
      /* digits saturate past the limit below (a run of 60 nines overflowed int: fuzz finding
         crash-chat_template-541353a7208a9a4e) */
      for (width = -1; i < n && p[i] >= '0' && p[i] <= '9'; i++)
        width = width > 100000 ? width : (width < 0 ? 0 : width) * 10 + (p[i] - '0');
    if (i < n && p[i] == '.') {
      i++;
      prec = 0;
      if (i < n && p[i] == '*') {
        jv w;
        NEXT_ARG(w);
        if (w.kind != JV_INT) { st = fmt_err(c, at, "* wants int"); goto done; }
        if (w.u.i > 1000) { st = fmt_err(c, at, "width or precision too large"); goto done; }
        prec = (int)(w.u.i < 0 ? 0 : w.u.i);
        i++;
      } else
        for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) prec = prec > 1000 ? prec : prec * 10 + (p[i] - '0');
    }
    if (width > 100000 || prec > 1000) { st = fmt_err(c, at, "width or precision too large"); goto done; }
    for (; i < n && (p[i] == 'h' || p[i] == 'l' || p[i] == 'L'); i++) {}
    if (i >= n) { st = fmt_err(c, at, "incomplete format"); goto done; }
    char conv = p[i++];
    if (conv == '%') {
      jj_buf_putc(&b, '%');
      continue;
    }
    if (!have_val) NEXT_ARG(val);
    if (conv == 's' || conv == 'r' || conv == 'a') {
      jj_buf t = {.limit = jj_ctx_out_limit(c)};
      if (conv == 's') jj_to_str(&t, val);
      else jj_repr(&t, val);
      size_t len = t.n, cps;
      const char *s = t.p ? t.p : "";
      if (prec >= 0) { /* precision truncates to that many code points */
        size_t k = 0, cnt = 0;
        while (k < len && cnt < (size_t)prec) { jj_utf8_next(s, len, &k); cnt++; }
        len = k;
      }
      cps = jj_utf8_len(s, len);
      pad(&b, s, len, cps, width, left, ' ');
      jj_buf_free(&t);
      continue;
    }
    if (conv == 'c') {
      jj_buf t = {0};
      if (val.kind == JV_INT && val.u.i >= 0 && val.u.i <= 0x10ffff) jj_utf8_put(&t, (uint32_t)val.u.i);
      else if (val.kind == JV_STR && jj_utf8_len(val.u.s.p, val.u.s.n) == 1) jj_buf_put(&t, val.u.s.p, val.u.s.n);
      else { jj_buf_free(&t); st = fmt_err(c, at, "%c requires an int or a single character"); goto done; }
      pad(&b, t.p, t.n, 1, width, left, ' ');
      jj_buf_free(&t);
      continue;
    }
    if (!strchr("diuxXofFeEgG", conv)) {
      st = jj_err(c, at, DI_ERR_INVALID_ARG, "string formatting: unsupported format character '%c'", conv);
      goto done;
    }
    int isnum = val.kind == JV_INT || val.kind == JV_BOOL || val.kind == JV_FLOAT;
    if (!isnum) {
      st = jj_err(c, at, DI_ERR_INVALID_ARG, "string formatting: %%%c format: a real number is required, not %s", conv,
                  jj_kind_name(val));
      goto done;
    }
    char spec[32], tmp[1100];
    int k = 0;
    spec[k++] = '%';
    if (left) spec[k++] = '-';
    if (plus) spec[k++] = '+';
    if (space) spec[k++] = ' ';
    if (zero && !left) spec[k++] = '0';
    if (alt && conv != 'o' && conv != 'x' && conv != 'X') spec[k++] = '#';
    k += snprintf(spec + k, sizeof spec - (size_t)k, "%d", width > 0 ? width : 0);
    if (prec >= 0) k += snprintf(spec + k, sizeof spec - (size_t)k, ".%d", prec);
    if (strchr("diuxXo", conv)) {
      if (val.kind == JV_FLOAT && (isnan(val.u.f) || isinf(val.u.f))) { st = fmt_err(c, at, "cannot convert float NaN or infinity to integer"); goto done; }
      int64_t ix = val.kind == JV_FLOAT ? 0 : val.u.i;
      if (val.kind == JV_FLOAT && !di_double_to_int_in(val.u.f, -9.2e18, 9.2e18, &ix)) {
        st = fmt_err(c, at, "float too large to convert to an integer format");
        goto done;
      }
      long long x = ix;
      if ((conv == 'x' || conv == 'X' || conv == 'o') && (x < 0 || alt)) {
        /* Python: sign before the 0x/0o prefix, on the magnitude */
        char digits[64];
        unsigned long long mag = x < 0 ? (unsigned long long)(-(x + 1)) + 1 : (unsigned long long)x;
        snprintf(digits, sizeof digits, conv == 'o' ? "%llo" : conv == 'x' ? "%llx" : "%llX", mag);
        char num[80];
        snprintf(num, sizeof num, "%s%s%s", x < 0 ? "-" : plus ? "+" : space ? " " : "",
                 alt ? (conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X") : "", digits);
        pad(&b, num, strlen(num), strlen(num), width, left, ' ');
        continue;
      }
      strcpy(spec + k, conv == 'i' || conv == 'u' ? "lld" : conv == 'd' ? "lld" : conv == 'o' ? "llo" : conv == 'x' ? "llx" : "llX");
      snprintf(tmp, sizeof tmp, spec, x);
    } else {
      double fx = val.kind == JV_FLOAT ? val.u.f : (double)val.u.i;
      spec[k++] = conv;
      spec[k] = 0;
      snprintf(tmp, sizeof tmp, spec, fx);
    }
    jj_buf_puts(&b, tmp);
  }
  /* Python skips this check when the argument is a mapping-like object (a list or dict; not a
   * tuple or str) */
  int getitem_arg = !tuple && (jv_subscriptable(args) || args.kind == JV_DICT || args.kind == JV_UNDEF);
  if (!used_mapping && argi < nargs && !getitem_arg) {
    st = fmt_err(c, at, "not all arguments converted during string formatting");
    goto done;
  }
done:
#undef NEXT_ARG
  if (st != DI_OK) {
    jj_buf_free(&b);
    return st;
  }
  if (b.failed) {
    jj_buf_free(&b);
    return jj_err(c, at, DI_ERR_OOM, "the output is too large");
  }
  *out = jj_str_dup(jj_ctx_arena(c), b.p ? b.p : "", b.n);
  jj_buf_free(&b);
  return out->kind == JV_STR ? DI_OK : jj_err(c, at, DI_ERR_OOM, "out of memory");
}
