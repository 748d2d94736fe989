/* One fuzz case for the engine's state machine (used by fuzz/fuzz_engine.c and replayed by
 * tests/engine/test_engine_fuzz_corpus.c): the input bytes choose the engine options (pool size,
 * budgets, async, chunking, prefix caching, device sampling) and a sequence of operations (add a
 * request with random length / sampling / stop strings / n / prompt logprobs / score only, abort,
 * step) on the mock backend (with or without a no_sharing cache). After every step the block accounting
 * must hold, sequence keys must continue their positions, and the mock must never
 * read a KV slot that was not written for that position; prompt logprobs must arrive once, in sample
 * 0's first output, equal to the mock's reference rows; at the end, with everything aborted and
 * drained, no block is in use. Returns the number of violations (0 = fine). */
#ifndef DI_TEST_ENGINE_FUZZ_BODY_H
#define DI_TEST_ENGINE_FUZZ_BODY_H
#include "mock_backend.h"
#include <math.h>
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
  int vocab, plp_k;  /* plp_k: the request's prompt_logprobs (< 0: none) */
  int plp_from;      /* its prompt_logprobs_from: entries before it are not reported */
  int n_out[2];      /* outputs seen per sample */
  int plp_got;       /* times the prompt arrays arrived */
} fz_req;

static long fz_compared; /* samples checked against their reference (for the replay test) */
static long fz_plp_checked, fz_scored; /* prompt arrays checked, score-only requests added */
static long fz_fb_tokens;               /* tokens taken from the device by a step queued with feedback */
static long fz_preemptions;             /* preemptions the engine made (di_engine_stats) */
static long fz_long_prompts;            /* requests added whose prompt is longer than the smallest pool (3 x 64) */

/* The checks against the references are the oracle, not what is fuzzed: kept out of the coverage
 * instrumentation, so that inputs are not rewarded for new paths through the checker. */
#if defined(__clang__)
#define FZ_ORACLE __attribute__((no_sanitize("coverage")))
#else
#define FZ_ORACLE
#endif

FZ_ORACLE static int fz_reference_ok(const fz_req *q, int sample) {
  di_sampler *s;
  fz_compared++;
  if (di_sampler_create(q->vocab, &s) != DI_OK) return 0;
  int32_t toks[512 + 24];
  memcpy(toks, q->prompt, (size_t)q->n_prompt * sizeof *toks);
  int n = q->n_prompt, k = 0, finish = DI_FINISH_LENGTH;
  float lg[40];
  di_sampling sp = q->sp;
  sp.stream = (uint64_t)sample;
  /* mock_logits_of(toks, n) with the context hash kept across tokens (one step per token, not n) */
  uint64_t h = MOCK_HASH0;
  for (int i = 0; i < n; i++) h = mock_hash_next(h, toks[i], i);
  while (k < q->max_tokens && n < 600) {
    mock_logits_of_hash(h, q->vocab, lg);
    di_sample_result res;
    di_sampler_sample(s, lg, q->vocab, &sp, toks, q->n_prompt, n, NULL, (uint64_t)n, &res);
    h = mock_hash_next(h, res.token, n);
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

/* The prompt arrays of one output against the mock's rows: entry i is the log-softmax (double sums,
 * as the engine) of mock_logits_of(prompt, i) at prompt[i]; the top k are the k largest logits (ties:
 * lower id), then id -1 where the vocabulary is smaller than k; rank = 1 + ids with a larger logit. */
FZ_ORACLE static int fz_check_plp(const fz_req *q, const di_seq_output *o) {
  int V = q->vocab, k = q->plp_k, bad = 0;
  fz_plp_checked++;
  if (o->n_prompt_tokens != q->n_prompt || o->n_prompt_top != k || (k > 0) != (o->prompt_top != NULL) ||
      !o->prompt_ranks) {
    fprintf(stderr, "fuzz: prompt arrays of %d tokens, top %d (expected %d, %d)\n", o->n_prompt_tokens,
            o->n_prompt_top, q->n_prompt, k);
    return 1;
  }
  const int first = q->plp_from > 1 ? q->plp_from : 1; /* entries before it: NaN, rank 0, no top */
  for (int i = 0; i < first && i < q->n_prompt; i++) {
    if (!isnan(o->prompt_logprobs[i]) || o->prompt_ranks[i] != 0) bad++;
    for (int j = 0; j < k; j++)
      if (o->prompt_top[(size_t)i * (size_t)k + j].id != -1) bad++;
  }
  float lg[40];
  uint64_t h = MOCK_HASH0; /* the context hash of prompt[0..i), advanced one token per entry */
  for (int i = 0; i < first - 1 && i < q->n_prompt; i++) h = mock_hash_next(h, q->prompt[i], i);
  for (int i = first; i < q->n_prompt && !bad; i++) {
    h = mock_hash_next(h, q->prompt[i - 1], i - 1);
    mock_logits_of_hash(h, V, lg);
    double mx = lg[0], z = 0;
    for (int v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
    for (int v = 0; v < V; v++) z += exp((double)lg[v] - mx);
    double lse = mx + log(z);
    float lp = o->prompt_logprobs[i];
    int32_t tgt = q->prompt[i], rank = 1;
    for (int v = 0; v < V; v++) rank += lg[v] > lg[tgt];
    if (!isfinite(lp) || lp > 0 || fabs(lp - ((double)lg[tgt] - lse)) > 1e-5 || o->prompt_ranks[i] != rank ||
        rank < 1) {
      fprintf(stderr, "fuzz: prompt token %d: logprob %g rank %d, reference %g rank %d\n", i, (double)lp,
              o->prompt_ranks[i], (double)lg[tgt] - lse, rank);
      bad++;
    }
    const di_token_logprob *top = k > 0 ? o->prompt_top + (size_t)i * (size_t)k : NULL;
    int used[40] = {0};
    for (int j = 0; j < k && !bad; j++) {
      if (j >= V) { bad += top[j].id != -1; continue; }
      int best = -1; /* the reference's j-th: the largest unused logit, lower id first */
      for (int v = 0; v < V; v++)
        if (!used[v] && (best < 0 || lg[v] > lg[best])) best = v;
      used[best] = 1;
      if (top[j].id != best || !isfinite(top[j].logprob) || top[j].logprob > 0 ||
          fabs(top[j].logprob - ((double)lg[best] - lse)) > 1e-5 || (j > 0 && top[j].logprob > top[j - 1].logprob)) {
        fprintf(stderr, "fuzz: prompt token %d top %d: id %d %g, reference %d %g\n", i, j, top[j].id,
                (double)top[j].logprob, best, (double)lg[best] - lse);
        bad++;
      }
    }
  }
  if (bad) fprintf(stderr, "fuzz: prompt logprobs of a %d-token prompt (k %d) differ from the reference\n", q->n_prompt, k);
  return bad;
}

FZ_ORACLE static int fz_collect(fz_req *reqs, int n, const di_step_output *out) {
  int bad = 0;
  for (int i = 0; i < out->n; i++) {
    const di_seq_output *o = &out->seqs[i];
    for (int k = 0; k < n; k++) {
      if (reqs[k].id != o->req_id || o->sample_index > 1) continue;
      fz_req *q = &reqs[k];
      int smp = o->sample_index;
      if (o->prompt_logprobs) { /* once, with sample 0's first output, only when asked for */
        if (smp != 0 || q->plp_k < 0 || q->plp_got || q->n_out[0] != 0) {
          fprintf(stderr, "fuzz: prompt logprobs in sample %d's output %d (k %d, %d before)\n", smp, q->n_out[smp],
                  q->plp_k, q->plp_got);
          bad++;
        } else {
          bad += fz_check_plp(q, o);
        }
        q->plp_got++;
      }
      q->n_out[smp]++;
      for (int t = 0; t < o->n_new_tokens && q->n_got[smp] < 24; t++) q->got[smp][q->n_got[smp]++] = o->new_tokens[t];
      if (o->finish_reason) q->finish[smp] = o->finish_reason;
    }
  }
  return bad;
}

/* Bounds on one input's work, which decide the target's speed (about 150 runs a second of CPU
 * before, most inputs a few dozen requests of hundreds of tokens): the prompt tokens of all its
 * requests (an add beyond it is skipped, its bytes still read, so inputs keep their meaning), and
 * the prompt of a request with prompt logprobs, whose cost (engine and check) is per prompt token x
 * vocabulary x k (such a prompt also counts FZ_PLP_WEIGHT times against the budget). Both stay
 * above what the paths need: a prompt longer than the smallest pool (3 x 64 tokens), many requests
 * competing for a small pool, chunks split by budgets of 4 tokens up. */
#define FZ_PROMPT_BUDGET 1024
#define FZ_MAX_STEPS 512 /* steps an input may ask for (was 4,000) */
#define FZ_PLP_MAX_PROMPT 48
#define FZ_PLP_WEIGHT 8
/* The flags byte's high nibble turns prompt logprobs on (the value is the mock's vocabulary; 12 is
 * smaller than the top 20). Only nibbles no seed of the older corpus used, so those keep their paths. */
static const int FZ_PLP_VOCAB[16] = {0, 0, 40, 0, 0, 0, 40, 12, 0, 40, 0, 0, 0, 0, 0, 0};

static int engine_fuzz_one(const uint8_t *data, size_t size) {
  /* the row sampler starts min(cores / 2, 8) threads at every engine create, and at these
   * vocabularies never uses them (its threshold is 2^20 rows x vocab): one thread, so an input costs
   * the same on the 2-core VM and the 16-core device host (where the engine target ran at a third of
   * the VM's rate per core, session 13) and no run depends on the machine's core count */
  static int threads_set;
  if (!threads_set) {
    setenv("DEEPINFER_SAMPLER_THREADS", "1", 0);
    threads_set = 1;
  }
  fz_in in = {data, size, 0};
  di_engine_options o;
  di_engine_options_default(&o);
  o.num_kv_blocks = 3 + fz_byte(&in) % 40;
  int seqs_byte = fz_byte(&in);
  o.max_num_seqs = 1 + seqs_byte % 16;
  o.max_num_batched_tokens = 4 + fz_byte(&in) % 300;
  int flags = fz_byte(&in);
  o.async_scheduling = flags & 1;
  o.enable_chunked_prefill = !(flags & 2);
  o.enable_prefix_caching = !(flags & 4);
  o.seed = 1;
  int plp_vocab = FZ_PLP_VOCAB[flags >> 4], vocab = plp_vocab ? plp_vocab : 40;
  mock_backend *mb = mock_backend_new(vocab);
  /* device sampling; with the max_num_seqs byte's 0x40 bit, with device token feedback (steps queued
   * before the host has their input tokens) */
  if (flags & 8) mb->base.ops = (seqs_byte & 0x40) ? &MOCK_OPS_FB : &MOCK_OPS_DEV;
  /* the max_num_seqs byte's high bit: a model whose cache cannot be shared (DeepSeek-V4's per-sequence
   * state): no prefix hits, samples compute their own prompts, new keys start at position 0 */
  mb->no_sharing = (seqs_byte & 0x80) != 0;
  di_engine *e;
  if (mock_engine(mb, &o, 1, 600, &e) != DI_OK) {
    mock_destroy(&mb->base);
    return 1;
  }
  int bad = 0, steps = 0, budget = FZ_PROMPT_BUDGET;
  uint64_t ids[64];
  int n_ids = 0;
  static fz_req reqs[64];
  di_step_output *out;
  int32_t prompt[512];
  const char *stop_pool[4] = {"a", "bc", "zz", "q"};
  while (in.i < in.n && steps < FZ_MAX_STEPS) {
    int op = fz_byte(&in) % 8;
    if (op < 3) {
      di_request_params p;
      di_request_params_default(&p);
      int len = 1 + fz_byte(&in) * 2;
      int shared = fz_byte(&in);
      int span = vocab - 2 < 30 ? vocab - 2 : 30; /* 30 and 38 with the vocabulary of 40 */
      for (int k = 0; k < len; k++) prompt[k] = 2 + (k < shared ? k % span : (k * 7 + shared) % (vocab - 2));
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
      int plp_bad = 0;
      if (plp_vocab) { /* off, 0..20 (small k more often), out of range; score only (max_tokens 0) */
        int pb = fz_byte(&in), v = pb % 32;
        p.prompt_logprobs = v < 6 ? -1 : v <= 26 ? v - 6 : v == 27 ? 21 : v == 28 ? 1000 : v - 29;
        /* such a prompt is cut to FZ_PLP_MAX_PROMPT tokens (still split across steps by small budgets) */
        if (p.prompt_logprobs >= 0 && len > FZ_PLP_MAX_PROMPT) len = p.n_prompt_ids = FZ_PLP_MAX_PROMPT;
        if ((pb & 32) && p.prompt_logprobs >= 0) p.max_tokens = 0;
        /* reported from: the start, the middle, the last token, or past the prompt (refused) */
        const int fsel = pb >> 6;
        p.prompt_logprobs_from = fsel == 0 ? 0 : fsel == 1 ? len / 2 : fsel == 2 ? len - 1 : len + 1;
        plp_bad = p.prompt_logprobs > 20 || (p.prompt_logprobs >= 0 && p.prompt_logprobs_from > len);
      }
      uint64_t id;
      if (plp_bad && n_ids < 64) {
        if (di_engine_add_request(e, &p, &id) != DI_ERR_INVALID_ARG) {
          fprintf(stderr, "fuzz: prompt_logprobs %d from %d (prompt %d) was accepted\n", p.prompt_logprobs,
                  p.prompt_logprobs_from, len);
          bad++;
          break;
        }
      } else if (n_ids < 64 && len * (p.prompt_logprobs >= 0 ? FZ_PLP_WEIGHT : 1) <= budget &&
                 di_engine_add_request(e, &p, &id) == DI_OK) {
        budget -= len * (p.prompt_logprobs >= 0 ? FZ_PLP_WEIGHT : 1);
        fz_req *q = &reqs[n_ids];
        memset(q, 0, sizeof *q);
        q->id = id;
        memcpy(q->prompt, prompt, (size_t)len * sizeof *prompt);
        q->n_prompt = len;
        q->n = p.n;
        q->has_stop = p.n_stop > 0;
        q->ignore_eos = p.ignore_eos;
        q->max_tokens = p.max_tokens;
        q->vocab = vocab;
        q->plp_k = p.prompt_logprobs;
        q->plp_from = p.prompt_logprobs >= 0 ? p.prompt_logprobs_from : 0;
        fz_scored += p.max_tokens == 0;
        q->sp = (di_sampling){.temperature = p.temperature, .top_p = 1, .top_k = p.top_k, .repetition_penalty =
                              p.repetition_penalty, .logprobs = p.logprobs, .seed = p.seed};
        ids[n_ids++] = id;
        fz_long_prompts += len > 3 * 64;
      }
    } else if (op == 3) {
      if (n_ids) di_engine_abort(e, ids[fz_byte(&in) % n_ids]);
    } else {
      if (di_engine_step(e, &out) != DI_OK) { bad++; break; }
      bad += fz_collect(reqs, n_ids, out);
      steps++;
      if (di_engine_check(e) != DI_OK) { fprintf(stderr, "fuzz: %s\n", di_last_error()); bad++; break; }
    }
  }
  for (int k = 0; k < n_ids; k++) di_engine_abort(e, ids[k]);
  /* the requests that ended on their own must equal their reference, however they were scheduled */
  for (int guard = 0; di_engine_has_unfinished(e) && guard < 20000; guard++) {
    if (di_engine_step(e, &out) != DI_OK) { bad++; break; }
    bad += fz_collect(reqs, n_ids, out);
  }
  for (int k = 0; k < n_ids; k++) {
    const fz_req *q = &reqs[k];
    int f0 = q->finish[0];
    if (q->plp_k >= 0 && f0 != DI_FINISH_ABORT && f0 != DI_FINISH_ERROR && q->plp_got != 1) {
      fprintf(stderr, "fuzz: request %d (finish %d) got its prompt logprobs %d times\n", k, f0, q->plp_got);
      bad++;
    }
    for (int smp = 0; smp < q->n && q->max_tokens == 0; smp++) /* score only: no token, LENGTH */
      if (q->n_got[smp] != 0 || (q->finish[smp] != DI_FINISH_LENGTH && q->finish[smp] != DI_FINISH_ABORT &&
                                 q->finish[smp] != DI_FINISH_ERROR)) {
        fprintf(stderr, "fuzz: score-only request %d sample %d: %d tokens, finish %d\n", k, smp, q->n_got[smp],
                q->finish[smp]);
        bad++;
      }
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
  if (mb->key_errors) { fprintf(stderr, "fuzz: %d sequence-key continuity violations\n", mb->key_errors); bad++; }
  if (mb->n_keys) { fprintf(stderr, "fuzz: %d sequence keys not released at the end\n", mb->n_keys); bad++; }
  if (mb->no_sharing && st.prefix_cache_hit_tokens != 0) {
    fprintf(stderr, "fuzz: %lld prefix-cache hit tokens with a no_sharing cache\n", (long long)st.prefix_cache_hit_tokens);
    bad++;
  }
  fz_fb_tokens += mb->fb_resolved;
  fz_preemptions += st.preemptions;
  di_engine_free(e);
  mock_destroy(&mb->base);
  return bad;
}
#endif
