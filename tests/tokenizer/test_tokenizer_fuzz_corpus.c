/* Replays the tokenizer fuzz corpus (fuzz/corpus/tokenizer/) through the fuzz target itself, so
 * every crash the fuzzer once found stays fixed under the normal and sanitizer test runs. The
 * target aborts if a streamed decode ever differs from the full decode. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include "../../fuzz/fuzz_tokenizer.c"
#include "test_util.h"
#include "util/json.h"

int main(void) {
  const char *dir = test_path("fuzz/corpus/tokenizer");
  DIR *d = opendir(dir);
  CHECKF(d != NULL, "cannot open %s", dir);
  if (!d)
    return test_finish("test_tokenizer_fuzz_corpus");
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *data;
    size_t n;
    if (di_read_file(path, &data, &n) != DI_OK)
      continue;
    LLVMFuzzerTestOneInput((const uint8_t *)data, n);
    free(data);
    files++;
  }
  closedir(d);
  fuzz_tokenizer_cleanup();
  CHECKF(files >= 10, "only %d corpus files", files);
  return test_finish("test_tokenizer_fuzz_corpus");
}
