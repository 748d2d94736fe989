/* EBNF front-end: the GBNF dialect llama.cpp users write -- `name ::= alternatives`, literals
 * with escapes, [classes] with ranges and ^negation, `.`, groups, `? * + {m} {m,} {m,n}`, `#`
 * comments; the start rule is `root`. Errors say "line L, column C". XGrammar's rule attributes,
 * `name[lazy, max_chars=N, max_tokens=N, capture="x"] ::= ...` (the rule's language must be
 * regular), run after parsing as Lark's do (rule_ops.h). */
#include "util/text.h"
#include "grammar/gram_ir.h"
#include "grammar/literal_char.h"
#include "grammar/rule_ops.h"
#include "grammar/token_ref.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
  di_gb *b;
  const char *s;
  size_t n, i;
  int depth;
  size_t *refpos; /* first reference of each rule (for "used but not defined") */
  int cap_ref;
  di_rule_ops ops; /* the rules' attributes, run once every rule is defined */
} ep;

static di_status perr(const ep *p, size_t at, const char *fmt, const char *arg) {
  int line, col;
  di_text_line_col(p->s, p->n, at, &line, &col);
  char msg[256];
  snprintf(msg, sizeof msg, fmt, arg ? arg : "");
  return di_error_set(DI_ERR_FORMAT, "grammar: %s at line %d, column %d", msg, line, col);
}

static void skip_space(ep *p, int newlines) {
  while (p->i < p->n) {
    char c = p->s[p->i];
    if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
      p->i++;
    } else if (c == '#') {
      while (p->i < p->n && p->s[p->i] != '\n')
        p->i++;
    } else {
      break;
    }
  }
}

static int is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}



/* One character of a literal or class, with escapes (also of the class punctuation and `/ .`).
 * Returns a code point or sets *st. */
static int32_t parse_char(ep *p, di_status *st) {
  size_t at = p->i;
  int32_t c = -1;
  int digits = 0;
  switch (di_read_literal_char(p->s, p->n, &p->i, "[]-^/.", &c, &digits)) {
  case DI_LIT_OK: return c;
  case DI_LIT_BAD_UTF8: *st = perr(p, at, "invalid UTF-8%s", NULL); return -1;
  case DI_LIT_UNFINISHED: *st = perr(p, at, "unfinished escape%s", NULL); return -1;
  case DI_LIT_UNKNOWN: *st = perr(p, at, "unknown escape%s", NULL); return -1;
  case DI_LIT_BAD_HEX:
    *st = perr(p, at, "escape needs %s hex digits", digits == 2 ? "2" : digits == 4 ? "4" : "8");
    return -1;
  case DI_LIT_RANGE: *st = perr(p, at, "code point out of range%s", NULL); return -1;
  }
  return -1;
}

static di_status parse_alternates(ep *p, int rule, int nested);

/* Where the attribute list `[...]` right after a rule name at j ends (j itself when there is none):
 * a `[` directly after the name, closed on the same line. Only a rule definition can follow a name
 * with one and then `::=` (a class after a reference never meets `::=`). */
static size_t attrs_end(const ep *p, size_t j) {
  if (j >= p->n || p->s[j] != '[')
    return j;
  for (size_t k = j + 1; k < p->n && p->s[k] != '\n'; k++)
    if (p->s[k] == ']')
      return k + 1;
  return j;
}

/* `[attr, attr=value, ...]` after rule r's name (XGrammar's EBNF): lazy, max_chars=N, max_tokens=N
 * (pushed in that order, whatever order they are written in, as Lark's are), capture="x" / capture=x
 * (a name for the matched text: no change to the language). */
static di_status parse_attributes(ep *p, int r, size_t at) {
  int lazy = 0, max_chars = -1, max_tokens = 0, seen_capture = 0;
  p->i++; /* '[' */
  for (;;) {
    skip_space(p, 0);
    size_t k = p->i;
    while (p->i < p->n && (is_word(p->s[p->i])))
      p->i++;
    char key[32];
    if (p->i == k || p->i - k >= sizeof key)
      return perr(p, k, "expected an attribute name (lazy, max_chars, max_tokens, capture)%s", NULL);
    memcpy(key, p->s + k, p->i - k);
    key[p->i - k] = 0;
    skip_space(p, 0);
    long v = -1;
    int has_value = p->i < p->n && p->s[p->i] == '=';
    if (has_value) {
      p->i++;
      skip_space(p, 0);
      if (strcmp(key, "capture") == 0) { /* a string or a name */
        if (p->i < p->n && p->s[p->i] == '"') {
          size_t q = p->i + 1;
          while (q < p->n && p->s[q] != '"' && p->s[q] != '\n')
            q += p->s[q] == '\\' && q + 1 < p->n ? 2 : 1;
          if (q >= p->n || p->s[q] != '"')
            return perr(p, p->i, "unterminated capture name%s", NULL);
          p->i = q + 1;
        } else {
          size_t q = p->i;
          while (p->i < p->n && is_word(p->s[p->i]))
            p->i++;
          if (p->i == q)
            return perr(p, q, "capture takes a name or a string%s", NULL);
        }
      } else { /* digits within the source (it is not NUL-terminated: no strtol) */
        size_t q = p->i;
        v = 0;
        while (q < p->n && p->s[q] >= '0' && p->s[q] <= '9' && v <= 1000000)
          v = v * 10 + (p->s[q++] - '0');
        if (q == p->i || (q < p->n && p->s[q] >= '0' && p->s[q] <= '9') ||
            (q < p->n && p->s[q] != ',' && p->s[q] != ']' && p->s[q] != ' ' && p->s[q] != '\t'))
          return perr(p, p->i, "attribute '%s' takes a whole number", key);
        p->i = q;
      }
    }
    if (strcmp(key, "lazy") == 0 && !has_value && !lazy) {
      lazy = 1;
    } else if (strcmp(key, "max_chars") == 0 && has_value && max_chars < 0) {
      if (v < 0 || v > 100000)
        return perr(p, k, "max_chars must be 0..100000%s", NULL);
      max_chars = (int)v;
    } else if (strcmp(key, "max_tokens") == 0 && has_value && !max_tokens) {
      if (v < 1 || v > DI_RLANG_MAX_TOKENS)
        return perr(p, k, "max_tokens must be 1..4096%s", NULL);
      max_tokens = (int)v;
    } else if (strcmp(key, "capture") == 0 && has_value && !seen_capture) {
      seen_capture = 1;
    } else if (strcmp(key, "lazy") == 0 || strcmp(key, "max_chars") == 0 || strcmp(key, "max_tokens") == 0 ||
               strcmp(key, "capture") == 0) {
      return perr(p, k, "attribute '%s' given twice or without its value (lazy has none)", key);
    } else {
      return perr(p, k, "unknown rule attribute '%s' (lazy, max_chars, max_tokens and capture are taken)", key);
    }
    skip_space(p, 0);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == ']') {
      p->i++;
      break;
    }
    return perr(p, p->i, "expected ',' or ']' in the rule's attributes%s", NULL);
  }
  int line, col;
  di_text_line_col(p->s, p->n, at, &line, &col);
  char w[48];
  snprintf(w, sizeof w, "line %d, column %d", line, col);
  di_status st = DI_OK;
  if (lazy)
    st = di_rule_ops_push(&p->ops, DI_ROP_LAZY, r, &r, 1, -1, w);
  if (st == DI_OK && max_chars >= 0)
    st = di_rule_ops_push(&p->ops, DI_ROP_CHARS, r, &r, 1, max_chars, w);
  if (st == DI_OK && max_tokens > 0) /* last: it bounds the rule's final language */
    st = di_rule_ops_push(&p->ops, DI_ROP_TOKENS, r, &r, 1, max_tokens, w);
  return st;
}



static int note_ref(ep *p, int rule, size_t at) {
  if (rule >= p->cap_ref) {
    int nc = p->cap_ref ? p->cap_ref * 2 : 64;
    while (nc <= rule)
      nc *= 2;
    size_t *q = realloc(p->refpos, sizeof(size_t) * (size_t)nc);
    if (!q)
      return 0;
    for (int k = p->cap_ref; k < nc; k++)
      q[k] = (size_t)-1;
    p->refpos = q;
    p->cap_ref = nc;
  }
  if (p->refpos[rule] == (size_t)-1)
    p->refpos[rule] = at;
  return 1;
}

static int parse_int(ep *p, int *out) { return di_parse_decimal_capped(p->s, p->n, &p->i, out); }

static di_status parse_sequence(ep *p, di_gseq *seq, int nested) {
  di_gb *b = p->b;
  int item = -1; /* start of the last item in seq, what a postfix operator applies to */
  di_status st = DI_OK;
  for (;;) {
    skip_space(p, nested);
    if (p->i >= p->n)
      break;
    char c = p->s[p->i];
    size_t at = p->i;
    if (c == '"') {
      item = seq->n;
      p->i++;
      while (p->i < p->n && p->s[p->i] != '"') {
        int32_t cp = parse_char(p, &st);
        if (cp < 0)
          return st;
        di_gseq_cp(b, seq, (uint32_t)cp);
      }
      if (p->i >= p->n)
        return perr(p, at, "unterminated string literal%s", NULL);
      p->i++;
    } else if (c == '[') {
      item = seq->n;
      p->i++;
      int neg = 0;
      if (p->i < p->n && p->s[p->i] == '^')
        neg = 1, p->i++;
      di_cprange *rs = NULL;
      int nr = 0, cap = 0;
      while (p->i < p->n && p->s[p->i] != ']') {
        int32_t lo = parse_char(p, &st), hi;
        if (lo < 0) {
          free(rs);
          return st;
        }
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
          p->i++;
          hi = parse_char(p, &st);
          if (hi < 0) {
            free(rs);
            return st;
          }
          if (hi < lo) {
            free(rs);
            return perr(p, at, "character range out of order%s", NULL);
          }
        }
        if (nr == cap) {
          cap = cap ? cap * 2 : 8;
          di_cprange *q = realloc(rs, sizeof *rs * (size_t)cap);
          if (!q) {
            free(rs);
            return di_error_set(DI_ERR_OOM, "out of memory");
          }
          rs = q;
        }
        rs[nr++] = (di_cprange){(uint32_t)lo, (uint32_t)hi};
      }
      if (p->i >= p->n) {
        free(rs);
        return perr(p, at, "unterminated character class%s", NULL);
      }
      p->i++;
      di_gseq_cpset(b, seq, rs, nr, neg);
      free(rs);
    } else if (c == '.') {
      item = seq->n;
      p->i++;
      di_cprange all = {0, 0x10FFFF};
      di_gseq_cpset(b, seq, &all, 1, 0);
    } else if (c == '(') {
      item = seq->n;
      p->i++;
      if (++p->depth > 200)
        return perr(p, at, "groups nested too deeply%s", NULL);
      int r = di_gb_new_rule(b, "group");
      DI_TRY(parse_alternates(p, r, 1));
      p->depth--;
      skip_space(p, 1);
      if (p->i >= p->n || p->s[p->i] != ')')
        return perr(p, at, "unclosed '('%s", NULL);
      p->i++;
      di_gseq_push(b, seq, (di_gel){DI_GE_RULE, r});
    } else if (is_word(c)) {
      size_t j = p->i;
      while (j < p->n && is_word(p->s[j]))
        j++;
      size_t k = attrs_end(p, j);
      while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t'))
        k++;
      if (!nested && k + 2 < p->n && memcmp(p->s + k, "::=", 3) == 0)
        break; /* the next rule starts */
      char name[128];
      if (j - p->i >= sizeof name)
        return perr(p, at, "rule name too long%s", NULL);
      memcpy(name, p->s + p->i, j - p->i);
      name[j - p->i] = 0;
      p->i = j;
      item = seq->n;
      int r = di_gb_rule(b, name);
      if (!note_ref(p, r, at))
        return di_error_set(DI_ERR_OOM, "out of memory");
      di_gseq_push(b, seq, (di_gel){DI_GE_RULE, r});
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (item < 0)
        return perr(p, at, "'%s' has nothing to repeat", (char[]){c, 0});
      int min = 0, max = -1;
      p->i++;
      if (c == '+')
        min = 1;
      else if (c == '?')
        max = 1;
      else if (c == '{') {
        skip_space(p, 0);
        if (!parse_int(p, &min))
          return perr(p, at, "expected a number after '{'%s", NULL);
        skip_space(p, 0);
        max = min;
        if (p->i < p->n && p->s[p->i] == ',') {
          p->i++;
          skip_space(p, 0);
          max = -1;
          parse_int(p, &max);
          skip_space(p, 0);
        }
        if (p->i >= p->n || p->s[p->i] != '}')
          return perr(p, at, "expected '}'%s", NULL);
        p->i++;
        if (max >= 0 && max < min)
          return perr(p, at, "repetition {m,n} with n < m%s", NULL);
      }
      di_gseq tail = {0};
      for (int k = item; k < seq->n; k++)
        di_gseq_push(b, &tail, seq->v[k]);
      seq->n = item;
      di_gel x = di_gb_wrap(b, &tail, "item");
      di_gseq_free(&tail);
      di_gseq_repeat(b, seq, x, min, max);
      if (b->oom)
        return di_error_set(DI_ERR_OOM, "out of memory");
      if (b->total_els > b->max_els)
        return perr(p, at, "repetition makes the grammar too large%s", NULL);
      item = -1; /* "a**" is an error as in llama.cpp */
    } else if (c == '<' || (c == '!' && p->i + 1 < p->n && p->s[p->i + 1] == '<')) {
      size_t j = p->i + (c == '!');
      int32_t id = 0;
      if (!di_token_ref_parse(p->s, p->n, &j, &id))
        return perr(p, at, "expected a token reference <[id]> or !<[id]>%s", NULL);
      p->i = j;
      item = seq->n;
      di_token_ref_push(b, seq, id, c == '!');
      b->has_token_refs = 1;
    } else {
      break; /* | ) newline or something the caller reports */
    }
    if (b->oom)
      return di_error_set(DI_ERR_OOM, "out of memory");
  }
  return DI_OK;
}

static di_status parse_alternates(ep *p, int rule, int nested) {
  for (;;) {
    di_gseq seq = {0};
    di_status st = parse_sequence(p, &seq, nested);
    if (st == DI_OK)
      st = di_gb_add_alt(p->b, rule, seq.v, seq.n);
    di_gseq_free(&seq);
    DI_TRY(st);
    skip_space(p, nested);
    /* a line starting with '|' continues the rule (more lenient than llama.cpp) */
    size_t k = p->i;
    if (!nested) {
      size_t j = k;
      while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t' || p->s[j] == '\r' || p->s[j] == '\n'))
        j++;
      if (j < p->n && p->s[j] == '|')
        k = j;
    }
    if (k < p->n && p->s[k] == '|') {
      p->i = k + 1;
      skip_space(p, 1);
      continue;
    }
    return DI_OK;
  }
}

di_status di_ebnf_compile(di_gb *b, const char *src, size_t len, const char *root_name) {
  if (!root_name || !root_name[0])
    root_name = "root";
  ep p = {.b = b, .s = src, .n = len};
  di_status st = DI_OK;
  for (;;) {
    skip_space(&p, 1);
    if (p.i >= p.n)
      break;
    size_t at = p.i;
    size_t j = p.i;
    while (j < p.n && is_word(p.s[j]))
      j++;
    if (j == p.i) {
      st = perr(&p, at, "expected a rule name%s", NULL);
      break;
    }
    char name[128];
    if (j - p.i >= sizeof name) {
      st = perr(&p, at, "rule name too long%s", NULL);
      break;
    }
    memcpy(name, p.s + p.i, j - p.i);
    name[j - p.i] = 0;
    p.i = j;
    int r = di_gb_rule(b, name);
    if (b->oom) {
      st = di_error_set(DI_ERR_OOM, "out of memory building the grammar");
      break;
    }
    if (b->rules[r].defined) {
      st = perr(&p, at, "rule '%s' defined twice", name);
      break;
    }
    if (p.i < p.n && p.s[p.i] == '[' && (st = parse_attributes(&p, r, at)) != DI_OK)
      break;
    skip_space(&p, 0);
    if (p.i + 3 > p.n || memcmp(p.s + p.i, "::=", 3) != 0) {
      st = perr(&p, p.i, "expected '::=' after rule name%s", NULL);
      break;
    }
    p.i += 3;
    skip_space(&p, 1);
    st = parse_alternates(&p, r, 0);
    if (st != DI_OK)
      break;
    skip_space(&p, 0);
    if (p.i < p.n && p.s[p.i] != '\n') {
      st = perr(&p, p.i, "unexpected '%s'", (char[]){p.s[p.i], 0});
      break;
    }
  }
  if (st == DI_OK && b->oom) /* rules may be half made (a NULL name) */
    st = di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  if (st == DI_OK) {
    for (int r = 0; r < b->n_rules; r++) {
      if (!b->rules[r].defined) {
        size_t at = r < p.cap_ref && p.refpos[r] != (size_t)-1 ? p.refpos[r] : 0;
        st = perr(&p, at, "rule '%s' is used but not defined", b->rules[r].name);
        break;
      }
    }
  }
  int root = -1;
  if (st == DI_OK) {
    for (int r = 0; r < b->n_rules; r++)
      if (strcmp(b->rules[r].name, root_name) == 0)
        root = r;
    if (root < 0)
      st = di_error_set(DI_ERR_FORMAT, "grammar: no '%s' rule at line 1, column 1", root_name);
  }
  if (st == DI_OK)
    st = di_rule_ops_run(b, &p.ops, "grammar");
  free(p.refpos);
  di_rule_ops_free(&p.ops);
  DI_TRY(st);
  return di_gb_finish(b, root);
}
