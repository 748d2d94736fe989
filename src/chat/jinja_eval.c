/* Evaluator of the Jinja subset: walks the syntax tree with Jinja2's scoping (a for-loop body gets
 * a fresh scope each iteration, `if` none, macros their own), Python's value semantics for
 * operators, Jinja2's Undefined (prints empty, is falsy, errors when used as an object or operand)
 * and limits on memory, output and steps so that a hostile template cannot hang or exhaust us. */
#include "chat/jinja.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct frame {
  struct frame *parent;
  jv_dict *vars;
} frame;

typedef struct jj_ctx {
  jj_arena *a;
  jj_buf *out;
  frame *root;
  uint64_t steps, max_steps;
  int clock_pinned;   /* strftime_now() formats pinned_now in UTC (jj_render_options) */
  int64_t pinned_now;
  int flow; /* 1: break, 2: continue */
  int depth;
  jv pending_caller; /* a {% call %} block's body, handed to the next macro call */
} jj_ctx;

jj_arena *jj_ctx_arena(jj_ctx *c) { return c->a; }
size_t jj_ctx_out_limit(jj_ctx *c) { return c->out->limit; }
int jj_ctx_now(jj_ctx *c, struct tm *tmv) {
  if (c->clock_pinned) {
    time_t t = (time_t)c->pinned_now;
    return gmtime_r(&t, tmv) != NULL;
  }
  time_t now = time(NULL);
  return localtime_r(&now, tmv) != NULL; /* Python's datetime.now() is local time */
}

di_status jj_err(jj_ctx *c, const jnode *at, di_status st, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (at) return di_error_set(st, "chat template line %d column %d: %s", at->line, at->col, msg);
  return di_error_set(st, "chat template: %s", msg);
}

/* the render's output stopped: over its max_output (the caller's bound on the rendered text, e.g. what
 * a context of max_model_len tokens can hold), or out of memory */
static di_status output_failed(jj_ctx *c, const jnode *at) {
  if (c->out->over_limit)
    return jj_err(c, at, DI_ERR_CONTEXT_OVERFLOW, "the output is too large (over %zu bytes)", c->out->limit);
  return jj_err(c, at, DI_ERR_OOM, "the output is too large (out of memory)");
}

static di_status oom(jj_ctx *c, const jnode *at) {
  if (c->a->limit && c->a->used_total + 65536 >= c->a->limit)
    return jj_err(c, at, DI_ERR_OOM, "the template used more than %zu MiB of memory", c->a->limit >> 20);
  return jj_err(c, at, DI_ERR_OOM, "out of memory");
}

static di_status step(jj_ctx *c, const jnode *at) {
  if (++c->steps > c->max_steps)
    return jj_err(c, at, DI_ERR_UNSUPPORTED, "the template ran more than %llu steps",
                  (unsigned long long)c->max_steps);
  if (c->a->failed) return oom(c, at);
  return DI_OK;
}

static di_status undef_err(jj_ctx *c, const jnode *at, jv u) {
  if (u.u.s.p) return jj_err(c, at, DI_ERR_INVALID_ARG, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p);
  return jj_err(c, at, DI_ERR_INVALID_ARG, "a value is undefined");
}

static frame *frame_new(jj_ctx *c, frame *parent) {
  frame *f = jj_alloc(c->a, sizeof *f);
  if (!f) return NULL;
  f->parent = parent;
  f->vars = jj_dict_new(c->a, 0);
  return f->vars ? f : NULL;
}

static jv *lookup(frame *f, const char *name, size_t n) {
  for (; f; f = f->parent) {
    jv *v = jj_dict_gets(f->vars, name, n);
    if (v) return v;
  }
  return NULL;
}

static di_status assign(jj_ctx *c, frame *f, const char *name, size_t n, jv v, const jnode *at) {
  jv k = jj_str_dup(c->a, name, n);
  if (k.kind != JV_STR || jj_dict_set(c->a, f->vars, k, v)) return oom(c, at);
  return DI_OK;
}

static di_status eval(jj_ctx *c, frame *f, const jnode *e, jv *out);
static di_status exec_body(jj_ctx *c, frame *f, const jn_list *body);

/* ---- iteration ------------------------------------------------------------------------------ */
/* The items a for loop or a filter walks: list/tuple items, dict keys, string characters. */
di_status jj_iter_items(jj_ctx *c, const jnode *at, jv v, jv_list **out);
di_status jj_iter_items(jj_ctx *c, const jnode *at, jv v, jv_list **out) {
  if (v.kind == JV_LIST) {
    if (v.u.l->err) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s", v.u.l->err);
    *out = v.u.l;
    return DI_OK;
  }
  jv_list *l = jj_list_new(c->a, 0);
  if (!l) return oom(c, at);
  if (v.kind == JV_UNDEF) {
    *out = l;
    return DI_OK;
  }
  if (v.kind == JV_DICT) {
    for (size_t i = 0; i < v.u.d->n; i++)
      if (jj_list_push(c->a, l, v.u.d->k[i])) return oom(c, at);
  } else if (v.kind == JV_STR) {
    size_t i = 0;
    while (i < v.u.s.n) {
      size_t st = i;
      jj_utf8_next(v.u.s.p, v.u.s.n, &i);
      if (jj_list_push(c->a, l, jv_strn(v.u.s.p + st, i - st))) return oom(c, at);
    }
  } else return jj_err(c, at, DI_ERR_INVALID_ARG, "'%s' object is not iterable", jj_kind_name(v));
  *out = l;
  return DI_OK;
}

/* ---- arithmetic and comparison -------------------------------------------------------------- */
static int is_num(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT; }
static double num(jv v) { return v.kind == JV_FLOAT ? v.u.f : (double)v.u.i; }

static const char *op_name(int op) {
  static const char *const n[] = {"?", "+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", "<=", ">", ">=", "in", "not in"};
  return op >= 0 && op <= OP_NOTIN ? n[op] : "?";
}

static di_status type_err(jj_ctx *c, const jnode *at, int op, jv a, jv b) {
  return jj_err(c, at, DI_ERR_INVALID_ARG, "unsupported operand types for %s: '%s' and '%s'", op_name(op),
                jj_kind_name(a), jj_kind_name(b));
}

static di_status repeat(jj_ctx *c, const jnode *at, jv seq, int64_t times, jv *out) {
  if (times < 0) times = 0;
  /* an empty sequence repeats to itself: without this the copy loops ran `times` (up to 2^63)
   * empty iterations (fuzz finding crash-chat_template-bdeb4d673c66fe17: '' * 2 * 4 * 2 * 5e13) */
  if ((seq.kind == JV_STR ? seq.u.s.n : seq.u.l->n) == 0) times = 0;
  if (seq.kind == JV_STR) {
    if (seq.u.s.n && (uint64_t)times > (64u << 20) / seq.u.s.n) return oom(c, at);
    size_t n = seq.u.s.n * (size_t)times;
    char *p = jj_alloc(c->a, n + 1);
    if (!p) return oom(c, at);
    for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
    *out = jv_strn(p, n);
    return DI_OK;
  }
  if (seq.u.l->n && (uint64_t)times > (1u << 22) / seq.u.l->n) return oom(c, at);
  jv r = seq;
  r.u.l = jj_list_new(c->a, seq.u.l->n * (size_t)times);
  if (!r.u.l) return oom(c, at);
  for (int64_t i = 0; i < times; i++)
    for (size_t k = 0; k < seq.u.l->n; k++)
      if (jj_list_push(c->a, r.u.l, seq.u.l->v[k])) return oom(c, at);
  *out = r;
  return DI_OK;
}

static di_status arith(jj_ctx *c, const jnode *at, int op, jv a, jv b, jv *out) {
  if (op == OP_MOD && a.kind == JV_STR) return jj_format(c, at, a, b, out);
  if (a.kind == JV_UNDEF) return undef_err(c, at, a);
  if (b.kind == JV_UNDEF) return undef_err(c, at, b);
  if (is_num(a) && is_num(b)) {
    int fl = a.kind == JV_FLOAT || b.kind == JV_FLOAT;
    if (op == OP_DIV) {
      if (num(b) == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "division by zero");
      *out = jv_float(num(a) / num(b));
      return DI_OK;
    }
    if (fl || op == OP_POW) {
      double x = num(a), y = num(b), r;
      if (op == OP_POW && !fl) { /* int ** int: an int when the exponent is non-negative */
        if (a.u.i == 0 && b.u.i < 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "0 cannot be raised to a negative power");
        if (b.u.i >= 0) {
          int64_t acc = 1, base = a.u.i;
          for (int64_t k = 0; k < b.u.i; k++) {
            if (__builtin_mul_overflow(acc, base, &acc)) return jj_err(c, at, DI_ERR_UNSUPPORTED, "integer overflow");
            if (acc == 0 || acc == 1) break;
          }
          *out = jv_int(acc);
          return DI_OK;
        }
      }
      switch (op) {
      case OP_ADD: r = x + y; break;
      case OP_SUB: r = x - y; break;
      case OP_MUL: r = x * y; break;
      case OP_FLOORDIV:
        if (y == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "division by zero");
        r = floor(x / y);
        if (r == 0) r = copysign(0.0, x / y);
        break;
      case OP_MOD:
        if (y == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "division by zero");
        r = fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        if (r == 0) r = copysign(0.0, y); /* Python: a zero result takes the divisor's sign */
        break;
      case OP_POW:
        if (x == 0 && y < 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != floor(y)) return jj_err(c, at, DI_ERR_UNSUPPORTED, "a negative number to a fractional power is complex");
        r = pow(x, y);
        break;
      default: return type_err(c, at, op, a, b);
      }
      *out = jv_float(r);
      return DI_OK;
    }
    int64_t x = a.u.i, y = b.u.i, r;
    switch (op) {
    case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; break;
    case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; break;
    case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; break;
    case OP_FLOORDIV:
    case OP_MOD:
      if (y == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "division by zero");
      if (x == INT64_MIN && y == -1) goto ovf;
      {
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
        r = op == OP_FLOORDIV ? q : m;
      }
      break;
    default: return type_err(c, at, op, a, b);
    }
    *out = jv_int(r);
    return DI_OK;
  ovf:
    return jj_err(c, at, DI_ERR_UNSUPPORTED, "integer overflow");
  }
  if (op == OP_ADD && a.kind == JV_STR && b.kind == JV_STR) {
    size_t n = a.u.s.n + b.u.s.n;
    char *p = jj_alloc(c->a, n + 1);
    if (!p) return oom(c, at);
    memcpy(p, a.u.s.p, a.u.s.n);
    memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
    *out = jv_strn(p, n);
    return DI_OK;
  }
  if (op == OP_ADD && a.kind == JV_LIST && b.kind == JV_LIST && a.tuple == b.tuple && a.tuple <= JV_SEQ_TUPLE) {
    jv r = a;
    r.u.l = jj_list_new(c->a, a.u.l->n + b.u.l->n);
    if (!r.u.l) return oom(c, at);
    for (size_t i = 0; i < a.u.l->n; i++) jj_list_push(c->a, r.u.l, a.u.l->v[i]);
    for (size_t i = 0; i < b.u.l->n; i++) jj_list_push(c->a, r.u.l, b.u.l->v[i]);
    *out = r;
    return DI_OK;
  }
  if (op == OP_MUL) {
    int ra = a.kind == JV_STR || (a.kind == JV_LIST && a.tuple <= JV_SEQ_TUPLE && a.tuple != JV_SEQ_ITER);
    int rb = b.kind == JV_STR || (b.kind == JV_LIST && b.tuple <= JV_SEQ_TUPLE && b.tuple != JV_SEQ_ITER);
    if (ra && (b.kind == JV_INT || b.kind == JV_BOOL)) return repeat(c, at, a, b.u.i, out);
    if (rb && (a.kind == JV_INT || a.kind == JV_BOOL)) return repeat(c, at, b, a.u.i, out);
  }
  return type_err(c, at, op, a, b);
}

static int str_cmp(jv a, jv b) {
  size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
  int r = memcmp(a.u.s.p, b.u.s.p, n);
  return r ? (r < 0 ? -1 : 1) : (a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n);
}

/* Python ordering for <, <=, >, >=: numbers, strings, and lists/tuples elementwise. */
static di_status order(jj_ctx *c, const jnode *at, int op, jv a, jv b, int *cmp) {
  if (is_num(a) && is_num(b)) {
    double x = num(a), y = num(b);
    if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) *cmp = a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
    else *cmp = x < y ? -1 : x > y ? 1 : 0;
    return DI_OK;
  }
  if (a.kind == JV_STR && b.kind == JV_STR) {
    *cmp = str_cmp(a, b);
    return DI_OK;
  }
  if (a.kind == JV_LIST && b.kind == JV_LIST && a.tuple == b.tuple && a.tuple <= JV_SEQ_TUPLE) {
    size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
    for (size_t i = 0; i < n; i++) {
      if (jj_equal(a.u.l->v[i], b.u.l->v[i])) continue;
      return order(c, at, op, a.u.l->v[i], b.u.l->v[i], cmp);
    }
    *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    return DI_OK;
  }
  if (a.kind == JV_UNDEF) return undef_err(c, at, a);
  if (b.kind == JV_UNDEF) return undef_err(c, at, b);
  return jj_err(c, at, DI_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'", op_name(op),
                jj_kind_name(a), jj_kind_name(b));
}

/* Python's `needle in hay`. */
di_status jj_contains(jj_ctx *c, const jnode *at, jv hay, jv needle, int *out);
di_status jj_contains(jj_ctx *c, const jnode *at, jv hay, jv needle, int *out) {
  switch (hay.kind) {
  case JV_STR:
    if (needle.kind != JV_STR)
      return jj_err(c, at, DI_ERR_INVALID_ARG, "'in <string>' requires string as left operand, not %s", jj_kind_name(needle));
    *out = needle.u.s.n == 0 || memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    return DI_OK;
  case JV_LIST:
    if (hay.u.l->err) return jj_err(c, at, DI_ERR_INVALID_ARG, "%s", hay.u.l->err);
    *out = 0;
    for (size_t i = 0; i < hay.u.l->n; i++)
      if (jj_equal(hay.u.l->v[i], needle)) { *out = 1; break; }
    return DI_OK;
  case JV_DICT:
    if ((needle.kind == JV_LIST && (needle.tuple == JV_SEQ_LIST || (needle.tuple >= JV_SEQ_ITEMS && needle.tuple <= JV_SEQ_VALUES))) ||
        needle.kind == JV_DICT)
      return jj_err(c, at, DI_ERR_INVALID_ARG, "unhashable type: '%s'", jj_kind_name(needle));
    *out = jj_dict_get(hay.u.d, needle) != NULL;
    return DI_OK;
  case JV_UNDEF: *out = 0; return DI_OK; /* Undefined iterates as empty */
  default:
    return jj_err(c, at, DI_ERR_INVALID_ARG, "argument of type '%s' is not iterable", jj_kind_name(hay));
  }
}

static di_status compare(jj_ctx *c, const jnode *at, int op, jv a, jv b, int *res) {
  int cmp;
  switch (op) {
  case OP_EQ: *res = jj_equal(a, b); return DI_OK;
  case OP_NE: *res = !jj_equal(a, b); return DI_OK;
  case OP_IN: return jj_contains(c, at, b, a, res);
  case OP_NOTIN: DI_TRY(jj_contains(c, at, b, a, res)); *res = !*res; return DI_OK;
  default:
    DI_TRY(order(c, at, op, a, b, &cmp));
    *res = op == OP_LT ? cmp < 0 : op == OP_LE ? cmp <= 0 : op == OP_GT ? cmp > 0 : cmp >= 0;
    return DI_OK;
  }
}

/* ---- subscripts ----------------------------------------------------------------------------- */
/* Byte offset of code point `idx` in s (idx <= length). */
static size_t cp_offset(const char *p, size_t n, size_t idx) {
  size_t i = 0;
  while (idx > 0 && i < n) {
    jj_utf8_next(p, n, &i);
    idx--;
  }
  return i;
}

static di_status slice_index(jj_ctx *c, frame *f, const jnode *e, int64_t def, int64_t *out, int *given) {
  *given = 0;
  *out = def;
  if (!e) return DI_OK;
  jv v;
  DI_TRY(eval(c, f, e, &v));
  if (v.kind == JV_NONE) return DI_OK;
  if (v.kind != JV_INT && v.kind != JV_BOOL)
    return jj_err(c, e, DI_ERR_INVALID_ARG, "slice indices must be integers or None, not %s", jj_kind_name(v));
  *out = v.u.i;
  *given = 1;
  return DI_OK;
}

static di_status do_slice(jj_ctx *c, frame *f, const jnode *e, jv obj, jv *out) {
  if (obj.kind == JV_UNDEF) return undef_err(c, e, obj);
  /* Jinja compiles a slice to a plain Python subscript (no getitem fallback), so slicing anything
   * but a list, tuple or string raises. (Its constant folding sometimes turns a literal's failed
   * slice into Undefined instead; we always raise.) */
  if (obj.kind == JV_DICT) return jj_err(c, e, DI_ERR_INVALID_ARG, "unhashable type: 'slice'");
  if (obj.kind != JV_STR && !jv_subscriptable(obj))
    return jj_err(c, e, DI_ERR_INVALID_ARG, "'%s' object is not subscriptable", jj_kind_name(obj));
  int64_t len = obj.kind == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)jj_utf8_len(obj.u.s.p, obj.u.s.n);
  int64_t stp, st, en;
  int g1, g2, g3;
  DI_TRY(slice_index(c, f, e->c, 1, &stp, &g3));
  if (stp == 0) return jj_err(c, e, DI_ERR_INVALID_ARG, "slice step cannot be zero");
  DI_TRY(slice_index(c, f, e->a, stp > 0 ? 0 : len - 1, &st, &g1));
  DI_TRY(slice_index(c, f, e->b, stp > 0 ? len : -1, &en, &g2));
  /* Python's PySlice_AdjustIndices */
  if (g1) {
    if (st < 0) { st += len; if (st < 0) st = stp < 0 ? -1 : 0; }
    else if (st >= len) st = stp < 0 ? len - 1 : len;
  }
  if (g2) {
    if (en < 0) { en += len; if (en < 0) en = stp < 0 ? -1 : 0; }
    else if (en >= len) en = stp < 0 ? len - 1 : len;
  }
  if (obj.kind == JV_LIST) {
    jv r = obj;
    r.u.l = jj_list_new(c->a, 0);
    if (!r.u.l) return oom(c, e);
    for (int64_t i = st; stp > 0 ? i < en : i > en; i += stp)
      if (jj_list_push(c->a, r.u.l, obj.u.l->v[i])) return oom(c, e);
    if (obj.tuple == JV_SEQ_RANGE) { /* a slice of a range is a range */
      const jv_list *o = obj.u.l;
      int64_t ns = o->start + st * o->step, nstep = o->step * stp, nstop = o->start + en * o->step;
      r.u.l->start = ns;
      r.u.l->step = nstep;
      r.u.l->stop = nstop;
    }
    *out = r;
    return DI_OK;
  }
  /* strings: collect code point boundaries once */
  size_t *offs = malloc(((size_t)len + 1) * sizeof *offs);
  if (!offs) return oom(c, e);
  size_t i = 0, k = 0;
  while (i < obj.u.s.n) {
    offs[k++] = i;
    jj_utf8_next(obj.u.s.p, obj.u.s.n, &i);
  }
  offs[k] = obj.u.s.n;
  jj_buf b = {.limit = jj_ctx_out_limit(c)};
  if (stp == 1) {
    if (en > st) jj_buf_put(&b, obj.u.s.p + offs[st], offs[en] - offs[st]);
  } else {
    for (int64_t q = st; stp > 0 ? q < en : q > en; q += stp) jj_buf_put(&b, obj.u.s.p + offs[q], offs[q + 1] - offs[q]);
  }
  free(offs);
  if (b.failed) { jj_buf_free(&b); return oom(c, e); }
  *out = jj_str_dup(c->a, b.p ? b.p : "", b.n);
  jj_buf_free(&b);
  return out->kind == JV_STR ? DI_OK : oom(c, e);
}

static di_status loop_attr(jj_ctx *c, const jnode *at, const jv_loop *L, const char *name, size_t n, jv *out);

/* obj[key] with Jinja's fallbacks: a missing key or index gives Undefined; a string key that is not
 * an item may name a method. */
static di_status getitem(jj_ctx *c, const jnode *at, jv obj, jv key, jv *out) {
  if (obj.kind == JV_UNDEF) return undef_err(c, at, obj);
  if (obj.kind == JV_LOOP && key.kind == JV_STR) return loop_attr(c, at, obj.u.loop, key.u.s.p, key.u.s.n, out);
  *out = jv_undef();
  if (obj.kind == JV_DICT || obj.kind == JV_NS) {
    jv *v = jj_dict_get(obj.u.d, key);
    if (v) { *out = *v; return DI_OK; }
  } else if ((jv_subscriptable(obj) || obj.kind == JV_STR) && (key.kind == JV_INT || key.kind == JV_BOOL)) {
    int64_t i = key.u.i;
    if (obj.kind == JV_LIST) {
      int64_t n = (int64_t)obj.u.l->n;
      if (i < 0) i += n;
      if (i >= 0 && i < n) *out = obj.u.l->v[i];
      return DI_OK;
    }
    int64_t n = (int64_t)jj_utf8_len(obj.u.s.p, obj.u.s.n);
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      size_t o = cp_offset(obj.u.s.p, obj.u.s.n, (size_t)i), e = o;
      jj_utf8_next(obj.u.s.p, obj.u.s.n, &e);
      *out = jv_strn(obj.u.s.p + o, e - o);
    }
    return DI_OK;
  }
  if (key.kind == JV_STR && jj_method_lookup(c, obj, key.u.s.p, key.u.s.n, out)) return DI_OK;
  if (key.kind == JV_STR) { out->u.s.p = key.u.s.p; out->u.s.n = key.u.s.n; }
  return DI_OK;
}

/* loop.index and friends, computed from the loop's position. */
static di_status loop_attr(jj_ctx *c, const jnode *at, const jv_loop *L, const char *name, size_t n, jv *out) {
  char k[16];
  snprintf(k, sizeof k, "%.*s", (int)(n < 15 ? n : 15), name);
  int64_t i = L->i, len = L->n;
  *out = jv_undef();
  if (!strcmp(k, "index")) *out = jv_int(i + 1);
  else if (!strcmp(k, "index0")) *out = jv_int(i);
  else if (!strcmp(k, "revindex")) *out = jv_int(len - i);
  else if (!strcmp(k, "revindex0")) *out = jv_int(len - i - 1);
  else if (!strcmp(k, "first")) *out = jv_bool(i == 0);
  else if (!strcmp(k, "last")) *out = jv_bool(i + 1 == len);
  else if (!strcmp(k, "length")) *out = jv_int(len);
  else if (!strcmp(k, "depth")) *out = jv_int(1);
  else if (!strcmp(k, "depth0")) *out = jv_int(0);
  else if (!strcmp(k, "previtem")) { if (i > 0) *out = L->items->v[i - 1]; }
  else if (!strcmp(k, "nextitem")) { if (i + 1 < len) *out = L->items->v[i + 1]; }
  else if (!strcmp(k, "cycle")) {
    jv_func *cyc = jj_alloc(c->a, sizeof *cyc);
    if (!cyc) return oom(c, at);
    cyc->type = FN_CYCLE;
    cyc->name = "loop.cycle";
    cyc->self = jv_int(i);
    out->kind = JV_FUNC;
    out->u.fn = cyc;
  } else if (!strcmp(k, "changed"))
    return jj_err(c, at, DI_ERR_UNSUPPORTED, "unsupported construct: loop.changed");
  if (out->kind == JV_UNDEF) { out->u.s.p = name; out->u.s.n = n; }
  return DI_OK;
}

static di_status getattr_(jj_ctx *c, const jnode *at, jv obj, const char *name, size_t n, jv *out) {
  if (obj.kind == JV_UNDEF) return undef_err(c, at, obj);
  if (obj.kind == JV_LOOP) return loop_attr(c, at, obj.u.loop, name, n, out);
  if (obj.kind != JV_NS && jj_method_lookup(c, obj, name, n, out)) return DI_OK;
  *out = jv_undef();
  if (obj.kind == JV_DICT || obj.kind == JV_NS) {
    jv *v = jj_dict_gets(obj.u.d, name, n);
    if (v) { *out = *v; return DI_OK; }
  }
  out->u.s.p = name;
  out->u.s.n = n;
  return DI_OK;
}

/* ---- calls ---------------------------------------------------------------------------------- */
/* Evaluates a call's arguments, spreading *list into positional and **dict into keyword ones. */
static di_status eval_args(jj_ctx *c, frame *f, const jnode *e, jj_args *args) {
  memset(args, 0, sizeof *args);
  int n = e->list.n, nk = e->list2.n, spread = 0;
  for (int i = 0; i < n; i++) spread |= e->list.v[i]->kind == E_STAR;
  for (int i = 0; i < nk; i++) spread |= e->list2.v[i]->kind == E_DSTAR;
  jv *v = jj_alloc(c->a, (size_t)(n + nk + 1) * sizeof(jv));
  if (!v) return oom(c, e);
  for (int i = 0; i < n; i++) DI_TRY(eval(c, f, e->list.v[i]->kind == E_STAR ? e->list.v[i]->a : e->list.v[i], &v[i]));
  for (int i = 0; i < nk; i++) DI_TRY(eval(c, f, e->list2.v[i]->kind == E_DSTAR ? e->list2.v[i]->a : e->list2.v[i], &v[n + i]));
  if (!spread) {
    args->n = n;
    args->v = v;
    args->nkw = nk;
    args->kwn = e->kwnames;
    args->kwv = v + n;
    return DI_OK;
  }
  jv_list *pos = jj_list_new(c->a, 0), *kv = jj_list_new(c->a, 0), *kn = jj_list_new(c->a, 0);
  if (!pos || !kv || !kn) return oom(c, e);
  for (int i = 0; i < n; i++) {
    if (e->list.v[i]->kind != E_STAR) {
      if (jj_list_push(c->a, pos, v[i])) return oom(c, e);
      continue;
    }
    jv_list *items = NULL;
    if (v[i].kind == JV_UNDEF) return undef_err(c, e->list.v[i], v[i]);
    DI_TRY(jj_iter_items(c, e->list.v[i], v[i], &items));
    for (size_t k = 0; k < items->n; k++)
      if (jj_list_push(c->a, pos, items->v[k])) return oom(c, e);
  }
  for (int i = 0; i < nk; i++) {
    if (e->list2.v[i]->kind != E_DSTAR) {
      jv name = jv_strn(e->kwnames[i], strlen(e->kwnames[i]));
      if (jj_list_push(c->a, kn, name) || jj_list_push(c->a, kv, v[n + i])) return oom(c, e);
      continue;
    }
    if (v[n + i].kind != JV_DICT)
      return jj_err(c, e->list2.v[i], DI_ERR_INVALID_ARG, "argument after ** must be a mapping, not %s", jj_kind_name(v[n + i]));
    const jv_dict *d = v[n + i].u.d;
    for (size_t k = 0; k < d->n; k++) {
      if (d->k[k].kind != JV_STR) return jj_err(c, e->list2.v[i], DI_ERR_INVALID_ARG, "keywords must be strings");
      jv name = jj_str_dup(c->a, d->k[k].u.s.p, d->k[k].u.s.n); /* NUL-terminated copy */
      if (name.kind != JV_STR || jj_list_push(c->a, kn, name) || jj_list_push(c->a, kv, d->v[k])) return oom(c, e);
    }
  }
  const char **names = jj_alloc(c->a, (kn->n + 1) * sizeof *names);
  if (!names) return oom(c, e);
  for (size_t k = 0; k < kn->n; k++) names[k] = kn->v[k].u.s.p;
  args->n = (int)pos->n;
  args->v = pos->v;
  args->nkw = (int)kv->n;
  args->kwn = names;
  args->kwv = kv->v;
  return DI_OK;
}

static di_status call_macro(jj_ctx *c, const jnode *at, const jv_func *fn, const jj_args *args, jv *out) {
  const jnode *m = fn->macro;
  jv caller = c->pending_caller;
  c->pending_caller = jv_undef();
  if (c->depth > 64) return jj_err(c, at, DI_ERR_UNSUPPORTED, "macro calls nested more than 64 deep");
  frame *f = frame_new(c, (frame *)fn->closure);
  if (!f) return oom(c, at);
  /* extra arguments go to `varargs` / `kwargs` when the macro uses them, as in Jinja */
  jv varargs = {0}, kwargs = {0};
  varargs.kind = JV_LIST;
  varargs.u.l = jj_list_new(c->a, 0);
  kwargs.kind = JV_DICT;
  kwargs.u.d = jj_dict_new(c->a, 0);
  if (!varargs.u.l || !kwargs.u.d) return oom(c, at);
  if (args->n > m->list.n) {
    if (!(m->op & 1))
      return jj_err(c, at, DI_ERR_INVALID_ARG, "macro '%.*s' takes not more than %d argument(s)", (int)m->name_len, m->name, m->list.n);
    for (int k = m->list.n; k < args->n; k++)
      if (jj_list_push(c->a, varargs.u.l, args->v[k])) return oom(c, at);
  }
  for (int k = 0; k < args->nkw; k++) {
    int found = 0;
    for (int p = 0; p < m->list.n; p++)
      if (strlen(args->kwn[k]) == m->list.v[p]->name_len && memcmp(args->kwn[k], m->list.v[p]->name, m->list.v[p]->name_len) == 0)
        found = 1;
    if (found) continue;
    if (!(m->op & 2))
      return jj_err(c, at, DI_ERR_INVALID_ARG, "macro '%.*s' takes no keyword argument '%s'", (int)m->name_len, m->name, args->kwn[k]);
    if (jj_dict_set(c->a, kwargs.u.d, jv_strn(args->kwn[k], strlen(args->kwn[k])), args->kwv[k])) return oom(c, at);
  }
  if (m->op & 1) DI_TRY(assign(c, f, "varargs", 7, varargs, at));
  if (m->op & 2) DI_TRY(assign(c, f, "kwargs", 6, kwargs, at));
  if (caller.kind == JV_FUNC) DI_TRY(assign(c, f, "caller", 6, caller, at));
  for (int p = 0; p < m->list.n; p++) {
    const jnode *pn = m->list.v[p];
    jv v = jv_undef();
    v.u.s.p = pn->name;
    v.u.s.n = pn->name_len;
    int set = 0;
    if (p < args->n) { v = args->v[p]; set = 1; }
    for (int k = 0; k < args->nkw; k++)
      if (strlen(args->kwn[k]) == pn->name_len && memcmp(args->kwn[k], pn->name, pn->name_len) == 0) {
        if (set) return jj_err(c, at, DI_ERR_INVALID_ARG, "macro got multiple values for argument '%s'", args->kwn[k]);
        v = args->kwv[k];
        set = 1;
      }
    if (!set && m->list2.v[p]) DI_TRY(eval(c, f, m->list2.v[p], &v));
    DI_TRY(assign(c, f, pn->name, pn->name_len, v, at));
  }
  jj_buf cap = {0}, *saved = c->out;
  cap.limit = saved->limit;
  c->out = &cap;
  c->depth++;
  di_status st = exec_body(c, f, &m->a->list);
  c->depth--;
  c->out = saved;
  c->flow = 0;
  if (st == DI_OK && cap.failed) st = jj_err(c, at, DI_ERR_OOM, "the output is too large");
  if (st == DI_OK) {
    *out = jj_str_dup(c->a, cap.p ? cap.p : "", cap.n);
    if (out->kind != JV_STR) st = oom(c, at);
  }
  jj_buf_free(&cap);
  return st;
}

static di_status call(jj_ctx *c, const jnode *at, jv fnv, const jj_args *args, jv *out) {
  if (fnv.kind == JV_UNDEF) return undef_err(c, at, fnv);
  if (fnv.kind != JV_FUNC) return jj_err(c, at, DI_ERR_INVALID_ARG, "'%s' object is not callable", jj_kind_name(fnv));
  const jv_func *fn = fnv.u.fn;
  switch (fn->type) {
  case FN_MACRO: return call_macro(c, at, fn, args, out);
  case FN_METHOD: return jj_call_method(c, at, fn, args, out);
  case FN_CYCLE:
    if (args->n == 0) return jj_err(c, at, DI_ERR_INVALID_ARG, "no items for cycling given");
    *out = args->v[fn->self.u.i % args->n];
    return DI_OK;
  default: return jj_call_global(c, at, fn, args, out);
  }
}

/* ---- expressions ---------------------------------------------------------------------------- */
static di_status eval_filter(jj_ctx *c, frame *f, const jnode *e, jv in, jv *out) {
  jv self = in;
  if (e->a) DI_TRY(eval(c, f, e->a, &self));
  jj_args args;
  DI_TRY(eval_args(c, f, e, &args));
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(e->name_len > 63 ? 63 : e->name_len), e->name);
  return jj_call_filter(c, e, name, self, &args, out);
}

/* A filter chain whose innermost operand is the captured body of a block (NULL operand). */
static di_status apply_block_filters(jj_ctx *c, frame *f, const jnode *chain, jv body, jv *out) {
  if (!chain) { *out = body; return DI_OK; }
  jv self = body;
  if (chain->a) DI_TRY(apply_block_filters(c, f, chain->a, body, &self));
  jj_args args;
  DI_TRY(eval_args(c, f, chain, &args));
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(chain->name_len > 63 ? 63 : chain->name_len), chain->name);
  return jj_call_filter(c, chain, name, self, &args, out);
}

/* Whether Jinja's optimizer folds `e` to a constant: literals and pure operations on them. */
static int const_tree(const jnode *e) {
  if (!e) return 1;
  switch (e->kind) {
  case E_CONST: return 1;
  case E_NEG: case E_POS: case E_NOT: case E_ATTR: return const_tree(e->a);
  case E_ITEM: return const_tree(e->a) && (e->b->kind == E_SLICE ? const_tree(e->b->a) && const_tree(e->b->b) && const_tree(e->b->c) : const_tree(e->b));
  case E_BINOP: case E_AND: case E_OR: return const_tree(e->a) && const_tree(e->b);
  case E_COND: return const_tree(e->a) && const_tree(e->b) && const_tree(e->c);
  case E_FILTER: case E_TEST: {
    /* Jinja cannot fold filters that take the context */
    static const char *const ctx_filters[] = {"map", "select", "reject", "selectattr", "rejectattr"};
    if (e->kind == E_FILTER)
      for (size_t k = 0; k < sizeof ctx_filters / sizeof ctx_filters[0]; k++)
        if (e->name_len == strlen(ctx_filters[k]) && !memcmp(e->name, ctx_filters[k], e->name_len)) return 0;
    if (!const_tree(e->a)) return 0;
    for (int i = 0; i < e->list.n; i++)
      if (!const_tree(e->list.v[i])) return 0;
    for (int i = 0; i < e->list2.n; i++)
      if (!const_tree(e->list2.v[i])) return 0;
    return 1;
  }
  case E_COMPARE: case E_LIST: case E_TUPLE: case E_DICT: case E_CONCAT:
    if (e->kind == E_COMPARE && !const_tree(e->a)) return 0;
    for (int i = 0; i < e->list.n; i++)
      if (!const_tree(e->list.v[i])) return 0;
    return 1;
  default: return 0;
  }
}

static di_status eval(jj_ctx *c, frame *f, const jnode *e, jv *out) {
  DI_TRY(step(c, e));
  switch (e->kind) {
  case E_CONST: *out = e->val; return DI_OK;
  case E_NAME: {
    jv *v = lookup(f, e->name, e->name_len);
    if (v) { *out = *v; return DI_OK; }
    if (jj_global_lookup(e->name, e->name_len, out)) return DI_OK;
    *out = jv_undef();
    out->u.s.p = e->name;
    out->u.s.n = e->name_len;
    return DI_OK;
  }
  case E_LIST: case E_TUPLE: {
    jv r = {0};
    r.kind = JV_LIST;
    r.tuple = e->kind == E_TUPLE;
    r.u.l = jj_list_new(c->a, (size_t)e->list.n);
    if (!r.u.l) return oom(c, e);
    for (int i = 0; i < e->list.n; i++) {
      jv x;
      DI_TRY(eval(c, f, e->list.v[i], &x));
      if (jj_list_push(c->a, r.u.l, x)) return oom(c, e);
    }
    *out = r;
    return DI_OK;
  }
  case E_DICT: {
    jv r = {0};
    r.kind = JV_DICT;
    r.u.d = jj_dict_new(c->a, (size_t)e->list.n / 2);
    if (!r.u.d) return oom(c, e);
    for (int i = 0; i + 1 < e->list.n; i += 2) {
      jv k, v;
      DI_TRY(eval(c, f, e->list.v[i], &k));
      DI_TRY(eval(c, f, e->list.v[i + 1], &v));
      if (k.kind == JV_LIST && (k.tuple == JV_SEQ_LIST || (k.tuple >= JV_SEQ_ITEMS && k.tuple <= JV_SEQ_VALUES)))
        return jj_err(c, e, DI_ERR_INVALID_ARG, "unhashable type: '%s'", jj_kind_name(k));
      if (k.kind == JV_DICT) return jj_err(c, e, DI_ERR_INVALID_ARG, "unhashable type: 'dict'");
      if (jj_dict_set(c->a, r.u.d, k, v)) return oom(c, e);
    }
    *out = r;
    return DI_OK;
  }
  case E_ATTR: {
    jv obj;
    DI_TRY(eval(c, f, e->a, &obj));
    return getattr_(c, e, obj, e->name, e->name_len, out);
  }
  case E_ITEM: {
    jv obj;
    DI_TRY(eval(c, f, e->a, &obj));
    if (e->b->kind == E_SLICE) return do_slice(c, f, e->b, obj, out);
    jv key;
    DI_TRY(eval(c, f, e->b, &key));
    return getitem(c, e, obj, key, out);
  }
  case E_SLICE: return jj_err(c, e, DI_ERR_FORMAT, "a slice outside a subscript");
  case E_CALL: {
    jv fn;
    DI_TRY(eval(c, f, e->a, &fn));
    jj_args args;
    DI_TRY(eval_args(c, f, e, &args));
    return call(c, e, fn, &args, out);
  }
  case E_FILTER: return eval_filter(c, f, e, jv_undef(), out);
  case E_TEST: {
    jv self;
    DI_TRY(eval(c, f, e->a, &self));
    jj_args args;
    DI_TRY(eval_args(c, f, e, &args));
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(e->name_len > 63 ? 63 : e->name_len), e->name);
    int r;
    DI_TRY(jj_call_test(c, e, name, self, &args, &r));
    *out = jv_bool(e->negated ? !r : r);
    return DI_OK;
  }
  case E_NEG: case E_POS: {
    jv x;
    DI_TRY(eval(c, f, e->a, &x));
    if (x.kind == JV_UNDEF) return undef_err(c, e, x);
    if (!is_num(x)) return jj_err(c, e, DI_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+', jj_kind_name(x));
    if (e->kind == E_POS) *out = x.kind == JV_BOOL ? jv_int(x.u.i) : x;
    else if (x.kind == JV_FLOAT) *out = jv_float(-x.u.f);
    else {
      if (x.u.i == INT64_MIN) return jj_err(c, e, DI_ERR_UNSUPPORTED, "integer overflow");
      *out = jv_int(-x.u.i);
    }
    return DI_OK;
  }
  case E_NOT: {
    jv x;
    DI_TRY(eval(c, f, e->a, &x));
    *out = jv_bool(!jj_truthy(x));
    return DI_OK;
  }
  case E_AND: case E_OR: {
    jv x;
    DI_TRY(eval(c, f, e->a, &x));
    if (jj_truthy(x) == (e->kind == E_OR)) { *out = x; return DI_OK; }
    return eval(c, f, e->b, out);
  }
  case E_COND: {
    jv x;
    DI_TRY(eval(c, f, e->a, &x));
    if (jj_truthy(x)) return eval(c, f, e->b, out);
    if (e->c) return eval(c, f, e->c, out);
    *out = jv_undef();
    return DI_OK;
  }
  case E_BINOP: {
    jv x, y;
    DI_TRY(eval(c, f, e->a, &x));
    DI_TRY(eval(c, f, e->b, &y));
    if (e->op == OP_POW && (x.kind == JV_INT || x.kind == JV_FLOAT) && (x.kind == JV_INT ? x.u.i < 0 : signbit(x.u.f)) &&
        const_tree(e->a) && !const_tree(e->b)) {
      /* Jinja folds a constant base such as -2 and writes it unparenthesized into Python code, so
       * with a non-constant exponent `-2 ** x` means -(2 ** x) */
      jv r, ax = x.kind == JV_INT ? jv_int(-x.u.i) : jv_float(-x.u.f);
      if (x.kind == JV_INT && x.u.i == INT64_MIN) return jj_err(c, e, DI_ERR_UNSUPPORTED, "integer overflow");
      DI_TRY(arith(c, e, OP_POW, ax, y, &r));
      return arith(c, e, OP_SUB, r.kind == JV_FLOAT ? jv_float(0.0) : jv_int(0), r, out);
    }
    return arith(c, e, e->op, x, y, out);
  }
  case E_COMPARE: {
    jv x;
    DI_TRY(eval(c, f, e->a, &x));
    for (int i = 0; i < e->list.n; i++) {
      jv y;
      DI_TRY(eval(c, f, e->list.v[i], &y));
      int r;
      DI_TRY(compare(c, e, e->ops[i], x, y, &r));
      if (!r) { *out = jv_bool(0); return DI_OK; }
      x = y;
    }
    *out = jv_bool(1);
    return DI_OK;
  }
  case E_CONCAT: {
    jj_buf b = {.limit = jj_ctx_out_limit(c)};
    for (int i = 0; i < e->list.n; i++) {
      jv x;
      di_status st = eval(c, f, e->list.v[i], &x);
      if (st != DI_OK) { jj_buf_free(&b); return st; }
      jj_to_str(&b, x);
    }
    if (b.failed) { jj_buf_free(&b); return oom(c, e); }
    *out = jj_str_dup(c->a, b.p ? b.p : "", b.n);
    jj_buf_free(&b);
    return out->kind == JV_STR ? DI_OK : oom(c, e);
  }
  default: return jj_err(c, e, DI_ERR_INTERNAL, "unknown expression node %d", e->kind);
  }
}

/* ---- statements ----------------------------------------------------------------------------- */
static di_status bind_target(jj_ctx *c, frame *f, const jnode *t, jv v) {
  if (t->kind == E_NAME) return assign(c, f, t->name, t->name_len, v, t);
  if (t->kind == E_ATTR) {
    jv *ns = lookup(f, t->a->name, t->a->name_len);
    if (!ns || ns->kind != JV_NS)
      return jj_err(c, t, DI_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object");
    if (t->name_len && t->name[0] == '_')
      return jj_err(c, t, DI_ERR_INVALID_ARG, "chat templates cannot store underscore-prefixed attributes on a namespace");
    jv k = jj_str_dup(c->a, t->name, t->name_len);
    if (k.kind != JV_STR || jj_dict_set(c->a, ns->u.d, k, v)) return oom(c, t);
    return DI_OK;
  }
  /* tuple unpacking */
  jv_list *items = NULL;
  if (v.kind == JV_UNDEF) return undef_err(c, t, v);
  DI_TRY(jj_iter_items(c, t, v, &items));
  if ((int)items->n != t->list.n)
    return jj_err(c, t, DI_ERR_INVALID_ARG, "cannot unpack %zu values into %d names", items->n, t->list.n);
  for (int i = 0; i < t->list.n; i++) DI_TRY(bind_target(c, f, t->list.v[i], items->v[i]));
  return DI_OK;
}

static di_status capture(jj_ctx *c, frame *f, const jn_list *body, const jnode *at, jv *out) {
  jj_buf cap = {0}, *saved = c->out;
  cap.limit = saved->limit;
  c->out = &cap;
  di_status st = exec_body(c, f, body);
  c->out = saved;
  if (st == DI_OK && cap.failed) st = jj_err(c, at, DI_ERR_OOM, "the output is too large");
  if (st == DI_OK) {
    *out = jj_str_dup(c->a, cap.p ? cap.p : "", cap.n);
    if (out->kind != JV_STR) st = oom(c, at);
  }
  jj_buf_free(&cap);
  return st;
}

static di_status exec_for(jj_ctx *c, frame *f, const jnode *s) {
  jv it;
  DI_TRY(eval(c, f, s->b, &it));
  jv_list *items = NULL;
  DI_TRY(jj_iter_items(c, s->b, it, &items));
  if (s->c) { /* {% for x in xs if cond %}: filter first, so loop.length counts what is kept */
    jv_list *kept = jj_list_new(c->a, 0);
    if (!kept) return oom(c, s);
    for (size_t i = 0; i < items->n; i++) {
      frame *tf = frame_new(c, f);
      if (!tf) return oom(c, s);
      DI_TRY(bind_target(c, tf, s->a, items->v[i]));
      jv cond;
      DI_TRY(eval(c, tf, s->c, &cond));
      if (jj_truthy(cond) && jj_list_push(c->a, kept, items->v[i])) return oom(c, s);
    }
    items = kept;
  }
  size_t n = items->n;
  for (size_t i = 0; i < n; i++) {
    DI_TRY(step(c, s));
    frame *lf = frame_new(c, f);
    if (!lf) return oom(c, s);
    jv_loop *L = jj_alloc(c->a, sizeof *L);
    if (!L) return oom(c, s);
    L->i = (int64_t)i;
    L->n = (int64_t)n;
    L->items = items;
    jv loop = {0};
    loop.kind = JV_LOOP;
    loop.u.loop = L;
    DI_TRY(assign(c, lf, "loop", 4, loop, s));
    DI_TRY(bind_target(c, lf, s->a, items->v[i]));
    DI_TRY(exec_body(c, lf, &s->list));
    int fl = c->flow;
    c->flow = 0;
    if (fl == 1) break;
  }
  if (n == 0 && s->list2.n) {
    frame *ef = frame_new(c, f);
    if (!ef) return oom(c, s);
    DI_TRY(exec_body(c, ef, &s->list2));
  }
  return DI_OK;
}

static di_status exec_stmt(jj_ctx *c, frame *f, const jnode *s) {
  DI_TRY(step(c, s));
  switch (s->kind) {
  case N_TEXT: jj_buf_put(c->out, s->name, s->name_len); break;
  case N_OUTPUT: {
    jv v;
    DI_TRY(eval(c, f, s->a, &v));
    jj_to_str(c->out, v);
    break;
  }
  case N_IF: {
    jv v;
    DI_TRY(eval(c, f, s->a, &v));
    DI_TRY(exec_body(c, f, jj_truthy(v) ? &s->list : &s->list2));
    break;
  }
  case N_FOR: DI_TRY(exec_for(c, f, s)); break;
  case N_SET: {
    jv v;
    DI_TRY(eval(c, f, s->b, &v));
    DI_TRY(bind_target(c, f, s->a, v));
    break;
  }
  case N_SET_BLOCK: {
    jv v;
    DI_TRY(capture(c, f, &s->list, s, &v));
    DI_TRY(apply_block_filters(c, f, s->b, v, &v));
    DI_TRY(bind_target(c, f, s->a, v));
    break;
  }
  case N_FILTER_BLOCK: {
    jv v;
    DI_TRY(capture(c, f, &s->list, s, &v));
    DI_TRY(apply_block_filters(c, f, s->b, v, &v));
    jj_to_str(c->out, v);
    break;
  }
  case N_MACRO: {
    jv_func *fn = jj_alloc(c->a, sizeof *fn);
    if (!fn) return oom(c, s);
    fn->type = FN_MACRO;
    fn->name = "macro";
    fn->macro = s;
    fn->closure = f;
    jv v = {0};
    v.kind = JV_FUNC;
    v.u.fn = fn;
    DI_TRY(assign(c, f, s->name, s->name_len, v, s));
    break;
  }
  case N_CALL_BLOCK: {
    jv_func *fn = jj_alloc(c->a, sizeof *fn);
    if (!fn) return oom(c, s);
    fn->type = FN_MACRO;
    fn->name = "caller";
    fn->macro = s->b;
    fn->closure = f;
    jv callee, r;
    DI_TRY(eval(c, f, s->a->a, &callee));
    jj_args args;
    DI_TRY(eval_args(c, f, s->a, &args));
    if (callee.kind != JV_FUNC || callee.u.fn->type != FN_MACRO)
      return jj_err(c, s, DI_ERR_INVALID_ARG, "a call block needs a macro, not %s", jj_kind_name(callee));
    c->pending_caller.kind = JV_FUNC;
    c->pending_caller.u.fn = fn;
    DI_TRY(call(c, s->a, callee, &args, &r));
    jj_to_str(c->out, r);
    break;
  }
  case N_BREAK: c->flow = 1; break;
  case N_CONTINUE: c->flow = 2; break;
  case N_BLOCK: DI_TRY(exec_body(c, f, &s->list)); break;
  case N_WITH: {
    frame *wf = frame_new(c, f);
    if (!wf) return oom(c, s);
    const jn_list *vals = &s->a->list;
    jv *tmp = jj_alloc(c->a, (size_t)(vals->n + 1) * sizeof(jv));
    if (!tmp) return oom(c, s);
    for (int i = 0; i < vals->n; i++) DI_TRY(eval(c, f, vals->v[i], &tmp[i]));
    for (int i = 0; i < vals->n; i++) DI_TRY(bind_target(c, wf, s->list2.v[i], tmp[i]));
    DI_TRY(exec_body(c, wf, &s->list));
    break;
  }
  default: return jj_err(c, s, DI_ERR_INTERNAL, "unknown statement node %d", s->kind);
  }
  if (c->out->failed) return output_failed(c, s);
  return DI_OK;
}

static di_status exec_body(jj_ctx *c, frame *f, const jn_list *body) {
  for (int i = 0; i < body->n; i++) {
    DI_TRY(exec_stmt(c, f, body->v[i]));
    if (c->flow) return DI_OK;
  }
  return DI_OK;
}

di_status jj_render_vars(const jj_template *t, jj_vars *vars, const jj_render_options *opt, char **out, size_t *len) {
  jj_arena *a = &vars->arena;
  a->limit = opt && opt->max_memory ? opt->max_memory : (size_t)256 << 20;
  if (a->used_total > a->limit) a->limit = a->used_total + (a->limit >> 1); /* the inputs themselves */
  jj_buf o = {0};
  o.limit = opt && opt->max_output ? opt->max_output : (size_t)64 << 20;
  jj_ctx c = {0};
  c.a = a;
  c.out = &o;
  c.max_steps = opt && opt->max_steps ? opt->max_steps : 50000000ull;
  c.clock_pinned = opt && opt->clock_pinned;
  c.pinned_now = opt ? opt->pinned_now : 0;
  di_status st = DI_OK;
  c.root = jj_alloc(a, sizeof *c.root);
  if (!c.root) st = oom(&c, NULL);
  else c.root->vars = vars->d;
  /* the template's own top-level scope sits below the caller's variables */
  frame *top = st == DI_OK ? frame_new(&c, c.root) : NULL;
  if (st == DI_OK && !top) st = oom(&c, NULL);
  if (st == DI_OK) st = exec_body(&c, top, &t->body);
  if (st == DI_OK && o.failed) st = output_failed(&c, NULL);
  if (st != DI_OK) {
    jj_buf_free(&o);
    return st;
  }
  if (!o.p) {
    o.p = calloc(1, 1);
    if (!o.p) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  }
  *out = o.p;
  *len = o.n;
  return DI_OK;
}

di_status jj_render(const jj_template *t, const cJSON *vars, const jj_render_options *opt, char **out, size_t *len) {
  jj_vars v;
  di_status st = jj_vars_init(&v);
  for (const cJSON *e = vars ? vars->child : NULL; st == DI_OK && e; e = e->next)
    st = jj_vars_set_cjson(&v, e->string ? e->string : "", e);
  if (st == DI_OK) st = jj_render_vars(t, &v, opt, out, len);
  jj_vars_free(&v);
  return st;
}
