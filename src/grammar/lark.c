/* Lark front-end (the dialect llguidance takes, and OpenAI's grammar-constrained custom tools):
 * `rule: expansions` (lower case) and `TERMINAL: expansions` (upper case), `|` alternatives that
 * may continue on lines starting with `|`, strings "..." (flag i), ranges "a".."z", /regex/
 * terminals (flags i, s, u; Rust regex syntax as llguidance has it, see regex.c's DI_RE_LARK), groups
 * ( ), optionals [ ], `? * +`, `~ N` and `~ N..M`, `-> alias` (ignored), `?rule` / `!rule` / `_rule`
 * (tree shaping, ignored), priorities `name.N` (parsed: the language is the union, so priorities
 * only matter to a lexer), `%import common.NAME [-> ALIAS]` / `%import common (A, B)`, `%ignore`.
 * The start rule is `start`. `//` comments.
 *
 * Lowering: the output is characters, not tokens, so %ignore becomes an optional repetition of the
 * ignored terminals before every terminal used in a rule (lower-case definition) and at the end of
 * the output; terminal definitions themselves are contiguous text. Direct left recursion
 * (`expr: expr "+" term | term`, which Lark allows) is rewritten into right recursion
 * (`expr: term expr_tail`, `expr_tail: "+" term expr_tail | ""`); indirect left recursion is an
 * error naming the rule. Errors say "line L, column C". */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"
#include "grammar/literal_char.h"
#include "grammar/token_ref.h"
#include "grammar/gram_ir.h"
#include "grammar/lark_param.h"
#include "grammar/regular_set.h"
#include "grammar/rule_ops.h"
#include "grammar/rule_scc.h"
#include "grammar/substring.h"
#include "util/grow.h"
#include "util/text.h"

typedef struct {
  di_gb *b;
  const char *s;
  size_t n, i;
  int depth;
  int has_ignore;    /* the grammar has %ignore: insert the ignore rule before terminals */
  int ign;           /* the ignore rule: (ignored alternatives)* */
  int ign_set;       /* the ignored alternatives */
  const char *prefix; /* names are prefixed in the built-in common library and in nested %lark grammars */
  const struct di_grammar_options *opt; /* for %json's schemas */
  di_rule_ops ops; /* regular-language operations done after parsing (rule_ops.h) */
  /* parametric rules (lark_param.h): definitions `name::_` (their body's offset), instances queued
   * by references `name::EXPR` and parsed once per parameter value after the other definitions */
  struct lark_pdef { char name[256]; size_t body; } *pdefs;
  int npdefs, cap_pdefs;
  struct lark_pinst { char name[256]; uint64_t v; int rule; size_t at; } *pq;
  int npq, cap_pq;
  char *queued; /* per rule id: an instance queued */
  int cap_queued;
  int in_param, dry; /* parsing a parametric body (for parameter p->param); checking it only */
  int ignore_once;    /* %llguidance {"ignore_once": true}: one %ignore match per gap, not a run */
  int initial_skip;   /* %grammar_options {"allow_initial_skip": ...}: -1 unset, 0 / 1 */
  uint64_t param;
  int chars_bound;    /* the max_chars=N of the rule whose body is being parsed (-1: none), for %json */
} lp;

#define LARK_MAX_INSTANCES 10000

/* Operations on regular languages (rule_ops.h), done once every definition is parsed (operands
 * may name terminals defined later): a lazy rule (shortest matches: [lazy], and [stop=X] /
 * [suffix=X] on body X), a character bound ([max_chars=N]), a token bound ([max_tokens=N]) and
 * terminals' `A & B` (intersection) and `~A` (complement). */
enum { OP_LAZY = DI_ROP_LAZY, OP_CHARS = DI_ROP_CHARS, OP_AND = DI_ROP_AND, OP_NOT = DI_ROP_NOT,
       OP_TOKENS = DI_ROP_TOKENS };

/* Lark's common.lark, the terminals `%import common.X` brings in (written in the dialect above). */
static const char COMMON[] =
    "DIGIT: \"0\"..\"9\"\n"
    "HEXDIGIT: \"a\"..\"f\" | \"A\"..\"F\" | DIGIT\n"
    "INT: DIGIT+\n"
    "SIGNED_INT: [\"+\"|\"-\"] INT\n"
    "DECIMAL: INT \".\" INT? | \".\" INT\n"
    "_EXP: (\"e\"|\"E\") SIGNED_INT\n"
    "FLOAT: INT _EXP | DECIMAL _EXP?\n"
    "SIGNED_FLOAT: [\"+\"|\"-\"] FLOAT\n"
    "NUMBER: FLOAT | INT\n"
    "SIGNED_NUMBER: [\"+\"|\"-\"] NUMBER\n"
    "_STRING_INNER: /.*/\n"
    "_STRING_ESC_INNER: /([^\"\\\\\\n]|\\\\[^\\n])*/\n"
    "ESCAPED_STRING: \"\\\"\" _STRING_ESC_INNER \"\\\"\"\n"
    "LCASE_LETTER: \"a\"..\"z\"\n"
    "UCASE_LETTER: \"A\"..\"Z\"\n"
    "LETTER: UCASE_LETTER | LCASE_LETTER\n"
    "WORD: LETTER+\n"
    "CNAME: (\"_\"|LETTER) (\"_\"|LETTER|DIGIT)*\n"
    "WS_INLINE: (\" \"|/\\t/)+\n"
    "WS: /[ \\t\\f\\r\\n]/+\n"
    "CR: /\\r/\n"
    "LF: /\\n/\n"
    "NEWLINE: (CR? LF)+\n"
    "SH_COMMENT: /#[^\\n]*/\n"
    "CPP_COMMENT: /\\/\\/[^\\n]*/\n"
    "C_COMMENT: /\\/\\*([^*]|\\*+[^*\\/])*\\*+\\//\n"
    "SQL_COMMENT: /--[^\\n]*/\n";
#define COMMON_PREFIX "common."

static di_status lerr(const lp *p, size_t at, const char *what) {
  int line, col;
  di_text_line_col(p->s, p->n, at, &line, &col);
  return di_error_set(DI_ERR_FORMAT, "lark grammar: %s at line %d, column %d%s", what, line, col,
                      p->prefix && strcmp(p->prefix, COMMON_PREFIX) == 0 ? " (built-in common library)"
                      : p->prefix ? " (of the nested %lark grammar)" : "");
}

/* "line L, column C" of offset `at` into buf */
static void where(const lp *p, size_t at, char *buf, size_t cap) {
  int line, col;
  di_text_line_col(p->s, p->n, at, &line, &col);
  snprintf(buf, cap, "line %d, column %d", line, col);
}

static di_status push_op(lp *p, int kind, int target, const int *ops, int k, int n, size_t at) {
  char w[48];
  where(p, at, w, sizeof w);
  return di_rule_ops_push(&p->ops, kind, target, ops, k, n, w);
}

/* Skips blanks and // comments; newlines too when `nl` (inside brackets, or before a `|`). */
static void skip(lp *p, int nl) {
  while (p->i < p->n) {
    char c = p->s[p->i];
    if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n'))
      p->i++;
    else if ((c == '/' && p->i + 1 < p->n && p->s[p->i + 1] == '/') || c == '#') /* llguidance: # comments too */
      while (p->i < p->n && p->s[p->i] != '\n')
        p->i++;
    else
      break;
  }
}

/* At a newline: does the definition continue on a following line that starts with `|`? */
static int continues(lp *p) {
  size_t save = p->i;
  skip(p, 1);
  if (p->i < p->n && p->s[p->i] == '|')
    return 1;
  p->i = save;
  return 0;
}

static int name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

/* llguidance allows '-' inside names (`foo-bar`), but not as the start of `->`. */
static int name_char_at(const lp *p, size_t i, size_t k) {
  return name_char(p->s[i]) || (k > 0 && p->s[i] == '-' && !(i + 1 < p->n && p->s[i + 1] == '>'));
}

static size_t read_name(lp *p, char *out, size_t cap) {
  size_t k = 0;
  while (p->i < p->n && name_char_at(p, p->i, k)) {
    if (k + 1 < cap)
      out[k++] = p->s[p->i];
    p->i++;
  }
  out[k] = 0;
  return k;
}

/* Terminals are upper case (after leading underscores). */
static int is_terminal_name(const char *nm) {
  const char *dot = strrchr(nm, '.'); /* past a library's or a nested grammar's prefix */
  if (dot)
    nm = dot + 1;
  while (*nm == '_')
    nm++;
  return *nm >= 'A' && *nm <= 'Z';
}

static int rule_of(lp *p, const char *nm) {
  char full[300];
  snprintf(full, sizeof full, "%s%s", p->prefix ? p->prefix : "", nm);
  return di_gb_rule(p->b, full);
}

/* One character of a "..." literal (Python string escapes: an unknown one keeps its backslash). */
static int32_t lit_char(lp *p, di_status *st) {
  size_t at = p->i;
  int32_t c = -1;
  int digits = 0;
  switch (di_read_literal_char(p->s, p->n, &p->i, NULL, &c, &digits)) {
  case DI_LIT_OK: return c;
  case DI_LIT_BAD_UTF8: *st = lerr(p, at, "invalid UTF-8"); return -1;
  case DI_LIT_UNFINISHED: *st = lerr(p, at, "unterminated string"); return -1;
  case DI_LIT_UNKNOWN: p->i = at + 1; return '\\';
  case DI_LIT_BAD_HEX: *st = lerr(p, at, "bad hex escape in a string"); return -1;
  case DI_LIT_RANGE: *st = lerr(p, at, "escape beyond U+10FFFF"); return -1;
  }
  return -1;
}

static void push_cp(lp *p, di_gseq *s, uint32_t c, int icase) {
  if (icase && (c | 32) >= 'a' && (c | 32) <= 'z') {
    di_gbyteset both = {{0}};
    di_gbyteset_add(&both, c | 32);
    di_gbyteset_add(&both, (c | 32) - 32);
    di_gseq_push(p->b, s, (di_gel){DI_GE_CLASS, di_gb_class(p->b, &both)});
  } else {
    di_gseq_cp(p->b, s, c);
  }
}

/* A "..." literal (flag i: ASCII case-insensitive), or a "a".."z" range; appends what it matches. */
static di_status parse_string(lp *p, di_gseq *s) {
  size_t at = p->i++;
  int32_t cps[256];
  int count = 0;
  di_status st = DI_OK;
  size_t body = p->i;
  while (p->i < p->n && p->s[p->i] != '"') { /* first pass: check and count */
    if (p->s[p->i] == '\n')
      return lerr(p, at, "unterminated string");
    int32_t c = lit_char(p, &st);
    if (c < 0)
      return st;
    if (count < 256)
      cps[count] = c;
    count++;
  }
  if (p->i >= p->n)
    return lerr(p, at, "unterminated string");
  p->i++;
  int icase = p->i < p->n && p->s[p->i] == 'i';
  if (icase)
    p->i++;
  if (p->i + 2 < p->n && p->s[p->i] == '.' && p->s[p->i + 1] == '.' && p->s[p->i + 2] == '"') { /* range */
    if (icase)
      return lerr(p, at, "a range takes no flag");
    p->i += 3;
    int32_t hi = p->i < p->n && p->s[p->i] != '"' ? lit_char(p, &st) : -1;
    if (hi < 0 || count != 1 || p->i >= p->n || p->s[p->i] != '"')
      return st != DI_OK ? st : lerr(p, at, "a range is two one-character strings: \"a\"..\"z\"");
    p->i++;
    if (hi < cps[0])
      return lerr(p, at, "range out of order");
    di_cprange r = {(uint32_t)cps[0], (uint32_t)hi};
    di_gseq_cpset(p->b, s, &r, 1, 0);
    return DI_OK;
  }
  size_t end = p->i;
  p->i = body; /* second pass: emit (strings of any length) */
  while (p->s[p->i] != '"')
    push_cp(p, s, (uint32_t)lit_char(p, &st), icase);
  p->i = end;
  return DI_OK;
}

static di_status parse_regex(lp *p, di_gseq *s) {
  size_t at = p->i++;
  size_t start = p->i;
  while (p->i < p->n && p->s[p->i] != '/') {
    if (p->s[p->i] == '\n')
      return lerr(p, at, "unterminated /regex/");
    if (p->s[p->i] == '\\' && p->i + 1 < p->n)
      p->i++;
    p->i++;
  }
  if (p->i >= p->n)
    return lerr(p, at, "unterminated /regex/");
  size_t end = p->i++;
  int flags = DI_RE_LARK;
  while (p->i < p->n && (p->s[p->i] == 'i' || p->s[p->i] == 's' || p->s[p->i] == 'm' || p->s[p->i] == 'x' ||
                         p->s[p->i] == 'u' || p->s[p->i] == 'l')) {
    char f = p->s[p->i];
    if (f == 'i')
      flags |= DI_RE_ICASE;
    else if (f == 's')
      flags |= DI_RE_DOTALL;
    else if (f != 'u') /* u (Unicode): regexes match code points already */
      return lerr(p, p->i, "unsupported regex flag (only i, s and u)");
    p->i++;
  }
  /* "\/" inside the delimiters stands for "/" */
  char *src = malloc(end - start + 1);
  if (!src)
    return di_error_set(DI_ERR_OOM, "out of memory");
  size_t k = 0;
  for (size_t j = start; j < end; j++) {
    if (p->s[j] == '\\' && j + 1 < end && p->s[j + 1] == '/')
      j++;
    src[k++] = p->s[j];
  }
  int r = di_gb_new_rule(p->b, "lark_re");
  di_status st = di_regex_compile_into_ex(p->b, r, src, k, 0, 1, flags);
  free(src);
  if (st != DI_OK)
    return di_error_wrap(st, "lark grammar: the /regex/ at offset %zu", at);
  di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, r});
  return DI_OK;
}

static di_status parse_alts(lp *p, int rule, int terminal, int nested);

/* `%json { SCHEMA }` (llguidance): a JSON value satisfying the schema, compiled by the JSON Schema
 * front end into this grammar. The schema's extent is found by matching braces outside strings. */
/* The JSON object after %json / %regex (keyword of `kw` bytes at p->i): *start = its '{', p->i
 * past its '}'. */
static di_status scan_json_object(lp *p, size_t kw, const char *what_open, const char *what_unclosed,
                                  size_t *start_out) {
  size_t at = p->i;
  p->i += kw;
  skip(p, 1);
  if (p->i >= p->n || p->s[p->i] != '{')
    return lerr(p, at, what_open);
  size_t start = p->i;
  int depth = 0, in_str = 0;
  for (; p->i < p->n; p->i++) {
    char c = p->s[p->i];
    if (in_str) {
      if (c == '\\')
        p->i++;
      else if (c == '"')
        in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else if (c == '{') {
      depth++;
    } else if (c == '}' && --depth == 0) {
      break;
    }
  }
  if (p->i >= p->n)
    return lerr(p, at, what_unclosed);
  p->i++;
  *start_out = start;
  return DI_OK;
}

/* %regex {...} (llguidance): a substring lexeme (substring.h). */
static di_status parse_regex_item(lp *p, di_gseq *s) {
  size_t at = p->i, start;
  DI_TRY(scan_json_object(p, 6, "expected '{' after %regex", "unclosed %regex object", &start));
  int r = -1;
  di_status st = di_substring_compile(p->b, p->s + start, p->i - start, &r);
  if (st != DI_OK)
    return di_error_wrap(st, "lark grammar: the %%regex at offset %zu", at);
  di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, r});
  return DI_OK;
}

static di_status parse_json_item(lp *p, di_gseq *s) {
  size_t at = p->i, start;
  DI_TRY(scan_json_object(p, 5, "expected '{' after %json", "unclosed %json schema", &start));
  di_grammar_options o = {0};
  if (p->opt)
    o = *p->opt;
  /* Directly in a max_chars=N body with N at most the string bound, every string of the value has
   * fewer than N characters anyway (each JSON character is at least one of the text's, plus the
   * quotes), so the bound changes nothing there; dropping it spares the max_chars product from
   * determinising the bound's 4,097 counts (~100 ms for a plain string at N = 40). */
  if (p->chars_bound >= 0 && o.max_string_length >= 0 &&
      p->chars_bound <= (o.max_string_length ? o.max_string_length : DI_GRAMMAR_DEFAULT_MAX_STRING_LENGTH))
    o.max_string_length = -1;
  int r = -1;
  /* inside a max_chars body the product copies the value's rules, and copies lose the marks of
   * the matcher's string counter (string_bound.h): the bound is written into the grammar there */
  const int off = p->b->sb_off;
  p->b->sb_off = p->chars_bound >= 0;
  di_status st = di_json_schema_compile_into(p->b, p->s + start, p->i - start, &o, &r, NULL, 0);
  p->b->sb_off = off;
  if (st != DI_OK)
    return di_error_wrap(st, "lark grammar: the %%json schema at offset %zu", at);
  if (r < 0) { /* the schema admits nothing */
    di_gbyteset none = {{0}};
    di_gseq_push(p->b, s, (di_gel){DI_GE_CLASS, di_gb_class(p->b, &none)});
  } else {
    di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, r});
  }
  return DI_OK;
}

static int read_int(lp *p, int *v) { return di_parse_decimal_capped(p->s, p->n, &p->i, v); }

/* At '{': does a repetition `{N}`, `{M,}`, `{,N}` or `{M,N}` (llguidance) follow, rather than a
 * template's arguments? */
static int brace_repeat_follows(const lp *p) {
  size_t j = p->i + 1;
  while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t'))
    j++;
  return j < p->n && ((p->s[j] >= '0' && p->s[j] <= '9') || p->s[j] == ',' || p->s[j] == '-');
}

/* `{N}` / `{M,}` / `{,N}` / `{M,N}` into *min, *max (-1: no maximum). */
static di_status parse_brace_repeat(lp *p, int *min, int *max) {
  static const char form[] = "a repetition is {N}, {M,}, {,N} or {M,N} with counts >= 0";
  size_t at = p->i++;
  skip(p, 0);
  *min = 0, *max = -1;
  int has_min = read_int(p, min);
  skip(p, 0);
  if (p->i < p->n && p->s[p->i] == ',') {
    p->i++;
    skip(p, 0);
    if (p->i < p->n && p->s[p->i] != '}' && !read_int(p, max))
      return lerr(p, at, form);
  } else if (has_min) {
    *max = *min;
  } else {
    return lerr(p, at, form);
  }
  skip(p, 0);
  if (p->i >= p->n || p->s[p->i] != '}')
    return lerr(p, at, form);
  p->i++;
  if (*min >= 1000000 || *max >= 1000000)
    return lerr(p, at, "a repetition count is at most 999999");
  if (*max >= 0 && *max < *min)
    return lerr(p, at, "a repetition {M,N} needs M <= N");
  return DI_OK;
}

static di_status parse_item(lp *p, di_gseq *s, int terminal, int nested, int *is_term_item);

/* At `%if` (a parametric alternative's condition)? */
static int at_if(const lp *p) {
  return p->i + 3 <= p->n && memcmp(p->s + p->i, "%if", 3) == 0 && (p->i + 3 == p->n || !name_char(p->s[p->i + 3]));
}

/* `~ATOM` in a terminal: the complement of the atom's language over all byte strings (llguidance:
 * it may match invalid UTF-8; intersect it with /(?s:.*)/ to avoid that). */
static di_status parse_complement(lp *p, di_gseq *s, int terminal, int nested) {
  size_t at = p->i++;
  if (!terminal)
    return lerr(p, at, "'~' (complement) is for terminals (upper-case names), not rules");
  if (++p->depth > 200)
    return lerr(p, at, "nested too deeply");
  skip(p, nested);
  di_gseq t = {0};
  int dummy = 0;
  di_status st = parse_item(p, &t, terminal, nested, &dummy);
  int arg = di_gb_new_rule(p->b, "lark_not_arg"), res = di_gb_new_rule(p->b, "lark_not");
  if (st == DI_OK)
    st = di_gb_add_alt(p->b, arg, t.v, t.n);
  di_gseq_free(&t);
  if (st == DI_OK)
    st = push_op(p, OP_NOT, res, &arg, 1, -1, at);
  p->depth--;
  DI_TRY(st);
  di_gb_mark_defined(p->b, res);
  di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, res});
  return DI_OK;
}

/* `name::EXPR` at "::": a reference to the instance of parametric rule `name` for the parameter
 * EXPR computes (from the current one inside a parametric rule), queued for parsing when new. */
static di_status parse_param_ref(lp *p, di_gseq *s, const char *nm, size_t at) {
  if (is_terminal_name(nm))
    return lerr(p, at, "terminals take no parameter (only rules: name::_)");
  p->i += 2;
  uint64_t v = 0;
  const char *err = NULL;
  if (!di_lark_param_expr(p->s, p->n, &p->i, p->in_param, p->param, &v, &err))
    return lerr(p, p->i, err);
  if (p->dry)
    return DI_OK; /* checking a parametric body's syntax: nothing is built */
  char inst[300];
  snprintf(inst, sizeof inst, "%.255s::%#llx", nm, (unsigned long long)v);
  int r = rule_of(p, inst);
  if (p->b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory");
  if (r >= p->cap_queued) {
    int nc = (r + 1) * 2;
    char *q = realloc(p->queued, (size_t)nc);
    if (!q)
      return di_error_set(DI_ERR_OOM, "out of memory");
    memset(q + p->cap_queued, 0, (size_t)(nc - p->cap_queued));
    p->queued = q, p->cap_queued = nc;
  }
  if (!p->queued[r]) {
    if (p->npq >= LARK_MAX_INSTANCES)
      return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: parametric rules expand to more than %d instances "
                          "(at %s::...)", LARK_MAX_INSTANCES, nm);
    if (!di_grow((void **)&p->pq, &p->cap_pq, p->npq + 1, sizeof *p->pq, 16))
      return di_error_set(DI_ERR_OOM, "out of memory");
    struct lark_pinst *e = &p->pq[p->npq++];
    snprintf(e->name, sizeof e->name, "%s", nm);
    e->v = v, e->rule = r, e->at = at;
    p->queued[r] = 1;
  }
  di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, r});
  return DI_OK;
}

static di_status parse_nested_lark(lp *p, di_gseq *s);

/* One item (a group, string, regex, %json / %regex / %lark, token reference, name or ~item) onto s. */
static di_status parse_item(lp *p, di_gseq *s, int terminal, int nested, int *is_term_item) {
  di_gb *b = p->b;
  *is_term_item = 0;
  if (p->i >= p->n) /* `~` at the very end (parse_seq checks before its items; the complement does not) */
    return lerr(p, p->i, "expected an item at the end of the grammar");
  char c = p->s[p->i];
  size_t at = p->i;
  if (c == '(' || c == '[') {
    p->i++;
    if (++p->depth > 200)
      return lerr(p, at, "nested too deeply");
    int r = di_gb_new_rule(b, "lark_group");
    DI_TRY(parse_alts(p, r, terminal, 1));
    p->depth--;
    skip(p, 1);
    char close = c == '(' ? ')' : ']';
    if (p->i >= p->n || p->s[p->i] != close)
      return lerr(p, at, c == '(' ? "unclosed '('" : "unclosed '['");
    p->i++;
    if (c == '[')
      di_gseq_repeat(b, s, (di_gel){DI_GE_RULE, r}, 0, 1);
    else
      di_gseq_push(b, s, (di_gel){DI_GE_RULE, r});
  } else if (c == '"') {
    DI_TRY(parse_string(p, s));
    *is_term_item = 1;
  } else if (c == '/') {
    DI_TRY(parse_regex(p, s));
    *is_term_item = 1;
  } else if (c == '~') {
    DI_TRY(parse_complement(p, s, terminal, nested));
    *is_term_item = 1;
  } else if (c == '%' && p->i + 5 <= p->n && memcmp(p->s + p->i, "%json", 5) == 0) {
    if (terminal)
      return lerr(p, at, "%json cannot be used in terminals (upper-case names)");
    DI_TRY(parse_json_item(p, s));
    *is_term_item = 1;
  } else if (c == '%' && p->i + 5 <= p->n && memcmp(p->s + p->i, "%lark", 5) == 0 &&
             (p->i + 5 == p->n || !name_char(p->s[p->i + 5]))) {
    if (terminal)
      return lerr(p, at, "%lark cannot be used in terminals (upper-case names)");
    DI_TRY(parse_nested_lark(p, s));
    *is_term_item = 1;
  } else if (c == '%' && p->i + 6 <= p->n && memcmp(p->s + p->i, "%regex", 6) == 0) {
    DI_TRY(parse_regex_item(p, s));
    *is_term_item = 1;
  } else if (c == '<' && p->i + 1 < p->n && p->s[p->i + 1] == '[') {
    int32_t id = 0;
    if (terminal)
      return lerr(p, at, "a token reference cannot be used in a terminal (upper-case name)");
    di_token_range set[64];
    int nset = 0;
    if (di_token_ref_parse(p->s, p->n, &p->i, &id))
      di_token_ref_push(b, s, id, 0);
    else if (di_token_set_parse(p->s, p->n, &p->i, set, 64, &nset)) /* <[A-B,C]>, <[^...]>, <[*]> */
      di_token_set_push(b, s, set, nset);
    else
      return lerr(p, at, "expected a token reference <[id]> or a token set <[A-B,C,...]> / <[^...]> / <[*]> "
                  "(at most 63 ranges)");
    b->has_token_refs = 1;
    *is_term_item = 1;
  } else if (name_char(c) && !(c >= '0' && c <= '9')) {
    char nm[256];
    read_name(p, nm, sizeof nm);
    if (p->i < p->n && p->s[p->i] == '{' && !brace_repeat_follows(p))
      return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: templates (%s{...}) are not supported", nm);
    if (terminal && !is_terminal_name(nm))
      return lerr(p, at, "a terminal cannot refer to a rule (lower-case name; nor can the body of a lazy, stop, suffix or max_tokens rule)");
    *is_term_item = is_terminal_name(nm);
    if (p->i + 1 < p->n && p->s[p->i] == ':' && p->s[p->i + 1] == ':')
      return parse_param_ref(p, s, nm, at);
    di_gseq_push(b, s, (di_gel){DI_GE_RULE, rule_of(p, nm)});
  } else if (c == '@') { /* XGrammar's / llguidance's reference to a grammar given beside this one */
    char nm[64] = "";
    p->i++;
    if (p->i < p->n && name_char(p->s[p->i]))
      read_name(p, nm, sizeof nm);
    int line, col;
    di_text_line_col(p->s, p->n, at, &line, &col);
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "lark grammar: grammar reference '@%s' at line %d, column %d: references to other grammars "
                        "(XGrammar's named_grammars, llguidance's sub-grammars) are not supported",
                        nm, line, col);
  } else {
    return lerr(p, at, "unexpected character");
  }
  return DI_OK;
}

/* At '~' after an item: a repetition `~ N` (a count follows) rather than a complement? */
static int tilde_count_follows(const lp *p) {
  size_t j = p->i + 1;
  while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t'))
    j++;
  return j < p->n && p->s[j] >= '0' && p->s[j] <= '9';
}

/* A sequence of items up to `|`, `&`, `)`, `]`, `->` or the end of the definition. */
static di_status parse_seq(lp *p, di_gseq *s, int terminal, int nested) {
  di_gb *b = p->b;
  for (;;) {
    skip(p, nested);
    if (p->i >= p->n)
      return DI_OK;
    char c = p->s[p->i];
    size_t at = p->i;
    if (c == '|' || c == '&' || c == ')' || c == ']' || c == '\n' ||
        (c == '-' && p->i + 1 < p->n && p->s[p->i + 1] == '>') || (c == '%' && at_if(p)))
      return DI_OK;
    int item = s->n;
    int is_term_item = 0;
    if (!terminal && p->has_ignore)
      di_gseq_push(b, s, (di_gel){DI_GE_RULE, p->ign}); /* removed again below if not a terminal */
    int after_ign = s->n;
    DI_TRY(parse_item(p, s, terminal, nested, &is_term_item));
    if (!terminal && p->has_ignore && !is_term_item) { /* no ignore slot before a group or a rule */
      memmove(s->v + item, s->v + after_ign, sizeof(di_gel) * (size_t)(s->n - after_ign));
      s->n -= after_ign - item;
    }
    if (b->oom)
      return di_error_set(DI_ERR_OOM, "out of memory");
    /* postfix operator */
    skip(p, 0);
    if (p->i >= p->n)
      return DI_OK;
    c = p->s[p->i];
    int min = -2, max = -1;
    if (c == '?')
      min = 0, max = 1, p->i++;
    else if (c == '*')
      min = 0, max = -1, p->i++;
    else if (c == '+')
      min = 1, max = -1, p->i++;
    else if (c == '~' && (!terminal || tilde_count_follows(p))) {
      p->i++;
      skip(p, 0);
      if (!read_int(p, &min))
        return lerr(p, p->i, "'~' needs a count");
      max = min;
      if (p->i + 1 < p->n && p->s[p->i] == '.' && p->s[p->i + 1] == '.') {
        p->i += 2;
        if (!read_int(p, &max) || max < min)
          return lerr(p, p->i, "'~ N..M' needs M >= N");
      }
    }
    else if (c == '{' && brace_repeat_follows(p))
      DI_TRY(parse_brace_repeat(p, &min, &max));
    if (min == -2)
      continue;
    di_gseq_repeat_tail(b, s, item, min, max, "lark_rep");
    if (b->total_els > b->max_els)
      return lerr(p, at, "repetition makes the grammar too large");
  }
}

/* `SEQ & SEQ & ...` in a terminal (s holds the first SEQ, p->i is at the first '&'): s becomes one
 * reference to the intersection, made after parsing. `&` binds tighter than `|`, looser than a
 * sequence (llguidance's precedence). */
static di_status parse_intersection(lp *p, di_gseq *s, int terminal, int nested) {
  size_t at = p->i;
  if (!terminal)
    return lerr(p, at, "'&' (intersection) is for terminals (upper-case names), not rules");
  int ops[DI_RLANG_MAX_OPERANDS], k = 0;
  di_status st = DI_OK;
  for (;;) {
    if (k == DI_RLANG_MAX_OPERANDS)
      return lerr(p, at, "an intersection has at most 16 operands");
    ops[k] = di_gb_new_rule(p->b, "lark_and_arg");
    DI_TRY(di_gb_add_alt(p->b, ops[k], s->v, s->n));
    k++;
    s->n = 0;
    if (p->i >= p->n || p->s[p->i] != '&')
      break;
    p->i++;
    DI_TRY(parse_seq(p, s, terminal, nested));
  }
  int res = di_gb_new_rule(p->b, "lark_and");
  st = push_op(p, OP_AND, res, ops, k, -1, at);
  di_gb_mark_defined(p->b, res);
  di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, res});
  return st;
}

/* alternatives into `rule`, up to the end of the definition (or the closing bracket if nested) */
static di_status parse_alts(lp *p, int rule, int terminal, int nested) {
  for (;;) {
    di_gseq s = {0};
    int queued_before = p->npq;
    di_status st = parse_seq(p, &s, terminal, nested);
    if (st == DI_OK && p->i < p->n && p->s[p->i] == '&')
      st = parse_intersection(p, &s, terminal, nested);
    int keep = 1;
    if (st == DI_OK && at_if(p)) { /* `%if COND`: the alternative only where COND holds */
      const char *err = NULL;
      if (!p->in_param || nested)
        st = lerr(p, p->i, "%if is only for the alternatives of a parametric rule (name::_)");
      else if ((p->i += 3, !di_lark_param_cond(p->s, p->n, &p->i, p->param, &keep, &err)))
        st = lerr(p, p->i, err);
      skip(p, 0);
    }
    if (st == DI_OK && keep)
      st = di_gb_add_alt(p->b, rule, s.v, s.n);
    for (; st == DI_OK && !keep && p->npq > queued_before; p->npq--) { /* a dropped alternative's instances */
      int r = p->pq[p->npq - 1].rule;
      p->queued[r] = 0;
      if (!p->b->rules[r].defined && p->b->rules[r].n_alts == 0)
        di_gb_mark_defined(p->b, r); /* unreferenced now; queued again (and parsed) if another reference comes */
    }
    di_gseq_free(&s);
    DI_TRY(st);
    skip(p, nested);
    if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] == '>') { /* alias: tree shaping only */
      p->i += 2;
      skip(p, 0);
      char nm[256];
      if (!read_name(p, nm, sizeof nm))
        return lerr(p, p->i, "'->' needs a name");
      skip(p, nested);
    }
    if (p->i < p->n && p->s[p->i] == '\n' && !nested)
      (void)continues(p); /* moves to a continuation line starting with '|', if there is one */
    if (p->i < p->n && p->s[p->i] == '|') {
      p->i++;
      continue;
    }
    return DI_OK;
  }
}

static di_status parse_common(lp *p, const char *name, const char *alias);

/* `%llguidance {...}` (llguidance) and `%grammar_options {...}` (XGrammar): options as a flat JSON
 * object of true / false / "string" values. Known here: ignore_once (llguidance; also
 * "skip_repetition": "once" / "many"): a gap takes one %ignore match instead of a run;
 * allow_initial_skip (XGrammar): only true, what this engine does (%ignore before every terminal,
 * the first included); no_forcing (tokenisation only: no change, but XGrammar refuses true);
 * allow_invalid_utf8 only false. Anything else is an error naming it. */
static di_status parse_options(lp *p, const char *kw) {
  size_t at = p->i, open = 0;
  int xg = strcmp(kw, "grammar_options") == 0;
  DI_TRY(scan_json_object(p, strlen(kw) + 1, "expected a JSON object of options", "unclosed options object", &open));
  size_t end = p->i - 1, j = open + 1;
  for (;;) {
    while (j < end && (p->s[j] == ' ' || p->s[j] == '\t' || p->s[j] == '\n' || p->s[j] == '\r'))
      j++;
    if (j >= end)
      break;
    if (p->s[j] != '"')
      return lerr(p, j, "expected an option name in quotes");
    size_t k0 = ++j;
    while (j < end && p->s[j] != '"')
      j++;
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)(j - k0 < 63 ? j - k0 : 63), p->s + k0);
    j++;
    while (j < end && (p->s[j] == ' ' || p->s[j] == '\t'))
      j++;
    if (j >= end || p->s[j] != ':')
      return lerr(p, j, "expected ':' after an option name");
    j++;
    while (j < end && (p->s[j] == ' ' || p->s[j] == '\t'))
      j++;
    size_t v0 = j;
    int b = -1; /* 1 true, 0 false, -1 a string or anything else */
    char str[32] = {0};
    if (end - j >= 4 && memcmp(p->s + j, "true", 4) == 0)
      b = 1, j += 4;
    else if (end - j >= 5 && memcmp(p->s + j, "false", 5) == 0)
      b = 0, j += 5;
    else if (p->s[j] == '"') {
      size_t s0 = ++j;
      while (j < end && p->s[j] != '"')
        j++;
      snprintf(str, sizeof str, "%.*s", (int)(j - s0 < 31 ? j - s0 : 31), p->s + s0);
      j++;
    } else {
      return lerr(p, v0, "an option's value is true, false or a string");
    }
    int is_bool = b >= 0;
    if (strcmp(key, "ignore_once") == 0 && !xg && is_bool)
      p->ignore_once = b;
    else if (strcmp(key, "skip_repetition") == 0 && !xg && (!strcmp(str, "once") || !strcmp(str, "many")))
      p->ignore_once = str[0] == 'o';
    else if (strcmp(key, "allow_initial_skip") == 0 && is_bool)
      p->initial_skip = b;
    else if ((strcmp(key, "no_forcing") == 0 && is_bool && !(xg && b)) ||
             (strcmp(key, "allow_invalid_utf8") == 0 && b == 0))
      ; /* no change to the language */
    else
      return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: %%%s option '%s' with that value is not supported (known: "
                          "ignore_once, skip_repetition \"once\" / \"many\", allow_initial_skip true, no_forcing, "
                          "allow_invalid_utf8 false) at offset %zu", kw, key, at);
    while (j < end && (p->s[j] == ' ' || p->s[j] == '\t' || p->s[j] == '\n' || p->s[j] == '\r'))
      j++;
    if (j < end && p->s[j] == ',')
      j++;
    else if (j < end)
      return lerr(p, j, "expected ',' or '}' in the options");
  }
  return DI_OK;
}

/* %import common.NAME [-> ALIAS] | %import common (A, B, ...) | %ignore EXPANSIONS */
static di_status parse_statement(lp *p) {
  size_t at = p->i;
  char kw[32];
  p->i++;
  read_name(p, kw, sizeof kw);
  skip(p, 0);
  if (strcmp(kw, "ignore") == 0) {
    di_status st = parse_alts(p, p->ign_set, 1, 0);
    return st;
  }
  if (strcmp(kw, "llguidance") == 0 || strcmp(kw, "grammar_options") == 0) {
    p->i = at;
    return parse_options(p, kw);
  }
  if (strcmp(kw, "import") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: %%%s is not supported (only %%import common, %%ignore, "
                        "%%llguidance and %%grammar_options)", kw);
  char mod[64];
  read_name(p, mod, sizeof mod);
  if (strcmp(mod, "common") != 0)
    return lerr(p, at, "only '%import common...' is supported (the grammar cannot read other files)");
  if (p->i < p->n && p->s[p->i] == '.') {
    p->i++;
    char nm[256], alias[256] = {0};
    read_name(p, nm, sizeof nm);
    skip(p, 0);
    if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] == '>') {
      p->i += 2;
      skip(p, 0);
      read_name(p, alias, sizeof alias);
    }
    return parse_common(p, nm, alias[0] ? alias : nm);
  }
  skip(p, 0);
  if (p->i >= p->n || p->s[p->i] != '(')
    return lerr(p, at, "expected '%import common.NAME' or '%import common (A, B)'");
  p->i++;
  for (;;) {
    skip(p, 1);
    char nm[256];
    if (!read_name(p, nm, sizeof nm))
      return lerr(p, p->i, "expected a name in '%import common (...)'");
    DI_TRY(parse_common(p, nm, nm));
    skip(p, 1);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == ')') {
      p->i++;
      return DI_OK;
    }
    return lerr(p, p->i, "expected ',' or ')'");
  }
}

static di_status parse_definitions(lp *p);

/* Makes `alias` (in the user's names) stand for common's NAME, parsing the library once. */
static di_status parse_common(lp *p, const char *name, const char *alias) {
  char full[300];
  snprintf(full, sizeof full, COMMON_PREFIX "%s", name);
  int loaded = 0; /* the library is parsed once, on the first import */
  for (int i = 0; i < p->b->n_rules && !loaded; i++)
    loaded = strcmp(p->b->rules[i].name, COMMON_PREFIX "DIGIT") == 0 && p->b->rules[i].defined;
  if (!loaded) {
    lp q = *p;
    q.s = COMMON;
    q.n = sizeof COMMON - 1;
    q.i = 0;
    q.prefix = COMMON_PREFIX;
    DI_TRY(parse_definitions(&q));
  }
  int lib_rule = di_gb_rule(p->b, full);
  if (!p->b->rules[lib_rule].defined)
    return di_error_set(DI_ERR_FORMAT, "lark grammar: common has no terminal '%s'", name);
  int r = rule_of(p, alias);
  if (p->b->rules[r].defined)
    return di_error_set(DI_ERR_FORMAT, "lark grammar: '%s' is defined twice (by %%import)", alias);
  di_gel e = {DI_GE_RULE, lib_rule};
  return di_gb_add_alt(p->b, r, &e, 1);
}

/* Rule attributes (llguidance / XGrammar): `name[lazy, capture, capture="x", temperature=0.5,
 * stop=X, suffix=X, stop_capture="y", max_chars=N]:`.
 * - lazy: the rule matches its shortest strings (made so after parsing).
 * - suffix=X / stop=X (X a "string", a /regex/ without flags, or a TERMINAL): the body is
 *   followed by X and the whole is lazy, so the rule ends at the first X (both peers' masks). The
 *   text of X stays in the output for both: XGrammar keeps it; llguidance hides a stop's text by
 *   backtracking tokens, which this engine never does (docs/structured-outputs.md). stop="" is
 *   llguidance's "the end-of-sequence token ends the lexeme": the body's language, unchanged.
 * - max_chars=N (XGrammar): at most N UTF-8 characters (the suffix included); the rule must be
 *   regular.
 * - max_tokens=N (llguidance, XGrammar): the lexeme spans at most N accepted tokens, counting
 *   the one it starts in (llguidance's count); the rule must be regular. Done last on the rule (after
 *   lazy / stop / suffix / max_chars) by di_rlang_bound_tokens: N copies of its DFA that the
 *   matcher steps down per token (gram_rt.c di_grt_boundary).
 * - capture, stop_capture, temperature: no change to the language.
 * Others are refused, naming them. */
typedef struct {
  int lazy, max_chars; /* max_chars -1: none */
  int max_tokens;      /* 0: none */
  int marker;          /* 0 none, 1 stop, 2 suffix */
  int marker_empty;    /* stop="" */
  di_gseq mark;        /* the marker's elements */
} rule_attrs;

/* The value of stop= / suffix=: a string, a /regex/ or a terminal name, onto a->mark. */
static di_status parse_marker(lp *p, rule_attrs *a, const char *an) {
  size_t at = p->i;
  char c = p->i < p->n ? p->s[p->i] : 0;
  if (c == '"') {
    DI_TRY(parse_string(p, &a->mark));
    if (a->mark.n == 0 && strcmp(an, "suffix") == 0)
      return lerr(p, at, "suffix must not be empty");
    a->marker_empty = a->mark.n == 0;
  } else if (c == '/') {
    DI_TRY(parse_regex(p, &a->mark));
    for (size_t j = p->i; j > at && p->s[j - 1] != '/'; j--)
      if (p->s[j - 1] == 'i') /* XGrammar's rule: a marker is matched exactly (s is fine) */
        return lerr(p, at, "a stop / suffix regex takes no i flag");
  } else {
    char nm[256];
    if (!read_name(p, nm, sizeof nm) || !is_terminal_name(nm))
      return lerr(p, at, "a stop / suffix value is a \"string\", a /regex/ or a TERMINAL (upper-case name)");
    di_gseq_push(p->b, &a->mark, (di_gel){DI_GE_RULE, rule_of(p, nm)});
  }
  return DI_OK;
}

static di_status parse_attributes(lp *p, rule_attrs *ra) {
  p->i++; /* [ */
  static const char *const known[] = {"lazy",         "capture",   "temperature", "stop",
                                      "suffix",       "stop_capture", "max_chars", "max_tokens"};
  int seen[8] = {0};
  for (;;) {
    skip(p, 1);
    size_t at = p->i;
    char an[64];
    if (!read_name(p, an, sizeof an))
      return lerr(p, at, "expected an attribute name in [...]");
    int which = -1;
    for (int k = 0; k < 8; k++)
      if (strcmp(an, known[k]) == 0)
        which = k;
    if (which < 0)
      return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: rule attribute '%s' is not supported (only lazy, capture, "
                          "temperature, stop, suffix, stop_capture, max_chars, max_tokens) at offset %zu", an, at);
    if (seen[which]++)
      return lerr(p, at, "an attribute given twice");
    skip(p, 1);
    int has_value = p->i < p->n && p->s[p->i] == '=';
    if (which == 0 && has_value)
      return lerr(p, at, "lazy takes no value");
    if ((which >= 3 && which <= 7) && !has_value)
      return lerr(p, at, "this attribute needs a value (name=...)");
    if (has_value) {
      p->i++;
      skip(p, 1);
      if (which == 3 || which == 4) {
        if (ra->marker)
          return lerr(p, at, "a rule takes one of stop and suffix");
        ra->marker = which == 3 ? 1 : 2;
        DI_TRY(parse_marker(p, ra, an));
      } else if (which == 6) {
        if (!read_int(p, &ra->max_chars))
          return lerr(p, p->i, "max_chars is a count >= 0");
      } else if (which == 7) {
        if (!read_int(p, &ra->max_tokens) || ra->max_tokens < 1 || ra->max_tokens > DI_RLANG_MAX_TOKENS)
          return lerr(p, p->i, "max_tokens is a count from 1 to 4096");
      } else if (p->i < p->n && p->s[p->i] == '"') { /* a string: capture, stop_capture names */
        size_t v0 = ++p->i;
        while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\n')
          p->i += p->s[p->i] == '\\' && p->i + 1 < p->n ? 2 : 1;
        if (p->i >= p->n || p->s[p->i] != '"')
          return lerr(p, at, "unterminated string in an attribute");
        int ident = p->i > v0 && !(p->s[v0] >= '0' && p->s[v0] <= '9');
        for (size_t k = v0; k < p->i; k++)
          ident &= name_char(p->s[k]);
        if ((which == 1 || which == 5) && !ident)
          return lerr(p, v0, "a capture name is a non-empty identifier");
        p->i++;
      } else { /* a number or a name */
        size_t v0 = p->i;
        while (p->i < p->n && (name_char(p->s[p->i]) || p->s[p->i] == '.' || p->s[p->i] == '-'))
          p->i++;
        if (p->i == v0)
          return lerr(p, p->i, "expected an attribute value");
        if (which == 5)
          return lerr(p, v0, "stop_capture takes a \"name\"");
      }
    }
    if (which == 0)
      ra->lazy = 1;
    skip(p, 1);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == ']') {
      p->i++;
      if (seen[5] && !ra->marker)
        return lerr(p, at, "stop_capture needs stop or suffix");
      return DI_OK;
    }
    return lerr(p, p->i, "expected ',' or ']' in rule attributes");
  }
}

/* `name::_ : body` at "::": recorded (instances parse the body per parameter value) and its
 * syntax checked once now, building nothing that is kept. */
static di_status parse_param_definition(lp *p, const char *nm, size_t at) {
  p->i += 2;
  if (p->i >= p->n || p->s[p->i] != '_')
    return lerr(p, p->i, "a parametric rule is written name::_");
  p->i++;
  if (is_terminal_name(nm))
    return lerr(p, at, "terminals cannot be parametric (only rules: name::_)");
  if (p->i < p->n && p->s[p->i] == '[')
    return lerr(p, p->i, "attributes are not supported on parametric rules");
  skip(p, 0);
  if (p->i >= p->n || p->s[p->i] != ':')
    return lerr(p, p->i, "expected ':' after the name");
  p->i++;
  for (int k = 0; k < p->npdefs; k++)
    if (strcmp(p->pdefs[k].name, nm) == 0)
      return lerr(p, at, "rule defined twice");
  if (!di_grow((void **)&p->pdefs, &p->cap_pdefs, p->npdefs + 1, sizeof *p->pdefs, 4))
    return di_error_set(DI_ERR_OOM, "out of memory");
  struct lark_pdef *d = &p->pdefs[p->npdefs++];
  snprintf(d->name, sizeof d->name, "%s", nm);
  d->body = p->i;
  p->dry = 1, p->in_param = 1, p->param = 0;
  int check = di_gb_new_rule(p->b, "lark_param_check");
  di_status st = parse_alts(p, check, 0, 0);
  p->dry = 0, p->in_param = 0;
  di_gb_mark_defined(p->b, check); /* unused; every condition may fail for parameter 0 */
  return st;
}

/* Parses every queued instance of a parametric rule (instances queue more) into its rule. */
static di_status instantiate_params(lp *p) {
  for (int q = 0; q < p->npq; q++) {
    struct lark_pinst e = p->pq[q]; /* p->pq may move while the body is parsed */
    int d = -1;
    for (int k = 0; k < p->npdefs && d < 0; k++)
      if (strcmp(p->pdefs[k].name, e.name) == 0)
        d = k;
    if (d < 0)
      return lerr(p, e.at, "a parameter given to a rule that is not parametric (define it as name::_)");
    size_t save = p->i;
    p->i = p->pdefs[d].body;
    p->in_param = 1, p->param = e.v;
    di_status st = parse_alts(p, e.rule, 0, 0);
    p->in_param = 0, p->i = save;
    DI_TRY(st);
    di_gb_mark_defined(p->b, e.rule); /* every alternative's condition may fail: it matches nothing */
  }
  return DI_OK;
}

static di_status parse_definitions(lp *p) {
  while (p->i < p->n) {
    skip(p, 1);
    if (p->i >= p->n)
      break;
    size_t at = p->i;
    char c = p->s[p->i];
    if (c == '%') {
      DI_TRY(parse_statement(p));
    } else {
      while (p->i < p->n && (p->s[p->i] == '?' || p->s[p->i] == '!'))
        p->i++;
      char nm[256];
      if (!read_name(p, nm, sizeof nm))
        return lerr(p, at, "expected a rule or terminal definition (name: ...)");
      if (p->i < p->n && p->s[p->i] == '{')
        return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: templates (%s{...}) are not supported", nm);
      if (p->i + 1 < p->n && p->s[p->i] == ':' && p->s[p->i + 1] == ':') {
        DI_TRY(parse_param_definition(p, nm, at));
        skip(p, 0);
        if (p->i < p->n && p->s[p->i] != '\n')
          return lerr(p, p->i, "unexpected text after the definition");
        continue;
      }
      if (p->i < p->n && p->s[p->i] == '.') { /* priority */
        p->i++;
        if (p->i < p->n && p->s[p->i] == '-')
          p->i++;
        int prio;
        if (!read_int(p, &prio))
          return lerr(p, p->i, "a priority is an integer (name.2: ...)");
      }
      rule_attrs ra = {.max_chars = -1};
      di_status st = DI_OK;
      if (p->i < p->n && p->s[p->i] == '[') {
        if (is_terminal_name(nm))
          return lerr(p, p->i, "attributes are for rules (lower-case names), not terminals");
        st = parse_attributes(p, &ra);
      }
      skip(p, 0);
      if (st == DI_OK && (p->i >= p->n || p->s[p->i] != ':'))
        st = lerr(p, p->i, "expected ':' after the name");
      int r = -1;
      if (st == DI_OK) {
        p->i++;
        r = rule_of(p, nm);
        if (p->b->rules[r].defined)
          st = lerr(p, at, "rule defined twice");
      }
      int marked = st == DI_OK && ra.marker && !ra.marker_empty;
      int lazy = ra.lazy || marked;
      /* a lazy rule is terminal-like: no %ignore inside */
      if (marked) { /* r ::= body marker, lazily */
        int body = di_gb_new_rule(p->b, "lark_marked_body");
        st = parse_alts(p, body, 1, 0);
        di_gseq q = {0};
        di_gseq_push(p->b, &q, (di_gel){DI_GE_RULE, body});
        for (int k = 0; k < ra.mark.n; k++)
          di_gseq_push(p->b, &q, ra.mark.v[k]);
        if (st == DI_OK)
          st = di_gb_add_alt(p->b, r, q.v, q.n);
        di_gseq_free(&q);
      } else if (st == DI_OK) {
        const int outer_chars = p->chars_bound;
        p->chars_bound = ra.max_chars;
        st = parse_alts(p, r, is_terminal_name(nm) || lazy || ra.max_tokens > 0, 0);
        p->chars_bound = outer_chars;
      }
      di_gseq_free(&ra.mark);
      if (st == DI_OK && lazy)
        st = push_op(p, OP_LAZY, r, &r, 1, -1, at);
      if (st == DI_OK && ra.max_chars >= 0)
        st = push_op(p, OP_CHARS, r, &r, 1, ra.max_chars, at);
      if (st == DI_OK && ra.max_tokens > 0) /* last: it bounds the rule's final language */
        st = push_op(p, OP_TOKENS, r, &r, 1, ra.max_tokens, at);
      DI_TRY(st);
    }
    skip(p, 0);
    if (p->i < p->n && p->s[p->i] != '\n')
      return lerr(p, p->i, "unexpected text after the definition");
  }
  return DI_OK;
}

/* A ::= A a1 | ... | b1 | ...  becomes  A ::= b1 T | ... ; T ::= a1 T | ... | "" */
static di_status remove_direct_left_recursion(di_gb *b) {
  int n0 = b->n_rules;
  for (int r = 0; r < n0; r++) {
    di_grule *R = &b->rules[r];
    int lr = 0;
    for (int a = 0; a < R->n_alts; a++)
      lr |= R->alt_off[a + 1] > R->alt_off[a] && R->els[R->alt_off[a]].kind == DI_GE_RULE &&
            R->els[R->alt_off[a]].arg == r;
    if (!lr)
      continue;
    int n_alts = R->n_alts;
    int32_t *off = R->alt_off;
    di_gel *els = R->els;
    R->alt_off = NULL, R->els = NULL, R->n_alts = R->cap_alts = R->n_els = R->cap_els = 0;
    char hint[300];
    snprintf(hint, sizeof hint, "%s_tail", R->name);
    int t = di_gb_new_rule(b, hint); /* may move b->rules: R is stale from here */
    di_status st = di_gb_add_alt(b, t, NULL, 0);
    di_gseq s = {0};
    for (int a = 0; a < n_alts && st == DI_OK; a++) {
      int lo = off[a], hi = off[a + 1];
      int is_lr = hi > lo && els[lo].kind == DI_GE_RULE && els[lo].arg == r;
      if (is_lr && hi - lo == 1)
        continue; /* A ::= A adds nothing */
      s.n = 0;
      for (int k = is_lr ? lo + 1 : lo; k < hi; k++)
        di_gseq_push(b, &s, els[k]);
      di_gseq_push(b, &s, (di_gel){DI_GE_RULE, t});
      st = di_gb_add_alt(b, is_lr ? t : r, s.v, s.n);
    }
    di_gseq_free(&s);
    free(off);
    free(els);
    b->rules[r].defined = 1;
    DI_TRY(st);
  }
  return DI_OK;
}

/* Terminals are regular expressions (llguidance builds each as one regex): a terminal that reaches
 * itself through other terminals is an error naming it. Repetitions are recursive rules of their
 * own, so the walk follows generated (lower-case) rules with a visited stamp and looks for cycles
 * only among the named terminals: strongly connected components (di_rule_scc) of terminal ->
 * terminals it names (directly or through its groups and repetitions). */
static int terminal_refs(const di_gb *b, int t, int *stamp, int *queue, int *out) {
  int qh = 0, qt = 0, n = 0;
  queue[qt++] = t;
  stamp[t] = t + 1;
  while (qh < qt) {
    const di_grule *R = &b->rules[queue[qh++]];
    for (int k = 0; k < R->n_els; k++) {
      int to = R->els[k].arg;
      if (R->els[k].kind != DI_GE_RULE || stamp[to] == t + 1)
        continue;
      stamp[to] = t + 1;
      if (is_terminal_name(b->rules[to].name))
        out[n++] = to;
      else
        queue[qt++] = to;
    }
  }
  return n;
}

static di_status check_terminal_cycles(const di_gb *b) {
  size_t n = (size_t)b->n_rules + 1;
  int *stamp = calloc(n, sizeof(int)), *queue = malloc(sizeof(int) * n), *refs = malloc(sizeof(int) * n);
  int *adj_off = calloc(n + 1, sizeof(int)), *comp = malloc(sizeof(int) * n), *size = calloc(n, sizeof(int));
  int *adj = NULL;
  di_status st = DI_OK;
  if (!stamp || !queue || !refs || !adj_off || !comp || !size) {
    st = di_error_set(DI_ERR_OOM, "out of memory");
    goto done;
  }
  size_t total = 0, cap = 0;
  for (int t = 0; t < b->n_rules && st == DI_OK; t++) { /* adjacency among terminals */
    adj_off[t] = (int)total;
    if (!is_terminal_name(b->rules[t].name))
      continue;
    int k = terminal_refs(b, t, stamp, queue, refs);
    if (k == 0)
      continue;
    if (total + (size_t)k > cap) {
      cap = (total + (size_t)k) * 2 + 16;
      int *q = realloc(adj, sizeof(int) * cap);
      if (!q) {
        st = di_error_set(DI_ERR_OOM, "out of memory");
        break;
      }
      adj = q;
    }
    memcpy(adj + total, refs, sizeof(int) * (size_t)k);
    total += (size_t)k;
  }
  adj_off[b->n_rules] = (int)total;
  if (st == DI_OK) /* terminal_refs never lists t itself, so a cycle is a component of two or more */
    st = di_rule_scc(b->n_rules, adj_off, adj, comp, NULL);
  for (int t = 0; t < b->n_rules && st == DI_OK; t++)
    size[comp[t]]++;
  for (int t = 0; t < b->n_rules && st == DI_OK; t++)
    if (size[comp[t]] > 1)
      st = di_error_set(DI_ERR_FORMAT, "lark grammar: terminal '%s' is recursive (terminals are regular "
                        "expressions; make it a rule, in lower case)", b->rules[t].name);
done:
  free(stamp), free(queue), free(refs), free(adj_off), free(comp), free(size), free(adj);
  return st;
}

static int has_ignore_statement(const char *s, size_t n) {
  for (size_t i = 0; i + 7 <= n; i++)
    if (memcmp(s + i, "%ignore", 7) == 0 && (i == 0 || s[i - 1] == '\n' || s[i - 1] == ' ' || s[i - 1] == '\t'))
      return 1;
  return 0;
}

/* Compiles p's text into p->b: *root matches the whole grammar (start, then the trailing %ignore).
 * A nested grammar (`%lark {...}`, parent set) is compiled with its own names (p->prefix), %ignore
 * and parametric rules; the passes over the whole builder (terminal cycles, left recursion, the
 * regular operations) run once, for the outermost grammar, after everything is parsed: a nested
 * grammar hands its operations to the parent. */
static di_status compile_grammar(lp *p, lp *parent, int *root) {
  di_gb *b = p->b;
  p->has_ignore = has_ignore_statement(p->s, p->n);
  p->ign_set = di_gb_new_rule(b, "lark_ignored");
  p->ign = -1;
  if (p->has_ignore) { /* ign ::= ignored* */
    di_gseq s = {0};
    di_gseq_repeat(b, &s, (di_gel){DI_GE_RULE, p->ign_set}, 0, -1);
    p->ign = di_gb_new_rule(b, "lark_ignore");
    di_gb_add_alt(b, p->ign, s.v, s.n);
    di_gseq_free(&s);
  } else {
    di_gb_mark_defined(b, p->ign_set);
  }
  p->initial_skip = -1;
  di_status pst = parse_definitions(p);
  di_gb_mark_defined(b, p->ign_set); /* the %ignore seen was a nested grammar's: nothing ignored here */
  if (pst == DI_OK && p->initial_skip == 0)
    pst = di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: allow_initial_skip false is not supported (%%ignore applies "
                       "before every terminal, the first included)");
  if (pst == DI_OK && p->has_ignore && p->ignore_once) { /* ign ::= ignored | "" */
    di_grule *R = &b->rules[p->ign];
    b->total_els -= R->n_els + R->n_alts;
    R->n_alts = R->n_els = 0;
    di_gel e = {DI_GE_RULE, p->ign_set};
    pst = di_gb_add_alt(b, p->ign, &e, 1);
    if (pst == DI_OK)
      pst = di_gb_add_alt(b, p->ign, NULL, 0);
  }
  if (pst == DI_OK)
    pst = instantiate_params(p);
  free(p->pdefs), free(p->pq), free(p->queued);
  p->pdefs = NULL, p->pq = NULL, p->queued = NULL;
  int start = -1;
  if (pst == DI_OK) {
    start = rule_of(p, "start");
    if (b->oom)
      pst = di_error_set(DI_ERR_OOM, "out of memory");
    else if (!b->rules[start].defined)
      pst = di_error_set(DI_ERR_FORMAT, "lark grammar: no 'start' rule");
  }
  if (parent) {
    for (int i = 0; i < p->ops.n && pst == DI_OK; i++) /* positions are the %lark's, in the parent */
      pst = push_op(parent, p->ops.v[i].kind, p->ops.v[i].target, p->ops.v[i].ops, p->ops.v[i].k, p->ops.v[i].n,
                    parent->i);
  } else {
    if (pst == DI_OK)
      pst = check_terminal_cycles(b);
    if (pst == DI_OK)
      pst = remove_direct_left_recursion(b);
    if (pst == DI_OK)
      pst = di_rule_ops_run(b, &p->ops, "lark grammar");
  }
  di_rule_ops_free(&p->ops);
  DI_TRY(pst);
  *root = di_gb_new_rule(b, "lark_root");
  di_gel els[2] = {{DI_GE_RULE, start}, {DI_GE_RULE, p->ign}};
  DI_TRY(di_gb_add_alt(b, *root, els, p->has_ignore ? 2 : 1));
  return b->oom ? di_error_set(DI_ERR_OOM, "out of memory") : DI_OK;
}

/* `%lark { GRAMMAR }` (llguidance, XGrammar): a grammar of its own (its names, its %ignore, its
 * start) used as one item; its extent is found by matching braces outside "..." strings. */
static di_status parse_nested_lark(lp *p, di_gseq *s) {
  size_t at = p->i, open = 0;
  DI_TRY(scan_json_object(p, 5, "expected '{' after %lark", "unclosed %lark grammar", &open));
  if (p->depth > 20)
    return lerr(p, at, "%lark grammars nested too deeply");
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%slark%d.", p->prefix ? p->prefix : "", p->b->n_rules);
  lp q = {.b = p->b, .s = p->s + open + 1, .n = p->i - open - 2, .opt = p->opt, .prefix = prefix,
          .depth = p->depth + 1};
  int root = -1;
  size_t save = p->i;
  p->i = at;
  di_status st = compile_grammar(&q, p, &root);
  p->i = save;
  if (st != DI_OK)
    return di_error_wrap(st, "lark grammar: the %%lark grammar at offset %zu", at);
  di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, root});
  return DI_OK;
}

di_status di_lark_compile(di_gb *b, const char *src, size_t len, const struct di_grammar_options *opt) {
  lp p = {.b = b, .s = src, .n = len, .opt = opt, .chars_bound = -1};
  int root = -1;
  DI_TRY(compile_grammar(&p, NULL, &root));
  return di_gb_finish(b, root);
}
