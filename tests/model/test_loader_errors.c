/* Loading: sharded checkpoints, dummy weights, and every kind of bad input the foundation issue
 * names (truncated or corrupt safetensors, overlapping or out-of-range offsets, dtype/shape that
 * disagree with the config, missing tensors, unknown model_type, unsupported options), each checked
 * for an error message that names the problem. */
#include "api/model_internal.h"
#include "model/safetensors.h"
#include "util/json.h"
#include "test_util.h"
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmp[256];

static const char *tmp_file(const char *name) {
  static char buf[4][600];
  static int k;
  char *b = buf[k++ & 3];
  snprintf(b, 600, "%s/%s", g_tmp, name);
  return b;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return;
  fwrite(data, 1, n, f);
  fclose(f);
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* A safetensors image from a header text and a data section. */
static void write_st_raw(const char *path, const char *header, const void *data, size_t n) {
  size_t hl = strlen(header);
  unsigned char le[8];
  for (int i = 0; i < 8; i++)
    le[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  FILE *f = fopen(path, "wb");
  if (!f)
    return;
  fwrite(le, 1, 8, f);
  fwrite(header, 1, hl, f);
  if (n)
    fwrite(data, 1, n, f);
  fclose(f);
}

/* Writes the tensors of `src` whose index satisfies keep(i) into a new file. */
static void write_subset(const char *path, const di_st_file *src, int mod, int rem, const char *skip) {
  char *hdr = malloc(1 << 20), *p = hdr;
  size_t off = 0;
  p += sprintf(p, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int i = 0; i < src->n_tensors; i++) {
    const di_st_tensor *t = &src->tensors[i];
    if (i % mod != rem || (skip && strcmp(t->name, skip) == 0))
      continue;
    p += sprintf(p, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype_name);
    for (int d = 0; d < t->ndim; d++)
      p += sprintf(p, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    p += sprintf(p, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
    off += t->nbytes;
  }
  sprintf(p, "}");
  char *data = malloc(off ? off : 1), *q = data;
  for (int i = 0; i < src->n_tensors; i++) {
    const di_st_tensor *t = &src->tensors[i];
    if (i % mod != rem || (skip && strcmp(t->name, skip) == 0))
      continue;
    memcpy(q, t->data, t->nbytes);
    q += t->nbytes;
  }
  write_st_raw(path, hdr, data, off);
  free(hdr);
  free(data);
}

static void copy_file(const char *from, const char *to, long truncate_to) {
  char *buf;
  size_t n;
  if (di_read_file(from, &buf, &n) != DI_OK)
    return;
  write_bytes(to, buf, truncate_to >= 0 && (size_t)truncate_to < n ? (size_t)truncate_to : n);
  free(buf);
}

static di_status load(const char *dir, const char *fmt, di_model **m) {
  di_model_options o;
  di_model_options_default(&o);
  o.quiet = 1;
  o.threads = 1;
  if (fmt)
    o.load_format = fmt;
  *m = NULL;
  return di_model_load(dir, &o, m);
}

static void clean_dir(void) {
  const char *names[] = {"config.json", "model.safetensors", "model.safetensors.index.json", "a.safetensors", "b.safetensors",
                         "generation_config.json"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    unlink(tmp_file(names[i]));
}

static const char *FIX = "tests/data/models/dsv3-tiny";

static void test_safetensors_parser(void) {
  di_st_file f;
  float data[4] = {1, 2, 3, 4};
  /* good */
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", data, 16);
  CHECK(di_st_open(tmp_file("a.safetensors"), &f) == DI_OK);
  float last;
  if (f.n_tensors == 1)
    memcpy(&last, (const char *)f.tensors[0].data + 12, 4);
  CHECK(f.n_tensors == 1 && f.tensors[0].nbytes == 16 && last == 4.0f);
  di_st_file_close(&f);
  /* data_offsets beyond the data section */
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", data, 12);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "tensor 'x': data_offsets [0, 16] run past the end");
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "a.safetensors");
  /* numbers beyond any integer type (undefined conversions before; found by fuzzing) */
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,2e42]}}", data, 16);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "data_offsets must be integers");
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[1e300,2],\"data_offsets\":[0,16]}}", data, 16);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "shape[0] is not a non-negative integer");
  /* overlap */
  write_st_raw(tmp_file("a.safetensors"),
               "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               data, 16);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "overlap");
  /* size disagrees with dtype x shape */
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", data, 16);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "16 bytes for BF16 shape of 4 elements (expected 8)");
  /* unknown dtype, bad shape, bad offsets, not JSON, header longer than the file, tiny file */
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "unknown dtype \"Q4\"");
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data, 8);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "shape[0] is not a non-negative integer");
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", data, 8);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "0 <= begin <= end");
  write_st_raw(tmp_file("a.safetensors"), "{\"x\":{\"dtype\":", data, 8);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "invalid JSON");
  unsigned char bad[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
  write_bytes(tmp_file("a.safetensors"), bad, 10);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "exceeds the file size");
  write_bytes(tmp_file("a.safetensors"), bad, 3);
  CHECK_ERR(di_st_open(tmp_file("a.safetensors"), &f), "shorter than the 8-byte header length");
  CHECK_ERR(di_st_open(tmp_file("nonexistent.safetensors"), &f), "cannot open");
  unlink(tmp_file("a.safetensors"));
}

static void test_model_errors(void) {
  di_model *m;
  char cfg_path[700];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", test_path(FIX));
  char *cfg_text;
  size_t cfg_len;
  CHECK(di_read_file(cfg_path, &cfg_text, &cfg_len) == DI_OK);
  char wpath[700];
  snprintf(wpath, sizeof wpath, "%s/model.safetensors", test_path(FIX));

  /* truncated weights file */
  clean_dir();
  write_text(tmp_file("config.json"), cfg_text);
  copy_file(wpath, tmp_file("model.safetensors"), 100000);
  CHECK_ERR(load(g_tmp, NULL, &m), "model.safetensors");
  CHECK_ERR(load(g_tmp, NULL, &m), "truncated");

  /* no weights at all */
  unlink(tmp_file("model.safetensors"));
  CHECK_ERR(load(g_tmp, NULL, &m), "no model.safetensors");

  /* dummy weights need no files, and give finite logits */
  CHECK(load(g_tmp, "dummy", &m) == DI_OK);
  if (m) {
    int32_t ids[5] = {3, 1, 4, 1, 5};
    float *lg = malloc(sizeof(float) * 5 * (size_t)di_model_vocab_size(m));
    CHECK(di_model_score(m, ids, 5, lg) == DI_OK);
    int finite = 1;
    for (int i = 0; i < 5 * di_model_vocab_size(m); i++)
      finite &= isfinite(lg[i]) != 0;
    CHECK(finite);
    /* a prompt longer than the context */
    CHECK_ERR(di_model_score(m, ids, 5000, lg), "longer than the context");
    free(lg);
    di_model_free(m);
  }

  /* a tensor missing from the checkpoint */
  di_st_file full;
  CHECK(di_st_open(wpath, &full) == DI_OK);
  write_subset(tmp_file("model.safetensors"), &full, 1, 0, "model.layers.1.mlp.experts.7.up_proj.weight");
  CHECK_ERR(load(g_tmp, NULL, &m), "missing tensor 'model.layers.1.mlp.experts.7.up_proj.weight'");

  /* a shape that disagrees with the config */
  char *edited = malloc(cfg_len + 256); /* room for the longest edit below */
  const char *at = strstr(cfg_text, "\"vocab_size\": 1024");
  CHECK(at != NULL);
  if (at) {
    sprintf(edited, "%.*s\"vocab_size\": 1000%s", (int)(at - cfg_text), cfg_text, at + strlen("\"vocab_size\": 1024"));
    write_text(tmp_file("config.json"), edited);
    write_subset(tmp_file("model.safetensors"), &full, 1, 0, NULL);
    CHECK_ERR(load(g_tmp, NULL, &m), "tensor 'model.embed_tokens.weight'");
    CHECK_ERR(load(g_tmp, NULL, &m), "the config implies [1000, 128]");
  }
  write_text(tmp_file("config.json"), cfg_text);

  /* sharded: two files + index.json give the same logits as the single file */
  unlink(tmp_file("model.safetensors"));
  write_subset(tmp_file("a.safetensors"), &full, 2, 0, NULL);
  write_subset(tmp_file("b.safetensors"), &full, 2, 1, NULL);
  {
    char *idx = malloc(1 << 20), *p = idx;
    p += sprintf(p, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < full.n_tensors; i++)
      p += sprintf(p, "%s\"%s\":\"%s\"", i ? "," : "", full.tensors[i].name, i % 2 ? "b.safetensors" : "a.safetensors");
    sprintf(p, "}}");
    write_text(tmp_file("model.safetensors.index.json"), idx);
    di_model *m1, *m2;
    CHECK(load(g_tmp, NULL, &m1) == DI_OK);
    CHECK(load(test_path(FIX), NULL, &m2) == DI_OK);
    if (m1 && m2) {
      int32_t ids[4] = {10, 20, 30, 40};
      const int V = di_model_vocab_size(m1);
      float *a = malloc(sizeof(float) * 4 * V), *b = malloc(sizeof(float) * 4 * V);
      CHECK(di_model_score(m1, ids, 4, a) == DI_OK && di_model_score(m2, ids, 4, b) == DI_OK);
      CHECK(memcmp(a, b, sizeof(float) * 4 * V) == 0);
      free(a);
      free(b);
    }
    di_model_free(m1);
    di_model_free(m2);
    /* the index names a shard that lacks the tensor */
    p = idx;
    p += sprintf(p, "{\"weight_map\":{");
    for (int i = 0; i < full.n_tensors; i++)
      p += sprintf(p, "%s\"%s\":\"%s\"", i ? "," : "", full.tensors[i].name, i == 3 ? "a.safetensors" : (i % 2 ? "b.safetensors" : "a.safetensors"));
    sprintf(p, "}}");
    write_text(tmp_file("model.safetensors.index.json"), idx);
    CHECK_ERR(load(g_tmp, NULL, &m), "but the index says");
    write_text(tmp_file("model.safetensors.index.json"), "{\"weight_map\": {\"x\": \"../etc/passwd\"}}");
    CHECK_ERR(load(g_tmp, NULL, &m), "is not a file name in the folder");
    free(idx);
  }
  di_st_file_close(&full);
  clean_dir();

  /* config.json problems */
  struct {
    const char *from, *to, *msg;
  } edits[] = {
      {"\"model_type\": \"deepseek_v3\"", "\"model_type\": \"llama\"", "unknown model_type \"llama\""},
      {"\"model_type\": \"deepseek_v3\"", "\"model_type\": \"deepseek_v4\"", "deepseek_v4"},
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act \"gelu\" is not supported"},
      {"\"type\": \"yarn\"", "\"type\": \"linear\"", "rope_scaling type \"linear\" is not supported"},
      {"\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"magic\"", "topk_method \"magic\" is not supported"},
      {"\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"tanh\"", "scoring_func \"tanh\" is not supported"},
      {"\"n_group\": 4", "\"n_group\": 3", "n_group must divide n_routed_experts"},
      {"\"hidden_size\": 128", "\"hidden_size\": \"big\"", "\"hidden_size\" must be an integer"},
      {"\"hidden_size\": 128,", "", "missing \"hidden_size\""},
      {"\"attention_bias\": false", "\"attention_bias\": true", "attention_bias = true is not supported"},
      {"\"vocab_size\": 1024,", "\"vocab_size\": 1024,,", "invalid JSON near byte"},
      {"\"torch_dtype\": \"bfloat16\"", "\"quantization_config\": {\"quant_method\": \"awq\"}", "quant_method \"awq\" is not supported"},
      /* numbers beyond every integer type: errors naming the key (their conversion was undefined
       * behaviour; the config fuzzer found the first three under UBSan) */
      {"\"num_hidden_layers\": 3", "\"num_hidden_layers\": 1e300", "num_hidden_layers"},
      {"\"vocab_size\": 1024", "\"vocab_size\": 5e9", "vocab_size"},
      {"\"eos_token_id\": 1", "\"eos_token_id\": 1e30", "eos_token_id"},
      {"\"eos_token_id\": 1", "\"eos_token_id\": [1, -1e300]", "eos_token_id"},
      {"\"eos_token_id\": 1", "\"eos_token_id\": 2.5", "eos_token_id"},
      {"\"torch_dtype\": \"bfloat16\"",
       "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"weight_block_size\": [1e300, 128]}",
       "weight_block_size"},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    const char *at2 = strstr(cfg_text, edits[i].from);
    CHECKF(at2 != NULL, "fixture config lacks %s", edits[i].from);
    if (!at2)
      continue;
    sprintf(edited, "%.*s%s%s", (int)(at2 - cfg_text), cfg_text, edits[i].to, at2 + strlen(edits[i].from));
    write_text(tmp_file("config.json"), edited);
    CHECK_ERR(load(g_tmp, "dummy", &m), edits[i].msg);
    CHECK_ERR(load(g_tmp, "dummy", &m), "config.json");
  }
  CHECK_ERR(load("/nonexistent/model/dir", NULL, &m), "cannot open /nonexistent/model/dir/config.json");

  /* FP8 tensor without its block scales */
  clean_dir();
  char fp8dir[600];
  snprintf(fp8dir, sizeof fp8dir, "%s", test_path("tests/data/models/dsv3-tiny-fp8"));
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", fp8dir);
  copy_file(cfg_path, tmp_file("config.json"), -1);
  snprintf(wpath, sizeof wpath, "%s/model.safetensors", fp8dir);
  CHECK(di_st_open(wpath, &full) == DI_OK);
  write_subset(tmp_file("model.safetensors"), &full, 1, 0, "model.layers.0.self_attn.o_proj.weight_scale_inv");
  CHECK_ERR(load(g_tmp, NULL, &m), "missing tensor 'model.layers.0.self_attn.o_proj.weight_scale_inv'");
  di_st_file_close(&full);
  /* generation_config.json: EOS list and sampling defaults */
  clean_dir();
  write_text(tmp_file("config.json"), cfg_text);
  write_text(tmp_file("generation_config.json"), "{\"eos_token_id\": [1, 7, 9], \"temperature\": 0.6, \"top_p\": 0.95, \"do_sample\": true}");
  CHECK(load(g_tmp, "dummy", &m) == DI_OK);
  if (m) {
    int32_t eos[8];
    CHECK(di_model_eos_ids(m, eos, 8) == 3 && eos[0] == 1 && eos[1] == 7 && eos[2] == 9);
    CHECK(fabsf(m->cfg.gen_temperature - 0.6f) < 1e-6f && fabsf(m->cfg.gen_top_p - 0.95f) < 1e-6f);
    di_model_free(m);
  }
  clean_dir();
  free(edited);
  free(cfg_text);
}

int main(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/di_loader_test_XXXXXX");
  if (!mkdtemp(g_tmp))
    return 1;
  test_safetensors_parser();
  test_model_errors();
  rmdir(g_tmp);
  return test_finish("test_loader_errors");
}
