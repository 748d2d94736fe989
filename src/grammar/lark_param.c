/* Parameter expressions and conditions of llguidance's parametric Lark rules (lark_param.h). */
#include "grammar/lark_param.h"
#include <string.h>

typedef struct {
  const char *s;
  size_t n, *i;
  const char **err;
} cur;

static void sp(cur *c) {
  while (*c->i < c->n && (c->s[*c->i] == ' ' || c->s[*c->i] == '\t'))
    (*c->i)++;
}

static int fail(cur *c, const char *what) {
  *c->err = what;
  return 0;
}

static int eat(cur *c, char ch) {
  sp(c);
  if (*c->i < c->n && c->s[*c->i] == ch) {
    (*c->i)++;
    return 1;
  }
  return 0;
}

static size_t word(cur *c, char *out, size_t cap) {
  sp(c);
  size_t k = 0;
  while (*c->i < c->n && ((c->s[*c->i] >= 'a' && c->s[*c->i] <= 'z') || c->s[*c->i] == '_' ||
                          (k > 0 && c->s[*c->i] >= '0' && c->s[*c->i] <= '9'))) {
    if (k + 1 < cap)
      out[k++] = c->s[*c->i];
    (*c->i)++;
  }
  out[k] = 0;
  return k;
}

/* A decimal or 0x-hex literal of at most 64 bits. */
static int literal(cur *c, uint64_t *v) {
  sp(c);
  size_t j = *c->i;
  int hex = j + 1 < c->n && c->s[j] == '0' && (c->s[j + 1] == 'x' || c->s[j + 1] == 'X');
  if (hex)
    j += 2;
  uint64_t x = 0;
  size_t d0 = j;
  for (; j < c->n; j++) {
    char ch = c->s[j];
    int dv = ch >= '0' && ch <= '9' ? ch - '0' : hex && (ch | 32) >= 'a' && (ch | 32) <= 'f' ? (ch | 32) - 'a' + 10 : -1;
    if (dv < 0)
      break;
    uint64_t base = hex ? 16 : 10;
    if (x > (UINT64_MAX - (uint64_t)dv) / base)
      return fail(c, "a parameter literal beyond 64 bits");
    x = x * base + (uint64_t)dv;
  }
  if (j == d0)
    return fail(c, "expected a number (decimal or 0x hex)");
  *c->i = j;
  *v = x;
  return 1;
}

static int bit_index(cur *c, int *k) {
  uint64_t v;
  if (!literal(c, &v))
    return 0;
  if (v > 63)
    return fail(c, "a bit index is 0..63");
  *k = (int)v;
  return 1;
}

/* `[x:y]` (0 <= x < y <= 64) or `_` ([0:64]) into shift and mask. */
static int range(cur *c, int *shift, uint64_t *mask) {
  if (eat(c, '_')) {
    *shift = 0, *mask = UINT64_MAX;
    return 1;
  }
  if (!eat(c, '['))
    return fail(c, "expected a bit range [x:y] or _");
  uint64_t x, y;
  if (!literal(c, &x) || !eat(c, ':') || !literal(c, &y) || !eat(c, ']'))
    return *c->err ? 0 : fail(c, "a bit range is [x:y]");
  if (!(x < y && y <= 64))
    return fail(c, "a bit range [x:y] needs 0 <= x < y <= 64");
  *shift = (int)x;
  *mask = y - x == 64 ? UINT64_MAX : ((uint64_t)1 << (y - x)) - 1;
  return 1;
}

static int popcount(uint64_t v) {
  int k = 0;
  for (; v; v &= v - 1)
    k++;
  return k;
}

int di_lark_param_expr(const char *s, size_t n, size_t *i, int in_param, uint64_t p, uint64_t *out, const char **err) {
  cur c = {s, n, i, err};
  *err = NULL;
  sp(&c);
  if (*i < n && s[*i] >= '0' && s[*i] <= '9')
    return literal(&c, out);
  if (!in_param)
    return fail(&c, "only a literal parameter outside a parametric rule (name::_)");
  if (*i < n && s[*i] == '_' && !(*i + 1 < n && s[*i + 1] >= 'a' && s[*i + 1] <= 'z')) {
    (*i)++;
    *out = p;
    return 1;
  }
  char f[32];
  if (!word(&c, f, sizeof f) || !eat(&c, '('))
    return fail(&c, "expected _, a number or a parameter function");
  int k, shift;
  uint64_t v, mask;
  if (strcmp(f, "set_bit") == 0 || strcmp(f, "clear_bit") == 0) {
    if (!bit_index(&c, &k))
      return 0;
    *out = f[0] == 's' ? p | ((uint64_t)1 << k) : p & ~((uint64_t)1 << k);
  } else if (strcmp(f, "bit_and") == 0 || strcmp(f, "bit_or") == 0) {
    if (!literal(&c, &v))
      return 0;
    *out = f[4] == 'a' ? p & v : p | v;
  } else if (strcmp(f, "incr") == 0 || strcmp(f, "decr") == 0) {
    if (!range(&c, &shift, &mask))
      return 0;
    uint64_t field = (p >> shift) & mask;
    if (f[0] == 'i')
      *out = field == mask ? p : p + ((uint64_t)1 << shift);
    else
      *out = field == 0 ? p : p - ((uint64_t)1 << shift);
  } else {
    return fail(&c, "unknown parameter function (set_bit, clear_bit, bit_and, bit_or, incr, decr)");
  }
  if (!eat(&c, ')'))
    return fail(&c, "expected ')'");
  return 1;
}

static int cond(cur *c, uint64_t p, int *out, int depth) {
  if (depth > 50)
    return fail(c, "a condition nested too deeply");
  char f[32];
  if (!word(c, f, sizeof f))
    return fail(c, "expected a condition");
  if (strcmp(f, "true") == 0) {
    if (eat(c, '(') && !eat(c, ')'))
      return fail(c, "expected ')'");
    *out = 1;
    return 1;
  }
  if (!eat(c, '('))
    return fail(c, "expected '(' after the condition's name");
  int a, b2, k, shift;
  uint64_t v, mask;
  if (strcmp(f, "and") == 0 || strcmp(f, "or") == 0) {
    if (!cond(c, p, &a, depth + 1) || !(eat(c, ',') || fail(c, "expected ','")) || !cond(c, p, &b2, depth + 1))
      return 0;
    *out = f[0] == 'a' ? a && b2 : a || b2;
  } else if (strcmp(f, "not") == 0) {
    if (!cond(c, p, &a, depth + 1))
      return 0;
    *out = !a;
  } else if (strcmp(f, "bit_clear") == 0 || strcmp(f, "bit_set") == 0) {
    if (!bit_index(c, &k))
      return 0;
    *out = (int)((p >> k) & 1) == (f[4] == 's');
  } else if (strcmp(f, "is_ones") == 0 || strcmp(f, "is_zeros") == 0) {
    if (!range(c, &shift, &mask))
      return 0;
    uint64_t field = (p >> shift) & mask;
    *out = f[3] == 'o' ? field == mask : field == 0;
  } else {
    int counting = strncmp(f, "bit_count_", 10) == 0;
    const char *op = counting ? f + 10 : f;
    static const char *const ops[] = {"eq", "ne", "lt", "le", "gt", "ge"};
    int which = -1;
    for (int j = 0; j < 6; j++)
      if (strcmp(op, ops[j]) == 0)
        which = j;
    if (which < 0)
      return fail(c, "unknown condition");
    if (!range(c, &shift, &mask) || !(eat(c, ',') || fail(c, "expected ','")) || !literal(c, &v))
      return 0;
    uint64_t x = (p >> shift) & mask;
    if (counting)
      x = (uint64_t)popcount(x);
    *out = which == 0 ? x == v : which == 1 ? x != v : which == 2 ? x < v : which == 3 ? x <= v : which == 4 ? x > v : x >= v;
  }
  if (!eat(c, ')'))
    return fail(c, "expected ')'");
  return 1;
}

int di_lark_param_cond(const char *s, size_t n, size_t *i, uint64_t p, int *out, const char **err) {
  cur c = {s, n, i, err};
  *err = NULL;
  return cond(&c, p, out, 0);
}
