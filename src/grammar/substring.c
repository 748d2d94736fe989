/* Substring lexemes (substring.h), the empty piece included (llguidance's tests take it). The
 * text's bytes become a chain of rules P_i ::= text[i] P_i+1 (and "" where a piece may end), and the lexeme starts at any allowed boundary: an NFA with one
 * position per byte, which the automaton determinises lazily (so a long text costs O(length)
 * rules, not one literal per substring). Words are split at changes between whitespace and the
 * rest; characters at UTF-8 boundaries; chunks at the chunks' joins (empty chunks vanish). */
#include "grammar/substring.h"
#include <stdlib.h>
#include <string.h>
#include "util/json.h"

static int is_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13); }

/* The rule for text[0..n) with pieces starting and ending where cut[] (n + 1 flags) says. */
static di_status substring_rule(di_gb *b, const char *text, size_t n, const uint8_t *cut, int *rule) {
  if (n == 0 || n > 1000000)
    return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: %%regex text of %zu bytes (1 to 1000000)", n);
  int *P = malloc(sizeof(int) * (n + 1));
  if (!P)
    return di_error_set(DI_ERR_OOM, "out of memory");
  for (size_t i = 0; i <= n; i++)
    P[i] = di_gb_new_rule(b, "substr");
  *rule = di_gb_new_rule(b, "substring");
  di_status st = b->oom ? di_error_set(DI_ERR_OOM, "out of memory building the grammar")
                        : di_gb_add_alt(b, *rule, NULL, 0); /* the empty piece, as llguidance's */
  di_gseq s = {0};
  for (size_t i = 0; st == DI_OK && i <= n; i++) {
    b->rules[P[i]].defined = 1;
    if (cut[i] && i > 0)
      st = di_gb_add_alt(b, P[i], NULL, 0);
    if (st != DI_OK || i == n)
      continue;
    s.n = 0;
    di_gseq_byte(b, &s, (uint8_t)text[i]);
    di_gseq_push(b, &s, (di_gel){DI_GE_RULE, P[i + 1]});
    st = di_gb_add_alt(b, P[i], s.v, s.n);
    if (st == DI_OK && cut[i])
      st = di_gb_add_alt(b, *rule, s.v, s.n);
  }
  di_gseq_free(&s);
  free(P);
  return st;
}

di_status di_substring_compile(di_gb *b, const char *spec, size_t len, int *rule) {
  for (size_t i = 0; i + 6 <= len; i++)
    if (memcmp(spec + i, "\\u0000", 6) == 0)
      return di_error_set(DI_ERR_UNSUPPORTED, "lark grammar: %%regex text holding U+0000 is not supported");
  cJSON *j = cJSON_ParseWithLength(spec, len);
  if (!cJSON_IsObject(j) || !j->child || j->child->next) {
    cJSON_Delete(j);
    return di_error_set(DI_ERR_FORMAT, "lark grammar: %%regex takes an object with one of substring_words, "
                                       "substring_chars, substring_chunks");
  }
  const cJSON *v = j->child;
  const char *k = v->string;
  char *text = NULL;
  size_t n = 0;
  uint8_t *cut = NULL;
  di_status st = DI_OK;
  if (strcmp(k, "substring_words") == 0 || strcmp(k, "substring_chars") == 0) {
    if (!cJSON_IsString(v)) {
      st = di_error_set(DI_ERR_FORMAT, "lark grammar: %%regex %s takes a string", k);
    } else {
      n = strlen(v->valuestring);
      text = v->valuestring;
      cut = calloc(n + 1, 1);
      int words = k[10] == 'w';
      for (size_t i = 0; cut && i <= n; i++)
        cut[i] = words ? (i == 0 || i == n || is_space((unsigned char)text[i - 1]) != is_space((unsigned char)text[i]))
                       : (i == n || ((unsigned char)text[i] & 0xC0) != 0x80);
    }
  } else if (strcmp(k, "substring_chunks") == 0) {
    if (!cJSON_IsArray(v)) {
      st = di_error_set(DI_ERR_FORMAT, "lark grammar: %%regex substring_chunks takes an array of strings");
    } else {
      for (const cJSON *c = v->child; c && st == DI_OK; c = c->next)
        if (!cJSON_IsString(c))
          st = di_error_set(DI_ERR_FORMAT, "lark grammar: %%regex substring_chunks takes an array of strings");
        else
          n += strlen(c->valuestring);
      text = st == DI_OK ? malloc(n + 1) : NULL;
      cut = text ? calloc(n + 1, 1) : NULL;
      size_t o = 0;
      for (const cJSON *c = v->child; cut && c; c = c->next) {
        size_t l = strlen(c->valuestring);
        cut[o] = 1;
        memcpy(text + o, c->valuestring, l);
        o += l;
      }
      if (cut)
        cut[n] = 1;
    }
  } else {
    st = di_error_set(DI_ERR_FORMAT, "lark grammar: %%regex: unknown field '%.100s'", k);
  }
  if (st == DI_OK && !cut)
    st = di_error_set(DI_ERR_OOM, "out of memory");
  if (st == DI_OK)
    st = substring_rule(b, text, n, cut, rule);
  if (text && text != v->valuestring)
    free(text);
  free(cut);
  cJSON_Delete(j);
  return st;
}
