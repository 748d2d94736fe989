/* `deepinfer perplexity`: the model's perplexity on a text file (llama.cpp's llama-perplexity):
 * the text is tokenized, cut into windows of --ctx tokens (each starting with BOS when the tokenizer
 * adds one), and the negative log-likelihood of the second half of each window is averaged, so every
 * scored token sees at least ctx/2 tokens of context. */
#include "cli.h"
#include "api/model_internal.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int di_cmd_perplexity(int argc, char **argv);

static void help(FILE *f) {
  fprintf(f, "usage: deepinfer perplexity [--model DIR] --file TEXT [--ctx N] [--max-windows N] [--threads N]\n\n"
             "Perplexity of the model on a text file: windows of N tokens (default 256), the second half\n"
             "of each window scored. Prints one JSON object {tokens_scored, windows, nll, ppl}.\n");
}

int di_cmd_perplexity(int argc, char **argv) {
  const char *model = NULL, *file = NULL, *ctx_s = "256", *maxw_s = "0", *threads = NULL, *fmt = "auto";
  int err = 0;
  for (int i = 1; i < argc; i++) {
    if (di_cli_is_help(argv[i])) {
      help(stdout);
      return 0;
    }
    if (di_cli_flag_value(argc, argv, &i, "--model", &model, &err) || di_cli_flag_value(argc, argv, &i, "--file", &file, &err) ||
        di_cli_flag_value(argc, argv, &i, "--ctx", &ctx_s, &err) ||
        di_cli_flag_value(argc, argv, &i, "--max-windows", &maxw_s, &err) ||
        di_cli_flag_value(argc, argv, &i, "--threads", &threads, &err) ||
        di_cli_flag_value(argc, argv, &i, "--load-format", &fmt, &err)) {
      if (err)
        return 2;
      continue;
    }
    fprintf(stderr, "deepinfer perplexity: unknown option '%s'\n", argv[i]);
    help(stderr);
    return 2;
  }
  const int ctx = atoi(ctx_s), max_windows = atoi(maxw_s);
  if (!file || ctx < 4) {
    fprintf(stderr, "deepinfer perplexity: --file is required and --ctx must be >= 4\n");
    return 2;
  }
  const char *dir = model ? model : di_cli_default_model_dir();
  char *text;
  size_t len;
  if (di_read_file(file, &text, &len) != DI_OK) {
    fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
    return 1;
  }
  di_tokenizer *tok = NULL;
  di_model *m = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  float *logits = NULL;
  int rc = 1;
  if (di_tokenizer_load(dir, &tok) != DI_OK || di_tokenizer_encode(tok, text, len, 0, &ids, &n) != DI_OK) {
    fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
    goto done;
  }
  di_model_options opt;
  di_model_options_default(&opt);
  opt.threads = threads ? atoi(threads) : 0;
  opt.load_format = fmt;
  opt.quiet = 1;
  if (di_model_load(dir, &opt, &m) != DI_OK) {
    fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
    goto done;
  }
  const int V = di_model_vocab_size(m), bos = di_tokenizer_add_bos(tok) ? di_tokenizer_bos_id(tok) : -1;
  const int body = bos >= 0 ? ctx - 1 : ctx;
  if (ctx > di_model_max_context(m)) {
    fprintf(stderr, "deepinfer perplexity: --ctx %d exceeds the model's context %d\n", ctx, di_model_max_context(m));
    goto done;
  }
  logits = malloc(sizeof(float) * (size_t)ctx * (size_t)V);
  int32_t *win = malloc(sizeof(int32_t) * (size_t)ctx);
  double nll = 0;
  long scored = 0;
  int windows = 0;
  for (size_t start = 0; start + (size_t)body <= n && (max_windows <= 0 || windows < max_windows); start += (size_t)body) {
    int k = 0;
    if (bos >= 0)
      win[k++] = bos;
    memcpy(win + k, ids + start, sizeof(int32_t) * (size_t)body);
    if (di_model_score(m, win, ctx, logits) != DI_OK) {
      fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
      free(win);
      goto done;
    }
    for (int t = ctx / 2; t < ctx - 1; t++) { /* logits at t predict win[t + 1] */
      const float *l = logits + (size_t)t * V;
      float mx = l[0];
      for (int v = 1; v < V; v++)
        mx = l[v] > mx ? l[v] : mx;
      double s = 0;
      for (int v = 0; v < V; v++)
        s += exp((double)l[v] - mx);
      nll += (log(s) + mx) - l[win[t + 1]];
      scored++;
    }
    windows++;
  }
  free(win);
  if (!scored) {
    fprintf(stderr, "deepinfer perplexity: the text has fewer than %d tokens\n", body);
    goto done;
  }
  printf("{\"tokens_scored\": %ld, \"windows\": %d, \"ctx\": %d, \"nll\": %.6f, \"ppl\": %.4f}\n", scored, windows, ctx,
         nll / (double)scored, exp(nll / (double)scored));
  rc = 0;
done:
  free(logits);
  free(ids);
  free(text);
  di_model_free(m);
  di_tokenizer_free(tok);
  return rc;
}
