/* Values of the Jinja interpreter: the render arena, byte buffers, lists and ordered dicts, and
 * the ways Python spells values: str(), repr() (shortest round-trip floats) and json.dumps as
 * transformers' tojson calls it. */
#include "chat/jinja.h"
#include "util/json.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---------------------------------------------------------------------------------- */
struct jj_arena_block {
  jj_arena_block *next;
  size_t used, cap;
  max_align_t data[];
};

void *jj_alloc(jj_arena *a, size_t n) {
  if (a->failed) return NULL;
  n = (n + 15) & ~(size_t)15;
  if (n == 0) n = 16;
  if (a->limit && a->used_total + n > a->limit) {
    a->failed = 1;
    return NULL;
  }
  jj_arena_block *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    b = malloc(sizeof *b + cap);
    if (!b) {
      a->failed = 1;
      return NULL;
    }
    b->used = 0;
    b->cap = cap;
    b->next = a->head;
    a->head = b;
  }
  void *p = (char *)b->data + b->used;
  b->used += n;
  a->used_total += n;
  memset(p, 0, n);
  return p;
}

void jj_arena_free(jj_arena *a) {
  jj_arena_block *b = a->head;
  while (b) {
    jj_arena_block *nx = b->next;
    free(b);
    b = nx;
  }
  a->head = NULL;
  a->used_total = 0;
}

/* ---- buffers -------------------------------------------------------------------------------- */
void jj_buf_put(jj_buf *b, const char *s, size_t n) {
  if (b->failed || n == 0) return;
  /* buffers without a limit of their own (temporaries) stop at 64 MiB */
  if (b->n + n > (b->limit ? b->limit : (size_t)64 << 20)) {
    b->failed = b->over_limit = 1;
    return;
  }
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
void jj_buf_puts(jj_buf *b, const char *s) { jj_buf_put(b, s, strlen(s)); }
void jj_buf_putc(jj_buf *b, char c) { jj_buf_put(b, &c, 1); }
void jj_buf_printf(jj_buf *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    jj_buf_put(b, tmp, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    b->failed = 1;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  jj_buf_put(b, big, (size_t)n);
  free(big);
}
void jj_buf_free(jj_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* ---- lists and dicts ------------------------------------------------------------------------ */
jv_list *jj_list_new(jj_arena *a, size_t cap) {
  jv_list *l = jj_alloc(a, sizeof *l);
  if (!l) return NULL;
  if (cap) {
    l->v = jj_alloc(a, cap * sizeof(jv));
    if (!l->v) return NULL;
    l->cap = cap;
  }
  return l;
}

int jj_list_push(jj_arena *a, jv_list *l, jv v) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 4;
    jv *nv = jj_alloc(a, cap * sizeof(jv));
    if (!nv) return -1;
    if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
    l->v = nv;
    l->cap = cap;
  }
  l->v[l->n++] = v;
  return 0;
}

jv_dict *jj_dict_new(jj_arena *a, size_t cap) {
  jv_dict *d = jj_alloc(a, sizeof *d);
  if (!d) return NULL;
  if (cap) {
    d->k = jj_alloc(a, cap * sizeof(jv));
    d->v = jj_alloc(a, cap * sizeof(jv));
    if (!d->k || !d->v) return NULL;
    d->cap = cap;
  }
  return d;
}

jv *jj_dict_get(const jv_dict *d, jv k) {
  for (size_t i = 0; i < d->n; i++)
    if (jj_equal(d->k[i], k)) return &d->v[i];
  return NULL;
}

jv *jj_dict_gets(const jv_dict *d, const char *k, size_t n) {
  for (size_t i = 0; i < d->n; i++)
    if (d->k[i].kind == JV_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, k, n) == 0)
      return &d->v[i];
  return NULL;
}

int jj_dict_set(jj_arena *a, jv_dict *d, jv k, jv v) {
  jv *slot = jj_dict_get(d, k);
  if (slot) {
    *slot = v;
    return 0;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4;
    jv *nk = jj_alloc(a, cap * sizeof(jv)), *nv = jj_alloc(a, cap * sizeof(jv));
    if (!nk || !nv) return -1;
    if (d->n) {
      memcpy(nk, d->k, d->n * sizeof(jv));
      memcpy(nv, d->v, d->n * sizeof(jv));
    }
    d->k = nk;
    d->v = nv;
    d->cap = cap;
  }
  d->k[d->n] = k;
  d->v[d->n] = v;
  d->n++;
  return 0;
}

jv jj_str_dup(jj_arena *a, const char *p, size_t n) {
  char *q = jj_alloc(a, n + 1);
  if (!q) return jv_undef();
  if (n) memcpy(q, p, n);
  return jv_strn(q, n);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */
uint32_t jj_utf8_next(const char *p, size_t n, size_t *i) {
  const unsigned char *s = (const unsigned char *)p;
  size_t k = *i;
  unsigned c = s[k];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || k + (size_t)len > n) {
    *i = k + 1;
    return c; /* invalid byte: one code point of its own value */
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (int j = 1; j < len; j++) {
    if ((s[k + j] & 0xc0) != 0x80) {
      *i = k + 1;
      return c;
    }
    cp = (cp << 6) | (s[k + j] & 0x3f);
  }
  *i = k + (size_t)len;
  return cp;
}

size_t jj_utf8_len(const char *p, size_t n) {
  size_t i = 0, cnt = 0;
  while (i < n) {
    jj_utf8_next(p, n, &i);
    cnt++;
  }
  return cnt;
}

void jj_utf8_put(jj_buf *b, uint32_t cp) {
  char t[4];
  if (cp < 0x80) {
    t[0] = (char)cp;
    jj_buf_put(b, t, 1);
  } else if (cp < 0x800) {
    t[0] = (char)(0xc0 | (cp >> 6));
    t[1] = (char)(0x80 | (cp & 0x3f));
    jj_buf_put(b, t, 2);
  } else if (cp < 0x10000) {
    t[0] = (char)(0xe0 | (cp >> 12));
    t[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    t[2] = (char)(0x80 | (cp & 0x3f));
    jj_buf_put(b, t, 3);
  } else {
    t[0] = (char)(0xf0 | (cp >> 18));
    t[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    t[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    t[3] = (char)(0x80 | (cp & 0x3f));
    jj_buf_put(b, t, 4);
  }
}

/* Python's str.isspace(). */
int jj_py_isspace(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f)) return 1;
  if (cp < 0x85) return 0;
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ---- truth, equality, names ----------------------------------------------------------------- */
int jj_truthy(jv v) {
  switch (v.kind) {
  case JV_UNDEF: case JV_NONE: return 0;
  case JV_BOOL: case JV_INT: return v.u.i != 0;
  case JV_FLOAT: return v.u.f != 0.0;
  case JV_STR: return v.u.s.n != 0;
  case JV_LIST: return v.tuple == JV_SEQ_ITER || v.u.l->n != 0;
  case JV_DICT: return v.u.d->n != 0;
  default: return 1;
  }
}

static int is_num(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT; }

int jj_equal(jv a, jv b) {
  if (is_num(a) && is_num(b)) {
    if (a.kind == JV_FLOAT || b.kind == JV_FLOAT) {
      double x = a.kind == JV_FLOAT ? a.u.f : (double)a.u.i, y = b.kind == JV_FLOAT ? b.u.f : (double)b.u.i;
      return x == y;
    }
    return a.u.i == b.u.i;
  }
  if (a.kind != b.kind) return 0;
  switch (a.kind) {
  case JV_UNDEF: case JV_NONE: return 1;
  case JV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
  case JV_LIST:
    if (a.tuple != b.tuple) return 0;
    if (a.tuple == JV_SEQ_ITER || a.tuple == JV_SEQ_VALUES) return a.u.l == b.u.l; /* identity */
    if (a.u.l->n != b.u.l->n) return 0;
    if (a.tuple == JV_SEQ_KEYS || a.tuple == JV_SEQ_ITEMS) { /* set-like: order does not matter */
      for (size_t i = 0; i < a.u.l->n; i++) {
        int found = 0;
        for (size_t j = 0; j < b.u.l->n && !found; j++) found = jj_equal(a.u.l->v[i], b.u.l->v[j]);
        if (!found) return 0;
      }
      return 1;
    }
    for (size_t i = 0; i < a.u.l->n; i++)
      if (!jj_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
    return 1;
  case JV_DICT:
    if (a.u.d->n != b.u.d->n) return 0;
    for (size_t i = 0; i < a.u.d->n; i++) {
      jv *o = jj_dict_get(b.u.d, a.u.d->k[i]);
      if (!o || !jj_equal(a.u.d->v[i], *o)) return 0;
    }
    return 1;
  default: return a.u.d == b.u.d; /* namespaces, functions: identity */
  }
}

const char *jj_kind_name(jv v) {
  switch (v.kind) {
  case JV_UNDEF: return "Undefined";
  case JV_NONE: return "NoneType";
  case JV_BOOL: return "bool";
  case JV_INT: return "int";
  case JV_FLOAT: return "float";
  case JV_STR: return "str";
  case JV_LIST: {
    static const char *const names[] = {"list", "tuple", "generator", "dict_items", "dict_keys", "dict_values", "range"};
    return v.tuple <= JV_SEQ_RANGE ? names[v.tuple] : "list";
  }
  case JV_DICT: return "dict";
  case JV_NS: return "Namespace";
  case JV_LOOP: return "LoopContext";
  default: return "function";
  }
}

/* ---- printing ------------------------------------------------------------------------------- */
/* Python's repr(float): the shortest digits that round-trip, fixed notation for decimal exponents
 * in [-4, 16), else scientific with a two-digit exponent at least. */
void jj_float_repr(jj_buf *b, double f) {
  if (isnan(f)) { jj_buf_puts(b, "nan"); return; }
  if (isinf(f)) { jj_buf_puts(b, f < 0 ? "-inf" : "inf"); return; }
  if (f == 0) { jj_buf_puts(b, signbit(f) ? "-0.0" : "0.0"); return; }
  char tmp[40];
  int prec;
  for (prec = 1; prec <= 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
    if (strtod(tmp, NULL) == f) break;
  }
  /* tmp: [-]d.ddde[+-]XX */
  char digits[24];
  int nd = 0, neg = 0;
  const char *s = tmp;
  if (*s == '-') { neg = 1; s++; }
  while (*s && *s != 'e') {
    if (*s >= '0' && *s <= '9') digits[nd++] = *s;
    s++;
  }
  int e10 = atoi(s + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  if (neg) jj_buf_putc(b, '-');
  if (e10 >= -4 && e10 < 16) {
    if (e10 < 0) {
      jj_buf_puts(b, "0.");
      for (int i = 0; i < -e10 - 1; i++) jj_buf_putc(b, '0');
      jj_buf_put(b, digits, (size_t)nd);
    } else {
      int intd = e10 + 1;
      for (int i = 0; i < intd; i++) jj_buf_putc(b, i < nd ? digits[i] : '0');
      jj_buf_putc(b, '.');
      if (nd > intd) jj_buf_put(b, digits + intd, (size_t)(nd - intd));
      else jj_buf_putc(b, '0');
    }
  } else {
    jj_buf_putc(b, digits[0]);
    if (nd > 1) {
      jj_buf_putc(b, '.');
      jj_buf_put(b, digits + 1, (size_t)(nd - 1));
    }
    jj_buf_printf(b, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
  }
}

/* Python's str.isprintable(), approximated without the Unicode database: control characters,
 * the C1 block, soft hyphen, zero-width and bidi marks, line/paragraph separators, surrogates,
 * private use and the BOM are unprintable. */
static int py_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return 0;
  if ((cp >= 0x200b && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x2064))
    return 0;
  if ((cp >= 0xd800 && cp <= 0xf8ff) || cp == 0xfeff || cp > 0x10ffff) return 0;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x205f || cp == 0x3000) return 0;
  return 1;
}

static void repr_str(jj_buf *b, const char *p, size_t n) {
  int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  jj_buf_putc(b, q);
  size_t i = 0;
  while (i < n) {
    uint32_t c = jj_utf8_next(p, n, &i);
    if (c == (uint32_t)q || c == '\\') { jj_buf_putc(b, '\\'); jj_buf_putc(b, (char)c); }
    else if (c == '\n') jj_buf_puts(b, "\\n");
    else if (c == '\r') jj_buf_puts(b, "\\r");
    else if (c == '\t') jj_buf_puts(b, "\\t");
    else if (!py_printable(c)) {
      if (c < 0x100) jj_buf_printf(b, "\\x%02x", c);
      else if (c < 0x10000) jj_buf_printf(b, "\\u%04x", c);
      else jj_buf_printf(b, "\\U%08x", c);
    } else jj_utf8_put(b, c);
  }
  jj_buf_putc(b, q);
}

/* Containers being printed, so that a namespace holding itself prints as Python does: its dict
 * repr shows "{...}" when met again inside itself (reprlib's recursion guard). */
typedef struct repr_path { const void *p[72]; int n; } repr_path;

static void repr_in(jj_buf *b, jv v, repr_path *path);
static void str_in(jj_buf *b, jv v, repr_path *path);

void jj_repr(jj_buf *b, jv v) { repr_path path = {{0}, 0}; repr_in(b, v, &path); }
void jj_to_str(jj_buf *b, jv v) { repr_path path = {{0}, 0}; str_in(b, v, &path); }

static int path_push(jj_buf *b, repr_path *path, const void *p, const char *again) {
  for (int i = 0; i < path->n; i++)
    if (path->p[i] == p) {
      jj_buf_puts(b, again);
      return 0;
    }
  if (path->n >= 64) { /* deeper than any real value: stop */
    jj_buf_puts(b, "...");
    return 0;
  }
  path->p[path->n++] = p;
  return 1;
}

static void repr_in(jj_buf *b, jv v, repr_path *path) {
  if (b->failed) return;
  switch (v.kind) {
  case JV_STR: repr_str(b, v.u.s.p, v.u.s.n); return;
  case JV_LIST:
    if (v.tuple == JV_SEQ_ITER) { /* Python prints the object's address; there is nothing to match */
      jj_buf_puts(b, "<generator object>");
      return;
    }
    if (v.tuple == JV_SEQ_RANGE) {
      if (v.u.l->step == 1) jj_buf_printf(b, "range(%lld, %lld)", (long long)v.u.l->start, (long long)v.u.l->stop);
      else jj_buf_printf(b, "range(%lld, %lld, %lld)", (long long)v.u.l->start, (long long)v.u.l->stop, (long long)v.u.l->step);
      return;
    }
    if (v.tuple >= JV_SEQ_ITEMS && v.tuple <= JV_SEQ_VALUES) { /* dict_items([...]) */
      jv l = v;
      l.tuple = JV_SEQ_LIST;
      jj_buf_puts(b, jj_kind_name(v));
      jj_buf_putc(b, '(');
      repr_in(b, l, path);
      jj_buf_putc(b, ')');
      return;
    }
    if (!path_push(b, path, v.u.l, v.tuple ? "(...)" : "[...]")) return;
    jj_buf_putc(b, v.tuple ? '(' : '[');
    for (size_t i = 0; i < v.u.l->n; i++) {
      if (i) jj_buf_puts(b, ", ");
      repr_in(b, v.u.l->v[i], path);
    }
    if (v.tuple && v.u.l->n == 1) jj_buf_putc(b, ',');
    jj_buf_putc(b, v.tuple ? ')' : ']');
    path->n--;
    return;
  case JV_DICT:
    if (!path_push(b, path, v.u.d, "{...}")) return;
    jj_buf_putc(b, '{');
    for (size_t i = 0; i < v.u.d->n; i++) {
      if (i) jj_buf_puts(b, ", ");
      repr_in(b, v.u.d->k[i], path);
      jj_buf_puts(b, ": ");
      repr_in(b, v.u.d->v[i], path);
    }
    jj_buf_putc(b, '}');
    path->n--;
    return;
  case JV_UNDEF: jj_buf_puts(b, "Undefined"); return; /* Jinja's Undefined.__repr__ */
  default: str_in(b, v, path);
  }
}

static void str_in(jj_buf *b, jv v, repr_path *path) {
  if (b->failed) return;
  switch (v.kind) {
  case JV_UNDEF: return;
  case JV_NONE: jj_buf_puts(b, "None"); return;
  case JV_BOOL: jj_buf_puts(b, v.u.i ? "True" : "False"); return;
  case JV_INT: jj_buf_printf(b, "%lld", (long long)v.u.i); return;
  case JV_FLOAT: jj_float_repr(b, v.u.f); return;
  case JV_STR: jj_buf_put(b, v.u.s.p, v.u.s.n); return;
  case JV_LIST: case JV_DICT: repr_in(b, v, path); return;
  case JV_NS:
    jj_buf_puts(b, "<Namespace ");
    { jv d = v; d.kind = JV_DICT; repr_in(b, d, path); }
    jj_buf_putc(b, '>');
    return;
  case JV_LOOP: jj_buf_printf(b, "<LoopContext %lld/%lld>", (long long)v.u.loop->i + 1, (long long)v.u.loop->n); return;
  default: jj_buf_printf(b, "<function %s>", v.u.fn->name ? v.u.fn->name : "?"); return;
  }
}

/* ---- JSON ----------------------------------------------------------------------------------- */
static void json_str(jj_buf *b, const char *p, size_t n, int ensure_ascii) {
  jj_buf_putc(b, '"');
  size_t i = 0;
  while (i < n) {
    size_t st = i;
    uint32_t c = jj_utf8_next(p, n, &i);
    switch (c) {
    case '"': jj_buf_puts(b, "\\\""); break;
    case '\\': jj_buf_puts(b, "\\\\"); break;
    case '\n': jj_buf_puts(b, "\\n"); break;
    case '\r': jj_buf_puts(b, "\\r"); break;
    case '\t': jj_buf_puts(b, "\\t"); break;
    case '\b': jj_buf_puts(b, "\\b"); break;
    case '\f': jj_buf_puts(b, "\\f"); break;
    default:
      if (c < 0x20) jj_buf_printf(b, "\\u%04x", c);
      else if (ensure_ascii && c >= 0x80) {
        if (c >= 0x10000) {
          uint32_t v = c - 0x10000;
          jj_buf_printf(b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
        } else jj_buf_printf(b, "\\u%04x", c);
      } else jj_buf_put(b, p + st, i - st);
    }
  }
  jj_buf_putc(b, '"');
}

static void json_newline(jj_buf *b, const jj_json_opts *o, int depth) {
  jj_buf_putc(b, '\n');
  for (int i = 0; i < depth; i++) jj_buf_puts(b, o->indent);
}

static int key_cmp_str(jv a, jv b) {
  size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
  int c = memcmp(a.u.s.p, b.u.s.p, n);
  return c ? c : (a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n);
}

int jj_to_json(jj_buf *b, jv v, const jj_json_opts *o, int depth, const char **bad) {
  if (depth > 200) { *bad = "nested too deeply"; return -1; }
  switch (v.kind) {
  case JV_NONE: jj_buf_puts(b, "null"); return 0;
  case JV_BOOL: jj_buf_puts(b, v.u.i ? "true" : "false"); return 0;
  case JV_INT: jj_buf_printf(b, "%lld", (long long)v.u.i); return 0;
  case JV_FLOAT:
    if (isnan(v.u.f)) jj_buf_puts(b, "NaN");
    else if (isinf(v.u.f)) jj_buf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
    else jj_float_repr(b, v.u.f);
    return 0;
  case JV_STR: json_str(b, v.u.s.p, v.u.s.n, o->ensure_ascii); return 0;
  case JV_LIST:
    if (v.tuple != JV_SEQ_LIST && v.tuple != JV_SEQ_TUPLE) { *bad = jj_kind_name(v); return -1; }
    if (v.u.l->n == 0) { jj_buf_puts(b, "[]"); return 0; }
    jj_buf_putc(b, '[');
    for (size_t i = 0; i < v.u.l->n; i++) {
      if (i) jj_buf_puts(b, o->item_sep);
      if (o->indent) json_newline(b, o, depth + 1);
      if (jj_to_json(b, v.u.l->v[i], o, depth + 1, bad)) return -1;
    }
    if (o->indent) json_newline(b, o, depth);
    jj_buf_putc(b, ']');
    return 0;
  case JV_DICT: {
    size_t n = v.u.d->n;
    if (n == 0) { jj_buf_puts(b, "{}"); return 0; }
    /* Keys: str as is; int, float, bool and None become strings as json.dumps does. */
    size_t *order = malloc(n * sizeof *order);
    if (!order) { b->failed = 1; return 0; }
    for (size_t i = 0; i < n; i++) order[i] = i;
    for (size_t i = 0; i < n; i++) {
      jv k = v.u.d->k[i];
      if (k.kind != JV_STR && k.kind != JV_INT && k.kind != JV_BOOL && k.kind != JV_FLOAT && k.kind != JV_NONE) {
        free(order);
        *bad = "keys must be str, int, float, bool or None";
        return -1;
      }
    }
    if (o->sort_keys) {
      for (size_t i = 0; i < n; i++)
        if (v.u.d->k[i].kind != JV_STR) {
          free(order);
          *bad = "sort_keys with non-string keys";
          return -1;
        }
      for (size_t i = 1; i < n; i++) { /* insertion sort: stable, dicts here are small */
        size_t x = order[i], j = i;
        while (j > 0 && key_cmp_str(v.u.d->k[order[j - 1]], v.u.d->k[x]) > 0) {
          order[j] = order[j - 1];
          j--;
        }
        order[j] = x;
      }
    }
    jj_buf_putc(b, '{');
    for (size_t ii = 0; ii < n; ii++) {
      size_t i = order[ii];
      if (ii) jj_buf_puts(b, o->item_sep);
      if (o->indent) json_newline(b, o, depth + 1);
      jv k = v.u.d->k[i];
      if (k.kind == JV_STR) json_str(b, k.u.s.p, k.u.s.n, o->ensure_ascii);
      else {
        jj_buf_putc(b, '"');
        if (k.kind == JV_NONE) jj_buf_puts(b, "null");
        else if (k.kind == JV_BOOL) jj_buf_puts(b, k.u.i ? "true" : "false");
        else jj_to_json(b, k, o, depth + 1, bad);
        jj_buf_putc(b, '"');
      }
      jj_buf_puts(b, o->key_sep);
      if (jj_to_json(b, v.u.d->v[i], o, depth + 1, bad)) { free(order); return -1; }
    }
    free(order);
    if (o->indent) json_newline(b, o, depth);
    jj_buf_putc(b, '}');
    return 0;
  }
  default: *bad = jj_kind_name(v); return -1;
  }
}

/* JSON numbers: integral values that fit exactly become ints (Python's json.loads gives int for
 * "3" and float for "3.0"; cJSON keeps no such distinction, so "3.0" reads as 3 here). */
jv jj_from_cjson(jj_arena *a, const cJSON *j) {
  if (!j) return jv_undef();
  if (cJSON_IsNull(j)) return jv_none();
  if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
  if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    int64_t i;
    if (di_json_int_in(j, -DI_JSON_MAX_EXACT_INT + 1, DI_JSON_MAX_EXACT_INT - 1, &i)) return jv_int(i);
    return jv_float(d);
  }
  if (cJSON_IsString(j)) return jj_str_dup(a, j->valuestring, strlen(j->valuestring));
  if (cJSON_IsArray(j)) {
    jv r = {0};
    r.kind = JV_LIST;
    r.u.l = jj_list_new(a, (size_t)cJSON_GetArraySize(j));
    if (!r.u.l) return jv_undef();
    for (const cJSON *c = j->child; c; c = c->next)
      if (jj_list_push(a, r.u.l, jj_from_cjson(a, c))) return jv_undef();
    return r;
  }
  if (cJSON_IsObject(j)) {
    jv r = {0};
    r.kind = JV_DICT;
    r.u.d = jj_dict_new(a, (size_t)cJSON_GetArraySize(j));
    if (!r.u.d) return jv_undef();
    for (const cJSON *c = j->child; c; c = c->next) {
      const char *k = c->string ? c->string : "";
      if (jj_dict_set(a, r.u.d, jj_str_dup(a, k, strlen(k)), jj_from_cjson(a, c))) return jv_undef();
    }
    return r;
  }
  return jv_undef();
}
