/* The accepted range of every sampling parameter, in one table that every surface checks against:
 * the server's JSON fields (src/server/openai.c), the CLI's flags (src/cli/cmd_generate.c) and the
 * engine itself (di_engine_add_request, which the Python binding reaches). One table means the same
 * values are accepted everywhere and refused with the same words. */
#ifndef DI_SAMPLING_RANGES_H
#define DI_SAMPLING_RANGES_H
#include <stddef.h>

typedef struct di_sampling_range {
  const char *name; /* the OpenAI / vLLM field name ("temperature"); the CLI flag is --name with '-' */
  double lo, hi;    /* inclusive */
  int integer;      /* the value must be an integer */
} di_sampling_range;

/* The range of `name`, or NULL if it is not a sampling parameter of the table. */
const di_sampling_range *di_sampling_range_find(const char *name);
/* 1 if v is accepted; else 0 and msg gets "must be in [lo, hi], got v" (or "must be an integer"),
 * the words both the server ("'temperature' must be ...") and the CLI ("--temperature: must be ...")
 * print after their own name of the parameter. */
int di_sampling_range_check(const di_sampling_range *r, double v, char *msg, size_t msg_size);

#endif
