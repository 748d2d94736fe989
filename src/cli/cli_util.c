/* Flag parsing helpers shared by the subcommands (see cli.h). */
#include "cli.h"
#include "sampler/sampling_ranges.h"
#include <stdio.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/switches.h"

int di_cli_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

int di_cli_parse_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    fprintf(stderr, "deepinfer %s: %s: \"%s\" is not an integer in [%lld, %lld]\n", cmd, flag, v, lo, hi);
    return 0;
  }
  *out = x;
  return 1;
}

int di_cli_parse_sampling(const char *cmd, const char *flag, const char *v, double *out) {
  char key[64]; /* --top-p -> top_p, the table's (and the server's) name */
  snprintf(key, sizeof key, "%s", flag[0] == '-' && flag[1] == '-' ? flag + 2 : flag);
  for (char *c = key; *c; c++)
    if (*c == '-') *c = '_';
  const di_sampling_range *r = di_sampling_range_find(key);
  char *end, msg[160];
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end) {
    fprintf(stderr, "deepinfer %s: %s: \"%s\" is not a number\n", cmd, flag, v);
    return 0;
  }
  if (r && !di_sampling_range_check(r, x, msg, sizeof msg)) {
    fprintf(stderr, "deepinfer %s: %s: %s\n", cmd, flag, msg);
    return 0;
  }
  *out = x;
  return 1;
}

int di_cli_engine_flag(const char *cmd, int argc, char **argv, int *i, di_engine_options *eo) {
  const char *a = argv[*i], *v = NULL;
  int err = 0;
  long long x;
  if (!strcmp(a, "--enable-prefix-caching"))
    eo->enable_prefix_caching = 1;
  else if (!strcmp(a, "--no-enable-prefix-caching"))
    eo->enable_prefix_caching = 0;
  else if (!strcmp(a, "--no-chunked-prefill"))
    eo->enable_chunked_prefill = 0;
  else if (!strcmp(a, "--no-async-scheduling"))
    eo->async_scheduling = 0;
#define INT_FLAG(name, lo, hi, field, type)                                     \
  else if (di_cli_flag_value(argc, argv, i, name, &v, &err)) {                  \
    if (err || !di_cli_parse_int(cmd, name, v, lo, hi, &x))                     \
      return -1;                                                                \
    eo->field = (type)x;                                                        \
  }
  INT_FLAG("--max-model-len", 1, INT32_MAX, max_model_len, int)
  INT_FLAG("--max-num-seqs", 1, 1 << 20, max_num_seqs, int)
  INT_FLAG("--max-num-batched-tokens", 1, INT32_MAX, max_num_batched_tokens, int)
  INT_FLAG("--kv-cache-memory", 1, INT64_MAX, kv_cache_memory_bytes, int64_t)
  INT_FLAG("--num-kv-blocks", 1, INT32_MAX, num_kv_blocks, int64_t)
#undef INT_FLAG
  else if (di_cli_flag_value(argc, argv, i, "--gpu-memory-utilization", &v, &err)) {
    char *end;
    errno = 0;
    double u = err ? 0 : strtod(v, &end);
    if (err || errno || end == v || *end || !(u > 0 && u <= 1)) {
      if (!err) fprintf(stderr, "deepinfer %s: --gpu-memory-utilization: must be in (0, 1], got \"%s\"\n", cmd, v);
      return -1;
    }
    eo->gpu_memory_utilization = (float)u;
  } else
    return 0;
  return 1;
}

int di_cli_parse_ids(const char *s, int32_t **ids, size_t *bad_offset) {
  int cap = 16, k = 0;
  int32_t *a = malloc((size_t)cap * sizeof *a);
  const char *p = s;
  while (a && *p) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (errno || end == p || x < 0 || x > INT32_MAX) {
      if (bad_offset)
        *bad_offset = (size_t)(p - s);
      free(a);
      return -1;
    }
    if (k == cap) {
      int32_t *b = realloc(a, (size_t)(cap *= 2) * sizeof *b);
      if (!b) {
        free(a);
        return -1;
      }
      a = b;
    }
    a[k++] = (int32_t)x;
    p = end;
    while (*p == ',' || *p == ' ')
      p++;
  }
  if (!a)
    return -1;
  *ids = a;
  return k;
}

char *di_cli_read_all(FILE *f, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf)
    return NULL;
  for (;;) {
    if (n + 1 >= cap) {
      char *q = realloc(buf, cap *= 2);
      if (!q) {
        free(buf);
        return NULL;
      }
      buf = q;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0)
      break;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

int di_cli_flag_value(int argc, char **argv, int *i, const char *name, const char **value, int *err) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0)
    return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != 0)
    return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "deepinfer: %s needs a value\n", name);
    *err = 1;
    return 1;
  }
  *value = argv[++*i];
  return 1;
}

int di_cli_lacks_tokenizer(const char *model_dir) {
  char cfg[4200], tok[4200];
  snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);
  snprintf(tok, sizeof tok, "%s/tokenizer.json", model_dir);
  return access(cfg, R_OK) == 0 && access(tok, R_OK) != 0;
}

const char *di_cli_default_model_dir(void) {
  const char *env = di_switch_get(DI_SW_HF_MODEL_DIR);
  if (env)
    return env;
  /* the shipped model: next to the executable's source tree, or installed share dir */
  static char path[4096];
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      const char *cands[] = {"%s/../models/default", "%s/../../models/default", "%s/../share/deepinfer/models/default"};
      for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, cands[k], exe);
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (access(cfg, R_OK) == 0)
          return path;
      }
    }
  }
  return "models/default";
}
