/* `deepinfer generate`: one prompt (token ids, text, or a chat message rendered with the model's
 * template) through the engine; streams text to stdout, or with --output-format json prints one
 * JSON object {ids, text, finish_reason}. Sampling defaults come from generation_config.json; flags
 * override them. Engine flags carry vLLM's names. */
#include "cli.h"
#include "api/model_internal.h"
#include "util/json.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int di_cmd_generate(int argc, char **argv);

static void usage(FILE *f) {
  fprintf(f,
          "usage: deepinfer generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
          "\n"
          "Model:    --model DIR (else $DEEPINFER_HF_MODEL_DIR, else the shipped models/default)\n"
          "          --load-format auto|dummy  --dummy-seed N  --threads N  --accelerator cpu|cuda\n"
          "          --quantization fp8 (a bf16 checkpoint's linear layers to 128x128 block FP8 at load)\n"
          "          --kv-cache-dtype auto|fp8 (fp8: the latent KV cache in E4M3; CPU and CUDA backends)\n"
          "          --batch-invariant (outputs independent of the other requests in a step: the CPU\n"
          "          always is; CUDA then runs slower kernels; also $DEEPINFER_BATCH_INVARIANT=1)\n"
          "Prompt:   --prompt TEXT  --prompt-ids 1,2,3  --chat (the prompt is one user message,\n"
          "          rendered with the model's chat template)\n"
          "Sampling: --max-tokens N (128; 0: no limit, until a stop or the context (--max-model-len) is full)\n"
          "          --min-tokens N (0; at most --max-tokens)  --temperature T (>= 0; 0 = greedy)\n"
          "          --top-p P (0, 1]  --top-k K (-1 or 0: off)  --min-p P [0, 1]  --repetition-penalty R (> 0)\n"
          "          --presence-penalty P [-2, 2]  --frequency-penalty F [-2, 2]  --seed S  --n N [1, 1024]\n"
          "          --ignore-eos  --stop STR (repeatable)  --stop-token-id ID (repeatable)\n"
          "          (the server's ranges; defaults: generation_config.json, else temperature 1, top-p 1,\n"
          "          top-k off)\n"
          "Structure: --json-schema FILE | --regex RE | --grammar FILE (GBNF) | --json (any JSON object)\n"
          "Engine:   --max-model-len N  --max-num-seqs N  --max-num-batched-tokens N\n"
          "          --enable-prefix-caching | --no-enable-prefix-caching  --no-chunked-prefill\n"
          "          --kv-cache-memory BYTES  --num-kv-blocks N  --no-async-scheduling\n"
          "          --gpu-memory-utilization U (CUDA: share of the device's memory for everything, 0.9;\n"
          "          the KV cache gets what the weights and step buffers leave; --kv-cache-memory and\n"
          "          --num-kv-blocks override it; the CPU's default KV cache is 1 GiB)\n"
          "          --swa-bounded-replay (DeepSeek-V4: cached prefixes keep no window; a hit recomputes it)\n"
          "Speculative decoding (MTP layer; off by default; outputs identical to plain decoding on the\n"
          "          CPU, and on CUDA with --batch-invariant):\n"
          "          --speculative-tokens N (1..5)  --speculative-min-confidence P (0.3)\n"
          "          --speculative-config '{\"method\":\"mtp\"|\"dspark\",\"num_speculative_tokens\":N}' (docs/speculative.md)\n"
          "Output:   --output-format text|json (json: one object {ids, text, finish_reason} on stdout;\n"
          "          ids are the generated tokens, the stop token included)  --stats (engine stats on stderr)\n");
}

static int parse_int(const char *flag, const char *v, long long lo, long long hi, long long *out) {
  return di_cli_parse_int("generate", flag, v, lo, hi, out);
}

static int parse_float(const char *flag, const char *v, float *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !isfinite(x)) {
    fprintf(stderr, "deepinfer generate: %s: \"%s\" is not a number\n", flag, v);
    return 0;
  }
  *out = (float)x;
  return 1;
}

static int parse_ids(const char *v, int32_t **ids, int *n) {
  size_t bad = 0;
  int k = di_cli_parse_ids(v, ids, &bad);
  if (k < 0) {
    fprintf(stderr, "deepinfer generate: --prompt-ids: bad id at offset %d of \"%s\"\n", (int)bad, v);
    return 0;
  }
  *n = k;
  return 1;
}

static char *read_text_file(const char *path) {
  char *data;
  size_t len;
  if (di_read_file(path, &data, &len) != DI_OK) {
    fprintf(stderr, "deepinfer generate: %s\n", di_last_error());
    return NULL;
  }
  return data;
}

#define MAX_STOPS 64

int di_cmd_generate(int argc, char **argv) {
  const char *model_dir = NULL, *prompt = NULL, *prompt_ids_s = NULL, *fmt = "text", *load_format = "auto";
  const char *quantization = NULL, *kv_cache_dtype = NULL;
  const char *accelerator = NULL, *schema_file = NULL, *regex = NULL, *grammar_file = NULL;
  const char *stops[MAX_STOPS];
  int32_t stop_ids[MAX_STOPS];
  int n_stops = 0, n_stop_ids = 0, chat = 0, ignore_eos = 0, json_any = 0, show_stats = 0, batch_invariant = 0;
  long long max_tokens = 128, seed = -1, threads = 0, top_k = -2, n = 1, dummy_seed = 0, min_tokens = 0;
  float temperature = NAN, top_p = NAN, min_p = 0, rep = 1, pres = 0, freq = 0;
  long long spec_tokens = 0;
  float spec_conf = 0.3f;
  const char *spec_json = NULL;
  di_engine_options eo;
  di_engine_options_default(&eo);
  for (int i = 1; i < argc; i++) {
    const char *v = NULL, *a = argv[i];
    int err = 0;
    long long x;
    if (di_cli_is_help(a)) { usage(stdout); return 0; }
#define FLAG(name) (di_cli_flag_value(argc, argv, &i, name, &v, &err) && !err)
    int ef = di_cli_engine_flag("generate", argc, argv, &i, &eo);
    if (ef < 0) return 2;
    if (ef) continue;
    if (strcmp(a, "--chat") == 0) chat = 1;
    else if (strcmp(a, "--ignore-eos") == 0) ignore_eos = 1;
    else if (strcmp(a, "--json") == 0) json_any = 1;
    else if (strcmp(a, "--stats") == 0) show_stats = 1;
    else if (strcmp(a, "--batch-invariant") == 0) batch_invariant = 1;
    else if (FLAG("--model")) model_dir = v;
    else if (FLAG("--prompt")) prompt = v;
    else if (FLAG("--prompt-ids")) prompt_ids_s = v;
    else if (FLAG("--output-format")) fmt = v;
    else if (FLAG("--load-format")) load_format = v;
    else if (FLAG("--quantization")) quantization = v;
    else if (FLAG("--kv-cache-dtype")) kv_cache_dtype = v;
    else if (FLAG("--accelerator")) accelerator = v;
    else if (FLAG("--json-schema")) schema_file = v;
    else if (FLAG("--regex")) regex = v;
    else if (FLAG("--grammar")) grammar_file = v;
    else if (FLAG("--stop")) {
      if (n_stops == MAX_STOPS) { fprintf(stderr, "deepinfer generate: at most %d --stop\n", MAX_STOPS); return 2; }
      stops[n_stops++] = v;
    } else if (FLAG("--stop-token-id")) {
      if (n_stop_ids == MAX_STOPS || !parse_int(a, v, 0, INT32_MAX, &x)) return 2;
      stop_ids[n_stop_ids++] = (int32_t)x;
    } else if (FLAG("--max-tokens")) { if (!parse_int(a, v, 0, INT32_MAX, &max_tokens)) return 2; }
    else if (FLAG("--seed")) { if (!parse_int(a, v, 0, INT64_MAX, &seed)) return 2; }
    else if (FLAG("--threads")) { if (!parse_int(a, v, 0, 4096, &threads)) return 2; }
    else if (FLAG("--dummy-seed")) { if (!parse_int(a, v, 0, INT64_MAX, &dummy_seed)) return 2; }
/* the sampling table's bounds checked by di_cli_parse_sampling; an integer flag's value becomes an
 * integer through the one range check (util/json.h), a float one by an explicit narrowing */
#define SAMPLING(flag, var)                                                     \
  else if (FLAG(flag)) {                                                        \
    double d;                                                                   \
    if (!di_cli_parse_sampling("generate", flag, v, &d)) return 2;              \
    var = (float)d;                                                             \
  }
#define SAMPLING_INT(flag, var)                                                 \
  else if (FLAG(flag)) {                                                        \
    double d;                                                                   \
    int64_t i64;                                                                \
    if (!di_cli_parse_sampling("generate", flag, v, &d) ||                      \
        !di_double_to_int_in(d, INT32_MIN, INT32_MAX, &i64)) return 2;          \
    var = i64;                                                                  \
  }
    SAMPLING_INT("--top-k", top_k)
    SAMPLING_INT("--n", n)
    SAMPLING_INT("--min-tokens", min_tokens)
    SAMPLING("--temperature", temperature)
    SAMPLING("--top-p", top_p)
    SAMPLING("--min-p", min_p)
    SAMPLING("--repetition-penalty", rep)
    SAMPLING("--presence-penalty", pres)
    SAMPLING("--frequency-penalty", freq)
#undef SAMPLING
#undef SAMPLING_INT
    else if (FLAG("--speculative-tokens")) { if (!parse_int(a, v, 0, 5, &spec_tokens)) return 2; }
    else if (FLAG("--speculative-min-confidence")) { if (!parse_float(a, v, &spec_conf)) return 2; }
    else if (FLAG("--speculative-config")) {
      if (di_engine_set_speculative_config(NULL, NULL, v) != DI_OK) {
        fprintf(stderr, "deepinfer generate: --speculative-config: %s\n", di_last_error());
        return 2;
      }
      spec_json = v;
    }
    else {
      if (!err) fprintf(stderr, "deepinfer generate: unknown option '%s' (see --help)\n", a);
      return 2;
    }
#undef FLAG
  }
  int json_out = strcmp(fmt, "json") == 0;
  if (!json_out && strcmp(fmt, "text") != 0) {
    fprintf(stderr, "deepinfer generate: --output-format must be text or json, not \"%s\"\n", fmt);
    return 2;
  }
  if (!prompt == !prompt_ids_s) {
    fprintf(stderr, "deepinfer generate: give exactly one of --prompt and --prompt-ids\n");
    return 2;
  }
  if (chat && !prompt) {
    fprintf(stderr, "deepinfer generate: --chat needs --prompt TEXT\n");
    return 2;
  }
  if (!!schema_file + !!regex + !!grammar_file + json_any > 1) {
    fprintf(stderr, "deepinfer generate: give at most one of --json-schema, --regex, --grammar, --json\n");
    return 2;
  }
  if (max_tokens > 0 && min_tokens > max_tokens) {
    fprintf(stderr, "deepinfer generate: --min-tokens: must be at most --max-tokens (%lld), got %lld\n", max_tokens, min_tokens);
    return 2;
  }
  if (!model_dir) model_dir = di_cli_default_model_dir();
  const int no_tokenizer = di_cli_lacks_tokenizer(model_dir);
  if (prompt && no_tokenizer) {
    /* said before loading (a large model takes a while): only token ids work without tokenizer.json */
    fprintf(stderr, "deepinfer generate: --prompt: a text prompt needs a tokenizer, and %s has no tokenizer.json "
                    "(give the prompt as token ids: --prompt-ids 1,2,3)\n", model_dir);
    return 1; /* the model cannot serve the request: exit 1, as a request that fails */
  }

  int rc = 1;
  di_model *m = NULL;
  di_engine *e = NULL;
  di_chat_template *tmpl = NULL;
  char *rendered = NULL, *schema = NULL, *grammar = NULL, *text = NULL;
  int32_t *pids = NULL, *out_ids = NULL;
  int n_pids = 0, n_out = 0, cap_out = 0;
  size_t text_len = 0, text_cap = 0;
  di_finish_reason fin = DI_FINISH_NONE;
  char err_msg[1024] = "";

  di_model_options mo;
  di_model_options_default(&mo);
  mo.load_format = load_format;
  mo.quantization = quantization;
  mo.kv_cache_dtype = kv_cache_dtype;
  mo.accelerator = accelerator;
  mo.threads = (int)threads;
  mo.dummy_seed = (uint64_t)dummy_seed;
  mo.quiet = json_out;
  mo.batch_invariant = batch_invariant;
  if (prompt_ids_s && !parse_ids(prompt_ids_s, &pids, &n_pids)) return 2;
  if (schema_file && !(schema = read_text_file(schema_file))) goto done;
  if (grammar_file && !(grammar = read_text_file(grammar_file))) goto done;
  if (di_model_load(model_dir, &mo, &m) != DI_OK) {
    fprintf(stderr, "deepinfer generate: %s\n", di_last_error());
    goto done;
  }
  if (di_engine_create(m, &eo, &e) != DI_OK) {
    fprintf(stderr, "deepinfer generate: %s\n", di_last_error());
    goto done;
  }
  if (!json_out) fprintf(stderr, "deepinfer: %s\n", di_engine_kv_summary(e));
  if (spec_tokens > 0 && di_engine_set_speculative(e, (int)spec_tokens, spec_conf) != DI_OK) {
    fprintf(stderr, "deepinfer generate: %s\n", di_last_error());
    goto done;
  }
  if (spec_json && di_engine_set_speculative_config(e, m, spec_json) != DI_OK) {
    fprintf(stderr, "deepinfer generate: --speculative-config: %s\n", di_last_error());
    goto done;
  }
  di_request_params p;
  di_request_params_default(&p);
  if (chat) {
    if (di_chat_template_load(model_dir, &tmpl) != DI_OK) {
      fprintf(stderr, "deepinfer generate: --chat: %s\n", di_last_error());
      goto done;
    }
    cJSON *msgs = cJSON_CreateArray(), *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "role", "user");
    cJSON_AddStringToObject(msg, "content", prompt);
    cJSON_AddItemToArray(msgs, msg);
    char *conv = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    di_status st = conv ? di_chat_template_render_json(tmpl, conv, 1, &rendered) : DI_ERR_OOM;
    free(conv);
    if (st != DI_OK) {
      fprintf(stderr, "deepinfer generate: --chat: %s\n", di_last_error());
      goto done;
    }
    p.prompt = rendered;
    p.prompt_is_rendered = 1;
  } else if (prompt) {
    p.prompt = prompt;
  } else {
    p.prompt_ids = pids;
    p.n_prompt_ids = n_pids;
  }
  const di_model_config *cfg = &m->cfg;
  p.temperature = !isnan(temperature) ? temperature : !isnan(cfg->gen_temperature) ? cfg->gen_temperature : 1.0f;
  p.top_p = !isnan(top_p) ? top_p : !isnan(cfg->gen_top_p) && cfg->gen_top_p > 0 ? cfg->gen_top_p : 1.0f;
  p.top_k = top_k != -2 ? (int)top_k : cfg->gen_top_k > 0 ? cfg->gen_top_k : 0;
  p.min_p = min_p;
  p.repetition_penalty = rep;
  p.presence_penalty = pres;
  p.frequency_penalty = freq;
  p.max_tokens = (int)max_tokens;
  p.min_tokens = (int)min_tokens;
  p.n = (int)n;
  if (seed >= 0) { p.has_seed = 1; p.seed = (uint64_t)seed; }
  p.ignore_eos = ignore_eos;
  p.stop = stops;
  p.n_stop = n_stops;
  p.stop_token_ids = stop_ids;
  p.n_stop_token_ids = n_stop_ids;
  p.json_schema = schema;
  p.regex = regex;
  p.grammar = grammar;
  p.json_object = json_any;
  uint64_t id;
  if (di_engine_add_request(e, &p, &id) != DI_OK) {
    /* name the file a structured-output error is about */
    const char *file_flag = schema_file ? "--json-schema" : grammar_file ? "--grammar" : NULL;
    const char *file = schema_file ? schema_file : grammar_file;
    if (file_flag && strncmp(di_last_error(), "structured output", 17) == 0)
      fprintf(stderr, "deepinfer generate: %s %s: %s\n", file_flag, file, di_last_error());
    else
      fprintf(stderr, "deepinfer generate: %s\n", di_last_error());
    goto done;
  }
  while (di_engine_has_unfinished(e)) {
    di_step_output *out;
    if (di_engine_step(e, &out) != DI_OK) {
      snprintf(err_msg, sizeof err_msg, "%s", di_last_error());
      fin = DI_FINISH_ERROR;
      if (!di_engine_has_unfinished(e)) break;
      continue;
    }
    for (int i = 0; i < out->n; i++) {
      const di_seq_output *o = &out->seqs[i];
      if (o->sample_index != 0) continue; /* --n > 1: the first sample is printed */
      if (n_out + o->n_new_tokens > cap_out) {
        cap_out = (n_out + o->n_new_tokens) * 2 + 16;
        int32_t *b = realloc(out_ids, (size_t)cap_out * sizeof *b);
        if (!b) goto done;
        out_ids = b;
      }
      memcpy(out_ids + n_out, o->new_tokens, (size_t)o->n_new_tokens * sizeof *out_ids);
      if (!json_out && no_tokenizer) {
        /* no tokenizer.json: the text output is the generated ids, comma-separated as --prompt-ids */
        for (int k = 0; k < o->n_new_tokens; k++) printf("%s%d", n_out + k ? "," : "", (int)o->new_tokens[k]);
        fflush(stdout);
      }
      n_out += o->n_new_tokens;
      if (o->new_text_len) {
        if (text_len + o->new_text_len + 1 > text_cap) {
          text_cap = (text_len + o->new_text_len + 1) * 2;
          char *b = realloc(text, text_cap);
          if (!b) goto done;
          text = b;
        }
        memcpy(text + text_len, o->new_text, o->new_text_len);
        text_len += o->new_text_len;
        text[text_len] = 0;
        if (!json_out) {
          fwrite(o->new_text, 1, o->new_text_len, stdout);
          fflush(stdout);
        }
      }
      if (o->finish_reason) {
        fin = o->finish_reason;
        if (o->error) snprintf(err_msg, sizeof err_msg, "%s", o->error);
      }
    }
  }
  if (json_out) {
    cJSON *obj = cJSON_CreateObject(), *ids = cJSON_CreateArray();
    for (int i = 0; i < n_out; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(out_ids[i]));
    cJSON_AddItemToObject(obj, "ids", ids);
    cJSON_AddStringToObject(obj, "text", text ? text : "");
    cJSON_AddStringToObject(obj, "finish_reason", di_finish_reason_str(fin));
    if (fin == DI_FINISH_ERROR) cJSON_AddStringToObject(obj, "error", err_msg);
    char *s = cJSON_PrintUnformatted(obj);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(obj);
  } else {
    printf("\n");
  }
  if (fin == DI_FINISH_ERROR) fprintf(stderr, "deepinfer generate: %s\n", err_msg);
  if (show_stats) {
    di_engine_stats s;
    di_engine_get_stats(e, &s);
    fprintf(stderr, "deepinfer: %lld prompt tokens, %lld generated, %.1f tok/s generation, %lld steps, prefix-cache hit rate %.2f, "
            "KV blocks %lld used / %lld total\n", (long long)s.prompt_tokens, (long long)s.generated_tokens,
            s.generation_tokens_per_s, (long long)s.steps, s.prefix_cache_hit_rate, (long long)s.kv_blocks_used,
            (long long)s.kv_blocks_total);
    di_spec_stats ss;
    di_engine_get_spec_stats(e, &ss);
    if (ss.num_tokens > 0)
      fprintf(stderr, "deepinfer: speculative (%s, k=%d): %lld drafted, %lld accepted (%.1f%%), mean accepted length %.2f\n",
              ss.method ? "DSpark" : "MTP", ss.num_tokens, (long long)ss.drafted_tokens, (long long)ss.accepted_tokens, 100 * ss.acceptance_rate,
              ss.mean_accepted_length);
  }
  rc = fin == DI_FINISH_ERROR ? 1 : 0;
done:
  di_engine_free(e);
  di_model_free(m);
  di_chat_template_free(tmpl);
  di_string_free(rendered);
  free(schema); free(grammar); free(pids); free(out_ids); free(text);
  return rc;
}
