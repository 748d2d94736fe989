/* The complement of a JSON schema (json_schema_not.c), for `not` and `if`/`else`. */
#ifndef DI_GRAMMAR_JSON_SCHEMA_NOT_H
#define DI_GRAMMAR_JSON_SCHEMA_NOT_H
#include <stddef.h>
#include <cjson/cJSON.h>

/* The internal keyword (true) of a schema matching exactly the non-integral numbers. */
#define DI_NONINTEGRAL_KEY "x-deepinfer-nonintegral"

/* *out = a schema matching exactly the values `s` rejects (caller frees), return 0; or -1 with
 * the keyword that has no complement here written to `why`. */
int di_json_schema_negate(const cJSON *s, cJSON **out, char *why, size_t whylen);
#endif
