/* The tokenizer: Hugging Face tokenizer.json (BPE model, normalizers, pre-tokenizers, decoders,
 * post-processors, added tokens) plus tokenizer_config.json, encoding and decoding exactly as the
 * Hugging Face `tokenizers` library does, and a streaming detokenizer for generated text.
 * Thread-safety: a loaded tokenizer is read-only except for its BPE word cache, which a mutex guards;
 * encode, decode and streams may be used from several threads at once. */
#ifndef DI_TOKENIZER_TOKENIZER_H
#define DI_TOKENIZER_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "deepinfer.h"

typedef struct di_tokenizer di_tokenizer;
/* `path` is a folder (tokenizer.json + optional tokenizer_config.json) or a tokenizer.json file. */
di_status di_tokenizer_load(const char *path, di_tokenizer **out);
/* Same from memory: `json` is the tokenizer.json text, `config_json` the tokenizer_config.json
 * text or NULL. `what` names the input in error messages. */
di_status di_tokenizer_load_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                                const char *what, di_tokenizer **out);
void di_tokenizer_free(di_tokenizer *t);

/* encode(text, add_special_tokens) exactly as HF tokenizers; *ids malloc'd, caller frees.
 * Invalid UTF-8 policy: each maximal invalid byte subsequence is replaced by U+FFFD before encoding
 * (what Python's bytes.decode("utf-8", "replace") gives), so the ids equal HF's for that string. */
di_status di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, int add_special_tokens,
                              int32_t **ids, size_t *n_ids);
/* decode as HF tokenizers' decode(ids, skip_special_tokens), then transformers' clean-up of
 * tokenization spaces when tokenizer_config.json sets clean_up_tokenization_spaces. Ids outside
 * [0, vocab_size) are an error; unused ids inside it are skipped as HF does.
 * *text malloc'd NUL-terminated, caller frees. */
di_status di_tokenizer_decode(const di_tokenizer *t, const int32_t *ids, size_t n, int skip_special_tokens,
                              char **text, size_t *len);
/* Model vocab + added tokens (max id + 1). */
int di_tokenizer_vocab_size(const di_tokenizer *t);
/* The raw bytes a token stands for in generated text (byte-level BPE: inverse byte map; Metaspace:
 * U+2581 -> space; byte-fallback <0xAB> -> that byte; special tokens: their content). Returns NULL
 * and *len = 0 for an unused id. The pointer is valid while t lives. */
const char *di_tokenizer_token_bytes(const di_tokenizer *t, int32_t id, size_t *len);
/* The token's string as stored in tokenizer.json (NULL for an unused id). */
const char *di_tokenizer_id_to_token(const di_tokenizer *t, int32_t id);
int di_tokenizer_is_special(const di_tokenizer *t, int32_t id);
int32_t di_tokenizer_token_to_id(const di_tokenizer *t, const char *token); /* -1 if none */
/* From tokenizer_config.json (bos/eos token ids are -1 if none). */
int32_t di_tokenizer_bos_id(const di_tokenizer *t);
int32_t di_tokenizer_eos_id(const di_tokenizer *t);
int di_tokenizer_add_bos(const di_tokenizer *t);
int di_tokenizer_add_eos(const di_tokenizer *t);
int di_tokenizer_clean_up_spaces(const di_tokenizer *t);
const char *di_tokenizer_bos_token(const di_tokenizer *t); /* NULL if none */
const char *di_tokenizer_eos_token(const di_tokenizer *t); /* NULL if none */
/* Prompt ids for a raw text prompt: encode without specials, then BOS per add_bos_token (and EOS
 * per add_eos_token). Never used for rendered chat templates, which hold their own BOS. */
di_status di_tokenizer_encode_prompt(const di_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                     size_t *n);

/* Streaming detokenizer: push one token at a time, get the newly completed text (never a split
 * UTF-8 character, never re-emitting); concatenation of all outputs + flush == full decode. */
typedef struct di_detok_stream di_detok_stream;
di_status di_detok_stream_create(const di_tokenizer *t, int skip_special_tokens, di_detok_stream **out);
/* Sets *text and *len to the new text (a buffer owned by the stream, valid until the next call). */
di_status di_detok_stream_push(di_detok_stream *s, int32_t id, const char **text, size_t *len);
di_status di_detok_stream_flush(di_detok_stream *s, const char **text, size_t *len);
void di_detok_stream_free(di_detok_stream *s);
#endif
