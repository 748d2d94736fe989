/* Substring lexemes (substring.c): llguidance's Lark `%regex {"substring_words": TEXT}`,
 * `{"substring_chars": TEXT}` and `{"substring_chunks": [CHUNKS]}`: a contiguous piece of a given
 * text that starts and ends at a word / character / chunk boundary, or nothing. */
#ifndef DI_GRAMMAR_SUBSTRING_H
#define DI_GRAMMAR_SUBSTRING_H
#include <stddef.h>
#include "grammar/gram_ir.h"

/* The rule for the JSON object `spec` (len bytes) as above; errors name the problem. */
di_status di_substring_compile(di_gb *b, const char *spec, size_t len, int *rule);
#endif
