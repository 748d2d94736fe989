/* Accept/reject conformance cases for the three front-ends, read from
 * tests/data/grammar/cases_{ebnf,regex,schema}.txt:
 *   @KIND GRAMMAR      compile (KIND: ebnf, lark, regex, schema, json); GRAMMAR is verbatim except
 *                      that in EBNF and Lark " ;; " separates rules (stands for a newline)
 *   + INPUT            must be accepted whole          - INPUT   must be rejected
 *   !KIND GRAMMAR      must fail to compile, and the next line `? TEXT` is part of the message
 *   % OPTION=N ...     options for the grammars that follow in the file (strict, max_digits,
 *                      max_string_length, max_whitespace, indent; item_separator="...",
 *                      key_separator="..." and root_rule="..." take text); `%` alone restores
 *                      the defaults
 * INPUT takes escapes \n \t \r \\ \xHH; `+` / `-` alone stand for the empty input. The regex cases are also run through PCRE2 (full
 * match) as an independent oracle. */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"
#include "test_util.h"
#include "util/json.h"
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

static size_t unescape(const char *s, char *out) {
  size_t n = 0;
  for (; *s; s++) {
    if (*s == '\\' && s[1]) {
      s++;
      switch (*s) {
      case 'n': out[n++] = '\n'; break;
      case 't': out[n++] = '\t'; break;
      case 'r': out[n++] = '\r'; break;
      case '\\': out[n++] = '\\'; break;
      case 'x': {
        char h[3] = {s[1], s[2], 0};
        out[n++] = (char)strtol(h, NULL, 16);
        s += 2;
        break;
      }
      default: out[n++] = '\\'; out[n++] = *s;
      }
    } else {
      out[n++] = *s;
    }
  }
  out[n] = 0;
  return n;
}

static int kind_of(const char *k, di_grammar_kind *out) {
  if (strncmp(k, "ebnf", 4) == 0)
    *out = DI_GRAMMAR_EBNF;
  else if (strncmp(k, "lark", 4) == 0)
    *out = DI_GRAMMAR_LARK;
  else if (strncmp(k, "regex", 5) == 0)
    *out = DI_GRAMMAR_REGEX;
  else if (strncmp(k, "schema", 6) == 0)
    *out = DI_GRAMMAR_JSON_SCHEMA;
  else if (strncmp(k, "json", 4) == 0)
    *out = DI_GRAMMAR_JSON_ANY;
  else
    return 0;
  return 1;
}

/* Reads a `% name=value ...` line into the options (starting from the defaults). */
static void parse_options(const char *line, di_grammar_options *o, const char *rel, int lineno) {
  memset(o, 0, sizeof *o);
  for (const char *p = line + 1; *p;) {
    while (*p == ' ')
      p++;
    if (!*p)
      break;
    char name[32];
    int v, used = 0;
    char *eq = strchr(p, '=');
    if (eq && eq[1] == '"' && eq - p < 32) { /* name="text" (escapes as in inputs): the separators */
      const char *end = strchr(eq + 2, '"');
      char raw[64] = {0}, text[64] = {0};
      if (!end || end - eq - 2 >= 63) {
        CHECKF(0, "%s:%d: bad option line", rel, lineno);
        return;
      }
      memcpy(name, p, (size_t)(eq - p));
      name[eq - p] = 0;
      memcpy(raw, eq + 2, (size_t)(end - eq - 2));
      size_t n = unescape(raw, text);
      char *dst = strcmp(name, "item_separator") == 0 ? o->item_separator
                  : strcmp(name, "key_separator") == 0 ? o->key_separator
                  : strcmp(name, "root_rule") == 0 ? o->root_rule : NULL;
      size_t cap = dst == o->root_rule ? sizeof o->root_rule : 8;
      CHECKF(dst && n < cap, "%s:%d: unknown option %s", rel, lineno, name);
      if (dst && n < cap)
        memcpy(dst, text, n + 1);
      p = end + 1;
      continue;
    }
    if (sscanf(p, "%31[a-z_]=%d%n", name, &v, &used) != 2) {
      CHECKF(0, "%s:%d: bad option line", rel, lineno);
      return;
    }
    if (strcmp(name, "strict") == 0)
      o->strict = v;
    else if (strcmp(name, "max_digits") == 0)
      o->max_digits = v;
    else if (strcmp(name, "max_string_length") == 0)
      o->max_string_length = v;
    else if (strcmp(name, "max_whitespace") == 0)
      o->max_whitespace = v;
    else if (strcmp(name, "indent") == 0)
      o->indent = v;
    else
      CHECKF(0, "%s:%d: unknown option %s", rel, lineno, name);
    p += used;
  }
}

static void run_file(const char *rel) {
  di_grammar_options opt = {0};
  char *data = NULL;
  size_t len = 0;
  if (di_read_file(test_path(rel), &data, &len) != DI_OK) {
    CHECKF(0, "cannot read %s: %s", rel, di_last_error());
    return;
  }
  di_grammar *g = NULL;
  pcre2_code *re = NULL;
  pcre2_match_data *md = NULL;
  int lineno = 0, n_acc = 0, n_rej = 0, n_err = 0, expect_error = 0;
  char *gsrc = malloc(len + 1), *inp = malloc(len + 1);
  char *save = NULL;
  for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    lineno++;
    if (line[0] == '#' || line[0] == 0)
      continue;
    if (line[0] == '%') {
      parse_options(line, &opt, rel, lineno);
      continue;
    }
    if (line[0] == '@' || line[0] == '!') {
      di_grammar_free(g);
      g = NULL;
      if (re)
        pcre2_code_free(re), re = NULL;
      di_grammar_kind kind;
      char *sp = strchr(line, ' ');
      const char *src = sp ? sp + 1 : "";
      if (!kind_of(line + 1, &kind)) {
        CHECKF(0, "%s:%d: bad kind", rel, lineno);
        continue;
      }
      size_t n = 0;
      for (const char *q = src; *q; q++) {
        if ((kind == DI_GRAMMAR_EBNF || kind == DI_GRAMMAR_LARK) && strncmp(q, " ;; ", 4) == 0) {
          gsrc[n++] = '\n';
          q += 3;
        } else {
          gsrc[n++] = *q;
        }
      }
      gsrc[n] = 0;
      di_status st = di_grammar_compile(kind, gsrc, n, &opt, &g);
      if (line[0] == '!') {
        CHECKF(st != DI_OK, "%s:%d: expected a compile error", rel, lineno);
        if (st == DI_OK) {
          di_grammar_free(g);
          g = NULL;
        }
        expect_error = 1;
        n_err++;
      } else {
        CHECKF(st == DI_OK, "%s:%d: %s", rel, lineno, di_last_error());
        expect_error = 0;
        if (st != DI_OK)
          g = NULL;
        if (kind == DI_GRAMMAR_REGEX && g) {
          int ec;
          PCRE2_SIZE eo;
          re = pcre2_compile((PCRE2_SPTR)gsrc, n, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &ec, &eo, NULL);
        }
      }
      continue;
    }
    if (line[0] == '?') {
      CHECKF(expect_error && strstr(di_last_error(), line + 2), "%s:%d: message \"%s\" lacks \"%s\"", rel, lineno,
             di_last_error(), line + 2);
      continue;
    }
    if ((line[0] == '+' || line[0] == '-') && g) {
      const char *src = line[1] == ' ' ? line + 2 : line + 1;
      size_t n = unescape(src, inp);
      int want = line[0] == '+';
      int got = di_grammar_accepts(g, inp, n);
      CHECKF(got == want, "%s:%d: '%s' %s but should be %s", rel, lineno, src, got ? "accepted" : "rejected",
             want ? "accepted" : "rejected");
      if (re) {
        if (!md)
          md = pcre2_match_data_create(4, NULL);
        int r = pcre2_match(re, (PCRE2_SPTR)inp, n, 0, 0, md, NULL);
        CHECKF((r >= 0) == want, "%s:%d: PCRE2 disagrees with the expectation for '%s'", rel, lineno, src);
      }
      if (want)
        n_acc++;
      else
        n_rej++;
    }
  }
  fprintf(stderr, "%s: %d accept, %d reject, %d error cases\n", rel, n_acc, n_rej, n_err);
  di_grammar_free(g);
  if (re)
    pcre2_code_free(re);
  if (md)
    pcre2_match_data_free(md);
  free(gsrc);
  free(inp);
  free(data);
}

int main(void) {
  run_file("tests/data/grammar/cases_ebnf.txt");
  run_file("tests/data/grammar/cases_regex.txt");
  run_file("tests/data/grammar/cases_lark.txt");
  run_file("tests/data/grammar/cases_schema.txt");
  return test_finish("test_grammar_cases");
}
