/* The default generation bounds of JSON values (issue 23, "No runaway values";
 * docs/structured-outputs.md): a string the schema leaves unbounded has at most
 * DI_GRAMMAR_DEFAULT_MAX_STRING_LENGTH (4,096) characters, keys included, a number at most
 * DI_GRAMMAR_DEFAULT_MAX_DIGITS (16) digits; max_string_length / max_digits change them, -1 turns
 * them off; a schema's own maxLength wins; a minLength above the bound raises it; a string under a
 * pattern keeps the pattern's language. Checked through the matcher (accept_bytes, can_end and
 * mask bits at the bound), with strings of exactly the bound, one more and one less, in ASCII,
 * in two-byte UTF-8 and in escapes (each one character, as maxLength counts). */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"
#include "test_util.h"

/* Tokens: the mask checks look at the first five; the others let the text be fed in pieces. */
static const char *const TOKS[] = {"x", "xx", "x\"", "\"", "xxxxxxxx", "{", "}", ":", ",", "1", "\"x", "\xc3\xa9", "\\n"};
enum { T_X, T_XX, T_XQ, T_Q, T_X8, NTOK = sizeof TOKS / sizeof TOKS[0] };
static di_grammar_vocab *vocab;

static di_grammar *compile(di_grammar_kind kind, const char *src, int max_len, int max_digits) {
  di_grammar_options o = {0};
  o.max_string_length = max_len;
  o.max_digits = max_digits;
  o.no_cache = 1;
  di_grammar *g = NULL;
  di_status st = di_grammar_compile(kind, src, strlen(src), &o, &g);
  CHECKF(st == DI_OK, "%s: %s", src, di_last_error());
  return g;
}

/* text = head + n copies of unit + tail, in a malloc'd buffer */
static char *text(const char *head, const char *unit, int n, const char *tail, size_t *len) {
  size_t h = strlen(head), u = strlen(unit), t = strlen(tail);
  char *s = malloc(h + u * (size_t)n + t + 1);
  if (!s)
    abort();
  memcpy(s, head, h);
  for (int i = 0; i < n; i++)
    memcpy(s + h + u * (size_t)i, unit, u);
  memcpy(s + h + u * (size_t)n, tail, t + 1);
  *len = h + u * (size_t)n + t;
  return s;
}

/* Whether the matcher takes head + n units + tail whole (fed 7 bytes a step) and can end there. */
static int matcher_takes(const di_grammar *g, const char *head, const char *unit, int n, const char *tail) {
  size_t len;
  char *s = text(head, unit, n, tail, &len);
  di_grammar_matcher *m = NULL;
  if (di_grammar_matcher_create(g, vocab, &m) != DI_OK)
    abort();
  int ok = 1;
  for (size_t i = 0; ok && i < len; i += 7)
    ok = di_grammar_matcher_accept_bytes(m, s + i, len - i < 7 ? len - i : 7) == DI_OK;
  ok = ok && di_grammar_matcher_can_end(m);
  int lang = di_grammar_accepts(g, s, len); /* the automaton alone must agree */
  CHECKF(ok == lang, "matcher %d vs automaton %d on %.40s... (%zu bytes)", ok, lang, s, len);
  di_grammar_matcher_free(m);
  free(s);
  return ok;
}

/* At the bound: after head + (bound - 1) x's a token "x" and "x\"" are allowed, "xx" is not; after
 * bound x's only the closing quote; "\"" always. */
static void mask_at_bound(const di_grammar *g, const char *head, int bound) {
  for (int left = 1; left >= 0; left--) {
    size_t len;
    char *s = text(head, "x", bound - left, "", &len);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_create(g, vocab, &m) != DI_OK)
      abort();
    CHECK(di_grammar_matcher_accept_bytes(m, s, len) == DI_OK);
    uint32_t mask[1] = {0};
    CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
    int bit[NTOK];
    for (int i = 0; i < NTOK; i++)
      bit[i] = (int)(mask[0] >> i & 1);
    CHECKF(bit[T_X] == left && bit[T_XQ] == left && !bit[T_XX] && !bit[T_X8] && bit[T_Q],
           "bound %d, %d left: x %d, x\" %d, xx %d, x8 %d, \" %d", bound, left, bit[T_X], bit[T_XQ], bit[T_XX],
           bit[T_X8], bit[T_Q]);
    di_grammar_matcher_free(m);
    free(s);
  }
}

enum { N = DI_GRAMMAR_DEFAULT_MAX_STRING_LENGTH };

static void string_values(void) {
  const char *str = "{\"type\": \"string\"}";
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, str, 0, 0);
  CHECK(N == 4096);
  CHECK(matcher_takes(g, "\"", "x", N, "\""));
  CHECK(!matcher_takes(g, "\"", "x", N + 1, "\""));
  CHECK(matcher_takes(g, "\"", "x", N - 1, "\""));
  CHECK(matcher_takes(g, "\"", "\xc3\xa9", N, "\""));   /* 8,192 bytes, 4,096 characters */
  CHECK(!matcher_takes(g, "\"", "\xc3\xa9", N + 1, "\""));
  CHECK(matcher_takes(g, "\"", "\\n", N, "\""));        /* an escape is one character */
  CHECK(!matcher_takes(g, "\"", "\\u00e9", N + 1, "\""));
  CHECK(matcher_takes(g, "\"", "\\ud83d\\ude00", N, "\"")); /* a surrogate pair is one */
  mask_at_bound(g, "\"", N);
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, str, -1, 0); /* off */
  CHECK(matcher_takes(g, "\"", "x", 3 * N, "\""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, str, 10, 0); /* changed */
  CHECK(matcher_takes(g, "\"", "x", 10, "\""));
  CHECK(!matcher_takes(g, "\"", "x", 11, "\""));
  mask_at_bound(g, "\"", 10);
  di_grammar_free(g);
  /* the schema's own maxLength wins, above or below the bound */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"maxLength\": 5000}", 0, 0);
  CHECK(matcher_takes(g, "\"", "x", 5000, "\""));
  CHECK(!matcher_takes(g, "\"", "x", 5001, "\""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"maxLength\": 3}", 0, 0);
  CHECK(matcher_takes(g, "\"", "x", 3, "\""));
  CHECK(!matcher_takes(g, "\"", "x", 4, "\""));
  di_grammar_free(g);
  /* a minLength above the bound raises it to the minLength; below it leaves it */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"minLength\": 5000}", 0, 0);
  CHECK(!matcher_takes(g, "\"", "x", 4999, "\""));
  CHECK(matcher_takes(g, "\"", "x", 5000, "\""));
  CHECK(!matcher_takes(g, "\"", "x", 5001, "\""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"minLength\": 2}", 0, 0);
  CHECK(!matcher_takes(g, "\"", "x", 1, "\""));
  CHECK(matcher_takes(g, "\"", "x", N, "\""));
  CHECK(!matcher_takes(g, "\"", "x", N + 1, "\""));
  di_grammar_free(g);
  /* a pattern keeps its own language (documented: no default bound under a pattern or format) */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"^x+$\"}", 0, 0);
  CHECK(matcher_takes(g, "\"", "x", N + 1, "\""));
  di_grammar_free(g);
  /* values of additional properties, array items, any JSON (json_object), Lark's %json */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"additionalProperties\": {\"type\": \"string\"}}", 0, 0);
  CHECK(matcher_takes(g, "{\"k\":\"", "x", N, "\"}"));
  CHECK(!matcher_takes(g, "{\"k\":\"", "x", N + 1, "\"}"));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"array\"}", 0, 0);
  CHECK(matcher_takes(g, "[1,\"", "x", N, "\"]"));
  CHECK(!matcher_takes(g, "[1,\"", "x", N + 1, "\"]"));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_ANY, "", 0, 0);
  CHECK(matcher_takes(g, "{\"k\":[\"", "x", N, "\"]}"));
  CHECK(!matcher_takes(g, "{\"k\":[\"", "x", N + 1, "\"]}"));
  mask_at_bound(g, "{\"k\":\"", N);
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_ANY, "", -1, 0);
  CHECK(matcher_takes(g, "{\"k\":[\"", "x", N + 1, "\"]}"));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_LARK, "start: \"<\" %json {\"type\": \"string\"} \">\"", 0, 0);
  CHECK(matcher_takes(g, "<\"", "x", N, "\">"));
  CHECK(!matcher_takes(g, "<\"", "x", N + 1, "\">"));
  di_grammar_free(g);
  /* %json directly in a max_chars=40 rule: the bound (4,096, above 40) is dropped there, the
   * language is the same (40 characters with the quotes); a bound of 20 below it still applies */
  const char *mc = "start: x \"!\"\nx[max_chars=40]: %json {\"type\": \"string\"}";
  for (int bound = 0; bound <= 20; bound += 20) {
    g = compile(DI_GRAMMAR_LARK, mc, bound, 0);
    int most = bound ? 20 : 38;
    CHECK(matcher_takes(g, "\"", "x", most, "\"!"));
    CHECK(!matcher_takes(g, "\"", "x", most + 1, "\"!"));
    CHECK(matcher_takes(g, "\"", "\\n", most / 2, "\"!"));  /* an escape: 2 characters of the 40 */
    di_grammar_free(g);
  }
}

static void keys(void) {
  /* free keys (no named property: any string) */
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\"}", 0, 0);
  CHECK(matcher_takes(g, "{\"", "x", N, "\":1}"));
  CHECK(!matcher_takes(g, "{\"", "x", N + 1, "\":1}"));
  mask_at_bound(g, "{\"", N);
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_ANY, "", 0, 0);
  CHECK(matcher_takes(g, "{\"", "x", N, "\":1}"));
  CHECK(!matcher_takes(g, "{\"", "x", N + 1, "\":1}"));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\"}", -1, 0);
  CHECK(matcher_takes(g, "{\"", "x", N + 1, "\":1}"));
  di_grammar_free(g);
  /* keys beside named properties (the exclusion trie: a key leaves it at its first byte that no
   * named key continues with, at any depth) */
  const char *named = "{\"properties\": {\"ab\": {\"type\": \"integer\"}, \"a\\u00e9\": {\"type\": \"integer\"}}}";
  g = compile(DI_GRAMMAR_JSON_SCHEMA, named, 0, 0);
  CHECK(matcher_takes(g, "{\"", "x", N, "\":1}"));                 /* leaves at the root */
  CHECK(!matcher_takes(g, "{\"", "x", N + 1, "\":1}"));
  CHECK(matcher_takes(g, "{\"a", "x", N - 1, "\":1}"));            /* leaves after "a" */
  CHECK(!matcher_takes(g, "{\"a", "x", N, "\":1}"));
  CHECK(matcher_takes(g, "{\"ab", "x", N - 2, "\":1}"));           /* after "ab" (a named key) */
  CHECK(!matcher_takes(g, "{\"ab", "x", N - 1, "\":1}"));
  CHECK(matcher_takes(g, "{\"a\xc3\xa9", "x", N - 2, "\":1}"));    /* after "aé": 2 characters */
  CHECK(!matcher_takes(g, "{\"a\xc3\xa9", "x", N - 1, "\":1}"));
  CHECK(matcher_takes(g, "{\"ab", "\\n", N - 2, "\":1}"));         /* escapes leave the trie too */
  CHECK(!matcher_takes(g, "{\"ab", "\\n", N - 1, "\":1}"));
  CHECK(matcher_takes(g, "{\"", "\xc3\xa9", N, "\":1}"));
  CHECK(!matcher_takes(g, "{\"", "\xc3\xa9", N + 1, "\":1}"));
  CHECK(matcher_takes(g, "{\"ab\":1,\"a", "x", N - 1, "\":1}"));    /* after a named member */
  CHECK(!matcher_takes(g, "{\"ab\":1,\"a", "x", N, "\":1}"));
  mask_at_bound(g, "{\"", N);
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, named, -1, 0);
  CHECK(matcher_takes(g, "{\"ab", "x", N, "\":1}"));
  di_grammar_free(g);
  /* named keys at and past a small bound: named keys are the schema's own; other keys of more
   * than 3 characters are not generated (a trie node of exactly 3 with nothing past it) */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"properties\": {\"abc\": {}, \"abcde\": {}}}", 3, 0);
  CHECK(matcher_takes(g, "{\"abc\":1", "", 0, "}"));
  CHECK(matcher_takes(g, "{\"abcde\":1", "", 0, "}"));
  CHECK(matcher_takes(g, "{\"abd\":1", "", 0, "}"));
  CHECK(matcher_takes(g, "{\"ab\":1", "", 0, "}"));
  CHECK(!matcher_takes(g, "{\"abcd\":1", "", 0, "}"));
  CHECK(!matcher_takes(g, "{\"abdd\":1", "", 0, "}"));
  CHECK(!matcher_takes(g, "{\"abcdef\":1", "", 0, "}"));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"properties\": {\"abc\": {}}}", 3, 0);
  CHECK(matcher_takes(g, "{\"abc\":1", "", 0, "}"));
  CHECK(!matcher_takes(g, "{\"abcd\":1", "", 0, "}"));
  CHECK(matcher_takes(g, "{\"xyz\":1", "", 0, "}"));
  CHECK(!matcher_takes(g, "{\"wxyz\":1", "", 0, "}"));
  di_grammar_free(g);
  /* keys generated from propertyNames */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"propertyNames\": {\"minLength\": 1}}", 0, 0);
  CHECK(matcher_takes(g, "{\"", "x", N, "\":1}"));
  CHECK(!matcher_takes(g, "{\"", "x", N + 1, "\":1}"));
  CHECK(!matcher_takes(g, "{\"", "x", 0, "\":1}"));
  di_grammar_free(g);
}

static void numbers(void) {
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"integer\"}", 0, 0);
  CHECK(matcher_takes(g, "", "9", DI_GRAMMAR_DEFAULT_MAX_DIGITS, ""));
  CHECK(!matcher_takes(g, "", "9", DI_GRAMMAR_DEFAULT_MAX_DIGITS + 1, ""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"integer\"}", 0, -1);
  CHECK(matcher_takes(g, "", "9", 40, ""));
  di_grammar_free(g);
}

int main(void) {
  size_t lens[NTOK];
  for (int i = 0; i < NTOK; i++)
    lens[i] = strlen(TOKS[i]);
  if (di_grammar_vocab_create(NTOK, TOKS, lens, NULL, 0, &vocab) != DI_OK)
    return 1;
  string_values();
  keys();
  numbers();
  di_grammar_vocab_free(vocab);
  return test_finish("test_grammar_bounds");
}
