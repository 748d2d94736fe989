/* Parser of the Jinja subset: tokens to a syntax tree, with Jinja2's grammar and operator
 * precedence (conditional < or < and < not < comparisons < + - < ~ < * / // % < ** < unary <
 * postfix . [] () < filters and tests). Tags and filters outside the subset are rejected here,
 * naming the construct and its position. */
#include "chat/jinja.h"
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 200

typedef struct parser {
  jj_arena *a;
  jj_tok *t;
  size_t n, i;
  int depth;
  jnode *cur_macro; /* the macro being parsed: records whether it uses varargs/kwargs */
} parser;

static jj_tok *cur(parser *P) { return &P->t[P->i]; }
static jj_tok *peek(parser *P, size_t k) { return &P->t[P->i + k < P->n ? P->i + k : P->n - 1]; }
static void adv(parser *P) { if (P->i + 1 < P->n) P->i++; }
static int is_op(jj_tok *t, const char *op) { return t->type == TK_OP && strcmp(t->op, op) == 0; }
static int is_kw(jj_tok *t, const char *kw) {
  return t->type == TK_NAME && t->n == strlen(kw) && memcmp(t->p, kw, t->n) == 0;
}

static const char *tok_desc(jj_tok *t, char *buf, size_t cap) {
  switch (t->type) {
  case TK_TEXT: return "template text";
  case TK_VAR_BEGIN: return "'{{'";
  case TK_VAR_END: return "'}}'";
  case TK_BLOCK_BEGIN: return "'{%'";
  case TK_BLOCK_END: return "'%}'";
  case TK_NAME: snprintf(buf, cap, "name '%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
  case TK_STRING: return "a string";
  case TK_INT: return "an integer";
  case TK_FLOAT: return "a float";
  case TK_OP: snprintf(buf, cap, "'%s'", t->op); return buf;
  default: return "the end of the template";
  }
}

static di_status perr(parser *P, jj_tok *t, di_status st, const char *fmt, const char *arg) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, arg);
  return di_error_set(st, "chat template line %d column %d: %s", t->line, t->col, msg);
}

static di_status unexpected(parser *P, const char *wanted) {
  char b[80], msg[200];
  snprintf(msg, sizeof msg, "expected %s, got %s", wanted, tok_desc(cur(P), b, sizeof b));
  return perr(P, cur(P), DI_ERR_FORMAT, "%s", msg);
}

static di_status oom(void) { return di_error_set(DI_ERR_OOM, "chat template: out of memory"); }

static jnode *node(parser *P, int kind, jj_tok *at) {
  jnode *n = jj_alloc(P->a, sizeof *n);
  if (!n) return NULL;
  n->kind = (uint8_t)kind;
  n->line = at->line;
  n->col = at->col;
  return n;
}

static int list_push(parser *P, jn_list *l, jnode *x) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 4;
    jnode **v = jj_alloc(P->a, (size_t)cap * sizeof *v);
    if (!v) return -1;
    if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = x;
  return 0;
}

static di_status expect_op(parser *P, const char *op) {
  if (!is_op(cur(P), op)) {
    char w[16];
    snprintf(w, sizeof w, "'%s'", op);
    return unexpected(P, w);
  }
  adv(P);
  return DI_OK;
}

static di_status expect_block_end(parser *P) {
  if (cur(P)->type != TK_BLOCK_END) return unexpected(P, "'%}'");
  adv(P);
  return DI_OK;
}

static di_status parse_expression(parser *P, int with_cond, jnode **out);
static di_status parse_tuple(parser *P, int with_cond, int explicit_paren, const char *extra_end, jnode **out);
static di_status parse_unary(parser *P, int with_filter, jnode **out);
static di_status parse_primary(parser *P, jnode **out);
static di_status parse_postfix(parser *P, jnode *n, jnode **out);

/* Call arguments after '(' up to ')': positional into `pos`, keyword into names + `kwv`. */
static di_status parse_call_args(parser *P, jnode *call, jn_list *pos, jn_list *kwv) {
  DI_TRY(expect_op(P, "("));
  int nkw = 0, cap = 0;
  const char **names = NULL;
  while (!is_op(cur(P), ")")) {
    if (pos->n + nkw > 0) {
      DI_TRY(expect_op(P, ","));
      if (is_op(cur(P), ")")) break;
    }
    if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
      int dstar = cur(P)->op[1] == '*';
      jnode *w = node(P, dstar ? E_DSTAR : E_STAR, cur(P));
      if (!w) return oom();
      adv(P);
      DI_TRY(parse_expression(P, 1, &w->a));
      if (!dstar) {
        if (list_push(P, pos, w)) return oom();
        continue;
      }
      if (nkw == cap) {
        cap = cap ? cap * 2 : 4;
        const char **nn = jj_alloc(P->a, (size_t)cap * sizeof *nn);
        if (!nn) return oom();
        if (nkw) memcpy(nn, names, (size_t)nkw * sizeof *nn);
        names = nn;
      }
      names[nkw++] = NULL; /* **mapping: names come from the value */
      if (list_push(P, kwv, w)) return oom();
      continue;
    }
    if (cur(P)->type == TK_NAME && is_op(peek(P, 1), "=")) {
      jj_tok *nt = cur(P);
      adv(P);
      adv(P);
      jnode *v = NULL;
      DI_TRY(parse_expression(P, 1, &v));
      if (nkw == cap) {
        cap = cap ? cap * 2 : 4;
        const char **nn = jj_alloc(P->a, (size_t)cap * sizeof *nn);
        if (!nn) return oom();
        if (nkw) memcpy(nn, names, (size_t)nkw * sizeof *nn);
        names = nn;
      }
      jv s = jj_str_dup(P->a, nt->p, nt->n);
      if (s.kind != JV_STR) return oom();
      names[nkw++] = s.u.s.p;
      if (list_push(P, kwv, v)) return oom();
    } else {
      if (nkw) return perr(P, cur(P), DI_ERR_FORMAT, "%s", "positional argument after a keyword argument");
      jnode *v = NULL;
      DI_TRY(parse_expression(P, 1, &v));
      if (list_push(P, pos, v)) return oom();
    }
  }
  adv(P); /* ')' */
  call->kwnames = names;
  return DI_OK;
}

/* NAME ( '.' NAME )* as one dotted name, as filter and test names are written. */
static di_status parse_dotted_name(parser *P, jnode *n) {
  if (cur(P)->type != TK_NAME) return unexpected(P, "a name");
  jj_tok *t = cur(P);
  const char *st = t->p;
  size_t len = t->n;
  adv(P);
  while (is_op(cur(P), ".") && peek(P, 1)->type == TK_NAME) {
    adv(P);
    len = (size_t)(cur(P)->p + cur(P)->n - st);
    adv(P);
  }
  n->name = st;
  n->name_len = len;
  return DI_OK;
}

static di_status parse_filter(parser *P, jnode *in, jnode **out) {
  jj_tok *at = cur(P);
  adv(P); /* '|' */
  jnode *f = node(P, E_FILTER, at);
  if (!f) return oom();
  DI_TRY(parse_dotted_name(P, f));
  if (!jj_filter_exists(f->name, f->name_len)) {
    char nm[64];
    snprintf(nm, sizeof nm, "%.*s", (int)(f->name_len > 60 ? 60 : f->name_len), f->name);
    return perr(P, at, DI_ERR_UNSUPPORTED, "unsupported construct: the filter '%s'", nm);
  }
  f->a = in;
  if (is_op(cur(P), "(")) DI_TRY(parse_call_args(P, f, &f->list, &f->list2));
  *out = f;
  return DI_OK;
}

static di_status parse_test(parser *P, jnode *in, jnode **out) {
  jj_tok *at = cur(P);
  adv(P); /* 'is' */
  int neg = 0;
  if (is_kw(cur(P), "not")) {
    neg = 1;
    adv(P);
  }
  jnode *t = node(P, E_TEST, at);
  if (!t) return oom();
  DI_TRY(parse_dotted_name(P, t));
  if (!jj_test_exists(t->name, t->name_len)) {
    char nm[64];
    snprintf(nm, sizeof nm, "%.*s", (int)(t->name_len > 60 ? 60 : t->name_len), t->name);
    return perr(P, at, DI_ERR_UNSUPPORTED, "unsupported construct: the test '%s'", nm);
  }
  t->a = in;
  t->negated = (uint8_t)neg;
  jj_tok *c = cur(P);
  if (is_op(c, "(")) {
    DI_TRY(parse_call_args(P, t, &t->list, &t->list2));
  } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT || c->type == TK_FLOAT ||
              is_op(c, "[") || is_op(c, "{")) &&
             !is_kw(c, "else") && !is_kw(c, "or") && !is_kw(c, "and")) {
    if (is_kw(c, "is")) return perr(P, c, DI_ERR_FORMAT, "%s", "you cannot chain multiple tests with is");
    jnode *arg = NULL;
    DI_TRY(parse_primary(P, &arg));
    DI_TRY(parse_postfix(P, arg, &arg));
    if (list_push(P, &t->list, arg)) return oom();
  }
  *out = t;
  return DI_OK;
}

/* One subscript element: an expression or a slice a:b:c. */
static di_status parse_subscribed(parser *P, jnode **out) {
  jj_tok *at = cur(P);
  jnode *parts[3] = {NULL, NULL, NULL};
  if (is_op(cur(P), ":")) {
    adv(P);
  } else {
    DI_TRY(parse_expression(P, 1, &parts[0]));
    if (!is_op(cur(P), ":")) {
      *out = parts[0];
      return DI_OK;
    }
    adv(P);
  }
  if (!is_op(cur(P), ":") && !is_op(cur(P), "]") && !is_op(cur(P), ","))
    DI_TRY(parse_expression(P, 1, &parts[1]));
  if (is_op(cur(P), ":")) {
    adv(P);
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) DI_TRY(parse_expression(P, 1, &parts[2]));
  }
  jnode *s = node(P, E_SLICE, at);
  if (!s) return oom();
  s->a = parts[0];
  s->b = parts[1];
  s->c = parts[2];
  *out = s;
  return DI_OK;
}

static di_status parse_postfix(parser *P, jnode *n, jnode **out) {
  for (;;) {
    jj_tok *at = cur(P);
    if (is_op(at, ".")) {
      adv(P);
      jj_tok *t = cur(P);
      if (t->type == TK_NAME) {
        jnode *g = node(P, E_ATTR, at);
        if (!g) return oom();
        g->a = n;
        g->name = t->p;
        g->name_len = t->n;
        adv(P);
        n = g;
      } else if (t->type == TK_INT) {
        jnode *g = node(P, E_ITEM, at), *k = node(P, E_CONST, t);
        if (!g || !k) return oom();
        k->val = jv_int(t->i);
        g->a = n;
        g->b = k;
        adv(P);
        n = g;
      } else return unexpected(P, "an attribute name");
    } else if (is_op(at, "[")) {
      adv(P);
      jn_list idx = {0};
      while (!is_op(cur(P), "]")) {
        if (idx.n) {
          DI_TRY(expect_op(P, ","));
          if (is_op(cur(P), "]")) break;
        }
        jnode *e = NULL;
        DI_TRY(parse_subscribed(P, &e));
        if (list_push(P, &idx, e)) return oom();
      }
      adv(P);
      if (idx.n == 0) return perr(P, at, DI_ERR_FORMAT, "%s", "expected a subscript");
      jnode *g = node(P, E_ITEM, at);
      if (!g) return oom();
      g->a = n;
      if (idx.n == 1) g->b = idx.v[0];
      else {
        jnode *tup = node(P, E_TUPLE, at);
        if (!tup) return oom();
        tup->list = idx;
        g->b = tup;
      }
      n = g;
    } else if (is_op(at, "(")) {
      jnode *c = node(P, E_CALL, at);
      if (!c) return oom();
      c->a = n;
      DI_TRY(parse_call_args(P, c, &c->list, &c->list2));
      n = c;
    } else break;
  }
  *out = n;
  return DI_OK;
}

static di_status parse_filter_expr(parser *P, jnode *n, jnode **out) {
  for (;;) {
    jj_tok *t = cur(P);
    if (is_op(t, "|")) DI_TRY(parse_filter(P, n, &n));
    else if (is_kw(t, "is")) DI_TRY(parse_test(P, n, &n));
    else if (is_op(t, "(")) {
      jnode *c = node(P, E_CALL, t);
      if (!c) return oom();
      c->a = n;
      DI_TRY(parse_call_args(P, c, &c->list, &c->list2));
      n = c;
    } else break;
  }
  *out = n;
  return DI_OK;
}

static di_status parse_primary(parser *P, jnode **out) {
  jj_tok *t = cur(P);
  jnode *n = NULL;
  if (t->type == TK_NAME) {
    if (is_kw(t, "true") || is_kw(t, "True") || is_kw(t, "false") || is_kw(t, "False")) {
      if (!(n = node(P, E_CONST, t))) return oom();
      n->val = jv_bool(t->p[0] == 't' || t->p[0] == 'T');
    } else if (is_kw(t, "none") || is_kw(t, "None")) {
      if (!(n = node(P, E_CONST, t))) return oom();
      n->val = jv_none();
    } else {
      if (!(n = node(P, E_NAME, t))) return oom();
      n->name = t->p;
      n->name_len = t->n;
      if (P->cur_macro && is_kw(t, "varargs")) P->cur_macro->op |= 1;
      if (P->cur_macro && is_kw(t, "kwargs")) P->cur_macro->op |= 2;
    }
    adv(P);
  } else if (t->type == TK_STRING) {
    if (!(n = node(P, E_CONST, t))) return oom();
    n->val = jv_strn(t->p, t->n);
    adv(P);
    if (cur(P)->type == TK_STRING) { /* adjacent literals concatenate */
      jj_buf b = {0};
      jj_buf_put(&b, t->p, t->n);
      while (cur(P)->type == TK_STRING) {
        jj_buf_put(&b, cur(P)->p, cur(P)->n);
        adv(P);
      }
      if (b.failed) { jj_buf_free(&b); return oom(); }
      n->val = jj_str_dup(P->a, b.p, b.n);
      jj_buf_free(&b);
      if (n->val.kind != JV_STR) return oom();
    }
  } else if (t->type == TK_INT || t->type == TK_FLOAT) {
    if (!(n = node(P, E_CONST, t))) return oom();
    n->val = t->type == TK_INT ? jv_int(t->i) : jv_float(t->f);
    adv(P);
  } else if (is_op(t, "(")) {
    adv(P);
    DI_TRY(parse_tuple(P, 1, 1, NULL, &n));
    DI_TRY(expect_op(P, ")"));
  } else if (is_op(t, "[")) {
    adv(P);
    if (!(n = node(P, E_LIST, t))) return oom();
    while (!is_op(cur(P), "]")) {
      if (n->list.n) {
        DI_TRY(expect_op(P, ","));
        if (is_op(cur(P), "]")) break;
      }
      jnode *e = NULL;
      DI_TRY(parse_expression(P, 1, &e));
      if (list_push(P, &n->list, e)) return oom();
    }
    adv(P);
  } else if (is_op(t, "{")) {
    adv(P);
    if (!(n = node(P, E_DICT, t))) return oom();
    while (!is_op(cur(P), "}")) {
      if (n->list.n) {
        DI_TRY(expect_op(P, ","));
        if (is_op(cur(P), "}")) break;
      }
      jnode *k = NULL, *v = NULL;
      DI_TRY(parse_expression(P, 1, &k));
      DI_TRY(expect_op(P, ":"));
      DI_TRY(parse_expression(P, 1, &v));
      if (list_push(P, &n->list, k) || list_push(P, &n->list, v)) return oom();
    }
    adv(P);
  } else return unexpected(P, "an expression");
  *out = n;
  return DI_OK;
}

static di_status parse_unary(parser *P, int with_filter, jnode **out) {
  jj_tok *t = cur(P);
  jnode *n = NULL;
  if (++P->depth > MAX_DEPTH) return perr(P, t, DI_ERR_UNSUPPORTED, "%s", "expression nested too deeply");
  if (is_op(t, "-") || is_op(t, "+")) {
    adv(P);
    jnode *x = NULL;
    DI_TRY(parse_unary(P, 0, &x));
    if (!(n = node(P, t->op[0] == '-' ? E_NEG : E_POS, t))) return oom();
    n->a = x;
  } else DI_TRY(parse_primary(P, &n));
  DI_TRY(parse_postfix(P, n, &n));
  if (with_filter) DI_TRY(parse_filter_expr(P, n, &n));
  P->depth--;
  *out = n;
  return DI_OK;
}

static di_status binop(parser *P, jj_tok *at, int op, jnode *l, jnode *r, jnode **out) {
  jnode *n = node(P, E_BINOP, at);
  if (!n) return oom();
  n->op = (uint8_t)op;
  n->a = l;
  n->b = r;
  *out = n;
  return DI_OK;
}

/* The left-associative binary levels share one loop: operands from `sub`, operators recognised by
 * `op_of` (0: not an operator of this level), each making a `kind` node (E_BINOP carrying the
 * operator, or E_AND / E_OR). */
typedef di_status (*level_fn)(parser *P, jnode **out);

static di_status parse_left_assoc(parser *P, jnode **out, level_fn sub, int (*op_of)(jj_tok *t), int kind) {
  jnode *l = NULL;
  DI_TRY(sub(P, &l));
  for (;;) {
    jj_tok *at = cur(P);
    const int op = op_of(at);
    if (!op) break;
    adv(P);
    jnode *r = NULL;
    DI_TRY(sub(P, &r));
    if (kind == E_BINOP) {
      DI_TRY(binop(P, at, op, l, r, &l));
    } else {
      jnode *n = node(P, kind, at);
      if (!n) return oom();
      n->a = l;
      n->b = r;
      l = n;
    }
  }
  *out = l;
  return DI_OK;
}

static int op_pow(jj_tok *t) { return is_op(t, "**") ? OP_POW : 0; }
static int op_mul(jj_tok *t) {
  return is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV : is_op(t, "%") ? OP_MOD : 0;
}
static int op_add(jj_tok *t) { return is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : 0; }
static int op_and(jj_tok *t) { return is_kw(t, "and"); }
static int op_or(jj_tok *t) { return is_kw(t, "or"); }

static di_status parse_unary_filtered(parser *P, jnode **out) { return parse_unary(P, 1, out); }
static di_status parse_pow(parser *P, jnode **out) {
  return parse_left_assoc(P, out, parse_unary_filtered, op_pow, E_BINOP);
}
static di_status parse_math2(parser *P, jnode **out) { return parse_left_assoc(P, out, parse_pow, op_mul, E_BINOP); }

static di_status parse_concat(parser *P, jnode **out) {
  jnode *first = NULL;
  DI_TRY(parse_math2(P, &first));
  if (!is_op(cur(P), "~")) {
    *out = first;
    return DI_OK;
  }
  jnode *c = node(P, E_CONCAT, cur(P));
  if (!c) return oom();
  if (list_push(P, &c->list, first)) return oom();
  while (is_op(cur(P), "~")) {
    adv(P);
    jnode *x = NULL;
    DI_TRY(parse_math2(P, &x));
    if (list_push(P, &c->list, x)) return oom();
  }
  *out = c;
  return DI_OK;
}

static di_status parse_math1(parser *P, jnode **out) { return parse_left_assoc(P, out, parse_concat, op_add, E_BINOP); }

static di_status parse_compare(parser *P, jnode **out) {
  jnode *l = NULL;
  DI_TRY(parse_math1(P, &l));
  jnode *cmp = NULL;
  int cap = 0;
  for (;;) {
    jj_tok *t = cur(P);
    int op = 0;
    if (is_op(t, "==")) op = OP_EQ;
    else if (is_op(t, "!=")) op = OP_NE;
    else if (is_op(t, "<")) op = OP_LT;
    else if (is_op(t, "<=")) op = OP_LE;
    else if (is_op(t, ">")) op = OP_GT;
    else if (is_op(t, ">=")) op = OP_GE;
    else if (is_kw(t, "in")) op = OP_IN;
    else if (is_kw(t, "not") && is_kw(peek(P, 1), "in")) {
      op = OP_NOTIN;
      adv(P);
    }
    if (!op) break;
    adv(P);
    jnode *r = NULL;
    DI_TRY(parse_math1(P, &r));
    if (!cmp) {
      if (!(cmp = node(P, E_COMPARE, t))) return oom();
      cmp->a = l;
    }
    if (cmp->list.n == cap) {
      cap = cap ? cap * 2 : 2;
      uint8_t *ops = jj_alloc(P->a, (size_t)cap);
      if (!ops) return oom();
      if (cmp->list.n) memcpy(ops, cmp->ops, (size_t)cmp->list.n);
      cmp->ops = ops;
    }
    cmp->ops[cmp->list.n] = (uint8_t)op;
    if (list_push(P, &cmp->list, r)) return oom();
  }
  *out = cmp ? cmp : l;
  return DI_OK;
}

static di_status parse_not(parser *P, jnode **out) {
  jj_tok *t = cur(P);
  if (is_kw(t, "not")) {
    if (++P->depth > MAX_DEPTH) return perr(P, t, DI_ERR_UNSUPPORTED, "%s", "expression nested too deeply");
    adv(P);
    jnode *x = NULL, *n = NULL;
    DI_TRY(parse_not(P, &x));
    if (!(n = node(P, E_NOT, t))) return oom();
    n->a = x;
    P->depth--;
    *out = n;
    return DI_OK;
  }
  return parse_compare(P, out);
}

static di_status parse_and(parser *P, jnode **out) { return parse_left_assoc(P, out, parse_not, op_and, E_AND); }
static di_status parse_or(parser *P, jnode **out) { return parse_left_assoc(P, out, parse_and, op_or, E_OR); }

static di_status parse_expression(parser *P, int with_cond, jnode **out) {
  if (++P->depth > MAX_DEPTH) return perr(P, cur(P), DI_ERR_UNSUPPORTED, "%s", "expression nested too deeply");
  jnode *e = NULL;
  DI_TRY(parse_or(P, &e));
  if (with_cond) {
    while (is_kw(cur(P), "if")) {
      jj_tok *at = cur(P);
      adv(P);
      jnode *cond, *els = NULL, *n;
      DI_TRY(parse_or(P, &cond));
      if (is_kw(cur(P), "else")) {
        adv(P);
        DI_TRY(parse_expression(P, 1, &els));
      }
      if (!(n = node(P, E_COND, at))) return oom();
      n->a = cond;
      n->b = e;
      n->c = els;
      e = n;
    }
  }
  P->depth--;
  *out = e;
  return DI_OK;
}

static int tuple_end(parser *P, const char *extra) {
  jj_tok *t = cur(P);
  return t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF || is_op(t, ")") ||
         (extra && is_kw(t, extra));
}

static di_status parse_tuple(parser *P, int with_cond, int explicit_paren, const char *extra_end, jnode **out) {
  jj_tok *at = cur(P);
  jn_list items = {0};
  int is_tuple = 0;
  for (;;) {
    if (items.n) DI_TRY(expect_op(P, ","));
    if (tuple_end(P, extra_end)) break;
    jnode *e = NULL;
    DI_TRY(parse_expression(P, with_cond, &e));
    if (list_push(P, &items, e)) return oom();
    if (is_op(cur(P), ",")) is_tuple = 1;
    else break;
  }
  if (!is_tuple) {
    if (items.n) {
      *out = items.v[0];
      return DI_OK;
    }
    if (!explicit_paren) return unexpected(P, "an expression");
  }
  jnode *t = node(P, E_TUPLE, at);
  if (!t) return oom();
  t->list = items;
  *out = t;
  return DI_OK;
}

/* Assignment targets: a name, ns.attr (with_ns), or names separated by commas. */
static di_status parse_target(parser *P, int with_ns, jnode **out) {
  jj_tok *at = cur(P);
  if (with_ns && at->type == TK_NAME && is_op(peek(P, 1), ".") && peek(P, 2)->type == TK_NAME) {
    jnode *n = node(P, E_ATTR, at), *b = node(P, E_NAME, at);
    if (!n || !b) return oom();
    b->name = at->p;
    b->name_len = at->n;
    n->a = b;
    n->name = peek(P, 2)->p;
    n->name_len = peek(P, 2)->n;
    adv(P); adv(P); adv(P);
    *out = n;
    return DI_OK;
  }
  int paren = is_op(at, "(");
  if (paren) adv(P);
  jn_list names = {0};
  int is_tuple = paren;
  for (;;) {
    jj_tok *t = cur(P);
    if (t->type != TK_NAME || is_kw(t, "in")) return unexpected(P, "a variable name to assign to");
    jnode *n = node(P, E_NAME, t);
    if (!n) return oom();
    n->name = t->p;
    n->name_len = t->n;
    if (list_push(P, &names, n)) return oom();
    adv(P);
    if (!is_op(cur(P), ",")) break;
    adv(P);
    is_tuple = 1;
    if (paren && is_op(cur(P), ")")) break;
  }
  if (paren) DI_TRY(expect_op(P, ")"));
  if (!is_tuple) {
    *out = names.v[0];
    return DI_OK;
  }
  jnode *t = node(P, E_TUPLE, at);
  if (!t) return oom();
  t->list = names;
  *out = t;
  return DI_OK;
}

/* Parses statements until `{% <one of ends> ...`; leaves the parser on that end name. */
static di_status parse_body(parser *P, const char *const *ends, jn_list *body, const char **which);

static di_status end_tag(parser *P) { /* after the end name */
  adv(P);
  return expect_block_end(P);
}

static di_status parse_if(parser *P, jj_tok *at, jnode **out) {
  jnode *n = node(P, N_IF, at);
  if (!n) return oom();
  *out = n;
  DI_TRY(parse_tuple(P, 0, 0, NULL, &n->a));
  DI_TRY(expect_block_end(P));
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  for (;;) {
    const char *w;
    DI_TRY(parse_body(P, ends, &n->list, &w));
    if (strcmp(w, "elif") == 0) {
      jj_tok *et = cur(P);
      adv(P);
      jnode *e = node(P, N_IF, et);
      if (!e) return oom();
      DI_TRY(parse_tuple(P, 0, 0, NULL, &e->a));
      DI_TRY(expect_block_end(P));
      if (list_push(P, &n->list2, e)) return oom();
      n = e;
      continue;
    }
    if (strcmp(w, "else") == 0) {
      DI_TRY(end_tag(P));
      static const char *const e2[] = {"endif", NULL};
      DI_TRY(parse_body(P, e2, &n->list2, &w));
    }
    return end_tag(P);
  }
}

static di_status parse_for(parser *P, jj_tok *at, jnode **out) {
  jnode *n = node(P, N_FOR, at);
  if (!n) return oom();
  *out = n;
  DI_TRY(parse_target(P, 0, &n->a));
  if (!is_kw(cur(P), "in")) return unexpected(P, "'in'");
  adv(P);
  DI_TRY(parse_tuple(P, 0, 0, "recursive", &n->b));
  if (is_kw(cur(P), "if")) {
    adv(P);
    DI_TRY(parse_expression(P, 1, &n->c));
  }
  if (is_kw(cur(P), "recursive"))
    return perr(P, cur(P), DI_ERR_UNSUPPORTED, "unsupported construct: %s", "recursive for loops");
  DI_TRY(expect_block_end(P));
  static const char *const ends[] = {"endfor", "else", NULL};
  const char *w;
  DI_TRY(parse_body(P, ends, &n->list, &w));
  if (strcmp(w, "else") == 0) {
    DI_TRY(end_tag(P));
    static const char *const e2[] = {"endfor", NULL};
    DI_TRY(parse_body(P, e2, &n->list2, &w));
  }
  return end_tag(P);
}

static di_status parse_set(parser *P, jj_tok *at, jnode **out) {
  jnode *n = node(P, N_SET, at);
  if (!n) return oom();
  *out = n;
  DI_TRY(parse_target(P, 1, &n->a));
  if (is_op(cur(P), "=")) {
    adv(P);
    DI_TRY(parse_tuple(P, 1, 0, NULL, &n->b));
    return expect_block_end(P);
  }
  n->kind = N_SET_BLOCK;
  if (is_op(cur(P), "|")) {
    /* {% set x | filter %}: the filters apply to the captured body, kept in n->b with a NULL
     * operand the evaluator fills in */
    jnode *f = NULL;
    DI_TRY(parse_filter_expr(P, NULL, &f));
    n->b = f;
  }
  DI_TRY(expect_block_end(P));
  static const char *const ends[] = {"endset", NULL};
  const char *w;
  DI_TRY(parse_body(P, ends, &n->list, &w));
  return end_tag(P);
}

static di_status parse_params(parser *P, jnode *n);

static di_status parse_macro(parser *P, jj_tok *at, jnode **out) {
  jnode *n = node(P, N_MACRO, at);
  if (!n) return oom();
  *out = n;
  if (cur(P)->type != TK_NAME) return unexpected(P, "a macro name");
  n->name = cur(P)->p;
  n->name_len = cur(P)->n;
  adv(P);
  DI_TRY(parse_params(P, n));
  DI_TRY(expect_block_end(P));
  static const char *const ends[] = {"endmacro", NULL};
  const char *w;
  jnode *body = node(P, N_BLOCK, at);
  if (!body) return oom();
  n->a = body;
  jnode *outer = P->cur_macro;
  P->cur_macro = n;
  di_status st = parse_body(P, ends, &body->list, &w);
  P->cur_macro = outer;
  DI_TRY(st);
  adv(P);
  if (cur(P)->type == TK_NAME) adv(P); /* {% endmacro name %} */
  return expect_block_end(P);
}

/* {% call [(params)] macro(args) %}body{% endcall %}: the body becomes the macro's `caller`. */
static di_status parse_call_block(parser *P, jj_tok *at, jnode **out) {
  jnode *n = node(P, N_CALL_BLOCK, at), *cd = node(P, N_MACRO, at), *body = node(P, N_BLOCK, at);
  if (!n || !cd || !body) return oom();
  *out = n;
  cd->name = "caller";
  cd->name_len = 6;
  cd->a = body;
  n->b = cd;
  if (is_op(cur(P), "(")) DI_TRY(parse_params(P, cd));
  DI_TRY(parse_expression(P, 1, &n->a));
  if (n->a->kind != E_CALL) return perr(P, at, DI_ERR_FORMAT, "%s", "a call block needs a macro call");
  DI_TRY(expect_block_end(P));
  static const char *const ends[] = {"endcall", NULL};
  const char *w;
  jnode *outer = P->cur_macro;
  P->cur_macro = cd;
  di_status st = parse_body(P, ends, &body->list, &w);
  P->cur_macro = outer;
  DI_TRY(st);
  return end_tag(P);
}

/* '(' name [= default], ... ')' into m->list (E_NAME) and m->list2 (defaults or NULL). */
static di_status parse_params(parser *P, jnode *n) {
  DI_TRY(expect_op(P, "("));
  while (!is_op(cur(P), ")")) {
    if (n->list.n) DI_TRY(expect_op(P, ","));
    jj_tok *t = cur(P);
    if (t->type != TK_NAME) return unexpected(P, "a parameter name");
    jnode *p = node(P, E_NAME, t);
    if (!p) return oom();
    p->name = t->p;
    p->name_len = t->n;
    adv(P);
    jnode *def = NULL;
    if (is_op(cur(P), "=")) {
      adv(P);
      DI_TRY(parse_expression(P, 1, &def));
    }
    if (list_push(P, &n->list, p) || list_push(P, &n->list2, def)) return oom();
  }
  adv(P);
  return DI_OK;
}

static di_status parse_statement(parser *P, jnode **out) {
  jj_tok *t = cur(P);
  if (t->type != TK_NAME) return unexpected(P, "a tag name");
  adv(P);
  if (is_kw(t, "if")) return parse_if(P, t, out);
  if (is_kw(t, "for")) return parse_for(P, t, out);
  if (is_kw(t, "set")) return parse_set(P, t, out);
  if (is_kw(t, "macro")) return parse_macro(P, t, out);
  if (is_kw(t, "call")) return parse_call_block(P, t, out);
  if (is_kw(t, "break") || is_kw(t, "continue")) {
    if (!(*out = node(P, is_kw(t, "break") ? N_BREAK : N_CONTINUE, t))) return oom();
    return expect_block_end(P);
  }
  if (is_kw(t, "generation")) { /* transformers' AssistantTracker: renders its body */
    jnode *n = node(P, N_BLOCK, t);
    if (!n) return oom();
    *out = n;
    DI_TRY(expect_block_end(P));
    static const char *const ends[] = {"endgeneration", NULL};
    const char *w;
    DI_TRY(parse_body(P, ends, &n->list, &w));
    return end_tag(P);
  }
  if (is_kw(t, "with")) {
    jnode *n = node(P, N_WITH, t);
    if (!n) return oom();
    *out = n;
    /* assignments: targets in list2, values in a->list */
    jnode *vals = node(P, N_BLOCK, t);
    if (!vals) return oom();
    n->a = vals;
    while (cur(P)->type != TK_BLOCK_END) {
      if (n->list2.n) DI_TRY(expect_op(P, ","));
      jnode *tg = NULL, *v = NULL;
      DI_TRY(parse_target(P, 0, &tg));
      DI_TRY(expect_op(P, "="));
      DI_TRY(parse_expression(P, 1, &v));
      if (list_push(P, &n->list2, tg) || list_push(P, &vals->list, v)) return oom();
    }
    adv(P);
    static const char *const ends[] = {"endwith", NULL};
    const char *w;
    DI_TRY(parse_body(P, ends, &n->list, &w));
    return end_tag(P);
  }
  if (is_kw(t, "filter")) {
    jnode *n = node(P, N_FILTER_BLOCK, t);
    if (!n) return oom();
    *out = n;
    P->i--; /* let parse_filter see a '|'-less first filter: re-lex as "filter name" */
    P->t[P->i].type = TK_OP;
    strcpy(P->t[P->i].op, "|");
    DI_TRY(parse_filter_expr(P, NULL, &n->b));
    DI_TRY(expect_block_end(P));
    static const char *const ends[] = {"endfilter", NULL};
    const char *w;
    DI_TRY(parse_body(P, ends, &n->list, &w));
    return end_tag(P);
  }
  static const char *const known[] = {"include", "import", "from", "extends", "block", "autoescape",
                                      "do", "trans", "pluralize", "raw", "endraw", NULL};
  for (int k = 0; known[k]; k++)
    if (is_kw(t, known[k]))
      return perr(P, t, DI_ERR_UNSUPPORTED, "unsupported construct: the '%s' tag", known[k]);
  char nm[64];
  snprintf(nm, sizeof nm, "%.*s", (int)(t->n > 60 ? 60 : t->n), t->p);
  return perr(P, t, DI_ERR_FORMAT, "unknown tag '%s'", nm);
}

static di_status parse_body(parser *P, const char *const *ends, jn_list *body, const char **which) {
  if (++P->depth > MAX_DEPTH) return perr(P, cur(P), DI_ERR_UNSUPPORTED, "%s", "blocks nested too deeply");
  for (;;) {
    jj_tok *t = cur(P);
    if (t->type == TK_EOF) {
      if (ends) {
        /* name the closing tag the block still needs */
        const char *need = ends[0];
        for (int k = 0; ends[k]; k++)
          if (strncmp(ends[k], "end", 3) == 0) need = ends[k];
        return perr(P, t, DI_ERR_FORMAT, "unexpected end of template: missing '{%% %s %%}'", need);
      }
      P->depth--;
      *which = NULL;
      return DI_OK;
    }
    if (t->type == TK_TEXT) {
      jnode *n = node(P, N_TEXT, t);
      if (!n) return oom();
      n->name = t->p;
      n->name_len = t->n;
      if (list_push(P, body, n)) return oom();
      adv(P);
    } else if (t->type == TK_VAR_BEGIN) {
      adv(P);
      jnode *n = node(P, N_OUTPUT, t);
      if (!n) return oom();
      DI_TRY(parse_tuple(P, 1, 0, NULL, &n->a));
      if (cur(P)->type != TK_VAR_END) return unexpected(P, "'}}'");
      adv(P);
      if (list_push(P, body, n)) return oom();
    } else if (t->type == TK_BLOCK_BEGIN) {
      adv(P);
      jj_tok *nm = cur(P);
      if (ends && nm->type == TK_NAME)
        for (int k = 0; ends[k]; k++)
          if (is_kw(nm, ends[k])) {
            *which = ends[k];
            P->depth--;
            return DI_OK;
          }
      if (nm->type == TK_NAME && nm->n >= 3 && (memcmp(nm->p, "end", 3) == 0 || is_kw(nm, "else") || is_kw(nm, "elif"))) {
        char b[64];
        snprintf(b, sizeof b, "%.*s", (int)(nm->n > 60 ? 60 : nm->n), nm->p);
        return perr(P, nm, DI_ERR_FORMAT, "unexpected '%s' tag", b);
      }
      jnode *s = NULL;
      DI_TRY(parse_statement(P, &s));
      if (list_push(P, body, s)) return oom();
    } else return unexpected(P, "template text or a tag");
  }
}

di_status jj_parse(const char *src, size_t len, jj_template **out) {
  jj_template *t = calloc(1, sizeof *t);
  if (!t) return oom();
  jj_tok *toks;
  size_t n;
  di_status st = jj_lex(&t->arena, src, len, &toks, &n);
  if (st == DI_OK) {
    parser P = {&t->arena, toks, n, 0, 0, NULL};
    const char *w = NULL;
    st = parse_body(&P, NULL, &t->body, &w);
  }
  if (st == DI_OK && t->arena.failed) st = oom();
  if (st != DI_OK) {
    jj_template_free(t);
    return st;
  }
  *out = t;
  return DI_OK;
}

void jj_template_free(jj_template *t) {
  if (!t) return;
  jj_arena_free(&t->arena);
  free(t);
}
