/* `deepinfer grammar`: compiles a grammar (--regex RE | --json-schema FILE | --grammar FILE |
 * --json) and, with --check, reads stdin verbatim and exits 0 when the grammar accepts it whole,
 * 1 when not, 2 (with a message and position) when the grammar itself is malformed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"
#include "grammar/grammar.h"
#include "util/json.h"

int di_cmd_grammar(int argc, char **argv);

static void usage(FILE *f) {
  fprintf(f, "usage: deepinfer grammar (--regex RE | --json-schema FILE | --grammar FILE | --json) [options]\n"
             "  --check                 read stdin verbatim; exit 0 if the grammar accepts it whole, 1 if not\n"
             "  --check-prefix          read stdin verbatim; exit 0 if it is a prefix of some accepted string\n"
             "                          (what a generation cut by max_tokens must be), 1 if not\n"
             "  --grammar-syntax S      --grammar FILE's syntax: gbnf (llama.cpp) or lark (llguidance);\n"
             "                          default lark for a .lark file, else gbnf\n"
             "  --print                 print the compiled grammar (GBNF-like) to stdout\n"
             "  --max-whitespace N      JSON: whitespace characters allowed between tokens (default 0)\n"
             "  --ignore-unsupported    JSON Schema: skip keywords it cannot enforce instead of failing\n"
             "  --strict                JSON Schema: XGrammar's strict mode (no properties beyond the named ones\n"
             "                          where additionalProperties is absent)\n"
             "  --max-digits N          JSON: digits of numbers the schema leaves unbounded (default 16, -1 = any)\n"
             "  --max-string-length N   JSON: characters of strings without maxLength (pattern and format\n"
             "                          strings and additional keys too; default 4096, -1 = any)\n"
             "  --no-generation-bounds  both of the above unbounded (what validation means)\n"
             "  --item-separator S      JSON: exactly S between items and members (',' with whitespace\n"
             "                          around it, e.g. \", \" as XGrammar's any_whitespace=False writes)\n"
             "  --key-separator S       JSON: exactly S between a key and its value (':' with whitespace)\n"
             "  --indent N              JSON Schema: XGrammar's indent layout, N (1..16) spaces per level\n"
             "                          (separators ',' and ': ' unless given; default: one line)\n"
             "exit status: 0 accepted (or compiled), 1 rejected, 2 malformed grammar or usage error\n");
}


/* A prefix check runs the bytes through a matcher over a vocabulary of the 256 single bytes. */
static int accepts_prefix(const di_grammar *g, const char *s, size_t n) {
  static char bytes[256];
  const char *tok[256];
  size_t lens[256];
  for (int i = 0; i < 256; i++) {
    bytes[i] = (char)i;
    tok[i] = &bytes[i];
    lens[i] = 1;
  }
  di_grammar_vocab *v = NULL;
  di_grammar_matcher *m = NULL;
  int ok = di_grammar_vocab_create(256, tok, lens, NULL, 0, &v) == DI_OK && di_grammar_matcher_create(g, v, &m) == DI_OK &&
           di_grammar_matcher_accept_bytes(m, s, n) == DI_OK;
  di_grammar_matcher_free(m);
  di_grammar_vocab_free(v);
  return ok;
}

int di_cmd_grammar(int argc, char **argv) {
  const char *regex = NULL, *schema_file = NULL, *grammar_file = NULL, *ws = NULL, *digits = NULL, *strlen_max = NULL,
             *syntax = NULL, *item_sep = NULL, *key_sep = NULL,
             *indent = NULL;
  int json_any = 0, check = 0, check_prefix = 0, print = 0, ignore = 0, err = 0, nkinds = 0, strict = 0, unbounded = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    if (di_cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    } else if (di_cli_flag_value(argc, argv, &i, "--regex", &v, &err)) {
      regex = v, nkinds++;
    } else if (di_cli_flag_value(argc, argv, &i, "--json-schema", &v, &err)) {
      schema_file = v, nkinds++;
    } else if (di_cli_flag_value(argc, argv, &i, "--grammar", &v, &err)) {
      grammar_file = v, nkinds++;
    } else if (di_cli_flag_value(argc, argv, &i, "--max-whitespace", &v, &err)) {
      ws = v;
    } else if (di_cli_flag_value(argc, argv, &i, "--grammar-syntax", &v, &err)) {
      syntax = v;
    } else if (di_cli_flag_value(argc, argv, &i, "--max-digits", &v, &err)) {
      digits = v;
    } else if (di_cli_flag_value(argc, argv, &i, "--max-string-length", &v, &err)) {
      strlen_max = v;
    } else if (di_cli_flag_value(argc, argv, &i, "--item-separator", &v, &err)) {
      item_sep = v;
    } else if (di_cli_flag_value(argc, argv, &i, "--key-separator", &v, &err)) {
      key_sep = v;
    } else if (di_cli_flag_value(argc, argv, &i, "--indent", &v, &err)) {
      indent = v;
    } else if (strcmp(argv[i], "--strict") == 0) {
      strict = 1;
    } else if (strcmp(argv[i], "--no-generation-bounds") == 0) {
      unbounded = 1;
    } else if (strcmp(argv[i], "--json") == 0) {
      json_any = 1, nkinds++;
    } else if (strcmp(argv[i], "--check") == 0) {
      check = 1;
    } else if (strcmp(argv[i], "--check-prefix") == 0) {
      check = check_prefix = 1;
    } else if (strcmp(argv[i], "--print") == 0) {
      print = 1;
    } else if (strcmp(argv[i], "--ignore-unsupported") == 0) {
      ignore = 1;
    } else {
      fprintf(stderr, "deepinfer grammar: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
    if (err)
      return 2;
  }
  if (nkinds != 1) {
    fprintf(stderr, "deepinfer grammar: give exactly one of --regex, --json-schema, --grammar, --json\n");
    usage(stderr);
    return 2;
  }
  if (syntax && strcmp(syntax, "gbnf") != 0 && strcmp(syntax, "lark") != 0) {
    fprintf(stderr, "deepinfer grammar: --grammar-syntax must be gbnf or lark, not '%s'\n", syntax);
    return 2;
  }
  if (syntax && !grammar_file) {
    fprintf(stderr, "deepinfer grammar: --grammar-syntax goes with --grammar FILE\n");
    return 2;
  }
  di_grammar_options opt = {0};
  opt.ignore_unsupported_keywords = ignore;
  if (ws)
    opt.max_whitespace = atoi(ws);
  opt.strict = strict;
  opt.max_digits = opt.max_string_length = unbounded ? -1 : 0;
  int bad_bound = 0;
  if (digits && (opt.max_digits = atoi(digits)) == 0)
    bad_bound = 1;
  if (strlen_max && (opt.max_string_length = atoi(strlen_max)) == 0)
    bad_bound = 1;
  if ((item_sep && strlen(item_sep) >= sizeof opt.item_separator) ||
      (key_sep && strlen(key_sep) >= sizeof opt.key_separator)) {
    fprintf(stderr, "deepinfer grammar: a separator is at most %zu bytes\n", sizeof opt.item_separator - 1);
    return 2;
  }
  if (indent) {
    char *end = NULL;
    long n = strtol(indent, &end, 10);
    if (end == indent || *end || n < 1 || n > DI_GRAMMAR_MAX_INDENT) {
      fprintf(stderr, "deepinfer grammar: --indent takes 1..%d spaces, not '%s'\n", DI_GRAMMAR_MAX_INDENT, indent);
      return 2;
    }
    opt.indent = (int)n;
  }
  if (item_sep)
    memcpy(opt.item_separator, item_sep, strlen(item_sep) + 1);
  if (key_sep)
    memcpy(opt.key_separator, key_sep, strlen(key_sep) + 1);
  if (bad_bound) {
    fprintf(stderr, "deepinfer grammar: --max-digits / --max-string-length take a positive number or -1 (unbounded)\n");
    return 2;
  }
  di_grammar_kind kind;
  char *src = NULL;
  size_t len = 0;
  const char *what = "";
  if (regex) {
    kind = DI_GRAMMAR_REGEX;
    src = strdup(regex);
    len = strlen(regex);
    what = "";
  } else if (json_any) {
    kind = DI_GRAMMAR_JSON_ANY;
    src = strdup("");
  } else {
    kind = schema_file ? DI_GRAMMAR_JSON_SCHEMA : DI_GRAMMAR_EBNF;
    if (grammar_file) {
      size_t fl = strlen(grammar_file);
      int lark = syntax ? strcmp(syntax, "lark") == 0 : fl >= 5 && strcmp(grammar_file + fl - 5, ".lark") == 0;
      if (lark)
        kind = DI_GRAMMAR_LARK;
    }
    what = schema_file ? schema_file : grammar_file;
    if (di_read_file(what, &src, &len) != DI_OK) {
      fprintf(stderr, "deepinfer grammar: %s\n", di_last_error());
      return 2;
    }
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  di_grammar *g = NULL;
  di_status st = di_grammar_compile(kind, src, len, &opt, &g);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  free(src);
  if (st != DI_OK) {
    fprintf(stderr, "deepinfer grammar: %s%s%s\n", what, *what ? ": " : "", di_last_error());
    return 2;
  }
  if (print)
    di_grammar_print(g, stdout);
  int rc = 0;
  if (check) {
    char *in = NULL;
    size_t n = 0;
    if (!(in = di_cli_read_all(stdin, &n))) {
      fprintf(stderr, "deepinfer grammar: cannot read stdin\n");
      di_grammar_free(g);
      return 2;
    }
    di_error_clear();
    if (check_prefix)
      rc = accepts_prefix(g, in, n) ? 0 : 1;
    else
      rc = di_grammar_accepts(g, in, n) ? 0 : 1;
    if (rc)
      fprintf(stderr, "deepinfer grammar: input rejected%s%s\n", *di_last_error() ? ": " : "", di_last_error());
    free(in);
  } else if (!print) {
    fprintf(stderr, "grammar compiled: %d elements in %.3f ms\n", di_grammar_num_elements(g),
            (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
  }
  di_grammar_free(g);
  return rc;
}
