/* Regex front-end, ECMA-262 syntax with the u flag (what JSON Schema's `pattern` specifies, and
 * what `--regex` / the regex option take): literals, classes with ranges/negation, \d \w \s (and
 * negations), \xHH \uHHHH \u{H..} \cX escapes, `.`, `* + ? {m} {m,} {m,n}` (lazy forms too),
 * alternation, (capturing / (?:non-capturing) / (?<named>)) groups. As the u flag demands, a lone
 * `{` `}` `]`, an identity escape of anything but a syntax character (`\a`, `\e`, `\-` outside a
 * class), a quantifier on a quantifier (`a++`) and `\0` before a digit are errors. Matching is over
 * code points emitted as UTF-8. Whole-output match for `--regex`; JSON Schema `pattern` uses
 * search semantics (unanchored unless ^ / $) and JSON-string escaping. Lark's /regex/ (DI_RE_LARK,
 * Rust's regex crate as llguidance has it) also takes scoped flags `(?s:...)` / `(?i:...)` /
 * `(?-s:...)`. Errors say "offset N". */
#include "util/text.h"
#include "grammar/gram_ir.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
  di_gb *b;
  const char *s;
  size_t n, i;
  int json, depth;
  int flags; /* DI_RE_* */
} rp;

typedef struct {
  di_cprange *v;
  int n, cap;
} cset;

static di_status rerr(const rp *p, size_t at, const char *what) {
  return di_error_set(DI_ERR_FORMAT, "regex: %s at offset %zu", what, at);
}

/* Valid regex syntax that this engine does not implement. */
static di_status runsup(const rp *p, size_t at, const char *what) {
  return di_error_set(DI_ERR_UNSUPPORTED, "regex: %s at offset %zu", what, at);
}

static int cs_add(cset *c, uint32_t lo, uint32_t hi) {
  if (c->n == c->cap) {
    int nc = c->cap ? c->cap * 2 : 8;
    di_cprange *q = realloc(c->v, sizeof *q * (size_t)nc);
    if (!q)
      return 0;
    c->v = q;
    c->cap = nc;
  }
  c->v[c->n++] = (di_cprange){lo, hi};
  return 1;
}

static const di_cprange R_DIGIT[] = {{'0', '9'}};
static const di_cprange R_WORD[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
static const di_cprange R_SPACE[] = {{9, 13},         {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
                                     {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                     {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

/* Adds a predefined set or its complement. */
static int cs_add_set(cset *c, const di_cprange *r, int n, int negate) {
  if (!negate) {
    for (int i = 0; i < n; i++)
      if (!cs_add(c, r[i].lo, r[i].hi))
        return 0;
    return 1;
  }
  uint32_t next = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].lo > next && !cs_add(c, next, r[i].lo - 1))
      return 0;
    next = r[i].hi + 1;
  }
  return cs_add(c, next, 0x10FFFF);
}



/* Parses an escape after '\' (p->i at the letter). Either returns a code point (>= 0) or, for a
 * class escape, fills `set` and returns -2; -1 on error (*st set). */
static int32_t parse_escape(rp *p, cset *set, int in_class, di_status *st) {
  size_t at = p->i - 1;
  if (p->i >= p->n) {
    *st = rerr(p, at, "trailing backslash");
    return -1;
  }
  char e = p->s[p->i++];
  int ok = 1;
  switch (e) {
  case 'd': ok = cs_add_set(set, R_DIGIT, 1, 0); break;
  case 'D': ok = cs_add_set(set, R_DIGIT, 1, 1); break;
  case 'w': ok = cs_add_set(set, R_WORD, 4, 0); break;
  case 'W': ok = cs_add_set(set, R_WORD, 4, 1); break;
  case 's': ok = cs_add_set(set, R_SPACE, 10, 0); break;
  case 'S': ok = cs_add_set(set, R_SPACE, 10, 1); break;
  case 'n': return '\n';
  case 't': return '\t';
  case 'r': return '\r';
  case 'f': return '\f';
  case 'v': return '\v';
  case '0':
    if (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
      *st = rerr(p, at, "\\0 followed by a digit (octal escapes are not allowed with the u flag)");
      return -1;
    }
    return 0;
  case 'c': {
    char l = p->i < p->n ? p->s[p->i] : 0;
    if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) {
      *st = rerr(p, at, "\\c needs an ASCII letter");
      return -1;
    }
    p->i++;
    return l % 32;
  }
  case 'b':
    if (in_class)
      return '\b';
    *st = runsup(p, at, "word boundary \\b is not supported");
    return -1;
  case 'B':
    *st = runsup(p, at, "\\B is not supported");
    return -1;
  case 'x': {
    int h1 = p->i < p->n ? di_hexval(p->s[p->i]) : -1, h2 = p->i + 1 < p->n ? di_hexval(p->s[p->i + 1]) : -1;
    if (h1 < 0 || h2 < 0) {
      *st = rerr(p, at, "\\x needs two hex digits");
      return -1;
    }
    p->i += 2;
    return h1 * 16 + h2;
  }
  case 'u': {
    uint32_t v = 0;
    if (p->i < p->n && p->s[p->i] == '{') {
      p->i++;
      int nd = 0;
      while (p->i < p->n && di_hexval(p->s[p->i]) >= 0 && nd < 8)
        v = v * 16 + (uint32_t)di_hexval(p->s[p->i++]), nd++;
      if (!nd || p->i >= p->n || p->s[p->i] != '}' || v > 0x10FFFF) {
        *st = rerr(p, at, "bad \\u{...} escape");
        return -1;
      }
      p->i++;
      return (int32_t)v;
    }
    for (int k = 0; k < 4; k++) {
      int h = p->i < p->n ? di_hexval(p->s[p->i]) : -1;
      if (h < 0) {
        *st = rerr(p, at, "\\u needs four hex digits");
        return -1;
      }
      v = v * 16 + (uint32_t)h;
      p->i++;
    }
    return (int32_t)v;
  }
  case 'p': case 'P':
    *st = runsup(p, at, "Unicode property escapes are not supported");
    return -1;
  case 'k':
    *st = runsup(p, at, "named backreferences are not supported");
    return -1;
  default:
    if (e >= '1' && e <= '9') {
      *st = runsup(p, at, "backreferences are not supported");
      return -1;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
      *st = rerr(p, at, "unknown escape");
      return -1;
    }
    /* identity escapes: with the u flag only syntax characters and '/' (and '-' in a class); the
     * Lark dialect (Rust's regex crate) escapes any ASCII punctuation */
    int lenient_ok = (p->flags & DI_RE_LARK) && e > ' ' && e < 0x7f;
    if (!strchr("^$\\.*+?()[]{}|/", e) && !(in_class && e == '-') && !lenient_ok) {
      *st = rerr(p, at, "invalid escape (with the u flag only ^$\\.*+?()[]{}|/ may be escaped)");
      return -1;
    }
    return (unsigned char)e;
  }
  if (!ok) {
    *st = di_error_set(DI_ERR_OOM, "out of memory");
    return -1;
  }
  return -2;
}

/* Every JSON spelling of the characters of `esc` (a bitmap over 0..0x7F of characters a JSON
 * string must escape: `"`, `\`, the controls), as alternatives of `rule`: the short escapes JSON
 * has (\b \f \n \r \t \" \\, one alternative `\[...]`) and \u with its four hex digits in
 * either case (\u0009, \u000A, \u000a), one alternative per third hex digit with a class of the
 * last, so a negated class costs a handful of alternatives, not one per character. Generation
 * writes the first spelling (Python's json.dumps). Other characters take their plain spelling
 * only (plus `\/` for `/`). */
static void json_escape_alts(di_gb *b, int rule, const uint8_t esc[128]) {
  static const char shorts[] = "\"\"\\\\\bb\ff\nn\rr\tt";
  di_gbyteset letters = {{0}}, backslash = {{0}}, u = {{0}}, zero = {{0}};
  int any_short = 0;
  for (int i = 0; shorts[i]; i += 2)
    if (esc[(unsigned char)shorts[i]])
      di_gbyteset_add(&letters, (unsigned char)shorts[i + 1]), any_short = 1;
  di_gbyteset_add(&backslash, '\\');
  di_gbyteset_add(&u, 'u');
  di_gbyteset_add(&zero, '0');
  if (any_short)
    di_gb_add_alt(b, rule, (di_gel[]){{DI_GE_CLASS, di_gb_class(b, &backslash)}, {DI_GE_CLASS, di_gb_class(b, &letters)}},
                  2);
  for (unsigned hi = 0; hi < 8; hi++) {
    di_gbyteset third = {{0}}, last = {{0}};
    int any = 0;
    for (unsigned lo = 0; lo < 16; lo++)
      if (esc[hi * 16 + lo]) {
        di_gbyteset_add(&last, lo < 10 ? '0' + lo : 'a' + lo - 10);
        di_gbyteset_add(&last, lo < 10 ? '0' + lo : 'A' + lo - 10);
        any = 1;
      }
    if (!any)
      continue;
    di_gbyteset_add(&third, '0' + hi);
    int z = di_gb_class(b, &zero);
    di_gb_add_alt(b, rule,
                  (di_gel[]){{DI_GE_CLASS, di_gb_class(b, &backslash)}, {DI_GE_CLASS, di_gb_class(b, &u)},
                             {DI_GE_CLASS, z}, {DI_GE_CLASS, z}, {DI_GE_CLASS, di_gb_class(b, &third)},
                             {DI_GE_CLASS, di_gb_class(b, &last)}},
                  6);
  }
}

static void json_escape_cp(di_gb *b, di_gseq *s, uint32_t c) {
  uint8_t esc[128] = {0};
  esc[c] = 1;
  int rule = di_gb_new_rule(b, "jesc");
  json_escape_alts(b, rule, esc);
  di_gseq_push(b, s, (di_gel){DI_GE_RULE, rule});
}

static int byte_class(di_gb *b, unsigned c) {
  di_gbyteset one = {{0}};
  di_gbyteset_add(&one, c);
  return di_gb_class(b, &one);
}

static int json_special(uint32_t c) { return c < 0x20 || c == '"' || c == '\\'; }

/* Emits one code point of `set` (optionally negated). */
static void emit_set(rp *p, di_gseq *s, cset *set, int negate) {
  di_gb *b = p->b;
  if (!p->json) {
    di_gseq_cpset(b, s, set->v, set->n, negate);
    return;
  }
  /* JSON string mode: the set minus the specials as plain code points, plus each special in it
   * as its escape sequence */
  int n = di_cpset_normalize(set->v, set->n);
  set->n = n;
  if (negate) {
    cset c = {0};
    cs_add_set(&c, set->v, n, 1);
    free(set->v);
    *set = c;
    n = set->n;
  }
  int rule = di_gb_new_rule(b, "jchar");
  cset plain = {0};
  uint8_t esc[128] = {0};
  int any_esc = 0;
  for (int i = 0; i < n; i++) {
    uint32_t lo = set->v[i].lo, hi = set->v[i].hi;
    for (uint32_t c = lo; c <= hi && c < 0x80; c++) {
      if (json_special(c)) {
        esc[c] = 1, any_esc = 1;
      } else {
        cs_add(&plain, c, c);
        if (c == '/')
          di_gb_add_alt(b, rule, (di_gel[]){{DI_GE_CLASS, byte_class(b, '\\')}, {DI_GE_CLASS, byte_class(b, '/')}}, 2);
      }
    }
    if (hi >= 0x80)
      cs_add(&plain, lo < 0x80 ? 0x80 : lo, hi);
  }
  if (any_esc)
    json_escape_alts(b, rule, esc);
  if (plain.n) {
    di_gseq e = {0};
    di_gseq_cpset(b, &e, plain.v, plain.n, 0);
    di_gb_add_alt(b, rule, e.v, e.n);
    di_gseq_free(&e);
  }
  free(plain.v);
  di_gseq_push(b, s, (di_gel){DI_GE_RULE, rule});
}

static void emit_cp(rp *p, di_gseq *s, uint32_t c) {
  if ((p->flags & DI_RE_ICASE) && ((c | 32) >= 'a' && (c | 32) <= 'z')) {
    di_gbyteset both = {{0}};
    di_gbyteset_add(&both, c | 32);
    di_gbyteset_add(&both, (c | 32) - 32);
    di_gseq_push(p->b, s, (di_gel){DI_GE_CLASS, di_gb_class(p->b, &both)});
    return;
  }
  if (p->json && json_special(c)) {
    json_escape_cp(p->b, s, c);
    return;
  }
  if (p->json && c == '/') { /* `/` or `\/` */
    int rule = di_gb_new_rule(p->b, "jesc");
    di_gb_add_alt(p->b, rule, (di_gel[]){{DI_GE_CLASS, byte_class(p->b, '/')}}, 1);
    di_gb_add_alt(p->b, rule, (di_gel[]){{DI_GE_CLASS, byte_class(p->b, '\\')}, {DI_GE_CLASS, byte_class(p->b, '/')}}, 2);
    di_gseq_push(p->b, s, (di_gel){DI_GE_RULE, rule});
    return;
  }
  di_gseq_cp(p->b, s, c);
}

static di_status parse_alt(rp *p, int rule, int top, int *anch_start, int *anch_end);

static di_status parse_class(rp *p, di_gseq *s) {
  size_t at = p->i - 1;
  cset set = {0};
  int neg = 0;
  di_status st = DI_OK;
  if (p->i < p->n && p->s[p->i] == '^')
    neg = 1, p->i++;
  int first = 1;
  while (p->i < p->n && (p->s[p->i] != ']' || (first && 0))) {
    first = 0;
    int32_t lo;
    if (p->s[p->i] == '\\') {
      p->i++;
      lo = parse_escape(p, &set, 1, &st);
      if (lo == -1)
        goto fail;
      if (lo == -2)
        continue;
    } else {
      lo = di_utf8_decode(p->s, p->n, &p->i);
      if (lo < 0) {
        st = rerr(p, p->i, "invalid UTF-8");
        goto fail;
      }
    }
    int32_t hi = lo;
    if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
      size_t dash = p->i;
      p->i++;
      if (p->s[p->i] == '\\') {
        p->i++;
        cset tmp = {0};
        hi = parse_escape(p, &tmp, 1, &st);
        free(tmp.v);
        if (hi == -1)
          goto fail;
        if (hi == -2) {
          st = rerr(p, dash, "a class escape cannot end a range");
          goto fail;
        }
      } else {
        hi = di_utf8_decode(p->s, p->n, &p->i);
        if (hi < 0) {
          st = rerr(p, p->i, "invalid UTF-8");
          goto fail;
        }
      }
      if (hi < lo) {
        st = rerr(p, dash, "range out of order in character class");
        goto fail;
      }
    }
    if (!cs_add(&set, (uint32_t)lo, (uint32_t)hi)) {
      st = di_error_set(DI_ERR_OOM, "out of memory");
      goto fail;
    }
  }
  if (p->i >= p->n) {
    st = rerr(p, at, "unterminated character class");
    goto fail;
  }
  p->i++;
  if (p->flags & DI_RE_ICASE) { /* ASCII case folding: add the other case of every letter range */
    int n0 = set.n;
    for (int k = 0; k < n0; k++)
      for (uint32_t ch = set.v[k].lo; ch <= set.v[k].hi && ch < 0x80; ch++)
        if ((ch | 32) >= 'a' && (ch | 32) <= 'z' && !cs_add(&set, ch ^ 32, ch ^ 32)) {
          st = di_error_set(DI_ERR_OOM, "out of memory");
          goto fail;
        }
  }
  emit_set(p, s, &set, neg);
fail:
  free(set.v);
  return st;
}

static int parse_num(rp *p, int *v) { return di_parse_decimal_capped(p->s, p->n, &p->i, v); }

/* Tries to read a {m}, {m,}, {m,n} quantifier at '{'; 0 (position restored) when it is not one. */
static int parse_brace(rp *p, int *min, int *max) {
  size_t save = p->i;
  p->i++;
  if (!parse_num(p, min)) {
    p->i = save;
    return 0;
  }
  *max = *min;
  if (p->i < p->n && p->s[p->i] == ',') {
    p->i++;
    *max = -1;
    parse_num(p, max);
  }
  if (p->i >= p->n || p->s[p->i] != '}') {
    p->i = save;
    return 0;
  }
  p->i++;
  return 1;
}

static di_status parse_seq(rp *p, di_gseq *s, int top, int *anch_end) {
  di_gb *b = p->b;
  int item = -1;
  di_status st = DI_OK;
  while (p->i < p->n) {
    char c = p->s[p->i];
    size_t at = p->i;
    if (c == '|' || c == ')')
      break;
    if (c == '$') {
      p->i++;
      if (top && (p->i >= p->n || p->s[p->i] == '|')) {
        *anch_end = 1;
        break;
      }
      return runsup(p, at, "'$' is only supported at the end of the pattern");
    }
    if (c == '^')
      return runsup(p, at, "'^' is only supported at the start of the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      int min = 0, max = -1;
      if (c == '{') {
        if (!parse_brace(p, &min, &max)) {
          if (!(p->flags & DI_RE_LARK))
            return rerr(p, at, "lone '{' (with the u flag a literal brace must be escaped: \\{)");
          p->i++;
          item = s->n;
          emit_cp(p, s, '{');
          continue;
        }
        if (max >= 0 && max < min)
          return rerr(p, at, "numbers out of order in {} quantifier");
      } else {
        p->i++;
        if (c == '+')
          min = 1;
        else if (c == '?')
          max = 1;
      }
      if (item < 0)
        return rerr(p, at, "nothing to repeat");
      if (p->i < p->n && p->s[p->i] == '?')
        p->i++; /* lazy: same language */
      di_gseq_repeat_tail(b, s, item, min, max, "re");
      if (b->total_els > b->max_els)
        return rerr(p, at, "repetition makes the grammar too large");
      item = -1;
      continue;
    }
    if ((c == '}' || c == ']') && !(p->flags & DI_RE_LARK))
      return rerr(p, at, c == '}' ? "lone '}' (with the u flag it must be escaped)"
                                  : "lone ']' (with the u flag it must be escaped)");
    item = s->n;
    if (c == '(') {
      p->i++;
      int scoped = 0, group_flags = p->flags;
      if (p->i + 1 < p->n && p->s[p->i] == '?') {
        char k = p->s[p->i + 1];
        if (k == ':') {
          p->i += 2;
        } else if (k == '<' && p->i + 2 < p->n && p->s[p->i + 2] != '=' && p->s[p->i + 2] != '!') {
          while (p->i < p->n && p->s[p->i] != '>')
            p->i++;
          if (p->i >= p->n)
            return rerr(p, at, "unterminated group name");
          p->i++;
        } else if ((p->flags & DI_RE_LARK) && (k == 'i' || k == 's' || k == '-')) {
          /* Rust's scoped flags (Lark): (?s:...), (?i:...), (?-s:...), (?is-i:...) */
          int on = 1;
          size_t j = p->i + 1;
          for (; j < p->n && p->s[j] != ':' && p->s[j] != ')'; j++) {
            char f = p->s[j];
            int bit = f == 'i' ? DI_RE_ICASE : f == 's' ? DI_RE_DOTALL : 0;
            if (f == '-' && on)
              on = 0;
            else if (!bit)
              return runsup(p, at, "inline flags other than i and s are not supported");
            else
              group_flags = on ? (group_flags | bit) : (group_flags & ~bit);
          }
          if (j >= p->n || p->s[j] != ':')
            return runsup(p, at, "inline flags are supported as a scoped group (?flags:...) only");
          p->i = j + 1;
          scoped = 1;
        } else {
          return runsup(p, at, "lookaround and inline flags are not supported");
        }
      }
      if (++p->depth > 200)
        return rerr(p, at, "groups nested too deeply");
      int r = di_gb_new_rule(b, "regroup");
      int saved_flags = p->flags;
      if (scoped)
        p->flags = group_flags;
      di_status gst = parse_alt(p, r, 0, NULL, NULL);
      p->flags = saved_flags;
      DI_TRY(gst);
      p->depth--;
      if (p->i >= p->n || p->s[p->i] != ')')
        return rerr(p, at, "unclosed '('");
      p->i++;
      di_gseq_push(b, s, (di_gel){DI_GE_RULE, r});
    } else if (c == '[') {
      p->i++;
      DI_TRY(parse_class(p, s));
    } else if (c == '.') {
      p->i++;
      cset set = {0};
      static const di_cprange nl[] = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};
      if (p->flags & DI_RE_DOTALL) /* the s flag: any character */
        cs_add(&set, 0, 0x10FFFF);
      else /* ECMAScript: all but line terminators; Rust's regex crate (Lark): all but \n */
        cs_add_set(&set, nl, (p->flags & DI_RE_LARK) ? 1 : 3, 1);
      emit_set(p, s, &set, 0);
      free(set.v);
    } else if (c == '\\') {
      p->i++;
      cset set = {0};
      int32_t cp = parse_escape(p, &set, 0, &st);
      if (cp == -1) {
        free(set.v);
        return st;
      }
      if (cp == -2)
        emit_set(p, s, &set, 0);
      else
        emit_cp(p, s, (uint32_t)cp);
      free(set.v);
    } else {
      int32_t cp = di_utf8_decode(p->s, p->n, &p->i);
      if (cp < 0)
        return rerr(p, at, "invalid UTF-8");
      emit_cp(p, s, (uint32_t)cp);
    }
    if (b->oom)
      return di_error_set(DI_ERR_OOM, "out of memory");
  }
  return DI_OK;
}

static void any_star(rp *p, di_gseq *s) {
  cset set = {0};
  cs_add(&set, 0, 0x10FFFF);
  di_gseq one = {0};
  emit_set(p, &one, &set, 0);
  free(set.v);
  di_gel x = di_gb_wrap(p->b, &one, "any");
  di_gseq_free(&one);
  di_gseq_repeat(p->b, s, x, 0, -1);
}

/* Alternatives into `rule`. At top level with search semantics (anch_start != NULL and
 * *anch_start == -1 meaning "unanchored mode"), each alternative gets its own anchors. */
static di_status parse_alt(rp *p, int rule, int top, int *anch_start, int *anch_end) {
  for (;;) {
    di_gseq s = {0};
    int a_start = 0, a_end = 0;
    if (top && p->i < p->n && p->s[p->i] == '^')
      p->i++, a_start = 1;
    int search = top && anch_start && *anch_start < 0;
    if (search && !a_start)
      any_star(p, &s);
    di_status st = parse_seq(p, &s, top, &a_end);
    if (st == DI_OK && search && !a_end)
      any_star(p, &s);
    if (st == DI_OK)
      st = di_gb_add_alt(p->b, rule, s.v, s.n);
    di_gseq_free(&s);
    DI_TRY(st);
    if (p->i < p->n && p->s[p->i] == '|') {
      p->i++;
      continue;
    }
    return DI_OK;
  }
}

di_status di_regex_compile_into(di_gb *b, int rule, const char *src, size_t len, int json_string, int anchored) {
  return di_regex_compile_into_ex(b, rule, src, len, json_string, anchored, 0);
}

di_status di_regex_compile_into_ex(di_gb *b, int rule, const char *src, size_t len, int json_string, int anchored,
                                   int flags) {
  rp p = {.b = b, .s = src, .n = len, .json = json_string, .flags = flags};
  int mode = anchored ? 0 : -1;
  DI_TRY(parse_alt(&p, rule, 1, &mode, NULL));
  if (p.i < p.n)
    return rerr(&p, p.i, p.s[p.i] == ')' ? "unmatched ')'" : "unexpected character");
  if (b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory");
  return DI_OK;
}

di_status di_regex_compile(di_gb *b, const char *src, size_t len) {
  int root = di_gb_rule(b, "root");
  if (b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  DI_TRY(di_regex_compile_into(b, root, src, len, 0, 1));
  return di_gb_finish(b, root);
}
