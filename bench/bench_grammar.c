/* Grammar benchmark: compile time and per-token mask time on one core with a real tokenizer.
 * Replays documents (target outputs valid for the grammar) token by token: for each step it times
 * di_grammar_matcher_fill_mask, then accepts the document's next token (and finally EOS).
 *   bench_grammar --tokenizer DIR (--schema FILE | --lark FILE | --json) --docs FILE [--ids FILE] [--warm]
 *                 [--strict] [--no-generation-bounds] [--max-digits N] [--max-string-length N]
 *                 (grammar options, see grammar.h)
 * --docs: one JSON string per line (the output text). --ids: the same documents' token ids, one
 * line of space-separated ids each (e.g. from the Hugging Face tokenizer, so that other engines
 * replay identical sequences); without it the documents are encoded with DeepInfer's tokenizer.
 * Each document gets a freshly compiled grammar (cold caches) unless --warm. BENCH_GRAMMAR_TRACE=1
 * prints each mask's CPU time on stderr (with DI_GRAMMAR_DEBUG=1, between the walks it caused). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* This thread's CPU time: what a mask costs without the preemption a shared machine adds to the
 * wall clock (reported beside it). */
static double cpu_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* This thread's minor page faults so far (BENCH_GRAMMAR_TRACE: fresh memory a mask touches). */
static long minor_faults(void) {
  struct rusage u;
  return getrusage(RUSAGE_THREAD, &u) == 0 ? u.ru_minflt : 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
  if (n == 0)
    return 0;
  int k = (int)(p * (n - 1) + 0.5);
  return v[k];
}

int main(int argc, char **argv) {
  const char *tok_dir = NULL, *schema = NULL, *docs = NULL, *ids_file = NULL;
  const int trace = getenv("BENCH_GRAMMAR_TRACE") != NULL;
  int json_any = 0, lark = 0, warm = 0, strict = 0, unbounded = 0, max_digits = 0, max_string = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
      tok_dir = argv[++i];
    else if (!strcmp(argv[i], "--schema") && i + 1 < argc)
      schema = argv[++i];
    else if (!strcmp(argv[i], "--docs") && i + 1 < argc)
      docs = argv[++i];
    else if (!strcmp(argv[i], "--ids") && i + 1 < argc)
      ids_file = argv[++i];
    else if (!strcmp(argv[i], "--lark") && i + 1 < argc) /* a Lark grammar instead of a schema */
      schema = argv[++i], lark = 1;
    else if (!strcmp(argv[i], "--json"))
      json_any = 1;
    else if (!strcmp(argv[i], "--warm"))
      warm = 1;
    else if (!strcmp(argv[i], "--strict"))
      strict = 1;
    else if (!strcmp(argv[i], "--no-generation-bounds"))
      unbounded = 1;
    else if (!strcmp(argv[i], "--max-digits") && i + 1 < argc)
      max_digits = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--max-string-length") && i + 1 < argc)
      max_string = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_grammar --tokenizer DIR (--schema FILE | --lark FILE | --json) --docs FILE [--ids FILE] [--warm]\n");
      return 2;
    }
  }
  if (!tok_dir || !docs || (!schema && !json_any)) {
    fprintf(stderr, "bench_grammar: --tokenizer, --docs and --schema or --json are required\n");
    return 2;
  }
  di_tokenizer *tok = NULL;
  if (di_tokenizer_load(tok_dir, &tok) != DI_OK) {
    fprintf(stderr, "bench_grammar: %s\n", di_last_error());
    return 1;
  }
  double t0 = now_us();
  di_grammar_vocab *v = NULL;
  if (di_grammar_vocab_from_tokenizer(tok, 0, NULL, 0, &v) != DI_OK) {
    fprintf(stderr, "bench_grammar: %s\n", di_last_error());
    return 1;
  }
  double t_vocab = now_us() - t0;
  int eos = di_tokenizer_eos_id(tok);
  char *src = NULL;
  size_t src_len = 0;
  if (schema && di_read_file(schema, &src, &src_len) != DI_OK) {
    fprintf(stderr, "bench_grammar: %s\n", di_last_error());
    return 1;
  }
  char *dtext = NULL, *itext = NULL;
  size_t dlen = 0, ilen = 0;
  if (di_read_file(docs, &dtext, &dlen) != DI_OK || (ids_file && di_read_file(ids_file, &itext, &ilen) != DI_OK)) {
    fprintf(stderr, "bench_grammar: %s\n", di_last_error());
    return 1;
  }
  int W = (di_grammar_vocab_size(v) + 31) / 32;
  uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)W);
  size_t cap = 1 << 16;
  double *mt = malloc(sizeof(double) * cap), *mc = malloc(sizeof(double) * cap), *ct = malloc(sizeof(double) * 4096),
         *cct = malloc(sizeof(double) * 4096);
  int nm = 0, nc = 0, ndocs = 0, bad = 0, first_n = 0;
  di_grammar_kind kind = json_any ? DI_GRAMMAR_JSON_ANY : lark ? DI_GRAMMAR_LARK : DI_GRAMMAR_JSON_SCHEMA;
  di_grammar_options opt = {0};
  opt.no_cache = !warm;
  opt.strict = strict;
  opt.max_digits = unbounded ? -1 : max_digits;
  opt.max_string_length = unbounded ? -1 : max_string;
  di_grammar *shared = NULL;
  char *dsave = NULL, *isave = NULL;
  char *iline = itext ? strtok_r(itext, "\n", &isave) : NULL;
  for (char *line = strtok_r(dtext, "\n", &dsave); line; line = strtok_r(NULL, "\n", &dsave)) {
    cJSON *j = cJSON_Parse(line);
    if (!cJSON_IsString(j)) {
      cJSON_Delete(j);
      continue;
    }
    const char *text = j->valuestring;
    int32_t *ids = NULL;
    size_t n = 0;
    if (iline) {
      ids = malloc(sizeof(int32_t) * (strlen(iline) / 2 + 2));
      for (char *p = iline, *end; *p; p = end) {
        long x = strtol(p, &end, 10);
        if (end == p)
          break;
        ids[n++] = (int32_t)x;
      }
      iline = strtok_r(NULL, "\n", &isave);
    } else if (di_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n) != DI_OK) {
      fprintf(stderr, "bench_grammar: %s\n", di_last_error());
      return 1;
    }
    di_grammar *g = shared;
    double c0 = now_us(), cc0 = cpu_us();
    if (!g && di_grammar_compile(kind, src ? src : "", src_len, &opt, &g) != DI_OK) {
      fprintf(stderr, "bench_grammar: %s\n", di_last_error());
      return 1;
    }
    double c1 = now_us(), cc1 = cpu_us();
    if (!shared && nc < 4096) {
      cct[nc] = (cc1 - cc0) / 1e3;
      ct[nc++] = (c1 - c0) / 1e3;
    }
    if (warm)
      shared = g;
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_create(g, v, &m) != DI_OK) {
      fprintf(stderr, "bench_grammar: %s\n", di_last_error());
      return 1;
    }
    for (size_t k = 0; k <= n; k++) {
      const long fa = trace ? minor_faults() : 0;
      double a = now_us(), ca = cpu_us();
      if (di_grammar_matcher_fill_mask(m, mask) != DI_OK) {
        fprintf(stderr, "bench_grammar: %s\n", di_last_error());
        return 1;
      }
      double b = now_us(), cb = cpu_us();
      if ((size_t)nm == cap) {
        cap *= 2;
        mt = realloc(mt, sizeof(double) * cap);
        mc = realloc(mc, sizeof(double) * cap);
      }
      mc[nm] = cb - ca;
      mt[nm++] = b - a;
      if (trace) /* BENCH_GRAMMAR_TRACE=1: each mask's CPU time on stderr, between DI_GRAMMAR_DEBUG's lines */
        fprintf(stderr, "mask doc %d step %zu cpu_us %.1f faults %ld\n", ndocs, k, cb - ca, minor_faults() - fa);
      int32_t id = k < n ? ids[k] : eos;
      if (!((mask[id >> 5] >> (id & 31)) & 1u) || di_grammar_matcher_accept_token(m, id) != DI_OK) {
        if (bad++ < 3)
          fprintf(stderr, "bench_grammar: document %d: token %zu (id %d) not allowed: %s\n", ndocs, k, id, text);
        break;
      }
    }
    di_grammar_matcher_free(m);
    if (!warm)
      di_grammar_free(g);
    free(ids);
    cJSON_Delete(j);
    if (ndocs++ == 0)
      first_n = nm;
  }
  /* the first document alone: what a process that has seen no grammar yet pays (later documents
   * may reuse classifications shared through the vocabulary, see src/grammar/ci_shared.h) */
  double *first = malloc(sizeof(double) * ((size_t)first_n + 1));
  memcpy(first, mc, sizeof(double) * (size_t)first_n);
  qsort(first, (size_t)first_n, sizeof(double), cmp_d);
  qsort(mt, (size_t)nm, sizeof(double), cmp_d);
  qsort(mc, (size_t)nm, sizeof(double), cmp_d);
  qsort(ct, (size_t)nc, sizeof(double), cmp_d);
  qsort(cct, (size_t)nc, sizeof(double), cmp_d);
  double sum = 0, csum = 0;
  for (int i = 0; i < nm; i++) {
    sum += mt[i];
    csum += mc[i];
  }
  printf("documents %d (rejected %d), mask calls %d, vocab %d ids (vocab build %.1f ms), caches %s\n", ndocs, bad, nm,
         di_grammar_vocab_size(v), t_vocab / 1e3, warm ? "warm (one grammar for all documents)" : "cold (fresh grammar per document)");
  printf("mask us: median %.2f  p90 %.2f  p99 %.2f  max %.1f  mean %.2f\n", pct(mt, nm, 0.5), pct(mt, nm, 0.9),
         pct(mt, nm, 0.99), nm ? mt[nm - 1] : 0.0, nm ? sum / nm : 0.0);
  printf("mask cpu us: median %.2f  p90 %.2f  p99 %.2f  max %.1f  mean %.2f (thread CPU time)\n", pct(mc, nm, 0.5),
         pct(mc, nm, 0.9), pct(mc, nm, 0.99), nm ? mc[nm - 1] : 0.0, nm ? csum / nm : 0.0);
  printf("first document mask cpu us: median %.2f  p90 %.2f  p99 %.2f  max %.1f (%d calls)\n", pct(first, first_n, 0.5),
         pct(first, first_n, 0.9), pct(first, first_n, 0.99), first_n ? first[first_n - 1] : 0.0, first_n);
  free(first);
  printf("compile ms: median %.3f  max %.3f (%d compiles)\n", pct(ct, nc, 0.5), nc ? ct[nc - 1] : 0.0, nc);
  printf("compile cpu ms: median %.3f  max %.3f (thread CPU time)\n", pct(cct, nc, 0.5), nc ? cct[nc - 1] : 0.0);
  if (shared)
    di_grammar_free(shared);
  di_grammar_vocab_free(v);
  di_tokenizer_free(tok);
  free(mask);
  free(mt);
  free(mc);
  free(ct);
  free(cct);
  free(src);
  free(dtext);
  free(itext);
  return bad ? 1 : 0;
}
