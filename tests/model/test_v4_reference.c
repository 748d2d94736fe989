/* The DeepSeek-V4 float32 CPU reference forward (src/backend/cpu/cpu_deepseek_v4.c) against the golden
 * outputs of transformers 5.17 on tests/data/models/dsv4-tiny: with the indexer's ties broken as
 * torch.topk breaks them (di_v4_ref_options.torch_ties), logits of every position (relative L2 error
 * < 1e-4) for prompts of 1, 40 and 300 tokens, and the 8-step greedy continuation (full recompute per
 * step). With DeepInfer's own rule (equal scores: the earlier entry), the same logits up to the first
 * position where that rule decided a tie at the top-k boundary (p1: one at t=37, three zero scores for
 * two slots; p2 several), where torch keeps another of the tied entries; after it they may differ
 * (reported). Also: the original checkpoint naming and a BF16 copy give identical logits; bad configs /
 * checkpoints fail with messages that name the field or tensor. */
#include "arch/deepseek_v4.h"
#include "backend/cpu/cpu_deepseek_v4.h"
#include "model/safetensors.h"
#include "util/json.h"
#include "test_util.h"
#include "v4_golden.h"
/* the fuzz target itself (its invariants on an accepted config), replayed over its corpus */
#define LLVMFuzzerTestOneInput fuzz_v4_config_one
#include "../../fuzz/fuzz_v4_config.c"
#undef LLVMFuzzerTestOneInput
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIXTURE "tests/data/models/dsv4-tiny"
#define NATIVE_FIXTURE "tests/data/models/dsv4-tiny-native"

static char *cfg_text;
static size_t cfg_len;


static di_status load_dir(const char *dir, const char *cfg_json, di_v4_config *cfg, di_tensor_source **src, di_v4_weights *w) {
  DI_TRY(di_v4_config_parse(cfg_json, strlen(cfg_json), cfg));
  DI_TRY(di_tensor_source_open(dir, src));
  di_status st = di_v4_weights_bind(cfg, *src, w);
  if (st != DI_OK) {
    di_tensor_source_free(*src);
    *src = NULL;
  }
  return st;
}

/* ---- golden comparisons -------------------------------------------------------------------------- */

/* dir's golden outputs; tie37: the dsv4-tiny fixture's known first decided tie (p1, t = 37) is checked. */
static void check_golden(const char *dir, const char *label, int tie37, const di_v4_config *cfg, const di_v4_weights *w) {
  di_st_file g;
  char gpath[512];
  snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
  di_status st = di_st_open(test_path(gpath), &g);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return;
  const int V = cfg->vocab_size;
  for (int p = 0; p < 3; p++) {
    const di_st_tensor *tid, *tlg, *tgr, *tmg;
    if (!v4_golden_prompt(&g, p, &tid, &tlg, &tgr, &tmg))
      continue;
    const int T = (int)tid->shape[0], G = (int)tgr->shape[0];
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(T + G));
    float *lg = malloc(sizeof(float) * (size_t)(T + G) * V);
    memcpy(seq, tid->data, sizeof(int32_t) * (size_t)T);
    /* DeepInfer's tie rule: the golden holds until its first decided tie */
    di_v4_ref_options fixed = {0};
    st = di_cpu_v4_forward_with(cfg, w, seq, T, &fixed, lg);
    CHECKF(st == DI_OK, "%s", di_last_error());
    char name[64];
    snprintf(name, sizeof name, "%s p%d", label, p);
    if (st == DI_OK)
      v4_check_golden_until_tie(name, lg, tlg->data, T, V, fixed.first_tie_pos);
    CHECKF(!tie37 || p != 1 || fixed.first_tie_pos == 37, "p1: first decided tie at %d, expected 37", fixed.first_tie_pos);
    /* torch's tie order: the whole golden */
    di_v4_ref_options torch = {.torch_ties = 1};
    st = di_cpu_v4_forward_with(cfg, w, seq, T, &torch, lg);
    CHECKF(st == DI_OK, "%s", di_last_error());
    double err = test_rel_l2(lg, tlg->data, (size_t)T * V);
    CHECKF(err < 1e-4, "%s p%d: logits rel L2 error %.3e", label, p, err);
    /* the worst single position, to see whether an error is spread or local */
    double worst = 0;
    for (int t = 0; t < T; t++) {
      double e = test_rel_l2(lg + (size_t)t * V, (const float *)tlg->data + (size_t)t * V, (size_t)V);
      worst = e > worst ? e : worst;
    }
    printf("%s p%d T=%d torch tie order: logits rel L2 err %.2e (worst position %.2e)\n", label, p, T, err, worst);
    const int32_t *gold = tgr->data;
    const float *margin = tmg->data;
    int ok = 1;
    for (int s = 0; s < G && st == DI_OK; s++) {
      st = di_cpu_v4_forward_with(cfg, w, seq, T + s, &torch, lg);
      CHECKF(st == DI_OK, "%s", di_last_error());
      int tok = test_argmax(lg + (size_t)(T + s - 1) * V, V);
      if (margin[s] > 1e-3f) {
        CHECKF(tok == gold[s], "%s p%d greedy step %d: got %d, reference %d (margin %.3g)", label, p, s, tok, gold[s], margin[s]);
        ok &= tok == gold[s];
      }
      seq[T + s] = gold[s]; /* follow the reference path */
    }
    printf("%s p%d greedy %d steps %s\n", label, p, G, ok ? "equal" : "DIFFER");
    free(seq);
    free(lg);
  }
  di_st_file_close(&g);
}

/* ---- a modified copy of the checkpoint in a temporary folder ---------------------------------------- */

/* `text` with the first `from` replaced by `to` (malloc'd), or NULL when `from` is absent. */
static char *replace_once(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  if (!at)
    return NULL;
  size_t n = strlen(text), pre = (size_t)(at - text), fl = strlen(from), tl = strlen(to);
  char *s = malloc(n - fl + tl + 1);
  memcpy(s, text, pre);
  memcpy(s + pre, to, tl);
  memcpy(s + pre + tl, at + fl, n - pre - fl + 1);
  return s;
}

typedef struct {
  uint8_t *buf; /* the whole model.safetensors */
  size_t len;
} blob;

static blob read_model(void) {
  blob b = {0};
  char *d = NULL;
  size_t n = 0;
  if (di_read_file(test_path(FIXTURE "/model.safetensors"), &d, &n) == DI_OK) {
    b.buf = (uint8_t *)d;
    b.len = n;
  }
  return b;
}

/* Edits the header tree and the data section in place. */
typedef void (*edit_fn)(cJSON *header, uint8_t *data, void *arg);
/* Or: edits the header and writes a whole new data section (malloc'd) to *out / *out_len. */
typedef void (*rewrite_fn)(cJSON *header, const uint8_t *data, uint8_t **out, size_t *out_len);

/* Writes dir/model.safetensors: the fixture with `edit` applied to its header tree and data section
 * (header re-serialized and padded to 8 bytes so tensors stay aligned), and dir/config.json. */
static int write_variant(const char *dir, edit_fn edit, rewrite_fn rewrite, void *arg) {
  blob b = read_model();
  if (!b.buf)
    return 0;
  uint64_t hl;
  memcpy(&hl, b.buf, 8);
  cJSON *h = cJSON_ParseWithLength((const char *)b.buf + 8, (size_t)hl);
  if (!h) {
    free(b.buf);
    return 0;
  }
  uint8_t *data = b.buf + 8 + hl;
  size_t dlen = b.len - 8 - (size_t)hl;
  if (rewrite)
    rewrite(h, b.buf + 8 + hl, &data, &dlen);
  else
    edit(h, data, arg);
  char *text = cJSON_PrintUnformatted(h);
  size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  FILE *f = fopen(path, "wb");
  int ok = f != NULL;
  if (f) {
    uint64_t pl = padded;
    ok &= fwrite(&pl, 8, 1, f) == 1 && fwrite(text, 1, tl, f) == tl;
    for (size_t i = tl; i < padded; i++)
      ok &= fputc(' ', f) != EOF;
    ok &= fwrite(data, 1, dlen, f) == dlen;
    ok &= fclose(f) == 0;
  }
  snprintf(path, sizeof path, "%s/config.json", dir);
  f = fopen(path, "wb");
  ok &= f != NULL;
  if (f) {
    ok &= fwrite(cfg_text, 1, cfg_len, f) == cfg_len;
    ok &= fclose(f) == 0;
  }
  cJSON_free(text);
  cJSON_Delete(h);
  if (data != b.buf + 8 + hl)
    free(data);
  free(b.buf);
  return ok;
}

static void remove_variant(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
}

static void edit_rename(cJSON *h, uint8_t *data, void *arg) {
  (void)data;
  const char **names = arg; /* from, to */
  cJSON *t = cJSON_DetachItemFromObjectCaseSensitive(h, names[0]);
  if (t)
    cJSON_AddItemToObject(h, names[1], t);
}

static void edit_shape(cJSON *h, uint8_t *data, void *arg) {
  (void)data;
  const char *name = arg;
  cJSON *t = cJSON_GetObjectItemCaseSensitive(h, name);
  cJSON *shape = t ? cJSON_GetObjectItemCaseSensitive(t, "shape") : NULL;
  if (cJSON_GetArraySize(shape) == 2) { /* [r, c] -> [r/2, 2c]: same bytes, wrong shape */
    cJSON *r = cJSON_GetArrayItem(shape, 0), *c = cJSON_GetArrayItem(shape, 1);
    cJSON_SetNumberValue(r, r->valuedouble / 2);
    cJSON_SetNumberValue(c, c->valuedouble * 2);
  }
}

static void edit_tid2eid(cJSON *h, uint8_t *data, void *arg) {
  (void)arg;
  cJSON *t = cJSON_GetObjectItemCaseSensitive(h, "model.layers.0.ffn.gate.tid2eid");
  cJSON *off = t ? cJSON_GetObjectItemCaseSensitive(t, "data_offsets") : NULL;
  if (off) {
    int64_t bad = 99; /* entry [3][1] */
    memcpy(data + (size_t)cJSON_GetArrayItem(off, 0)->valuedouble + 8 * 7, &bad, 8);
  }
}

/* Every F32 tensor whose values are BF16-exact (all but the routers' correction biases: the fixture's
 * weights are bf16-rounded) stored as BF16: the BF16 weight path must give bit-identical logits. */
static int n_bf16; /* tensors converted by the last rewrite_bf16 */

static void rewrite_bf16(cJSON *h, const uint8_t *data, uint8_t **out, size_t *out_len) {
  size_t cap = 0;
  n_bf16 = 0;
  for (cJSON *e = h->child; e; e = e->next) {
    cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (off)
      cap += (size_t)(cJSON_GetArrayItem(off, 1)->valuedouble - cJSON_GetArrayItem(off, 0)->valuedouble);
  }
  uint8_t *buf = malloc(cap + 1);
  size_t pos = 0;
  for (cJSON *e = h->child; e; e = e->next) {
    cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!off || !cJSON_IsString(dt))
      continue; /* __metadata__ */
    size_t a = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, z = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    int exact = strcmp(dt->valuestring, "F32") == 0;
    for (size_t i = a; exact && i < z; i += 4) {
      uint32_t u;
      memcpy(&u, data + i, 4);
      exact = (u & 0xffff) == 0;
    }
    size_t start = pos;
    if (exact) {
      for (size_t i = a; i < z; i += 4, pos += 2) {
        uint32_t u;
        memcpy(&u, data + i, 4);
        uint16_t hb = (uint16_t)(u >> 16);
        memcpy(buf + pos, &hb, 2);
      }
      cJSON_SetValuestring(dt, "BF16");
      n_bf16++;
    } else {
      memcpy(buf + pos, data + a, z - a);
      pos += z - a;
    }
    pos = (pos + 7) / 8 * 8 <= cap ? (pos + 7) / 8 * 8 : pos; /* keep the next tensor aligned when there is room */
    cJSON_SetNumberValue(cJSON_GetArrayItem(off, 0), (double)start);
    cJSON_SetNumberValue(cJSON_GetArrayItem(off, 1), (double)(start + (exact ? (z - a) / 2 : z - a)));
  }
  *out = buf;
  *out_len = pos;
}

/* The original checkpoint naming: no "model." prefix, embed.weight, norm.weight, hc_head_fn, ... */
static void edit_original_names(cJSON *h, uint8_t *data, void *arg) {
  (void)data;
  (void)arg;
  cJSON *out = cJSON_CreateObject();
  cJSON *e;
  while ((e = h->child) != NULL) {
    cJSON_DetachItemViaPointer(h, e);
    char name[512];
    const char *n = e->string;
    if (strcmp(n, "model.embed_tokens.weight") == 0)
      snprintf(name, sizeof name, "embed.weight");
    else if (strcmp(n, "model.norm.weight") == 0)
      snprintf(name, sizeof name, "norm.weight");
    else if (strncmp(n, "model.hc_head.", 14) == 0)
      snprintf(name, sizeof name, "hc_head_%s", n + 17); /* model.hc_head.hc_fn -> hc_head_fn */
    else if (strncmp(n, "model.", 6) == 0)
      snprintf(name, sizeof name, "%s", n + 6);
    else
      snprintf(name, sizeof name, "%s", n);
    cJSON_AddItemToObject(out, name, e);
  }
  /* move the renamed items back into h (the caller owns h) */
  while ((e = out->child) != NULL) {
    cJSON_DetachItemViaPointer(out, e);
    cJSON_AddItemToObject(h, e->string, e);
  }
  cJSON_Delete(out);
}

/* Loads a variant; returns its status (and frees what was loaded). */
static di_status load_variant(edit_fn edit, rewrite_fn rewrite, void *arg, const char *cfg_json, float *logits,
                              const int32_t *ids, int n) {
  char tmpl[] = "/tmp/di_v4ref_XXXXXX";
  char *dir = mkdtemp(tmpl);
  CHECK(dir != NULL);
  if (!dir)
    return DI_ERR_IO;
  CHECK(write_variant(dir, edit, rewrite, arg));
  di_v4_config cfg;
  di_tensor_source *src = NULL;
  di_v4_weights w;
  di_status st = load_dir(dir, cfg_json ? cfg_json : cfg_text, &cfg, &src, &w);
  if (st == DI_OK && logits) {
    st = di_cpu_v4_forward_full(&cfg, &w, ids, n, logits);
  }
  if (src) {
    di_v4_weights_free(&w);
    di_tensor_source_free(src);
  }
  remove_variant(dir);
  return st;
}

static void check_checkpoint_errors(void) {
  const char *missing[2] = {"model.layers.1.attn.indexer.wq_b.weight", "model.layers.1.attn.indexer.wq_b.weightX"};
  CHECK_ERR(load_variant(edit_rename, NULL, missing, NULL, NULL, NULL, 0), "missing tensor 'model.layers.1.attn.indexer.wq_b.weight'");
  const char *sink[2] = {"model.layers.3.attn.attn_sink", "model.layers.3.attn.sinks"};
  CHECK_ERR(load_variant(edit_rename, NULL, sink, NULL, NULL, NULL, 0), "missing tensor 'model.layers.3.attn.attn_sink'");
  CHECK_ERR(load_variant(edit_shape, NULL, "model.layers.2.attn.compressor.wkv.weight", NULL, NULL, NULL, 0),
            "tensor 'model.layers.2.attn.compressor.wkv.weight'");
  CHECK_ERR(load_variant(edit_shape, NULL, "model.layers.2.attn.compressor.wkv.weight", NULL, NULL, NULL, 0),
            "has shape [32, 128], the config implies [64, 64]");
  CHECK_ERR(load_variant(edit_tid2eid, NULL, NULL, NULL, NULL, NULL, 0), "entry [3][1] = 99 is not an expert id");
  /* a CSA layer's checkpoint under an HCA config: its compressor is 2*head_dim wide, HCA's head_dim */
  char *swapped = replace_once(cfg_text, "\"compressed_sparse_attention\",\n    \"heavily", "\"heavily_compressed_attention\",\n    \"heavily");
  CHECK(swapped != NULL);
  if (swapped) {
    di_v4_config cfg;
    di_tensor_source *src = NULL;
    di_v4_weights w;
    CHECK_ERR(load_dir(test_path(FIXTURE), swapped, &cfg, &src, &w),
              "tensor 'model.layers.1.attn.compressor.wkv.weight' in");
    free(swapped);
  }
}

static void check_original_naming(const di_v4_config *cfg, const di_v4_weights *w) {
  int32_t ids[40];
  for (int i = 0; i < 40; i++)
    ids[i] = (i * 37 + 11) % cfg->vocab_size;
  float *a = malloc(sizeof(float) * 40 * cfg->vocab_size), *b = malloc(sizeof(float) * 40 * cfg->vocab_size);
  di_status st = di_cpu_v4_forward_full(cfg, w, ids, 40, a);
  CHECK(st == DI_OK);
  st = load_variant(edit_original_names, NULL, NULL, NULL, b, ids, 40);
  CHECKF(st == DI_OK, "original naming: %s", di_last_error());
  CHECK(st == DI_OK && memcmp(a, b, sizeof(float) * 40 * cfg->vocab_size) == 0);
  memset(b, 0, sizeof(float) * 40 * cfg->vocab_size);
  st = load_variant(NULL, rewrite_bf16, NULL, NULL, b, ids, 40);
  CHECKF(st == DI_OK, "bf16 copy: %s", di_last_error());
  CHECKF(n_bf16 > 200, "only %d tensors converted to BF16", n_bf16);
  CHECK(st == DI_OK && memcmp(a, b, sizeof(float) * 40 * cfg->vocab_size) == 0);
  /* bad arguments */
  ids[5] = cfg->vocab_size;
  CHECK_ERR(di_cpu_v4_forward_full(cfg, w, ids, 40, a), "token 512 at position 5 is outside the vocabulary");
  CHECK_ERR(di_cpu_v4_forward_full(cfg, w, ids, 0, a), "empty token sequence");
  free(a);
  free(b);
}

/* ---- config errors ----------------------------------------------------------------------------------- */

/* Parses the fixture config with `from` replaced by `to`; expects an error containing `needle`. */
static void cfg_err(const char *from, const char *to, const char *needle) {
  char *s = replace_once(cfg_text, from, to);
  CHECKF(s != NULL, "test setup: '%s' not in config.json", from);
  if (!s)
    return;
  di_v4_config c;
  CHECK_ERR(di_v4_config_parse(s, strlen(s), &c), needle);
  free(s);
}

static void check_config(const di_v4_config *c) {
  CHECK(c->n_layers == 4 && c->hidden_size == 64 && c->head_dim == 64 && c->n_heads == 4);
  CHECK(c->attn_kind[0] == DI_V4_ATTN_SLIDING && c->attn_kind[1] == DI_V4_ATTN_CSA && c->attn_kind[2] == DI_V4_ATTN_HCA &&
        c->attn_kind[3] == DI_V4_ATTN_CSA);
  CHECK(c->ffn_kind[0] == DI_V4_FFN_HASH_MOE && c->ffn_kind[1] == DI_V4_FFN_MOE);
  CHECK(c->csa_rate == 4 && c->hca_rate == 128 && c->index_topk == 8 && c->index_head_dim == 16 && c->index_n_heads == 2);
  CHECK(c->rope_main.dim == 16 && !c->rope_main.yarn && c->rope_main.theta == 10000.0);
  CHECK(c->rope_compress.dim == 16 && c->rope_compress.yarn && c->rope_compress.theta == 160000.0 &&
        c->rope_compress.factor == 16.0 && c->rope_compress.original_max_pos == 64 && c->rope_compress.attention_factor == 1.0);
  CHECK(c->hc_mult == 4 && c->hc_sinkhorn_iters == 20 && c->o_groups == 2 && c->o_lora_rank == 16 && c->sliding_window == 128);
  CHECK(c->scoring == DI_V4_SCORE_SQRTSOFTPLUS && c->routed_scaling == 1.5 && c->swiglu_limit == 10.0 && !c->fp8);

  cfg_err("\"hidden_size\": 64", "\"hidden_sizeX\": 64", "missing required field \"hidden_size\"");
  cfg_err("\"hc_mult\": 4", "\"hc_mult\": \"four\"", "\"hc_mult\" must be an integer");
  cfg_err("\"o_groups\": 2", "\"o_groups\": 3", "o_groups (3) must divide");
  cfg_err("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", "num_experts_per_tok (9) exceeds n_routed_experts (8)");
  cfg_err("\"sliding_attention\"", "\"full_attention\"", "layer_types[0] = \"full_attention\"");
  cfg_err("\"hash_moe\"", "\"dense\"", "mlp_layer_types[0] = \"dense\"");
  cfg_err("\"scoring_func\": \"sqrtsoftplus\"", "\"scoring_func\": \"softmax\"", "scoring_func \"softmax\" is not supported");
  cfg_err("\"model_type\": \"deepseek_v4\"", "\"model_type\": \"deepseek_v3\"", "model_type \"deepseek_v3\" is not deepseek_v4");
  cfg_err("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 2", "num_key_value_heads must be 1");
  cfg_err("\"index_topk\": 8,", "", "missing required field \"index_topk\"");
  cfg_err("\"rope_type\": \"yarn\"", "\"rope_type\": \"ntk\"", "rope_type \"ntk\" is not supported");
  cfg_err("\"original_max_position_embeddings\": 64", "\"original_max_position_embeddingz\": 64",
          "needs \"original_max_position_embeddings\"");
  cfg_err("{", "[", "config.json");

  /* the original (flat) dialect: compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling */
  const char *flat = "{\"model_type\": \"deepseek_v4\", \"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 4,"
                     " \"num_attention_heads\": 4, \"head_dim\": 64, \"q_lora_rank\": 32, \"o_groups\": 2, \"o_lora_rank\": 16,"
                     " \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"index_n_heads\": 2,"
                     " \"index_head_dim\": 16, \"index_topk\": 8, \"compress_ratios\": [0, 4, 128, 4, 0],"
                     " \"num_hash_layers\": 1, \"qk_rope_head_dim\": 16, \"compress_rope_theta\": 160000,"
                     " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 64,"
                     " \"beta_fast\": 32, \"beta_slow\": 1}}";
  di_v4_config f;
  di_status st = di_v4_config_parse(flat, strlen(flat), &f);
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(memcmp(f.attn_kind, c->attn_kind, 4) == 0 && memcmp(f.ffn_kind, c->ffn_kind, 4) == 0);
  CHECK(memcmp(&f.rope_main, &c->rope_main, sizeof f.rope_main) == 0);
  CHECK(memcmp(&f.rope_compress, &c->rope_compress, sizeof f.rope_compress) == 0);
}

/* The fuzz corpus of the config parser (fuzz/fuzz_v4_config.c): good_* parse, crash-* (findings
 * that scripts/fuzz_run.sh kept) and the fuzzer's sha-named finds must only not crash, the rest fail
 * with a message. */
static void replay_config(const char *name, const char *rel, const char *buf, size_t len, void *ctx) {
  (void)ctx;
  di_v4_config c;
  di_status st = di_v4_config_parse(buf, len, &c);
  if (strncmp(name, "crash-", 6) == 0 || strspn(name, "0123456789abcdef") == strlen(name))
    CHECKF(st == DI_OK || di_last_error()[0] != 0, "%s: an error without a message", rel);
  else if (strncmp(name, "good", 4) == 0)
    CHECKF(st == DI_OK, "%s: %s", rel, di_last_error());
  else
    CHECKF(st != DI_OK && di_last_error()[0] != 0, "%s: expected an error", rel);
}

/* The native-format fixture (MXFP4 routed experts, FP8 attention and shared expert with UE8M0 128 x 128
 * scales, DeepSeek's tensor names; tests/data/tools/make_v4_native.py) against transformers on its
 * dequantized weights: every weight read in place must give the reference's numbers. */
static void check_native_formats(void) {
  char *text = NULL;
  size_t len = 0;
  di_status st = di_read_file(test_path(NATIVE_FIXTURE "/config.json"), &text, &len);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return;
  di_v4_config cfg;
  di_tensor_source *src = NULL;
  di_v4_weights w;
  st = load_dir(test_path(NATIVE_FIXTURE), text, &cfg, &src, &w);
  CHECKF(st == DI_OK, "native formats: %s", di_last_error());
  if (st == DI_OK) {
    CHECK(cfg.fp8 && cfg.fp8_block[0] == 128 && cfg.fp8_block[1] == 128);
    CHECK(w.layers[1].exp_w1[0].dtype == DI_DT_F4E2M1 && w.layers[1].exp_w2[7].dtype == DI_DT_F4E2M1);
    CHECK(w.layers[2].wq_a.dtype == DI_DT_F8E4M3 && w.layers[2].wq_a.scale_e8m0 && w.layers[0].sh_w2.dtype == DI_DT_F8E4M3);
    CHECK(w.layers[1].router.dtype == DI_DT_F32 && w.embed.dtype == DI_DT_F32);
    check_golden(NATIVE_FIXTURE, "dsv4-tiny-native", 0, &cfg, &w);
    di_v4_weights_free(&w);
    di_tensor_source_free(src);
  }
  free(text);
}

int main(void) {
  CHECK(test_for_each_file("fuzz/corpus/v4_config", replay_config, NULL) >= 6);
  CHECK(test_fuzz_replay("fuzz/corpus/v4_config", fuzz_v4_config_one) >= 6);
  di_status st = di_read_file(test_path(FIXTURE "/config.json"), &cfg_text, &cfg_len);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return test_finish("test_v4_reference");
  di_v4_config cfg;
  di_tensor_source *src = NULL;
  di_v4_weights w;
  st = load_dir(test_path(FIXTURE), cfg_text, &cfg, &src, &w);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st == DI_OK) {
    check_config(&cfg);
    check_golden(FIXTURE, "dsv4-tiny", 1, &cfg, &w);
    check_original_naming(&cfg, &w);
    di_v4_weights_free(&w);
    di_tensor_source_free(src);
  }
  check_native_formats();
  check_checkpoint_errors();
  free(cfg_text);
  return test_finish("test_v4_reference");
}
