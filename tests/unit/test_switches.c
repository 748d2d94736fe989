/* The table of environment switches (util/switches.h): every entry is listed in docs/switches.md,
 * every row of that doc's table is an entry, no file of src/ reads the environment itself, and the
 * boolean / integer readers follow their documented rules. */
#include "test_util.h"
#include "util/switches.h"
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

static char *g_doc;

static void read_doc(const char *name, const char *rel, const char *data, size_t len, void *ctx) {
  (void)rel; (void)len; (void)ctx;
  if (strcmp(name, "switches.md") == 0) g_doc = strdup(data);
}

/* every file below src/ (recursively): none but util/switches.c calls getenv; returns the files seen */
static int no_getenv(const char *dir) {
  DIR *d = opendir(dir);
  CHECKF(d != NULL, "cannot open %s", dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode)) {
      n += no_getenv(path);
      continue;
    }
    if (!S_ISREG(sb.st_mode) || strcmp(e->d_name, "switches.c") == 0) continue;
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    char *buf = malloc((size_t)sb.st_size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)sb.st_size, f) : 0;
    fclose(f);
    if (!buf) continue;
    buf[got] = 0;
    CHECKF(strstr(buf, "getenv(") == NULL, "%s reads the environment outside util/switches.c", path);
    free(buf);
    n++;
  }
  closedir(d);
  return n;
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
  CHECKF(no_getenv(test_path("src")) > 100, "too few files seen below src/");
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
