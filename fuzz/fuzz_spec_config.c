/* libFuzzer target: the speculative-decoding config (`--speculative-config JSON`, vLLM's flag). The
 * parser is a static function of the `generate` command (src/cli/cmd_generate.c), so the target
 * goes in through the command's own entry point, which is also what keeps it current when the
 * config grows fields (the DSpark drafter's, say): argv = generate --speculative-config <input>
 * --output-format ? . The last flag is always refused after the flags are read (exit 2 before any
 * model is loaded), so each run is the config's parse and checks alone; a config the parser takes
 * reaches it, one it refuses returns 2 at once. The command's sources are compiled in here (the
 * library does not hold the CLI). Replayed by tests/unit/test_spec_config_fuzz_corpus.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../src/cli/cli_util.c"
#include "../src/cli/cmd_generate.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0; /* a flag's value is a C string: it ends at the first NUL, as argv would */
  char *argv[] = {"generate", "--speculative-config", text, "--output-format", "?", NULL};
  int rc = di_cmd_generate(5, argv);
  if (rc != 2) __builtin_trap(); /* either the config or the output format is refused */
  free(text);
  return 0;
}
