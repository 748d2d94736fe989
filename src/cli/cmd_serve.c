/* `deepinfer serve`: loads a model and serves the OpenAI API over HTTP (src/server/, docs/server.md).
 * Flags carry vLLM's names; SIGINT/SIGTERM shut the server down gracefully. */
#include "cli.h"
#include "server/server.h"
#include "util/json.h"
#include "util/status.h"
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/switches.h"

int di_cmd_serve(int argc, char **argv);

static di_server *g_server;

static volatile sig_atomic_t g_signals;

static void on_signal(int sig) {
  (void)sig;
  /* the first signal starts the graceful shutdown; a second one (Ctrl-C again) exits at once */
  if (g_signals++ > 0) _exit(130);
  if (g_server) di_server_request_stop(g_server);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: deepinfer serve [MODEL_DIR] [--model DIR] [--host 127.0.0.1] [--port 8000] [options]\n"
          "\n"
          "Serves the OpenAI API: POST /v1/completions, /v1/chat/completions, GET /v1/models, /health,\n"
          "/metrics, /version, POST /tokenize, /detokenize (see docs/server.md).\n"
          "\n"
          "Model:    MODEL_DIR or --model DIR (else $DEEPINFER_HF_MODEL_DIR, else the shipped models/default)\n"
          "          --served-model-name NAME (default: the model argument as given, or \"default\")\n"
          "          --load-format auto|dummy  --dummy-seed N  --threads N  --accelerator cpu|cuda\n"
          "          --quantization fp8 (a bf16 checkpoint's linear layers to 128x128 block FP8 at load)\n"
          "          --kv-cache-dtype auto|fp8 (fp8: the latent KV cache in E4M3; CPU and CUDA backends)\n"
          "          --batch-invariant (a request's output independent of the requests batched with it:\n"
          "          the CPU always is; CUDA then runs slower kernels; also $DEEPINFER_BATCH_INVARIANT=1)\n"
          "Engine:   --max-model-len N  --max-num-seqs N  --max-num-batched-tokens N\n"
          "          --enable-prefix-caching | --no-enable-prefix-caching  --no-chunked-prefill\n"
          "          --kv-cache-memory BYTES  --num-kv-blocks N  --no-async-scheduling  --seed N\n"
          "          --gpu-memory-utilization U (CUDA: share of the device's memory for everything, 0.9;\n"
          "          the KV cache gets what the weights and step buffers leave; the CPU's default is 1 GiB)\n"
          "          --swa-bounded-replay (DeepSeek-V4: cached prefixes keep no window; a hit recomputes it)\n"
          "          --speculative-config JSON ({\"method\": \"mtp\"|\"dspark\", \"num_speculative_tokens\": N}; docs/speculative.md)\n"
          "HTTP:     --host ADDR (default 127.0.0.1; 0.0.0.0 for all interfaces)  --port N (0: any free port)\n"
          "          --api-key KEY (or $DEEPINFER_API_KEY: every route but /health, /ping and /metrics needs\n"
          "          \"Authorization: Bearer KEY\")\n"
          "Limits:   --max-connections N (16384 open at once)  --max-body-bytes N (32 MiB)  --max-n N (1024 samples\n"
          "          per request: n x prompts)  --max-model-len N (prompt + output tokens)\n"
          "          --keep-alive-timeout S (60: a connection silent this long is closed)\n"
          "          --request-timeout S (60: a request body must arrive within this of its head)\n"
          "          --shutdown-timeout S (10: in-flight requests get this long on SIGINT/SIGTERM)\n"
          "          --disable-log-requests (no access-log lines on stderr)\n"
          "          --allowed-origins '*'|ORIGIN,ORIGIN...|'' (CORS; default *: any browser origin may call)\n"
          "Tools:    --enable-auto-tool-choice --tool-call-parser deepseek_v3|deepseek_v31|deepseek_v32|deepseek_v4\n"
          "          (DeepSeek tool-call markup in chat replies becomes OpenAI tool_calls; every form is read)  --reasoning-parser deepseek_r1\n"
          "          (<think>...</think> of chat replies becomes reasoning_content)\n");
}

static int parse_ll(const char *flag, const char *v, long long lo, long long hi, long long *out) {
  return di_cli_parse_int("serve", flag, v, lo, hi, out);
}

int di_cmd_serve(int argc, char **argv) {
  /* before any thread: cJSON's allocation hooks are process-wide (util/json.h) */
  di_json_track_alloc_failures();
  const char *model_dir = NULL, *served = NULL, *load_format = "auto", *accelerator = NULL, *api_key = NULL;
  const char *quantization = NULL, *kv_cache_dtype = NULL;
  const char *spec_json = NULL;
  long long threads = 0, dummy_seed = 0, seed = 0, x;
  int auto_tools = 0, batch_invariant = 0;
  di_server_config sc;
  di_server_config_default(&sc);
  di_engine_options eo;
  di_engine_options_default(&eo);
  for (int i = 1; i < argc; i++) {
    const char *v = NULL, *a = argv[i];
    int err = 0;
    if (di_cli_is_help(a)) { usage(stdout); return 0; }
#define FLAG(name) (di_cli_flag_value(argc, argv, &i, name, &v, &err) && !err)
#define INT(lo, hi) if (!parse_ll(a, v, lo, hi, &x)) return 2
    int ef = di_cli_engine_flag("serve", argc, argv, &i, &eo);
    if (ef < 0) return 2;
    if (ef) continue;
    if (strcmp(a, "--disable-log-requests") == 0) sc.log_requests = 0;
    else if (strcmp(a, "--enable-auto-tool-choice") == 0) auto_tools = 1;
    else if (strcmp(a, "--batch-invariant") == 0) batch_invariant = 1;
    else if (FLAG("--reasoning-parser")) {
      if (strcmp(v, "deepseek_r1") != 0) {
        fprintf(stderr, "deepinfer serve: --reasoning-parser: \"%s\" is not known (deepseek_r1)\n", v);
        return 2;
      }
      sc.reasoning_parser = 1;
    } else if (FLAG("--tool-call-parser")) {
      if (strcmp(v, "deepseek_v3") != 0 && strcmp(v, "deepseek_v31") != 0 && strcmp(v, "deepseek_v32") != 0 &&
          strcmp(v, "deepseek_v4") != 0) {
        fprintf(stderr, "deepinfer serve: --tool-call-parser: \"%s\" is not known (deepseek_v3, deepseek_v31, "
                "deepseek_v32, deepseek_v4)\n", v);
        return 2;
      }
      sc.tool_call_parser = 1;
    }
    else if (FLAG("--model")) model_dir = v;
    else if (FLAG("--served-model-name")) served = v;
    else if (FLAG("--host")) sc.host = v;
    else if (FLAG("--port")) { INT(0, 65535); sc.port = (int)x; }
    else if (FLAG("--api-key")) api_key = v;
    else if (FLAG("--allowed-origins")) sc.allowed_origins = v;
    else if (FLAG("--load-format")) load_format = v;
    else if (FLAG("--quantization")) quantization = v;
    else if (FLAG("--kv-cache-dtype")) kv_cache_dtype = v;
    else if (FLAG("--accelerator")) accelerator = v;
    else if (FLAG("--threads")) { INT(0, 4096); threads = x; }
    else if (FLAG("--dummy-seed")) { INT(0, INT64_MAX); dummy_seed = x; }
    else if (FLAG("--seed")) { INT(0, INT64_MAX); seed = x; }
    else if (FLAG("--max-connections")) { INT(1, 1 << 20); sc.max_connections = (int)x; }
    else if (FLAG("--max-body-bytes")) { INT(1024, (long long)1 << 40); sc.max_body_bytes = (size_t)x; }
    else if (FLAG("--keep-alive-timeout")) { INT(1, 86400); sc.keep_alive_timeout_s = (int)x; }
    else if (FLAG("--request-timeout")) { INT(1, 86400); sc.request_timeout_s = (int)x; }
    else if (FLAG("--max-n")) { INT(1, 1024); sc.max_n = (int)x; }
    else if (FLAG("--shutdown-timeout")) { INT(0, 86400); sc.shutdown_grace_s = (int)x; }
    else if (FLAG("--speculative-config")) {
      if (di_engine_set_speculative_config(NULL, NULL, v) != DI_OK) {
        fprintf(stderr, "deepinfer serve: --speculative-config: %s\n", di_last_error());
        return 2;
      }
      spec_json = v;
    }
    else if (a[0] != '-' && !model_dir) model_dir = a;
    else {
      if (!err) fprintf(stderr, "deepinfer serve: unknown option '%s' (see --help)\n", a);
      return 2;
    }
#undef INT
#undef FLAG
  }
  if (auto_tools != sc.tool_call_parser) {
    fprintf(stderr, "deepinfer serve: --enable-auto-tool-choice and --tool-call-parser go together (as in vLLM)\n");
    return 2;
  }
  if (!served) served = model_dir ? model_dir : "default";
  if (!model_dir) model_dir = di_cli_default_model_dir();
  if (!api_key) api_key = di_switch_get(DI_SW_API_KEY);
  eo.seed = (uint64_t)seed;

  int rc = 1;
  di_model *m = NULL;
  di_engine *e = NULL;
  di_chat_template *tmpl = NULL;
  di_server *srv = NULL;
  di_model_options mo;
  di_model_options_default(&mo);
  mo.load_format = load_format;
  mo.quantization = quantization;
  mo.kv_cache_dtype = kv_cache_dtype;
  mo.accelerator = accelerator;
  mo.threads = (int)threads;
  mo.dummy_seed = (uint64_t)dummy_seed;
  mo.batch_invariant = batch_invariant;
  if (di_model_load(model_dir, &mo, &m) != DI_OK || di_engine_create(m, &eo, &e) != DI_OK) {
    fprintf(stderr, "deepinfer serve: %s\n", di_last_error());
    goto done;
  }
  fprintf(stderr, "deepinfer serve: %s\n", di_engine_kv_summary(e));
  if (spec_json && di_engine_set_speculative_config(e, m, spec_json) != DI_OK) {
    fprintf(stderr, "deepinfer serve: --speculative-config: %s\n", di_last_error());
    goto done;
  }
  if (di_chat_template_load(model_dir, &tmpl) != DI_OK) {
    fprintf(stderr, "deepinfer serve: no chat template (/v1/chat/completions answers 400): %s\n", di_last_error());
    tmpl = NULL;
  }
  sc.served_name = served;
  sc.api_key = api_key;
  sc.model = m;
  sc.engine = e;
  sc.tmpl = tmpl;
  sc.max_model_len = eo.max_model_len > 0 && eo.max_model_len < di_model_max_context(m) ? eo.max_model_len
                                                                                          : di_model_max_context(m);
  if (di_server_create(&sc, &srv) != DI_OK) {
    fprintf(stderr, "deepinfer serve: %s\n", di_last_error());
    goto done;
  }
  g_server = srv;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  fprintf(stderr, "deepinfer serve: model %s (%s) as \"%s\", max_model_len %d\n", model_dir, di_model_type(m), served,
          sc.max_model_len);
  int v6 = strchr(sc.host, ':') != NULL;
  fprintf(stderr, "deepinfer serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", sc.host, v6 ? "]" : "",
          di_server_port(srv));
  fflush(stderr);
  if (di_server_run(srv) != DI_OK) {
    fprintf(stderr, "deepinfer serve: %s\n", di_last_error());
    /* a connection thread may still use the server: leave it allocated */
    srv = NULL;
    goto done_keep;
  }
  rc = 0;
done:
  g_server = NULL;
  di_server_free(srv);
  di_engine_free(e);
  di_model_free(m);
  di_chat_template_free(tmpl);
  return rc;
done_keep:
  g_server = NULL;
  return 1;
}
