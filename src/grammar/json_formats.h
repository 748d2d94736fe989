/* JSON Schema `format` regexes (json_formats.c), used by the JSON Schema front-end. */
#ifndef DI_GRAMMAR_JSON_FORMATS_H
#define DI_GRAMMAR_JSON_FORMATS_H
/* The whole-match regex (ECMA-262, u flag) for a format, or NULL. *defined says whether JSON Schema
 * defines the name (a defined format without a regex cannot be asserted; an undefined one is an
 * annotation and is ignored). */
const char *di_json_format_regex(const char *name, int *defined);
/* Compiles format `name` (its regex `re`, from di_json_format_regex) into `rule` as a JSON string
 * body. "time" and "date-time" also take the leap seconds at non-zero offsets, which the regex
 * cannot hold at a reasonable size (json_formats.c); *time_cache: the builder's time rule, shared
 * by every time format of the grammar (-1 = not built yet). */
#include "grammar/gram_ir.h"
di_status di_json_format_compile(di_gb *b, const char *name, const char *re, int rule, int *time_cache);
#endif
