/* JSON text to template values with Python's json.loads semantics, which cJSON cannot give:
 * "3" is an int and "3.0" a float (so tojson prints them back as transformers does), strings
 * keep embedded NULs, duplicate keys keep the last value at the first key's place. Also the
 * template variables a render starts from (jj_vars). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "chat/jinja.h"

typedef struct jp {
  jj_arena *a;
  const char *s;
  size_t n, i;
  const char *what;
  int depth;
} jp;

static di_status jerr(jp *p, const char *msg) {
  return di_error_set(DI_ERR_INVALID_ARG, "%s: invalid JSON at byte %zu: %s", p->what, p->i, msg);
}

static void skip_ws(jp *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static int hex4(const char *s, uint32_t *out) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    char c = s[k];
    int h = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (h < 0) return -1;
    v = v * 16 + (uint32_t)h;
  }
  *out = v;
  return 0;
}

static di_status parse_string(jp *p, jv *out) {
  p->i++; /* opening quote */
  jj_buf b = {0};
  while (p->i < p->n && p->s[p->i] != '"') {
    unsigned char c = (unsigned char)p->s[p->i];
    if (c < 0x20) { jj_buf_free(&b); return jerr(p, "control character in a string"); }
    if (c != '\\') { jj_buf_putc(&b, (char)c); p->i++; continue; }
    if (p->i + 1 >= p->n) break;
    char e = p->s[p->i + 1];
    p->i += 2;
    switch (e) {
    case '"': jj_buf_putc(&b, '"'); break;
    case '\\': jj_buf_putc(&b, '\\'); break;
    case '/': jj_buf_putc(&b, '/'); break;
    case 'b': jj_buf_putc(&b, '\b'); break;
    case 'f': jj_buf_putc(&b, '\f'); break;
    case 'n': jj_buf_putc(&b, '\n'); break;
    case 'r': jj_buf_putc(&b, '\r'); break;
    case 't': jj_buf_putc(&b, '\t'); break;
    case 'u': {
      uint32_t cp, lo;
      if (p->i + 4 > p->n || hex4(p->s + p->i, &cp)) { jj_buf_free(&b); return jerr(p, "bad \\u escape"); }
      p->i += 4;
      if (cp >= 0xd800 && cp <= 0xdbff && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u' &&
          !hex4(p->s + p->i + 2, &lo) && lo >= 0xdc00 && lo <= 0xdfff) {
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        p->i += 6;
      } else if (cp >= 0xd800 && cp <= 0xdfff) {
        jj_buf_free(&b);
        return jerr(p, "a lone surrogate escape (text must be valid Unicode)");
      }
      jj_utf8_put(&b, cp);
      break;
    }
    default: jj_buf_free(&b); return jerr(p, "bad escape in a string");
    }
  }
  if (p->i >= p->n) { jj_buf_free(&b); return jerr(p, "unterminated string"); }
  p->i++;
  if (b.failed) { jj_buf_free(&b); return di_error_set(DI_ERR_OOM, "%s: out of memory", p->what); }
  *out = jj_str_dup(p->a, b.p ? b.p : "", b.n);
  jj_buf_free(&b);
  return out->kind == JV_STR ? DI_OK : di_error_set(DI_ERR_OOM, "%s: out of memory", p->what);
}

static di_status parse_number(jp *p, jv *out) {
  size_t st = p->i;
  int is_float = 0;
  if (p->s[p->i] == '-') p->i++;
  if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jerr(p, "bad number");
  if (p->s[p->i] == '0') p->i++;
  else while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  if (p->i < p->n && p->s[p->i] == '.') {
    is_float = 1;
    p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jerr(p, "bad number");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  }
  if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
    is_float = 1;
    p->i++;
    if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jerr(p, "bad number");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  }
  char buf[400];
  size_t len = p->i - st;
  if (len >= sizeof buf) return jerr(p, "number too long");
  memcpy(buf, p->s + st, len);
  buf[len] = 0;
  if (is_float) {
    *out = jv_float(strtod(buf, NULL));
    return DI_OK;
  }
  errno = 0;
  long long v = strtoll(buf, NULL, 10);
  if (errno == ERANGE)
    return di_error_set(DI_ERR_UNSUPPORTED, "%s: the integer %s does not fit in 64 bits", p->what, buf);
  *out = jv_int(v);
  return DI_OK;
}

static di_status parse_value(jp *p, jv *out) {
  skip_ws(p);
  if (p->i >= p->n) return jerr(p, "unexpected end");
  if (++p->depth > 512) return jerr(p, "nested too deeply");
  char c = p->s[p->i];
  di_status st = DI_OK;
  if (c == '{') {
    p->i++;
    jv r = {0};
    r.kind = JV_DICT;
    r.u.d = jj_dict_new(p->a, 0);
    if (!r.u.d) return di_error_set(DI_ERR_OOM, "%s: out of memory", p->what);
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') p->i++;
    else
      for (;;) {
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') return jerr(p, "expected a string key");
        jv k, v;
        DI_TRY(parse_string(p, &k));
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') return jerr(p, "expected ':'");
        p->i++;
        DI_TRY(parse_value(p, &v));
        if (jj_dict_set(p->a, r.u.d, k, v)) return di_error_set(DI_ERR_OOM, "%s: out of memory", p->what);
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->n && p->s[p->i] == '}') { p->i++; break; }
        return jerr(p, "expected ',' or '}'");
      }
    *out = r;
  } else if (c == '[') {
    p->i++;
    jv r = {0};
    r.kind = JV_LIST;
    r.u.l = jj_list_new(p->a, 0);
    if (!r.u.l) return di_error_set(DI_ERR_OOM, "%s: out of memory", p->what);
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ']') p->i++;
    else
      for (;;) {
        jv v;
        DI_TRY(parse_value(p, &v));
        if (jj_list_push(p->a, r.u.l, v)) return di_error_set(DI_ERR_OOM, "%s: out of memory", p->what);
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->n && p->s[p->i] == ']') { p->i++; break; }
        return jerr(p, "expected ',' or ']'");
      }
    *out = r;
  } else if (c == '"') {
    st = parse_string(p, out);
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    st = parse_number(p, out);
  } else if (p->n - p->i >= 4 && memcmp(p->s + p->i, "true", 4) == 0) {
    p->i += 4;
    *out = jv_bool(1);
  } else if (p->n - p->i >= 5 && memcmp(p->s + p->i, "false", 5) == 0) {
    p->i += 5;
    *out = jv_bool(0);
  } else if (p->n - p->i >= 4 && memcmp(p->s + p->i, "null", 4) == 0) {
    p->i += 4;
    *out = jv_none();
  } else if (p->n - p->i >= 3 && memcmp(p->s + p->i, "NaN", 3) == 0) { /* Python accepts these */
    p->i += 3;
    *out = jv_float(NAN);
  } else if (p->n - p->i >= 8 && memcmp(p->s + p->i, "Infinity", 8) == 0) {
    p->i += 8;
    *out = jv_float(INFINITY);
  } else if (p->n - p->i >= 9 && memcmp(p->s + p->i, "-Infinity", 9) == 0) {
    p->i += 9;
    *out = jv_float(-INFINITY);
  } else return jerr(p, "unexpected character");
  p->depth--;
  return st;
}

di_status jj_json_parse(jj_arena *a, const char *text, size_t n, const char *what, jv *out) {
  jp p = {a, text, n, 0, what ? what : "JSON", 0};
  DI_TRY(parse_value(&p, out));
  skip_ws(&p);
  if (p.i != n) return jerr(&p, "extra data after the value");
  if (a->failed) return di_error_set(DI_ERR_OOM, "%s: out of memory", p.what);
  return DI_OK;
}

/* ---- render variables ----------------------------------------------------------------------- */
di_status jj_vars_init(jj_vars *v) {
  memset(v, 0, sizeof *v);
  v->d = jj_dict_new(&v->arena, 0);
  return v->d ? DI_OK : di_error_set(DI_ERR_OOM, "chat template: out of memory");
}

void jj_vars_free(jj_vars *v) { jj_arena_free(&v->arena); }

di_status jj_vars_set(jj_vars *v, const char *name, jv val) {
  jv k = jj_str_dup(&v->arena, name, strlen(name));
  if (k.kind != JV_STR || jj_dict_set(&v->arena, v->d, k, val)) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  return DI_OK;
}

di_status jj_vars_set_cjson(jj_vars *v, const char *name, const cJSON *j) {
  jv x = jj_from_cjson(&v->arena, j);
  if (v->arena.failed) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  return jj_vars_set(v, name, x);
}
