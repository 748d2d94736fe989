/* Launch policy shared by the kernels: whether programmatic dependent launch is on
 * (DEEPINFER_CUDA_PDL=0 turns it off, for A/B measurements and as a fallback). */
#include "cuda_common.cuh"
#include <stdlib.h>

int di_cu_pdl_enabled(void) {
  static int on = -1; /* read once; a benign race writes the same value */
  if (on < 0) {
    const char *e = getenv("DEEPINFER_CUDA_PDL");
    on = !(e && e[0] == '0');
  }
  return on;
}
