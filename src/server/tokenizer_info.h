/* GET /tokenizer_info (tokenizer_info.c). */
#ifndef DI_SERVER_TOKENIZER_INFO_H
#define DI_SERVER_TOKENIZER_INFO_H
#include <stddef.h>
#include <cjson/cJSON.h>

/* The tokenizer configuration of the model folder as vLLM's /tokenizer_info gives it; NULL with
 * `why` filled when the folder has none. */
cJSON *di_tokenizer_info_json(const char *model_dir, char *why, size_t cap);
#endif
