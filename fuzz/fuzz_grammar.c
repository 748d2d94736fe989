/* libFuzzer target for the grammar front-ends and the automaton: the first byte picks the
 * front-end (0xC0 and above: Lark; else EBNF, regex, JSON Schema by its value mod 3, which is how
 * the corpus was first written) and the options (fuzz_grammar_options: whitespace by value / 3 mod 3
 * as before, and from session 13 the JSON options by (value - 0xC0 for Lark) / 9, 0 being the
 * defaults, so the older corpus keeps its meaning where that is 0), the rest is the grammar source.
 * Session 15: a second byte 0x7F (no corpus input had it) says a third byte holds more options
 * (fuzz_grammar_more: the JSON Schema indent layout and EBNF's root_rule) and the source follows it. Compiled grammars are
 * exercised through di_grammar_accepts and a short masked walk over a small vocabulary (built once:
 * it is not what is fuzzed). Also
 * replayed over fuzz/corpus/grammar by tests/grammar/test_grammar_fuzz_corpus.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static di_grammar_vocab *fuzz_vocab(void) {
  static di_grammar_vocab *v;
  if (v)
    return v;
  static char bytes[256];
  static const char *extra[] = {"{\"", "\":", "\",", "true", "null", "ab", "12", "\xc3\xa9", " \n", "\"}", "]]"};
  enum { N = 256 + 11 + 2 };
  const char *tb[N];
  size_t tl[N];
  for (int i = 0; i < 256; i++) {
    bytes[i] = (char)i;
    tb[i] = &bytes[i];
    tl[i] = 1;
  }
  for (int i = 0; i < 11; i++) {
    tb[256 + i] = extra[i];
    tl[256 + i] = strlen(extra[i]);
  }
  tb[N - 2] = NULL;
  tl[N - 2] = 0;
  tb[N - 1] = "</s>";
  tl[N - 1] = 4;
  int32_t stop = N - 1;
  if (di_grammar_vocab_create(N, tb, tl, &stop, 1, &v) != DI_OK)
    return NULL;
  return v;
}

/* The front end and options of an input whose first byte is b (the corpus replay test uses it too).
 * The JSON options (JSON Schema, Lark's %json) by bits of v: 1 strict, 2 XGrammar's separators with
 * any_whitespace=False, 4 tight bounds on strings and numbers, 8 unsupported keywords skipped and few
 * branches, 16 other separators (with 2 as well: invalid ones, so their validation is fuzzed too). */
static di_grammar_kind fuzz_grammar_options(uint8_t b, di_grammar_options *opt) {
  static const di_grammar_kind kinds[] = {DI_GRAMMAR_EBNF, DI_GRAMMAR_REGEX, DI_GRAMMAR_JSON_SCHEMA};
  memset(opt, 0, sizeof *opt);
  opt->max_elements = 50000; /* keep each run fast */
  opt->max_whitespace = b / 3 % 3;
  unsigned v = (b >= 0xC0 ? b - 0xC0u : b) / 9;
  opt->strict = v & 1;
  if (v & 4) {
    opt->max_string_length = 8;
    opt->max_digits = 3;
  }
  if (v & 8) {
    opt->ignore_unsupported_keywords = 1;
    opt->max_branches = 4;
  }
  const char *item = (v & 18) == 2 ? ", " : (v & 18) == 16 ? " ,\n\t" : (v & 18) == 18 ? ";" : "";
  const char *key = (v & 18) == 2 ? ": " : (v & 18) == 16 ? " : " : (v & 18) == 18 ? ": =" : "";
  memcpy(opt->item_separator, item, strlen(item) + 1);
  memcpy(opt->key_separator, key, strlen(key) + 1);
  return b >= 0xC0 ? DI_GRAMMAR_LARK : kinds[b % 3];
}

/* Session 15's options, from byte x after the 0x7F marker: bits 0-2 XGrammar's indent (0-7 spaces
 * per level; with an indent the whitespace slots are 0, as the layout requires), bits 3-4 EBNF's
 * root_rule (none, "a", "b", "value": names the fuzzer can write in the source). Bits 5-7 unused
 * (0: keep them so for later options). */
static void fuzz_grammar_more(uint8_t x, di_grammar_options *opt) {
  static const char *roots[] = {"", "a", "b", "value"};
  opt->indent = x & 7;
  if (opt->indent)
    opt->max_whitespace = 0;
  snprintf(opt->root_rule, sizeof opt->root_rule, "%s", roots[x >> 3 & 3]);
}

/* The whole input: front end, options and where the source starts (*src_at). */
static di_grammar_kind fuzz_grammar_input(const uint8_t *data, size_t size, di_grammar_options *opt, size_t *src_at) {
  di_grammar_kind kind = fuzz_grammar_options(data[0], opt);
  *src_at = 1;
  if (size >= 3 && data[1] == 0x7F) {
    fuzz_grammar_more(data[2], opt);
    *src_at = 3;
  }
  return kind;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  di_grammar_options opt;
  size_t at;
  di_grammar_kind kind = fuzz_grammar_input(data, size, &opt, &at);
  di_grammar *g = NULL;
  if (di_grammar_compile(kind, (const char *)data + at, size - at, &opt, &g) != DI_OK)
    return 0;
  /* one probe per input (the last byte picks it) and the source itself: each di_grammar_accepts
   * builds a fresh automaton runtime, which dominated the run time when all ten were tried */
  static const char *probes[] = {"", "a", "{}", "[1,2]", "{\"a\":1}", "abc", "\"x\"", "0", "null", "\xc3\xa9"};
  const char *probe = probes[data[size - 1] % (sizeof probes / sizeof probes[0])];
  (void)di_grammar_accepts(g, probe, strlen(probe));
  (void)di_grammar_accepts(g, (const char *)data + at, size - at);
  di_grammar_vocab *v = fuzz_vocab();
  di_grammar_matcher *m = NULL;
  if (v && di_grammar_matcher_create(g, v, &m) == DI_OK) {
    uint32_t mask[(256 + 13 + 31) / 32];
    for (int step = 0; step < 12; step++) {
      if (di_grammar_matcher_fill_mask(m, mask) != DI_OK)
        break;
      int pick = -1;
      for (int id = 0; id < 256 + 13; id++)
        if ((mask[id >> 5] >> (id & 31)) & 1u) {
          pick = id;
          if ((size_t)step < size && data[step] % 4 == (unsigned)id % 4)
            break;
        }
      if (pick < 0 || di_grammar_matcher_accept_token(m, pick) != DI_OK)
        break;
      if (step % 5 == 4)
        di_grammar_matcher_rollback(m, 1);
    }
    di_grammar_matcher_free(m);
  }
  di_grammar_free(g);
  return 0;
}
