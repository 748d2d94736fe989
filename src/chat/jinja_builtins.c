/* Builtins of the Jinja subset: Jinja2's filters and tests that chat templates use, the Python
 * string and dict methods the sandbox allows, and the globals transformers defines (range,
 * namespace, dict, raise_exception, strftime_now). Anything else is reported by name. */
#include "chat/jinja.h"
#include "util/json.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

di_status jj_iter_items(struct jj_ctx *c, const jnode *at, jv v, jv_list **out);
di_status jj_contains(struct jj_ctx *c, const jnode *at, jv hay, jv needle, int *out);

#define A(c) jj_ctx_arena(c)

static di_status oom(struct jj_ctx *c, const jnode *at) { return jj_err(c, at, DI_ERR_OOM, "out of memory"); }

/* Argument `pos` (positional index) or keyword `name`; NULL when absent. */
static const jv *arg(const jj_args *a, int pos, const char *name) {
  if (pos >= 0 && pos < a->n) return &a->v[pos];
  for (int i = 0; i < a->nkw; i++)
    if (strcmp(a->kwn[i], name) == 0) return &a->kwv[i];
  return NULL;
}

static di_status check_args(struct jj_ctx *c, const jnode *at, const char *fname, const jj_args *a, int maxpos,
                            const char *const *kw) {
  if (a->n > maxpos) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s takes at most %d positional argument(s)", fname, maxpos);
  for (int i = 0; i < a->nkw; i++) {
    int ok = 0;
    for (int k = 0; kw && kw[k]; k++)
      if (strcmp(a->kwn[i], kw[k]) == 0) ok = 1;
    if (!ok) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s got an unexpected keyword argument '%s'", fname, a->kwn[i]);
  }
  return DI_OK;
}

static di_status buf_to_str(struct jj_ctx *c, const jnode *at, jj_buf *b, jv *out) {
  if (b->failed) { jj_buf_free(b); return oom(c, at); }
  *out = jj_str_dup(A(c), b->p ? b->p : "", b->n);
  jj_buf_free(b);
  return out->kind == JV_STR ? DI_OK : oom(c, at);
}

/* str(v) as a string value (Undefined gives ""). */
static di_status to_s(struct jj_ctx *c, const jnode *at, jv v, jv *out) {
  if (v.kind == JV_STR) { *out = v; return DI_OK; }
  jj_buf b = {.limit = jj_ctx_out_limit(c)};
  jj_to_str(&b, v);
  return buf_to_str(c, at, &b, out);
}

static int is_int(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL; }

/* ---- case mapping (ASCII, Latin-1, Greek, Cyrillic) ----------------------------------------- */
static uint32_t cp_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    int odd_pairs = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_pairs ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}
static uint32_t cp_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    int odd_pairs = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_pairs ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}
static int cp_is_upper(uint32_t c) { return cp_lower(c) != c; }
static int cp_is_lower(uint32_t c) { return cp_upper(c) != c || c == 0xdf; }
static int cp_cased(uint32_t c) { return cp_is_upper(c) || cp_is_lower(c); }

/* mode: 0 lower, 1 upper, 2 title, 3 capitalize */
static di_status case_map(struct jj_ctx *c, const jnode *at, jv s, int mode, jv *out) {
  jj_buf b = {.limit = jj_ctx_out_limit(c)};
  size_t i = 0;
  int prev_cased = 0, first = 1;
  while (i < s.u.s.n) {
    uint32_t cp = jj_utf8_next(s.u.s.p, s.u.s.n, &i);
    uint32_t r;
    int up = mode == 1 || (mode == 2 && !prev_cased) || (mode == 3 && first);
    r = up ? cp_upper(cp) : cp_lower(cp);
    prev_cased = cp_cased(cp);
    first = 0;
    if (cp == 0xdf && up) { /* ß: upper "SS", title "Ss" */
      jj_buf_puts(&b, mode == 1 ? "SS" : "Ss");
      continue;
    }
    jj_utf8_put(&b, r);
  }
  return buf_to_str(c, at, &b, out);
}

/* ---- string helpers ------------------------------------------------------------------------- */
static int in_chars(uint32_t cp, const jv *chars) {
  if (!chars || chars->kind == JV_NONE) return jj_py_isspace(cp);
  size_t i = 0;
  while (i < chars->u.s.n)
    if (jj_utf8_next(chars->u.s.p, chars->u.s.n, &i) == cp) return 1;
  return 0;
}

/* which: 1 left, 2 right, 3 both */
static di_status strip(struct jj_ctx *c, const jnode *at, jv s, const jv *chars, int which, jv *out) {
  if (chars && chars->kind != JV_NONE && chars->kind != JV_STR)
    return jj_err(c, at, DI_ERR_INVALID_ARG, "strip arg must be None or str");
  size_t st = 0, en = s.u.s.n;
  if (which & 1) {
    while (st < en) {
      size_t j = st;
      uint32_t cp = jj_utf8_next(s.u.s.p, en, &j);
      if (!in_chars(cp, chars)) break;
      st = j;
    }
  }
  if (which & 2) {
    while (en > st) {
      size_t k = en - 1;
      while (k > st && ((unsigned char)s.u.s.p[k] & 0xc0) == 0x80) k--;
      size_t j = k;
      uint32_t cp = jj_utf8_next(s.u.s.p, en, &j);
      if (j != en) { k = en - 1; cp = (unsigned char)s.u.s.p[k]; } /* invalid tail byte */
      if (!in_chars(cp, chars)) break;
      en = k;
    }
  }
  *out = jv_strn(s.u.s.p + st, en - st);
  return DI_OK;
}

static di_status push(struct jj_ctx *c, const jnode *at, jv_list *l, jv v) {
  return jj_list_push(A(c), l, v) ? oom(c, at) : DI_OK;
}

static jv list_val(jv_list *l, int tuple) {
  jv r = {0};
  r.kind = JV_LIST;
  r.tuple = (uint8_t)tuple;
  r.u.l = l;
  return r;
}

static di_status split(struct jj_ctx *c, const jnode *at, jv s, const jv *sep, const jv *maxsplit, int from_right, jv *out) {
  int64_t maxs = -1;
  if (maxsplit) {
    if (!is_int(*maxsplit)) return jj_err(c, at, DI_ERR_INVALID_ARG, "maxsplit must be an integer");
    maxs = maxsplit->u.i;
  }
  jv_list *l = jj_list_new(A(c), 0);
  if (!l) return oom(c, at);
  const char *p = s.u.s.p;
  size_t n = s.u.s.n;
  if (!sep || sep->kind == JV_NONE) {
    /* runs of whitespace; no empty strings */
    if (!from_right) {
      size_t i = 0;
      int64_t splits = 0;
      for (;;) {
        while (i < n) { size_t j = i; if (!jj_py_isspace(jj_utf8_next(p, n, &j))) break; i = j; }
        if (i >= n) break;
        if (maxs >= 0 && splits >= maxs) { /* the rest, trailing whitespace kept (as Python) */
          DI_TRY(push(c, at, l, jv_strn(p + i, n - i)));
          break;
        }
        size_t st = i;
        while (i < n) { size_t j = i; if (jj_py_isspace(jj_utf8_next(p, n, &j))) break; i = j; }
        DI_TRY(push(c, at, l, jv_strn(p + st, i - st)));
        splits++;
      }
    } else {
      /* rsplit(None, k): split from the right; collected reversed then flipped */
      size_t e = n;
      int64_t splits = 0;
      for (;;) {
        while (e > 0) { size_t k = e - 1; while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--; size_t j = k; if (!jj_py_isspace(jj_utf8_next(p, n, &j))) break; e = k; }
        if (e == 0) break;
        if (maxs >= 0 && splits >= maxs) { /* the rest, leading whitespace kept (as Python) */
          DI_TRY(push(c, at, l, jv_strn(p, e)));
          break;
        }
        size_t st = e;
        while (st > 0) { size_t k = st - 1; while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--; size_t j = k; if (jj_py_isspace(jj_utf8_next(p, n, &j))) break; st = k; }
        DI_TRY(push(c, at, l, jv_strn(p + st, e - st)));
        e = st;
        splits++;
      }
      for (size_t i = 0; i < l->n / 2; i++) { jv t = l->v[i]; l->v[i] = l->v[l->n - 1 - i]; l->v[l->n - 1 - i] = t; }
    }
    *out = list_val(l, 0);
    return DI_OK;
  }
  if (sep->kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "must be str or None, not %s", jj_kind_name(*sep));
  if (sep->u.s.n == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "empty separator");
  const char *q = sep->u.s.p;
  size_t m = sep->u.s.n;
  if (!from_right) {
    size_t st = 0;
    int64_t splits = 0;
    for (;;) {
      const char *hit = (maxs < 0 || splits < maxs) ? memmem(p + st, n - st, q, m) : NULL;
      if (!hit) { DI_TRY(push(c, at, l, jv_strn(p + st, n - st))); break; }
      DI_TRY(push(c, at, l, jv_strn(p + st, (size_t)(hit - (p + st)))));
      st = (size_t)(hit - p) + m;
      splits++;
    }
  } else {
    size_t e = n;
    int64_t splits = 0;
    for (;;) {
      const char *hit = NULL;
      if ((maxs < 0 || splits < maxs) && e >= m)
        for (size_t k = e - m + 1; k-- > 0;)
          if (memcmp(p + k, q, m) == 0) { hit = p + k; break; }
      if (!hit) { DI_TRY(push(c, at, l, jv_strn(p, e))); break; }
      DI_TRY(push(c, at, l, jv_strn(hit + m, e - (size_t)(hit - p) - m)));
      e = (size_t)(hit - p);
      splits++;
    }
    for (size_t i = 0; i < l->n / 2; i++) { jv t = l->v[i]; l->v[i] = l->v[l->n - 1 - i]; l->v[l->n - 1 - i] = t; }
  }
  *out = list_val(l, 0);
  return DI_OK;
}

static di_status replace(struct jj_ctx *c, const jnode *at, jv s, jv old, jv neu, int64_t count, jv *out) {
  if (old.kind != JV_STR || neu.kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "replace() arguments must be str");
  jj_buf b = {.limit = jj_ctx_out_limit(c)};
  const char *p = s.u.s.p;
  size_t n = s.u.s.n, i = 0;
  int64_t done = 0;
  if (old.u.s.n == 0) { /* Python inserts `new` before every character and at the end */
    while (i <= n) {
      if (count < 0 || done < count) { jj_buf_put(&b, neu.u.s.p, neu.u.s.n); done++; }
      if (i == n) break;
      size_t j = i;
      jj_utf8_next(p, n, &j);
      jj_buf_put(&b, p + i, j - i);
      i = j;
    }
    return buf_to_str(c, at, &b, out);
  }
  while (i < n) {
    const char *hit = (count < 0 || done < count) ? memmem(p + i, n - i, old.u.s.p, old.u.s.n) : NULL;
    if (!hit) break;
    jj_buf_put(&b, p + i, (size_t)(hit - (p + i)));
    jj_buf_put(&b, neu.u.s.p, neu.u.s.n);
    i = (size_t)(hit - p) + old.u.s.n;
    done++;
  }
  jj_buf_put(&b, p + i, n - i);
  return buf_to_str(c, at, &b, out);
}

static int starts_ends(jv s, jv x, int ends) {
  if (x.u.s.n > s.u.s.n) return 0;
  return memcmp(ends ? s.u.s.p + s.u.s.n - x.u.s.n : s.u.s.p, x.u.s.p, x.u.s.n) == 0;
}

static di_status startswith(struct jj_ctx *c, const jnode *at, jv s, const jj_args *a, int ends, jv *out) {
  if (a->n != 1 || a->nkw) return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: %s with start/end arguments", ends ? "str.endswith" : "str.startswith");
  jv x = a->v[0];
  if (x.kind == JV_STR) { *out = jv_bool(starts_ends(s, x, ends)); return DI_OK; }
  if (x.kind == JV_LIST && x.tuple == JV_SEQ_TUPLE) {
    for (size_t i = 0; i < x.u.l->n; i++) {
      if (x.u.l->v[i].kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "tuple for startswith must only contain str");
      if (starts_ends(s, x.u.l->v[i], ends)) { *out = jv_bool(1); return DI_OK; }
    }
    *out = jv_bool(0);
    return DI_OK;
  }
  return jj_err(c, at, DI_ERR_INVALID_ARG, "%s first arg must be str or a tuple of str, not %s", ends ? "endswith" : "startswith", jj_kind_name(x));
}

static di_status join_items(struct jj_ctx *c, const jnode *at, jv_list *items, jv sep, int strict, jv *out) {
  jj_buf b = {.limit = jj_ctx_out_limit(c)};
  for (size_t i = 0; i < items->n; i++) {
    if (i) jj_buf_put(&b, sep.u.s.p, sep.u.s.n);
    if (strict && items->v[i].kind != JV_STR) {
      jj_buf_free(&b);
      return jj_err(c, at, DI_ERR_INVALID_ARG, "sequence item %zu: expected str instance, %s found", i, jj_kind_name(items->v[i]));
    }
    jj_to_str(&b, items->v[i]);
  }
  return buf_to_str(c, at, &b, out);
}

/* ---- methods -------------------------------------------------------------------------------- */
static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                          "upper", "lower", "title", "capitalize", "replace", "find", "rfind", "count",
                                          "join", "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower",
                                          "isupper", "removeprefix", "removesuffix", "format", "index", "center",
                                          "ljust", "rjust", "zfill", "encode", "partition", "rpartition", "casefold",
                                          "swapcase", "expandtabs", "format_map", "isnumeric", "isdecimal", "istitle", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", "pop", "popitem", "update",
                                           "setdefault", "clear", "fromkeys", NULL};
static const char *const LIST_METHODS[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                                           "index", "count", "copy", NULL};

static const char *find_name(const char *const *tab, const char *name, size_t n) {
  for (int i = 0; tab[i]; i++)
    if (strlen(tab[i]) == n && memcmp(tab[i], name, n) == 0) return tab[i];
  return NULL;
}

int jj_method_lookup(struct jj_ctx *c, jv obj, const char *name, size_t n, jv *out) {
  const char *m = NULL;
  if (obj.kind == JV_STR) m = find_name(STR_METHODS, name, n);
  else if (obj.kind == JV_DICT) m = find_name(DICT_METHODS, name, n);
  else if (obj.kind == JV_LIST && obj.tuple == JV_SEQ_LIST) m = find_name(LIST_METHODS, name, n);
  else if (obj.kind == JV_LIST && (obj.tuple == JV_SEQ_TUPLE || obj.tuple == JV_SEQ_RANGE)) {
    static const char *const seq_methods[] = {"index", "count", NULL};
    m = find_name(seq_methods, name, n);
  }
  if (!m) return 0;
  jv_func *fn = jj_alloc(A(c), sizeof *fn);
  if (!fn) return 0;
  fn->type = FN_METHOD;
  fn->name = m;
  fn->self = obj;
  jv r = {0};
  r.kind = JV_FUNC;
  r.u.fn = fn;
  *out = r;
  return 1;
}

static di_status str_find(struct jj_ctx *c, const jnode *at, jv s, const jj_args *a, int rev, int64_t *pos) {
  if (a->n != 1 || a->v[0].kind != JV_STR) return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: find with other than one str argument");
  jv x = a->v[0];
  const char *hit = NULL;
  if (!rev) hit = memmem(s.u.s.p, s.u.s.n, x.u.s.p, x.u.s.n);
  else if (x.u.s.n <= s.u.s.n)
    for (size_t k = s.u.s.n - x.u.s.n + 1; k-- > 0;)
      if (memcmp(s.u.s.p + k, x.u.s.p, x.u.s.n) == 0) { hit = s.u.s.p + k; break; }
  *pos = hit ? (int64_t)jj_utf8_len(s.u.s.p, (size_t)(hit - s.u.s.p)) : -1;
  return DI_OK;
}

static di_status str_method(struct jj_ctx *c, const jnode *at, const char *m, jv s, const jj_args *a, jv *out) {
  if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
    static const char *const kw[] = {"chars", NULL};
    DI_TRY(check_args(c, at, m, a, 1, kw));
    return strip(c, at, s, arg(a, 0, "chars"), m[0] == 's' ? 3 : m[0] == 'l' ? 1 : 2, out);
  }
  if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
    static const char *const kw[] = {"sep", "maxsplit", NULL};
    DI_TRY(check_args(c, at, m, a, 2, kw));
    return split(c, at, s, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), m[0] == 'r', out);
  }
  if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) return startswith(c, at, s, a, m[0] == 'e', out);
  if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
    DI_TRY(check_args(c, at, m, a, 0, NULL));
    return case_map(c, at, s, m[0] == 'l' ? 0 : m[0] == 'u' ? 1 : m[0] == 't' ? 2 : 3, out);
  }
  if (!strcmp(m, "replace")) {
    DI_TRY(check_args(c, at, m, a, 3, NULL));
    if (a->n < 2) return jj_err(c, at, DI_ERR_INVALID_ARG, "replace expected at least 2 arguments");
    int64_t cnt = -1;
    if (a->n == 3) {
      if (!is_int(a->v[2])) return jj_err(c, at, DI_ERR_INVALID_ARG, "replace count must be an integer");
      cnt = a->v[2].u.i;
    }
    return replace(c, at, s, a->v[0], a->v[1], cnt, out);
  }
  if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index")) {
    int64_t pos = -1;
    DI_TRY(str_find(c, at, s, a, m[0] == 'r', &pos));
    if (pos < 0 && m[0] == 'i') return jj_err(c, at, DI_ERR_INVALID_ARG, "substring not found");
    *out = jv_int(pos);
    return DI_OK;
  }
  if (!strcmp(m, "count")) {
    if (a->n != 1 || a->nkw || a->v[0].kind != JV_STR) return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: str.count with other than one str argument");
    jv x = a->v[0];
    int64_t cnt = 0;
    if (x.u.s.n == 0) cnt = (int64_t)jj_utf8_len(s.u.s.p, s.u.s.n) + 1;
    else
      for (size_t i = 0; i + x.u.s.n <= s.u.s.n;) {
        const char *hit = memmem(s.u.s.p + i, s.u.s.n - i, x.u.s.p, x.u.s.n);
        if (!hit) break;
        cnt++;
        i = (size_t)(hit - s.u.s.p) + x.u.s.n;
      }
    *out = jv_int(cnt);
    return DI_OK;
  }
  if (!strcmp(m, "join")) {
    if (a->n != 1 || a->nkw) return jj_err(c, at, DI_ERR_INVALID_ARG, "join takes exactly one argument");
    if (a->v[0].kind == JV_UNDEF) return jj_err(c, at, DI_ERR_INVALID_ARG, "can only join an iterable");
    jv_list *items = NULL;
    DI_TRY(jj_iter_items(c, at, a->v[0], &items));
    return join_items(c, at, items, s, 1, out);
  }
  if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
    if (a->n != 1 || a->v[0].kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s takes one str argument", m);
    int suf = m[6] == 's';
    jv x = a->v[0];
    *out = starts_ends(s, x, suf) ? jv_strn(suf ? s.u.s.p : s.u.s.p + x.u.s.n, s.u.s.n - x.u.s.n) : s;
    return DI_OK;
  }
  if (!strcmp(m, "splitlines")) {
    DI_TRY(check_args(c, at, m, a, 0, NULL));
    jv_list *l = jj_list_new(A(c), 0);
    if (!l) return oom(c, at);
    size_t i = 0, st = 0;
    while (i < s.u.s.n) {
      size_t j = i;
      uint32_t cp = jj_utf8_next(s.u.s.p, s.u.s.n, &j);
      int br = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 ||
               cp == 0x2028 || cp == 0x2029;
      if (br) {
        DI_TRY(push(c, at, l, jv_strn(s.u.s.p + st, i - st)));
        if (cp == '\r' && j < s.u.s.n && s.u.s.p[j] == '\n') j++;
        st = j;
      }
      i = j;
    }
    if (st < s.u.s.n) DI_TRY(push(c, at, l, jv_strn(s.u.s.p + st, s.u.s.n - st)));
    *out = list_val(l, 0);
    return DI_OK;
  }
  if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isalnum") || !strcmp(m, "isspace") ||
      !strcmp(m, "islower") || !strcmp(m, "isupper")) {
    DI_TRY(check_args(c, at, m, a, 0, NULL));
    size_t i = 0;
    int ok = s.u.s.n > 0, any_cased = 0;
    while (i < s.u.s.n && ok) {
      uint32_t cp = jj_utf8_next(s.u.s.p, s.u.s.n, &i);
      int dig = cp >= '0' && cp <= '9', alp = cp_cased(cp) || (cp >= 0x80 && cp > 0xff && !jj_py_isspace(cp));
      if (!strcmp(m, "isdigit")) ok = dig;
      else if (!strcmp(m, "isalpha")) ok = alp;
      else if (!strcmp(m, "isalnum")) ok = dig || alp;
      else if (!strcmp(m, "isspace")) ok = jj_py_isspace(cp);
      else if (!strcmp(m, "islower")) { if (cp_is_upper(cp)) ok = 0; if (cp_is_lower(cp)) any_cased = 1; }
      else { if (cp_is_lower(cp)) ok = 0; if (cp_is_upper(cp)) any_cased = 1; }
    }
    if (!strcmp(m, "islower") || !strcmp(m, "isupper")) ok = ok && any_cased;
    *out = jv_bool(ok);
    return DI_OK;
  }
  return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: the method str.%s", m);
}

di_status jj_call_method(struct jj_ctx *c, const jnode *at, const jv_func *fn, const jj_args *a, jv *out) {
  jv self = fn->self;
  const char *m = fn->name;
  if (self.kind == JV_STR) return str_method(c, at, m, self, a, out);
  if (self.kind == JV_DICT) {
    if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
      DI_TRY(check_args(c, at, m, a, 0, NULL));
      jv_list *l = jj_list_new(A(c), self.u.d->n);
      if (!l) return oom(c, at);
      for (size_t i = 0; i < self.u.d->n; i++) {
        jv v;
        if (m[0] == 'k') v = self.u.d->k[i];
        else if (m[0] == 'v') v = self.u.d->v[i];
        else {
          jv_list *p = jj_list_new(A(c), 2);
          if (!p) return oom(c, at);
          jj_list_push(A(c), p, self.u.d->k[i]);
          jj_list_push(A(c), p, self.u.d->v[i]);
          v = list_val(p, 1);
        }
        DI_TRY(push(c, at, l, v));
      }
      *out = list_val(l, m[0] == 'k' ? JV_SEQ_KEYS : m[0] == 'v' ? JV_SEQ_VALUES : JV_SEQ_ITEMS);
      return DI_OK;
    }
    if (!strcmp(m, "get")) {
      if (a->n < 1 || a->n > 2 || a->nkw) return jj_err(c, at, DI_ERR_INVALID_ARG, "get expected 1 or 2 arguments");
      jv *v = jj_dict_get(self.u.d, a->v[0]);
      *out = v ? *v : a->n == 2 ? a->v[1] : jv_none();
      return DI_OK;
    }
  }
  if (self.kind == JV_LIST && (!strcmp(m, "index") || !strcmp(m, "count"))) {
    if (a->n != 1 || a->nkw) return jj_err(c, at, DI_ERR_INVALID_ARG, "list.%s takes exactly one argument", m);
    int64_t cnt = 0, first = -1;
    for (size_t i = 0; i < self.u.l->n; i++)
      if (jj_equal(self.u.l->v[i], a->v[0])) { if (first < 0) first = (int64_t)i; cnt++; }
    if (m[0] == 'i' && first < 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "value is not in list");
    *out = jv_int(m[0] == 'i' ? first : cnt);
    return DI_OK;
  }
  if (find_name(LIST_METHODS, m, strlen(m)) || find_name(DICT_METHODS, m, strlen(m)))
    if (strcmp(m, "index") && strcmp(m, "count") && strcmp(m, "copy"))
      return jj_err(c, at, DI_ERR_INVALID_ARG, "the sandbox does not allow %s.%s: it modifies the object", jj_kind_name(self), m);
  return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: the method %s.%s", jj_kind_name(self), m);
}

/* ---- globals -------------------------------------------------------------------------------- */
static jv_func G_RANGE = {FN_GLOBAL, "range", {0}, NULL, NULL};
static jv_func G_NAMESPACE = {FN_GLOBAL, "namespace", {0}, NULL, NULL};
static jv_func G_DICT = {FN_GLOBAL, "dict", {0}, NULL, NULL};
static jv_func G_RAISE = {FN_GLOBAL, "raise_exception", {0}, NULL, NULL};
static jv_func G_STRFTIME = {FN_GLOBAL, "strftime_now", {0}, NULL, NULL};
static jv_func G_LIPSUM = {FN_GLOBAL, "lipsum", {0}, NULL, NULL};
static jv_func G_CYCLER = {FN_GLOBAL, "cycler", {0}, NULL, NULL};
static jv_func G_JOINER = {FN_GLOBAL, "joiner", {0}, NULL, NULL};

int jj_global_lookup(const char *name, size_t n, jv *out) {
  static jv_func *const all[] = {&G_RANGE, &G_NAMESPACE, &G_DICT, &G_RAISE, &G_STRFTIME, &G_LIPSUM, &G_CYCLER, &G_JOINER};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strlen(all[i]->name) == n && memcmp(all[i]->name, name, n) == 0) {
      jv r = {0};
      r.kind = JV_FUNC;
      r.u.fn = all[i];
      *out = r;
      return 1;
    }
  return 0;
}

di_status jj_call_global(struct jj_ctx *c, const jnode *at, const jv_func *fn, const jj_args *a, jv *out) {
  if (fn == &G_RANGE) {
    if (a->nkw || a->n < 1 || a->n > 3) return jj_err(c, at, DI_ERR_INVALID_ARG, "range expected 1 to 3 integer arguments");
    for (int i = 0; i < a->n; i++)
      if (!is_int(a->v[i])) return jj_err(c, at, DI_ERR_INVALID_ARG, "'%s' object cannot be interpreted as an integer", jj_kind_name(a->v[i]));
    int64_t st = a->n == 1 ? 0 : a->v[0].u.i, en = a->n == 1 ? a->v[0].u.i : a->v[1].u.i, sp = a->n == 3 ? a->v[2].u.i : 1;
    if (sp == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "range() arg 3 must not be zero");
    /* Jinja's sandbox refuses ranges over 100000 items */
    double cnt = sp > 0 ? ceil(((double)en - (double)st) / (double)sp) : ceil(((double)st - (double)en) / (double)-sp);
    if (cnt > 100000) return jj_err(c, at, DI_ERR_INVALID_ARG, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    int64_t len = 0;
    (void)di_double_to_int_in(cnt, 0, 100000, &len); /* NaN cannot happen; a negative count is empty */
    jv_list *l = jj_list_new(A(c), (size_t)len);
    if (!l) return oom(c, at);
    for (int64_t i = st; sp > 0 ? i < en : i > en; i += sp) DI_TRY(push(c, at, l, jv_int(i)));
    l->start = st;
    l->stop = en;
    l->step = sp;
    *out = list_val(l, JV_SEQ_RANGE);
    return DI_OK;
  }
  if (fn == &G_NAMESPACE || fn == &G_DICT) {
    jv r = {0};
    r.kind = fn == &G_NAMESPACE ? JV_NS : JV_DICT;
    r.u.d = jj_dict_new(A(c), (size_t)a->nkw);
    if (!r.u.d) return oom(c, at);
    if (a->n > 1) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s expected at most 1 positional argument", fn->name);
    if (a->n == 1) {
      jv src = a->v[0];
      if (src.kind == JV_DICT || src.kind == JV_NS) {
        for (size_t i = 0; i < src.u.d->n; i++)
          if (jj_dict_set(A(c), r.u.d, src.u.d->k[i], src.u.d->v[i])) return oom(c, at);
      } else if (src.kind == JV_LIST) {
        jv_list *pairs = NULL;
        DI_TRY(jj_iter_items(c, at, src, &pairs));
        for (size_t i = 0; i < pairs->n; i++) {
          jv p = pairs->v[i];
          if (p.kind != JV_LIST || p.u.l->n != 2) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s: sequence elements must be pairs", fn->name);
          if (jj_dict_set(A(c), r.u.d, p.u.l->v[0], p.u.l->v[1])) return oom(c, at);
        }
      } else return jj_err(c, at, DI_ERR_INVALID_ARG, "'%s' object is not iterable", jj_kind_name(src));
    }
    for (int i = 0; i < a->nkw; i++) {
      if (r.kind == JV_NS && a->kwn[i][0] == '_')
        return jj_err(c, at, DI_ERR_INVALID_ARG, "chat templates cannot store underscore-prefixed attributes on a namespace");
      if (jj_dict_set(A(c), r.u.d, jv_strn(a->kwn[i], strlen(a->kwn[i])), a->kwv[i])) return oom(c, at);
    }
    *out = r;
    return DI_OK;
  }
  if (fn == &G_RAISE) {
    jj_buf b = {.limit = jj_ctx_out_limit(c)};
    if (a->n >= 1) jj_to_str(&b, a->v[0]);
    di_status st = jj_err(c, at, DI_ERR_INVALID_ARG, "raise_exception: %s", b.p ? b.p : "");
    jj_buf_free(&b);
    return st;
  }
  if (fn == &G_STRFTIME) {
    if (a->n != 1 || a->v[0].kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "strftime_now takes one format string");
    char f[256], res[512];
    if (a->v[0].u.s.n >= sizeof f) return jj_err(c, at, DI_ERR_UNSUPPORTED, "strftime_now format longer than 255 bytes");
    memcpy(f, a->v[0].u.s.p, a->v[0].u.s.n);
    f[a->v[0].u.s.n] = 0;
    struct tm tmv;
    if (!jj_ctx_now(c, &tmv)) return jj_err(c, at, DI_ERR_INTERNAL, "strftime_now: the clock cannot be read");
    size_t n = strftime(res, sizeof res, f, &tmv);
    *out = jj_str_dup(A(c), res, n);
    return out->kind == JV_STR ? DI_OK : oom(c, at);
  }
  return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: the global function %s()", fn->name);
}

/* ---- tests ---------------------------------------------------------------------------------- */
static const char *const TESTS[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float",
                                    "number", "string", "mapping", "iterable", "sequence", "callable", "sameas",
                                    "escaped", "in", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne", "!=",
                                    "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "lower",
                                    "upper", NULL};

int jj_test_exists(const char *name, size_t n) { return find_name(TESTS, name, n) != NULL; }

static di_status cmp_test(struct jj_ctx *c, const jnode *at, int op, jv a, jv b, int *out) {
  if (op == OP_EQ) { *out = jj_equal(a, b); return DI_OK; }
  if (op == OP_NE) { *out = !jj_equal(a, b); return DI_OK; }
  double x, y;
  int cmp;
  if (a.kind == JV_LIST && b.kind == JV_LIST && a.tuple == b.tuple && a.tuple <= JV_SEQ_TUPLE) {
    /* Python orders lists and tuples by their first differing item, then by length */
    size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
    for (size_t i = 0; i < n; i++) {
      if (jj_equal(a.u.l->v[i], b.u.l->v[i])) continue;
      return cmp_test(c, at, op, a.u.l->v[i], b.u.l->v[i], out);
    }
    cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    *out = op == OP_LT ? cmp < 0 : op == OP_LE ? cmp <= 0 : op == OP_GT ? cmp > 0 : cmp >= 0;
    return DI_OK;
  }
  if ((a.kind == JV_INT || a.kind == JV_BOOL || a.kind == JV_FLOAT) && (b.kind == JV_INT || b.kind == JV_BOOL || b.kind == JV_FLOAT)) {
    x = a.kind == JV_FLOAT ? a.u.f : (double)a.u.i;
    y = b.kind == JV_FLOAT ? b.u.f : (double)b.u.i;
    cmp = x < y ? -1 : x > y;
  } else if (a.kind == JV_STR && b.kind == JV_STR) {
    size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
    int r = memcmp(a.u.s.p, b.u.s.p, n);
    cmp = r ? (r < 0 ? -1 : 1) : (a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n);
  } else return jj_err(c, at, DI_ERR_INVALID_ARG, "comparison not supported between '%s' and '%s'", jj_kind_name(a), jj_kind_name(b));
  *out = op == OP_LT ? cmp < 0 : op == OP_LE ? cmp <= 0 : op == OP_GT ? cmp > 0 : cmp >= 0;
  return DI_OK;
}

di_status jj_call_test(struct jj_ctx *c, const jnode *at, const char *t, jv v, const jj_args *a, int *out) {
  const jv *x = arg(a, 0, "other");
  if (!strcmp(t, "defined")) *out = v.kind != JV_UNDEF;
  else if (!strcmp(t, "undefined")) *out = v.kind == JV_UNDEF;
  else if (!strcmp(t, "none")) *out = v.kind == JV_NONE;
  else if (!strcmp(t, "boolean")) *out = v.kind == JV_BOOL;
  else if (!strcmp(t, "false")) *out = v.kind == JV_BOOL && !v.u.i;
  else if (!strcmp(t, "true")) *out = v.kind == JV_BOOL && v.u.i;
  else if (!strcmp(t, "integer")) *out = v.kind == JV_INT;
  else if (!strcmp(t, "float")) *out = v.kind == JV_FLOAT;
  else if (!strcmp(t, "number")) *out = v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
  else if (!strcmp(t, "string")) *out = v.kind == JV_STR;
  else if (!strcmp(t, "mapping")) *out = v.kind == JV_DICT;
  else if (!strcmp(t, "iterable")) *out = v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_UNDEF;
  /* Jinja's Undefined has __len__ and __getitem__ (that raise) and __call__, so it passes these */
  else if (!strcmp(t, "sequence"))
    *out = v.kind == JV_STR || jv_subscriptable(v) || v.kind == JV_DICT || v.kind == JV_UNDEF;
  else if (!strcmp(t, "callable")) *out = v.kind == JV_FUNC || v.kind == JV_UNDEF;
  else if (!strcmp(t, "escaped")) *out = 0;
  else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
    jv s;
    DI_TRY(to_s(c, at, v, &s));
    jj_args none = {0};
    jv r;
    DI_TRY(str_method(c, at, t[0] == 'l' ? "islower" : "isupper", s, &none, &r));
    *out = (int)r.u.i;
  } else if (!strcmp(t, "odd") || !strcmp(t, "even")) { /* value % 2 == 1 (or 0), floats too */
    if (v.kind == JV_STR) { /* str % 2 is string formatting; its result never equals a number */
      jv r;
      DI_TRY(jj_format(c, at, v, jv_int(2), &r));
      *out = 0;
    } else if (is_int(v)) *out = (int)((v.u.i % 2 != 0) == (t[0] == 'o'));
    else if (v.kind == JV_FLOAT) {
      double m = fmod(v.u.f, 2.0);
      if (m < 0) m += 2.0;
      *out = t[0] == 'o' ? m == 1.0 : m == 0.0;
    } else return jj_err(c, at, DI_ERR_INVALID_ARG, "the test '%s' needs a number, not %s", t, jj_kind_name(v));
  } else {
    if (!x) return jj_err(c, at, DI_ERR_INVALID_ARG, "the test '%s' needs an argument", t);
    if (!strcmp(t, "sameas")) {
      if (v.kind == JV_NONE || v.kind == JV_BOOL || v.kind == JV_UNDEF) *out = v.kind == x->kind && v.u.i == x->u.i;
      else *out = v.kind == x->kind && memcmp(&v.u, &x->u, sizeof v.u) == 0;
    } else if (!strcmp(t, "in")) {
      DI_TRY(jj_contains(c, at, *x, v, out));
    } else if (!strcmp(t, "divisibleby") && v.kind == JV_STR) {
      jv r;
      DI_TRY(jj_format(c, at, v, *x, &r));
      *out = 0;
    } else if (!strcmp(t, "divisibleby")) { /* value % num == 0 */
      int vn = is_int(v) || v.kind == JV_FLOAT, xn = is_int(*x) || x->kind == JV_FLOAT;
      if (!vn || !xn) return jj_err(c, at, DI_ERR_INVALID_ARG, "divisibleby needs numbers");
      if (is_int(v) && is_int(*x)) {
        if (x->u.i == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "division by zero");
        *out = x->u.i == -1 || v.u.i % x->u.i == 0;
      } else {
        double num = is_int(v) ? (double)v.u.i : v.u.f, d = is_int(*x) ? (double)x->u.i : x->u.f;
        if (d == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "division by zero");
        *out = fmod(num, d) == 0.0;
      }
    } else {
      int op = (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) ? OP_EQ
               : (!strcmp(t, "ne") || !strcmp(t, "!=")) ? OP_NE
               : (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<")) ? OP_LT
               : (!strcmp(t, "le") || !strcmp(t, "<=")) ? OP_LE
               : (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">")) ? OP_GT : OP_GE;
      DI_TRY(cmp_test(c, at, op, v, *x, out));
    }
  }
  return DI_OK;
}

/* ---- filters -------------------------------------------------------------------------------- */
static const char *const FILTERS[] = {"abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort",
                                      "e", "escape", "first", "float", "forceescape", "format", "indent", "int", "items",
                                      "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
                                      "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr",
                                      "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper",
                                      "wordcount", NULL};

int jj_filter_exists(const char *name, size_t n) { return find_name(FILTERS, name, n) != NULL; }

/* item.attr for a dotted attribute path ("a.b", "0"), as Jinja's make_attrgetter does. */
static di_status attr_path(struct jj_ctx *c, const jnode *at, jv item, jv path, jv *out) {
  if (path.kind == JV_INT) {
    if (item.kind == JV_LIST) {
      int64_t i = path.u.i, n = (int64_t)item.u.l->n;
      if (i < 0) i += n;
      *out = (i >= 0 && i < n) ? item.u.l->v[i] : jv_undef();
    } else *out = jv_undef();
    return DI_OK;
  }
  if (path.kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "attribute must be a string or an integer");
  const char *p = path.u.s.p, *end = p + path.u.s.n;
  jv cur = item;
  while (p <= end) {
    const char *dot = memchr(p, '.', (size_t)(end - p));
    const char *e = dot ? dot : end;
    if (cur.kind == JV_UNDEF) return jj_err(c, at, DI_ERR_INVALID_ARG, "'%.*s' is undefined", (int)(e - p), p);
    jv next = jv_undef();
    int isnum = e > p;
    for (const char *q = p; q < e; q++)
      if (*q < '0' || *q > '9') isnum = 0;
    if ((cur.kind == JV_DICT || cur.kind == JV_NS)) {
      jv *v = jj_dict_gets(cur.u.d, p, (size_t)(e - p));
      if (v) next = *v;
    } else if (isnum && cur.kind == JV_LIST) {
      long long i = strtoll(p, NULL, 10);
      if (i >= 0 && (size_t)i < cur.u.l->n) next = cur.u.l->v[i];
    }
    cur = next;
    if (!dot) break;
    p = dot + 1;
  }
  *out = cur;
  return DI_OK;
}

/* A sort/compare key: lowercased strings unless case_sensitive. */
static di_status sort_key(struct jj_ctx *c, const jnode *at, jv v, int cs, jv *out) {
  if (!cs && v.kind == JV_STR) return case_map(c, at, v, 0, out);
  *out = v;
  return DI_OK;
}

static di_status order_cmp(struct jj_ctx *c, const jnode *at, jv a, jv b, int *r) {
  int lt = 0, gt = 0;
  DI_TRY(cmp_test(c, at, OP_LT, a, b, &lt));
  DI_TRY(cmp_test(c, at, OP_GT, a, b, &gt));
  *r = lt ? -1 : gt;
  return DI_OK;
}

static di_status sorted(struct jj_ctx *c, const jnode *at, jv_list *items, jv_list *keys, int reverse, jv_list **out) {
  size_t n = items->n;
  jv_list *ri = jj_list_new(A(c), n), *rk = jj_list_new(A(c), n);
  if (!ri || !rk) return oom(c, at);
  for (size_t i = 0; i < n; i++) { /* stable insertion sort */
    size_t j = ri->n;
    DI_TRY(push(c, at, ri, items->v[i]));
    DI_TRY(push(c, at, rk, keys->v[i]));
    while (j > 0) {
      int r;
      DI_TRY(order_cmp(c, at, rk->v[j - 1], rk->v[j], &r));
      if (reverse ? r >= 0 : r <= 0) break;
      jv t = ri->v[j]; ri->v[j] = ri->v[j - 1]; ri->v[j - 1] = t;
      t = rk->v[j]; rk->v[j] = rk->v[j - 1]; rk->v[j - 1] = t;
      j--;
    }
  }
  *out = ri;
  return DI_OK;
}

static di_status select_filter(struct jj_ctx *c, const jnode *at, const char *f, jv v, const jj_args *a, jv *out) {
  int byattr = strstr(f, "attr") != NULL, keep_true = f[0] == 's';
  jv_list *items = NULL, *res = jj_list_new(A(c), 0);
  if (!res) return oom(c, at);
  if (!jj_truthy(v)) { /* Jinja: `if value:` guards the loop, so a falsy value gives nothing */
    *out = list_val(res, JV_SEQ_ITER);
    return DI_OK;
  }
  DI_TRY(jj_iter_items(c, at, v, &items));
  int first = 0;
  jv path = jv_undef();
  if (byattr) {
    if (a->n < 1) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s needs an attribute name", f);
    path = a->v[0];
    first = 1;
  }
  const char *test = NULL;
  char tname[64];
  if (a->n > first) {
    if (a->v[first].kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s: the test name must be a string", f);
    snprintf(tname, sizeof tname, "%.*s", (int)(a->v[first].u.s.n > 63 ? 63 : a->v[first].u.s.n), a->v[first].u.s.p);
    if (!jj_test_exists(tname, strlen(tname))) return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: the test '%s'", tname);
    test = tname;
  }
  jj_args targs = {0};
  targs.n = a->n > first + 1 ? a->n - first - 1 : 0;
  targs.v = a->v + first + 1;
  for (size_t i = 0; i < items->n; i++) {
    jv x = items->v[i];
    if (byattr) DI_TRY(attr_path(c, at, x, path, &x));
    int r;
    if (test) DI_TRY(jj_call_test(c, at, test, x, &targs, &r));
    else r = jj_truthy(x);
    if ((r != 0) == keep_true) DI_TRY(push(c, at, res, items->v[i]));
  }
  *out = list_val(res, JV_SEQ_ITER); /* select/reject/selectattr/rejectattr are generators */
  return DI_OK;
}

static di_status map_filter(struct jj_ctx *c, const jnode *at, jv v, const jj_args *a, jv *out) {
  jv_list *items = NULL, *res = jj_list_new(A(c), 0);
  if (!res) return oom(c, at);
  if (!jj_truthy(v)) { /* Jinja: `if value:` guards the loop, so a falsy value gives nothing */
    *out = list_val(res, JV_SEQ_ITER);
    return DI_OK;
  }
  DI_TRY(jj_iter_items(c, at, v, &items));
  const jv *attrp = arg(a, -1, "attribute");
  if (attrp) {
    const jv *def = arg(a, -1, "default");
    for (size_t i = 0; i < items->n; i++) {
      jv x;
      DI_TRY(attr_path(c, at, items->v[i], *attrp, &x));
      if (x.kind == JV_UNDEF && def) x = *def;
      DI_TRY(push(c, at, res, x));
    }
  } else {
    if (a->n < 1 || a->v[0].kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "map needs a filter name or attribute=");
    char fname[64];
    snprintf(fname, sizeof fname, "%.*s", (int)(a->v[0].u.s.n > 63 ? 63 : a->v[0].u.s.n), a->v[0].u.s.p);
    if (!jj_filter_exists(fname, strlen(fname))) return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: the filter '%s'", fname);
    jj_args fa = *a;
    fa.n = a->n - 1;
    fa.v = a->v + 1;
    for (size_t i = 0; i < items->n; i++) {
      jv x;
      DI_TRY(jj_call_filter(c, at, fname, items->v[i], &fa, &x));
      DI_TRY(push(c, at, res, x));
    }
  }
  *out = list_val(res, JV_SEQ_ITER); /* Jinja's map is a generator */
  return DI_OK;
}

static di_status tojson_filter(struct jj_ctx *c, const jnode *at, jv v, const jj_args *a, jv *out) {
  /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
  static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
  DI_TRY(check_args(c, at, "tojson", a, 4, kw));
  jj_json_opts o = {0};
  const jv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
           *sk = arg(a, 3, "sort_keys");
  o.ensure_ascii = ea ? jj_truthy(*ea) : 0;
  o.sort_keys = sk ? jj_truthy(*sk) : 0;
  char indent_buf[64];
  if (ind && ind->kind != JV_NONE) {
    if (is_int(*ind)) {
      int64_t k = ind->u.i < 0 ? 0 : ind->u.i > 32 ? 32 : ind->u.i;
      memset(indent_buf, ' ', (size_t)k);
      indent_buf[k] = 0;
      o.indent = indent_buf;
    } else if (ind->kind == JV_STR && ind->u.s.n < sizeof indent_buf) {
      memcpy(indent_buf, ind->u.s.p, ind->u.s.n);
      indent_buf[ind->u.s.n] = 0;
      o.indent = indent_buf;
    } else return jj_err(c, at, DI_ERR_INVALID_ARG, "tojson: indent must be an integer or a short string");
  }
  o.item_sep = o.indent ? "," : ", ";
  o.key_sep = ": ";
  char s1[16], s2[16];
  if (sep && sep->kind != JV_NONE) {
    if (sep->kind != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].kind != JV_STR || sep->u.l->v[1].kind != JV_STR ||
        sep->u.l->v[0].u.s.n >= sizeof s1 || sep->u.l->v[1].u.s.n >= sizeof s2)
      return jj_err(c, at, DI_ERR_INVALID_ARG, "tojson: separators must be a pair of short strings");
    memcpy(s1, sep->u.l->v[0].u.s.p, sep->u.l->v[0].u.s.n);
    s1[sep->u.l->v[0].u.s.n] = 0;
    memcpy(s2, sep->u.l->v[1].u.s.p, sep->u.l->v[1].u.s.n);
    s2[sep->u.l->v[1].u.s.n] = 0;
    o.item_sep = s1;
    o.key_sep = s2;
  }
  jj_buf b = {.limit = jj_ctx_out_limit(c)};
  const char *bad = NULL;
  if (jj_to_json(&b, v, &o, 0, &bad)) {
    jj_buf_free(&b);
    return jj_err(c, at, DI_ERR_INVALID_ARG, "tojson: Object of type %s is not JSON serializable", bad);
  }
  return buf_to_str(c, at, &b, out);
}

static di_status call_filter(struct jj_ctx *c, const jnode *at, const char *f, jv v, const jj_args *a, jv *out);

/* Jinja's map, select, reject, selectattr, rejectattr, unique and items filters are generators:
 * nothing runs until something consumes them. We compute eagerly, so an error becomes a poisoned
 * generator that raises it when consumed, and a never-consumed one stays harmless (and true). */
di_status jj_call_filter(struct jj_ctx *c, const jnode *at, const char *f, jv v, const jj_args *a, jv *out) {
  static const char *const lazy[] = {"map", "select", "reject", "selectattr", "rejectattr", "unique", "items", NULL};
  di_status st = call_filter(c, at, f, v, a, out);
  if (st == DI_OK || st == DI_ERR_OOM || !find_name(lazy, f, strlen(f))) return st;
  if (st == DI_ERR_UNSUPPORTED && strstr(di_last_error(), "unsupported construct")) return st;
  jv_list *l = jj_list_new(A(c), 0);
  jv msg = jj_str_dup(A(c), di_last_error(), strlen(di_last_error()));
  if (!l || msg.kind != JV_STR) return oom(c, at);
  l->err = msg.u.s.p;
  *out = list_val(l, JV_SEQ_ITER);
  di_error_clear();
  return DI_OK;
}

static di_status call_filter(struct jj_ctx *c, const jnode *at, const char *f, jv v, const jj_args *a, jv *out) {
  if (!strcmp(f, "tojson")) return tojson_filter(c, at, v, a, out);
  if (!strcmp(f, "safe")) return to_s(c, at, v, out); /* Markup(value): a string */
  if (!strcmp(f, "format")) { /* Jinja: str(value) % (args or kwargs) */
    if (a->n && a->nkw) return jj_err(c, at, DI_ERR_INVALID_ARG, "can't handle positional and keyword arguments at the same time");
    jv s, fa = {0};
    DI_TRY(to_s(c, at, v, &s));
    if (a->nkw) {
      fa.kind = JV_DICT;
      fa.u.d = jj_dict_new(A(c), (size_t)a->nkw);
      if (!fa.u.d) return oom(c, at);
      for (int i = 0; i < a->nkw; i++)
        if (jj_dict_set(A(c), fa.u.d, jv_strn(a->kwn[i], strlen(a->kwn[i])), a->kwv[i])) return oom(c, at);
    } else {
      jv_list *l = jj_list_new(A(c), (size_t)a->n);
      if (!l) return oom(c, at);
      for (int i = 0; i < a->n; i++) DI_TRY(push(c, at, l, a->v[i]));
      fa = list_val(l, 1);
    }
    return jj_format(c, at, s, fa, out);
  }
  if (!strcmp(f, "d") || !strcmp(f, "default")) {
    const jv *def = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
    int use = v.kind == JV_UNDEF || (boolean && jj_truthy(*boolean) && !jj_truthy(v));
    *out = use ? (def ? *def : jv_strn("", 0)) : v;
    return DI_OK;
  }
  if (!strcmp(f, "length") || !strcmp(f, "count")) {
    switch (v.kind) {
    case JV_UNDEF: *out = jv_int(0); return DI_OK;
    case JV_STR: *out = jv_int((int64_t)jj_utf8_len(v.u.s.p, v.u.s.n)); return DI_OK;
    case JV_LIST:
      if (v.tuple == JV_SEQ_ITER) break;
      *out = jv_int((int64_t)v.u.l->n);
      return DI_OK;
    case JV_DICT: *out = jv_int((int64_t)v.u.d->n); return DI_OK;
    default: break;
    }
    return jj_err(c, at, DI_ERR_INVALID_ARG, "object of type '%s' has no len()", jj_kind_name(v));
  }
  if (!strcmp(f, "string")) return to_s(c, at, v, out);
  if (!strcmp(f, "indent") && v.kind != JV_STR) /* Jinja appends "\n" to the value itself */
    return jj_err(c, at, DI_ERR_INVALID_ARG, "indent: unsupported operand type(s) for +=: '%s' and 'str'", jj_kind_name(v));
  if (!strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") ||
      !strcmp(f, "capitalize") || !strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape") ||
      !strcmp(f, "wordcount") || !strcmp(f, "center") || !strcmp(f, "indent") || !strcmp(f, "replace")) {
    jv s;
    DI_TRY(to_s(c, at, v, &s));
    if (!strcmp(f, "trim")) return strip(c, at, s, arg(a, 0, "chars"), 3, out);
    if (!strcmp(f, "upper")) return case_map(c, at, s, 1, out);
    if (!strcmp(f, "lower")) return case_map(c, at, s, 0, out);
    if (!strcmp(f, "title")) { /* Jinja: words split at runs of [-\s({[<]; first char upper, rest lower */
      jj_buf b = {.limit = jj_ctx_out_limit(c)};
      size_t i = 0;
      int word_start = 1;
      while (i < s.u.s.n) {
        uint32_t cp = jj_utf8_next(s.u.s.p, s.u.s.n, &i);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jj_py_isspace(cp);
        if (sep) {
          jj_utf8_put(&b, cp);
          word_start = 1;
          continue;
        }
        if (cp == 0xdf && word_start) jj_buf_puts(&b, "SS");
        else jj_utf8_put(&b, word_start ? cp_upper(cp) : cp_lower(cp));
        word_start = 0;
      }
      return buf_to_str(c, at, &b, out);
    }
    if (!strcmp(f, "capitalize")) return case_map(c, at, s, 3, out);
    if (!strcmp(f, "replace")) {
      if (a->n < 2) return jj_err(c, at, DI_ERR_INVALID_ARG, "replace needs old and new");
      const jv *cnt = arg(a, 2, "count");
      jv o2, n2;
      DI_TRY(to_s(c, at, a->v[0], &o2));
      DI_TRY(to_s(c, at, a->v[1], &n2));
      return replace(c, at, s, o2, n2, cnt && is_int(*cnt) ? cnt->u.i : -1, out);
    }
    if (!strcmp(f, "wordcount")) {
      int64_t n = 0;
      int in = 0;
      size_t i = 0;
      while (i < s.u.s.n) {
        uint32_t cp = jj_utf8_next(s.u.s.p, s.u.s.n, &i);
        int w = (cp >= '0' && cp <= '9') || cp == '_' || cp_cased(cp) || (cp >= 0x80 && !jj_py_isspace(cp) && cp > 0xbf);
        if (w && !in) n++;
        in = w;
      }
      *out = jv_int(n);
      return DI_OK;
    }
    if (!strcmp(f, "center")) {
      const jv *w = arg(a, 0, "width");
      int64_t width = w && is_int(*w) ? w->u.i : 80, len = (int64_t)jj_utf8_len(s.u.s.p, s.u.s.n);
      if (width > 100000) width = 100000;
      if (width <= len) { *out = s; return DI_OK; }
      int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
      jj_buf b = {.limit = jj_ctx_out_limit(c)};
      for (int64_t i = 0; i < left; i++) jj_buf_putc(&b, ' ');
      jj_buf_put(&b, s.u.s.p, s.u.s.n);
      for (int64_t i = 0; i < pad - left; i++) jj_buf_putc(&b, ' ');
      return buf_to_str(c, at, &b, out);
    }
    if (!strcmp(f, "indent")) {
      const jv *w = arg(a, 0, "width"), *fst = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
      char ind[64];
      if (w && w->kind == JV_STR && w->u.s.n < sizeof ind) { memcpy(ind, w->u.s.p, w->u.s.n); ind[w->u.s.n] = 0; }
      else {
        int64_t k = w && is_int(*w) ? w->u.i : 4;
        if (k < 0) k = 0;
        if (k > 63) k = 63;
        memset(ind, ' ', (size_t)k);
        ind[k] = 0;
      }
      int first = fst && jj_truthy(*fst), bl = blank && jj_truthy(*blank);
      jj_buf b = {.limit = jj_ctx_out_limit(c)};
      /* Jinja: lines after the first get the indent (empty lines only with blank=True) */
      size_t i = 0, ln = 0;
      while (i <= s.u.s.n) {
        const char *nl = memchr(s.u.s.p + i, '\n', s.u.s.n - i);
        size_t e = nl ? (size_t)(nl - s.u.s.p) : s.u.s.n;
        int empty = e == i;
        if ((ln == 0 && first) || (ln > 0 && (bl || !empty))) jj_buf_puts(&b, ind);
        jj_buf_put(&b, s.u.s.p + i, e - i);
        if (!nl) break;
        jj_buf_putc(&b, '\n');
        i = e + 1;
        ln++;
      }
      return buf_to_str(c, at, &b, out);
    }
    /* escape */
    jj_buf b = {.limit = jj_ctx_out_limit(c)};
    for (size_t i = 0; i < s.u.s.n; i++) {
      char ch = s.u.s.p[i];
      if (ch == '&') jj_buf_puts(&b, "&amp;");
      else if (ch == '<') jj_buf_puts(&b, "&lt;");
      else if (ch == '>') jj_buf_puts(&b, "&gt;");
      else if (ch == '"') jj_buf_puts(&b, "&#34;");
      else if (ch == '\'') jj_buf_puts(&b, "&#39;");
      else jj_buf_putc(&b, ch);
    }
    return buf_to_str(c, at, &b, out);
  }
  if (!strcmp(f, "first") || !strcmp(f, "last")) {
    if (f[0] == 'l' && v.kind == JV_LIST && v.tuple == JV_SEQ_ITER)
      return jj_err(c, at, DI_ERR_INVALID_ARG, "'generator' object is not reversible");
    jv_list *items = NULL;
    DI_TRY(jj_iter_items(c, at, v, &items));
    *out = items->n ? items->v[f[0] == 'f' ? 0 : items->n - 1] : jv_undef();
    return DI_OK;
  }
  if (!strcmp(f, "list")) {
    jv_list *items, *l = jj_list_new(A(c), 0);
    if (!l) return oom(c, at);
    DI_TRY(jj_iter_items(c, at, v, &items));
    for (size_t i = 0; i < items->n; i++) DI_TRY(push(c, at, l, items->v[i]));
    *out = list_val(l, 0);
    return DI_OK;
  }
  if (!strcmp(f, "items")) {
    if (v.kind == JV_UNDEF) { jv_list *l = jj_list_new(A(c), 0); if (!l) return oom(c, at); *out = list_val(l, 0); return DI_OK; }
    if (v.kind != JV_DICT) return jj_err(c, at, DI_ERR_INVALID_ARG, "Can only get item pairs from a mapping.");
    jv_func fn = {FN_METHOD, "items", v, NULL, NULL};
    jj_args none = {0};
    DI_TRY(jj_call_method(c, at, &fn, &none, out));
    out->tuple = JV_SEQ_ITER; /* the items filter is a generator */
    return DI_OK;
  }
  if (!strcmp(f, "join")) {
    const jv *sep = arg(a, 0, "d"), *attrp = arg(a, 1, "attribute");
    jv sv = jv_strn("", 0);
    if (sep) DI_TRY(to_s(c, at, *sep, &sv));
    jv_list *items = NULL;
    DI_TRY(jj_iter_items(c, at, v, &items));
    if (attrp) {
      jv_list *m = jj_list_new(A(c), items->n);
      if (!m) return oom(c, at);
      for (size_t i = 0; i < items->n; i++) {
        jv x;
        DI_TRY(attr_path(c, at, items->v[i], *attrp, &x));
        DI_TRY(push(c, at, m, x));
      }
      items = m;
    }
    return join_items(c, at, items, sv, 0, out);
  }
  if (!strcmp(f, "reverse")) {
    if (v.kind == JV_STR) {
      jv_list *items = NULL;
      DI_TRY(jj_iter_items(c, at, v, &items));
      jj_buf b = {.limit = jj_ctx_out_limit(c)};
      for (size_t i = items->n; i-- > 0;) jj_buf_put(&b, items->v[i].u.s.p, items->v[i].u.s.n);
      return buf_to_str(c, at, &b, out);
    }
    jv_list *items, *l = jj_list_new(A(c), 0);
    if (!l) return oom(c, at);
    DI_TRY(jj_iter_items(c, at, v, &items));
    for (size_t i = items->n; i-- > 0;) DI_TRY(push(c, at, l, items->v[i]));
    *out = list_val(l, JV_SEQ_ITER); /* reversed(list) is an iterator */
    return DI_OK;
  }
  if (!strcmp(f, "map")) return map_filter(c, at, v, a, out);
  if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
    return select_filter(c, at, f, v, a, out);
  if (!strcmp(f, "attr")) {
    if (a->n != 1 || a->v[0].kind != JV_STR) return jj_err(c, at, DI_ERR_INVALID_ARG, "attr needs a name");
    if (v.kind == JV_UNDEF) return jj_err(c, at, DI_ERR_INVALID_ARG, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "value");
    /* getattr only: a dict's keys are not attributes, a namespace's are */
    if (v.kind == JV_NS) {
      jv *x = jj_dict_gets(v.u.d, a->v[0].u.s.p, a->v[0].u.s.n);
      *out = x ? *x : jv_undef();
    } else if (!jj_method_lookup(c, v, a->v[0].u.s.p, a->v[0].u.s.n, out)) *out = jv_undef();
    return DI_OK;
  }
  if (!strcmp(f, "sort") || !strcmp(f, "unique") || !strcmp(f, "max") || !strcmp(f, "min") || !strcmp(f, "dictsort")) {
    int dictsort = f[0] == 'd';
    const jv *rev = arg(a, dictsort ? 2 : 0, "reverse"), *cs = arg(a, dictsort ? 0 : 1, "case_sensitive");
    const jv *attrp = arg(a, dictsort ? -1 : 2, "attribute"), *by = arg(a, 1, "by");
    if (f[0] != 's' && !dictsort) { rev = NULL; cs = arg(a, 0, "case_sensitive"); attrp = arg(a, 1, "attribute"); }
    jv_list *items = NULL;
    if (dictsort) {
      if (v.kind != JV_DICT) return jj_err(c, at, DI_ERR_INVALID_ARG, "dictsort needs a mapping");
      jv pairs;
      jv_func fn = {FN_METHOD, "items", v, NULL, NULL};
      jj_args none = {0};
      DI_TRY(jj_call_method(c, at, &fn, &none, &pairs));
      items = pairs.u.l;
    } else DI_TRY(jj_iter_items(c, at, v, &items));
    int csv = cs && jj_truthy(*cs);
    jv_list *keys = jj_list_new(A(c), items->n);
    if (!keys) return oom(c, at);
    int by_value = by && by->kind == JV_STR && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5);
    for (size_t i = 0; i < items->n; i++) {
      jv k = items->v[i];
      if (dictsort) k = k.u.l->v[by_value ? 1 : 0];
      else if (attrp) DI_TRY(attr_path(c, at, k, *attrp, &k));
      DI_TRY(sort_key(c, at, k, csv, &k));
      DI_TRY(push(c, at, keys, k));
    }
    if (!strcmp(f, "unique")) {
      jv_list *l = jj_list_new(A(c), 0), *seen = jj_list_new(A(c), 0);
      if (!l || !seen) return oom(c, at);
      for (size_t i = 0; i < items->n; i++) {
        jv k = keys->v[i]; /* keys go in a Python set */
        if ((k.kind == JV_LIST && (k.tuple == JV_SEQ_LIST || (k.tuple >= JV_SEQ_ITEMS && k.tuple <= JV_SEQ_VALUES))) ||
            k.kind == JV_DICT)
          return jj_err(c, at, DI_ERR_INVALID_ARG, "unhashable type: '%s'", jj_kind_name(k));
        int dup = 0;
        for (size_t j = 0; j < seen->n && !dup; j++) dup = jj_equal(seen->v[j], keys->v[i]);
        if (dup) continue;
        DI_TRY(push(c, at, seen, keys->v[i]));
        DI_TRY(push(c, at, l, items->v[i]));
      }
      *out = list_val(l, JV_SEQ_ITER); /* unique is a generator */
      return DI_OK;
    }
    if (!strcmp(f, "max") || !strcmp(f, "min")) {
      if (items->n == 0) { *out = jv_undef(); return DI_OK; }
      size_t best = 0;
      for (size_t i = 1; i < items->n; i++) {
        int r;
        DI_TRY(order_cmp(c, at, keys->v[i], keys->v[best], &r));
        if (f[1] == 'a' ? r > 0 : r < 0) best = i;
      }
      *out = items->v[best];
      return DI_OK;
    }
    jv_list *res = NULL;
    DI_TRY(sorted(c, at, items, keys, rev && jj_truthy(*rev), &res));
    *out = list_val(res, 0);
    return DI_OK;
  }
  if (!strcmp(f, "sum")) {
    const jv *attrp = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
    jv acc = start ? *start : jv_int(0);
    jv_list *items = NULL;
    DI_TRY(jj_iter_items(c, at, v, &items));
    for (size_t i = 0; i < items->n; i++) {
      jv x = items->v[i];
      if (attrp) DI_TRY(attr_path(c, at, x, *attrp, &x));
      int ai = is_int(acc), xi = is_int(x);
      if (!(ai || acc.kind == JV_FLOAT) || !(xi || x.kind == JV_FLOAT))
        return jj_err(c, at, DI_ERR_INVALID_ARG, "sum: unsupported operand types '%s' and '%s'", jj_kind_name(acc), jj_kind_name(x));
      if (ai && xi) {
        int64_t r;
        if (__builtin_add_overflow(acc.u.i, x.u.i, &r)) return jj_err(c, at, DI_ERR_UNSUPPORTED, "integer overflow");
        acc = jv_int(r);
      } else acc = jv_float((ai ? (double)acc.u.i : acc.u.f) + (xi ? (double)x.u.i : x.u.f));
    }
    *out = acc;
    return DI_OK;
  }
  if (!strcmp(f, "abs")) {
    if (v.kind == JV_FLOAT) *out = jv_float(fabs(v.u.f));
    else if (is_int(v)) {
      if (v.u.i == INT64_MIN) return jj_err(c, at, DI_ERR_UNSUPPORTED, "integer overflow");
      *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    } else return jj_err(c, at, DI_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", jj_kind_name(v));
    return DI_OK;
  }
  if (!strcmp(f, "int") || !strcmp(f, "float")) {
    const jv *def = arg(a, 0, "default");
    if (v.kind == JV_UNDEF) /* Undefined's __int__/__float__ raise, past the filter's except */
      return jj_err(c, at, DI_ERR_INVALID_ARG, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "value");
    int isint = f[0] == 'i';
    jv d = def ? *def : isint ? jv_int(0) : jv_float(0.0);
    if (is_int(v)) *out = isint ? jv_int(v.u.i) : jv_float((double)v.u.i);
    else if (v.kind == JV_FLOAT) {
      int64_t i;
      if (!isint) *out = v;
      else *out = di_double_to_int_in(v.u.f, -9.2e18, 9.2e18, &i) ? jv_int(i) : d;
    } else if (v.kind == JV_STR) {
      char buf[64];
      jv sv;
      DI_TRY(strip(c, at, v, NULL, 3, &sv)); /* Python's int() and float() ignore surrounding whitespace */
      size_t n = sv.u.s.n < 63 ? sv.u.s.n : 63;
      memcpy(buf, sv.u.s.p, n);
      buf[n] = 0;
      char *e;
      if (isint) {
        long long x = strtoll(buf, &e, 10);
        while (*e == ' ') e++;
        if (e != buf && !*e) *out = jv_int(x);
        else {
          double fx = strtod(buf, &e);
          int64_t i;
          *out = (e != buf && !*e && di_double_to_int_in(fx, -9.2e18, 9.2e18, &i)) ? jv_int(i) : d;
        }
      } else {
        double x = strtod(buf, &e);
        *out = (e != buf && !*e) ? jv_float(x) : d;
      }
    } else *out = d;
    return DI_OK;
  }
  if (!strcmp(f, "round")) {
    const jv *pr = arg(a, 0, "precision"), *method = arg(a, 1, "method");
    int64_t p = pr && is_int(*pr) ? pr->u.i : 0;
    if (p > 15) p = 15;
    if (p < -15) p = -15;
    double x = is_int(v) ? (double)v.u.i : v.kind == JV_FLOAT ? v.u.f : NAN;
    if (isnan(x) && v.kind != JV_FLOAT) return jj_err(c, at, DI_ERR_INVALID_ARG, "round needs a number");
    double m = pow(10.0, (double)p), r;
    const char *how = method && method->kind == JV_STR ? method->u.s.p : "common";
    if (is_int(v) && strncmp(how, "floor", 5) && strncmp(how, "ceil", 4)) { /* round(int, n) is an int */
      if (p >= 0) { *out = jv_int(v.u.i); return DI_OK; }
      double q = pow(10.0, (double)-p), rounded = nearbyint((double)v.u.i / q) * q;
      int64_t i;
      /* near +-2^63 the rounded value leaves int64: Python's int grows, here it stays a float */
      *out = di_double_to_int_in(rounded, -9.2e18, 9.2e18, &i) ? jv_int(i) : jv_float(rounded);
      return DI_OK;
    }
    if (!strncmp(how, "floor", 5)) r = floor(x * m) / m;
    else if (!strncmp(how, "ceil", 4)) r = ceil(x * m) / m;
    else if (p >= 0 && isfinite(x)) { /* Python's round(): correctly rounded, ties to even, as printf does */
      char buf[512];
      snprintf(buf, sizeof buf, "%.*f", (int)p, x);
      r = strtod(buf, NULL);
    } else r = nearbyint(x / pow(10.0, (double)-p)) * pow(10.0, (double)-p);
    *out = jv_float(r);
    return DI_OK;
  }
  return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: the filter '%s'", f);
}
