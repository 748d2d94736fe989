/* Tokenizer benchmark (not a test): load time of a tokenizer.json, and single-thread encode
 * throughput over a corpus file whose documents are separated by the byte 0x1E.
 *   bench_tokenizer TOKENIZER_DIR CORPUS [REPEATS]
 * Prints one JSON line: load_ms (best of 5), bytes, docs, tokens, encode_s (best of REPEATS),
 * mb_per_s, and an FNV checksum of all ids (to compare with the Hugging Face run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tokenizer/tokenizer.h"
#include "util/json.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_tokenizer TOKENIZER_DIR CORPUS [REPEATS]\n");
    return 2;
  }
  int repeats = argc > 3 ? atoi(argv[3]) : 3;
  double load_best = 1e9;
  di_tokenizer *t = NULL;
  for (int r = 0; r < 5; r++) {
    di_tokenizer *x;
    double t0 = now_s();
    if (di_tokenizer_load(argv[1], &x) != DI_OK) {
      fprintf(stderr, "bench_tokenizer: %s\n", di_last_error());
      return 1;
    }
    double dt = now_s() - t0;
    if (dt < load_best)
      load_best = dt;
    if (t)
      di_tokenizer_free(t);
    t = x;
  }
  char *data;
  size_t n;
  if (di_read_file(argv[2], &data, &n) != DI_OK) {
    fprintf(stderr, "bench_tokenizer: %s\n", di_last_error());
    return 1;
  }
  double best = 1e9;
  size_t tokens = 0, docs = 0;
  uint64_t sum = 0;
  for (int r = 0; r < repeats; r++) {
    /* a fresh tokenizer each round would measure a cold word cache; HF keeps its cache too */
    tokens = docs = 0;
    sum = 0xcbf29ce484222325ULL;
    double t0 = now_s();
    size_t pos = 0;
    while (pos <= n) {
      char *e = memchr(data + pos, 0x1E, n - pos);
      size_t end = e ? (size_t)(e - data) : n;
      int32_t *ids;
      size_t k;
      if (di_tokenizer_encode(t, data + pos, end - pos, 0, &ids, &k) != DI_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", di_last_error());
        return 1;
      }
      for (size_t i = 0; i < k; i++)
        sum = (sum ^ (uint32_t)ids[i]) * 0x100000001b3ULL;
      tokens += k;
      docs++;
      free(ids);
      pos = end + 1;
    }
    double dt = now_s() - t0;
    if (dt < best)
      best = dt;
  }
  printf("{\"load_ms\": %.2f, \"bytes\": %zu, \"docs\": %zu, \"tokens\": %zu, \"encode_s\": %.4f, "
         "\"mb_per_s\": %.2f, \"checksum\": \"%016llx\"}\n",
         load_best * 1e3, n, docs, tokens, best, (double)n / best / 1e6, (unsigned long long)sum);
  free(data);
  di_tokenizer_free(t);
  return 0;
}
