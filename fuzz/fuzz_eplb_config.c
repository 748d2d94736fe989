/* libFuzzer target: `--eplb-config` JSON (src/dist/dist.c, di_dist_parse_eplb_config), the expert
 * load balancer's settings a launcher or user passes to serve / generate. Any input is refused with a
 * message or read into settings inside the bounds the parser promises (num_redundant_experts in
 * [0, 1e6], window_size and step_interval in [1, 1e6], fields not named keep their value); anything
 * else is a crash here. Replayed by tests/dist/test_eplb_config_fuzz_corpus.c. */
#include "dist/dist.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fuzz_eplb_accepted; /* the last input was read (for the replay test's seed checks) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_eplb_accepted = 0;
  char *json = malloc(size + 1); /* the flag's value is a C string */
  if (!json) return 0;
  memcpy(json, data, size);
  json[size] = 0;
  /* a sentinel apart from every accepted value, so an untouched field is seen as such */
  const di_ep_config before = {.enable_eplb = 7, .num_redundant_experts = -5, .window_size = -5, .step_interval = -5};
  di_ep_config c = before;
  char err[256];
  err[0] = 0;
  if (di_dist_parse_eplb_config(json, &c, err, sizeof err) == 0) {
    int ok = c.enable_eplb == 7 &&
             (c.num_redundant_experts == -5 || (c.num_redundant_experts >= 0 && c.num_redundant_experts <= 1000000)) &&
             (c.window_size == -5 || (c.window_size >= 1 && c.window_size <= 1000000)) &&
             (c.step_interval == -5 || (c.step_interval >= 1 && c.step_interval <= 1000000));
    if (!ok) __builtin_trap();
    fuzz_eplb_accepted = 1;
  } else if (!err[0] || !memchr(err, 0, sizeof err)) {
    __builtin_trap(); /* a refusal names its cause */
  }
  free(json);
  return 0;
}
