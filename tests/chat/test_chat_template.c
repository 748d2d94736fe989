/* Chat templates against transformers: replays the goldens made by tests/data/chat/make_goldens.py
 * (apply_chat_template of transformers 5.17 on DeepSeek V2/V3/R1, Llama 3/3.2, Qwen 3, a named-
 * template folder and a feature template), the project's DeepSeek-V3 chat fixture, and checks the
 * errors: unsupported constructs named with their position, syntax errors, raise_exception,
 * runaway templates stopped by the limits, bad tokenizer_config.json, and the fuzz corpus. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "test_util.h"
/* the fuzz target itself: its own conversation (tool-call arguments as an object, a non-ASCII
 * message) and limits, replayed over its corpus too (its file-scope names kept apart from this file's) */
#define LLVMFuzzerTestOneInput fuzz_chat_template_one
#define vars fuzz_chat_vars
#include "../../fuzz/fuzz_chat_template.c"
#undef vars
#undef LLVMFuzzerTestOneInput
#include "util/json.h"

static int first_diff(const char *a, size_t na, const char *b, size_t nb) {
  size_t n = na < nb ? na : nb;
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) return (int)i;
  return (int)n;
}

/* Replays one goldens file; returns the number of cases. */
static int replay(const char *name) {
  char rel[256];
  snprintf(rel, sizeof rel, "tests/data/chat/%s", name);
  di_chat_template *t = NULL;
  di_status st = di_chat_template_load(test_path(rel), &t);
  CHECKF(st == DI_OK, "load %s: %s", name, di_last_error());
  if (st != DI_OK) return 0;
  snprintf(rel, sizeof rel, "tests/data/chat/goldens/%s.jsonl", name);
  char *data;
  size_t n;
  st = di_read_file(test_path(rel), &data, &n);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK) {
    di_chat_template_free(t);
    return 0;
  }
  int cases = 0;
  char *line = data;
  while (line && *line) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    cJSON *rec = cJSON_Parse(line);
    CHECKF(rec != NULL, "%s case %d: bad JSON", name, cases);
    if (rec) {
      const cJSON *msgs = cJSON_GetObjectItem(rec, "messages"), *tools = cJSON_GetObjectItem(rec, "tools"),
                  *extra = cJSON_GetObjectItem(rec, "extra"), *text = cJSON_GetObjectItem(rec, "text"),
                  *err = cJSON_GetObjectItem(rec, "error");
      int agp = cJSON_IsTrue(cJSON_GetObjectItem(rec, "add_generation_prompt"));
      const char *conv = cJSON_GetObjectItem(rec, "conversation")->valuestring;
      char *out = NULL;
      size_t len = 0;
      /* The cJSON API cannot tell 21.0 from 21 (cJSON keeps no such distinction), so the case with
       * float literals is checked through the JSON-text API only. */
      if (!strstr(conv, "\"temperature\": 21.0")) {
        st = di_chat_template_render(t, msgs, cJSON_IsNull(tools) ? NULL : tools, agp, extra, &out, &len);
        if (err) CHECKF(st != DI_OK, "%s case %d (cJSON API): rendered where transformers failed", name, cases);
        else CHECKF(st == DI_OK && len == strlen(text->valuestring) && memcmp(out, text->valuestring, len) == 0,
                    "%s case %d (cJSON API): %s", name, cases, st == DI_OK ? "differs" : di_last_error());
        free(out);
        out = NULL;
      }
      st = di_chat_template_render_json(t, conv, -1, &out);
      if (st == DI_OK) len = strlen(out);
      if (err) {
        CHECKF(st != DI_OK, "%s case %d: transformers failed (%s) but we rendered", name, cases, err->valuestring);
        /* raise_exception's message is carried through */
        const char *colon = strstr(err->valuestring, ": ");
        if (st != DI_OK && colon && strncmp(err->valuestring, "TemplateError", 13) == 0)
          CHECKF(strstr(di_last_error(), colon + 2) != NULL, "%s case %d: error '%s' lacks '%s'", name, cases,
                 di_last_error(), colon + 2);
      } else {
        CHECKF(st == DI_OK, "%s case %d: %s", name, cases, di_last_error());
        if (st == DI_OK) {
          size_t want = strlen(text->valuestring);
          int ok = len == want && memcmp(out, text->valuestring, len) == 0;
          int d = first_diff(out, len, text->valuestring, want);
          CHECKF(ok, "%s case %d differs at byte %d:\n  want: %.80s\n  got:  %.80s", name, cases, d,
                 text->valuestring + d, out + d);
        }
      }
      free(out);
      cJSON_Delete(rec);
    }
    cases++;
    line = nl ? nl + 1 : NULL;
  }
  free(data);
  di_chat_template_free(t);
  return cases;
}

static void test_goldens(void) { /* through di_chat_template_render_json and the cJSON API */
  static const char *const names[] = {"deepseek-v3", "deepseek-v2", "deepseek-r1", "deepseek-v3.1", "llama3", "llama3.2",
                                      "qwen3", "named", "features"};
  int total = 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int n = replay(names[i]);
    CHECKF(n >= 20, "%s: only %d golden cases", names[i], n);
    total += n;
  }
  printf("golden cases replayed: %d\n", total);
}

/* The instant the goldens' clock-reading templates were rendered at (2026-11-30 12:00 UTC; SmolLM3
 * prints "Today Date: 30 November 2026"): make_goldens.py pins transformers' clock to it too. */
#define GOLDEN_NOW INT64_C(1796040000)

/* 53 real templates (Zephyr, Mistral, Mixtral, Command-R, Hermes, Llama 3.1/3.2, Qwen 2.5/3/3.5,
 * DeepSeek, MiniCPM3 with call blocks, Jamba with *args, GLM, Kimi, ...) with the inputs of
 * huggingface.js's Jinja end-to-end tests, rendered by transformers 5.17. */
static void test_public_templates(void) {
  char *data;
  size_t n;
  di_status st = di_read_file(test_path("tests/data/chat/public_templates.jsonl"), &data, &n);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK) return;
  int cases = 0;
  for (char *line = data; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    cJSON *rec = cJSON_Parse(line);
    if (rec) {
      const char *name = cJSON_GetObjectItem(rec, "name")->valuestring;
      const cJSON *text = cJSON_GetObjectItem(rec, "text");
      di_chat_template *t = NULL;
      char *out = NULL;
      st = di_chat_template_from_string(cJSON_GetObjectItem(rec, "template")->valuestring, NULL, NULL, &t);
      if (st == DI_OK) di_chat_template_pin_clock(t, GOLDEN_NOW);
      if (st == DI_OK) st = di_chat_template_render_json(t, cJSON_GetObjectItem(rec, "conversation")->valuestring, -1, &out);
      if (text) {
        CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
        if (st == DI_OK) {
          int d = first_diff(out, strlen(out), text->valuestring, strlen(text->valuestring));
          CHECKF(strcmp(out, text->valuestring) == 0, "%s differs at byte %d:\n  want: %.80s\n  got:  %.80s", name, d,
                 text->valuestring + d, out + d);
        }
      } else CHECKF(st != DI_OK, "%s: transformers failed but we rendered", name);
      free(out);
      di_chat_template_free(t);
      cJSON_Delete(rec);
      cases++;
    }
    line = nl ? nl + 1 : NULL;
  }
  free(data);
  CHECKF(cases >= 50, "only %d public templates", cases);
}

/* A pinned clock renders its instant in UTC whatever the time zone; the real clock is local time. */
static void test_pinned_clock(void) {
  di_chat_template *t = NULL;
  CHECK(di_chat_template_from_string("{{ strftime_now('%Y-%m-%d %H:%M %B') }}", NULL, NULL, &t) == DI_OK);
  if (!t) return;
  char *out = NULL;
  di_chat_template_pin_clock(t, GOLDEN_NOW);
  CHECK(di_chat_template_render_json(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", 0, &out) == DI_OK);
  CHECKF(out && strcmp(out, "2026-11-30 12:00 November") == 0, "pinned clock rendered %s", out ? out : "(null)");
  di_string_free(out);
  di_chat_template_pin_clock(t, 0);
  out = NULL;
  CHECK(di_chat_template_render_json(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", 0, &out) == DI_OK);
  CHECKF(out && strcmp(out, "1970-01-01 00:00 January") == 0, "epoch rendered %s", out ? out : "(null)");
  di_string_free(out);
  di_chat_template_free(t);
}

/* The project's DeepSeek-V3 chat fixture (copied from fixtures/chat_dsv3_public.jsonl). */
static void test_dsv3_fixture(void) {
  di_chat_template *t = NULL;
  CHECK(di_chat_template_load(test_path("tests/data/chat/deepseek-v3"), &t) == DI_OK);
  if (!t) return;
  CHECK(strcmp(di_chat_template_token(t, "bos_token"), "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>") == 0);
  CHECK(di_chat_template_token(t, "unk_token") == NULL);
  char *data;
  size_t n;
  CHECK(di_read_file(test_path("tests/data/chat/chat_dsv3_public.jsonl"), &data, &n) == DI_OK);
  int cases = 0;
  for (char *line = data; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    cJSON *rec = cJSON_Parse(line);
    if (rec) {
      char *out = NULL;
      di_status st = di_chat_template_render(t, cJSON_GetObjectItem(rec, "messages"), NULL,
                                             cJSON_IsTrue(cJSON_GetObjectItem(rec, "add_generation_prompt")), NULL, &out, NULL);
      CHECKF(st == DI_OK && strcmp(out, cJSON_GetObjectItem(rec, "text")->valuestring) == 0, "fixture case %d", cases);
      free(out);
      cJSON_Delete(rec);
      cases++;
    }
    line = nl ? nl + 1 : NULL;
  }
  CHECK(cases == 4);
  free(data);
  di_chat_template_free(t);
}

/* Renders `src` with messages [{"role":"user","content":"hi"}]. */
static di_status render_src(const char *src, char **out) {
  di_chat_template *t = NULL;
  *out = NULL;
  di_status st = di_chat_template_from_string(src, "<s>", "</s>", &t);
  if (st != DI_OK) return st;
  cJSON *m = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hi\"}]");
  st = di_chat_template_render(t, m, NULL, 1, NULL, out, NULL);
  cJSON_Delete(m);
  di_chat_template_free(t);
  return st;
}

static void expect_render(const char *src, const char *want) {
  char *out;
  di_status st = render_src(src, &out);
  CHECKF(st == DI_OK && strcmp(out, want) == 0, "template %s: got \"%s\" (%s), want \"%s\"", src, out ? out : "",
         st == DI_OK ? "ok" : di_last_error(), want);
  free(out);
}

static void expect_error(const char *src, di_status want_st, const char *needle) {
  char *out;
  di_status st = render_src(src, &out);
  CHECKF(st == want_st && strstr(di_last_error(), needle) != NULL, "template %s: status %d, message \"%s\", want %d with \"%s\"",
         src, (int)st, di_last_error(), (int)want_st, needle);
  free(out);
}

static void test_errors(void) {
  /* unsupported constructs: named, with their position */
  expect_error("{% include 'other.jinja' %}", DI_ERR_UNSUPPORTED, "line 1 column 4: unsupported construct: the 'include' tag");
  expect_error("ab\n  {{ messages | wordwrap(5) }}", DI_ERR_UNSUPPORTED, "line 2 column 15: unsupported construct: the filter 'wordwrap'");
  expect_error("{% if x is prime %}{% endif %}", DI_ERR_UNSUPPORTED, "unsupported construct: the test 'prime'");
  expect_error("{% for x in y recursive %}{% endfor %}", DI_ERR_UNSUPPORTED, "recursive for loops");
  expect_error("{{ '%d' % 'x' }}", DI_ERR_INVALID_ARG, "a real number is required, not str");
  expect_error("{{ '%s %s' % 1 }}", DI_ERR_INVALID_ARG, "not enough arguments for format string");
  /* widths and precisions past int (fuzz finding: a run of digits overflowed the accumulator) */
  expect_error("{{ '%99999999999999999999999999999999d' % 1 }}", DI_ERR_INVALID_ARG, "width or precision too large");
  expect_error("{{ '%.99999999999999999999999999999999f' % 1.5 }}", DI_ERR_INVALID_ARG, "width or precision too large");
  expect_error("{{ '%*d' % (-1099511627776, 1) }}", DI_ERR_INVALID_ARG, "width or precision too large");
  expect_error("{{ '%.*f' % (1099511627776, 1.5) }}", DI_ERR_INVALID_ARG, "width or precision too large");
  expect_render("{{ '%5d|%.2f|%*d' % (7, 1.234, 3, 4) }}", "    7|1.23|  4");
  /* an empty string or list times a huge count is empty at once (fuzz finding: it looped 5e13 times) */
  expect_render("{{ ('' * 49999999999999) ~ '|' ~ ([] * 49999999999999) | length }}", "|0");
  expect_error("{{ '%s' % (1, 2) }}", DI_ERR_INVALID_ARG, "not all arguments converted");
  expect_error("{{ '%y' % 1 }}", DI_ERR_INVALID_ARG, "unsupported format character 'y'");
  expect_error("{{ 'a'.format(1) }}", DI_ERR_UNSUPPORTED, "the method str.format");
  expect_error("{{ lipsum() }}", DI_ERR_UNSUPPORTED, "lipsum");
  expect_error("{% extends 'base' %}", DI_ERR_UNSUPPORTED, "the 'extends' tag");
  /* syntax errors */
  expect_error("{% if true %}x", DI_ERR_FORMAT, "missing '{% endif %}'");
  expect_error("{% for m in messages %}x{% endif %}", DI_ERR_FORMAT, "unexpected 'endif' tag");
  expect_error("{{ messages ", DI_ERR_FORMAT, "missing '}}'");
  expect_error("{{ 'abc }}", DI_ERR_FORMAT, "unterminated string literal");
  expect_error("x\n{{ ) }}", DI_ERR_FORMAT, "line 2 column 4: unexpected ')'");
  expect_error("{% frobnicate %}", DI_ERR_FORMAT, "unknown tag 'frobnicate'");
  expect_error("{# never closed", DI_ERR_FORMAT, "missing end of comment tag");
  expect_error("{{ 1 + }}", DI_ERR_FORMAT, "expected an expression");
  expect_error("{{ '\\x4' }}", DI_ERR_FORMAT, "truncated");
  /* runtime errors, as Jinja raises them */
  expect_error("{{ raise_exception('Only user and assistant roles are supported!') }}", DI_ERR_INVALID_ARG,
               "raise_exception: Only user and assistant roles are supported!");
  expect_error("{{ nothing.attr }}", DI_ERR_INVALID_ARG, "'nothing' is undefined");
  expect_error("{{ 'a' + messages[0].missing }}", DI_ERR_INVALID_ARG, "'missing' is undefined");
  expect_error("{{ 1 / 0 }}", DI_ERR_INVALID_ARG, "division by zero");
  expect_error("{{ 'a' + 1 }}", DI_ERR_INVALID_ARG, "unsupported operand types for +: 'str' and 'int'");
  expect_error("{{ messages.append(1) }}", DI_ERR_INVALID_ARG, "sandbox");
  expect_error("{% for x in 3 %}{% endfor %}", DI_ERR_INVALID_ARG, "'int' object is not iterable");
  expect_error("{{ range(200000) | length }}", DI_ERR_INVALID_ARG, "Range too big");
  expect_error("{% set x = 1 %}{% set x.y = 2 %}", DI_ERR_INVALID_ARG, "non-namespace");
  expect_error("{% set ns = namespace(_private=1) %}", DI_ERR_INVALID_ARG, "underscore");
  expect_error("{{ {'a': 1} | tojson(indent=2) }}{{ messages | map(attribute='role') | first | tojson }}{{ range | tojson }}",
               DI_ERR_INVALID_ARG, "not JSON serializable");
  expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", DI_ERR_UNSUPPORTED, "nested more than 64 deep");
  /* deep nesting is refused by the parser, not by the stack */
  char deep[4200];
  size_t k = 0;
  k += (size_t)snprintf(deep, sizeof deep, "{{ ");
  for (int i = 0; i < 2000; i++) deep[k++] = '(';
  deep[k++] = '1';
  for (int i = 0; i < 2000; i++) deep[k++] = ')';
  memcpy(deep + k, " }}", 4);
  expect_error(deep, DI_ERR_UNSUPPORTED, "nested too deeply");
  k = 0;
  for (int i = 0; i < 300; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if 1 %%}");
  expect_error(deep, DI_ERR_UNSUPPORTED, "nested too deeply");
}

static void test_semantics(void) {
  /* whitespace: trim_blocks, lstrip_blocks, -, +, one trailing newline dropped, \r\n normalized */
  expect_render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", "a\n  b\nc");
  expect_render("a  {%- if true -%}  b  {%- endif %}\r\nc\r\n\r\n", "abc\n");
  expect_render("  {%+ if true %}x{% endif +%}\ny", "  x\ny");
  expect_render("{{ 'x' }}\n{# comment #}\n  {# indented #}\ny", "x\ny");
  /* Jinja scoping: loop bodies do not leak, namespaces do, if blocks do not scope */
  expect_render("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}", "110;120;1");
  expect_render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}", "3");
  expect_render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "6");
  expect_render("{{ bos_token }}{{ eos_token }}{{ messages[0]['content'] }}{{ add_generation_prompt }}{{ tools }}", "<s></s>hiTrueNone");
  expect_render("{{ 'é'.encode is defined }}|{{ messages[0].content[5] }}|{{ messages[0].nope is defined }}", "True||False");
  expect_render("{% for a, b in {'x': 1, 'y': 2} | items %}{{ a }}{{ b }}{% endfor %}", "x1y2");
  expect_render("{{ '\\u00e9' if false else '\\\\q\\q' }}", "\\q\\q");
  expect_render("{% filter upper %}shout {{ 'it' }}{% endfilter %}", "SHOUT IT");
  expect_render("{% set s | trim %}  padded  {% endset %}[{{ s }}]", "[padded]");
  expect_render("{% generation %}gen{% endgeneration %}", "gen");
  /* a namespace holding itself prints as Python's reprlib guard does */
  expect_render("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{% set ns.b = [ns] %}{{ ns }}",
                "<Namespace {'a': <Namespace {...}>, 'b': [<Namespace {...}>]}>");
  expect_render("{{ [x, none, {'k': x}] }}", "[Undefined, None, {'k': Undefined}]");
  expect_render("{% macro m(a) %}<{{ caller(a * 2) }}>{% endmacro %}{% call(x) m(3) %}[{{ x }}]{% endcall %}", "<[6]>");
  expect_render("{% macro m(a, b=1) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(*[1, 2, 3], **{'z': 4}) }}",
                "12[3]{'z': 4}");
  expect_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", DI_ERR_INVALID_ARG, "takes not more than 1 argument");
  expect_error("{% macro m() %}{% endmacro %}{{ m(**[1]) }}", DI_ERR_INVALID_ARG, "argument after ** must be a mapping");
  expect_render("{{ x if x is defined else 'fallback' }}{{ [1, 2, 3][-1] }}{{ 'abc'[-1] }}", "fallback3c");
  /* strftime_now is local time, as Python's datetime.now() */
  char want[64];
  time_t now = time(NULL);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(want, sizeof want, "%Y-%m-%d", &tmv);
  expect_render("{{ strftime_now('%Y-%m-%d') }}", want);
}

/* Runaway templates stop at the limits with an error instead of hanging or exhausting memory. */
static void test_limits(void) {
  jj_template *t;
  char *out = NULL;
  size_t n;
  jj_render_options lim = {.max_memory = 64 << 20, .max_output = 1 << 16, .max_steps = 100000};
  const char *loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
  CHECK(jj_parse(loops, strlen(loops), &t) == DI_OK);
  CHECK_ERR(jj_render(t, NULL, &lim, &out, &n), "steps");
  jj_template_free(t);
  lim.max_memory = 1 << 20;
  const char *dbl = "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
  CHECK(jj_parse(dbl, strlen(dbl), &t) == DI_OK);
  CHECK_ERR(jj_render(t, NULL, &lim, &out, &n), "memory");
  jj_template_free(t);
  lim.max_memory = 64 << 20;
  const char *big = "{% for i in range(100000) %}xxxxxxxxxxxxxxxx{% endfor %}";
  CHECK(jj_parse(big, strlen(big), &t) == DI_OK);
  CHECK_ERR(jj_render(t, NULL, &lim, &out, &n), "output is too large");
  jj_template_free(t);
  const char *rep = "{{ 'ab' * 100000000 }}";
  CHECK(jj_parse(rep, strlen(rep), &t) == DI_OK);
  CHECK(jj_render(t, NULL, &lim, &out, &n) != DI_OK);
  jj_template_free(t);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static void test_loading(void) {
  char dir[] = "/tmp/di_chat_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char cfg[256], jinja[256];
  snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
  snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
  di_chat_template *t = NULL;
  CHECK_ERR(di_chat_template_load(dir, &t), "has no chat template");
  write_file(cfg, "{\"bos_token\": 5, \"chat_template\": \"x\"}");
  CHECK_ERR(di_chat_template_load(dir, &t), "\"bos_token\" is neither a string");
  write_file(cfg, "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": \"{{ bos_token }}{% if %}\"}");
  CHECK_ERR(di_chat_template_load(dir, &t), "tokenizer_config.json: chat template line 1 column");
  write_file(cfg, "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": [{\"name\": \"other\", \"template\": \"x\"}]}");
  CHECK_ERR(di_chat_template_load(dir, &t), "no template named \"default\"");
  write_file(cfg, "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": 7}");
  CHECK_ERR(di_chat_template_load(dir, &t), "must be a string or a list");
  write_file(jinja, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}\n");
  CHECK(di_chat_template_load(dir, &t) == DI_OK); /* the .jinja file wins over the config's bad entry */
  char *out = NULL;
  CHECK(di_chat_template_render_json(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", -1, &out) == DI_OK);
  CHECK(out && strcmp(out, "<B>hi<E>") == 0);
  di_string_free(out);
  out = NULL;
  CHECK_ERR(di_chat_template_render_json(t, "[]", 1, &out), "empty conversation");
  CHECK_ERR(di_chat_template_render_json(t, "{\"messages\": [}", 1, &out), "the conversation");
  CHECK_ERR(di_chat_template_render_json(t, "{\"tools\": []}", 1, &out), "no \"messages\"");
  CHECK_ERR(di_chat_template_render_json(t, "\"text\"", 1, &out), "JSON array of messages");
  di_chat_template_free(t);
  write_file(jinja, "{{ x }}{% if add_generation_prompt %}[gen]{% endif %}");
  CHECK(di_chat_template_load(dir, &t) == DI_OK);
  CHECK(di_chat_template_render_json(t, "{\"messages\": [{}], \"x\": \"extra\", \"add_generation_prompt\": false}", -1, &out) == DI_OK);
  CHECK(out && strcmp(out, "extra") == 0);
  di_string_free(out);
  CHECK(di_chat_template_render_json(t, "{\"messages\": [{}], \"add_generation_prompt\": false}", 1, &out) == DI_OK);
  CHECK(out && strcmp(out, "[gen]") == 0);
  di_string_free(out);
  CHECK(di_chat_template_render_json(t, "{\"messages\": [{}], \"add_generation_prompt\": true}", 0, &out) == DI_OK);
  CHECK(out && strcmp(out, "") == 0);
  di_string_free(out);
  cJSON *m = cJSON_Parse("[{}]"), *ex = cJSON_Parse("{\"messages\": 1}");
  CHECK_ERR(di_chat_template_render(t, m, NULL, 1, ex, &out, NULL), "would replace an argument");
  cJSON_Delete(m);
  cJSON_Delete(ex);
  di_chat_template_free(t);
  unlink(jinja);
  unlink(cfg);
  rmdir(dir);
  CHECK(di_chat_template_load("/nonexistent/dir", &t) == DI_ERR_NOT_FOUND);
}

/* The fuzz corpus: every input parses or fails cleanly and renders or fails cleanly. */
static void test_fuzz_corpus(void) {
  const char *dir = test_path("fuzz/corpus/chat_template");
  DIR *d = opendir(dir);
  CHECKF(d != NULL, "no corpus at %s", dir);
  if (!d) return;
  cJSON *vars = cJSON_Parse("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"hi\"},"
                            "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
                            "{\"name\": \"f\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"content\": \"1\"}],"
                            "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"bos_token\": \"<s>\","
                            "\"eos_token\": \"</s>\", \"add_generation_prompt\": true}");
  int files = 0, rendered = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *data;
    size_t n;
    if (di_read_file(path, &data, &n) != DI_OK) continue;
    files++;
    /* as fuzz/fuzz_chat_template.c: a template, then optionally NUL and a conversation */
    const char *nul = memchr(data, 0, n);
    size_t tlen = nul ? (size_t)(nul - data) : n;
    jj_template *t;
    if (jj_parse(data, tlen, &t) == DI_OK) {
      jj_render_options lim = {.max_memory = 4 << 20, .max_output = 256 << 10, .max_steps = 20000}; /* the target's */
      char *out = NULL;
      size_t len;
      if (!nul) {
        if (jj_render(t, vars, &lim, &out, &len) == DI_OK) rendered++;
      } else {
        jj_vars v;
        jv conv;
        if (jj_vars_init(&v) == DI_OK && jj_json_parse(&v.arena, nul + 1, n - tlen - 1, "conversation", &conv) == DI_OK &&
            jj_vars_set(&v, "messages", conv) == DI_OK && jj_render_vars(t, &v, &lim, &out, &len) == DI_OK)
          rendered++;
        jj_vars_free(&v);
      }
      free(out);
      jj_template_free(t);
    } else CHECKF(di_last_error()[0] != 0, "%s failed without a message", e->d_name);
    free(data);
  }
  closedir(d);
  cJSON_Delete(vars);
  CHECKF(files >= 10, "only %d corpus files", files);
  CHECKF(rendered >= 5, "only %d corpus files rendered", rendered);
  CHECK(test_fuzz_replay("fuzz/corpus/chat_template", fuzz_chat_template_one) == files);
  cJSON_Delete(fuzz_chat_vars);
  printf("fuzz corpus: %d files, %d rendered\n", files, rendered);
}

int main(void) {
  test_goldens();
  test_public_templates();
  test_pinned_clock();
  test_dsv3_fixture();
  test_errors();
  test_semantics();
  test_limits();
  test_loading();
  test_fuzz_corpus();
  return test_finish("test_chat_template");
}
