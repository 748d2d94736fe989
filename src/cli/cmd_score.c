/* `deepinfer score`: the logits at every position of a token sequence, written as the F32 tensor
 * `logits` [T, vocab] of a safetensors file (for comparisons against reference implementations). */
#include "cli.h"
#include "deepinfer.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int write_logits(const char *path, const float *logits, int T, int V) {
  char header[256];
  size_t nbytes = (size_t)T * (size_t)V * 4;
  int hl = snprintf(header, sizeof header, "{\"logits\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]}}", T, V,
                    nbytes);
  while (hl % 8)
    header[hl++] = ' ';
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  uint64_t len = (uint64_t)hl;
  unsigned char le[8];
  for (int i = 0; i < 8; i++)
    le[i] = (unsigned char)(len >> (8 * i));
  int ok = fwrite(le, 1, 8, f) == 8 && fwrite(header, 1, (size_t)hl, f) == (size_t)hl &&
           fwrite(logits, 1, nbytes, f) == nbytes;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

static void help(FILE *f) {
  fprintf(f, "usage: deepinfer score [--model DIR] --ids 1,2,3 --out FILE.safetensors [options]\n\n"
             "Runs the token sequence through the model and writes the F32 tensor `logits` [T, vocab]\n"
             "(the logits at every position) to FILE.safetensors.\n\n"
             "options:\n"
             "  --model DIR          model folder (default: $DEEPINFER_HF_MODEL_DIR, else the shipped model)\n"
             "  --ids LIST           comma-separated token ids\n"
             "  --out FILE           output safetensors file\n"
             "  --load-format FMT    auto (default) or dummy (random weights, no weight files)\n"
             "  --threads N          CPU threads (default: all cores)\n");
}

int di_cmd_score(int argc, char **argv) {
  const char *model = NULL, *ids_s = NULL, *out = NULL, *fmt = "auto", *threads = NULL;
  int err = 0;
  for (int i = 1; i < argc; i++) {
    if (di_cli_is_help(argv[i])) {
      help(stdout);
      return 0;
    }
    if (di_cli_flag_value(argc, argv, &i, "--model", &model, &err) || di_cli_flag_value(argc, argv, &i, "--ids", &ids_s, &err) ||
        di_cli_flag_value(argc, argv, &i, "--out", &out, &err) ||
        di_cli_flag_value(argc, argv, &i, "--load-format", &fmt, &err) ||
        di_cli_flag_value(argc, argv, &i, "--threads", &threads, &err)) {
      if (err)
        return 2;
      continue;
    }
    fprintf(stderr, "deepinfer score: unknown option '%s'\n", argv[i]);
    help(stderr);
    return 2;
  }
  if (!ids_s || !out) {
    fprintf(stderr, "deepinfer score: --ids and --out are required\n");
    return 2;
  }
  int32_t *ids;
  int n = di_cli_parse_ids(ids_s, &ids, NULL);
  if (n <= 0) {
    fprintf(stderr, "deepinfer score: --ids must be a non-empty comma-separated list of token ids\n");
    return 2;
  }
  di_model_options opt;
  di_model_options_default(&opt);
  opt.load_format = fmt;
  opt.threads = threads ? atoi(threads) : 0;
  di_model *m;
  if (di_model_load(model ? model : di_cli_default_model_dir(), &opt, &m) != DI_OK) {
    fprintf(stderr, "deepinfer score: %s\n", di_last_error());
    free(ids);
    return 1;
  }
  const int V = di_model_vocab_size(m);
  float *logits = malloc(sizeof(float) * (size_t)n * (size_t)V);
  int rc = 0;
  if (!logits) {
    fprintf(stderr, "deepinfer score: out of memory\n");
    rc = 1;
  } else if (di_model_score(m, ids, n, logits) != DI_OK) {
    fprintf(stderr, "deepinfer score: %s\n", di_last_error());
    rc = 1;
  } else if (write_logits(out, logits, n, V) != 0) {
    fprintf(stderr, "deepinfer score: cannot write %s\n", out);
    rc = 1;
  }
  free(logits);
  free(ids);
  di_model_free(m);
  return rc;
}
