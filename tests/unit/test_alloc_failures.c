/* Allocation-failure injection (issue 27), in the manner of SQLite's test/malloc_common.tcl: the
 * n-th allocation fails, for every n (or every n-th with a stride, said below) over the whole of an
 * operation, and the operation must return an error with a message: no crash, no leak, no
 * half-built object left behind. The operations: di_model_load (config, safetensors, weights),
 * tokenizer load (a small byte-level BPE with a Split regex, the real 8k-token tokenizer of
 * engine-dummy sampled with a stride), grammar compile (JSON Schema, EBNF, regex) with a matcher,
 * and an engine step, after which the engine must go on serving: the requests of the failed step
 * end with an error (or are untouched), and a later request gives the tokens it gives alone.
 *
 * How: this executable is linked with --wrap=malloc,calloc,realloc,free,strdup,strndup and
 * --wrap=pcre2_compile_8,pcre2_match_data_create_8 (CMakeLists.txt), so every allocation of the
 * library's code passes af_alloc below; cJSON's go through it too (cJSON_InitHooks), and PCRE2's
 * two constructors fail as a whole when their turn comes. Allocations inside libc and PCRE2 are
 * not counted. Leaks are checked two ways: a live-allocation count that must come back to where it
 * was (any build), and LeakSanitizer in the ASan build. Budget: ~30-60 s on one core (stride below). */
#include <execinfo.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pcre2.h>
#include "deepinfer.h"
#include "grammar/grammar.h"
#include "test_util.h"
#include "server/responses.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"

/* Under AddressSanitizer every run is several times slower: the long operations then take every
 * n up to a point and then a stride (said in the output), to keep the test within CI's budget. */
#if defined(__SANITIZE_ADDRESS__)
#define AF_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AF_SANITIZED 1
#endif
#endif
#ifdef AF_SANITIZED
#define AF_DENSE_LONG 200 /* every n up to here, then every AF_STRIDE_LONG-th */
#define AF_STRIDE_LONG 13
#define AF_DENSE_TOK 100 /* the 8k-token tokenizer */
#define AF_STRIDE_TOK 2999
#define AF_DENSE_SPEC 40 /* engine steps with speculative decoding (models/default: ~0.1 s a run here) */
#define AF_STRIDE_SPEC 23
#define AF_TOKENS_SPEC 4 /* tokens per request: the prefill, a draft, its verification and the next */
#define AF_DENSE_SETUP 40 /* the DSpark drafter's set-up */
#define AF_STRIDE_SETUP 23
#define AF_DENSE_V4 150 /* V4 engine steps */
#define AF_STRIDE_V4 11
#else
#define AF_DENSE_LONG 100000
#define AF_STRIDE_LONG 1
#define AF_DENSE_TOK 300
#define AF_STRIDE_TOK 997
/* The engine cases' later steps repeat the first ones' allocation sites (a V4 decode step: the same
 * 280 every step), so they take every n over the prefill and the first decode steps, then a stride
 * prime to that period, so that the later steps fail at different sites of each (V4: every 3rd over
 * its three decode steps reaches nearly every site of one). AF_FULL=1 takes every n (release: 0 findings
 * on the final code, ~40 s). */
#define AF_DENSE_SPEC 250
#define AF_STRIDE_SPEC 11
#define AF_TOKENS_SPEC 6
#define AF_DENSE_SETUP 150
#define AF_STRIDE_SETUP 7
#define AF_DENSE_V4 450
#define AF_STRIDE_V4 3
#endif

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
pcre2_code *__real_pcre2_compile_8(PCRE2_SPTR pattern, PCRE2_SIZE length, uint32_t options, int *errorcode,
                                   PCRE2_SIZE *erroroffset, pcre2_compile_context *ccontext);
pcre2_match_data *__real_pcre2_match_data_create_8(uint32_t ovecsize, pcre2_general_context *gcontext);

static atomic_long af_count;  /* allocations since af_arm */
static long af_gen;           /* af_arm calls so far (AF_LEAKS: an allocation counts from its af_arm) */
static atomic_long af_live;   /* allocations not yet freed (of those this file saw) */
static long af_fail_at;       /* 0: no failure; else the allocation number that fails */
static atomic_int af_failed;  /* whether the armed failure happened */
static long af_trace = -1;    /* AF_TRACE (debugging, with AF_ONLY): see af_note */
static int af_tracing;        /* in the run AF_ONLY="name:n" picked */

static void af_arm(long n) {
  af_gen++;
  af_count = 0;
  af_failed = 0;
  af_fail_at = n;
}

static int af_fail_now(void) {
  long c = atomic_fetch_add(&af_count, 1) + 1;
  if (af_fail_at > 0 && c == af_fail_at) {
    af_failed = 1;
    if (af_trace == 0) { /* AF_TRACE=0: the stack of the failing allocation */
      void *frames[16];
      backtrace_symbols_fd(frames, backtrace(frames, 16), 2);
    }
    return 1;
  }
  return 0;
}

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
pcre2_code *__wrap_pcre2_compile_8(PCRE2_SPTR pattern, PCRE2_SIZE length, uint32_t options, int *errorcode,
                                   PCRE2_SIZE *erroroffset, pcre2_compile_context *ccontext);
pcre2_match_data *__wrap_pcre2_match_data_create_8(uint32_t ovecsize, pcre2_general_context *gcontext);

/* AF_LEAKS=1 (debugging, with AF_ONLY="name:n"): every live allocation's number in a table, so a run
 * that leaves allocations behind names them (then AF_TRACE=k prints where allocation k was made) */
#define AF_LEAK_SLOTS (1u << 20)
static struct af_slot { void *p; long n, gen; } *af_leaks;
static size_t af_slot_of(void *p) { return ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 44; }
static void af_leak_put(void *p, long n) {
  for (size_t i = af_slot_of(p);; i = (i + 1) & (AF_LEAK_SLOTS - 1))
    if (!af_leaks[i].p || af_leaks[i].p == (void *)1) { af_leaks[i] = (struct af_slot){p, n, af_gen}; return; }
}
static void af_leak_del(void *p) {
  for (size_t i = af_slot_of(p); af_leaks[i].p; i = (i + 1) & (AF_LEAK_SLOTS - 1))
    if (af_leaks[i].p == p) { af_leaks[i].p = (void *)1; return; } /* a tombstone */
}
/* prints the allocations made since af_arm call `gen0` that are still live: which af_arm after it
 * (0: the run's first) and their number from that one */
static void af_leak_report(long gen0) {
  if (!af_leaks) return;
  for (size_t i = 0; i < AF_LEAK_SLOTS; i++)
    if (af_leaks[i].p > (void *)1 && af_leaks[i].gen >= gen0)
      fprintf(stderr, "  still live: allocation %ld after arm %ld\n", af_leaks[i].n, af_leaks[i].gen - gen0);
}

/* AF_TRACE=k (with AF_ONLY): prints the call stack of allocation k of the run (addr2line reads it) */
static void af_note(void *p) {
  if (!p) return;
  af_live++;
  if (af_leaks) af_leak_put(p, af_count);
  if (af_tracing && af_count == af_trace) {
    void *frames[16];
    backtrace_symbols_fd(frames, backtrace(frames, 16), 2);
  }
}

void *__wrap_malloc(size_t n) {
  if (af_fail_now()) return NULL;
  void *p = __real_malloc(n);
  af_note(p);
  return p;
}
void *__wrap_calloc(size_t k, size_t n) {
  if (af_fail_now()) return NULL;
  void *p = __real_calloc(k, n);
  af_note(p);
  return p;
}
void *__wrap_realloc(void *p, size_t n) {
  if (af_fail_now()) return NULL;
  void *q = __real_realloc(p, n);
  if (!p) af_note(q);
  if (p && !q && n == 0) af_live--; /* glibc: realloc(p, 0) frees p */
  if (af_leaks && p && q != p) {
    long was = -1;
    for (size_t i = af_slot_of(p); af_leaks[i].p; i = (i + 1) & (AF_LEAK_SLOTS - 1))
      if (af_leaks[i].p == p) was = af_leaks[i].n;
    af_leak_del(p);
    if (q && was >= 0) af_leak_put(q, was);
  }
  return q;
}
void __wrap_free(void *p) {
  if (p) af_live--;
  if (p && af_leaks) af_leak_del(p);
  __real_free(p);
}
char *__wrap_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = __wrap_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}
char *__wrap_strndup(const char *s, size_t n) {
  size_t l = strnlen(s, n);
  char *d = __wrap_malloc(l + 1);
  if (d) {
    memcpy(d, s, l);
    d[l] = 0;
  }
  return d;
}
pcre2_code *__wrap_pcre2_compile_8(PCRE2_SPTR pattern, PCRE2_SIZE length, uint32_t options, int *errorcode,
                                   PCRE2_SIZE *erroroffset, pcre2_compile_context *ccontext) {
  if (af_fail_now()) {
    *errorcode = PCRE2_ERROR_HEAPLIMIT; /* what pcre2 reports when its own allocation fails */
    *erroroffset = 0;
    return NULL;
  }
  return __real_pcre2_compile_8(pattern, length, options, errorcode, erroroffset, ccontext);
}
pcre2_match_data *__wrap_pcre2_match_data_create_8(uint32_t ovecsize, pcre2_general_context *gcontext) {
  if (af_fail_now()) return NULL;
  return __real_pcre2_match_data_create_8(ovecsize, gcontext);
}

/* One operation under injection: runs `op` with allocation n failing, for n = 1.. until a run in
 * which no allocation failed (the operation then must have succeeded); n steps by 1 up to `dense`,
 * then by `stride`. A failed run must return an error with a message and free what it took. */
static int af_run(const char *what, di_status (*op)(void *ctx), void *ctx, long dense, long stride) {
  /* once without failures: warms lazily built tables, and counts the allocations */
  clock_t t0 = clock();
  long live0 = af_live;
  af_arm(0);
  di_status st = op(ctx);
  long total = af_count;
  CHECKF(st == DI_OK, "%s without injected failures: %s", what, di_last_error());
  if (st != DI_OK) return 0;
  /* a second run without failures leaves memory as it found it (what a first run builds lazily is
   * built; a cache keyed by a freed object would grow here: see di_grammar_forget_vocab) */
  live0 = af_live;
  st = op(ctx);
  CHECKF(st == DI_OK && af_live == live0, "%s run again without failures: %s, %ld allocations more", what,
         st == DI_OK ? "ok" : di_last_error(), af_live - live0);
  /* the grammar cache emptied after every run from here: compiled grammars' automata and mask caches
   * grow with the states a run reaches, which a failure changes */
  di_grammar_cache_clear();
  live0 = af_live;
  int runs = 0, bad = 0;
  /* AF_ONLY="name:n" runs only allocation n of the operations whose name starts with `name` (to read
   * the leak report of one failure under ASan); AF_ONLY="name" every n of those operations */
  const char *only = getenv("AF_ONLY"), *colon = only ? strrchr(only, ':') : NULL;
  long only_n = 0;
  if (colon && colon[1] >= '0' && colon[1] <= '9') {
    if (strncmp(what, only, (size_t)(colon - only)) != 0) return 0;
    only_n = atol(colon + 1);
  } else if (only && strncmp(what, only, strlen(only)) != 0) {
    return 0;
  }
  if (getenv("AF_FULL")) dense = LONG_MAX; /* AF_FULL=1: every n of every operation (the strides' check) */
  for (long n = only_n ? only_n : 1;; n += n < dense ? 1 : stride) {
    long gen0 = af_gen + 1;
    af_arm(n);
    af_tracing = only_n > 0 && af_trace > 0;
    st = op(ctx);
    af_tracing = 0;
    di_grammar_cache_clear();
    af_fail_at = 0; /* disarmed; af_failed tells whether the failure happened */
    runs++;
    if (!af_failed) { /* past the last allocation */
      CHECKF(st == DI_OK, "%s: failed (%s) with no allocation failing (n %ld)", what, di_last_error(), n);
      break;
    }
    if (st == DI_OK && af_live == live0) continue; /* the failure was absorbed (a fallback path) */
    if (st == DI_OK) {
      CHECKF(0, "%s: allocation %ld failed, the op succeeded, %ld allocations left over", what, n, af_live - live0);
      bad++;
    } else if (!di_last_error()[0]) {
      CHECKF(0, "%s: allocation %ld failed: status %d without a message", what, n, (int)st);
      bad++;
    }
    if (af_live != live0) {
      CHECKF(0, "%s: allocation %ld failed: %ld allocations leaked (%s)", what, n, af_live - live0, di_last_error());
      af_leak_report(gen0);
      bad++;
      live0 = af_live;
    }
    if (bad > 5 || only_n) break;
  }
  fprintf(stderr, "%s: %ld allocations; %d runs (every n to %ld, then every %ld-th), %.1f s of CPU\n", what, total, runs, dense,
          stride, (double)(clock() - t0) / CLOCKS_PER_SEC);
  CHECK(runs > 1);
  return runs;
}

/* ---- the operations ---- */

static di_status op_model_load(void *ctx) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.threads = 1;
  di_model *m = NULL;
  di_status st = di_model_load(test_path((const char *)ctx), &mo, &m);
  if (st == DI_OK) di_model_free(m);
  return st;
}

static const char SMALL_TOKENIZER[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true}, {\"id\": 1, \"content\": \"<L>\", \"lstrip\": true,"
    " \"special\": true}], \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Replace\","
    " \"pattern\": {\"Regex\": \"\\\\d{4,}\"}, \"content\": \"#\"}]}, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\":"
    " [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+|\\\\s+\"}, \"behavior\":"
    " \"Isolated\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}, \"post_processor\":"
    " {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
    " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [0]}}}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\":"
    " {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0, \"<L>\": 1, \"a\": 2, \"b\": 3, \"c\": 4, \"ab\": 5, \"abc\": 6, \"\\u0120\": 7,"
    " \"\\u0120a\": 8, \"1\": 9, \"#\": 10}, \"merges\": [\"a b\", \"ab c\", \"\\u0120 a\"]}}";

static di_status use_tokenizer(di_tokenizer *t) {
  int32_t *ids = NULL;
  size_t n = 0;
  static const char text[] = "abc ab <L> 12345 abca";
  di_status st = di_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n);
  char *back = NULL;
  size_t bl;
  if (st == DI_OK) st = di_tokenizer_decode(t, ids, n, 0, &back, &bl);
  free(ids);
  free(back);
  return st;
}

static di_status op_tokenizer_small(void *ctx) {
  (void)ctx;
  di_tokenizer *t = NULL;
  DI_TRY(di_tokenizer_load_mem(SMALL_TOKENIZER, sizeof SMALL_TOKENIZER - 1, NULL, 0, "tokenizer.json", &t));
  di_status st = use_tokenizer(t);
  di_tokenizer_free(t);
  return st;
}

static di_status op_tokenizer_dir(void *ctx) {
  di_tokenizer *t = NULL;
  DI_TRY(di_tokenizer_load(test_path((const char *)ctx), &t));
  di_status st = use_tokenizer(t);
  di_tokenizer_free(t);
  return st;
}

typedef struct grammar_case {
  di_grammar_kind kind;
  const char *src;
  int indent; /* di_grammar_options.indent */
} grammar_case;

static di_grammar_vocab *grammar_vocab(void) {
  static const char *tok[] = {"{", "}", "\"", "a", "b", ":", ",", "1", "2", " ", "\"a\"", "true", "[", "]", "</s>"};
  enum { N = sizeof tok / sizeof tok[0] };
  size_t len[N];
  for (int i = 0; i < N; i++) len[i] = strlen(tok[i]);
  int32_t stop = N - 1;
  di_grammar_vocab *v = NULL;
  return di_grammar_vocab_create(N, tok, len, &stop, 1, &v) == DI_OK ? v : NULL;
}

static di_status op_grammar(void *ctx) {
  const grammar_case *c = ctx;
  di_grammar_options opt = {0};
  opt.no_cache = 1; /* compiled afresh each time: the compile is under injection, and a cached grammar
                       would keep what a failed matcher left in its caches */
  opt.indent = c->indent;
  di_grammar *g = NULL;
  DI_TRY(di_grammar_compile(c->kind, c->src, strlen(c->src), &opt, &g));
  di_grammar_vocab *v = grammar_vocab();
  di_grammar_matcher *m = NULL;
  di_status st = v ? di_grammar_matcher_create(g, v, &m) : di_error_set(DI_ERR_OOM, "grammar vocab: out of memory");
  uint32_t mask[1];
  for (int step = 0; st == DI_OK && step < 4; step++) {
    st = di_grammar_matcher_fill_mask(m, mask);
    int pick = -1;
    for (int id = 0; id < 15 && pick < 0; id++)
      if (mask[0] >> id & 1u) pick = id;
    if (st == DI_OK && pick >= 0) st = di_grammar_matcher_accept_token(m, pick);
  }
  di_grammar_matcher_free(m);
  di_grammar_vocab_free(v);
  di_grammar_free(g);
  return st;
}

/* ---- the engine step ---- */

/* One engine set-up under injection: a model, optionally speculative decoding (a --speculative-config:
 * MTP or a DSpark drafter), a KV pool, and three greedy requests whose tokens alone are the reference. */
#define AF_MAXP 24 /* prompt tokens */
#define AF_MAXT 8  /* tokens generated per request */
typedef struct engine_case {
  di_model *m;
  const char *spec;      /* di_engine_set_speculative_config's JSON, or NULL: plain decoding */
  int64_t kv_blocks;     /* di_engine_options.num_kv_blocks; 0: kv_bytes */
  int64_t kv_bytes;      /* di_engine_options.kv_cache_memory_bytes when kv_blocks is 0 */
  int max_tokens;        /* per request, <= AF_MAXT */
  int sampled;           /* request 1 is sampled (T = 0.8, seeded) rather than greedy */
  const char *regex;     /* request 0's structured output (drafts under its grammar), or NULL */
  const char *const *text; /* the three prompts as text (the model's tokenizer), or NULL: prompt[] */
  int n_prompt[3];
  int32_t prompt[3][AF_MAXP];
  int32_t ref[3][AF_MAXT];  /* each request's greedy tokens alone (no injection) */
  int failed_steps, errored, served_after;
} engine_case;

static void params(di_request_params *p, const engine_case *c, int r) {
  di_request_params_default(p);
  if (c->text) {
    p->prompt = c->text[r];
  } else {
    p->prompt_ids = c->prompt[r];
    p->n_prompt_ids = c->n_prompt[r];
  }
  p->max_tokens = c->max_tokens;
  p->temperature = 0;
  p->ignore_eos = 1;
  if (r == 0) p->regex = c->regex;
  if (r == 1 && c->sampled) { /* seeded sampling: with DSpark, rejection sampling of its drafts */
    p->temperature = 0.8f;
    p->has_seed = 1;
    p->seed = 11;
  }
}

/* the case's prompts: lengths n0..n2, ids below 32 from a fixed sequence (every model's vocabulary
 * holds them) */
static void set_prompts(engine_case *c, int n0, int n1, int n2) {
  static const int32_t base[3][6] = {{5, 9, 13, 2, 7, 7}, {3, 3, 8, 20, 11, 4}, {17, 6, 6, 1, 9, 30}};
  const int n[3] = {n0, n1, n2};
  for (int r = 0; r < 3; r++) {
    c->n_prompt[r] = n[r];
    for (int i = 0; i < n[r]; i++) c->prompt[r][i] = i < 6 ? base[r][i] : (base[r][i % 6] * 7 + i) % 32;
  }
}

/* the engine of the case, its speculative decoding set (no injection armed here) */
static di_status engine_make(const engine_case *c, di_engine **e) {
  di_engine_options o;
  di_engine_options_default(&o);
  if (c->kv_blocks) o.num_kv_blocks = c->kv_blocks;
  else o.kv_cache_memory_bytes = c->kv_bytes;
  o.max_num_seqs = 4; /* V4's per-sequence state is sized for max_num_seqs up front */
  o.seed = 3;
  DI_TRY(di_engine_create(c->m, &o, e));
  di_status st = c->spec ? di_engine_set_speculative_config(*e, c->m, c->spec) : DI_OK;
  if (st != DI_OK) {
    di_engine_free(*e);
    *e = NULL;
  }
  return st;
}

/* Runs requests 0 and 1, with allocation n of their steps failing (af_fail_at, set by the caller, is
 * armed at the first step: prefill, decode, and with speculative decoding the drafts and their
 * verification), then request 2 alone; checks each against its reference. */
static di_status op_engine(void *ctx) {
  engine_case *c = ctx;
  long fail_at = af_fail_at;
  af_arm(0);
  di_engine *e = NULL;
  DI_TRY(engine_make(c, &e));
  di_request_params p;
  uint64_t id[3];
  int32_t got[3][AF_MAXT];
  int n_got[3] = {0}, finish[3] = {0};
  di_status st = DI_OK, step_st = DI_OK;
  for (int r = 0; r < 2 && st == DI_OK; r++) {
    params(&p, c, r);
    st = di_engine_add_request(e, &p, &id[r]);
  }
  for (int steps = 0; st == DI_OK && di_engine_has_unfinished(e) && steps < 100; steps++) {
    if (steps == 0) af_arm(fail_at); /* the injection covers the prefill and the decode steps */
    di_step_output *out = NULL;
    di_status s = di_engine_step(e, &out);
    if (s != DI_OK) {
      step_st = s;
      c->failed_steps++;
      CHECKF(di_last_error()[0] != 0, "engine step failed without a message");
      /* the engine goes on; the outputs a failed step still reports (the requests it ended) count */
    }
    for (int i = 0; out && i < out->n; i++) {
      const di_seq_output *so = &out->seqs[i];
      int r = so->req_id == id[0] ? 0 : 1;
      for (int t = 0; t < so->n_new_tokens && n_got[r] < c->max_tokens; t++) got[r][n_got[r]++] = so->new_tokens[t];
      if (so->finish_reason) finish[r] = so->finish_reason;
      if (so->finish_reason == DI_FINISH_ERROR) CHECKF(so->error && so->error[0], "an error finish without a message");
    }
  }
  af_fail_at = 0; /* disarmed: af_run reads af_failed, whether the failure happened */
  int errored_here = 0;
  for (int r = 0; r < 2; r++) {
    if (finish[r] == DI_FINISH_ERROR) { c->errored++; errored_here++; continue; }
    CHECKF(finish[r] == DI_FINISH_LENGTH && n_got[r] == c->max_tokens && memcmp(got[r], c->ref[r], sizeof(int32_t) * (size_t)c->max_tokens) == 0,
           "request %d after allocation %ld failed: finish %d, %d tokens (not its tokens alone)", r, fail_at, finish[r],
           n_got[r]);
  }
  /* a new request after the failure: served as if alone */
  params(&p, c, 2);
  if (st == DI_OK) st = di_engine_add_request(e, &p, &id[2]);
  for (int steps = 0; st == DI_OK && di_engine_has_unfinished(e) && steps < 100; steps++) {
    di_step_output *out;
    st = di_engine_step(e, &out);
    for (int i = 0; st == DI_OK && i < out->n; i++)
      for (int t = 0; t < out->seqs[i].n_new_tokens && n_got[2] < c->max_tokens; t++) got[2][n_got[2]++] = out->seqs[i].new_tokens[t];
  }
  CHECKF(st == DI_OK && n_got[2] == c->max_tokens && memcmp(got[2], c->ref[2], sizeof(int32_t) * (size_t)c->max_tokens) == 0,
         "the request after allocation %ld failed: %s, %d tokens", fail_at, st == DI_OK ? "ok" : di_last_error(), n_got[2]);
  c->served_after += st == DI_OK && n_got[2] == c->max_tokens;
  CHECKF(di_engine_check(e) == DI_OK, "%s", di_last_error());
  di_engine_stats es;
  di_engine_get_stats(e, &es);
  CHECKF(es.kv_blocks_used == 0, "%lld KV blocks in use at the end", (long long)es.kv_blocks_used);
  di_engine_free(e);
  if (st != DI_OK) return st;
  return step_st != DI_OK || errored_here ? di_error_set(DI_ERR_OOM, "a step failed (as injected)") : DI_OK;
}

/* Each request alone without injection (the reference), into c->ref; with speculative decoding also
 * plain decoding's tokens, which greedy speculative decoding must equal, and the drafts made and
 * accepted over the three (into *drafted / *accepted), so the injection is known to reach them. */
static void reference_tokens(engine_case *c, int64_t *drafted, int64_t *accepted) {
  *drafted = *accepted = 0;
  for (int pass = 0; pass < (c->spec ? 2 : 1); pass++) {
    const char *spec = c->spec;
    if (pass == 1) c->spec = NULL; /* plain decoding */
    for (int r = 0; r < 3; r++) {
      di_engine *e = NULL;
      CHECKF(engine_make(c, &e) == DI_OK, "%s", di_last_error());
      if (!e) break;
      di_request_params p;
      params(&p, c, r);
      uint64_t id;
      CHECK(di_engine_add_request(e, &p, &id) == DI_OK);
      int32_t got[AF_MAXT];
      int n = 0;
      for (int steps = 0; di_engine_has_unfinished(e) && steps < 100; steps++) {
        di_step_output *out;
        CHECK(di_engine_step(e, &out) == DI_OK);
        for (int i = 0; i < out->n; i++)
          for (int t = 0; t < out->seqs[i].n_new_tokens && n < c->max_tokens; t++) got[n++] = out->seqs[i].new_tokens[t];
      }
      CHECK(n == c->max_tokens);
      if (pass == 0) memcpy(c->ref[r], got, sizeof(int32_t) * (size_t)n);
      else if (!(r == 1 && c->sampled)) /* greedy: speculative decoding gives plain decoding's tokens */
        CHECKF(memcmp(c->ref[r], got, sizeof(int32_t) * (size_t)n) == 0, "request %d: speculative decoding != plain decoding (greedy)", r);
      if (pass == 0 && spec) {
        di_spec_stats ss;
        di_engine_get_spec_stats(e, &ss);
        *drafted += ss.drafted_tokens;
        *accepted += ss.accepted_tokens;
      }
      di_engine_free(e);
    }
    c->spec = spec;
  }
}

/* di_engine_set_speculative_config under injection (the MTP set-up, or a DSpark drafter's config and
 * weights loaded from its folder): a failure is an error with a message, and the engine it was called
 * on still serves, plain decoding, request 2 as plain decoding alone gives it. */
static di_status op_spec_setup(void *ctx) {
  engine_case *c = ctx;
  long fail_at = af_fail_at;
  af_arm(0);
  const char *spec = c->spec;
  c->spec = NULL;
  di_engine *e = NULL;
  di_status st = engine_make(c, &e);
  c->spec = spec;
  DI_TRY(st);
  af_arm(fail_at);
  st = di_engine_set_speculative_config(e, c->m, c->spec);
  af_fail_at = 0;
  if (st != DI_OK) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", di_last_error());
    CHECKF(msg[0] != 0, "speculative set-up failed without a message");
    di_request_params p;
    params(&p, c, 2);
    uint64_t id;
    di_status s2 = di_engine_add_request(e, &p, &id);
    int32_t got[AF_MAXT];
    int n = 0;
    for (int steps = 0; s2 == DI_OK && di_engine_has_unfinished(e) && steps < 100; steps++) {
      di_step_output *out;
      s2 = di_engine_step(e, &out);
      for (int i = 0; s2 == DI_OK && i < out->n; i++)
        for (int t = 0; t < out->seqs[i].n_new_tokens && n < c->max_tokens; t++) got[n++] = out->seqs[i].new_tokens[t];
    }
    CHECKF(s2 == DI_OK && n == c->max_tokens && memcmp(got, c->ref[2], sizeof(int32_t) * (size_t)n) == 0,
           "after a failed speculative set-up (allocation %ld: %s) the engine did not serve a request as plain decoding "
           "(%s, %d tokens)", fail_at, msg, s2 == DI_OK ? "ok" : di_last_error(), n);
    CHECKF(di_engine_check(e) == DI_OK, "%s", di_last_error());
    di_error_set(st, "%s", msg);
  }
  di_engine_free(e);
  return st;
}

/* A Responses API body translated into a chat body (server/responses.c, ~130 cJSON_Add* calls that do
 * not check their allocations): with the failures tracked (util/json.h), a failed allocation gives a
 * 500 error, never a chat body with a field silently missing (a dropped structured_outputs would
 * make an unconstrained request). The reference body is the translation without failures. */
static const char RESPONSES_BODY[] =
    "{\"model\": \"m\", \"instructions\": \"Be brief.\", \"input\": [{\"role\": \"user\", \"content\": "
    "[{\"type\": \"input_text\", \"text\": \"Hi\"}]}, {\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": "
    "\"f\", \"arguments\": \"{}\"}, {\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"ok\"}], "
    "\"tools\": [{\"type\": \"function\", \"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": "
    "\"object\"}}], \"tool_choice\": \"auto\", \"temperature\": 0.5, \"max_output_tokens\": 9, \"stream\": true, "
    "\"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"s\", \"schema\": {\"type\": \"object\"}}}}";
static char *responses_reference;

static di_status op_responses(void *ctx) {
  (void)ctx;
  char *chat = NULL;
  di_resp_req rr;
  di_oai_error err;
  if (di_resp_translate(RESPONSES_BODY, sizeof RESPONSES_BODY - 1, &chat, &rr, &err) != 0)
    return di_error_set(err.status == 500 ? DI_ERR_OOM : DI_ERR_FORMAT, "%d %s", err.status, err.message);
  CHECKF(!responses_reference || strcmp(chat, responses_reference) == 0, "responses: an incomplete chat body was made: %s",
         chat);
  if (!responses_reference && (responses_reference = __real_malloc(strlen(chat) + 1))) strcpy(responses_reference, chat);
  free(chat);
  di_resp_req_free(&rr);
  return DI_OK;
}

/* One engine case's set-up: what is loaded, how the engine runs it, and how densely the injection
 * walks its steps. */
typedef struct engine_setup {
  const char *what, *model, *load_format, *spec;
  int64_t kv_blocks;  /* 0: a 4 MiB KV budget */
  int max_tokens;
  int sampled;        /* request 1 seeded at T = 0.8 */
  const char *regex;  /* request 0's regex (structured output), or NULL */
  const char *const *text; /* text prompts (else ids of the lengths n_prompt) */
  int setup;          /* also inject into di_engine_set_speculative_config (the drafter's load) */
  int n_prompt[3];
  long dense, stride; /* af_run's */
} engine_setup;

/* Loads the model of one engine case (no injection), computes its references, then runs the
 * injection over its steps (and, with `setup`, over its speculative set-up). */
static void engine_case_run(const engine_setup *es) {
  engine_case c = {0};
  c.spec = es->spec;
  c.kv_blocks = es->kv_blocks;
  c.kv_bytes = 4 << 20;
  c.max_tokens = es->max_tokens;
  c.sampled = es->sampled;
  c.regex = es->regex;
  c.text = es->text;
  set_prompts(&c, es->n_prompt[0], es->n_prompt[1], es->n_prompt[2]);
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.threads = 1;
  mo.load_format = es->load_format;
  CHECKF(di_model_load(test_path(es->model), &mo, &c.m) == DI_OK, "%s: %s", es->model, di_last_error());
  if (!c.m) return;
  int64_t drafted, accepted;
  reference_tokens(&c, &drafted, &accepted);
  if (es->spec) {
    fprintf(stderr, "%s: the references drafted %lld tokens, accepted %lld\n", es->what, (long long)drafted,
            (long long)accepted);
    CHECKF(drafted > 0 && accepted > 0, "%s: no drafts made or accepted: the injection would miss their paths", es->what);
  }
  char name[160];
  if (es->setup) {
    snprintf(name, sizeof name, "speculative set-up (%s)", es->what);
    af_run(name, op_spec_setup, &c, AF_DENSE_SETUP, AF_STRIDE_SETUP);
  }
  snprintf(name, sizeof name, "engine steps (%s)", es->what);
  if (af_run(name, op_engine, &c, es->dense, es->stride) > 0) {
    fprintf(stderr, "%s: %d failed steps, %d requests ended with the error, %d served after\n", name, c.failed_steps,
            c.errored, c.served_after);
    CHECKF(c.failed_steps + c.errored > 0 && c.served_after > 0, "%s: no failed step or no request served after", name);
  }
  di_model_free(c.m);
}

/* Plain decoding on engine-dummy (dummy weights, a real 8k tokenizer); speculative decoding on
 * models/default (trained weights, so drafts are accepted as well as rejected) with its MTP layer and
 * with its DSpark drafter (models/default/dspark; rejection sampling for the seeded request, and the
 * drafter's config and weights loaded under injection too); DeepSeek-V4 (dsv4-tiny: its sliding-window,
 * compressed and indexer caches; 4 tokens from prompts of 5-6, a compressed entry every 4 positions). */
static void engine_cases(void) {
  static const char REGEX[] = "(the|a|sea|is|of| )+";
  /* text the trained model continues predictably, so that drafts are accepted within a few tokens */
  static const char *const TEXT[3] = {"The sea is", "Once upon a time", "The history of the city"};
  static const engine_setup cases[] = {
      {"engine-dummy", "tests/data/models/engine-dummy", "dummy", NULL, 8, 8, 0, NULL, NULL, 0, {6, 6, 6},
       AF_DENSE_LONG / 2, AF_STRIDE_LONG},
      {"models/default, MTP", "models/default", NULL,
       "{\"method\": \"mtp\", \"num_speculative_tokens\": 3, \"min_confidence\": 0}", 8, AF_TOKENS_SPEC, 1, REGEX,
       TEXT, 0, {0}, AF_DENSE_SPEC, AF_STRIDE_SPEC},
      {"models/default, DSpark", "models/default", NULL,
       "{\"method\": \"dspark\", \"num_speculative_tokens\": 4, \"schedule\": \"fixed\"}", 8, AF_TOKENS_SPEC, 1,
       REGEX, TEXT, 1, {0}, AF_DENSE_SPEC, AF_STRIDE_SPEC},
      {"dsv4-tiny", "tests/data/models/dsv4-tiny", NULL, NULL, 0, 4, 1, NULL, NULL, 0, {5, 6, 5}, AF_DENSE_V4,
       AF_STRIDE_V4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) engine_case_run(&cases[i]);
}

int main(void) {
  if (getenv("AF_TRACE")) af_trace = atol(getenv("AF_TRACE"));
  if (getenv("AF_LEAKS")) af_leaks = __real_calloc(AF_LEAK_SLOTS, sizeof *af_leaks);
  cJSON_Hooks hooks = {__wrap_malloc, __wrap_free};
  cJSON_InitHooks(&hooks);
  /* the injection reaches cJSON and PCRE2: a parse and a compile each fail at their first allocation */
  af_arm(1);
  CHECK(cJSON_Parse("[1]") == NULL && af_failed);
  af_arm(1);
  int ec;
  PCRE2_SIZE eo;
  CHECK(pcre2_compile((PCRE2_SPTR) "a+", 2, 0, &ec, &eo, NULL) == NULL && af_failed);
  af_arm(0);

  af_run("di_model_load(dsv3-tiny)", op_model_load, (void *)"tests/data/models/dsv3-tiny", AF_DENSE_LONG, AF_STRIDE_LONG);
  af_run("di_model_load(dsv2-lite-tiny)", op_model_load, (void *)"tests/data/models/dsv2-lite-tiny", AF_DENSE_LONG,
         AF_STRIDE_LONG);
  /* session 13: the FP8 block-scaled loader, DeepSeek-V4's loader and its native MXFP4 / FP8 weights */
  af_run("di_model_load(dsv3-tiny-fp8)", op_model_load, (void *)"tests/data/models/dsv3-tiny-fp8", AF_DENSE_LONG,
         AF_STRIDE_LONG);
  af_run("di_model_load(dsv4-tiny)", op_model_load, (void *)"tests/data/models/dsv4-tiny", AF_DENSE_LONG, AF_STRIDE_LONG);
  af_run("di_model_load(dsv4-tiny-native)", op_model_load, (void *)"tests/data/models/dsv4-tiny-native", AF_DENSE_LONG,
         AF_STRIDE_LONG);
  af_run("tokenizer load (small BPE) + encode/decode", op_tokenizer_small, NULL, 100000, 1);
  af_run("tokenizer load (engine-dummy, 8k tokens) + encode/decode", op_tokenizer_dir,
         (void *)"tests/data/models/engine-dummy", AF_DENSE_TOK, AF_STRIDE_TOK);
  static const grammar_case grammars[] = {
      {DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 1},"
                               " \"b\": {\"enum\": [\"x\", true]}}, \"required\": [\"a\"]}", 0},
      {DI_GRAMMAR_EBNF, "root ::= \"{\" pair (\",\" pair)* \"}\"\npair ::= \"\\\"a\\\"\" \":\" [0-9]+", 0},
      {DI_GRAMMAR_REGEX, "(ab|[0-9]{1,3})+\\s?", 0},
      /* an allOf branch's additionalProperties beside another's patternProperties (merge's entries) */
      {DI_GRAMMAR_JSON_SCHEMA, "{\"allOf\": [{\"properties\": {\"a\": {}}, \"additionalProperties\": {\"type\": \"integer\"}},"
                               " {\"patternProperties\": {\"^f\": {\"minimum\": 2}}}]}", 0},
      /* x-guidance's json_allowed_escapes (its own escape rules), and a pattern string's spellings of
       * escapable characters (one alternative per third hex digit) */
      {DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\", \"additionalProperties\": {\"type\": \"string\"},"
                               " \"x-guidance\": {\"json_allowed_escapes\": \"nu\", \"lenient\": true}}", 0},
      {DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"^[^a]\\\\s\\\"/$\"}", 0},
      /* indent's layout: rules per nesting level, a $ref at two levels, one-line any values */
      {DI_GRAMMAR_JSON_SCHEMA, "{\"$defs\": {\"p\": {\"type\": \"array\", \"items\": {}}}, \"type\": \"object\","
                               " \"properties\": {\"a\": {\"$ref\": \"#/$defs/p\"}, \"b\": {\"type\": \"object\","
                               " \"properties\": {\"c\": {\"$ref\": \"#/$defs/p\"}}}}}", 2},
      /* Lark's deferred regular operations, parametric instances and a nested grammar */
      {DI_GRAMMAR_LARK, "start: \"{\" r p::0 N %lark { start: \"1\" | \"2\" } \"}\"\n"
                        "r[suffix=\",\", max_chars=4]: /[ab]*/\n"
                        "p::_ : \"a\" p::set_bit(0) %if bit_clear(0) | \"\"\n"
                        "N: /[ab:]+/ & ~\"ba\"\n", 0},
      /* the time formats' leap-second trie (shared by both) and a date */
      {DI_GRAMMAR_JSON_SCHEMA, "{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\", \"format\": \"time\"},"
                               " {\"type\": \"string\", \"format\": \"date-time\"}]}", 0},
      /* max_tokens: the copies, the boundary map and its per-state memo */
      {DI_GRAMMAR_LARK, "start: \"{\" r (\",\" r)* \"}\"\nr[max_tokens=2, suffix=\";\"]: /[ab]+/\n", 0},
  };
  for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++) {
    char what[64];
    snprintf(what, sizeof what, "grammar compile %zu + matcher", i);
    af_run(what, op_grammar, (void *)&grammars[i], AF_DENSE_LONG, AF_STRIDE_LONG); /* the schema: ~3,600 */
  }
  /* the counting hooks wrap this file's: cJSON allocations still pass af_alloc */
  di_json_track_alloc_failures();
  af_arm(0);
  CHECK(op_responses(NULL) == DI_OK && responses_reference);
  af_run("responses body -> chat body (cJSON builders)", op_responses, NULL, AF_DENSE_LONG, AF_STRIDE_LONG);
  engine_cases(); /* engine steps: plain, MTP, DSpark, V4 */
  __real_free(responses_reference);
  return test_finish("test_alloc_failures");
}
