/* libFuzzer target: the safetensors header parser on arbitrary bytes. Any input must give either
 * a parsed file whose every tensor lies inside the buffer, or an error; never a crash. */
#include "model/safetensors.h"
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  di_st_file f;
  if (di_st_parse(data, size, "fuzz", &f) == DI_OK) {
    for (int i = 0; i < f.n_tensors; i++) {
      const uint8_t *p = f.tensors[i].data;
      if (p < data || p + f.tensors[i].nbytes > data + size)
        abort();
    }
    di_st_file_close(&f);
  }
  return 0;
}
