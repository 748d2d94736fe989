/* Counter-based random numbers: a draw is a pure function of (seed, stream, counter), so a
 * request's samples never depend on what else ran, in what batch, or whether it was preempted
 * and recomputed. The mixer is SplitMix64's finaliser applied to a keyed combination (a
 * stateless generator in the spirit of Philox/Threefry, with 64-bit output). */
#ifndef DI_SAMPLER_RNG_H
#define DI_SAMPLER_RNG_H
#include <stdint.h>

uint64_t di_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter);
/* Uniform in [0, 1) with 53 random bits. */
double di_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
/* A seed for an unseeded request: distinct per call, from the engine's base seed. */
uint64_t di_rng_draw_seed(uint64_t *state);
#endif
