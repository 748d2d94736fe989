/* Reasoning in a DeepSeek-R1-style reply (vLLM's `--reasoning-parser deepseek_r1`): the reply is
 * "[<think>]REASONING</think>CONTENT"; R1's chat template opens the <think> itself, so the reply
 * usually starts inside it. No </think> at all: everything is reasoning. */
#ifndef DI_SERVER_REASONING_H
#define DI_SERVER_REASONING_H
#include <stddef.h>

typedef struct di_reasoning_split {
  size_t r_begin, r_end;     /* reasoning: text[r_begin..r_end) */
  size_t c_begin;            /* content: text[c_begin..len) (c_begin == len: none yet) */
  int ended;                 /* </think> was seen */
} di_reasoning_split;

/* Splits text[0..len). With final = 0 (more text may come) a tail that could be the start of a
 * marker is held back (neither reasoning nor content yet). */
void di_reasoning_split_text(const char *text, size_t len, int final, di_reasoning_split *out);
#endif
