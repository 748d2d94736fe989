/* The `deepinfer` command-line tool: one file per subcommand (cmd_<name>.c), registered in the
 * table in main.c. Each command parses its own flags and prints its own --help. */
#ifndef DI_CLI_H
#define DI_CLI_H
#include <stdio.h>

typedef struct di_cli_command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv); /* argv[0] is the command name; returns the exit code */
} di_cli_command;

/* The subcommands (one file each). */
int di_cmd_score(int argc, char **argv);

/* Flag helpers shared by the commands: `--name value` and `--name=value` forms. */
/* If argv[*i] is `--name` (or `--name=v`), stores the value, advances *i and returns 1. A missing
 * value prints an error and sets *err. */
int di_cli_flag_value(int argc, char **argv, int *i, const char *name, const char **value, int *err);
int di_cli_is_help(const char *arg);
/* Default model folder: --model, else $DEEPINFER_HF_MODEL_DIR, else the shipped default model. */
const char *di_cli_default_model_dir(void);
#endif
