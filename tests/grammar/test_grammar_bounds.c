/* The default generation bounds of JSON values (issue 23, "No runaway values";
 * docs/structured-outputs.md): a string the schema leaves unbounded has at most
 * DI_GRAMMAR_DEFAULT_MAX_STRING_LENGTH (4,096) characters, keys included, a number at most
 * DI_GRAMMAR_DEFAULT_MAX_DIGITS (16) digits; max_string_length / max_digits change them, -1 turns
 * them off; a schema's own maxLength wins; a minLength above the bound raises it. Strings under a
 * pattern or format get the same bound through the matcher's character counter (string_bound.h):
 * checked against the language by hand at every count of a small bound, with rollbacks at random
 * against a fresh matcher's replay. Checked through the matcher (accept_bytes, can_end and
 * mask bits at the bound), with strings of exactly the bound, one more and one less, in ASCII,
 * in two-byte UTF-8 and in escapes (each one character, as maxLength counts). */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"
#include "test_util.h"

/* Tokens: the mask checks look at the first five; the others let the text be fed in pieces. */
static const char *const TOKS[] = {"x",  "xx", "x\"", "\"",  "xxxxxxxx", "{",     "}", ":", ",", "1", "\"x",
                                   "\xc3\xa9", "\\n", "y", "xy", "y\"", "@a.b\"", "@",  "a", ".", "b", "xxx", "[", "]", "\",\""};
enum { T_X, T_XX, T_XQ, T_Q, T_X8, NTOK = sizeof TOKS / sizeof TOKS[0] };
_Static_assert(NTOK <= 32, "the masks are one word");
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

/* A string schema of x's with the bound turned off (-1: runs to 3N) and changed (10: stops there, the
 * mask at the bound as mask_at_bound checks it). */
static void bound_off_and_changed(const char *schema) {
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, schema, -1, 0);
  CHECK(matcher_takes(g, "\"", "x", 3 * N, "\""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, schema, 10, 0);
  CHECK(matcher_takes(g, "\"", "x", 10, "\""));
  CHECK(!matcher_takes(g, "\"", "x", 11, "\""));
  mask_at_bound(g, "\"", 10);
  di_grammar_free(g);
}

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
  bound_off_and_changed(str); /* off: runs to 3N; changed: stops at 10 */
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

/* The language of `"` then body^(x+) (with_y = 0) or `x+y` (1) then `"`, bodies of at most `bound`
 * characters, by hand: whether some string of it starts with `"` + k x's + token t. */
static int xy_allows(int with_y, int bound, int k, const char *t) {
  int a = k;
  while (*t == 'x')
    a++, t++;
  if (with_y && *t == 'y')
    return a >= 1 && a + 1 <= bound && (t[1] == 0 || (t[1] == '"' && t[2] == 0));
  if (*t == 0)
    return (a > 1 ? a : 1) + with_y <= bound;
  return !with_y && *t == '"' && t[1] == 0 && a >= 1 && a <= bound;
}

/* Every token's mask bit after `"` + k x's, k = 0 .. bound + 1, against xy_allows. */
static void xy_masks(const char *schema, int with_y, int bound) {
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, schema, bound, 0);
  for (int k = 0; k <= bound + 1; k++) {
    size_t len;
    char *s = text("\"", "x", k, "", &len);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_create(g, vocab, &m) != DI_OK)
      abort();
    int fed = 1;
    for (size_t i = 0; fed && i < len; i += 3) /* in pieces, so the counter crosses steps */
      fed = di_grammar_matcher_accept_bytes(m, s + i, len - i < 3 ? len - i : 3) == DI_OK;
    const int can_feed = k == 0 || xy_allows(with_y, bound, k - 1, "x");
    CHECKF(fed == can_feed, "%s bound %d: \" + %d x's fed %d, expected %d", schema, bound, k, fed, can_feed);
    if (fed) {
      uint32_t mask[1] = {0};
      CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
      for (int i = 0; i < NTOK; i++)
        CHECKF((int)(mask[0] >> i & 1) == xy_allows(with_y, bound, k, TOKS[i]), "%s bound %d, %d x's: token '%s' %d",
               schema, bound, k, TOKS[i], (int)(mask[0] >> i & 1));
    }
    di_grammar_matcher_free(m);
    free(s);
  }
  di_grammar_free(g);
}

/* Random tokens from the masks with rollbacks at random: after every operation the matcher's mask and
 * can_end equal a fresh matcher's that took the same bytes in one step (the counter is exact across
 * rollbacks and the steps' boundaries). */
static void rollback_walk(const char *schema, int bound, unsigned seed) {
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, schema, bound, 0);
  di_grammar_matcher *m = NULL;
  if (di_grammar_matcher_create(g, vocab, &m) != DI_OK)
    abort();
  int hist[512], nh = 0, checks = 0;
  for (int op = 0; op < 400; op++) {
    uint32_t mask[1] = {0};
    CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
    seed = seed * 1103515245u + 12345u;
    const int r = (int)(seed >> 16);
    if ((r % 10 < 3 && nh > 0) || !mask[0] || nh == 500 || di_grammar_matcher_is_terminated(m)) {
      const int n = 1 + r % (nh < 4 ? (nh ? nh : 1) : 4);
      if (nh == 0)
        break;
      CHECK(di_grammar_matcher_rollback(m, n) == DI_OK);
      nh -= n;
    } else {
      int pick = r % __builtin_popcount(mask[0]), id = 0;
      for (uint32_t x = mask[0];; x &= x - 1)
        if (pick-- == 0) {
          id = __builtin_ctz(x);
          break;
        }
      CHECK(di_grammar_matcher_accept_token(m, id) == DI_OK);
      hist[nh++] = id;
    }
    char buf[8192];
    size_t len = 0;
    for (int i = 0; i < nh; i++) {
      memcpy(buf + len, TOKS[hist[i]], strlen(TOKS[hist[i]]));
      len += strlen(TOKS[hist[i]]);
    }
    di_grammar_matcher *f = NULL;
    if (di_grammar_matcher_create(g, vocab, &f) != DI_OK)
      abort();
    CHECK(len == 0 || di_grammar_matcher_accept_bytes(f, buf, len) == DI_OK);
    uint32_t a[1] = {0}, b[1] = {0};
    CHECK(di_grammar_matcher_fill_mask(m, a) == DI_OK && di_grammar_matcher_fill_mask(f, b) == DI_OK);
    CHECKF(a[0] == b[0] && di_grammar_matcher_can_end(m) == di_grammar_matcher_can_end(f),
           "%s: after op %d (%zu bytes) mask %08x vs fresh %08x", schema, op, len, a[0], b[0]);
    di_grammar_matcher_free(f);
    checks++;
  }
  CHECK(checks > 100);
  di_grammar_matcher_free(m);
  di_grammar_free(g);
}

/* A vocabulary of text, quotes, escapes, multi-byte characters and long tokens, and walks that take
 * random allowed tokens (long ones first, so that strings run into the bound) where every mask bit
 * must equal whether a fresh matcher fed the same bytes accepts that token: the mask's filter near
 * the bound (its short rows, its refusals without a walk, its walks) against accept_token. */
static const char *const WTOKS[] = {
    "a", "b", "x", "y", "!", "@", ".", "ab", "abc", "xyz", "hello", "abcdefghij", "abcdefghijklmnop", "\"", "\",",
    "\",\"", "\":", "\":\"", "\":1", "\"}", "\"]", "{", "}", "[", "]", ",", ":", "1", "{\"", "[\"", "ab\"", "a\"b",
    "abc\":\"", "x@y.z", "\\\"", "\\n", "\\u00e9", "\\u0041b", "\\ud83d\\ude00", "\xc3\xa9", "\xc3\xa9\xc3\xa9\xc3\xa9", "\xe6\x9d\xb1",
    "x\xc3\xa9y", "\\", "u00", "\\ud83d", "\\ude00", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "!\"", "b.c", "z\"]"};
enum { NW = sizeof WTOKS / sizeof WTOKS[0] };

static void brute_walk(const di_grammar_vocab *wv, const char *schema, int bound, unsigned seed, int *near) {
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, schema, bound, 0);
  di_grammar_matcher *m = NULL;
  if (di_grammar_matcher_create(g, wv, &m) != DI_OK)
    abort();
  char buf[16384];
  size_t len = 0;
  for (int step = 0; step < 120 && !di_grammar_matcher_is_terminated(m); step++) {
    uint32_t mask[(NW + 31) / 32 + 1] = {0};
    CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
    int allowed[NW], na = 0;
    for (int t = 0; t < NW; t++) {
      di_grammar_matcher *f = NULL;
      if (di_grammar_matcher_create(g, wv, &f) != DI_OK)
        abort();
      int ok = (len == 0 || di_grammar_matcher_accept_bytes(f, buf, len) == DI_OK) &&
               di_grammar_matcher_accept_token(f, t) == DI_OK;
      di_grammar_matcher_free(f);
      CHECKF((int)(mask[t >> 5] >> (t & 31) & 1) == ok, "%s bound %d step %d: token '%s' mask %d, accepted %d",
             schema, bound, step, WTOKS[t], (int)(mask[t >> 5] >> (t & 31) & 1), ok);
      if (ok)
        allowed[na++] = t;
    }
    if (!na)
      break;
    seed = seed * 1103515245u + 12345u;
    int pick = allowed[(seed >> 16) % (unsigned)na];
    for (int i = 0; i < na && (seed >> 8) % 4 != 0; i++) /* mostly the longest allowed */
      if (strlen(WTOKS[allowed[i]]) > strlen(WTOKS[pick]))
        pick = allowed[i];
    if (len + strlen(WTOKS[pick]) >= sizeof buf)
      break;
    CHECK(di_grammar_matcher_accept_token(m, pick) == DI_OK);
    memcpy(buf + len, WTOKS[pick], strlen(WTOKS[pick]));
    len += strlen(WTOKS[pick]);
    *near += len > (size_t)bound / 2;
  }
  di_grammar_matcher_free(m);
  di_grammar_free(g);
}

static void walks_at_the_bound(void) {
  size_t lens[NW];
  for (int i = 0; i < NW; i++)
    lens[i] = strlen(WTOKS[i]);
  const int32_t stop = NW - 1; /* "z\"]": its text never matters, it is the stop id */
  di_grammar_vocab *wv = NULL;
  if (di_grammar_vocab_create(NW, WTOKS, lens, &stop, 1, &wv) != DI_OK)
    abort();
  static const char *const schemas[] = {
      "{\"type\": \"string\"}",
      "{\"type\": \"array\", \"items\": {\"type\": \"string\"}}",
      "{\"type\": \"object\"}",
      "{\"properties\": {\"abc\": {\"type\": \"string\"}, \"ab\": {}}}",
      "{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"^[a-z]+!$\"}}",
      "{\"type\": \"array\", \"items\": {\"type\": \"string\", \"format\": \"email\"}}",
      "{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"a\"}}",
  };
  int near = 0;
  for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++)
    for (int bound = 7; bound <= 60; bound += 53) /* 60: above the longest token + the radius (the shortcuts) */
      for (unsigned seed = 1; seed <= 3; seed++)
        brute_walk(wv, schemas[k], bound, seed, &near);
  CHECK(near > 500);
  di_grammar_vocab_free(wv);
}

/* Strings under a pattern or format: the same default bound, through the matcher's counter. */
static void pattern_strings(void) {
  const char *px = "{\"type\": \"string\", \"pattern\": \"^x+$\"}";
  di_grammar *g = compile(DI_GRAMMAR_JSON_SCHEMA, px, 0, 0);
  CHECK(matcher_takes(g, "\"", "x", N, "\""));
  CHECK(!matcher_takes(g, "\"", "x", N + 1, "\""));
  CHECK(matcher_takes(g, "\"", "x", N - 1, "\""));
  mask_at_bound(g, "\"", N);
  di_grammar_free(g);
  bound_off_and_changed(px); /* off: the pattern's own language; changed: stops at 10 */
  /* characters as maxLength counts them: two-byte UTF-8 and escapes one each (an unanchored pattern) */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"a\"}", 0, 0);
  CHECK(matcher_takes(g, "\"a", "\xc3\xa9", N - 1, "\""));
  CHECK(!matcher_takes(g, "\"a", "\xc3\xa9", N, "\""));
  CHECK(matcher_takes(g, "\"a", "\\n", N - 1, "\""));
  CHECK(!matcher_takes(g, "\"a", "\\n", N, "\""));
  CHECK(matcher_takes(g, "\"a", "\\u0001", N - 1, "\""));
  CHECK(!matcher_takes(g, "\"a", "\\u0001", N, "\""));
  CHECK(!matcher_takes(g, "\"", "x", N, "\""));   /* no "a": the pattern's language still holds */
  di_grammar_free(g);
  /* a format: the local part cannot run on (the domain must still fit) */
  const char *em = "{\"type\": \"string\", \"format\": \"email\"}";
  g = compile(DI_GRAMMAR_JSON_SCHEMA, em, 0, 0);
  CHECK(matcher_takes(g, "\"", "x", N - 4, "@a.b\""));
  CHECK(!matcher_takes(g, "\"", "x", N - 3, "@a.b\""));
  CHECK(!matcher_takes(g, "\"", "x", N - 3, ""));  /* refused where "@a.b" no longer fits */
  CHECK(matcher_takes(g, "\"", "x", 0, "x@a.b\""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, em, -1, 0);
  CHECK(matcher_takes(g, "\"", "x", 2 * N, "@a.b\""));
  di_grammar_free(g);
  /* every mask bit at every count of a small bound against the language by hand: x+ and x+y (where
   * the body must keep room for its y: the viability check) */
  xy_masks(px, 0, 10);
  xy_masks("{\"type\": \"string\", \"pattern\": \"^x+y$\"}", 1, 10);
  xy_masks("{\"type\": \"string\", \"pattern\": \"^x+y$\"}", 1, 3);
  /* a pattern with minLength (the product's counter), and minLength above the bound: unbounded */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"^x+$\", \"minLength\": 2}", 0, 0);
  CHECK(!matcher_takes(g, "\"", "x", 1, "\""));
  CHECK(matcher_takes(g, "\"", "x", N, "\""));
  CHECK(!matcher_takes(g, "\"", "x", N + 1, "\""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"^x+$\", \"minLength\": 5000}", 0, 0);
  CHECK(matcher_takes(g, "\"", "x", 6000, "\""));
  di_grammar_free(g);
  /* a finite format longer than the bound, and a pattern whose shortest string is: their own
   * language (the bound would leave none, as a minLength above it) */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"format\": \"uuid\"}", 12, 0);
  CHECK(matcher_takes(g, "\"64abd298-f7b2-0a75-ff42-475ca4e1b2bd", "", 0, "\""));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"^x{20}y*$\"}", 10, 0);
  CHECK(matcher_takes(g, "\"", "x", 20, "yyyyyyyyyy\""));
  di_grammar_free(g);
  /* maxLength stays the exact way */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"^x+$\", \"maxLength\": 5000}", 0, 0);
  CHECK(matcher_takes(g, "\"", "x", 5000, "\""));
  CHECK(!matcher_takes(g, "\"", "x", 5001, "\""));
  di_grammar_free(g);
  /* inside objects and arrays, keys under propertyNames' pattern, and Lark's %json */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"properties\": {\"k\": {\"type\": \"array\", \"items\": {\"format\": \"email\"}}}}", 0, 0);
  CHECK(matcher_takes(g, "{\"k\":[\"x@a.b\",\"", "x", N - 4, "@a.b\"]}"));
  CHECK(!matcher_takes(g, "{\"k\":[\"x@a.b\",\"", "x", N - 3, "@a.b\"]}"));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"propertyNames\": {\"pattern\": \"^x+$\"}}", 0, 0);
  CHECK(matcher_takes(g, "{\"", "x", N, "\":1}"));
  CHECK(!matcher_takes(g, "{\"", "x", N + 1, "\":1}"));
  CHECK(matcher_takes(g, "{\"x\":1,\"", "x", N, "\":1}")); /* the counter starts again per string */
  di_grammar_free(g);
  /* patternProperties names: those matching a pattern and those matching none */
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"patternProperties\": {\"^x\": {\"type\": \"integer\"}}}", 0, 0);
  CHECK(matcher_takes(g, "{\"", "x", N, "\":1}"));
  CHECK(!matcher_takes(g, "{\"", "x", N + 1, "\":1}"));
  CHECK(matcher_takes(g, "{\"", "a", N, "\":[]}")); /* no pattern: any value */
  CHECK(!matcher_takes(g, "{\"", "a", N + 1, "\":[]}"));
  CHECK(!matcher_takes(g, "{\"", "x", 3, "\":[]}")); /* the pattern's schema holds */
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_JSON_SCHEMA, "{\"patternProperties\": {\"^x\": {\"type\": \"integer\"}}}", -1, 0);
  CHECK(matcher_takes(g, "{\"", "x", 2 * N, "\":1}"));
  di_grammar_free(g);
  g = compile(DI_GRAMMAR_LARK, "start: \"<\" %json {\"type\": \"string\", \"pattern\": \"^x+$\"} \">\"", 0, 0);
  CHECK(matcher_takes(g, "<\"", "x", N, "\">"));
  CHECK(!matcher_takes(g, "<\"", "x", N + 1, "\">"));
  di_grammar_free(g);
  /* rollback: exact across the counter (small bounds, so the walks meet them often) */
  rollback_walk("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"^x+y$\"}}", 4, 1);
  rollback_walk("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"^x+$\"}}", 3, 2);
  rollback_walk("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"format\": \"email\"}}", 6, 3);
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
  pattern_strings();
  walks_at_the_bound();
  numbers();
  di_grammar_vocab_free(vocab);
  return test_finish("test_grammar_bounds");
}
