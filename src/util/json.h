/* JSON helpers over cJSON (Debian's libcjson): reading a file into a tree, typed getters that
 * report the key at fault. Numbers are doubles; integers are exact up to 2^53. */
#ifndef DI_UTIL_JSON_H
#define DI_UTIL_JSON_H
#include <cjson/cJSON.h>
#include <stdint.h>
#include "util/status.h"

/* Reads and parses `path`. On failure sets an error naming the file (and the byte offset of a
 * syntax error). *out must be freed with cJSON_Delete. */
di_status di_json_read_file(const char *path, cJSON **out);
/* Parses `len` bytes (need not be NUL-terminated). `what` names the input in errors. */
di_status di_json_parse(const char *text, size_t len, const char *what, cJSON **out);

/* Typed lookups: missing key or JSON null gives `def`; a value of the wrong type is an error
 * naming `what`.`key`. */
di_status di_json_int(const cJSON *obj, const char *key, int64_t def, const char *what, int64_t *out);
di_status di_json_num(const cJSON *obj, const char *key, double def, const char *what, double *out);
di_status di_json_bool(const cJSON *obj, const char *key, int def, const char *what, int *out);
/* Returns a borrowed string or `def`; wrong type is an error. */
di_status di_json_str(const cJSON *obj, const char *key, const char *def, const char *what, const char **out);

/* Whether v is a JSON number that is an integer in [lo, hi] (finite, no fraction): converting it to
 * an integer type covering [lo, hi] is then defined (an out-of-range double-to-integer conversion
 * is undefined behaviour in C, and JSON numbers come from untrusted input). */
int di_json_is_int_in(const cJSON *v, double lo, double hi);
/* The one range check through which an untrusted double becomes an integer (the rule that no other
 * file casts one is tests/python/test_int_conversion_rule.py): when v is a JSON number that is an
 * integer in [lo, hi], stores it in *out and returns 1; otherwise returns 0 and leaves *out. */
int di_json_int_in(const cJSON *v, double lo, double hi, int64_t *out);
/* The same for a double already read (a parsed float, a product of JSON numbers): when d is finite
 * and in [lo, hi], stores it truncated toward zero in *out and returns 1; otherwise returns 0 and
 * leaves *out. Bounds beyond the int64 range are narrowed to it. */
int di_double_to_int_in(double d, double lo, double hi, int64_t *out);
/* 2^53: the largest magnitude up to which every integer is exact as a double (a JSON number) */
#define DI_JSON_MAX_EXACT_INT 9007199254740992.0

/* cJSON's Add* calls drop a value without a word when its allocation fails, so a document built by
 * many of them (a response, a translated request) may be silently incomplete. After
 * di_json_track_alloc_failures() (once per process, from any thread; the server calls it when it
 * starts) cJSON allocates through a counter of the failures on each thread: a builder takes
 * di_json_alloc_failures() before and compares after, and a change means the document lacks
 * something and must not be sent or acted on (di_json_print_checked does both). Without the
 * tracking the count stays 0. The tracking replaces cJSON's hooks (a caller's own, a test's
 * injection, keep working: the counter allocates with malloc). */
void di_json_track_alloc_failures(void);
unsigned long di_json_alloc_failures(void);
/* cJSON_AddItemToObject / cJSON_AddItemToArray that always take `item`: when it cannot be added (the
 * parent is NULL because its own allocation failed, or the key's copy failed) cJSON leaves it to the
 * caller, and a builder that does not check leaks it; these free it and count the failure. They
 * return 1 when added, else 0. */
int di_json_add_item(cJSON *obj, const char *key, cJSON *item);
int di_json_append(cJSON *arr, cJSON *item);
/* cJSON_PrintUnformatted(o), or NULL when it fails or when a cJSON allocation on this thread failed
 * since `mark` (a di_json_alloc_failures() value taken before o was built) */
char *di_json_print_checked(const cJSON *o, unsigned long mark);

/* Reads a whole file into a malloc'd NUL-terminated buffer. */
di_status di_read_file(const char *path, char **data, size_t *len);
#endif
