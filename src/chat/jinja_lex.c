/* Lexer of the Jinja subset: splits a template into text and the tokens inside {{ }}, {% %} and
 * {# #}, with Jinja2's whitespace rules as transformers sets them (trim_blocks, lstrip_blocks,
 * `-`/`+` modifiers, newline normalization, one trailing newline dropped) and its string escapes
 * (Python's unicode-escape). Raw blocks become text. */
#include "util/text.h"
#include "chat/jinja.h"
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
  jj_arena *a;
  const char *s; /* normalized source */
  size_t n, pos;
  int line;
  size_t line_start;
  jj_tok *toks;
  size_t ntoks, cap;
} lexer;

static di_status lex_err(lexer *L, size_t at, const char *what) {
  int line = 1;
  size_t ls = 0;
  for (size_t i = 0; i < at && i < L->n; i++)
    if (L->s[i] == '\n') { line++; ls = i + 1; }
  return di_error_set(DI_ERR_FORMAT, "chat template line %d column %d: %s", line, (int)(at - ls) + 1, what);
}

static void pos_of(lexer *L, size_t at, int *line, int *col) {
  *line = L->line;
  *col = (int)(at - L->line_start) + 1;
}

/* Keeps L->line/line_start in step with the position `to`. */
static void advance_lines(lexer *L, size_t from, size_t to) {
  for (size_t i = from; i < to && i < L->n; i++)
    if (L->s[i] == '\n') { L->line++; L->line_start = i + 1; }
}

static jj_tok *push(lexer *L, int type, size_t at) {
  if (L->ntoks == L->cap) {
    size_t cap = L->cap ? L->cap * 2 : 64;
    jj_tok *nt = jj_alloc(L->a, cap * sizeof *nt);
    if (!nt) return NULL;
    if (L->ntoks) memcpy(nt, L->toks, L->ntoks * sizeof *nt);
    L->toks = nt;
    L->cap = cap;
  }
  jj_tok *t = &L->toks[L->ntoks++];
  memset(t, 0, sizeof *t);
  t->type = (uint8_t)type;
  pos_of(L, at, &t->line, &t->col);
  return t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name(char c) { return is_name0(c) || is_digit(c); }


/* Decodes a string literal's body as Jinja does: encode("ascii", "backslashreplace") then
 * decode("unicode-escape"). So a backslash before a non-ASCII character yields the text of
 * that character's \x/\u/\U escape. */
static di_status decode_string(lexer *L, size_t at, const char *p, size_t n, jj_tok *t) {
  jj_buf b = {0};
  size_t i = 0;
  while (i < n) {
    if (p[i] != '\\') {
      jj_buf_putc(&b, p[i++]);
      continue;
    }
    if (i + 1 >= n) { jj_buf_free(&b); return lex_err(L, at, "string literal ends with a lone backslash"); }
    char c = p[i + 1];
    i += 2;
    switch (c) {
    case '\\': jj_buf_putc(&b, '\\'); break;
    case '\'': jj_buf_putc(&b, '\''); break;
    case '"': jj_buf_putc(&b, '"'); break;
    case 'a': jj_buf_putc(&b, 7); break;
    case 'b': jj_buf_putc(&b, 8); break;
    case 'f': jj_buf_putc(&b, 12); break;
    case 'n': jj_buf_putc(&b, '\n'); break;
    case 'r': jj_buf_putc(&b, '\r'); break;
    case 't': jj_buf_putc(&b, '\t'); break;
    case 'v': jj_buf_putc(&b, 11); break;
    case '\n': break; /* line continuation */
    case 'x': case 'u': case 'U': {
      int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
      uint32_t cp = 0;
      for (int k = 0; k < nd; k++) {
        int h = i + (size_t)k < n ? di_hexval(p[i + (size_t)k]) : -1;
        if (h < 0) { jj_buf_free(&b); return lex_err(L, at, "string literal has a truncated \\x, \\u or \\U escape"); }
        cp = cp * 16 + (uint32_t)h;
      }
      i += (size_t)nd;
      if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        jj_buf_free(&b);
        return lex_err(L, at, "string literal escapes a surrogate or out-of-range code point");
      }
      jj_utf8_put(&b, cp);
      break;
    }
    case 'N': jj_buf_free(&b); return lex_err(L, at, "unsupported construct: \\N{...} escape in a string literal");
    default:
      if (c >= '0' && c <= '7') {
        uint32_t cp = (uint32_t)(c - '0');
        for (int k = 0; k < 2 && i < n && p[i] >= '0' && p[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(p[i++] - '0');
        jj_utf8_put(&b, cp);
      } else if ((unsigned char)c >= 0x80) {
        size_t j = i - 1;
        uint32_t cp = jj_utf8_next(p, n, &j);
        i = j;
        jj_buf_putc(&b, '\\');
        if (cp < 0x100) jj_buf_printf(&b, "\\x%02x", cp);
        else if (cp < 0x10000) jj_buf_printf(&b, "\\u%04x", cp);
        else jj_buf_printf(&b, "\\U%08x", cp);
      } else {
        jj_buf_putc(&b, '\\');
        jj_buf_putc(&b, c);
      }
    }
  }
  if (b.failed) { jj_buf_free(&b); return di_error_set(DI_ERR_OOM, "chat template: out of memory"); }
  jv s = jj_str_dup(L->a, b.p ? b.p : "", b.n);
  jj_buf_free(&b);
  if (s.kind != JV_STR) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  t->p = s.u.s.p;
  t->n = s.u.s.n;
  return DI_OK;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/* Lexes the inside of a tag until its end; `var`: {{ }} else {% %}. Returns the position after
 * the end marker and sets *strip ('-', '+' or 0). */
static di_status lex_tag(lexer *L, int var, size_t *endpos, char *strip) {
  int depth = 0;
  size_t i = L->pos;
  for (;;) {
    while (i < L->n && is_ws(L->s[i])) i++;
    advance_lines(L, L->pos, i);
    L->pos = i;
    if (i >= L->n) return lex_err(L, i, var ? "missing '}}' at the end of the template" : "missing '%}' at the end of the template");
    const char *e = var ? "}}" : "%}";
    if (depth == 0) {
      if ((L->s[i] == '-' || (!var && L->s[i] == '+')) && i + 2 < L->n + 0 && L->s[i + 1] == e[0] && L->s[i + 2] == e[1]) {
        *strip = L->s[i];
        *endpos = i + 3;
        return DI_OK;
      }
      if (i + 1 < L->n && L->s[i] == e[0] && L->s[i + 1] == e[1]) {
        *strip = 0;
        *endpos = i + 2;
        return DI_OK;
      }
    }
    char c = L->s[i];
    jj_tok *t;
    if (is_digit(c)) {
      size_t j = i;
      while (j < L->n && is_digit(L->s[j])) j++;
      int isf = 0;
      size_t k = j;
      if (k + 1 < L->n && L->s[k] == '.' && is_digit(L->s[k + 1])) {
        k++;
        while (k < L->n && is_digit(L->s[k])) k++;
        isf = 1;
      }
      if (k < L->n && (L->s[k] == 'e' || L->s[k] == 'E')) {
        size_t m = k + 1;
        if (m < L->n && (L->s[m] == '+' || L->s[m] == '-')) m++;
        if (m < L->n && is_digit(L->s[m])) {
          while (m < L->n && is_digit(L->s[m])) m++;
          k = m;
          isf = 1;
        }
      }
      if (!isf) k = j;
      char buf[64];
      size_t len = k - i < sizeof buf - 1 ? k - i : sizeof buf - 1;
      memcpy(buf, L->s + i, len);
      buf[len] = 0;
      if (!(t = push(L, isf ? TK_FLOAT : TK_INT, i))) goto oom;
      if (isf) t->f = strtod(buf, NULL);
      else {
        if (k - i > 18) return lex_err(L, i, "integer literal too large");
        t->i = strtoll(buf, NULL, 10);
      }
      i = k;
    } else if (is_name0(c)) {
      size_t j = i;
      while (j < L->n && is_name(L->s[j])) j++;
      if (!(t = push(L, TK_NAME, i))) goto oom;
      t->p = L->s + i;
      t->n = j - i;
      i = j;
    } else if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < L->n && L->s[j] != c) j += (L->s[j] == '\\' && j + 1 < L->n) ? 2 : 1;
      if (j >= L->n) return lex_err(L, i, "unterminated string literal");
      if (!(t = push(L, TK_STRING, i))) goto oom;
      DI_TRY(decode_string(L, i, L->s + i + 1, j - i - 1, t));
      advance_lines(L, i, j + 1);
      L->pos = j + 1;
      i = j + 1;
    } else {
      int len = 0;
      for (int k = 0; OPS2[k]; k++)
        if (i + 1 < L->n && L->s[i] == OPS2[k][0] && L->s[i + 1] == OPS2[k][1]) { len = 2; break; }
      if (!len && strchr(OPS1, c) && c) len = 1;
      if (!len) {
        char msg[64];
        snprintf(msg, sizeof msg, "unexpected character '%c' in a tag", (c >= 32 && c < 127) ? c : '?');
        return lex_err(L, i, msg);
      }
      if (!(t = push(L, TK_OP, i))) goto oom;
      memcpy(t->op, L->s + i, (size_t)len);
      if (c == '(' || c == '[' || c == '{') depth++;
      if ((c == ')' || c == ']' || c == '}') && len == 1) {
        if (depth == 0) {
          char msg[48];
          snprintf(msg, sizeof msg, "unexpected '%c'", c);
          return lex_err(L, i, msg);
        }
        depth--;
      }
      i += (size_t)len;
    }
  }
oom:
  return di_error_set(DI_ERR_OOM, "chat template: out of memory");
}

/* Strips trailing whitespace of the text [st, *en) per the tag's sign and lstrip_blocks. */
static void strip_before(lexer *L, size_t st, size_t *en, char sign, int lstrip_ok, int line_starting) {
  if (sign == '-') {
    while (*en > st && is_ws(L->s[*en - 1])) (*en)--;
    return;
  }
  if (sign == '+' || !lstrip_ok) return;
  size_t lp = *en;
  while (lp > st && L->s[lp - 1] != '\n') lp--;
  int at_line = lp > st || line_starting; /* a newline in the text, or the text starts a line */
  if (!at_line || lp == *en) return;
  for (size_t k = lp; k < *en; k++)
    if (!is_ws(L->s[k])) return;
  *en = lp;
}

static di_status emit_text(lexer *L, size_t st, size_t en) {
  if (en <= st) return DI_OK;
  jj_tok *t = push(L, TK_TEXT, st);
  if (!t) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  t->p = L->s + st;
  t->n = en - st;
  return DI_OK;
}

/* After an end marker: '-' eats all whitespace, '+' nothing, else trim_blocks eats one newline
 * (for block and comment ends only). Returns the new position. */
static size_t strip_after(lexer *L, size_t pos, char sign, int trim) {
  if (sign == '-') {
    while (pos < L->n && is_ws(L->s[pos])) pos++;
  } else if (sign != '+' && trim && pos < L->n && L->s[pos] == '\n') pos++;
  return pos;
}

/* Matches `{%[-+]?\s*NAME\s*` then an end marker at `at`; returns 1 with the position after the
 * end marker and its sign. */
static int match_word_tag(lexer *L, size_t at, const char *word, size_t *after, char *begin_sign, char *end_sign) {
  size_t i = at + 2;
  *begin_sign = 0;
  if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) *begin_sign = L->s[i++];
  while (i < L->n && is_ws(L->s[i])) i++;
  size_t wl = strlen(word);
  if (i + wl > L->n || memcmp(L->s + i, word, wl) != 0) return 0;
  i += wl;
  if (i < L->n && is_name(L->s[i])) return 0;
  while (i < L->n && is_ws(L->s[i])) i++;
  if (i + 2 < L->n + 0 && (L->s[i] == '-' || L->s[i] == '+') && L->s[i + 1] == '%' && L->s[i + 2] == '}') {
    *end_sign = L->s[i];
    *after = i + 3;
    return 1;
  }
  if (i + 1 < L->n && L->s[i] == '%' && L->s[i + 1] == '}') {
    *end_sign = 0;
    *after = i + 2;
    return 1;
  }
  return 0;
}

di_status jj_lex(jj_arena *a, const char *src, size_t len, jj_tok **toks, size_t *ntoks) {
  lexer L = {0};
  L.a = a;
  L.line = 1;
  /* Newlines: \r\n and \r become \n; one trailing newline is dropped (keep_trailing_newline off). */
  char *s = jj_alloc(a, len + 1);
  if (!s) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (src[i] == '\r') {
      s[n++] = '\n';
      if (i + 1 < len && src[i + 1] == '\n') i++;
    } else s[n++] = src[i];
  }
  if (n > 0 && s[n - 1] == '\n') n--;
  L.s = s;
  L.n = n;
  int line_starting = 1;
  while (L.pos < L.n) {
    /* the next tag start */
    size_t t = L.pos;
    const char *hit = NULL;
    while (t + 1 < L.n) {
      if (L.s[t] == '{' && (L.s[t + 1] == '{' || L.s[t + 1] == '%' || L.s[t + 1] == '#')) { hit = L.s + t; break; }
      t++;
    }
    if (!hit) {
      DI_TRY(emit_text(&L, L.pos, L.n));
      break;
    }
    char kind = L.s[t + 1];
    char sign = (t + 2 < L.n && (L.s[t + 2] == '-' || L.s[t + 2] == '+')) ? L.s[t + 2] : 0;
    size_t text_end = t;
    size_t raw_after;
    char rs_b, rs_e;
    /* Jinja's raw opening tag ends with "-%}" or "%}" only; "{% raw +%}" is an (unknown) tag */
    int is_raw = kind == '%' && match_word_tag(&L, t, "raw", &raw_after, &rs_b, &rs_e) && rs_e != '+';
    strip_before(&L, L.pos, &text_end, sign, kind != '{', line_starting);
    DI_TRY(emit_text(&L, L.pos, text_end));
    advance_lines(&L, L.pos, t);
    L.pos = t;
    if (is_raw) {
      size_t body = raw_after;
      if (rs_e == '-') while (body < L.n && is_ws(L.s[body])) body++;
      size_t k = body;
      size_t after = 0;
      char eb = 0, ee = 0;
      for (; k + 1 < L.n; k++)
        if (L.s[k] == '{' && L.s[k + 1] == '%' && match_word_tag(&L, k, "endraw", &after, &eb, &ee)) break;
      if (k + 1 >= L.n) return lex_err(&L, t, "missing end of raw directive");
      size_t be = k;
      strip_before(&L, body, &be, eb, 1, 0);
      DI_TRY(emit_text(&L, body, be));
      size_t np = strip_after(&L, after, ee, 1);
      line_starting = np > 0 && L.s[np - 1] == '\n';
      advance_lines(&L, L.pos, np);
      L.pos = np;
      continue;
    }
    if (kind == '#') {
      size_t k = t + 2 + (sign ? 1 : 0);
      while (k + 1 < L.n && !(L.s[k] == '#' && L.s[k + 1] == '}')) k++;
      if (k + 1 >= L.n) return lex_err(&L, t, "missing end of comment tag");
      char es = (k > t + 2 + (sign ? 1 : 0) && (L.s[k - 1] == '-' || L.s[k - 1] == '+')) ? L.s[k - 1] : 0;
      size_t np = strip_after(&L, k + 2, es, 1);
      line_starting = L.s[np - 1] == '\n';
      advance_lines(&L, L.pos, np);
      L.pos = np;
      continue;
    }
    int var = kind == '{';
    if (!push(&L, var ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, t)) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
    L.pos = t + 2 + (sign ? 1 : 0);
    size_t endpos = 0;
    char es = 0;
    DI_TRY(lex_tag(&L, var, &endpos, &es));
    if (!push(&L, var ? TK_VAR_END : TK_BLOCK_END, L.pos)) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
    size_t np = strip_after(&L, endpos, es, !var);
    line_starting = L.s[np - 1] == '\n';
    advance_lines(&L, L.pos, np);
    L.pos = np;
  }
  jj_tok *e = push(&L, TK_EOF, L.n);
  if (!e) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  *toks = L.toks;
  *ntoks = L.ntoks;
  return DI_OK;
}
