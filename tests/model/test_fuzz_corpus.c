/* Replays the fuzz corpora of the model-file parsers (fuzz/corpus/safetensors, fuzz/corpus/config,
 * the latter through fuzz_config.c's split into config.json and generation_config.json)
 * through the same entry points the fuzz targets use, and checks the expected verdicts of the seed
 * files whose names say what they are (good_* parse, the rest fail with a message). */
#include "../../fuzz/fuzz_config.c"
/* the safetensors target itself too (its bounds check on every parsed tensor) */
#define LLVMFuzzerTestOneInput fuzz_safetensors_one
#include "../../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#include "model/safetensors.h"
#include "util/json.h"
#include "test_util.h"
#include <stdlib.h>

static void replay_config(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  di_model_config c;
  di_status st = fuzz_config_parse(buf, len, &c); /* config.json [+ generation_config.json] */
  if (strncmp(name, "dsv", 3) == 0)
    CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
  else if (st != DI_OK)
    CHECK(di_last_error()[0] != 0);
  if (strcmp(name, "dsv3_with_generation_config") == 0) /* the second file was read */
    CHECKF(c.gen_top_k == 20 && c.n_eos == 2, "%s: top_k %d, %d eos ids", rel, c.gen_top_k, c.n_eos);
  if (strncmp(name, "bad_generation_config", 21) == 0)
    CHECKF(st != DI_OK && strstr(di_last_error(), "generation_config.json"), "%s: %s", rel, di_last_error());
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
  CHECK(test_fuzz_replay("fuzz/corpus/safetensors", fuzz_safetensors_one) >= 5);
  CHECK(test_fuzz_replay("fuzz/corpus/config", LLVMFuzzerTestOneInput) >= 4);
  return test_finish("test_fuzz_corpus");
}
