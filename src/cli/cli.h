/* The `deepinfer` command-line tool: one file per subcommand (cmd_<name>.c), registered in the
 * table in main.c. Each command parses its own flags and prints its own --help. */
#ifndef DI_CLI_H
#define DI_CLI_H
#include <stdint.h>
#include <stdio.h>
#include "deepinfer.h"

typedef struct di_cli_command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv); /* argv[0] is the command name; returns the exit code */
} di_cli_command;

/* The subcommands (one file each). */
int di_cmd_score(int argc, char **argv);
int di_cmd_switches(int argc, char **argv);

/* Flag helpers shared by the commands: `--name value` and `--name=value` forms. */
/* If argv[*i] is `--name` (or `--name=v`), stores the value, advances *i and returns 1. A missing
 * value prints an error and sets *err. */
int di_cli_flag_value(int argc, char **argv, int *i, const char *name, const char **value, int *err);
int di_cli_is_help(const char *arg);
/* Parses an integer flag value in [lo, hi]; on failure prints "deepinfer CMD: FLAG: ..." and returns 0. */
int di_cli_parse_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out);
/* Parses a sampling flag's number (--temperature, --top-p, --top-k, --min-p, --*-penalty,
 * --min-tokens, --n) and checks it against the range the server applies to the same field
 * (sampler/sampling_ranges.h); on failure prints "deepinfer CMD: FLAG: must be in [lo, hi], got v"
 * (the server's words) and returns 0. */
int di_cli_parse_sampling(const char *cmd, const char *flag, const char *v, double *out);
/* The engine flags `generate` and `serve` share, with vLLM's names: --max-model-len, --max-num-seqs,
 * --max-num-batched-tokens, --kv-cache-memory, --num-kv-blocks, --gpu-memory-utilization,
 * --[no-]enable-prefix-caching,
 * --no-chunked-prefill, --no-async-scheduling. If argv[*i] is one, applies it to *eo (advancing *i past
 * its value) and returns 1; returns 0 for any other argument and -1 (message printed) for a bad value. */
int di_cli_engine_flag(const char *cmd, int argc, char **argv, int *i, di_engine_options *eo);
/* Parses "1,2,3" (ids separated by commas and/or spaces) into a malloc'd array; returns the count, or
 * -1 for a malformed list (with the byte offset of the bad id in *bad_offset when non-NULL). */
int di_cli_parse_ids(const char *s, int32_t **ids, size_t *bad_offset);
/* Reads all of `f` into a malloc'd buffer with a NUL after the data (the data may hold NULs too).
 * NULL on out-of-memory. */
char *di_cli_read_all(FILE *f, size_t *len);
/* 1 if model_dir is a model folder (it has config.json) without a tokenizer.json: text prompts and
 * text output need one. 0 otherwise (a missing folder is left for the loader to report). */
int di_cli_lacks_tokenizer(const char *model_dir);
/* Default model folder: --model, else $DEEPINFER_HF_MODEL_DIR, else the shipped default model. */
const char *di_cli_default_model_dir(void);
#endif
