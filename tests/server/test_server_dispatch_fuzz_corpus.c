/* Replays the server-dispatch fuzz corpus (fuzz/corpus/server_dispatch/) through the fuzz target
 * itself (method, path, headers and body through di_srv_dispatch with no socket), so every input the
 * fuzzer once found stays fixed under the normal and sanitizer test runs. The target traps on a
 * request answered twice or not at all, a status outside 200..599, or a header with CR / LF; the
 * seeds' statuses are checked here too, so a route that stopped answering as it did fails. */
#include <stdlib.h>
#include <string.h>
#include "../../fuzz/fuzz_server_dispatch.c"
#include "test_util.h"

/* the fuzz target itself, then the status it answered with against the seed's */
static void replay(const char *name, const char *rel, const char *data, size_t n, void *count) {
  (void)rel;
  (*(int *)count)++;
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
  struct { const char *seed; unsigned status; } expect[] = {
      {"ok_tokenize_prompt", 200}, {"ok_tokenize_messages", 200}, {"ok_detokenize", 200},
      {"bad_detokenize_range", 400}, {"bad_detokenize_model", 404}, {"bad_tokenize_body", 400},
      {"unauthorized", 401}, {"no_key", 401}, {"models", 200}, {"model_card", 200}, {"model_missing", 404},
      {"version", 200}, {"preflight", 200}, {"wrong_method", 405}, {"unknown_route", 404}};
  for (size_t i = 0; i < sizeof expect / sizeof *expect; i++)
    if (strcmp(name, expect[i].seed) == 0)
      CHECKF(fuzz_server_dispatch_last_status == expect[i].status, "%s: status %u, expected %u", name,
             fuzz_server_dispatch_last_status, expect[i].status);
}

int main(void) {
  char root[4096];
  snprintf(root, sizeof root, "%s", test_path(""));
  setenv("DI_SOURCE_DIR", root, 1); /* the target's tokenizer and template: engine-dummy's */
  int seen = 0;
  int files = test_for_each_file("fuzz/corpus/server_dispatch", replay, &seen);
  CHECKF(files >= 15 && seen == files, "only %d corpus files", files);
  CHECKF(tok && tmpl, "the engine-dummy tokenizer and template did not load");
  fuzz_server_dispatch_cleanup();
  return test_finish("test_server_dispatch_fuzz_corpus");
}
