/* Grammar benchmark over many different schemas (the peers' suites, bench/grammar_suite_cases.py):
 * for each case a fresh compile (no compile cache), then its document replayed token by token,
 * timing each mask (thread CPU time and wall clock), as bench_grammar does for one schema. Unlike
 * repeating one schema, the schemas differ, so later cases reuse only the sub-languages they share
 * with earlier ones (src/grammar/ci_shared.h): the "cold" cost a server meets with new schemas.
 *   bench_grammar_suite --tokenizer DIR --cases FILE [--bounds] [--ids FILE] [--times FILE]
 * Generation bounds are off unless --bounds (the suites' instances are validation data). A case
 * whose schema does not compile, or whose document the grammar rejects, is counted and skipped.
 * --ids: each case's token ids, one line per case line (from the Hugging Face tokenizer, so that
 * bench/grammar_compare.py --suite replays the peers' sequences); else DeepInfer's tokenizer.
 * --times: per case a line "case N compile_ms X ok 0|1" and per mask "mask N cpu_us wall_us", for
 * the same-run comparison over the cases every engine replayed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"

static double clock_us(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(const double *v, int n, double p) { return n ? v[(int)(p * (n - 1) + 0.5)] : 0; }

int main(int argc, char **argv) {
  const char *tok_dir = NULL, *cases = NULL, *ids_path = NULL, *times_path = NULL;
  int bounds = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
      tok_dir = argv[++i];
    else if (!strcmp(argv[i], "--cases") && i + 1 < argc)
      cases = argv[++i];
    else if (!strcmp(argv[i], "--bounds"))
      bounds = 1;
    else if (!strcmp(argv[i], "--ids") && i + 1 < argc)
      ids_path = argv[++i];
    else if (!strcmp(argv[i], "--times") && i + 1 < argc)
      times_path = argv[++i];
    else {
      fprintf(stderr, "usage: bench_grammar_suite --tokenizer DIR --cases FILE [--bounds] [--ids FILE] [--times FILE]\n");
      return 2;
    }
  }
  if (!tok_dir || !cases) {
    fprintf(stderr, "bench_grammar_suite: --tokenizer and --cases are required\n");
    return 2;
  }
  di_tokenizer *tok = NULL;
  di_grammar_vocab *v = NULL;
  char *text = NULL, *itext = NULL;
  size_t tlen = 0, ilen = 0;
  if (di_tokenizer_load(tok_dir, &tok) != DI_OK || di_grammar_vocab_from_tokenizer(tok, 0, NULL, 0, &v) != DI_OK ||
      di_read_file(cases, &text, &tlen) != DI_OK || (ids_path && di_read_file(ids_path, &itext, &ilen) != DI_OK)) {
    fprintf(stderr, "bench_grammar_suite: %s\n", di_last_error());
    return 1;
  }
  FILE *times = times_path ? fopen(times_path, "w") : NULL;
  if (times_path && !times) {
    fprintf(stderr, "bench_grammar_suite: cannot write %s\n", times_path);
    return 1;
  }
  int W = (di_grammar_vocab_size(v) + 31) / 32, eos = di_tokenizer_eos_id(tok);
  uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)W);
  size_t cap = 1 << 16;
  double *mc = malloc(sizeof(double) * cap), *mw = malloc(sizeof(double) * cap), *ct = malloc(sizeof(double) * 65536);
  int nm = 0, nc = 0, used = 0, no_compile = 0, rejected = 0;
  char *save = NULL, *isave = NULL;
  char *iline = itext ? strtok_r(itext, "\n", &isave) : NULL;
  int case_no = -1;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *ids_line = iline; /* this case's ids (one line per case line, blank lines skipped alike) */
    if (iline)
      iline = strtok_r(NULL, "\n", &isave);
    case_no++;
    cJSON *j = cJSON_Parse(line);
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(j, "schema"), *doc = cJSON_GetObjectItemCaseSensitive(j, "doc");
    if (!cJSON_IsString(schema) || !cJSON_IsString(doc)) {
      cJSON_Delete(j);
      continue;
    }
    di_grammar_options opt = {0};
    opt.no_cache = 1;
    opt.strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strict"));
    opt.max_digits = opt.max_string_length = bounds ? 0 : -1;
    di_grammar *g = NULL;
    double c0 = clock_us(CLOCK_MONOTONIC);
    if (di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, schema->valuestring, strlen(schema->valuestring), &opt, &g) != DI_OK) {
      no_compile++;
      if (times)
        fprintf(times, "case %d compile_ms -1 ok 0\n", case_no);
      cJSON_Delete(j);
      continue;
    }
    const double compile_ms = (clock_us(CLOCK_MONOTONIC) - c0) / 1e3;
    if (nc < 65536)
      ct[nc++] = compile_ms;
    int32_t *ids = NULL;
    size_t n = 0;
    di_grammar_matcher *m = NULL;
    if (ids_line) {
      ids = malloc(sizeof(int32_t) * (strlen(ids_line) / 2 + 2));
      for (char *p = ids_line, *end; ids; p = end) {
        long x = strtol(p, &end, 10);
        if (end == p)
          break;
        ids[n++] = (int32_t)x;
      }
    } else if (di_tokenizer_encode(tok, doc->valuestring, strlen(doc->valuestring), 0, &ids, &n) != DI_OK) {
      ids = NULL;
    }
    if (!ids || di_grammar_matcher_create(g, v, &m) != DI_OK) {
      fprintf(stderr, "bench_grammar_suite: %s\n", di_last_error());
      return 1;
    }
    int ok = 1;
    for (size_t k = 0; k <= n && ok; k++) {
      double w0 = clock_us(CLOCK_MONOTONIC), c1 = clock_us(CLOCK_THREAD_CPUTIME_ID);
      if (di_grammar_matcher_fill_mask(m, mask) != DI_OK) {
        ok = 0;
        break;
      }
      double c2 = clock_us(CLOCK_THREAD_CPUTIME_ID), w1 = clock_us(CLOCK_MONOTONIC);
      if ((size_t)nm == cap) {
        cap *= 2;
        mc = realloc(mc, sizeof(double) * cap);
        mw = realloc(mw, sizeof(double) * cap);
      }
      mc[nm] = c2 - c1;
      mw[nm++] = w1 - w0;
      if (times)
        fprintf(times, "mask %d %.3f %.3f\n", case_no, c2 - c1, w1 - w0);
      int32_t id = k < n ? ids[k] : eos;
      ok = ((mask[id >> 5] >> (id & 31)) & 1u) && di_grammar_matcher_accept_token(m, id) == DI_OK;
    }
    rejected += !ok;
    used += ok;
    if (times)
      fprintf(times, "case %d compile_ms %.4f ok %d\n", case_no, compile_ms, ok);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    free(ids);
    cJSON_Delete(j);
  }
  qsort(mc, (size_t)nm, sizeof(double), cmp_d);
  qsort(mw, (size_t)nm, sizeof(double), cmp_d);
  qsort(ct, (size_t)nc, sizeof(double), cmp_d);
  printf("cases replayed %d (schema refused %d, document rejected %d), mask calls %d, bounds %s\n", used, no_compile,
         rejected, nm, bounds ? "default" : "off");
  printf("mask cpu us: median %.2f  p90 %.2f  p99 %.2f  max %.1f (thread CPU time)\n", pct(mc, nm, 0.5),
         pct(mc, nm, 0.9), pct(mc, nm, 0.99), nm ? mc[nm - 1] : 0.0);
  printf("mask us: median %.2f  p90 %.2f  p99 %.2f  max %.1f (wall clock)\n", pct(mw, nm, 0.5), pct(mw, nm, 0.9),
         pct(mw, nm, 0.99), nm ? mw[nm - 1] : 0.0);
  printf("compile ms: median %.3f  p99 %.3f (%d compiles)\n", pct(ct, nc, 0.5), pct(ct, nc, 0.99), nc);
  di_grammar_vocab_free(v);
  di_tokenizer_free(tok);
  free(mask);
  free(mc);
  free(mw);
  free(ct);
  free(text);
  free(itext);
  if (times)
    fclose(times);
  return 0;
}
