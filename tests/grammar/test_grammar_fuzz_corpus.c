/* Replays fuzz/corpus/grammar through the fuzz target's entry point (crashes and sanitizer
 * reports are the failures), and checks that the hand-written seeds compile (found_* and fuzzed_*
 * are fuzzer inputs, replayed only). */
#include <dirent.h>
#include <stdlib.h>
#include "../../fuzz/fuzz_grammar.c"
#include "test_util.h"
#include "util/json.h"

int main(void) {
  const char *dir = "fuzz/corpus/grammar";
  DIR *d = opendir(test_path(dir));
  CHECKF(d != NULL, "cannot open %s", dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char rel[1024];
    snprintf(rel, sizeof rel, "%s/%s", dir, e->d_name);
    char *buf;
    size_t len;
    if (di_read_file(test_path(rel), &buf, &len) != DI_OK)
      continue;
    n++;
    LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
    if (len > 0 && strstr(e->d_name, "_") && !strstr(e->d_name, "leftrec") && strncmp(e->d_name, "crash", 5) != 0 &&
        strncmp(e->d_name, "found", 5) != 0 && strncmp(e->d_name, "fuzzed", 6) != 0) {
      static const di_grammar_kind kinds[] = {DI_GRAMMAR_EBNF, DI_GRAMMAR_REGEX, DI_GRAMMAR_JSON_SCHEMA};
      di_grammar_options opt = {0};
      opt.max_whitespace = (unsigned char)buf[0] / 3 % 3;
      di_grammar *g = NULL;
      di_status st = di_grammar_compile(kinds[(unsigned char)buf[0] % 3], buf + 1, len - 1, &opt, &g);
      CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
      di_grammar_free(g);
    }
    free(buf);
  }
  if (d)
    closedir(d);
  CHECKF(n >= 10, "only %d corpus files", n);
  return test_finish("test_grammar_fuzz_corpus");
}
