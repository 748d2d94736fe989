/* Requests for engine tests: the parameters most tests give (a prompt as ids or text, max_tokens,
 * temperature, a seed, ignore_eos) and what a request got back, collected from the step outputs while
 * the engine runs to its end. Tests keep their own request records with a test_got inside (at the same
 * offset in each record of an array: test_run_to_end finds a request's record from its id, the ids of
 * the array's requests being consecutive, as di_engine_add_request hands them out). Header-only. */
#ifndef DI_TEST_REQUESTS_H
#define DI_TEST_REQUESTS_H
#include "test_util.h"
#include "deepinfer.h"
#include <stddef.h>

#define TEST_GOT_TOKENS 256 /* tokens kept per request (more are dropped: a count check then fails) */

typedef struct test_got {
  int32_t tok[TEST_GOT_TOKENS];
  int n, finish; /* tokens kept, the finish reason (0 while running) */
  uint64_t id;
} test_got;

/* greedy when temperature <= 0, else seeded; ids NULL: the prompt is text */
static inline di_request_params test_params(const char *text, const int32_t *ids, int n_ids, int max_tokens,
                                            float temperature, uint64_t seed) {
  di_request_params p;
  di_request_params_default(&p);
  if (ids) {
    p.prompt_ids = ids;
    p.n_prompt_ids = n_ids;
  } else {
    p.prompt = text;
  }
  p.max_tokens = max_tokens;
  p.temperature = temperature > 0 ? temperature : 0;
  p.ignore_eos = 1;
  p.has_seed = 1;
  p.seed = seed;
  return p;
}

/* adds the request (its record reset); a failure is a failed check naming `what` */
static inline void test_add(di_engine *e, const di_request_params *p, test_got *g, const char *what) {
  g->n = g->finish = 0;
  CHECKF(di_engine_add_request(e, p, &g->id) == DI_OK, "%s: add: %s", what, di_last_error());
}

/* the record of request `id` among n records starting at first, stride bytes apart */
static inline test_got *test_got_of(test_got *first, size_t stride, int n, uint64_t id) {
  const uint64_t k = id - first->id;
  return k < (uint64_t)n ? (test_got *)((char *)first + k * stride) : NULL;
}

/* steps e until nothing is unfinished (at most max_steps), each output's tokens and finish into its
 * record; on_step (may be NULL) after each step with the step count; returns the steps taken, -1 when
 * one failed (a failed check naming `what`) */
static inline int test_run_to_end(di_engine *e, test_got *first, size_t stride, int n, int max_steps,
                                  void (*on_step)(di_engine *e, int step, void *ctx), void *ctx, const char *what) {
  int steps = 0;
  while (di_engine_has_unfinished(e) && steps < max_steps) {
    di_step_output *out;
    if (di_engine_step(e, &out) != DI_OK) {
      CHECKF(0, "%s: step: %s", what, di_last_error());
      return -1;
    }
    steps++;
    for (int i = 0; i < out->n; i++) {
      const di_seq_output *so = &out->seqs[i];
      test_got *g = test_got_of(first, stride, n, so->req_id);
      if (!g) continue;
      for (int t = 0; t < so->n_new_tokens && g->n < TEST_GOT_TOKENS; t++) g->tok[g->n++] = so->new_tokens[t];
      if (so->finish_reason) g->finish = so->finish_reason;
    }
    if (on_step) on_step(e, steps, ctx);
  }
  return steps;
}

/* the same tokens and finish */
static inline int test_got_equal(const test_got *a, const test_got *b) {
  return a->n == b->n && a->finish == b->finish && memcmp(a->tok, b->tok, sizeof(int32_t) * (size_t)a->n) == 0;
}
#endif
