/* `deepinfer generate`: generate a continuation of a prompt with the engine (minimal placeholder
 * while the engine is being written; it reports that generation is not available yet). */
#include "cli.h"
#include <stdio.h>

int di_cmd_generate(int argc, char **argv);

int di_cmd_generate(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (di_cli_is_help(argv[i])) {
      printf("usage: deepinfer generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]\n");
      return 0;
    }
  fprintf(stderr, "deepinfer generate: the engine is not built yet\n");
  return 1;
}
