/* Soak on a real (random-weight) model with the default tokenizer: 2,000 random requests with
 * random prompt lengths, sampling settings, stop strings, `n`, and aborts at random moments, through
 * a KV pool small enough to preempt. Ends with zero blocks in use and consistent accounting (also
 * run under ASan/UBSan by ./build.sh asan). */
#include "test_util.h"
#include "deepinfer.h"
#include "sampler/rng.h"
#include <stdlib.h>
#include <string.h>

static uint64_t rs = 17;
static int rnd(int n) { return (int)(di_rng_u64(5, 5, rs++) % (uint64_t)n); }

int main(void) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.load_format = "dummy";
  mo.threads = 1;
  di_model *m;
  di_status st = di_model_load(test_path("tests/data/models/engine-dummy"), &mo, &m);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK) return test_finish("test_engine_soak");
  di_engine_options o;
  di_engine_options_default(&o);
  o.num_kv_blocks = 10;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 256;
  o.seed = 11;
  di_engine *e;
  CHECK(di_engine_create(m, &o, &e) == DI_OK);
  const char *stop_pool[] = {"e", "th", " a", "in", "\n", "s."};
  int added = 0, finished = 0, steps = 0, reasons[5] = {0}, check_fail = 0;
  uint64_t recent[8] = {0};
  int32_t ids[200];
  while ((added < 2000 || di_engine_has_unfinished(e)) && steps < 100000) {
    for (int k = rnd(8); k > 0 && added < 2000; k--) {
      di_request_params p;
      di_request_params_default(&p);
      int kind = rnd(8);
      /* some end just before a block boundary, so decoding needs a new block: preemption; most
       * are short (the test is about the lifecycle, and runs under the sanitizers too) */
      int n = kind < 2 ? 60 + rnd(4) : kind == 2 ? 1 + rnd(130) : 1 + rnd(16);
      int shared = kind <= 2 && rnd(4) ? 70 : 0; /* a shared "system prompt": prefix-cache hits */
      for (int i = 0; i < n; i++) ids[i] = i < shared ? 100 + i : 5 + rnd(8000);
      p.prompt_ids = ids;
      p.n_prompt_ids = n;
      p.max_tokens = 1 + rnd(8);
      p.temperature = rnd(3) ? 1.0f : 0.0f;
      p.top_k = rnd(2) ? 0 : 1 + rnd(50);
      p.n = rnd(12) ? 1 : 2;
      p.logprobs = rnd(10) ? -1 : 2;
      const char *stops[2] = {stop_pool[rnd(6)], stop_pool[rnd(6)]};
      if (rnd(3) == 0) { p.stop = stops; p.n_stop = 1 + rnd(2); }
      uint64_t id;
      if (di_engine_add_request(e, &p, &id) == DI_OK) { added++; recent[added % 8] = id; }
    }
    if (rnd(5) == 0 && recent[rnd(8)]) di_engine_abort(e, recent[rnd(8)]);
    di_step_output *out;
    if (di_engine_step(e, &out) != DI_OK) { CHECKF(0, "step: %s", di_last_error()); break; }
    steps++;
    for (int i = 0; i < out->n; i++)
      if (out->seqs[i].finish_reason) { finished++; reasons[out->seqs[i].finish_reason]++; }
    if (steps % 50 == 0 && di_engine_check(e) != DI_OK) check_fail++;
  }
  di_engine_stats s;
  di_engine_get_stats(e, &s);
  fprintf(stderr, "soak: %d requests, %d samples finished (stop %d, length %d, abort %d, error %d), %d steps, "
          "%lld preemptions, prefix-cache hit rate %.2f\n", added, finished, reasons[1], reasons[2], reasons[3],
          reasons[4], steps, (long long)s.preemptions, s.prefix_cache_hit_rate);
  CHECK(added == 2000 && finished >= 2000);
  CHECK(check_fail == 0);
  CHECK(reasons[1] > 0 && reasons[2] > 0 && reasons[3] > 0 && reasons[4] == 0);
  CHECKF(s.kv_blocks_used == 0, "%lld blocks in use after the soak", (long long)s.kv_blocks_used);
  CHECK(s.preemptions > 0 && s.prefix_cache_hit_tokens > 0);
  CHECKF(di_engine_check(e) == DI_OK, "%s", di_last_error());
  di_engine_free(e);
  di_model_free(m);
  return test_finish("test_engine_soak");
}
