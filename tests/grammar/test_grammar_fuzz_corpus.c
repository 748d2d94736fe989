/* Replays fuzz/corpus/grammar through the fuzz target's entry point (crashes and sanitizer
 * reports are the failures), and checks that the hand-written seeds compile with the options their
 * first byte gives (fuzz_grammar_options; bad_* seeds must be refused instead; found_* and fuzzed_*
 * are fuzzer inputs, replayed only), and that the seeds of EXPECT hold their options (each accepts
 * one document and refuses another). */
#include <stdlib.h>
#include "../../fuzz/fuzz_grammar.c"
#include "test_util.h"
#include "util/json.h"

/* Seeds whose options must have taken effect (session 15's marker byte: indent, root_rule): a
 * document the grammar accepts and one it refuses. */
static const struct {
  const char *name, *yes, *no;
} EXPECT[] = {
    {"s15_schema_indent2", "{\n  \"a\": 1,\n  \"b\": [\n    2,\n    3\n  ]\n}", "{\"a\": 1, \"b\": [2, 3]}"},
    {"s15_schema_indent4_xgrammar_separators", "{\n    \"a\": 1, \n    \"b\": []\n}", "{\n  \"a\": 1,\n  \"b\": []\n}"},
    {"s15_schema_indent_ref", "{\n   \"x\": [\n      true\n   ],\n   \"y\": {\n      \"z\": []\n   }\n}",
     "{\"x\": [true], \"y\": {\"z\": []}}"},
    {"s15_ebnf_root_a", "xy", "r"},
    {"s15_ebnf_root_value_attr", "<abc>", "<abcd>"},
};
static int expect_seen;

static void replay(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
  if (len > 0 && strstr(name, "_") && !strstr(name, "leftrec") && strncmp(name, "crash", 5) != 0 &&
      strncmp(name, "found", 5) != 0 && strncmp(name, "fuzzed", 6) != 0) {
    di_grammar_options opt;
    size_t at;
    di_grammar_kind kind = fuzz_grammar_input((const uint8_t *)buf, len, &opt, &at);
    opt.max_elements = 0; /* the seeds are checked at the default size bound */
    di_grammar *g = NULL;
    di_status st = di_grammar_compile(kind, buf + at, len - at, &opt, &g);
    if (strncmp(name, "bad_", 4) == 0)
      CHECKF(st != DI_OK, "%s: compiled, but a bad_ seed must be refused", rel);
    else
      CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
    for (size_t i = 0; st == DI_OK && i < sizeof EXPECT / sizeof EXPECT[0]; i++)
      if (strcmp(name, EXPECT[i].name) == 0) {
        expect_seen++;
        CHECKF(di_grammar_accepts(g, EXPECT[i].yes, strlen(EXPECT[i].yes)), "%s: refuses %s", rel, EXPECT[i].yes);
        CHECKF(!di_grammar_accepts(g, EXPECT[i].no, strlen(EXPECT[i].no)), "%s: accepts %s", rel, EXPECT[i].no);
      }
    di_grammar_free(g);
  }
}

int main(void) {
  int n = test_for_each_file("fuzz/corpus/grammar", replay, NULL);
  CHECKF(n >= 10, "only %d corpus files", n);
  CHECKF(expect_seen == (int)(sizeof EXPECT / sizeof EXPECT[0]), "%d of the seeds with expectations found", expect_seen);
  return test_finish("test_grammar_fuzz_corpus");
}
