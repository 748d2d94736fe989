/* The sampling parameters' accepted ranges (see sampling_ranges.h). The numbers are the server's
 * historical ones (OpenAI's: temperature >= 0, top_p in (0, 1], penalties in [-2, 2]; vLLM's extras). */
#include "sampler/sampling_ranges.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#define INT32_HI 2147483647.0

static const di_sampling_range RANGES[] = {
    {"temperature", 0, 1e6, 0},
    {"top_p", 1e-9, 1, 0},
    {"top_k", -1, INT32_HI, 1}, /* -1 and 0: off */
    {"min_p", 0, 1, 0},
    {"presence_penalty", -2, 2, 0},
    {"frequency_penalty", -2, 2, 0},
    {"repetition_penalty", 1e-6, 1e6, 0},
    {"min_tokens", 0, INT32_HI, 1},
    {"n", 1, 1024, 1},
};

const di_sampling_range *di_sampling_range_find(const char *name) {
  for (size_t i = 0; i < sizeof RANGES / sizeof RANGES[0]; i++)
    if (strcmp(RANGES[i].name, name) == 0) return &RANGES[i];
  return NULL;
}

int di_sampling_range_check(const di_sampling_range *r, double v, char *msg, size_t msg_size) {
  if (!isfinite(v)) {
    snprintf(msg, msg_size, "must be a number");
    return 0;
  }
  if (r->integer && v != floor(v)) {
    snprintf(msg, msg_size, "must be an integer");
    return 0;
  }
  if (v < r->lo || v > r->hi) {
    if (r->integer) snprintf(msg, msg_size, "must be in [%.0f, %.0f], got %.0f", r->lo, r->hi, v);
    else snprintf(msg, msg_size, "must be in [%g, %g], got %g", r->lo, r->hi, v);
    return 0;
  }
  return 1;
}
