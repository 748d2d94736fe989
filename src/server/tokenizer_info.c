/* GET /tokenizer_info, as vLLM serves it: the model folder's tokenizer configuration
 * (tokenizer_config.json less its added_tokens_decoder table) with the chat template the server
 * renders (chat_template.jinja when the folder has one, as the loader prefers it). Special tokens
 * written as objects ({"content": ...}) are given as their strings. lm-evaluation-harness reads it to
 * pick its "remote" tokenizer backend (then /tokenize and /detokenize do its tokenizing). */
#include "server/tokenizer_info.h"
#include "util/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cJSON *di_tokenizer_info_json(const char *model_dir, char *why, size_t cap) {
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
  char *data = NULL;
  size_t len = 0;
  cJSON *cfg = NULL;
  if (di_read_file(path, &data, &len) == DI_OK) cfg = cJSON_ParseWithLength(data, len);
  free(data);
  if (!cJSON_IsObject(cfg)) {
    cJSON_Delete(cfg);
    snprintf(why, cap, "the model folder has no readable tokenizer_config.json (%s)", path);
    return NULL;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(cfg, "added_tokens_decoder");
  for (cJSON *v = cfg->child; v; v = v->next) {
    const cJSON *content = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "content") : NULL;
    size_t kl = strlen(v->string);
    if (cJSON_IsString(content) && kl > 6 && strcmp(v->string + kl - 6, "_token") == 0)
      cJSON_ReplaceItemViaPointer(cfg, v, cJSON_CreateString(content->valuestring));
  }
  snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
  if (di_read_file(path, &data, &len) == DI_OK) {
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "chat_template");
    cJSON_AddStringToObject(cfg, "chat_template", data); /* NUL-terminated by di_read_file */
    free(data);
  }
  if (!cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class")) cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
  return cfg;
}
