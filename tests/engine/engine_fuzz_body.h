/* One fuzz case for the engine's state machine (used by fuzz/fuzz_engine.c and replayed by
 * tests/engine/test_engine_fuzz_corpus.c): the input bytes choose the engine options (pool size,
 * budgets, async, chunking, prefix caching, device sampling) and a sequence of operations (add a
 * request with random length / sampling / stop strings / n, abort, step) on the mock backend. After
 * every step the block accounting must hold and the mock must never read a KV slot that was not
 * written for that position; at the end, with everything aborted and drained, no block is in use.
 * Returns the number of violations (0 = fine). */
#ifndef DI_TEST_ENGINE_FUZZ_BODY_H
#define DI_TEST_ENGINE_FUZZ_BODY_H
#include "mock_backend.h"
#include <stdio.h>

typedef struct fz_in {
  const uint8_t *p;
  size_t n, i;
} fz_in;

static int fz_byte(fz_in *in) { return in->i < in->n ? in->p[in->i++] : 0; }

static int engine_fuzz_one(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  di_engine_options o;
  di_engine_options_default(&o);
  o.num_kv_blocks = 3 + fz_byte(&in) % 40;
  o.max_num_seqs = 1 + fz_byte(&in) % 16;
  o.max_num_batched_tokens = 4 + fz_byte(&in) % 300;
  int flags = fz_byte(&in);
  o.async_scheduling = flags & 1;
  o.enable_chunked_prefill = !(flags & 2);
  o.enable_prefix_caching = !(flags & 4);
  o.seed = 1;
  mock_backend *mb = mock_backend_new(40);
  if (flags & 8) mb->base.ops = &MOCK_OPS_DEV;
  di_engine *e;
  if (mock_engine(mb, &o, 1, 600, &e) != DI_OK) {
    mock_destroy(&mb->base);
    return 1;
  }
  int bad = 0, steps = 0;
  uint64_t ids[64];
  int n_ids = 0;
  int32_t prompt[512];
  const char *stop_pool[4] = {"a", "bc", "zz", "q"};
  while (in.i < in.n && steps < 4000) {
    int op = fz_byte(&in) % 8;
    if (op < 3) {
      di_request_params p;
      di_request_params_default(&p);
      int len = 1 + fz_byte(&in) * 2;
      int shared = fz_byte(&in);
      for (int k = 0; k < len; k++) prompt[k] = 2 + (k < shared ? k % 30 : (k * 7 + shared) % 38);
      p.prompt_ids = prompt;
      p.n_prompt_ids = len;
      int s = fz_byte(&in);
      p.max_tokens = 1 + s % 20;
      p.temperature = (s & 32) ? 1.0f : 0.0f;
      p.top_k = (s & 64) ? 5 : 0;
      p.n = (s & 128) ? 2 : 1;
      p.ignore_eos = s & 16;
      p.logprobs = (s & 8) ? 2 : -1;
      p.repetition_penalty = (s & 4) ? 1.2f : 1.0f;
      const char *stops[1] = {stop_pool[s & 3]};
      if (s & 2) { p.stop = stops; p.n_stop = 1; }
      uint64_t id;
      if (di_engine_add_request(e, &p, &id) == DI_OK && n_ids < 64) ids[n_ids++] = id;
    } else if (op == 3) {
      if (n_ids) di_engine_abort(e, ids[fz_byte(&in) % n_ids]);
    } else {
      di_step_output *out;
      if (di_engine_step(e, &out) != DI_OK) { bad++; break; }
      steps++;
      if (di_engine_check(e) != DI_OK) { fprintf(stderr, "fuzz: %s\n", di_last_error()); bad++; break; }
    }
  }
  for (int k = 0; k < n_ids; k++) di_engine_abort(e, ids[k]);
  for (int guard = 0; di_engine_has_unfinished(e) && guard < 20000; guard++) {
    di_step_output *out;
    if (di_engine_step(e, &out) != DI_OK) { bad++; break; }
  }
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  if (di_engine_has_unfinished(e) || st.kv_blocks_used != 0 || di_engine_check(e) != DI_OK) {
    fprintf(stderr, "fuzz: %lld blocks in use at the end (%s)\n", (long long)st.kv_blocks_used, di_last_error());
    bad++;
  }
  if (mb->errors) { fprintf(stderr, "fuzz: the mock read %d unwritten slots\n", mb->errors); bad++; }
  di_engine_free(e);
  mock_destroy(&mb->base);
  return bad;
}
#endif
