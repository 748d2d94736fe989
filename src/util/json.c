/* See json.h. */
#include "util/json.h"
#include <pthread.h>
#include <stdlib.h>
#include <math.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

di_status di_read_file(const char *path, char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return di_error_set(errno == ENOENT ? DI_ERR_NOT_FOUND : DI_ERR_IO, "cannot open %s: %s", path,
                        strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) { /* a directory "opens" and seeks to LONG_MAX */
    fclose(f);
    return di_error_set(DI_ERR_IO, "cannot read %s: not a regular file", path);
  }
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return di_error_set(DI_ERR_IO, "cannot seek %s", path);
  }
  long n = ftell(f);
  rewind(f);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!buf) {
    fclose(f);
    return di_error_set(DI_ERR_OOM, "cannot read %s: out of memory", path);
  }
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  if (got != (size_t)n) {
    free(buf);
    return di_error_set(DI_ERR_IO, "short read on %s", path);
  }
  buf[n] = 0;
  *data = buf;
  if (len)
    *len = (size_t)n;
  return DI_OK;
}

di_status di_json_parse(const char *text, size_t len, const char *what, cJSON **out) {
  const char *end = NULL;
  cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!j) {
    size_t off = end && end >= text ? (size_t)(end - text) : 0;
    return di_error_set(DI_ERR_FORMAT, "%s: invalid JSON near byte %zu", what, off);
  }
  *out = j;
  return DI_OK;
}

di_status di_json_read_file(const char *path, cJSON **out) {
  char *buf;
  size_t n;
  DI_TRY(di_read_file(path, &buf, &n));
  di_status st = di_json_parse(buf, n, path, out);
  free(buf);
  return st;
}

static const cJSON *get(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  return (v && !cJSON_IsNull(v)) ? v : NULL;
}

int di_json_is_int_in(const cJSON *v, double lo, double hi) {
  if (!cJSON_IsNumber(v)) return 0;
  const double d = v->valuedouble;
  return d >= lo && d <= hi && d == floor(d); /* NaN fails every comparison; infinities the range */
}

int di_double_to_int_in(double d, double lo, double hi, int64_t *out) {
  if (lo < -9223372036854775808.0) lo = -9223372036854775808.0; /* -2^63 */
  if (hi > 9223372036854774784.0) hi = 9223372036854774784.0;   /* the largest double below 2^63 */
  if (!(d >= lo && d <= hi)) return 0;                          /* NaN fails too */
  *out = (int64_t)d;
  return 1;
}

int di_json_int_in(const cJSON *v, double lo, double hi, int64_t *out) {
  return di_json_is_int_in(v, lo, hi) && di_double_to_int_in(v->valuedouble, lo, hi, out);
}

di_status di_json_int(const cJSON *obj, const char *key, int64_t def, const char *what, int64_t *out) {
  const cJSON *v = get(obj, key);
  if (!v) {
    *out = def;
    return DI_OK;
  }
  if (cJSON_IsBool(v)) {
    *out = cJSON_IsTrue(v);
    return DI_OK;
  }
  if (!di_json_int_in(v, -DI_JSON_MAX_EXACT_INT, DI_JSON_MAX_EXACT_INT, out))
    return di_error_set(DI_ERR_FORMAT, "%s: \"%s\" must be an integer", what, key);
  return DI_OK;
}

di_status di_json_num(const cJSON *obj, const char *key, double def, const char *what, double *out) {
  const cJSON *v = get(obj, key);
  if (!v) {
    *out = def;
    return DI_OK;
  }
  if (!cJSON_IsNumber(v))
    return di_error_set(DI_ERR_FORMAT, "%s: \"%s\" must be a number", what, key);
  *out = v->valuedouble;
  return DI_OK;
}

di_status di_json_bool(const cJSON *obj, const char *key, int def, const char *what, int *out) {
  const cJSON *v = get(obj, key);
  if (!v) {
    *out = def;
    return DI_OK;
  }
  if (!cJSON_IsBool(v))
    return di_error_set(DI_ERR_FORMAT, "%s: \"%s\" must be true or false", what, key);
  *out = cJSON_IsTrue(v);
  return DI_OK;
}

di_status di_json_str(const cJSON *obj, const char *key, const char *def, const char *what, const char **out) {
  const cJSON *v = get(obj, key);
  if (!v) {
    *out = def;
    return DI_OK;
  }
  if (!cJSON_IsString(v))
    return di_error_set(DI_ERR_FORMAT, "%s: \"%s\" must be a string", what, key);
  *out = v->valuestring;
  return DI_OK;
}

/* ---- cJSON allocation failures, counted per thread (see json.h) ---- */
static _Thread_local unsigned long json_alloc_failures;

static void *counted_malloc(size_t n) {
  void *p = malloc(n);
  if (!p) json_alloc_failures++;
  return p;
}

static void install_counted_hooks(void) {
  cJSON_Hooks h = {counted_malloc, free};
  cJSON_InitHooks(&h);
}

void di_json_track_alloc_failures(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, install_counted_hooks);
}

unsigned long di_json_alloc_failures(void) { return json_alloc_failures; }

int di_json_add_item(cJSON *obj, const char *key, cJSON *item) {
  if (!item) return 0; /* its creation failed: counted by the hooks */
  if (obj && cJSON_AddItemToObject(obj, key, item)) return 1;
  cJSON_Delete(item);
  json_alloc_failures++;
  return 0;
}

int di_json_append(cJSON *arr, cJSON *item) {
  if (!item) return 0;
  if (arr && cJSON_AddItemToArray(arr, item)) return 1;
  cJSON_Delete(item);
  json_alloc_failures++;
  return 0;
}

char *di_json_print_checked(const cJSON *o, unsigned long mark) {
  char *s = o ? cJSON_PrintUnformatted(o) : NULL;
  if (s && json_alloc_failures != mark) {
    cJSON_free(s);
    s = NULL;
  }
  return s;
}
