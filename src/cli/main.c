/* Entry point of the `deepinfer` CLI: dispatches to the subcommands in the table below. */
#include "cli.h"
#include "dist/dist.h"
#include <string.h>

int di_cmd_score(int argc, char **argv);
int di_cmd_perplexity(int argc, char **argv);
int di_cmd_generate(int argc, char **argv);
int di_cmd_tokenize(int argc, char **argv);
int di_cmd_detokenize(int argc, char **argv);
int di_cmd_grammar(int argc, char **argv);
int di_cmd_chat_template(int argc, char **argv);
int di_cmd_serve(int argc, char **argv);
int di_cmd_switches(int argc, char **argv);

static const di_cli_command COMMANDS[] = {
    {"score", "write the logits of a token sequence to a safetensors file", di_cmd_score},
    {"generate", "generate a continuation of a prompt", di_cmd_generate},
    {"perplexity", "perplexity of the model on a text file", di_cmd_perplexity},
    {"tokenize", "text on stdin to token ids (JSON), as Hugging Face tokenizers", di_cmd_tokenize},
    {"detokenize", "token ids (JSON) on stdin to text, as Hugging Face tokenizers", di_cmd_detokenize},
    {"grammar", "compile a grammar (regex, JSON schema, EBNF) and check stdin against it", di_cmd_grammar},
    {"chat-template", "render a conversation with a model's chat template", di_cmd_chat_template},
    {"serve", "serve the OpenAI API over HTTP (completions, chat, streaming)", di_cmd_serve},
    {"switches", "list the environment switches (DEEPINFER_*) with defaults and meanings", di_cmd_switches},
};

static void usage(FILE *f) {
  fprintf(f, "usage: deepinfer <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
    fprintf(f, "  %-16s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
  fprintf(f, "\n`deepinfer <command> --help` describes each command.\n"
             "Several ranks (`mpirun -np N deepinfer <command> ...`; any command): --enable-expert-parallel,\n"
             "--enable-eplb, --eplb-config JSON, --dist-timeout SECONDS (docs/multi-gpu.md); serve and generate\n"
             "also start N ranks themselves: --data-parallel-size N.\n"
             "Environment: DEEPINFER_HF_MODEL_DIR (default model folder), DEEPINFER_ACCELERATOR (cpu, cuda);\n"
             "`deepinfer switches` lists every switch (docs/switches.md).\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || di_cli_is_help(argv[1])) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
    if (strcmp(argv[1], COMMANDS[i].name) == 0) {
      int rc = di_dist_cli_setup(&argc, argv); /* the distributed flags (dist/dist.h); MPI under mpirun */
      return rc ? rc : di_dist_cli_finish(COMMANDS[i].run(argc - 1, argv + 1));
    }
  fprintf(stderr, "deepinfer: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
