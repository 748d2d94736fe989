/* DSpark proposals inside the step (di_batch.propose_row / propose_cap; the drafter's graph_on and
 * graph_drafts, engine/drafter.h) on the mock backend, so the engine's side runs in CI without a GPU.
 * The mock plays the CUDA drafter's part: after a step that carries proposals it finds each block's
 * anchor from the step's own samples by the device's rule (the verified drafts accepted while each
 * equals the sample of the row before it; the anchor is the sample after the last accepted one) and
 * drafts greedily from the mock model's logits over the sequence's context read back from the mock KV
 * (so a wrong table or a wrong anchor changes the drafts), every fourth draft made wrong on purpose.
 * Held: greedy and seeded (acceptance "exact") outputs equal to the same requests without speculative
 * decoding, under the fixed and the confidence schedule, with token feedback; drafts proposed in the
 * step, accepted, none with an anchor the host does not confirm; no KV block leaked, also through a
 * 6-block pool (preemption) and aborts; the mock's slot checks clean. */
#include "test_util.h"
#include "mock_drafter.h"
#include "test_requests.h"
#include "engine/spec_decode.h"
#include <stdlib.h>
#include <string.h>

#define VOCAB 53
#define NREQ 12
#define MAXT 40
#define BLOCK 4

typedef struct {
  int32_t prompt[64];
  int n_prompt;
  float temperature;
  test_got out;
} rq_t;

static void make(rq_t *rq, int n) {
  for (int k = 0; k < n; k++) {
    memset(&rq[k], 0, sizeof rq[k]);
    rq[k].n_prompt = 3 + (k * 7) % 29;
    for (int i = 0; i < rq[k].n_prompt; i++) rq[k].prompt[i] = 2 + (int32_t)(mock_mix((uint64_t)(k * 100 + i)) % (VOCAB - 2));
    rq[k].temperature = k % 3 == 2 ? 0.8f : 0.f;
  }
}

/* every third request aborted at step at */
typedef struct abort_ctx {
  rq_t *rq;
  int n, at;
} abort_ctx;
static void abort_every_third(di_engine *e, int step, void *c) {
  const abort_ctx *a = c;
  if (step == a->at)
    for (int k = 0; k < a->n; k += 3) (void)di_engine_abort(e, a->rq[k].out.id);
}

/* runs rq through an engine on a fresh mock (spec NULL: no speculative decoding); abort_at > 0: every
 * third request aborted at that step (their outputs are not compared) */
static void run(rq_t *rq, int n, const char *spec, int fixed, int blocks, int abort_at, di_spec_stats *ss) {
  mock_backend *m = mock_backend_new(VOCAB);
  m->base.ops = &MOCK_DRAFTER_OPS;
  mock_drafter_reset(m, BLOCK);
  di_engine_options o;
  di_engine_options_default(&o);
  o.num_kv_blocks = blocks ? blocks : 256;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.seed = 3;
  di_engine *e = NULL;
  CHECKF(mock_engine(m, &o, 0, 4096, &e) == DI_OK, "%s", di_last_error());
  if (!e) { mock_destroy(&m->base); return; }
  if (spec) {
    di_drafter_ops d = mock_drafter_ops();
    CHECKF(di_engine_set_dspark(e, &d, BLOCK, 1, fixed) == DI_OK, "%s: %s", spec, di_last_error());
    CHECKF(g_md.on, "%s: graph proposals not turned on", spec);
  }
  for (int k = 0; k < n; k++) {
    const di_request_params p = test_params(NULL, rq[k].prompt, rq[k].n_prompt, MAXT, rq[k].temperature, 11 + (uint64_t)k);
    test_add(e, &p, &rq[k].out, spec ? spec : "plain");
  }
  abort_ctx ac = {rq, n, abort_at};
  test_run_to_end(e, &rq[0].out, sizeof *rq, n, 20000, abort_every_third, &ac, spec ? spec : "plain");
  di_engine_stats st;
  di_engine_get_stats(e, &st);
  CHECKF(st.kv_blocks_used == 0, "%s: %lld KV blocks leaked", spec ? spec : "plain", (long long)st.kv_blocks_used);
  CHECKF(di_engine_check(e) == DI_OK, "%s", di_last_error());
  /* (the mock's sequence-key contract, a step continuing where the last one ended, is not held: a verify
   * step that rejects drafts is followed by one that starts below its end, by design) */
  CHECKF(m->errors == 0, "%s: mock errors %d", spec ? spec : "plain", m->errors);
  memset(ss, 0, sizeof *ss);
  di_engine_get_spec_stats(e, ss);
  di_engine_free(e);
  mock_destroy(&m->base);
}

int main(void) {
  static rq_t ref[NREQ], got[NREQ];
  make(ref, NREQ);
  di_spec_stats ss;
  run(ref, NREQ, NULL, 0, 0, 0, &ss);
  const struct { const char *what; int fixed, blocks, abort_at; } cfgs[] = {
      {"fixed", 1, 0, 0}, {"confidence", 0, 0, 0}, {"fixed, 6-block pool", 1, 6, 0}, {"fixed, aborts", 1, 0, 9}};
  for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
    memcpy(got, ref, sizeof got);
    run(got, NREQ, cfgs[c].what, cfgs[c].fixed, cfgs[c].blocks, cfgs[c].abort_at, &ss);
    int same = 1, compared = 0;
    for (int k = 0; k < NREQ; k++) {
      if (cfgs[c].abort_at && k % 3 == 0) continue;
      compared++;
      same &= test_got_equal(&got[k].out, &ref[k].out);
    }
    CHECKF(same && compared > 0, "%s: outputs differ from decoding without drafts", cfgs[c].what);
    CHECKF(ss.proposals_in_step > 0 && ss.proposals_missed == 0, "%s: %lld proposals in the step, %lld missed", cfgs[c].what,
           (long long)ss.proposals_in_step, (long long)ss.proposals_missed);
    if (cfgs[c].fixed)
      CHECKF(ss.drafted_tokens > 0 && ss.accepted_tokens > 0 && ss.accepted_tokens < ss.drafted_tokens,
             "%s: %lld drafted, %lld accepted", cfgs[c].what, (long long)ss.drafted_tokens, (long long)ss.accepted_tokens);
    printf("%s: %lld proposals in the step (%lld missed), %lld drafted, %lld accepted, mean accepted length %.2f\n",
           cfgs[c].what, (long long)ss.proposals_in_step, (long long)ss.proposals_missed, (long long)ss.drafted_tokens,
           (long long)ss.accepted_tokens, ss.mean_accepted_length);
  }
  free(g_md.sampled);
  return test_finish("test_dspark_graph");
}
