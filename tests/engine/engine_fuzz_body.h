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
#include <string.h>

/* what a request must produce alone (no aborts, no stop strings): the reference loop */
typedef struct fz_req {
  uint64_t id;
  int32_t prompt[512];
  int n_prompt, n, has_stop;
  int ignore_eos, max_tokens;
  di_sampling sp;
  int32_t got[2][24];
  int n_got[2], finish[2];
} fz_req;

static long fz_compared; /* samples checked against their reference (for the replay test) */

static int fz_reference_ok(const fz_req *q, int sample) {
  di_sampler *s;
  fz_compared++;
  if (di_sampler_create(40, &s) != DI_OK) return 0;
  int32_t toks[512 + 24];
  memcpy(toks, q->prompt, (size_t)q->n_prompt * sizeof *toks);
  int n = q->n_prompt, k = 0, finish = DI_FINISH_LENGTH;
  float lg[40];
  di_sampling sp = q->sp;
  sp.stream = (uint64_t)sample;
  while (k < q->max_tokens && n < 600) {
    mock_logits_of(toks, n, 40, lg);
    di_sample_result res;
    di_sampler_sample(s, lg, 40, &sp, toks, q->n_prompt, n, NULL, (uint64_t)n, &res);
    toks[n++] = res.token;
    k++;
    if (!q->ignore_eos && res.token == MOCK_EOS[0]) { finish = DI_FINISH_STOP; break; }
  }
  di_sampler_free(s);
  return k == q->n_got[sample] && finish == q->finish[sample] &&
         memcmp(toks + q->n_prompt, q->got[sample], (size_t)k * sizeof *toks) == 0;
}

typedef struct fz_in {
  const uint8_t *p;
  size_t n, i;
} fz_in;

static int fz_byte(fz_in *in) { return in->i < in->n ? in->p[in->i++] : 0; }

static void fz_collect(fz_req *reqs, int n, const di_step_output *out) {
  for (int i = 0; i < out->n; i++) {
    const di_seq_output *o = &out->seqs[i];
    for (int k = 0; k < n; k++) {
      if (reqs[k].id != o->req_id || o->sample_index > 1) continue;
      fz_req *q = &reqs[k];
      int smp = o->sample_index;
      for (int t = 0; t < o->n_new_tokens && q->n_got[smp] < 24; t++) q->got[smp][q->n_got[smp]++] = o->new_tokens[t];
      if (o->finish_reason) q->finish[smp] = o->finish_reason;
    }
  }
}

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
  static fz_req reqs[64];
  di_step_output *out;
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
      p.has_seed = 1;
      p.seed = (uint64_t)len * 31 + (uint64_t)s;
      const char *stops[1] = {stop_pool[s & 3]};
      if (s & 2) { p.stop = stops; p.n_stop = 1; }
      uint64_t id;
      if (n_ids < 64 && di_engine_add_request(e, &p, &id) == DI_OK) {
        fz_req *q = &reqs[n_ids];
        memset(q, 0, sizeof *q);
        q->id = id;
        memcpy(q->prompt, prompt, (size_t)len * sizeof *prompt);
        q->n_prompt = len;
        q->n = p.n;
        q->has_stop = p.n_stop > 0;
        q->ignore_eos = p.ignore_eos;
        q->max_tokens = p.max_tokens;
        q->sp = (di_sampling){.temperature = p.temperature, .top_p = 1, .top_k = p.top_k, .repetition_penalty =
                              p.repetition_penalty, .logprobs = p.logprobs, .seed = p.seed};
        ids[n_ids++] = id;
      }
    } else if (op == 3) {
      if (n_ids) di_engine_abort(e, ids[fz_byte(&in) % n_ids]);
    } else {
      if (di_engine_step(e, &out) != DI_OK) { bad++; break; }
      fz_collect(reqs, n_ids, out);
      steps++;
      if (di_engine_check(e) != DI_OK) { fprintf(stderr, "fuzz: %s\n", di_last_error()); bad++; break; }
    }
  }
  for (int k = 0; k < n_ids; k++) di_engine_abort(e, ids[k]);
  /* the requests that ended on their own must equal their reference, however they were scheduled */
  for (int guard = 0; di_engine_has_unfinished(e) && guard < 20000; guard++) {
    if (di_engine_step(e, &out) != DI_OK) { bad++; break; }
    fz_collect(reqs, n_ids, out);
  }
  for (int k = 0; k < n_ids; k++)
    for (int smp = 0; smp < reqs[k].n; smp++) {
      int f = reqs[k].finish[smp];
      if (reqs[k].has_stop || f == DI_FINISH_ABORT || f == DI_FINISH_ERROR) continue;
      if (!fz_reference_ok(&reqs[k], smp)) {
        fprintf(stderr, "fuzz: request %d sample %d differs from its reference (%d tokens, finish %d)\n", k, smp,
                reqs[k].n_got[smp], f);
        bad++;
      }
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
