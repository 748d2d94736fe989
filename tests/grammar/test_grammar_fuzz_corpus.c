/* Replays fuzz/corpus/grammar through the fuzz target's entry point (crashes and sanitizer
 * reports are the failures), and checks that the hand-written seeds compile with the options their
 * first byte gives (fuzz_grammar_options; bad_* seeds must be refused instead; found_* and fuzzed_*
 * are fuzzer inputs, replayed only). */
#include <stdlib.h>
#include "../../fuzz/fuzz_grammar.c"
#include "test_util.h"
#include "util/json.h"

static void replay(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
  if (len > 0 && strstr(name, "_") && !strstr(name, "leftrec") && strncmp(name, "crash", 5) != 0 &&
      strncmp(name, "found", 5) != 0 && strncmp(name, "fuzzed", 6) != 0) {
    di_grammar_options opt;
    di_grammar_kind kind = fuzz_grammar_options((uint8_t)buf[0], &opt);
    opt.max_elements = 0; /* the seeds are checked at the default size bound */
    di_grammar *g = NULL;
    di_status st = di_grammar_compile(kind, buf + 1, len - 1, &opt, &g);
    if (strncmp(name, "bad_", 4) == 0)
      CHECKF(st != DI_OK, "%s: compiled, but a bad_ seed must be refused", rel);
    else
      CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
    di_grammar_free(g);
  }
}

int main(void) {
  int n = test_for_each_file("fuzz/corpus/grammar", replay, NULL);
  CHECKF(n >= 10, "only %d corpus files", n);
  return test_finish("test_grammar_fuzz_corpus");
}
