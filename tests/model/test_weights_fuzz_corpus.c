/* Replays the weight-binding fuzz corpus (fuzz/corpus/weights/: FP8 with F32 and E8M0 block scales,
 * MXFP4 blocks + scales, MXFP4 as the loader binds it (I8 / U8 + F8_E8M0 `.scale` / `_scale_inv`), and
 * their malformed variants) through the fuzz target, so every input the
 * fuzzer once found stays fixed under the normal and sanitizer runs; the seeds it knows are checked
 * for what they must bind (an FP8 weight per well-formed FP8 seed, none for a missing block size,
 * missing or misshapen scales; an MXFP4 weight per well-formed pair). */
#include "../../fuzz/fuzz_weights.c"
#include "test_util.h"

typedef struct { int files, checked; } replay_ctx;

static void replay(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  (void)rel;
  replay_ctx *c = ctx;
  c->files++;
  LLVMFuzzerTestOneInput((const uint8_t *)data, n);
  /* mxfp4: the target's own blocks/scales pairing; loader: MXFP4 bound by di_tensor_source_weight */
  static const struct { const char *name; int fp8, mxfp4, loader; } want[] = {
      {"fp8_f32_scales", 1, 0, 0},      {"fp8_e8m0_scales", 1, 0, 0},     {"fp8_blocks_3x5", 1, 0, 0},
      {"fp8_no_block", 0, 0, 0},        {"fp8_bad_scale_shape", 0, 0, 0}, {"fp8_missing_scales", 0, 0, 0},
      {"mxfp4_pair", 0, 1, 0},          {"mxfp4_partial", 0, 1, 0},       {"mxfp4_bad_scales", 0, 0, 0},
      {"mixed", 0, 0, 0},               {"mxfp4_loader_scale", 0, 0, 1},  {"mxfp4_loader_scale_inv", 0, 0, 1},
      {"mxfp4_loader_partial", 0, 0, 1}, {"mxfp4_loader_bad_scale_dtype", 0, 0, 0},
      {"mxfp4_loader_bad_scale_shape", 0, 0, 0}, {"mxfp4_loader_no_scale", 0, 0, 0}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (strcmp(name, want[i].name) == 0) {
      c->checked++;
      CHECKF(fuzz_weights_fp8 == want[i].fp8 && fuzz_weights_mxfp4 == want[i].mxfp4 &&
                 fuzz_weights_mxfp4_loader == want[i].loader,
             "%s: bound %d FP8, %d MXFP4 pairs, %d MXFP4 by the loader; expected %d, %d, %d", name, fuzz_weights_fp8,
             fuzz_weights_mxfp4, fuzz_weights_mxfp4_loader, want[i].fp8, want[i].mxfp4, want[i].loader);
    }
}

int main(void) {
  replay_ctx c = {0, 0};
  int files = test_for_each_file("fuzz/corpus/weights", replay, &c);
  CHECKF(files >= 10 && c.files == files && c.checked == 16, "%d corpus files, %d known seeds checked", files, c.checked);
  return test_finish("test_weights_fuzz_corpus");
}
