/* DeepInfer public C API: the one header applications include.
 *
 * Conventions
 *  - Handles are opaque. Every `*_create`/`*_load` has a matching `*_free`; freeing NULL is a no-op.
 *  - Every fallible function returns a di_status. On failure di_last_error() returns a readable
 *    message for the calling thread (it names the file, tensor, key or position at fault), valid
 *    until the next failing call on that thread. Outputs are left untouched on failure.
 *  - Strings passed in are copied; strings returned are owned by the handle that returned them and
 *    live as long as it does, unless the function says otherwise.
 *  - The library never exits or aborts on bad input or out-of-memory.
 */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================ */
/* Status                                                                                        */
/* ============================================================================================ */
typedef enum di_status {
  DI_OK = 0,
  DI_ERR_INVALID_ARG = 1,   /* a caller-supplied value is out of range or inconsistent */
  DI_ERR_IO = 2,            /* a file could not be opened, read or mapped */
  DI_ERR_FORMAT = 3,        /* malformed input: JSON, safetensors, tokenizer.json, a grammar */
  DI_ERR_UNSUPPORTED = 4,   /* valid input naming something DeepInfer does not implement */
  DI_ERR_NOT_FOUND = 5,     /* a required file, tensor or key is missing */
  DI_ERR_OOM = 6,           /* memory (host or device, or the KV budget) ran out */
  DI_ERR_CONTEXT_OVERFLOW = 7, /* a prompt longer than the model's context */
  DI_ERR_BACKEND = 8,       /* the accelerator reported an error */
  DI_ERR_ABORTED = 9,       /* the operation was aborted by the caller */
  DI_ERR_INTERNAL = 10
} di_status;

/* A short fixed name of a status ("malformed input"). Never NULL. */
const char *di_status_str(di_status st);
/* The message of the last failure on this thread ("" when none). Never NULL. */
const char *di_last_error(void);

/* ============================================================================================ */
/* Models                                                                                        */
/* ============================================================================================ */
typedef struct di_model di_model;

typedef struct di_model_options {
  const char *load_format;   /* "auto" (safetensors in the folder) or "dummy" (random weights in
                                the shapes config.json describes; no weight files read). NULL: auto */
  const char *accelerator;   /* "cpu", "cuda" (alias "nvidia"); NULL: $DEEPINFER_ACCELERATOR, else cpu */
  int threads;               /* CPU threads; <= 0: all cores */
  uint64_t dummy_seed;       /* seed of the dummy weights */
  int quiet;                 /* nonzero: no progress lines on stderr while loading */
  int batch_invariant;       /* nonzero: a request's outputs do not depend on what else is in its steps
                                (the CPU backend always is; CUDA then runs slower kernels whose
                                arithmetic per row is fixed). Also on with $DEEPINFER_BATCH_INVARIANT=1 */
  const char *quantization;  /* NULL, "" or "none": weights as stored; "fp8" (vLLM's --quantization fp8,
                                but per 128 x 128 block, DeepSeek's format): a bf16 checkpoint's linear
                                layers quantized to FP8 at load (docs/quantization.md says which) */
  const char *kv_cache_dtype; /* NULL, "" or "auto": the backend's own (CPU f32, CUDA bf16); "fp8" or
                                "fp8_e4m3" (vLLM's --kv-cache-dtype): the MLA latent cache in E4M3, one
                                scale per token per 128 latent channels, the rope part bf16 (CPU and CUDA) */
} di_model_options;

/* Fills `opt` with defaults. */
void di_model_options_default(di_model_options *opt);

/* Loads a Hugging Face model folder (config.json, *.safetensors, optional generation_config.json,
 * tokenizer files). `opt` may be NULL for defaults. On success *out owns the model.
 * model_type deepseek_v2 / deepseek_v3: every path below. deepseek_v4: the CPU accelerator and
 * safetensors weights only (no dummy weights); the engine, di_model_score and di_model_loglikelihood(_batch)
 * serve it; speculative decoding is refused (no MTP layer run for V4). With DEEPINFER_CUDA_V4=1 V4 also
 * loads on cuda (experimental). */
di_status di_model_load(const char *dir, const di_model_options *opt, di_model **out);
void di_model_free(di_model *m);

/* The model's facts. */
int di_model_vocab_size(const di_model *m);       /* rows of the output layer (config vocab_size) */
int di_model_max_context(const di_model *m);      /* max_position_embeddings */
const char *di_model_type(const di_model *m);     /* "deepseek_v2", "deepseek_v3", "deepseek_v4" */
const char *di_model_dir(const di_model *m);
/* Default EOS ids (generation_config.json, else config.json). Returns the count; fills up to cap. */
int di_model_eos_ids(const di_model *m, int32_t *ids, int cap);

/* Runs the whole sequence `ids[0..n)` through the model from an empty cache and writes the logits
 * at every position to `logits` (row-major [n][vocab_size], float32). DeepSeek-V4: one chunk (its
 * logits depend on the chunking; this equals the uncached reference forward). */
di_status di_model_score(di_model *m, const int32_t *ids, int n, float *logits);

/* Log-likelihood of the continuation ids[start..n) given the context ids[0..start), as
 * lm-evaluation-harness scores answers: *logprob = sum over t in [start, n) of log p(ids[t] | ids[<t])
 * (log-softmax over the whole vocabulary, summed in double), *is_greedy (may be NULL) = 1 when every
 * continuation token is the argmax of its row (ties: the lowest id, as greedy sampling), else 0.
 * Needs 1 <= start < n <= max context and ids in [0, vocab). One pass from an empty cache; only the
 * rows [start-1, n-1) get logits, a bounded number per forward call. Like di_model_score it reuses
 * the backend's KV pool: not while an engine of this model exists (free the engine first). */
di_status di_model_loglikelihood(di_model *m, const int32_t *ids, int n, int start, float *logprob, int *is_greedy);
/* The same for n_seqs sequences (ids[i], n[i], start[i]) -> logprob[i], is_greedy[i] (may be NULL):
 * short sequences share forward calls (each its own rows of the batch, up to 2048 fed tokens per call),
 * so many small requests (multiple-choice items) run much faster than one call each. Results equal
 * di_model_loglikelihood's on a batch-invariant backend (the CPU's). Errors name the sequence. */
di_status di_model_loglikelihood_batch(di_model *m, int n_seqs, const int32_t *const *ids, const int *n, const int *start,
                                       float *logprob, int *is_greedy);

/* ============================================================================================ */
/* Engine: continuous batching over a paged KV cache (see docs/NOTES.md, "Engine")               */
/* ============================================================================================ */
typedef struct di_engine di_engine;

typedef struct di_engine_options {
  int max_num_seqs;              /* sequences running at once (default 256) */
  int max_num_batched_tokens;    /* tokens per step (default 2048) */
  int max_model_len;             /* longest prompt + output; <= 0: the model's context */
  int enable_prefix_caching;     /* share cached full blocks between requests (default 1) */
  int enable_chunked_prefill;    /* split long prompts across steps (default 1) */
  int async_scheduling;          /* prepare step n+1 while step n runs (default 1) */
  /* KV pool budget; <= 0 (the default): on a device backend (CUDA), what gpu_memory_utilization
   * leaves after the weights and the largest step's buffers; on the CPU a fixed 1 GiB */
  int64_t kv_cache_memory_bytes;
  int64_t num_kv_blocks;         /* > 0: exactly this many blocks (overrides the budget) */
  uint64_t seed;                 /* seeds the seeds drawn for unseeded requests (0: from the clock) */
  /* vLLM's --gpu-memory-utilization: the share of the device's total memory the engine may use for
   * everything (weights, step buffers, KV cache); <= 0: the default 0.9. Device backends only. */
  float gpu_memory_utilization;
  /* DeepSeek-V4: a cached prefix keeps only its compressed entries and indexer keys (no sliding-window
   * rows, no compressor snapshots); a prefix hit recomputes the prefix's last sliding_window - 1
   * tokens to rebuild the window. Less memory per cached prefix, approximate logits after a hit
   * (docs/PERFORMANCE.md). No effect on models without a sliding window. Default 0: exact caching. */
  int swa_bounded_replay;
} di_engine_options;

/* One line on how the engine sized its KV cache ("KV cache: 5,213 blocks of 64 tokens (12.1 GiB):
 * gpu_memory_utilization 0.90 of 139.8 GiB, 31.2 GiB in use before it"), for startup logs. */
const char *di_engine_kv_summary(const di_engine *e);

void di_engine_options_default(di_engine_options *opt);

typedef enum di_finish_reason {
  DI_FINISH_NONE = 0,   /* still running */
  DI_FINISH_STOP,       /* a stop token or stop string (or the grammar ended) */
  DI_FINISH_LENGTH,     /* max_tokens, or the model's context filled */
  DI_FINISH_ABORT,      /* di_engine_abort */
  DI_FINISH_ERROR       /* this request failed; see di_seq_output.error */
} di_finish_reason;
const char *di_finish_reason_str(di_finish_reason r); /* "stop", "length", "abort", "error", "" */

/* di_request_params.max_whitespace's bound (whitespace slots are counted repetitions) */
#define DI_MAX_WHITESPACE 64
/* di_request_params.indent's bound (spaces per nesting level) */
#define DI_MAX_INDENT 16

/* One request. Everything is copied by di_engine_add_request. Zero values mean "unset" where
 * noted; use di_request_params_default. */
typedef struct di_request_params {
  /* prompt: token ids, or a text encoded with the model's tokenizer (BOS per its config) */
  const int32_t *prompt_ids;
  int n_prompt_ids;
  const char *prompt;
  int prompt_is_rendered;        /* the text prompt is a rendered chat template (holds its own BOS):
                                    encoded without adding special tokens */
  /* sampling */
  int n;                         /* samples of this prompt (default 1); they share its KV blocks */
  float temperature;             /* <= 0: greedy (default 1) */
  float top_p;                   /* (0, 1]; 1: off */
  int top_k;                     /* <= 0: off */
  float min_p;                   /* [0, 1]; 0: off */
  float repetition_penalty;      /* 1: off; > 1 discourages tokens of the prompt and output */
  float presence_penalty;        /* 0: off; output tokens only */
  float frequency_penalty;       /* 0: off; output tokens only */
  const int32_t *logit_bias_ids; /* added to the logits before everything else */
  const float *logit_bias_values;
  int n_logit_bias;
  int has_seed;                  /* 0: a seed is drawn at admission */
  uint64_t seed;
  int logprobs;                  /* < 0: none; k >= 0: logprob of the chosen token + top k */
  int prompt_logprobs;           /* < 0: none (default); k in [0, 20]: for every prompt token after the
                                    first, log p(token | the tokens before it) and the top k ids, as
                                    vLLM computes them: log-softmax of the raw logits (no temperature,
                                    penalties or bias). Such a request takes no prefix-cache hits for
                                    the prompt (its rows are recomputed). Delivered once, in sample 0's
                                    first output (di_seq_output.prompt_logprobs). */
  int prompt_logprobs_from;      /* with prompt_logprobs >= 0: the first prompt index reported (default 0:
                                    all). Tokens before it get NaN (rank 0), and the prompt up to it may
                                    come from the prefix cache: scoring continuations of one context
                                    (multiple choice) computes the context once. In [0, prompt length]:
                                    di_engine_add_request refuses a value past the prompt. */
  /* stopping */
  int max_tokens;                /* new tokens at most (default 16). 0: up to the context, except with
                                    prompt_logprobs >= 0, where 0 means none: the request only scores
                                    its prompt and finishes after it (DI_FINISH_LENGTH, no token) */
  int min_tokens;                /* stop tokens banned until this many tokens were generated */
  const int32_t *stop_token_ids; /* extra stop tokens (the model's EOS ids stop unless ignore_eos) */
  int n_stop_token_ids;
  const char *const *stop;       /* stop strings (not included in the returned text) */
  int n_stop;
  int ignore_eos;
  int include_stop_str_in_output;
  int skip_special_tokens;       /* in the returned text (default 1) */
  /* structured outputs (vLLM's structured_outputs): at most one of these */
  const char *json_schema;       /* JSON Schema text */
  const char *regex;
  const char *grammar;           /* a grammar in `grammar_syntax` */
  int json_object;               /* any JSON object */
  int grammar_syntax;            /* grammar: 0 = GBNF (llama.cpp's EBNF), 1 = Lark (llguidance's) */
  int json_strict;               /* json_schema / json_object: XGrammar's strict mode (an object schema
                                    without additionalProperties admits no other properties); the
                                    server sets it for response_format json_schema strict: true */
  int max_digits;                /* JSON: digits of numbers the schema leaves unbounded (0 = default
                                    16, -1 = unbounded); docs/structured-outputs.md */
  int max_string_length;         /* JSON: characters of strings without maxLength, pattern and format
                                    strings and keys included (0 = default 4,096, -1 = unbounded) */
  const char *item_separator;    /* JSON: exactly this between array items and object members: ","
                                    with JSON whitespace around it, at most 7 bytes (NULL or "" =
                                    ","); with key_separator, XGrammar's `separators` (", " / ": "
                                    is its any_whitespace=False text) */
  const char *key_separator;     /* JSON: exactly this between a key and its value (":" with JSON
                                    whitespace; NULL or "" = ":") */
  int max_whitespace;            /* JSON: whitespace characters allowed in each gap beside the
                                    separators (0 = none, the default; at most DI_MAX_WHITESPACE) */
  int indent;                    /* JSON Schema: XGrammar's `indent` layout, 1..DI_MAX_INDENT spaces
                                    per nesting level (0 = one line, the default); separators then
                                    "," / ": " unless given; needs max_whitespace 0;
                                    docs/structured-outputs.md */
} di_request_params;

void di_request_params_default(di_request_params *p);

typedef struct di_token_logprob {
  int32_t id;
  float logprob;
} di_token_logprob;

/* What one step did for one sample of one request. */
typedef struct di_seq_output {
  uint64_t req_id;
  int sample_index;              /* 0..n-1 */
  int n_new_tokens;
  const int32_t *new_tokens;
  const char *new_text;          /* new text (NUL-terminated; "" without a tokenizer) */
  size_t new_text_len;
  const float *new_logprobs;     /* [n_new_tokens] when logprobs >= 0, else NULL */
  int n_top;                     /* top alternatives per token */
  const di_token_logprob *top;   /* [n_new_tokens][n_top] */
  di_finish_reason finish_reason; /* != DI_FINISH_NONE: this sample is done */
  const char *error;             /* message when finish_reason == DI_FINISH_ERROR, else NULL */
  int32_t stop_token;            /* the stop token it ended on, or -1 */
  int n_prompt_tokens;
  int n_cached_tokens;           /* prompt tokens found in the prefix cache */
  int n_output_tokens;           /* generated so far */
  const int32_t *prompt_token_ids; /* [n_prompt_tokens] (text prompts: as encoded) */
  double time_to_first_token;    /* seconds from add to first token (-1 before it) */
  double time_per_output_token;  /* mean seconds between later tokens (set when finished) */
  /* prompt_logprobs >= 0: set in sample 0's first output (the step that completes the prompt), else
   * NULL. [n_prompt_tokens]: entry i is log p(prompt[i] | prompt[<i]); entry 0 is NaN. */
  const float *prompt_logprobs;
  int n_prompt_top;              /* top alternatives per prompt token (the request's prompt_logprobs) */
  const di_token_logprob *prompt_top; /* [n_prompt_tokens][n_prompt_top], best first (ties: lower id);
                                         row 0 is id -1, NaN; NULL when n_prompt_top is 0 */
  const int32_t *prompt_ranks;   /* [n_prompt_tokens]: 1 + the number of ids whose logit is larger than
                                    the prompt token's (vLLM's rank); entry 0 is 0 */
} di_seq_output;

typedef struct di_step_output {
  int n;
  const di_seq_output *seqs;
} di_step_output;

typedef struct di_engine_stats {
  int64_t kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached;
  double prefix_cache_hit_rate;  /* hit tokens / queried prompt tokens */
  int64_t prefix_cache_hit_tokens, prefix_cache_query_tokens;
  int n_running, n_waiting;
  int64_t steps, prompt_tokens, generated_tokens, preemptions;
  double prompt_tokens_per_s, generation_tokens_per_s; /* over the engine's busy time */
  double host_time_s;            /* host-side scheduling + sampling time, total */
  double hidden_host_time_s;     /* of it, spent while the backend was computing */
  double backend_wait_s;         /* time blocked in the backend's wait */
  /* admissions put off because another running request was computing the prompt block that would
   * extend the request's prefix-cache hit (counted per step the request waited) */
  int64_t prefix_waits;
} di_engine_stats;

/* Creates an engine over a loaded model (which must outlive it; one engine per model at a time:
 * the backend's KV pool is sized here). `opt` may be NULL. An engine is not thread-safe: call its
 * functions from one thread at a time (the server runs it on one engine thread). */
di_status di_engine_create(di_model *m, const di_engine_options *opt, di_engine **out);
void di_engine_free(di_engine *e);
/* Queues a request. Invalid parameters are an error returned here (nothing queued); a prompt that
 * cannot fit the context is queued and finishes at once with DI_FINISH_ERROR. */
di_status di_engine_add_request(di_engine *e, const di_request_params *p, uint64_t *req_id);
/* Runs one scheduling step. *out (owned by the engine, valid until the next step/free) lists the
 * samples that produced tokens or finished. Per-request failures are reported there; a status
 * other than DI_OK means the engine itself failed (backend error). */
di_status di_engine_step(di_engine *e, di_step_output **out);
/* Aborts a request (all its samples); reported as DI_FINISH_ABORT by the next step. Unknown or
 * finished ids: DI_ERR_NOT_FOUND. */
di_status di_engine_abort(di_engine *e, uint64_t req_id);
/* 1 while any request is queued, running or has output not yet reported, or a step is still in
 * flight (stepping until 0 returns every KV block). */
int di_engine_has_unfinished(const di_engine *e);
void di_engine_get_stats(const di_engine *e, di_engine_stats *s);
/* Verifies the KV block accounting (no leaked or double-freed block). */
di_status di_engine_check(const di_engine *e);

/* Speculative decoding with the model's MTP layer (DeepSeek-V3 num_nextn_predict_layers >= 1; CPU
 * backend). Off by default; call before the first request. num_tokens: the longest draft (0 turns it
 * off, at most 5). A sequence's draft stops at the first token whose cumulative confidence (product
 * of the MTP layer's softmax probabilities of the drafted tokens) is below min_confidence (in [0, 1]).
 * Lossless: every verified row is sampled exactly as plain decoding samples it and a draft token is
 * accepted only if it equals that sample, so outputs are identical with and without it (greedy and
 * seeded sampling). Turns async scheduling off. Structured-output requests decode without drafts. */
di_status di_engine_set_speculative(di_engine *e, int num_tokens, float min_confidence);
typedef struct di_spec_stats {
  int num_tokens;                /* 0: off */
  int64_t verify_steps;          /* sequence-steps that verified at least one draft token */
  int64_t drafted_tokens;        /* draft tokens verified */
  int64_t accepted_tokens;       /* of them, accepted */
  int64_t drafted_at[5];         /* per draft position: verified ... */
  int64_t accepted_at[5];        /* ... and accepted */
  double acceptance_rate;        /* accepted / drafted */
  double mean_accepted_length;   /* tokens per verify step: 1 + accepted / verify_steps */
  int method;                    /* 0: mtp, 1: dspark */
  /* DSpark's confidence head, calibration over verified drafts in DI_SPEC_CALIB_BINS equal bins of
   * predicted (per-position) acceptance: drafts, summed predictions, accepted; and the expected
   * calibration error sum_b |accepted_b - predicted_b| / drafts */
  int64_t calib_count[10];
  double calib_predicted[10];
  int64_t calib_accepted[10];
  double calibration_error;
  /* DSpark on CUDA: steps that proposed the next drafts inside themselves (the step's CUDA graph,
   * DEEPINFER_DSPARK_GRAPH_PROPOSE), and blocks of those whose device-found anchor the host's
   * verification did not confirm (their drafts dropped; expected 0) */
  int64_t proposals_in_step;
  int64_t proposals_missed;
} di_spec_stats;
#define DI_SPEC_CALIB_BINS 10
void di_engine_get_spec_stats(const di_engine *e, di_spec_stats *s);
/* Speculative decoding from vLLM's --speculative-config JSON, for the engine over model m:
 *   {"method": "mtp" | "dspark", "num_speculative_tokens": 0..5 (default 5 for dspark),
 *    "min_confidence": 0..1 (mtp: the draft cut, default 0.3), "acceptance": "rejection" | "exact",
 *    "schedule": "confidence" | "fixed", "model": "<drafter folder>"}.
 * dspark: a DSpark block drafter (DeepSpec's checkpoint layout; default folder <model>/dspark),
 * CPU backend; acceptance "rejection" (default) verifies drafts by speculative sampling (accept with
 * min(1, p/q), else sample the normalised residual), lossless in distribution at any temperature and
 * identical to plain decoding for greedy requests; "exact" accepts a draft only when it equals the
 * plain sample (then seeded output equals plain decoding's whatever the schedule). schedule
 * "confidence" (default) verifies the drafts whose predicted survival pays for their step time.
 * mtp: as di_engine_set_speculative (acceptance "exact" only). Call before the first request.
 * With e and m both NULL it only checks the JSON (a front end's flag parsing). */
di_status di_engine_set_speculative_config(di_engine *e, di_model *m, const char *json);
/* sizeof of a public struct by name ("di_request_params", ...), 0 if unknown: lets bindings
 * (the ctypes package) verify their mirror of the layout. */
size_t di_abi_sizeof(const char *struct_name);

/* ============================================================================================ */
/* Chat templates                                                                                */
/* ============================================================================================ */
/* A model folder's Jinja chat template (chat_template.jinja, else tokenizer_config.json's
 * "chat_template"), rendered exactly as transformers' apply_chat_template renders it. */
typedef struct di_chat_template di_chat_template;

di_status di_chat_template_load(const char *dir, di_chat_template **out);
void di_chat_template_free(di_chat_template *t);
/* conversation_json: a JSON array of messages ({"role", "content", ...}; tool_calls etc. pass
 * through), or an object {"messages": [...], "tools": [...], "documents": [...],
 * "add_generation_prompt": bool, ...} whose other keys become extra template variables.
 * add_generation_prompt: 1 or 0, or -1 to take the object's key (default true). *out is
 * NUL-terminated; free it with di_string_free. */
di_status di_chat_template_render_json(const di_chat_template *t, const char *conversation_json,
                                       int add_generation_prompt, char **out);
/* Pins the clock a template reads: strftime_now() then formats this instant (Unix seconds) in UTC
 * instead of the local time of the call, so a render that shows "today" is reproducible (tests,
 * goldens). Without it, as in transformers, the real local clock is read at each render. */
void di_chat_template_pin_clock(di_chat_template *t, int64_t unix_seconds);
/* Frees a string the library returned to the caller. NULL: no-op. */
void di_string_free(char *s);

/* ============================================================================================ */
/* Tokenizer                                                                                     */
/* ============================================================================================ */
/* Hugging Face tokenizer.json (BPE: byte-level or SentencePiece-style with byte fallback), encoding
 * and decoding exactly as the Hugging Face `tokenizers` library does. A loaded tokenizer may be used
 * from several threads at once (its only mutable state, a word cache, is locked). */
typedef struct di_tokenizer di_tokenizer;

/* `path` is a folder (tokenizer.json + optional tokenizer_config.json; a model folder works) or a
 * tokenizer.json file. */
di_status di_tokenizer_load(const char *path, di_tokenizer **out);
void di_tokenizer_free(di_tokenizer *t);
/* HF encode(text, add_special_tokens). *ids is malloc'd: free() it. Invalid UTF-8: each maximal
 * invalid byte sequence reads as U+FFFD (Python's bytes.decode("utf-8", "replace")). */
di_status di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, int add_special_tokens,
                              int32_t **ids, size_t *n_ids);
/* HF decode(ids, skip_special_tokens), plus transformers' clean-up of tokenization spaces when
 * tokenizer_config.json sets clean_up_tokenization_spaces. *text is malloc'd, NUL-terminated. */
di_status di_tokenizer_decode(const di_tokenizer *t, const int32_t *ids, size_t n, int skip_special_tokens,
                              char **text, size_t *len);
int di_tokenizer_vocab_size(const di_tokenizer *t); /* max id + 1 over the vocab and added tokens */
/* The bytes token `id` contributes to generated text (NULL and *len = 0 for an unused id); valid
 * while t lives. */
const char *di_tokenizer_token_bytes(const di_tokenizer *t, int32_t id, size_t *len);
int di_tokenizer_is_special(const di_tokenizer *t, int32_t id);
int32_t di_tokenizer_token_to_id(const di_tokenizer *t, const char *token); /* -1 if none */
/* tokenizer_config.json facts: BOS/EOS ids (-1 if none) and strings (NULL if none), add_bos_token. */
int32_t di_tokenizer_bos_id(const di_tokenizer *t);
int32_t di_tokenizer_eos_id(const di_tokenizer *t);
int di_tokenizer_add_bos(const di_tokenizer *t);
const char *di_tokenizer_bos_token(const di_tokenizer *t);
const char *di_tokenizer_eos_token(const di_tokenizer *t);
/* Ids of a raw text prompt: encode without special tokens, then BOS as add_bos_token says. */
di_status di_tokenizer_encode_prompt(const di_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n);

/* Streaming detokenizer: push generated ids one at a time; each call returns the newly completed
 * text (never a split UTF-8 character, never repeated). All outputs + flush == the full decode. */
typedef struct di_detok_stream di_detok_stream;
di_status di_detok_stream_create(const di_tokenizer *t, int skip_special_tokens, di_detok_stream **out);
/* *text (owned by the stream, valid until its next call) and *len: the new text, possibly empty. */
di_status di_detok_stream_push(di_detok_stream *s, int32_t id, const char **text, size_t *len);
/* The rest (an incomplete character at the end comes out as U+FFFD); the stream starts afresh. */
di_status di_detok_stream_flush(di_detok_stream *s, const char **text, size_t *len);
void di_detok_stream_free(di_detok_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* DEEPINFER_H */
