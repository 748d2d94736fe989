/* The table of environment switches (util/switches.h): every entry is listed in docs/switches.md,
 * every row of that doc's table is an entry, no file of src/ reads the environment itself, and the
 * boolean / integer readers follow their documented rules. */
#include "test_util.h"
#include "util/switches.h"
#include <stdlib.h>
#include <string.h>

static char *g_doc;

static void read_doc(const char *name, const char *rel, const char *data, size_t len, void *ctx) {
  (void)rel; (void)len; (void)ctx;
  if (strcmp(name, "switches.md") == 0) g_doc = strdup(data);
}

/* a file of src/ that calls getenv: only switches.c may */
static void no_getenv(const char *name, const char *rel, const char *data, size_t len, void *ctx) {
  (void)len; (void)ctx;
  if (strcmp(name, "switches.c") == 0) return;
  CHECKF(strstr(data, "getenv(") == NULL, "%s reads the environment outside util/switches.c", rel);
}

int main(void) {
  test_for_each_file("docs", read_doc, NULL);
  CHECKF(g_doc != NULL, "docs/switches.md missing");
  /* every entry: its exact row in the doc, and a unique name */
  for (int s = 0; s < DI_SW_COUNT && g_doc; s++) {
    char row[512];
    di_switch_markdown_row((di_switch)s, row, sizeof row);
    CHECKF(strstr(g_doc, row) != NULL, "docs/switches.md lacks the row %s (print them: deepinfer switches)", row);
    const di_switch_info *i = di_switch_info_of((di_switch)s);
    CHECKF(i && i->name && i->dflt && i->meaning, "switch %d has an empty table entry", s);
    for (int t = 0; t < s; t++) CHECK(strcmp(di_switch_info_of((di_switch)t)->name, i->name) != 0);
  }
  /* every row of the doc's switch table names an entry */
  int rows = 0;
  for (const char *p = g_doc; p && (p = strstr(p, "\n| `")) != NULL; p++) {
    const char *n0 = p + 4, *n1 = strchr(n0, '`');
    if (!n1) break;
    int found = 0;
    for (int s = 0; s < DI_SW_COUNT; s++) {
      const char *nm = di_switch_info_of((di_switch)s)->name;
      if ((size_t)(n1 - n0) == strlen(nm) && strncmp(n0, nm, (size_t)(n1 - n0)) == 0) found = 1;
    }
    CHECKF(found, "docs/switches.md lists %.*s, which is not in util/switches.c", (int)(n1 - n0), n0);
    rows++;
  }
  CHECKF(rows == DI_SW_COUNT, "docs/switches.md has %d rows, the table %d", rows, (int)DI_SW_COUNT);
  static const char *dirs[] = {"src/api", "src/arch", "src/backend", "src/backend/cpu", "src/backend/cuda", "src/chat",
                               "src/cli", "src/engine", "src/grammar", "src/kv", "src/model", "src/sampler",
                               "src/server", "src/tokenizer", "src/util"};
  for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) test_for_each_file(dirs[d], no_getenv, NULL);
  /* readers */
  setenv("DEEPINFER_CUDA_GRAPHS", "0", 1);
  CHECK(di_switch_bool(DI_SW_CUDA_GRAPHS, 1) == 0);
  setenv("DEEPINFER_CUDA_GRAPHS", "1", 1);
  CHECK(di_switch_bool(DI_SW_CUDA_GRAPHS, 0) == 1);
  setenv("DEEPINFER_CUDA_GRAPHS", "yes", 1);
  CHECK(di_switch_bool(DI_SW_CUDA_GRAPHS, 0) == 0 && di_switch_bool(DI_SW_CUDA_GRAPHS, 1) == 1);
  setenv("DEEPINFER_CUDA_GRAPHS", "", 1);
  CHECK(di_switch_get(DI_SW_CUDA_GRAPHS) == NULL && di_switch_bool(DI_SW_CUDA_GRAPHS, 1) == 1);
  unsetenv("DEEPINFER_CUDA_GRAPHS");
  CHECK(di_switch_get(DI_SW_CUDA_GRAPHS) == NULL);
  setenv("DEEPINFER_CUDA_OUT_CAP", "37", 1);
  CHECK(di_switch_int(DI_SW_CUDA_OUT_CAP, 16) == 37);
  unsetenv("DEEPINFER_CUDA_OUT_CAP");
  CHECK(di_switch_int(DI_SW_CUDA_OUT_CAP, 16) == 16);
  CHECK(di_switch_info_of(DI_SW_COUNT) == NULL && di_switch_get(DI_SW_COUNT) == NULL);
  free(g_doc);
  return test_finish("test_switches");
}
