/* Issue 27: every conversion of an untrusted double to an integer goes through the one range check
 * (di_json_int_in / di_double_to_int_in in util/json.h). One check per conversion site, each with a
 * value far outside the integer type (an undefined conversion before, which UBSan reports in the
 * sanitizer run) and the error or fallback the site gives instead; the rule that keeps new sites
 * from casting directly is tests/python/test_int_conversion_rule.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "arch/deepseek_v4.h"
#include "chat/chat_template.h"
#include "grammar/grammar.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "server/openai.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"

static void test_helpers(void) {
  int64_t x = 7;
  CHECK(di_double_to_int_in(3.9, 0, 10, &x) && x == 3);
  CHECK(di_double_to_int_in(-3.9, -10, 10, &x) && x == -3);
  x = 7;
  CHECK(!di_double_to_int_in(NAN, -1e300, 1e300, &x) && x == 7);
  CHECK(!di_double_to_int_in(INFINITY, -1e300, 1e300, &x) && x == 7);
  CHECK(!di_double_to_int_in(9223372036854775808.0, 0, 1e300, &x) && x == 7); /* 2^63: bound narrowed */
  CHECK(di_double_to_int_in(-9223372036854775808.0, -1e300, 0, &x) && x == INT64_MIN);
  CHECK(di_double_to_int_in(9223372036854774784.0, 0, 1e300, &x) && x == 9223372036854774784LL);
  CHECK(!di_double_to_int_in(11, 0, 10, &x) && x == 9223372036854774784LL);
  cJSON *j = cJSON_Parse("[5, 5.5, 1e300, \"5\", -0.0]");
  x = 1;
  CHECK(di_json_int_in(cJSON_GetArrayItem(j, 0), 0, 10, &x) && x == 5);
  CHECK(!di_json_int_in(cJSON_GetArrayItem(j, 1), 0, 10, &x) && x == 5);
  CHECK(!di_json_int_in(cJSON_GetArrayItem(j, 2), 0, HUGE_VAL, &x) && x == 5);
  CHECK(!di_json_int_in(cJSON_GetArrayItem(j, 3), 0, 10, &x) && x == 5);
  CHECK(di_json_int_in(cJSON_GetArrayItem(j, 4), 0, 10, &x) && x == 0);
  cJSON_Delete(j);
}

/* src/arch/deepseek_v4_config.c: the input (kept as a fuzz corpus file, replayed by
 * test_v4_reference) and the other two conversions of that file */
static void test_v4_config(void) {
  char *buf;
  size_t len;
  CHECK(di_read_file(test_path("fuzz/corpus/v4_config/crash_issue27_omax.json"), &buf, &len) == DI_OK);
  di_v4_config c;
  CHECK_ERR(di_v4_config_parse(buf, len, &c), "rope_scaling: \"original_max_position_embeddings\" must be an integer");
  /* the same config with a sane value parses, so the error above is the value's */
  char *p = strstr(buf, "6.5e44");
  CHECK(p != NULL);
  if (p) {
    memcpy(p, "4096  ", 6);
    CHECKF(di_v4_config_parse(buf, len, &c) == DI_OK && c.rope_compress.original_max_pos == 4096, "%s", di_last_error());
    memcpy(p, "4096.5", 6);
    CHECK_ERR(di_v4_config_parse(buf, len, &c), "original_max_position_embeddings");
    memcpy(p, "2e9   ", 6);
    CHECK_ERR(di_v4_config_parse(buf, len, &c), "\"original_max_position_embeddings\" must be an integer in [1, 2^30]");
  }
  free(buf);
  static const char base[] =
      "{\"model_type\": \"deepseek_v4\", \"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 4, "
      "\"num_attention_heads\": 4, \"head_dim\": 64, \"q_lora_rank\": 32, \"o_groups\": 2, \"o_lora_rank\": 16, "
      "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"index_n_heads\": 2, "
      "\"index_head_dim\": 16, \"index_topk\": 8, \"compress_ratios\": [0, 4, 128, 4]%s}";
  char cfg[2048];
  snprintf(cfg, sizeof cfg, base, ", \"partial_rotary_factor\": 1e-300");
  CHECK_ERR(di_v4_config_parse(cfg, strlen(cfg), &c), "rotary dimension head_dim*partial_rotary_factor = 0");
  snprintf(cfg, sizeof cfg, base, ", \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [1e300, 128]}");
  CHECK_ERR(di_v4_config_parse(cfg, strlen(cfg), &c), "weight_block_size must be two positive integers");
  snprintf(cfg, sizeof cfg, base, ", \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 64]}");
  CHECKF(di_v4_config_parse(cfg, strlen(cfg), &c) == DI_OK && c.fp8_block[0] == 128 && c.fp8_block[1] == 64, "%s",
         di_last_error());
}

/* src/model/config.c: eos_token_id (a number, a list) and the FP8 block sizes, each put into a
 * good config (fuzz/corpus/config/dsv3-tiny-fp8.json) in place of its value */
static void config_with(const char *text, const char *key_at, const char *value, const char *want) {
  const char *at = strstr(text, key_at);
  CHECKF(at != NULL, "%s not in the config", key_at);
  if (!at) return;
  at += strlen(key_at);
  const char *end = at + strcspn(at, ",\n");
  if (*at == '[') end = strchr(at, ']') + 1;
  char cfg[8192];
  snprintf(cfg, sizeof cfg, "%.*s%s%s", (int)(at - text), text, value, end);
  di_model_config c;
  if (want) CHECK_ERR(di_model_config_parse(cfg, strlen(cfg), NULL, 0, &c), want);
  else CHECKF(di_model_config_parse(cfg, strlen(cfg), NULL, 0, &c) == DI_OK, "%s: %s", value, di_last_error());
}

static void test_model_config(void) {
  char *text;
  size_t len;
  CHECK(di_read_file(test_path("fuzz/corpus/config/dsv3-tiny-fp8.json"), &text, &len) == DI_OK);
  config_with(text, "\"eos_token_id\": ", "1e30", "\"eos_token_id\" must be an integer");
  config_with(text, "\"eos_token_id\": ", "[1, -1e30]", "\"eos_token_id\" must be an integer");
  config_with(text, "\"eos_token_id\": ", "[1, 2]", NULL);
  config_with(text, "\"weight_block_size\": ", "[128, 1e300]", "weight_block_size must be [rows, cols]");
  config_with(text, "\"weight_block_size\": ", "[1e300, 128]", "weight_block_size must be [rows, cols]");
  config_with(text, "\"weight_block_size\": ", "[64, 32]", NULL);
  free(text);
}

static void st_header(const char *json, uint8_t *out, size_t *len) {
  uint64_t n = strlen(json);
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(n >> (8 * i));
  memcpy(out + 8, json, n);
  memset(out + 8 + n, 0, 16);
  *len = 8 + n + 16;
}

/* src/model/safetensors.c: shape entries and data_offsets */
static void test_safetensors(void) {
  uint8_t buf[512];
  size_t len;
  di_st_file f;
  st_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 4]}}", buf, &len);
  CHECK_ERR(di_st_parse(buf, len, "t.safetensors", &f), "shape[0] is not a non-negative integer");
  st_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [2e42, 4]}}", buf, &len);
  CHECK_ERR(di_st_parse(buf, len, "t.safetensors", &f), "data_offsets must be integers");
  st_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 2e42]}}", buf, &len);
  CHECK_ERR(di_st_parse(buf, len, "t.safetensors", &f), "data_offsets must be integers");
  st_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", buf, &len);
  di_status st = di_st_parse(buf, len, "t.safetensors", &f);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st == DI_OK) {
    CHECK(f.n_tensors == 1 && f.tensors[0].shape[0] == 2 && f.tensors[0].nbytes == 8);
    di_st_file_close(&f);
  }
}

/* src/server/openai.c: integer parameters, prompt token ids, stop_token_ids */
static void test_openai(void) {
  di_oai_ctx ctx = {0};
  ctx.served_name = "m";
  ctx.max_model_len = 256;
  ctx.vocab_size = 100;
  ctx.default_temperature = NAN;
  ctx.default_top_p = NAN;
  static const char *bodies[][2] = {
      {"{\"model\": \"m\", \"prompt\": [1, 2], \"max_tokens\": 1e300}", "max_tokens"},
      {"{\"model\": \"m\", \"prompt\": [1, 1e300]}", "prompt"},
      {"{\"model\": \"m\", \"prompt\": [1, -1e300]}", "prompt"},
      {"{\"model\": \"m\", \"prompt\": [1], \"stop_token_ids\": [1e300]}", "stop_token_ids"},
      {"{\"model\": \"m\", \"prompt\": [1], \"seed\": -1e300}", "seed"},
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    di_oai_request r;
    di_oai_error e;
    int rc = di_oai_parse_request(&ctx, 0, bodies[i][0], strlen(bodies[i][0]), &r, &e);
    CHECKF(rc != 0 && e.status == 400 && strcmp(e.param, bodies[i][1]) == 0, "%s: rc %d, param %s, %s", bodies[i][0], rc,
           e.param, e.message);
    if (rc == 0) di_oai_request_free(&r);
  }
  di_oai_request r;
  di_oai_error e;
  static const char ok[] = "{\"model\": \"m\", \"prompt\": [1, 99], \"max_tokens\": 3, \"stop_token_ids\": [7]}";
  int rc = di_oai_parse_request(&ctx, 0, ok, strlen(ok), &r, &e);
  CHECKF(rc == 0, "%s", e.message);
  if (rc == 0) {
    CHECK(r.n_stop_token_ids == 1 && r.stop_token_ids[0] == 7);
    di_oai_request_free(&r);
  }
}

/* src/tokenizer/tok_load.c: TemplateProcessing ids and Bert/Roberta cls/sep ids */
static void test_tokenizer(void) {
  static const char tp[] =
      "{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
      " {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1e300]}}},"
      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0}}}";
  di_tokenizer *t = NULL;
  CHECK_ERR(di_tokenizer_load_mem(tp, strlen(tp), NULL, 0, "tokenizer.json", &t), "bad token id");
  static const char bert[] =
      "{\"post_processor\": {\"type\": \"RobertaProcessing\", \"cls\": [\"<s>\", 0], \"sep\": [\"</s>\", -1e300]},"
      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0}}}";
  CHECK_ERR(di_tokenizer_load_mem(bert, strlen(bert), NULL, 0, "tokenizer.json", &t), "\"cls\"/\"sep\" must be [token, id]");
}

/* src/grammar/json_schema.c: counts (capped), integer bounds, number bounds */
static void test_json_schema(void) {
  di_grammar_options opt = {0};
  di_grammar *g = NULL;
  static const char big_count[] = "{\"type\": \"string\", \"maxLength\": 1e300}"; /* read as 1e9 */
  CHECK_ERR(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, big_count, strlen(big_count), &opt, &g), "string length bound above");
  static const char big_items[] = "{\"type\": \"array\", \"minItems\": 1e300}";
  CHECK_ERR(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, big_items, strlen(big_items), &opt, &g), "minItems");
  static const char big_min[] = "{\"type\": \"integer\", \"minimum\": 1e300}";
  CHECK_ERR(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, big_min, strlen(big_min), &opt, &g), "integer bound beyond 2^53");
  static const char big_max[] = "{\"type\": \"integer\", \"exclusiveMaximum\": -1e300}";
  CHECK_ERR(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, big_max, strlen(big_max), &opt, &g), "integer bound beyond 2^53");
  static const char num_max[] = "{\"type\": \"number\", \"maximum\": 1e300}";
  CHECK_ERR(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, num_max, strlen(num_max), &opt, &g), "on a number beyond 9e15");
  static const char ok[] = "{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 12}";
  di_status st = di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, ok, strlen(ok), &opt, &g);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st == DI_OK) {
    CHECK(di_grammar_accepts(g, "12", 2) && di_grammar_accepts(g, "-5", 2) && !di_grammar_accepts(g, "13", 2));
    di_grammar_free(g);
  }
}

static di_status render(const char *src, const char *messages, char **out) {
  di_chat_template *t = NULL;
  *out = NULL;
  DI_TRY(di_chat_template_from_string(src, "<s>", "</s>", &t));
  cJSON *m = cJSON_Parse(messages);
  di_status st = di_chat_template_render(t, m, NULL, 1, NULL, out, NULL);
  cJSON_Delete(m);
  di_chat_template_free(t);
  return st;
}

static void expect(const char *src, const char *messages, const char *want) {
  char *out = NULL;
  di_status st = render(src, messages, &out);
  CHECKF(st == DI_OK && strcmp(out, want) == 0, "%s: got \"%s\" (%s), want \"%s\"", src, out ? out : "",
         st == DI_OK ? "ok" : di_last_error(), want);
  free(out);
}

/* src/chat: the int filter (of a float, of a string), round of a huge int, "%d" of a float, range
 * lengths, and numbers read from the conversation JSON */
static void test_templates(void) {
  static const char msg[] = "[{\"role\": \"user\", \"content\": \"hi\"}]";
  expect("{{ 1e300 | int }}|{{ -1e300 | int(-7) }}|{{ 2.9 | int }}", msg, "0|-7|2");
  expect("{{ '1e300' | int }}|{{ ' 2.5e3 ' | int }}", msg, "0|2500");
  /* 2^63 - 10 (the lexer takes 18 digits) rounds to 2^63, past int64 */
  expect("{{ ((999999999999999999 * 9 + 223372036854775807) | round(-1)) > 9e18 }}|{{ 1234 | round(-2) }}", msg,
         "True|1200");
  char *out = NULL;
  CHECK_ERR(render("{{ '%d' % 1e300 }}", msg, &out), "too large");
  free(out);
  expect("{{ '%d|%x' % (2.9, 255.0) }}", msg, "2|ff");
  expect("{{ range(3) | list | length }}|{{ range(5, 1) | list | length }}", msg, "3|0");
  expect("{{ messages[0].content }}|{{ messages[1].content }}|{{ messages[2].content }}",
         "[{\"role\": \"user\", \"content\": 1e300}, {\"role\": \"user\", \"content\": 9007199254740993},"
         " {\"role\": \"user\", \"content\": 42}]",
         "1e+300|9007199254740992.0|42");
}

int main(void) {
  test_helpers();
  test_v4_config();
  test_model_config();
  test_safetensors();
  test_openai();
  test_tokenizer();
  test_json_schema();
  test_templates();
  return test_finish("test_int_conversions");
}
