/* Replays fuzz/corpus/grammar through the fuzz target's entry point (crashes and sanitizer
 * reports are the failures), and checks that the hand-written seeds compile (found_* and fuzzed_*
 * are fuzzer inputs, replayed only). */
#include <stdlib.h>
#include "../../fuzz/fuzz_grammar.c"
#include "test_util.h"
#include "util/json.h"

static void replay(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
  if (len > 0 && strstr(name, "_") && !strstr(name, "leftrec") && strncmp(name, "crash", 5) != 0 &&
      strncmp(name, "found", 5) != 0 && strncmp(name, "fuzzed", 6) != 0) {
    static const di_grammar_kind kinds[] = {DI_GRAMMAR_EBNF, DI_GRAMMAR_REGEX, DI_GRAMMAR_JSON_SCHEMA};
    di_grammar_options opt = {0};
    opt.max_whitespace = (unsigned char)buf[0] / 3 % 3;
    di_grammar *g = NULL;
    unsigned char k = (unsigned char)buf[0];
    di_status st = di_grammar_compile(k >= 0xC0 ? DI_GRAMMAR_LARK : kinds[k % 3], buf + 1, len - 1, &opt, &g);
    CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
    di_grammar_free(g);
  }
}

int main(void) {
  int n = test_for_each_file("fuzz/corpus/grammar", replay, NULL);
  CHECKF(n >= 10, "only %d corpus files", n);
  return test_finish("test_grammar_fuzz_corpus");
}
