/* The complement of a JSON schema, for `not` and for the else-branch of `if` (json_schema.c):
 * De Morgan over the keywords that constrain one JSON type independently (`type`, numeric bounds,
 * string / array / object size bounds, `required`, `properties`, and `not` / `allOf` / `anyOf`
 * themselves). A keyword constrains only values of its type, so its complement is "another type,
 * or this type beyond the bound": not {minimum: 5} = anyOf [{type: non-numbers}, {type: number,
 * exclusiveMaximum: 5}]. What has no such complement here (patterns, formats, enum/const, items,
 * $ref, ...) is reported by name: the caller refuses the schema. Non-integral numbers, the
 * complement of "integer" within "number", are marked with DI_NONINTEGRAL_KEY. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "grammar/json_schema_not.h"

static const char *TYPES[] = {"null", "boolean", "object", "array", "number", "string", NULL};

/* {type: every type but `keep` (one of TYPES)} */
static cJSON *other_types(const char *keep) {
  cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "type");
  for (int i = 0; TYPES[i]; i++)
    if (strcmp(TYPES[i], keep) != 0)
      cJSON_AddItemToArray(arr, cJSON_CreateString(TYPES[i]));
  return o;
}

static cJSON *typed(const char *type, const char *kw, cJSON *value) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "type", type);
  cJSON_AddItemToObject(o, kw, value);
  return o;
}

static int is_annotation(const char *k) {
  static const char *ann[] = {"$schema", "$id", "$comment", "title", "description", "default", "examples",
                              "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
  for (int i = 0; ann[i]; i++)
    if (strcmp(k, ann[i]) == 0)
      return 1;
  return strncmp(k, "x-", 2) == 0 && strcmp(k, DI_NONINTEGRAL_KEY) != 0;
}

/* not {type: T}: the other types; "integer" without "number" leaves the non-integral numbers */
static cJSON *negate_type(const cJSON *t) {
  int has[7] = {0}, integer = 0;
  const cJSON *one = cJSON_IsString(t) ? t : NULL;
  for (const cJSON *e = one ? one : t->child; e; e = one ? NULL : e->next) {
    if (!cJSON_IsString(e))
      return NULL;
    if (strcmp(e->valuestring, "integer") == 0)
      integer = 1;
    for (int i = 0; TYPES[i]; i++)
      if (strcmp(e->valuestring, TYPES[i]) == 0)
        has[i] = 1;
  }
  cJSON *alts = cJSON_CreateArray(), *rest = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(rest, "type");
  for (int i = 0; TYPES[i]; i++)
    if (!has[i] && !(i == 4 && integer)) /* "integer" leaves only the non-integral numbers */
      cJSON_AddItemToArray(arr, cJSON_CreateString(TYPES[i]));
  cJSON_AddItemToArray(alts, rest);
  if (integer && !has[4]) {
    cJSON *ni = cJSON_CreateObject();
    cJSON_AddTrueToObject(ni, DI_NONINTEGRAL_KEY);
    cJSON_AddItemToArray(alts, ni);
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "anyOf", alts);
  return o;
}

/* One keyword's complement (as alternatives appended to `alts`); 0 when it has none here. */
static int negate_keyword(const cJSON *sch, const cJSON *kw, cJSON *alts, char *why, size_t whylen) {
  const char *k = kw->string;
  static const char *num_flip[][2] = {{"minimum", "exclusiveMaximum"},
                                      {"exclusiveMinimum", "maximum"},
                                      {"maximum", "exclusiveMinimum"},
                                      {"exclusiveMaximum", "minimum"}};
  for (int i = 0; i < 4; i++)
    if (strcmp(k, num_flip[i][0]) == 0 && cJSON_IsNumber(kw)) {
      cJSON_AddItemToArray(alts, other_types("number"));
      cJSON_AddItemToArray(alts, typed("number", num_flip[i][1], cJSON_CreateNumber(kw->valuedouble)));
      return 1;
    }
  static const char *counts[][3] = {{"minLength", "maxLength", "string"}, {"maxLength", "minLength", "string"},
                                    {"minItems", "maxItems", "array"},     {"maxItems", "minItems", "array"},
                                    {"minProperties", "maxProperties", "object"},
                                    {"maxProperties", "minProperties", "object"}};
  for (int i = 0; i < 6; i++)
    if (strcmp(k, counts[i][0]) == 0 && cJSON_IsNumber(kw) && kw->valuedouble == floor(kw->valuedouble)) {
      int is_min = strncmp(k, "min", 3) == 0;
      double v = is_min ? kw->valuedouble - 1 : kw->valuedouble + 1;
      cJSON_AddItemToArray(alts, other_types(counts[i][2]));
      if (v >= 0) /* not minLength 0: nothing of this type */
        cJSON_AddItemToArray(alts, typed(counts[i][2], counts[i][1], cJSON_CreateNumber(v)));
      return 1;
    }
  if (strcmp(k, "type") == 0) {
    cJSON *t = negate_type(kw);
    if (t)
      cJSON_AddItemToArray(alts, t);
    return t != NULL;
  }
  if (strcmp(k, "required") == 0 && cJSON_IsArray(kw)) {
    cJSON_AddItemToArray(alts, other_types("object"));
    for (const cJSON *r = kw->child; r; r = r->next) {
      if (!cJSON_IsString(r))
        return 0;
      cJSON *o = cJSON_CreateObject(), *p = cJSON_AddObjectToObject(o, "properties");
      cJSON_AddStringToObject(o, "type", "object");
      cJSON_AddFalseToObject(p, r->valuestring);
      cJSON_AddItemToArray(alts, o);
    }
    return 1;
  }
  if (strcmp(k, "properties") == 0 && cJSON_IsObject(kw)) { /* some property present and failing */
    cJSON_AddItemToArray(alts, other_types("object"));
    for (const cJSON *p = kw->child; p; p = p->next) {
      cJSON *np = NULL;
      if (di_json_schema_negate(p, &np, why, whylen) != 0)
        return 0;
      cJSON *o = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(o, "properties"),
            *req = cJSON_AddArrayToObject(o, "required");
      cJSON_AddStringToObject(o, "type", "object");
      cJSON_AddItemToObject(props, p->string, np);
      cJSON_AddItemToArray(req, cJSON_CreateString(p->string));
      cJSON_AddItemToArray(alts, o);
    }
    return 1;
  }
  if (strcmp(k, "not") == 0) {
    cJSON_AddItemToArray(alts, cJSON_Duplicate(kw, 1));
    return 1;
  }
  if ((strcmp(k, "allOf") == 0 || strcmp(k, "anyOf") == 0) && cJSON_IsArray(kw)) {
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, strcmp(k, "allOf") == 0 ? "anyOf" : "allOf");
    for (const cJSON *e = kw->child; e; e = e->next) {
      cJSON *ne = NULL;
      if (di_json_schema_negate(e, &ne, why, whylen) != 0) {
        cJSON_Delete(o);
        return 0;
      }
      cJSON_AddItemToArray(arr, ne);
    }
    cJSON_AddItemToArray(alts, o);
    return 1;
  }
  (void)sch;
  snprintf(why, whylen, "%s", k);
  return 0;
}

int di_json_schema_negate(const cJSON *s, cJSON **out, char *why, size_t whylen) {
  *out = NULL;
  if (cJSON_IsBool(s)) {
    *out = cJSON_IsTrue(s) ? cJSON_CreateFalse() : cJSON_CreateTrue();
    return 0;
  }
  if (!cJSON_IsObject(s)) {
    snprintf(why, whylen, "not (a schema must be an object or a boolean)");
    return -1;
  }
  cJSON *alts = cJSON_CreateArray();
  int n = 0;
  for (const cJSON *kw = s->child; kw; kw = kw->next) {
    if (is_annotation(kw->string))
      continue;
    if (!negate_keyword(s, kw, alts, why, whylen)) {
      if (!*why)
        snprintf(why, whylen, "%s", kw->string);
      cJSON_Delete(alts);
      return -1;
    }
    n++;
  }
  if (n == 0) { /* not {}: nothing */
    cJSON_Delete(alts);
    *out = cJSON_CreateFalse();
    return 0;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "anyOf", alts);
  *out = o;
  return 0;
}
