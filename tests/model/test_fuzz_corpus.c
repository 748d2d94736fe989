/* Replays the fuzz corpora of the model-file parsers (fuzz/corpus/safetensors, fuzz/corpus/config)
 * through the same entry points the fuzz targets use, and checks the expected verdicts of the seed
 * files whose names say what they are (good_* parse, the rest fail with a message). */
#include "model/config.h"
#include "model/safetensors.h"
#include "util/json.h"
#include "test_util.h"
#include <stdlib.h>

static void replay_config(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  di_model_config c;
  di_status st = di_model_config_parse(buf, len, NULL, 0, &c);
  if (strncmp(name, "dsv", 3) == 0)
    CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
  else if (st != DI_OK)
    CHECK(di_last_error()[0] != 0);
}

static void replay_safetensors(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  di_st_file f;
  di_status st = di_st_parse((const uint8_t *)buf, len, rel, &f);
  if (strncmp(name, "good", 4) == 0)
    CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
  if (st == DI_OK)
    di_st_file_close(&f);
  else
    CHECK(strstr(di_last_error(), name) != NULL); /* names the file */
}

int main(void) {
  CHECK(test_for_each_file("fuzz/corpus/safetensors", replay_safetensors, NULL) >= 5);
  CHECK(test_for_each_file("fuzz/corpus/config", replay_config, NULL) >= 4);
  return test_finish("test_fuzz_corpus");
}
