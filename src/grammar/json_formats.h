/* JSON Schema `format` regexes (json_formats.c), used by the JSON Schema front-end. */
#ifndef DI_GRAMMAR_JSON_FORMATS_H
#define DI_GRAMMAR_JSON_FORMATS_H
/* The whole-match regex (ECMA-262, u flag) for a format, or NULL. *defined says whether JSON Schema
 * defines the name (a defined format without a regex cannot be asserted; an undefined one is an
 * annotation and is ignored). */
const char *di_json_format_regex(const char *name, int *defined);
#endif
