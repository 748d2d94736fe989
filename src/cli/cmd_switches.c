/* `deepinfer switches`: the table of environment switches (util/switches.h), as the Markdown rows of
 * docs/switches.md, with each one's value in this environment when --values is given. */
#include "cli.h"
#include "util/switches.h"
#include <string.h>

int di_cmd_switches(int argc, char **argv) {
  int values = 0;
  for (int i = 1; i < argc; i++) {
    if (di_cli_is_help(argv[i])) {
      printf("usage: deepinfer switches [--values]\n\n"
             "Prints every environment switch the library reads (name, default, meaning) as the rows of the\n"
             "table in docs/switches.md; --values adds each one's value in this environment.\n");
      return 0;
    }
    if (strcmp(argv[i], "--values") == 0) {
      values = 1;
      continue;
    }
    fprintf(stderr, "deepinfer switches: unknown argument '%s'\n", argv[i]);
    return 2;
  }
  printf("| switch | default | meaning |%s\n| --- | --- | --- |%s\n", values ? " value |" : "", values ? " --- |" : "");
  for (int s = 0; s < DI_SW_COUNT; s++) {
    char row[512];
    di_switch_markdown_row((di_switch)s, row, sizeof row);
    const char *v = di_switch_get((di_switch)s);
    if (values) printf("%s %s |\n", row, v ? v : "(unset)");
    else printf("%s\n", row);
  }
  return 0;
}
