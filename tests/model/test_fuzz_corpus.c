/* Replays the fuzz corpora of the model-file parsers (fuzz/corpus/safetensors, fuzz/corpus/config)
 * through the same entry points the fuzz targets use, and checks the expected verdicts of the seed
 * files whose names say what they are (good_* parse, the rest fail with a message). */
#include "model/config.h"
#include "model/safetensors.h"
#include "util/json.h"
#include "test_util.h"
#include <dirent.h>
#include <stdlib.h>

static int replay(const char *dir, int is_config) {
  DIR *d = opendir(test_path(dir));
  CHECKF(d != NULL, "cannot open %s", dir);
  if (!d)
    return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char rel[1024];
    snprintf(rel, sizeof rel, "%s/%s", dir, e->d_name);
    char *buf;
    size_t len;
    if (di_read_file(test_path(rel), &buf, &len) != DI_OK)
      continue;
    n++;
    if (is_config) {
      di_model_config c;
      di_status st = di_model_config_parse(buf, len, NULL, 0, &c);
      if (strncmp(e->d_name, "dsv", 3) == 0)
        CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
      else if (st != DI_OK)
        CHECK(di_last_error()[0] != 0);
    } else {
      di_st_file f;
      di_status st = di_st_parse((const uint8_t *)buf, len, rel, &f);
      if (strncmp(e->d_name, "good", 4) == 0)
        CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
      if (st == DI_OK)
        di_st_file_close(&f);
      else
        CHECK(strstr(di_last_error(), e->d_name) != NULL); /* names the file */
    }
    free(buf);
  }
  closedir(d);
  return n;
}

int main(void) {
  CHECK(replay("fuzz/corpus/safetensors", 0) >= 5);
  CHECK(replay("fuzz/corpus/config", 1) >= 4);
  return test_finish("test_fuzz_corpus");
}
