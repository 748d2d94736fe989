/* Counter-based generator (see rng.h). */
#include "sampler/rng.h"

static uint64_t fmix(uint64_t x) {
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27; x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t di_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
  /* three rounds keyed by the seed: every input bit reaches every output bit */
  uint64_t k = fmix(seed + 0x9e3779b97f4a7c15ULL);
  uint64_t x = fmix(k ^ (stream * 0xd1342543de82ef95ULL + 0x632be59bd9b4e019ULL));
  x = fmix(x ^ (counter + k));
  return fmix(x + 0x9e3779b97f4a7c15ULL * (counter ^ stream));
}

double di_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
  return (double)(di_rng_u64(seed, stream, counter) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t di_rng_draw_seed(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ULL;
  return fmix(*state);
}
