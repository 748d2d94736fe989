/* Offline batched inference with DeepInfer's C API: the C twin of offline_inference.py.
 *
 *   ./build/offline_inference                 the shipped default model (models/default)
 *   DEEPINFER_HF_MODEL_DIR=/path ./build/offline_inference
 *   ./build/offline_inference MODEL_DIR [dummy]     (dummy: random weights, for trying the API)
 *
 * Adds four text prompts to one engine, steps it until all finish while streaming each request's
 * new text, then prints the results and the engine statistics. */
#include <deepinfer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *PROMPTS[] = {"Hello, my name is", "The capital of France is", "The future of AI is",
                                "Once upon a time,"};
#define N_PROMPTS 4

/* models/default relative to the executable (build/ or build/examples/) or the working directory */
static const char *default_model(void) {
  const char *env = getenv("DEEPINFER_HF_MODEL_DIR");
  if (env && *env) return env;
  static char path[4096];
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    const char *rel[] = {"%s/../models/default", "%s/../../models/default"};
    for (int i = 0; i < 2; i++) {
      snprintf(path, sizeof path, rel[i], exe);
      char cfg[4200];
      snprintf(cfg, sizeof cfg, "%s/config.json", path);
      if (access(cfg, R_OK) == 0) return path;
    }
  }
  return "models/default";
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : default_model();
  di_model *model = NULL;
  di_engine *engine = NULL;
  di_model_options mo;
  di_model_options_default(&mo);
  if (argc > 2) mo.load_format = argv[2];
  if (di_model_load(dir, &mo, &model) != DI_OK || di_engine_create(model, NULL, &engine) != DI_OK) {
    fprintf(stderr, "offline_inference: %s\n", di_last_error());
    di_model_free(model);
    return 1;
  }
  uint64_t ids[N_PROMPTS];
  char *text[N_PROMPTS] = {0};
  size_t len[N_PROMPTS] = {0};
  const char *finish[N_PROMPTS] = {0};
  for (int i = 0; i < N_PROMPTS; i++) {
    di_request_params p;
    di_request_params_default(&p);
    p.prompt = PROMPTS[i];
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    p.max_tokens = 48;
    p.has_seed = 1;
    p.seed = (uint64_t)i;
    if (di_engine_add_request(engine, &p, &ids[i]) != DI_OK) {
      fprintf(stderr, "offline_inference: %s\n", di_last_error());
      return 1;
    }
  }
  while (di_engine_has_unfinished(engine)) {
    di_step_output *out;
    if (di_engine_step(engine, &out) != DI_OK) {
      fprintf(stderr, "offline_inference: %s\n", di_last_error());
      break;
    }
    for (int k = 0; k < out->n; k++) {
      const di_seq_output *o = &out->seqs[k];
      int i = (int)(o->req_id - ids[0]);
      if (i < 0 || i >= N_PROMPTS) continue;
      char *grown = realloc(text[i], len[i] + o->new_text_len + 1);
      if (!grown) return 1;
      text[i] = grown;
      memcpy(text[i] + len[i], o->new_text, o->new_text_len);
      len[i] += o->new_text_len;
      text[i][len[i]] = 0;
      if (o->finish_reason) finish[i] = di_finish_reason_str(o->finish_reason);
      if (o->error) fprintf(stderr, "request %d failed: %s\n", i, o->error);
    }
  }
  for (int i = 0; i < N_PROMPTS; i++) {
    printf("Prompt: \"%s\"\nGenerated: \"%s\" [%s]\n\n", PROMPTS[i], text[i] ? text[i] : "", finish[i] ? finish[i] : "?");
    free(text[i]);
  }
  di_engine_stats s;
  di_engine_get_stats(engine, &s);
  printf("stats: %lld prompt tokens, %lld generated, %.1f tok/s, prefix-cache hit rate %.2f, %lld steps\n",
         (long long)s.prompt_tokens, (long long)s.generated_tokens, s.generation_tokens_per_s, s.prefix_cache_hit_rate,
         (long long)s.steps);
  di_engine_free(engine);
  di_model_free(model);
  return 0;
}
