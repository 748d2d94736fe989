/* `deepinfer chat-template`: renders a conversation with a model folder's chat template and
 * prints exactly the rendered text (no newline added), as transformers' apply_chat_template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "chat/chat_template.h"
#include "cli.h"
#include "util/json.h"

int di_cmd_chat_template(int argc, char **argv);

static void help(FILE *f) {
  fprintf(f,
          "usage: deepinfer chat-template [--tokenizer DIR] --messages FILE.json [--no-generation-prompt]\n"
          "\n"
          "Renders the chat template of DIR (chat_template.jinja, else \"chat_template\" in\n"
          "tokenizer_config.json) and prints exactly the rendered text, with no newline added.\n"
          "\n"
          "  --tokenizer DIR          tokenizer or model folder (default: --model, $DEEPINFER_HF_MODEL_DIR)\n"
          "  --model DIR              the same\n"
          "  --messages FILE          a JSON array of messages, or an object with \"messages\", optional\n"
          "                           \"tools\", \"documents\" and \"add_generation_prompt\"; its other keys become extra\n"
          "                           template variables (e.g. \"enable_thinking\": false). \"-\": stdin\n"
          "  --no-generation-prompt   do not end with the assistant header (add_generation_prompt=false)\n");
}


int di_cmd_chat_template(int argc, char **argv) {
  const char *dir = NULL, *msgs = NULL;
  int no_gen = 0, err = 0;
  for (int i = 1; i < argc; i++) {
    if (di_cli_is_help(argv[i])) {
      help(stdout);
      return 0;
    }
    if (di_cli_flag_value(argc, argv, &i, "--tokenizer", &dir, &err) ||
        di_cli_flag_value(argc, argv, &i, "--model", &dir, &err) ||
        di_cli_flag_value(argc, argv, &i, "--messages", &msgs, &err)) {
      if (err) return 2;
      continue;
    }
    if (strcmp(argv[i], "--no-generation-prompt") == 0) {
      no_gen = 1;
      continue;
    }
    fprintf(stderr, "deepinfer chat-template: unknown option '%s'\n\n", argv[i]);
    help(stderr);
    return 2;
  }
  if (!msgs) {
    fprintf(stderr, "deepinfer chat-template: --messages FILE is required\n\n");
    help(stderr);
    return 2;
  }
  if (!dir) dir = di_cli_default_model_dir();
  char *text = NULL;
  size_t n = 0;
  if (strcmp(msgs, "-") == 0) {
    text = di_cli_read_all(stdin, &n);
    if (!text) {
      fprintf(stderr, "deepinfer chat-template: cannot read stdin\n");
      return 1;
    }
  } else if (di_read_file(msgs, &text, &n) != DI_OK) {
    fprintf(stderr, "deepinfer chat-template: %s\n", di_last_error());
    return 1;
  }
  di_chat_template *t = NULL;
  di_status st = di_chat_template_load(dir, &t);
  char *out = NULL;
  if (st == DI_OK) st = di_chat_template_render_json(t, text, no_gen ? 0 : -1, &out);
  free(text);
  di_chat_template_free(t);
  if (st != DI_OK) {
    fprintf(stderr, "deepinfer chat-template: %s\n", di_last_error());
    return 1;
  }
  size_t len = strlen(out);
  int ok = fwrite(out, 1, len, stdout) == len && fflush(stdout) == 0;
  di_string_free(out);
  return ok ? 0 : 1;
}
