/* Flag parsing helpers shared by the subcommands (see cli.h). */
#include "cli.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int di_cli_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

int di_cli_flag_value(int argc, char **argv, int *i, const char *name, const char **value, int *err) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0)
    return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != 0)
    return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "deepinfer: %s needs a value\n", name);
    *err = 1;
    return 1;
  }
  *value = argv[++*i];
  return 1;
}

const char *di_cli_default_model_dir(void) {
  const char *env = getenv("DEEPINFER_HF_MODEL_DIR");
  if (env && *env)
    return env;
  /* the shipped model: next to the executable's source tree, or installed share dir */
  static char path[4096];
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      const char *cands[] = {"%s/../models/default", "%s/../../models/default", "%s/../share/deepinfer/models/default"};
      for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, cands[k], exe);
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (access(cfg, R_OK) == 0)
          return path;
      }
    }
  }
  return "models/default";
}
