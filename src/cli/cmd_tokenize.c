/* `deepinfer tokenize` and `deepinfer detokenize`: text <-> token ids with a model's tokenizer.json,
 * exactly as Hugging Face `tokenizers` encode(text, add_special_tokens) / decode(ids, skip). */
#include "cli.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"
#include <stdlib.h>
#include <string.h>

int di_cmd_tokenize(int argc, char **argv);
int di_cmd_detokenize(int argc, char **argv);


static void print_ids(FILE *f, const int32_t *ids, size_t n) {
  fputc('[', f);
  for (size_t i = 0; i < n; i++)
    fprintf(f, i ? ", %d" : "%d", (int)ids[i]);
  fputc(']', f);
}

/* JSON string literal of s[0..n) (valid UTF-8 passes through). */
static void print_json_string(FILE *f, const char *s, size_t n) {
  fputc('"', f);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c == '\n')
      fputs("\\n", f);
    else if (c == '\r')
      fputs("\\r", f);
    else if (c == '\t')
      fputs("\\t", f);
    else if (c < 0x20 || c == 0x7F)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static int load(const char *dir, di_tokenizer **t) {
  if (di_tokenizer_load(dir, t) != DI_OK) {
    fprintf(stderr, "deepinfer: %s\n", di_last_error());
    return 1;
  }
  return 0;
}

static const char *default_dir(const char *dir) { return dir ? dir : di_cli_default_model_dir(); }

int di_cmd_tokenize(int argc, char **argv) {
  const char *dir = NULL;
  int add_special = 0, jsonl = 0, err = 0;
  for (int i = 1; i < argc; i++) {
    if (di_cli_is_help(argv[i])) {
      printf("usage: deepinfer tokenize [--tokenizer DIR] [--add-special-tokens] [--jsonl]\n\n"
             "Reads text from stdin verbatim (a trailing newline is part of the text) and prints its token\n"
             "ids as a JSON array: Hugging Face tokenizers' encode(text, add_special_tokens=False).\n"
             "  --tokenizer DIR        folder with tokenizer.json (+ tokenizer_config.json), or the file;\n"
             "                         a model folder works (default: --model / $DEEPINFER_HF_MODEL_DIR)\n"
             "  --add-special-tokens   add what the post-processor adds (e.g. BOS)\n"
             "  --jsonl                each input line {\"text\": ...} gives an output line {\"ids\": [...]}\n"
             "Invalid UTF-8 in the input: each maximal invalid byte sequence is read as U+FFFD.\n");
      return 0;
    }
    if (di_cli_flag_value(argc, argv, &i, "--tokenizer", &dir, &err) ||
        di_cli_flag_value(argc, argv, &i, "--model", &dir, &err)) {
      if (err)
        return 2;
    } else if (!strcmp(argv[i], "--add-special-tokens")) {
      add_special = 1;
    } else if (!strcmp(argv[i], "--jsonl")) {
      jsonl = 1;
    } else {
      fprintf(stderr, "deepinfer tokenize: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  di_tokenizer *t;
  if (load(default_dir(dir), &t))
    return 1;
  char *in;
  size_t n;
  if (!(in = di_cli_read_all(stdin, &n))) {
    fprintf(stderr, "deepinfer tokenize: out of memory reading stdin\n");
    di_tokenizer_free(t);
    return 1;
  }
  int rc = 0;
  if (!jsonl) {
    int32_t *ids;
    size_t k;
    if (di_tokenizer_encode(t, in, n, add_special, &ids, &k) != DI_OK) {
      fprintf(stderr, "deepinfer tokenize: %s\n", di_last_error());
      rc = 1;
    } else {
      print_ids(stdout, ids, k);
      fputc('\n', stdout);
      free(ids);
    }
  } else {
    size_t line = 0, pos = 0;
    while (pos < n && rc == 0) {
      char *nl = memchr(in + pos, '\n', n - pos);
      size_t end = nl ? (size_t)(nl - in) : n;
      line++;
      cJSON *j = NULL;
      const char *what = "stdin";
      if (end > pos && di_json_parse(in + pos, end - pos, what, &j) == DI_OK) {
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (!cJSON_IsString(tx)) {
          fprintf(stderr, "deepinfer tokenize: line %zu: expected {\"text\": \"...\"}\n", line);
          rc = 1;
        } else {
          int32_t *ids;
          size_t k;
          if (di_tokenizer_encode(t, tx->valuestring, strlen(tx->valuestring), add_special, &ids, &k) != DI_OK) {
            fprintf(stderr, "deepinfer tokenize: line %zu: %s\n", line, di_last_error());
            rc = 1;
          } else {
            fputs("{\"ids\": ", stdout);
            print_ids(stdout, ids, k);
            fputs("}\n", stdout);
            free(ids);
          }
        }
        cJSON_Delete(j);
      } else if (end > pos) {
        fprintf(stderr, "deepinfer tokenize: line %zu: %s\n", line, di_last_error());
        rc = 1;
      }
      pos = end + 1;
    }
  }
  fflush(stdout);
  free(in);
  di_tokenizer_free(t);
  return rc;
}

/* Parses a JSON array of ids. */
static int parse_ids(const cJSON *a, int32_t **ids, size_t *n, const char *ctx) {
  if (!cJSON_IsArray(a)) {
    fprintf(stderr, "deepinfer detokenize: %s: expected a JSON array of token ids\n", ctx);
    return 1;
  }
  size_t k = (size_t)cJSON_GetArraySize(a), i = 0;
  int32_t *v = malloc((k ? k : 1) * sizeof *v);
  if (!v)
    return 1;
  const cJSON *it;
  cJSON_ArrayForEach(it, a) {
    int64_t id;
    if (!di_json_int_in(it, -2147483648.0, 2147483647.0, &id)) {
      fprintf(stderr, "deepinfer detokenize: %s: element %zu is not an integer token id\n", ctx, i);
      free(v);
      return 1;
    }
    v[i++] = (int32_t)id;
  }
  *ids = v;
  *n = k;
  return 0;
}

static int detok_one(const di_tokenizer *t, const int32_t *ids, size_t n, int skip, int stream, char **text,
                     size_t *len) {
  if (!stream)
    return di_tokenizer_decode(t, ids, n, skip, text, len) != DI_OK;
  /* through the streaming detokenizer, one token at a time (same text by contract) */
  di_detok_stream *s;
  if (di_detok_stream_create(t, skip, &s) != DI_OK)
    return 1;
  size_t cap = 256, w = 0;
  char *out = malloc(cap);
  int bad = !out;
  for (size_t i = 0; i <= n && !bad; i++) {
    const char *piece;
    size_t pl;
    di_status st = i < n ? di_detok_stream_push(s, ids[i], &piece, &pl) : di_detok_stream_flush(s, &piece, &pl);
    if (st != DI_OK) {
      bad = 1;
      break;
    }
    while (w + pl + 1 > cap) {
      char *p = realloc(out, cap *= 2);
      if (!p) {
        bad = 1;
        break;
      }
      out = p;
    }
    if (!bad) {
      memcpy(out + w, piece, pl);
      w += pl;
    }
  }
  di_detok_stream_free(s);
  if (bad) {
    free(out);
    return 1;
  }
  out[w] = 0;
  *text = out;
  *len = w;
  return 0;
}

int di_cmd_detokenize(int argc, char **argv) {
  const char *dir = NULL;
  int skip = 0, jsonl = 0, stream = 0, err = 0;
  for (int i = 1; i < argc; i++) {
    if (di_cli_is_help(argv[i])) {
      printf("usage: deepinfer detokenize [--tokenizer DIR] [--skip-special-tokens] [--jsonl] [--stream]\n\n"
             "Reads a JSON array of token ids from stdin and prints their text verbatim (no newline added):\n"
             "Hugging Face tokenizers' decode(ids, skip_special_tokens), then the clean-up of tokenization\n"
             "spaces when tokenizer_config.json asks for it.\n"
             "  --tokenizer DIR         folder with tokenizer.json, or the file (a model folder works)\n"
             "  --skip-special-tokens   leave special tokens out\n"
             "  --jsonl                 each input line {\"ids\": [...]} gives an output line {\"text\": ...}\n"
             "  --stream                decode through the streaming detokenizer, one token at a time\n");
      return 0;
    }
    if (di_cli_flag_value(argc, argv, &i, "--tokenizer", &dir, &err) ||
        di_cli_flag_value(argc, argv, &i, "--model", &dir, &err)) {
      if (err)
        return 2;
    } else if (!strcmp(argv[i], "--skip-special-tokens")) {
      skip = 1;
    } else if (!strcmp(argv[i], "--jsonl")) {
      jsonl = 1;
    } else if (!strcmp(argv[i], "--stream")) {
      stream = 1;
    } else {
      fprintf(stderr, "deepinfer detokenize: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  di_tokenizer *t;
  if (load(default_dir(dir), &t))
    return 1;
  char *in;
  size_t n;
  if (!(in = di_cli_read_all(stdin, &n))) {
    di_tokenizer_free(t);
    return 1;
  }
  int rc = 0;
  size_t line = 0, pos = 0;
  while (pos < n && rc == 0) {
    size_t end = n;
    if (jsonl) {
      char *nl = memchr(in + pos, '\n', n - pos);
      end = nl ? (size_t)(nl - in) : n;
    }
    line++;
    if (end == pos) {
      pos = end + 1;
      continue;
    }
    char ctx[64];
    snprintf(ctx, sizeof ctx, jsonl ? "line %zu" : "stdin", line);
    cJSON *j = NULL;
    if (di_json_parse(in + pos, end - pos, ctx, &j) != DI_OK) {
      fprintf(stderr, "deepinfer detokenize: %s\n", di_last_error());
      rc = 1;
      break;
    }
    int32_t *ids = NULL;
    size_t k = 0;
    const cJSON *arr = jsonl ? cJSON_GetObjectItemCaseSensitive(j, "ids") : j;
    if (parse_ids(arr, &ids, &k, ctx)) {
      rc = 1;
    } else {
      char *text;
      size_t tl;
      if (detok_one(t, ids, k, skip, stream, &text, &tl)) {
        fprintf(stderr, "deepinfer detokenize: %s: %s\n", ctx, di_last_error());
        rc = 1;
      } else {
        if (jsonl) {
          fputs("{\"text\": ", stdout);
          print_json_string(stdout, text, tl);
          fputs("}\n", stdout);
        } else {
          fwrite(text, 1, tl, stdout);
        }
        free(text);
      }
      free(ids);
    }
    cJSON_Delete(j);
    pos = end + 1;
  }
  if (!jsonl && n == 0) {
    fprintf(stderr, "deepinfer detokenize: expected a JSON array of token ids on stdin\n");
    rc = 1;
  }
  fflush(stdout);
  free(in);
  di_tokenizer_free(t);
  return rc;
}
